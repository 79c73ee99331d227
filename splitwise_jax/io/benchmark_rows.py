"""Benchmark rows -> engine stages -> predicted columns (the serving model's data path).

`stage_of_row` turns a row of a benchmark table (`io.benchmarks`) into the engine
model's `Stage`; `predict_frame` evaluates every row, stages of one experiment back to back
(a stage starts with the queue the one before left), and returns the rows with
``pred_{ttft,tpot,e2e}_{p50,p90,p99}_s``, ``pred_throughput_req_per_s``,
``pred_overloaded`` and the model's internals (capacity, batch, KV tokens, prefix-hit).

Prefix caching (vLLM's automatic prefix caching, on by default in the measured builds):
the shared system prompt's full 16-token blocks are hits for every request but the
first of its group; in a multi-turn chat (``multi_turn``), a user's request repeats that
user's earlier prompt as its prefix (the measured prompt lengths stay flat through a
stage, so the context does not grow with the answers), so every full block of the
prompt is a hit while the users' prompts stay resident in the KV blocks that running
requests leave free (`engine._flows`).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

import jax
import numpy as np

from splitwise_jax.io.benchmarks import GPU_IDS, LEVELS, METRICS, BenchmarkTable, prompt_tokens, resolve_model_name
from splitwise_jax.cluster.engine import EngineParams, Stage, stage_metrics

#: The catalogue machine whose GPU, links and prices a server of each GPU takes.
_MACHINE_OF_GPU = {"h100-80gb": "dgx-h100", "a100-80gb": "dgx-a100", "h200-141gb": "dgx-h200",
                   "b200-180gb": "dgx-b200", "mi300x-192gb": "mi300x-x8"}


def machine_for(gpu: str, tp: int):
    """A server of `tp` GPUs of a benchmark row's `gpu` (the catalogue machine's GPU and
    links; its price pro rata)."""
    from splitwise_jax.specs.catalog import get_machine

    gname = GPU_IDS[str(gpu).lower()]
    base = get_machine(_MACHINE_OF_GPU[gname])
    frac = tp / base.gpus_per_machine
    return base.replace(gpus_per_machine=int(tp), name=f"{gname}-x{tp}", cost_per_hour=base.cost_per_hour * frac,
                        provisioned_power_w=base.provisioned_power_w * frac, host_power_w=base.host_power_w * frac)


def llm_for(model: str, extra: dict | None = None):
    """The LLM of a row's `model`: a user-given one (`extra`: id -> LLM, from --specs or
    --hf-config), else the catalogue (Hugging Face ids resolve, `HF_MODEL_IDS`)."""
    from splitwise_jax.specs.catalog import get_llm, llm_names

    if extra and model in extra:
        return extra[model]
    name = resolve_model_name(model)
    if name is None:
        raise ValueError(f"model {model!r} is not in the catalogue (names: {', '.join(llm_names())}; Hugging Face "
                         "ids of those resolve); give its architecture with --hf-config DIR or --specs FILE")
    return get_llm(name)


def stage_of_row(row, backlog_in: float = 0.0) -> Stage:
    """The engine model's `Stage` for one benchmark row (module docstring: the cache)."""
    p = prompt_tokens(row)
    spec = float(row["system_prompt_len"]) + float(row["question_len"])
    # the server tokenises the generated text a little longer than the generator's token
    # counts (measured prompt / (system + question)); scale the system prompt alike
    scale = p / spec if spec > 0 else 1.0
    caching = bool(row["enable_prefix_caching"])
    block = 16.0
    shared = math.floor(float(row["system_prompt_len"]) * scale / block) * block if caching else 0.0
    users = float(row["n_system_prompts"]) * float(row["users_per_system_prompt"])
    multi = bool(row["multi_turn"]) and caching
    own = math.floor((p - 1.0) / block) * block if multi else shared
    return Stage(
        rate_per_s=float(row["rate_per_s"]), duration_s=float(row["duration_s"]), prompt_tokens=p,
        cached_hit_tokens=own, cached_shared_tokens=shared,
        working_set_tokens=users * p if multi else 0.0,
        output_tokens=float(row["output_len_target"]),
        max_num_batched_tokens=float(row["max_num_batched_tokens"]), max_num_seqs=float(row["max_num_seqs"]),
        gpu_memory_utilization=float(row["gpu_memory_utilization"]),
        poisson=1.0 if str(row["arrivals"]) == "poisson" else 0.0, backlog_in=float(backlog_in))


def stack_rows(stages: list[Stage]) -> Stage:
    """Stages as one `Stage` of arrays (leading axis = rows)."""
    return jax.tree_util.tree_map(lambda *xs: np.asarray(xs, dtype=float), *stages)


@lru_cache(maxsize=64)
def _program(llm, machine):
    # one compiled program per (model, server): rows of a group vmap over it
    return jax.jit(jax.vmap(lambda p, e, st: stage_metrics(p, e, machine, llm, st), in_axes=(None, None, 0)))


def evaluate_rows(params, engine: EngineParams, machine, llm, stages: list[Stage]):
    """`stage_metrics` over several stages of one model and server (one vmapped program)."""
    return _program(llm, machine)(params, engine, stack_rows(stages))


def groups(table: BenchmarkTable, extra_llms: dict | None = None) -> dict:
    """Row indices by (model, gpu, tensor_parallel): the units one program evaluates."""
    out: dict = {}
    for i, row in table.frame.iterrows():
        key = (str(row["model"]), str(row["gpu"]), int(row["tensor_parallel"]))
        out.setdefault(key, []).append(int(i))
    for key in out:  # resolve early so an unknown model fails before any compile
        llm_for(key[0], extra_llms)
    return out


def _order(frame, idx: list[int]) -> list[list[int]]:
    """Rows of a group in waves by stage: wave k holds every experiment's k-th stage."""
    by_exp: dict = {}
    for i in idx:
        r = frame.loc[i]
        start = r["stage_start_s"] if np.isfinite(r["stage_start_s"]) else float(r["stage"])
        by_exp.setdefault(str(r["experiment"]), []).append((float(r["stage"]), start, i))
    waves: list[list[int]] = []
    for rows in by_exp.values():
        for k, (_, _, i) in enumerate(sorted(rows)):
            while len(waves) <= k:
                waves.append([])
            waves[k].append(i)
    return waves


def predict_frame(table: BenchmarkTable, params_for_gpu, engine: EngineParams, extra_llms: dict | None = None):
    """Predicted columns for every row of a benchmark table.

    Args:
        table: the rows (`read_benchmarks`).
        params_for_gpu: callable catalogue GPU name -> PhaseParams.
        engine: engine and client parameters.
        extra_llms: models not in the catalogue, by the `model` value of their rows.

    Returns:
        A copy of the table's frame with the pred_* columns (module docstring).
    """
    frame = table.frame.copy()
    cols = {f"pred_{m}_{q}_s": np.full(len(frame), np.nan) for m in METRICS for q in LEVELS}
    extra = {k: np.full(len(frame), np.nan) for k in
             ("pred_throughput_req_per_s", "pred_capacity_req_per_s", "pred_load", "pred_batch",
              "pred_kv_tokens", "pred_prefix_hit", "pred_gap_s", "pred_backlog_out")}
    for (model, gpu, tp), idx in groups(table, extra_llms).items():
        llm = llm_for(model, extra_llms)
        machine = machine_for(gpu, tp)
        params = params_for_gpu(GPU_IDS[gpu])
        backlog: dict = {}
        for wave in _order(frame, idx):
            stages = [stage_of_row(frame.loc[i], backlog.get(str(frame.loc[i, "experiment"]), 0.0)) for i in wave]
            m = jax.tree_util.tree_map(np.asarray, evaluate_rows(params, engine, machine, llm, stages))
            for j, i in enumerate(wave):
                for k, q in enumerate(LEVELS):
                    cols[f"pred_ttft_{q}_s"][i] = m.ttft_s[j, k]
                    cols[f"pred_tpot_{q}_s"][i] = m.tpot_s[j, k]
                    cols[f"pred_e2e_{q}_s"][i] = m.e2e_s[j, k]
                extra["pred_throughput_req_per_s"][i] = m.throughput_req_per_s[j]
                extra["pred_capacity_req_per_s"][i] = m.capacity_req_per_s[j]
                extra["pred_load"][i] = m.load[j]
                extra["pred_batch"][i] = m.batch[j]
                extra["pred_kv_tokens"][i] = m.kv_tokens[j]
                extra["pred_prefix_hit"][i] = m.prefix_hit[j]
                extra["pred_gap_s"][i] = m.gap_s[j]
                extra["pred_backlog_out"][i] = m.backlog_out[j]
                backlog[str(frame.loc[i, "experiment"])] = float(m.backlog_out[j])
    for k, v in {**cols, **extra}.items():
        frame[k] = v
    frame["pred_overloaded"] = frame["pred_load"] > 1.0
    return frame


class Stack(NamedTuple):
    """A parameter stack: its name (or file), the phase parameters per GPU, the engine's."""

    name: str
    params_for_gpu: object  # callable: catalogue GPU name -> PhaseParams
    engine: EngineParams
    meta: dict


def load_stack(name_or_path=None) -> Stack:
    """A named stack (`phases.params.STACKS`: "vllm-2026", "paper-2023") or a params file.

    Example:
        >>> s = load_stack("vllm-2026")
        >>> s.name, round(float(s.params_for_gpu("h100-80gb").bw_eff), 2)
        ('vllm-2026', 0.9)
    """
    from splitwise_jax.phases.params import params_for_gpu, read_params_file, resolve_params, stack_name

    path = resolve_params(name_or_path)
    content = read_params_file(path)
    return Stack(stack_name(path) or str(path), lambda g: params_for_gpu(content, g),
                 EngineParams.from_dict(content.engine), dict(content.meta))
