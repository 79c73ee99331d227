"""Calibrate the phase model on the measured profiles, and measure its held-out error.

Library first (fit, splits, error tables), command line at the bottom (`main`).

What is fitted
--------------
`PhaseParams` (all positive) in log space. Every field has a *shared* value; the fields
in `FitConfig.per_gpu_fields` also get a per-GPU log-deviation, penalised by
`deviation_penalty * deviation**2`, so a GPU's value is shared x exp(deviation). With
two GPUs the shared value sits between them; a GPU without an override (a new one)
runs on the shared values and its own spec sheet, which is what split (c) measures.

Loss: pseudo-Huber on log(predicted / measured) with scale `huber_scale` (0.05: errors
under ~5% count quadratically, larger ones linearly, so a stray configuration pulls
with bounded force), over configuration medians, for prompt time, token time, and, on
A100 (the only GPU with power measured), peak power (prompt-phase draw / TDP) and
average power (request-average draw / TDP). Configurations flagged by
`profiles.flag_outliers` are reported and excluded.

References:
    Patel et al., Splitwise, ISCA 2024, §III (the profiles, insights III-VII) and §V-A
    (SplitwiseSim's interpolating performance model, the baseline here).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd

from splitwise_jax.batch import Batch
from splitwise_jax.catalog import CAP_OF_HARDWARE, MACHINE_OF_HARDWARE, get_llm, get_machine
from splitwise_jax.params import PRIOR, PhaseParams, save_params
from splitwise_jax.phases import iteration
from splitwise_jax.profiles import CONFIG_KEYS, SERIES_KEYS, flag_outliers, profile_medians

FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(PhaseParams))


# ---------------------------------------------------------------------------------------
# Configuration


@dataclasses.dataclass(frozen=True)
class FitConfig:
    """Options of one calibration (all with defaults; see the module docstring).

    Attributes:
        per_gpu_fields: fields that get a per-GPU deviation from the shared value.
        frozen_fields: fields held at their starting value (the profiles cannot see them).
        steps: Adam steps.
        learning_rate: peak Adam step in log-parameter units (warm-up then cosine decay).
        huber_scale: pseudo-Huber scale on log errors (0.05 ~ 5%).
        w_prompt, w_token, w_power: weights of the three terms (per configuration).
        deviation_penalty: weight on squared per-GPU log-deviations.
        prior_penalty: weight on squared log(shared / start), keeps fields the data
            barely see near their physical prior.
        exclude_outliers: drop the configurations `profiles.flag_outliers` flags.
    """

    per_gpu_fields: tuple[str, ...] = ("mfu_max", "bw_eff", "t_iter_s", "t_layer_s")
    frozen_fields: tuple[str, ...] = ("kv_link_eff",)
    steps: int = 3000
    learning_rate: float = 0.05
    huber_scale: float = 0.05
    w_prompt: float = 1.0
    w_token: float = 1.0
    w_power: float = 0.3
    deviation_penalty: float = 1e-3
    prior_penalty: float = 1e-4
    exclude_outliers: bool = True

    def replace(self, **changes) -> "FitConfig":
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------
# Data: configuration medians arranged into static groups of (model, TP)
#
# One group per (model, tensor parallel): those fix the shapes of the computation (layers,
# hidden size and TP are static). The GPU, its power cap and its parameters vary per row,
# as arrays, so the loss traces one model evaluation per group, not per hardware.


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
        ))
    return tuple(keys), data


# ---------------------------------------------------------------------------------------
# The model evaluated on profile rows


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
    p = jnp.asarray(prompt_size, dtype=float)
    b = jnp.asarray(batch_size, dtype=float)
    t = jnp.asarray(token_size, dtype=float)
    pr = iteration(params, machine, llm, Batch.prompts(p, b), tp=tp, cap_frac=cap_frac)
    tk = iteration(params, machine, llm, Batch.decode(b, p + 0.5 * t), tp=tp, cap_frac=cap_frac)
    tdp = machine.gpu.tdp_w
    decode_total = t * tk.latency_s
    avg = (pr.power_w * pr.latency_s + tk.power_w * decode_total) / (pr.latency_s + decode_total)
    return RowPredictions(pr.latency_s, tk.latency_s, pr.power_w / tdp, avg / tdp)


# ---------------------------------------------------------------------------------------
# Parameters in an unconstrained space
#
# Efficiencies are fractions of a peak (in (0, 1)): they live in logit space, so no fit
# can claim more than the spec sheet. Everything else is positive: log space.

UNIT_FIELDS: frozenset[str] = frozenset({"mfu_max", "bw_eff", "kv_bw_eff", "link_eff", "kv_link_eff"})
_IS_UNIT = np.array([f in UNIT_FIELDS for f in FIELDS])


def _to_raw(params: PhaseParams) -> np.ndarray:
    v = np.array([float(getattr(params, f)) for f in FIELDS])
    if np.any(v[_IS_UNIT] >= 1.0):
        bad = [f for f, x in zip(FIELDS, v) if f in UNIT_FIELDS and x >= 1.0]
        raise ValueError(f"efficiency fields {bad} must be < 1")
    return np.where(_IS_UNIT, np.log(v) - np.log1p(-np.minimum(v, 0.999999)), np.log(v))


def _from_raw(z):
    """Field values (last axis = FIELDS) from unconstrained values."""
    return jnp.where(jnp.asarray(_IS_UNIT), jax.nn.sigmoid(z), jnp.exp(z))


def _params_of(values) -> PhaseParams:
    return PhaseParams(**{f: values[..., i] for i, f in enumerate(FIELDS)})


class RawParams(NamedTuple):
    """Unconstrained parameters: shared [n_fields] and per-GPU deviations [n_gpus, n_fields]."""

    shared: jnp.ndarray
    deviation: jnp.ndarray
# ---------------------------------------------------------------------------------------
# Prediction of a table of rows


def predict_frame(fitted: Fitted, rows: pd.DataFrame) -> pd.DataFrame:
    """Predict prompt_time, token_time (ms) and power fractions for profile-like rows.

    Args:
        fitted: the calibration.
        rows: columns model, hardware, tensor_parallel, prompt_size, batch_size,
            token_size (validated by the caller).

    Returns:
        DataFrame indexed like `rows` with prompt_time, token_time (ms), peak_power,
        average_power (fraction of TDP).
    """
    out = pd.DataFrame(index=rows.index, columns=["prompt_time", "token_time", "peak_power", "average_power"],
                       dtype=float)
    for (model, hardware, tp), q in rows.groupby(list(SERIES_KEYS), sort=False):
        machine = get_machine(MACHINE_OF_HARDWARE[hardware])
        params = fitted.params_for(machine.gpu.name)
        pred = _predict_jit(params, machine, get_llm(model), q["prompt_size"].to_numpy(float),
                            q["batch_size"].to_numpy(float), q["token_size"].to_numpy(float), int(tp),
                            float(CAP_OF_HARDWARE[hardware]))
        out.loc[q.index, "prompt_time"] = np.asarray(pred.prompt_s) * 1e3
        out.loc[q.index, "token_time"] = np.asarray(pred.token_s) * 1e3
        out.loc[q.index, "peak_power"] = np.asarray(pred.peak_frac)
        out.loc[q.index, "average_power"] = np.asarray(pred.avg_frac)
    return out


@jax.jit
def _predict_jit_impl(params, machine, llm, p, b, t, cap, tp_holder):
    raise NotImplementedError


def _predict_jit(params, machine, llm, p, b, t, tp, cap):
    return _predict_static(params, machine, llm, jnp.asarray(p), jnp.asarray(b), jnp.asarray(t), cap, tp=tp)


@jax.jit
def _predict_static_inner(params, machine, llm, p, b, t, cap):  # pragma: no cover - replaced below
    raise NotImplementedError


from functools import partial  # noqa: E402


@partial(jax.jit, static_argnames=("tp",))
def _predict_static(params, machine, llm, p, b, t, cap, *, tp):
    return predict_rows(params, machine, llm, p, b, t, tp=tp, cap_frac=cap)
