"""Calibration from serving benchmarks: phase and engine parameters by gradient through
the engine model, jointly over every row of a benchmark table.

What is fitted, and at which level (docs/serving.md, "What transfers"):
* Per GPU (physics of the chip, shared by every model and engine on it; a GPU without
  rows takes the shared values, its datasheet carrying the rest): the achieved fractions
  of HBM bandwidth for weights (`bw_eff`) and for attention over the KV cache
  (`kv_bw_eff`), of tensor throughput (`mfu_max`, `attn_eff`).
* Per engine (the serving software, shared by every model it serves): the fixed costs
  of an iteration (`t_iter_s`, per layer `t_layer_s`, per running sequence
  `t_decode_seq_s`, per prompt `t_prompt_seq_s`, per context token `t_ctx_token_s`),
  the all-reduce call (`allreduce_call_s`), the API's cost per request (`t_api_s`),
  the steps before the first token streams (`ttft_extra_iters`) and the request-to-
  request scatter (`tpot_sigma`, `ttft_sigma`).
* Per model: nothing. A model enters only through its architecture (parameters, layers,
  KV bytes per token, experts), so a model that was never measured is predicted by the
  same parameters; that is what the leave-one-model-out study tests.
Each fitted value lives in a bounded interval (`BOUNDS`) through a logistic map, so an
efficiency can never pass 1 (the roofline) however the data pull; a value at its bound
is reported, not hidden (`FitResult.at_bounds`).

The loss: a Huber loss (scale 0.1, i.e. 10 %) of log(predicted / measured) over the
latency percentiles of every stage that kept up (weights 1 for P50, 0.5 for P90 and
P99) and of the served rate of every stage (weight 1; 3 for a stage that did not keep
up, where the served rate is the one number that says how far it fell behind), plus a
1e-3 pull toward the starting point in the unconstrained space (parameters the rows
cannot see stay at their physical priors). Adam (optax), cosine-decayed step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
import optax

from splitwise_jax.phases.params import PhaseParams
from splitwise_jax.io.benchmarks import GPU_IDS, LEVELS, METRICS, BenchmarkTable, kept_up
from splitwise_jax.cluster.engine import EngineParams, stage_metrics
from splitwise_jax.io.benchmark_rows import groups, llm_for, machine_for, stack_rows, stage_of_row

#: field -> (low, high, log-scale). Efficiencies stop at 1: the physics.
BOUNDS: dict[str, tuple[float, float, bool]] = {
    # phase parameters (PhaseParams)
    "bw_eff": (0.3, 1.0, False),
    "kv_bw_eff": (0.2, 1.0, False),
    "mfu_max": (0.2, 0.95, False),
    "attn_eff": (0.1, 1.0, False),
    "t_iter_s": (1e-5, 2e-2, True),
    "t_layer_s": (1e-8, 1e-3, True),
    "t_decode_seq_s": (1e-8, 1e-3, True),
    "t_prompt_seq_s": (1e-6, 5e-2, True),
    "t_ctx_token_s": (1e-12, 1e-6, True),
    # engine parameters (EngineParams)
    "t_api_s": (1e-4, 0.1, True),
    "ttft_extra_iters": (0.0, 3.0, False),
    "allreduce_call_s": (1e-6, 1e-4, True),
    "tpot_sigma": (0.005, 0.5, True),
    "ttft_sigma": (0.01, 0.8, True),
}
PHASE_FIELDS = ("bw_eff", "kv_bw_eff", "mfu_max", "attn_eff", "t_iter_s", "t_layer_s",
                "t_decode_seq_s", "t_prompt_seq_s", "t_ctx_token_s")
ENGINE_FIELDS = ("t_api_s", "ttft_extra_iters", "allreduce_call_s", "tpot_sigma", "ttft_sigma")
LEVEL_WEIGHTS = (1.0, 0.5, 0.5)
HUBER = 0.1
PULL = 1e-3

#: The starting point: a modern engine's physical prior (docs/serving.md): HBM streamed
#: at 85 % for weights and for attention over the cache (paged decode-attention kernels
#: stream the cache as the GEMMs stream weights), 1 ms of scheduler per step, tens of us
#: per layer and sequence, 5-10 us per NVLink all-reduce call; the 2023 fit's measured
#: scaling of fixed costs between A100 and H100 (fixed_bw_exponent 0.65, the one figure
#: there is of how they move with the GPU generation; it matters only for a GPU without
#: rows). Fixed costs add to the GPU's work (overlap_p = 1, not fitted): the engine's
#: scheduler, sampling and launches run between the GPU's kernels. Chosen by the
#: leave-one-model-out study (docs/serving.md): fitted overlap (p ~ 2.4) predicted the
#: held-out model's TPOT P50 with a median error of 11.5 %, serial 7.0 % (250 steps).
START_PHASE = dict(bw_eff=0.85, kv_bw_eff=0.85, mfu_max=0.6, attn_eff=0.5, overlap_p=1.0, t_iter_s=1e-3,
                   t_layer_s=2e-5, t_decode_seq_s=2e-5, t_prompt_seq_s=1e-3, t_ctx_token_s=1e-9,
                   fixed_bw_exponent=0.65)
START_ENGINE = EngineParams()


def _to_z(name: str, v: float) -> float:
    lo, hi, log = BOUNDS[name]
    if log:
        lo, hi, v = math.log(lo), math.log(hi), math.log(v)
    u = min(max((v - lo) / (hi - lo), 1e-6), 1 - 1e-6)
    return math.log(u / (1 - u))


def _from_z(name: str, z):
    lo, hi, log = BOUNDS[name]
    if log:
        return jnp.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * jax.nn.sigmoid(z))
    return lo + (hi - lo) * jax.nn.sigmoid(z)


def unpack(z: dict, base_phase: PhaseParams, base_engine: EngineParams):
    """Phase and engine parameters from the unconstrained vector `z` (name -> value)."""
    phase = base_phase.replace(**{k: _from_z(k, z[k]) for k in PHASE_FIELDS if k in z})
    engine = base_engine.replace(**{k: _from_z(k, z[k]) for k in ENGINE_FIELDS if k in z})
    return phase, engine


@dataclass
class FitResult:
    """A fit: the parameters, the loss history and which fields sit at a bound."""

    phase: PhaseParams
    engine: EngineParams
    loss_first: float
    loss_last: float
    steps: int
    seconds: float
    rows: int
    at_bounds: list = field(default_factory=list)


def _targets(table: BenchmarkTable, idx: list[int]):
    f = table.frame
    ok = kept_up(table)[idx]
    y = np.stack([[np.log(f.loc[i, f"{m}_{q}_s"]) if f"{m}_{q}_s" in f.columns else np.nan
                   for m in METRICS for q in LEVELS] for i in idx])
    w = np.tile(np.array(LEVEL_WEIGHTS * len(METRICS)), (len(idx), 1)) * ok[:, None]
    w = np.where(np.isfinite(y), w, 0.0)
    thr = table.measured("throughput_req_per_s")[idx]
    wt = np.where(np.isfinite(thr) & (thr > 0), np.where(ok, 1.0, 3.0), 0.0)
    return (np.nan_to_num(y), w, np.log(np.where(wt > 0, thr, 1.0)), wt)


def _huber(r):
    a = jnp.abs(r)
    return jnp.where(a < HUBER, 0.5 * r * r, HUBER * (a - 0.5 * HUBER))


def _group_loss(machine, llm):
    def loss(phase, engine, st, y, w, ythr, wthr):
        m = jax.vmap(lambda s: stage_metrics(phase, engine, machine, llm, s))(st)
        pred = jnp.concatenate([m.ttft_s, m.tpot_s, m.e2e_s], axis=-1)
        r = jnp.log(jnp.maximum(pred, 1e-9)) - y
        rt = jnp.log(jnp.maximum(m.throughput_req_per_s, 1e-9)) - ythr
        return jnp.sum(w * _huber(r)) + jnp.sum(wthr * _huber(rt))
    return loss


def fit_benchmarks(table: BenchmarkTable, *, rows: list[int] | None = None, steps: int = 160, lr: float = 0.06,
                   start_phase: PhaseParams | None = None, start_engine: EngineParams | None = None,
                   extra_llms: dict | None = None, progress: bool = True) -> FitResult:
    """Fit phase and engine parameters to the rows of a benchmark table (module docstring).

    Args:
        table: the benchmark rows (`read_benchmarks`); those with measured percentiles or
            throughput enter the loss.
        rows: the row indices to fit on (default all): the leave-one-model-out study
            passes one model's rows.
        steps, lr: Adam steps and peak step size.
        start_phase, start_engine: the starting point (default: `START_PHASE` on the
            default PhaseParams, `START_ENGINE`).
        extra_llms: models not in the catalogue, by their rows' `model` value.
        progress: a progress bar on stderr.

    Returns:
        FitResult (one PhaseParams for the GPU of the rows: the fit is per GPU).
    """
    from tqdm import tqdm

    rows = list(range(len(table))) if rows is None else list(rows)
    gpus = {GPU_IDS[str(table.frame.loc[i, "gpu"])] for i in rows}
    if len(gpus) != 1:
        raise ValueError(f"--benchmarks: rows of one GPU per fit (the GPU-level parameters are per GPU), got "
                         f"{sorted(gpus)}; split the file by its 'gpu' column")
    phase0 = start_phase or PhaseParams().replace(**START_PHASE)
    engine0 = start_engine or START_ENGINE
    z0 = {k: _to_z(k, float(getattr(phase0, k))) for k in PHASE_FIELDS}
    z0.update({k: _to_z(k, float(getattr(engine0, k))) for k in ENGINE_FIELDS})
    z0 = {k: jnp.asarray(v) for k, v in z0.items()}
    parts = []
    for (model, gpu, tp), idx in groups(table, extra_llms).items():
        idx = [i for i in idx if i in rows]
        if not idx:
            continue
        st = stack_rows([stage_of_row(table.frame.loc[i]) for i in idx])
        tg = _targets(table, idx)
        parts.append((_group_loss(machine_for(gpu, tp), llm_for(model, extra_llms)), st, tg))
    if not parts:
        raise ValueError("--benchmarks: no rows to fit")

    def total(z):
        phase, engine = unpack(z, phase0, engine0)
        out = sum(loss(phase, engine, st, *tg) for loss, st, tg in parts)
        return out + PULL * sum(jnp.sum((z[k] - z0[k]) ** 2) for k in z)

    sched = optax.cosine_decay_schedule(lr, steps, alpha=0.05)
    opt = optax.adam(sched)
    vg = jax.jit(jax.value_and_grad(total))

    @jax.jit
    def step(z, state):
        v, g = vg(z)
        upd, state = opt.update(g, state, z)
        return optax.apply_updates(z, upd), state, v

    t0 = time.perf_counter()
    z, state = dict(z0), opt.init(z0)
    first = last = float("nan")
    bar = tqdm(total=steps, desc="calibrate (benchmarks)", unit="step", leave=False, disable=not progress)
    for k in range(steps):
        z, state, v = step(z, state)
        v = float(v)
        if k == 0:
            first = v
        last = v
        bar.update(1)
        if k % 20 == 0:
            bar.set_postfix(loss=f"{v:.4f}")
    bar.close()
    phase, engine = unpack(z, phase0, engine0)
    phase = jax.tree_util.tree_map(float, phase)
    engine = jax.tree_util.tree_map(float, engine)
    at = []
    for k in BOUNDS:
        if k in z and abs(float(z[k])) > 6.0:  # within 0.25 % of an end of its interval
            at.append(f"{k}={'high' if float(z[k]) > 0 else 'low'}")
    return FitResult(phase, engine, first, float(total(z)), steps, time.perf_counter() - t0, len(rows), at)


def error_summary(frame) -> "object":
    """Median |relative error| (%) per metric and level over stages that kept up, with the
    overload verdicts; a DataFrame (empty when the rows carry no measurements)."""
    import pandas as pd


    ok = kept_up(BenchmarkTable(frame, ""))
    rows = []
    for m in METRICS:
        for q in LEVELS:
            col = f"{m}_{q}_s"
            if col not in frame.columns:
                continue
            e = (frame[f"pred_{col}"] / frame[col] - 1.0).to_numpy(dtype=float)[ok]
            e = e[np.isfinite(e)]
            if len(e):
                rows.append({"metric": f"{m} {q}", "stages": len(e), "median_abs_err_pct": 100 * np.median(np.abs(e)),
                             "max_abs_err_pct": 100 * np.max(np.abs(e))})
    return pd.DataFrame(rows)


def verdicts(frame) -> dict:
    """Overload verdicts against the measurements: counts and served-rate errors."""

    ok = kept_up(BenchmarkTable(frame, ""))
    pred = frame["pred_overloaded"].to_numpy(dtype=bool)
    out = {"stages": int(len(frame)), "measured_overloaded": int((~ok).sum()),
           "flagged_and_overloaded": int((pred & ~ok).sum()), "flagged_but_kept_up": int((pred & ok).sum()),
           "missed_overloads": int((~pred & ~ok).sum())}
    if "throughput_req_per_s" in frame.columns and (~ok).any():
        e = frame["pred_throughput_req_per_s"] / frame["throughput_req_per_s"] - 1.0
        out["served_rate_err_pct_overloaded"] = [round(100 * float(x), 1) for x in e.to_numpy()[~ok]]
    return out


def leave_one_model_out(table, *, steps: int, start_phase, extra=None, progress: bool = False) -> dict:
    """Fit without each model in turn and predict it: per-row predictions and the median
    |relative error| per metric over every held-out stage that kept up."""
    import pandas as pd

    from splitwise_jax.io.benchmark_rows import predict_frame

    frames = []
    for model in sorted({str(m) for m in table.frame["model"]}):
        train = [i for i in range(len(table)) if str(table.frame.loc[i, "model"]) != model]
        if not train:
            continue
        fit = fit_benchmarks(table, rows=train, steps=steps, start_phase=start_phase, extra_llms=extra,
                             progress=progress)
        f = predict_frame(table, lambda g: fit.phase, fit.engine, extra)
        frames.append(f[f["model"] == model])
    held = pd.concat(frames).sort_index()
    summary = error_summary(held)
    return {"frame": held,
            "summary": {r["metric"]: round(float(r["median_abs_err_pct"]), 1) for _, r in summary.iterrows()},
            "verdicts": verdicts(held)}
