"""Calibrate the phase model on the measured profiles, and measure its held-out error.

Library first (fit, splits, error tables), command line at the bottom (`main`).

What is fitted
--------------
`PhaseParams`, each mapped from an unconstrained value onto its physical range (see
`BOUNDS`: log for positive fields, a scaled logit for bounded ones). Every field has a
*shared* value; the fields in `FitConfig.per_gpu_fields` also get a per-GPU deviation in
that space, penalised by `deviation_penalty * deviation**2`. With two GPUs the shared
value sits between them; a GPU without an override (a new one) runs on the shared
values and its own spec sheet, which is what split (c) measures. Adam (optax), float64,
in jitted chunks of steps with a tqdm bar; docs/calibration.md has the choices and the
results.

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
import json
import math
import time
from functools import partial
from pathlib import Path
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd

from splitwise_jax.batch import Batch
from splitwise_jax.catalog import CAP_OF_HARDWARE, MACHINE_OF_HARDWARE, get_llm, get_machine, llm_names
from splitwise_jax.hardware import GPU, Machine
from splitwise_jax.params import FITTED_PARAMS_FILE, PRIOR, PhaseParams, save_params
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
        w_capped_token: extra weight on the token time of power-capped rows: their token
            time equals the uncapped one (Splitwise insight VII), and without the extra
            weight the fit traded ~3% of decode slowdown under a 70% cap for prompt
            accuracy elsewhere.
        deviation_penalty: weight on squared per-GPU log-deviations.
        prior_penalty: weight on squared log(shared / start), keeps fields the data
            barely see near their physical prior.
        exclude_outliers: drop the configurations `profiles.flag_outliers` flags.
    """

    per_gpu_fields: tuple[str, ...] = (
        "mfu_max", "n_half_tokens", "attn_eff", "roofline_p", "bw_eff", "kv_bw_eff", "link_eff",
        "allreduce_latency_s", "comm_knee_tokens", "comm_knee_exp", "comm_knee_slowdown", "t_iter_s",
        "t_layer_s", "t_prompt_seq_s", "t_decode_seq_s", "t_ctx_token_s", "overlap_p")
    frozen_fields: tuple[str, ...] = ("knee_tokens", "knee_exp", "kv_link_eff")
    steps: int = 2000
    learning_rate: float = 0.05
    huber_scale: float = 0.05
    w_prompt: float = 1.0
    w_token: float = 1.0
    w_power: float = 1.0
    w_capped_token: float = 4.0
    deviation_penalty: float = 1e-3
    prior_penalty: float = 1e-4
    exclude_outliers: bool = True

    def replace(self, **changes) -> "FitConfig":
        return dataclasses.replace(self, **changes)


#: Where every fit starts, and what the prior penalty pulls shared values towards: the
#: physical prior, except that the compute roll-off (knee_tokens, knee_exp) is moved out
#: of the profiled range and frozen, because the all-reduce step
#: (phases.allreduce_slowdown) describes the data's step at 2-4k tokens and, bounded,
#: extrapolates sanely, whereas an unbounded roll-off fitted to 8k tokens multiplied
#: prompt time at 32k tokens by ~20 in split (b).
FIT_START = PRIOR.replace(knee_tokens=1e6, knee_exp=1.0, overlap_p=3.0, n_half_tokens=30.0, link_eff=0.3,
                          comm_knee_slowdown=1.0)


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
# Parameters in an unconstrained space
#
# Every field lives in an unconstrained space mapped onto its physical range: (lo, hi)
# through lo + (hi - lo) sigmoid(z), (lo, inf) through lo + exp(z). Efficiencies are
# fractions of a spec-sheet peak, so no fit can claim more than the spec sheet; p-norm
# and DVFS exponents exceed 1; a unit's power draw at full use is at most (TDP - idle)
# for memory and NVLink and 1.5 x (TDP - idle) for the tensor cores (a board can demand
# more than its TDP and then throttles: the A100 profiles' prompt power sits at
# 1.00-1.03 x TDP). Without these bounds a fit gave NVLink transfers 3.4 x (TDP - idle)
# to make the capped H100 prompts slow at TP8.

_INF = float("inf")
BOUNDS: dict[str, tuple[float, float]] = {
    **{f: (0.0, 1.0) for f in ("mfu_max", "attn_eff", "bw_eff", "kv_bw_eff", "link_eff", "kv_link_eff",
                               "mem_clock_sensitivity", "p_memory_frac", "p_comm_frac")},
    **{f: (1.0, _INF) for f in ("roofline_p", "overlap_p", "dvfs_exponent")},
    "p_compute_frac": (0.0, 1.5),
}
_LO = np.array([BOUNDS.get(f, (0.0, _INF))[0] for f in FIELDS])
_HI = np.array([BOUNDS.get(f, (0.0, _INF))[1] for f in FIELDS])
_BOUNDED = np.isfinite(_HI)


def _to_raw(params: PhaseParams) -> np.ndarray:
    """Unconstrained values of a parameter set (inverse of `_from_raw`)."""
    v = np.array([float(getattr(params, f)) for f in FIELDS])
    bad = [f"{f}={x:g} not in ({lo:g}, {hi:g})" for f, x, lo, hi in zip(FIELDS, v, _LO, _HI) if not lo < x < hi]
    if bad:
        raise ValueError(f"starting values out of range: {bad}")
    span = np.where(_BOUNDED, _HI - _LO, 1.0)
    u = np.where(_BOUNDED, (v - _LO) / span, 0.5)
    return np.where(_BOUNDED, np.log(u) - np.log1p(-u), np.log(v - _LO))


def _from_raw(z):
    """Field values (last axis = FIELDS) from unconstrained values."""
    lo = jnp.asarray(_LO)
    span = jnp.asarray(np.where(_BOUNDED, _HI - _LO, 1.0))
    # where() between two finite branches: both are finite for every z
    return jnp.where(jnp.asarray(_BOUNDED), lo + span * jax.nn.sigmoid(z), lo + jnp.exp(z))


def _params_of(values) -> PhaseParams:
    return PhaseParams(**{f: values[..., i] for i, f in enumerate(FIELDS)})


class RawParams(NamedTuple):
    """Unconstrained parameters: shared [n_fields] and per-GPU deviations [n_gpus, n_fields]."""

    shared: jnp.ndarray
    deviation: jnp.ndarray
@dataclasses.dataclass(frozen=True)
class Fitted:
    """A calibration: shared parameters plus per-GPU overrides (absolute values)."""

    shared: PhaseParams
    per_gpu: dict[str, dict[str, float]]
    meta: dict

    def params_for(self, gpu_name: str) -> PhaseParams:
        """Parameters a GPU runs on: its overrides if any, else the shared values."""
        override = self.per_gpu.get(gpu_name)
        return PhaseParams.from_dict(override, base=self.shared) if override else self.shared

    def save(self, path) -> None:
        save_params(path, self.shared, self.per_gpu, self.meta)

    @classmethod
    def load(cls, path=None) -> "Fitted":
        """Read a params file (default: the shipped fit; the prior if none ships)."""
        p = Path(path) if path is not None else FITTED_PARAMS_FILE
        if not p.exists():
            if path is None:
                return cls(PRIOR, {}, {"source": "prior (no fitted file shipped)"})
            raise ValueError(f"params file {p} does not exist")
        data = _read_params_file(p)
        shared = PhaseParams.from_dict(data["shared"])
        per_gpu = data.get("per_gpu") or {}
        if not isinstance(per_gpu, dict) or not all(isinstance(v, dict) for v in per_gpu.values()):
            raise ValueError(f"params file {p}: 'per_gpu' must map GPU names to objects of fields")
        for override in per_gpu.values():
            PhaseParams.from_dict(override, base=shared)  # validates names and values
        return cls(shared, {k: dict(v) for k, v in per_gpu.items()}, dict(data.get("meta") or {}))


def _read_params_file(p: Path) -> dict:
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"params file {p} cannot be read: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("shared"), dict):
        raise ValueError(f"params file {p} must be a JSON object with a 'shared' object of PhaseParams fields")
    return data


# ---------------------------------------------------------------------------------------
# Loss and fit


def _pseudo_huber(r, scale):
    """scale^2 (sqrt(1 + (r/scale)^2) - 1): r^2/2 for |r| << scale, scale |r| beyond."""
    return scale**2 * (jnp.sqrt(1.0 + (r / scale) ** 2) - 1.0)


def _make_loss(keys, cfg: FitConfig, dev_mask, raw_start):
    llms = [get_llm(m) for m, _ in keys]

    def loss(theta: RawParams, data):
        h = cfg.huber_scale
        total = 0.0
        n = 0.0
        for k, (_, tp) in enumerate(keys):
            d = data[k]
            raw = theta.shared[None, :] + theta.deviation[d.gpu_index] * dev_mask[None, :]
            params = _params_of(_from_raw(raw))
            pred = predict_rows(params, d.machine, llms[k], d.prompt_size, d.batch_size, d.token_size, tp=tp,
                                cap_frac=d.cap_frac)
            rp = jnp.log(pred.prompt_s) - d.log_prompt_s
            rt = jnp.log(pred.token_s) - d.log_token_s
            rpk = jnp.log(pred.peak_frac / d.peak_frac)
            rav = jnp.log(pred.avg_frac / d.avg_frac)
            total = total + cfg.w_prompt * jnp.sum(d.w_prompt * _pseudo_huber(rp, h))
            total = total + cfg.w_token * jnp.sum(d.w_token * _pseudo_huber(rt, h))
            total = total + cfg.w_power * jnp.sum(d.w_power * _pseudo_huber(rpk, h)
                                                  + d.w_avg_power * _pseudo_huber(rav, h))
            n = n + jnp.sum(d.w_prompt)
        data_term = total / jnp.maximum(n, 1.0) / h**2
        reg = (cfg.deviation_penalty * jnp.sum(theta.deviation**2)
               + cfg.prior_penalty * jnp.sum((theta.shared - raw_start) ** 2))
        return data_term + reg

    return loss


_CHUNK = 50  # Adam steps per compiled call (one progress-bar tick)
_COMPILED: dict = {}


def _learning_rate(cfg: FitConfig, step: int) -> float:
    """Linear warm-up over the first 5% of steps, then cosine decay to 1% of the peak."""
    warm = max(1, cfg.steps // 20)
    if step < warm:
        return cfg.learning_rate * (step + 1) / warm
    frac = min(1.0, (step - warm) / max(1, cfg.steps - warm))
    return cfg.learning_rate * (0.01 + 0.99 * 0.5 * (1.0 + math.cos(math.pi * frac)))


def _compiled(keys, gpus, cfg: FitConfig, raw_start_key):
    """The jitted chunk of Adam steps for one problem layout, cached: one compile serves
    every split, seed and step count (they differ only in row weights and the rate)."""
    cfg_key = cfg.replace(steps=0, learning_rate=0.0)
    ck = (keys, gpus, cfg_key, raw_start_key)
    if ck in _COMPILED:
        return _COMPILED[ck]
    dev_mask = jnp.asarray([1.0 if f in cfg.per_gpu_fields else 0.0 for f in FIELDS])
    free_mask = jnp.asarray([0.0 if f in cfg.frozen_fields else 1.0 for f in FIELDS])
    loss = _make_loss(keys, cfg, dev_mask, jnp.asarray(raw_start_key))
    adam = optax.scale_by_adam()
    grad_mask = RawParams(free_mask, dev_mask[None, :] * free_mask[None, :] * jnp.ones((len(gpus), 1)))

    @jax.jit
    def run_chunk(theta, state, data, gpu_has_data, rate):
        # A GPU without training rows keeps a zero deviation: it runs on the shared values.
        mask = grad_mask._replace(deviation=grad_mask.deviation * gpu_has_data[:, None])

        def step(carry, _):
            theta, state = carry
            value, grads = jax.value_and_grad(loss)(theta, data)
            grads = jax.tree_util.tree_map(jnp.multiply, grads, mask)
            updates, state = adam.update(grads, state, theta)
            theta = jax.tree_util.tree_map(lambda t, u: t - rate * u, theta, updates)
            return (theta, state), value

        (theta, state), values = jax.lax.scan(step, (theta, state), None, length=_CHUNK)
        return theta, state, values

    _COMPILED[ck] = (adam, run_chunk)
    return _COMPILED[ck]


def outlier_ids(medians: pd.DataFrame) -> set[int]:
    """config_ids that `profiles.flag_outliers` flags (any metric).

    The whole configuration is dropped, not only the flagged prompt time: the flagged
    run (Llama2-70B TP2, batch 64 x 512) also reports a token time below batch 32's on
    every hardware (67 vs 72 ms on A100, 42 vs 52 ms on H100), so it is not trusted.
    """
    flags = flag_outliers(medians)
    return set(int(i) for i in flags["config_id"].tolist())


#: An average power below this fraction of its series' median is not fitted (see
#: `power_outliers`).
POWER_OUTLIER_FRACTION = 0.5


def power_outliers(medians: pd.DataFrame) -> pd.DataFrame:
    """Configurations whose measured average power is implausible, with the reason.

    Rule: average power below POWER_OUTLIER_FRACTION x the median average power of its
    (model, hardware, TP) series. In the shipped profiles this flags Llama2-70B at
    prompt 8,192 on A100 (TP 2, 4, 8): 0.17-0.18 of TDP, barely above idle (0.15),
    for a request that spends seconds in a prompt drawing ~1.0 x TDP and the rest in
    decode at >= 0.43 (its neighbours at 4,096 tokens: 0.39-0.68). Their peak power
    and times are kept; only the average power is left out of the fit.
    """
    med = medians[np.isfinite(medians["average_power_frac"])]
    series = med.groupby(list(SERIES_KEYS))["average_power_frac"].transform("median")
    bad = med[med["average_power_frac"] < POWER_OUTLIER_FRACTION * series]
    return bad[list(CONFIG_KEYS) + ["config_id", "average_power_frac"]].assign(
        reason=[f"average power {v:.2f} x TDP is below {POWER_OUTLIER_FRACTION:g} x its series' median "
                f"({m:.2f})" for v, m in zip(bad["average_power_frac"], series[bad.index])])


def fit(medians: pd.DataFrame, *, config: FitConfig = FitConfig(), train_ids=None, start: PhaseParams = FIT_START,
        progress: bool = True, desc: str = "calibrating") -> tuple[Fitted, list[float]]:
    """Fit the phase model to configuration medians by Adam on the robust log-error loss.

    Args:
        medians: `profiles.profile_medians` output.
        config: fit options.
        train_ids: config_ids to fit on (default: all); other rows are carried with
            weight 0 (so every split reuses one compiled loss).
        start: starting values, also the prior the penalty pulls shared values to.
        progress: show a tqdm bar.
        desc: the bar's label.

    Returns:
        (the calibration, the loss after every chunk of 50 steps; last = final loss).

    Raises:
        ValueError: nothing left to fit, or a starting efficiency >= 1.

    Example:
        >>> med = profile_medians(load_profiles())
        >>> fitted, history = fit(med, config=FitConfig(steps=200), progress=False)
        >>> history[-1] < history[0]
        True
    """
    from tqdm.auto import tqdm

    med = medians.sort_values("config_id").reset_index(drop=True)
    use = np.ones(len(med), bool) if train_ids is None else med["config_id"].isin(set(train_ids)).to_numpy().copy()
    if config.exclude_outliers:
        use &= ~med["config_id"].isin(outlier_ids(medians)).to_numpy()
    if not use.any():
        raise ValueError("no configurations to fit (check train_ids and the outlier filter)")
    gpus = tuple(sorted({gpu_of_hardware(h) for h in med["hardware"]}))
    gpu_has_data = jnp.asarray([float(any(gpu_of_hardware(h) == g for h in med.loc[use, "hardware"])) for g in gpus])
    w = use.astype(float)
    w_avg = w * ~med["config_id"].isin(set(power_outliers(medians)["config_id"])).to_numpy()
    capped = med["hardware"].map(lambda h: CAP_OF_HARDWARE[h] < 1.0).to_numpy()
    w_tok = w * np.where(capped, config.w_capped_token, 1.0)
    med = med.assign(w_prompt=w, w_token=w_tok, w_power=w, w_avg_power=w_avg)
    keys, data = _design(med, gpus)
    raw_start = _to_raw(start)
    adam, run_chunk = _compiled(keys, gpus, config, tuple(raw_start.tolist()))
    theta = RawParams(jnp.asarray(raw_start), jnp.zeros((len(gpus), len(FIELDS))))
    state = adam.init(theta)

    history = []
    t0 = time.perf_counter()
    n_chunks = max(1, math.ceil(config.steps / _CHUNK))
    bar = tqdm(range(n_chunks), desc=desc, disable=not progress, leave=False)
    for k in bar:
        rate = jnp.asarray(_learning_rate(config, k * _CHUNK))
        theta, state, values = run_chunk(theta, state, data, gpu_has_data, rate)
        if k == 0:
            history.append(float(values[0]))
        history.append(float(values[-1]))
        bar.set_postfix(loss=f"{history[-1]:.4g}")
    bar.close()

    # With a single GPU in the data, its deviation and the shared value are the same
    # degree of freedom: fold it in, so the shared values are that GPU's fit (split c).
    dev_mask = np.array([f in config.per_gpu_fields for f in FIELDS], float)
    shared = np.asarray(theta.shared)
    deviation = np.asarray(theta.deviation) * dev_mask[None, :]
    has = np.asarray(gpu_has_data) > 0
    if has.sum() == 1:
        shared = shared + deviation[has][0]
        deviation = np.zeros_like(deviation)
    final = history[-1]

    values = np.asarray(_from_raw(jnp.asarray(shared)))
    shared_params = PhaseParams(**{f: float(values[i]) for i, f in enumerate(FIELDS)})
    per_gpu = {}
    for gi, gpu in enumerate(gpus):
        if not has[gi] or has.sum() == 1:
            continue
        v = np.asarray(_from_raw(jnp.asarray(shared + deviation[gi])))
        per_gpu[gpu] = {f: float(v[i]) for i, f in enumerate(FIELDS) if f in config.per_gpu_fields}
    meta = {
        "loss": final,
        "steps": int(config.steps),
        "fit_seconds": round(time.perf_counter() - t0, 2),
        "n_configs_fitted": int(use.sum()),
        "gpus_fitted": [g for g, h in zip(gpus, has) if h],
        "huber_scale": config.huber_scale,
        "per_gpu_fields": list(config.per_gpu_fields),
        "frozen_fields": list(config.frozen_fields),
    }
    return Fitted(shared_params, per_gpu, meta), history


# ---------------------------------------------------------------------------------------
# Prediction of a table of rows


@partial(jax.jit, static_argnames=("tp",))
def _predict_jit(params, machine, llm, p, b, t, cap, *, tp):
    return predict_rows(params, machine, llm, p, b, t, tp=tp, cap_frac=cap)


def _bucket(n: int) -> int:
    """Padded length for n rows (powers of two from 64): few distinct shapes to compile."""
    return max(64, 1 << (max(n, 1) - 1).bit_length())


def predict_frame(fitted: Fitted, rows: pd.DataFrame) -> pd.DataFrame:
    """Predict prompt_time, token_time (ms) and power fractions for profile-like rows.

    Args:
        fitted: the calibration.
        rows: columns model, hardware, tensor_parallel, prompt_size, batch_size,
            token_size (names as in the catalogue and `catalog.MACHINE_OF_HARDWARE`;
            values already validated, e.g. by `predict.validate_queries`).

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


# ---------------------------------------------------------------------------------------
# Held-out splits
#
# Each split returns (train config_ids, test config_ids) over the medians with the
# flagged outliers removed from both sides (they are reported, not scored).

SPLITS = ("random", "extrapolation", "spec_transfer")
SPLIT_LABELS = {
    "random": "(a) random 80:20 over configurations",
    "extrapolation": "(b) extrapolation: largest batch-token levels held out",
    "spec_transfer": "(c) spec transfer: fit on A100, predict H100 from its spec sheet",
}


def _clean(medians: pd.DataFrame) -> pd.DataFrame:
    return medians[~medians["config_id"].isin(outlier_ids(medians))]


def split_random(medians: pd.DataFrame, seed: int, test_frac: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """(a) A random `test_frac` of the distinct configurations (not rows) held out.

    The triplicated 512 x 1 x 128 block is one configuration, so its repeats never
    straddle the split.
    """
    ids = np.sort(_clean(medians)["config_id"].to_numpy())
    rng = np.random.default_rng(seed)
    perm = rng.permutation(ids)
    n_test = int(round(test_frac * len(ids)))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def split_extrapolation(medians: pd.DataFrame, levels: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(b) Per (model, hardware, TP), the configurations at the `levels` largest
    batch-token counts held out (16,384 and 32,768 in the shipped grid: prompt 512 at
    batch 32 and 64), everything below fitted."""
    med = _clean(medians)
    rank = med.groupby(list(SERIES_KEYS))["batch_tokens"].rank(method="dense", ascending=False)
    test = med["config_id"][rank <= levels].to_numpy()
    train = med["config_id"][rank > levels].to_numpy()
    return np.sort(train), np.sort(test)


def split_spec_transfer(medians: pd.DataFrame, train_gpu: str = "a100-80gb") -> tuple[np.ndarray, np.ndarray]:
    """(c) Fit on one GPU's rows only; every other GPU's rows (the power-capped H100
    rows included) are predicted from the shared parameters and their spec sheet."""
    med = _clean(medians)
    on = med["hardware"].map(gpu_of_hardware) == train_gpu
    return np.sort(med["config_id"][on].to_numpy()), np.sort(med["config_id"][~on].to_numpy())


def _spec_scaled_baseline(train_rows: pd.DataFrame, query: pd.DataFrame) -> pd.DataFrame:
    """Baseline for split (c): the training GPU's interpolation table for the same
    (model, TP), prompt time scaled by the FLOP/s ratio and token time by the HBM
    bandwidth ratio of the two spec sheets (SplitwiseSim itself cannot predict a GPU it
    has no profile of). No power-cap model."""
    out = pd.DataFrame(index=query.index, columns=["prompt_time", "token_time"], dtype=float)
    for (model, hardware, tp), q in query.groupby(list(SERIES_KEYS), sort=False):
        gpu = get_machine(MACHINE_OF_HARDWARE[hardware]).gpu
        src = train_rows[(train_rows["model"] == model) & (train_rows["tensor_parallel"] == tp)]
        if src.empty:
            continue
        src_hw = src["hardware"].iloc[0]
        src_gpu = get_machine(MACHINE_OF_HARDWARE[src_hw]).gpu
        pred = _safe_interp(src, q.assign(hardware=src_hw))
        out.loc[q.index, "prompt_time"] = pred["prompt_time"] * float(src_gpu.peak_flops_per_s / gpu.peak_flops_per_s)
        out.loc[q.index, "token_time"] = pred["token_time"] * float(src_gpu.hbm_bw_bytes_per_s / gpu.hbm_bw_bytes_per_s)
    return out


def _safe_interp(train_rows: pd.DataFrame, query: pd.DataFrame) -> pd.DataFrame:
    """`sim_table.interp_baseline_predict`, series by series; NaN where a series has
    fewer than two training knots."""
    from splitwise_jax.sim_table import interp_baseline_predict

    out = pd.DataFrame(index=query.index, columns=["prompt_time", "token_time"], dtype=float)
    for _, q in query.groupby(list(SERIES_KEYS), sort=False):
        try:
            out.loc[q.index] = interp_baseline_predict(train_rows, q)[["prompt_time", "token_time"]].to_numpy()
        except ValueError:
            pass
    return out


def evaluate_split(rows: pd.DataFrame, medians: pd.DataFrame, split: str, seeds: Sequence[int] = (0,), *,
                   config: FitConfig = FitConfig(), progress: bool = True) -> pd.DataFrame:
    """Fit on a split's training configurations and predict its held-out ones.

    Args:
        rows: the profile rows (`profiles.load_profiles`), for the baseline, which
            builds its knots from rows as SplitwiseSim does.
        medians: `profiles.profile_medians(rows)`.
        split: one of `SPLITS`.
        seeds: seeds of the random split (the other splits are deterministic and run once).
        config: fit options.
        progress: tqdm bars.

    Returns:
        One row per (seed, held-out configuration): CONFIG_KEYS, config_id, split, seed,
        measured prompt_time / token_time (ms, medians), the model's (`model_*`) and the
        baseline's (`base_*`) predictions.

    Raises:
        ValueError: unknown split, or a split with nothing to train or test on.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    runs = [(s, *split_random(medians, s)) for s in seeds] if split == "random" else \
        [(0, *(split_extrapolation(medians) if split == "extrapolation" else split_spec_transfer(medians)))]
    frames = []
    for seed, train_ids, test_ids in runs:
        if len(train_ids) == 0 or len(test_ids) == 0:
            raise ValueError(f"split {split!r} leaves {len(train_ids)} training and {len(test_ids)} test "
                             "configurations in these profiles")
        fitted, _ = fit(medians, config=config, train_ids=train_ids, progress=progress,
                        desc=f"{split} seed {seed}" if split == "random" else split)
        test = medians[medians["config_id"].isin(set(test_ids))]
        pred = predict_frame(fitted, test)
        train_rows = rows[rows["config_id"].isin(set(train_ids))]
        base = _spec_scaled_baseline(train_rows, test) if split == "spec_transfer" else _safe_interp(train_rows, test)
        frames.append(test[list(CONFIG_KEYS) + ["config_id", "batch_tokens", "prompt_time", "token_time"]].assign(
            split=split, seed=seed,
            model_prompt_time=pred["prompt_time"].to_numpy(), model_token_time=pred["token_time"].to_numpy(),
            base_prompt_time=base["prompt_time"].to_numpy(), base_token_time=base["token_time"].to_numpy()))
    return pd.concat(frames, ignore_index=True)


def _errors(predictions: pd.DataFrame) -> pd.DataFrame:
    df = predictions.copy()
    for who in ("model", "base"):
        for ph in ("prompt", "token"):
            df[f"{who}_{ph}_err"] = 100.0 * (df[f"{who}_{ph}_time"] / df[f"{ph}_time"] - 1.0).abs()
    return df


def _agg(g: pd.DataFrame) -> pd.Series:
    out = {"n": len(g)}
    for who in ("model", "base"):
        for ph in ("prompt", "token"):
            e = g[f"{who}_{ph}_err"]
            out[f"{who}_{ph}_mape"] = e.mean() if e.notna().any() else np.nan
            out[f"{who}_{ph}_max"] = e.max() if e.notna().any() else np.nan
    return pd.Series(out)


def error_table(predictions: pd.DataFrame) -> pd.DataFrame:
    """MAPE and max |error| (%) per split and (model, hardware, TP), model vs baseline.

    Args:
        predictions: rows of `evaluate_split` (several splits concatenated is fine).

    Returns:
        Columns split, model, hardware, tensor_parallel, n (held-out predictions scored,
        all seeds pooled), then {model,base}_{prompt,token}_{mape,max} in percent (NaN
        where the baseline has no prediction). Error = |predicted / measured median - 1|.
    """
    df = _errors(predictions)
    by = ["split", "model", "hardware", "tensor_parallel"]
    table = df.groupby(by, sort=False).apply(_agg, include_groups=False).reset_index()
    table["n"] = table["n"].astype(int)
    return table


def summary_table(predictions: pd.DataFrame) -> pd.DataFrame:
    """Per split: all held-out predictions; TP 4 and 8 only; and each hardware kind.

    Returns:
        Columns split, subset, n and the error columns of `error_table`.
    """
    df = _errors(predictions)
    rows = []
    for split, g in df.groupby("split", sort=False):
        subsets = [("all", g), ("TP 4 and 8", g[g["tensor_parallel"] >= 4])]
        subsets += [(f"hardware {h}", gh) for h, gh in g.groupby("hardware", sort=True)]
        for name, sub in subsets:
            if len(sub):
                rows.append({"split": split, "subset": name, **_agg(sub).to_dict()})
    out = pd.DataFrame(rows)
    out["n"] = out["n"].astype(int)
    return out


# ---------------------------------------------------------------------------------------
# Reports (markdown, CSV, plot)


def _fmt(model: float, base: float) -> str:
    b = "-" if not np.isfinite(base) else f"{base:.1f}"
    return f"{model:.1f} / {b}"


def markdown_tables(predictions: pd.DataFrame) -> str:
    """The error tables as markdown: per split, a summary and the per-series table.

    Each cell reads "model / baseline" in percent.
    """
    summ = summary_table(predictions)
    detail = error_table(predictions)
    lines = []
    for split in [s for s in SPLITS if s in set(predictions["split"])]:
        seeds = sorted(set(predictions.loc[predictions["split"] == split, "seed"]))
        lines += [f"### {SPLIT_LABELS[split]}", ""]
        if split == "random":
            lines += [f"Seeds {seeds[0]}..{seeds[-1]} ({len(seeds)} random splits), all held-out predictions "
                      "pooled.", ""]
        head = ("| {} | n | prompt MAPE | prompt max | token MAPE | token max |\n"
                "|---|---:|---:|---:|---:|---:|")
        lines.append(head.format("subset"))
        for _, r in summ[summ["split"] == split].iterrows():
            lines.append(f"| {r['subset']} | {r['n']} | {_fmt(r['model_prompt_mape'], r['base_prompt_mape'])} | "
                         f"{_fmt(r['model_prompt_max'], r['base_prompt_max'])} | "
                         f"{_fmt(r['model_token_mape'], r['base_token_mape'])} | "
                         f"{_fmt(r['model_token_max'], r['base_token_max'])} |")
        lines.append("")
        lines.append(head.format("model, hardware, TP"))
        for _, r in detail[detail["split"] == split].iterrows():
            lines.append(f"| {r['model']}, {r['hardware']}, {r['tensor_parallel']} | {r['n']} | "
                         f"{_fmt(r['model_prompt_mape'], r['base_prompt_mape'])} | "
                         f"{_fmt(r['model_prompt_max'], r['base_prompt_max'])} | "
                         f"{_fmt(r['model_token_mape'], r['base_token_mape'])} | "
                         f"{_fmt(r['model_token_max'], r['base_token_max'])} |")
        lines.append("")
    return "\n".join(lines)


def plot_predicted_vs_measured(fitted: Fitted, medians: pd.DataFrame, path, held_out: pd.DataFrame | None = None):
    """Save a log-log predicted-vs-measured plot (prompt and token time, ms).

    Filled markers: the full fit on every configuration; open markers (if `held_out`
    is given): held-out predictions of split (a); crosses: the flagged outliers.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bad = outlier_ids(medians)
    pred = predict_frame(fitted, medians)
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    colors = {"a100-80gb": "tab:blue", "h100-80gb": "tab:orange", "h100-80gb-pcap": "tab:red"}
    for ax, ph in zip(axes, ("prompt", "token")):
        meas = medians[f"{ph}_time"].to_numpy()
        pr = pred[f"{ph}_time"].to_numpy()
        ok = ~medians["config_id"].isin(bad).to_numpy()
        for hw, c in colors.items():
            m = ok & (medians["hardware"] == hw).to_numpy()
            ax.scatter(meas[m], pr[m], s=14, color=c, label=f"{hw} (fit)")
        if held_out is not None and len(held_out):
            h = held_out[held_out["split"] == "random"]
            for hw, c in colors.items():
                m = (h["hardware"] == hw).to_numpy()
                ax.scatter(h[f"{ph}_time"][m], h[f"model_{ph}_time"][m], s=30, facecolors="none", edgecolors=c,
                           label=f"{hw} (held out, split a)")
        ax.scatter(meas[~ok], pr[~ok], marker="x", color="k", label="outlier (not fitted)")
        lo, hi = np.nanmin([meas.min(), pr.min()]) * 0.8, np.nanmax([meas.max(), pr.max()]) * 1.25
        ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
        for f in (0.9, 1.1):
            ax.plot([lo, hi], [lo * f, hi * f], "k:", lw=0.6)
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel=f"measured {ph} time (ms)",
               ylabel=f"predicted {ph} time (ms)", title=f"{ph} time (dotted: +-10%)")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------
# Command line


_SPLIT_ALIASES = {"a": "random", "b": "extrapolation", "c": "spec_transfer"}


def _parse_splits(text: str) -> list[str]:
    if text.strip().lower() in ("none", ""):
        return []
    out = []
    for s in text.split(","):
        s = _SPLIT_ALIASES.get(s.strip().lower(), s.strip().lower())
        if s not in SPLITS:
            raise ValueError(f"--splits: unknown split {s!r}; accepted: a, b, c, {', '.join(SPLITS)} or none")
        out.append(s)
    return out


def _parser():
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m splitwise_jax.calibrate",
        description="Fit the phase model to SplitwiseSim's measured profiles, write the parameters, and print "
                    "held-out errors against SplitwiseSim's interpolation.")
    p.add_argument("--profiles", default=None,
                   help="profile CSV (perf_model.csv columns); default: the shared perf_model.csv")
    p.add_argument("--out", default=None,
                   help=f"params JSON to write (default: the shipped {FITTED_PARAMS_FILE.name} in the package)")
    p.add_argument("--splits", default="a,b,c",
                   help="held-out splits to run: a (random 80:20), b (extrapolation), c (spec transfer), "
                        "comma-separated, or 'none' (default: a,b,c)")
    p.add_argument("--seeds", type=int, default=5, help="random splits to average over (default 5)")
    p.add_argument("--steps", type=int, default=None, help=f"Adam steps per fit (default {FitConfig.steps})")
    p.add_argument("--plot", default=None,
                   help="predicted-vs-measured PNG (default: next to --out, or calibration/ for the shipped fit)")
    p.add_argument("--report", default=None,
                   help="folder for README.md (error tables) and errors.csv (default: calibration/ when "
                        "writing the shipped fit from a checkout, else none)")
    p.add_argument("--quick", action="store_true", help="smoke run: 400 steps, 2 seeds")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _report_text(fitted: Fitted, summary_md: str, outliers: pd.DataFrame, power_bad: pd.DataFrame,
                 command: str) -> str:
    pg, frozen = fitted.meta.get("per_gpu_fields", []), fitted.meta.get("frozen_fields", [])
    shared = ", ".join(f"`{f}`" for f in FIELDS if f not in pg and f not in frozen)
    per_gpu = ", ".join(f"`{f}`" for f in pg)
    frozen_txt = ", ".join(f"`{f}`" for f in frozen) or "none"
    out_lines = "\n".join(f"- {r['model']} {r['hardware']} TP{r['tensor_parallel']} prompt {r['prompt_size']} x "
                          f"batch {r['batch_size']}: {r['reason']}" for _, r in outliers.iterrows()) or "- none"
    pow_lines = "\n".join(f"- {r['model']} {r['hardware']} TP{r['tensor_parallel']} prompt {r['prompt_size']} x "
                          f"batch {r['batch_size']}: {r['reason']}" for _, r in power_bad.iterrows()) or "- none"
    return f"""# Calibration of the phase model: held-out accuracy

Generated by `{command}` (do not edit by hand; docs/calibration.md explains the method).
Every cell reads **model / baseline**, in percent; error = |predicted / measured - 1| on
configuration medians (5 repeats each). The baseline is SplitwiseSim's own performance
model: piecewise-linear interpolation of the training rows' medians over batch tokens
(`sim_table.interp_baseline_predict`), fitted on the same training configurations. For
split (c) SplitwiseSim has no H100 rows to interpolate, so the baseline is the A100
table scaled by the spec-sheet ratios (FLOP/s for prompt time, HBM bandwidth for token
time; no power-cap model).

Parameters: shared across GPUs: {shared}.
Per GPU (a deviation from the shared value, penalised; a GPU without an entry runs on
the shared values): {per_gpu}. Held at their starting values: {frozen_txt}.

## Outliers (reported, not fitted, not scored)

{out_lines}

Average power left out of the fit (times kept):

{pow_lines}

## Held-out error

{summary_md}
"""


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (see `_parser`); returns the exit status."""
    import shlex
    import sys

    from splitwise_jax.profiles import load_profiles

    jax.config.update("jax_enable_x64", True)
    args = _parser().parse_args(argv)
    try:
        splits = _parse_splits(args.splits)
        if args.seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
        if args.steps is not None and args.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {args.steps}")
        if args.profiles is not None and not Path(args.profiles).is_file():
            raise ValueError(f"--profiles {args.profiles} does not exist")
        try:
            rows = load_profiles(args.profiles)
        except FileNotFoundError as e:
            raise ValueError(f"{e}; pass --profiles PATH") from None
        for col, known in (("model", llm_names()), ("hardware", sorted(MACHINE_OF_HARDWARE))):
            unknown = sorted(set(rows[col]) - set(known))
            if unknown:
                raise ValueError(f"--profiles: unknown {col} {unknown}; the catalogue knows {known}")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    steps = args.steps or (400 if args.quick else FitConfig.steps)
    seeds = range(2 if args.quick and args.seeds == 5 else args.seeds)
    config = FitConfig(steps=steps)
    progress = not args.no_progress
    default_out = args.out is None
    out = FITTED_PARAMS_FILE if default_out else Path(args.out)
    repo_calibration = Path(__file__).resolve().parent.parent / "calibration"
    report = Path(args.report) if args.report else (repo_calibration if default_out and repo_calibration.is_dir()
                                                     else None)
    plot = Path(args.plot) if args.plot else (report / "pred_vs_measured.png" if report is not None
                                              else out.with_name(out.stem + "_pred_vs_measured.png"))
    command = "python -m splitwise_jax.calibrate" + ("" if argv is None and len(sys.argv) <= 1 else
                                                     " " + shlex.join(sys.argv[1:] if argv is None else argv))

    medians = profile_medians(rows)
    flags = flag_outliers(medians)
    power_bad = power_outliers(medians)
    print(f"profiles: {len(rows)} rows, {len(medians)} configurations")
    for _, r in flags.iterrows():
        print(f"outlier (not fitted): {r['model']} {r['hardware']} TP{r['tensor_parallel']} "
              f"{r['prompt_size']}x{r['batch_size']}: {r['reason']}")
    for _, r in power_bad.iterrows():
        print(f"average power not fitted: {r['model']} {r['hardware']} TP{r['tensor_parallel']} "
              f"{r['prompt_size']}x{r['batch_size']}: {r['reason']}")

    fitted, history = fit(medians, config=config, progress=progress, desc="full fit")
    preds = []
    for split in splits:
        try:
            preds.append(evaluate_split(rows, medians, split, seeds=seeds, config=config, progress=progress))
        except ValueError as e:
            print(f"split {split} skipped: {e}")
    predictions = pd.concat(preds, ignore_index=True) if preds else None
    meta = dict(fitted.meta)
    meta.update({
        "generated_by": command,
        "profiles": str(args.profiles or "shared/data/splitwise_sim_profiles/perf_model.csv"),
        "loss_history_first_last": [history[0], history[-1]],
        "outliers_excluded": sorted(int(i) for i in outlier_ids(medians)),
        "average_power_excluded": sorted(int(i) for i in power_bad["config_id"]),
    })
    if predictions is not None:
        summ = summary_table(predictions)
        meta["held_out_mape_percent"] = {
            f"{r['split']}: {r['subset']}": {"prompt": round(float(r["model_prompt_mape"]), 2),
                                             "token": round(float(r["model_token_mape"]), 2)}
            for _, r in summ.iterrows() if r["subset"] in ("all", "TP 4 and 8")}
        meta["held_out_max_percent"] = {
            f"{r['split']}: {r['subset']}": {"prompt": round(float(r["model_prompt_max"]), 2),
                                             "token": round(float(r["model_token_max"]), 2)}
            for _, r in summ.iterrows() if r["subset"] == "all"}
    fitted = Fitted(fitted.shared, fitted.per_gpu, meta)
    out.parent.mkdir(parents=True, exist_ok=True)
    fitted.save(out)
    print(f"wrote parameters to {out} (full-fit loss {history[-1]:.4g}, {meta['fit_seconds']} s)")

    if predictions is not None:
        pd.set_option("display.width", 200)
        cols = ["n", "model_prompt_mape", "base_prompt_mape", "model_prompt_max", "base_prompt_max",
                "model_token_mape", "base_token_mape", "model_token_max", "base_token_max"]
        print("\nHeld-out error, % (model vs SplitwiseSim interpolation baseline):")
        print(summary_table(predictions).set_index(["split", "subset"])[cols].round(1).to_string())
        print()
        print(error_table(predictions).set_index(["split", "model", "hardware", "tensor_parallel"])[cols]
              .round(1).to_string())
    held = predictions if predictions is not None else None
    plot.parent.mkdir(parents=True, exist_ok=True)
    plot_predicted_vs_measured(fitted, medians, plot, held_out=held)
    print(f"wrote plot to {plot}")
    if report is not None and predictions is not None:
        report.mkdir(parents=True, exist_ok=True)
        (report / "README.md").write_text(_report_text(fitted, markdown_tables(predictions), flags, power_bad, command))
        predictions.to_csv(report / "errors.csv", index=False, float_format="%.6g")
        print(f"wrote {report / 'README.md'} and {report / 'errors.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
