"""The phase model evaluated on profile rows: what the profiles measure, predicted.

One group of rows per (model, tensor parallel): those fix the shapes of the
computation (layers, hidden size and TP are static). The GPU, its power cap and its
parameters vary per row, as arrays, so the loss traces one model evaluation per group,
not per hardware.

References:
    Patel et al., Splitwise, ISCA 2024, §III (the profiles) and §V-A (SplitwiseSim's
    performance model, whose rows these are).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from splitwise_jax.specs.batch import Batch
from splitwise_jax.specs.catalog import CAP_OF_HARDWARE, MACHINE_OF_HARDWARE, get_llm, get_machine
from splitwise_jax.specs.hardware import GPU, Machine
from splitwise_jax.phases.params import PhaseParams
from splitwise_jax.phases.phases import iteration
from splitwise_jax.phases.profiles import SERIES_KEYS

def gpu_of_hardware(hardware: str) -> str:
    """The GPU a profile `hardware` name runs on (the pcap rows are H100s under a cap)."""
    if hardware not in MACHINE_OF_HARDWARE:
        raise ValueError(f"hardware must be one of {sorted(MACHINE_OF_HARDWARE)}, got {hardware!r}")
    return get_machine(MACHINE_OF_HARDWARE[hardware]).gpu.name


def stack_machines(hardware: Sequence[str]) -> Machine:
    """One Machine whose numeric fields are arrays over rows of the given hardware names."""
    ms = [get_machine(MACHINE_OF_HARDWARE[h]) for h in hardware]
    if not ms:
        raise ValueError("stack_machines needs at least one row")
    counts = {m.gpus_per_machine for m in ms}
    if len(counts) != 1:
        raise ValueError(f"rows mix machines with different GPU counts {sorted(counts)}")

    def col(get):
        return np.array([float(get(m)) for m in ms])

    gpu = GPU(peak_flops_per_s=col(lambda m: m.gpu.peak_flops_per_s), hbm_bytes=col(lambda m: m.gpu.hbm_bytes),
              hbm_bw_bytes_per_s=col(lambda m: m.gpu.hbm_bw_bytes_per_s), tdp_w=col(lambda m: m.gpu.tdp_w),
              idle_w=col(lambda m: m.gpu.idle_w), min_cap_w=col(lambda m: m.gpu.min_cap_w), name="rows")
    return Machine(gpu=gpu, nvlink_bytes_per_s=col(lambda m: m.nvlink_bytes_per_s),
                   ib_bytes_per_s=col(lambda m: m.ib_bytes_per_s), cost_per_hour=col(lambda m: m.cost_per_hour),
                   provisioned_power_w=col(lambda m: m.provisioned_power_w), host_power_w=col(lambda m: m.host_power_w),
                   kv_setup_s=col(lambda m: m.kv_setup_s), gpus_per_machine=counts.pop(), name="rows")


class GroupData(NamedTuple):
    """Arrays of one (model, TP) group, shape [n]; weights are 0 for rows not fitted."""

    machine: Machine
    gpu_index: jnp.ndarray
    cap_frac: jnp.ndarray
    prompt_size: jnp.ndarray
    batch_size: jnp.ndarray
    token_size: jnp.ndarray
    log_prompt_s: jnp.ndarray
    log_token_s: jnp.ndarray
    peak_frac: jnp.ndarray
    avg_frac: jnp.ndarray
    w_prompt: jnp.ndarray
    w_token: jnp.ndarray
    w_power: jnp.ndarray
    w_avg_power: jnp.ndarray


def _design(medians: pd.DataFrame, gpus: Sequence[str]):
    """((model, tp) keys, per-group arrays) for the rows of `medians`."""
    keys = []
    data = []
    for (model, tp), sel in medians.groupby(["model", "tensor_parallel"], sort=True):
        peak = sel["peak_power_frac"].to_numpy(float)
        avg = sel["average_power_frac"].to_numpy(float)
        has_power = np.isfinite(peak) & np.isfinite(avg)
        ones = np.ones(len(sel))
        w_prompt = sel["w_prompt"].to_numpy(float) if "w_prompt" in sel else ones
        w_token = sel["w_token"].to_numpy(float) if "w_token" in sel else ones
        w_power = sel["w_power"].to_numpy(float) if "w_power" in sel else ones
        w_avg = sel["w_avg_power"].to_numpy(float) if "w_avg_power" in sel else w_power
        keys.append((str(model), int(tp)))
        data.append(GroupData(
            machine=stack_machines(sel["hardware"].tolist()),
            gpu_index=jnp.asarray([gpus.index(gpu_of_hardware(h)) for h in sel["hardware"]]),
            cap_frac=jnp.asarray([float(CAP_OF_HARDWARE[h]) for h in sel["hardware"]]),
            prompt_size=jnp.asarray(sel["prompt_size"].to_numpy(float)),
            batch_size=jnp.asarray(sel["batch_size"].to_numpy(float)),
            token_size=jnp.asarray(sel["token_size"].to_numpy(float)),
            log_prompt_s=jnp.asarray(np.log(sel["prompt_time_s"].to_numpy(float))),
            log_token_s=jnp.asarray(np.log(sel["token_time_s"].to_numpy(float))),
            peak_frac=jnp.asarray(np.where(has_power, peak, 1.0)),
            avg_frac=jnp.asarray(np.where(has_power, avg, 1.0)),
            w_prompt=jnp.asarray(w_prompt),
            w_token=jnp.asarray(w_token),
            w_power=jnp.asarray(w_power * has_power),
            w_avg_power=jnp.asarray(w_avg * has_power),
        ))
    return tuple(keys), data



class RowPredictions(NamedTuple):
    prompt_s: jnp.ndarray
    token_s: jnp.ndarray
    peak_frac: jnp.ndarray
    avg_frac: jnp.ndarray


def predict_rows(params: PhaseParams, machine: Machine, llm, prompt_size, batch_size, token_size, *, tp: int,
                 cap_frac=1.0) -> RowPredictions:
    """What the profile rows hold, predicted: prompt time, token time (s), power / TDP.

    `token_s` is `phases.mean_token_latency_s` (decode at the mean context prompt +
    token_size / 2); peak power is the prompt iteration's draw; average power is the
    time-weighted draw over the request (one prompt iteration then token_size decodes).
    All arguments but `tp` may be arrays over rows (params and machine with array leaves).
    """
    p, b, t, cap = jnp.broadcast_arrays(*(jnp.asarray(v, dtype=float) for v in
                                           (prompt_size, batch_size, token_size, cap_frac)))
    # One iteration() call over [prompt rows; decode rows] (every leaf of params and
    # machine is broadcast and repeated likewise): half the graph to compile.
    shape = p.shape
    p, b, t, cap = (v.reshape(-1) for v in (p, b, t, cap))
    n = p.shape[0]

    def twice(leaf):
        leaf = jnp.broadcast_to(jnp.asarray(leaf, dtype=float), shape).reshape(-1)
        return jnp.concatenate([leaf, leaf])

    zeros = jnp.zeros_like(p)
    prompt_part = Batch(p * b, b, b * p * p, zeros, zeros)  # Batch.prompts(p, b), array-valued
    decode_part = Batch(zeros, zeros, zeros, b, b * (p + 0.5 * t))  # Batch.decode(b, p + t / 2)
    batch = jax.tree_util.tree_map(lambda a, c: jnp.concatenate([a, c]), prompt_part, decode_part)
    it = iteration(jax.tree_util.tree_map(twice, params), jax.tree_util.tree_map(twice, machine), llm, batch,
                   tp=tp, cap_frac=jnp.concatenate([cap, cap]))
    lat_p, lat_t = it.latency_s[:n], it.latency_s[n:]
    pow_p, pow_t = it.power_w[:n], it.power_w[n:]
    tdp = jnp.broadcast_to(jnp.asarray(machine.gpu.tdp_w, dtype=float), shape).reshape(-1)
    decode_total = t * lat_t
    avg = (pow_p * lat_p + pow_t * decode_total) / (lat_p + decode_total)
    return RowPredictions(*(v.reshape(shape) for v in (lat_p, lat_t, pow_p / tdp, avg / tdp)))



# ---------------------------------------------------------------------------------------
# Prediction of a table of rows


@partial(jax.jit, static_argnames=("tp",))
def _predict_jit(params, machine, llm, p, b, t, cap, *, tp):
    return predict_rows(params, machine, llm, p, b, t, tp=tp, cap_frac=cap)


def _bucket(n: int) -> int:
    """Padded length for n rows (powers of two from 64): few distinct shapes to compile."""
    return max(64, 1 << (max(n, 1) - 1).bit_length())



def predict_frame(fitted, rows: pd.DataFrame) -> pd.DataFrame:
    """Predict prompt_time, token_time (ms) and power fractions for profile-like rows.

    Args:
        fitted: the calibration (`fit.Fitted`: anything with `params_for(gpu_name)`).
        rows: columns model, hardware, tensor_parallel, prompt_size, batch_size,
            token_size (names as in the catalogue and `catalog.MACHINE_OF_HARDWARE`;
            values already validated, e.g. by `calibrate.queries.validate_queries`).

    Returns:
        DataFrame indexed like `rows` with prompt_time, token_time (ms, the profiles'
        meaning: one prompt iteration; the mean decode iteration), peak_power and
        average_power (fractions of TDP).
    """
    out = pd.DataFrame(index=rows.index, columns=["prompt_time", "token_time", "peak_power", "average_power"],
                       dtype=float)
    for (model, hardware, tp), q in rows.groupby(list(SERIES_KEYS), sort=False):
        machine = get_machine(MACHINE_OF_HARDWARE[hardware])
        params = fitted.params_for(machine.gpu.name)
        n = len(q)
        pad = _bucket(n) - n

        def col(name):
            v = q[name].to_numpy(float)
            return jnp.asarray(np.concatenate([v, np.full(pad, v[0])]))

        pred = _predict_jit(params, machine, get_llm(model), col("prompt_size"), col("batch_size"),
                            col("token_size"), float(CAP_OF_HARDWARE[hardware]), tp=int(tp))
        out.loc[q.index, "prompt_time"] = np.asarray(pred.prompt_s)[:n] * 1e3
        out.loc[q.index, "token_time"] = np.asarray(pred.token_s)[:n] * 1e3
        out.loc[q.index, "peak_power"] = np.asarray(pred.peak_frac)[:n]
        out.loc[q.index, "average_power"] = np.asarray(pred.avg_frac)[:n]
    return out

