"""Fit the phase model to the profiles' configuration medians (Adam, float64).

What is fitted: `PhaseParams`, each mapped from an unconstrained value onto its
physical range (see `BOUNDS`: log for positive fields, a scaled logit for bounded ones).
Every field has a *shared* value; the fields in `FitConfig.per_gpu_fields` also get a
per-GPU deviation in that space, penalised by `deviation_penalty * deviation**2`. With
two GPUs the shared value sits between them; a GPU without an override (a new one) runs
on the shared values and its own spec sheet, which is what split (c) measures. Adam
(optax), float64, in jitted chunks of steps with a tqdm bar; docs/calibration.md has
the choices and the results.

Loss: pseudo-Huber on log(predicted / measured) with scale `huber_scale` (0.05: errors
under ~5% count quadratically, larger ones linearly, so a stray configuration pulls
with bounded force), over configuration medians, for prompt time, token time, and, on
A100 (the only GPU with power measured), peak power (prompt-phase draw / TDP) and
average power (request-average draw / TDP). Configurations flagged by
`profiles.flag_outliers` are reported and excluded.

References:
    Patel et al., Splitwise, ISCA 2024, §III (the profiles, insights III-VII).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd

from splitwise_jax.calibrate.rows import _design, gpu_of_hardware, predict_rows
from splitwise_jax.specs.catalog import CAP_OF_HARDWARE, get_llm
# The unconstrained space every field is fitted in (bounds, maps both ways); re-exported.
from splitwise_jax.phases.param_space import _BOUNDED, _HI, _LO, BOUNDS, FIELDS, _from_raw, _to_raw  # noqa: F401
from splitwise_jax.phases.params import (FITTED_PARAMS_FILE, PRIOR, ParamUncertainty, PhaseParams, params_for_gpu,
                                  read_params_file, write_params_file)
from splitwise_jax.phases.profiles import CONFIG_KEYS, SERIES_KEYS, flag_outliers


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



def _params_of(values) -> PhaseParams:
    return PhaseParams(**{f: values[..., i] for i, f in enumerate(FIELDS)})


class RawParams(NamedTuple):
    """Unconstrained parameters: shared [n_fields] and per-GPU deviations [n_gpus, n_fields]."""

    shared: jnp.ndarray
    deviation: jnp.ndarray


@dataclasses.dataclass(frozen=True)
class Fitted:
    """A calibration: shared parameters plus per-GPU overrides (absolute values).

    Read and written through `params.read_params_file` / `params.write_params_file`,
    the one home of the file format.
    """

    shared: PhaseParams
    per_gpu: dict[str, dict[str, float]]
    meta: dict
    uncertainty: ParamUncertainty | None = None  # `calibrate.laplace.laplace`; None: not computed

    def params_for(self, gpu_name: str) -> PhaseParams:
        """Parameters a GPU runs on: its overrides if any, else the shared values."""
        return params_for_gpu(self, gpu_name)

    def save(self, path) -> None:
        write_params_file(path, self.shared, self.per_gpu, self.meta, self.uncertainty)

    @classmethod
    def load(cls, path=None) -> "Fitted":
        """Read a params file (default: the shipped fit; the prior if none ships).

        Raises:
            ValueError: a missing, unreadable or malformed file (see `params.read_params_file`).
        """
        p = Path(path) if path is not None else FITTED_PARAMS_FILE
        if path is None and not p.exists():
            return cls(PRIOR, {}, {"source": "prior (no fitted file shipped)"})
        content = read_params_file(p)
        return cls(content.shared, {k: dict(v) for k, v in content.per_gpu.items()}, dict(content.meta),
                   content.uncertainty)


# ---------------------------------------------------------------------------------------
# Loss and fit


def _pseudo_huber(r, scale):
    """scale^2 (sqrt(1 + (r/scale)^2) - 1): r^2/2 for |r| << scale, scale |r| beyond."""
    return scale**2 * (jnp.sqrt(1.0 + (r / scale) ** 2) - 1.0)


class Residuals(NamedTuple):
    """log(predicted / measured) of one (model, TP) group, shape [n] each, and the weight
    each carries in the loss (0 for rows not fitted)."""

    prompt: jnp.ndarray
    token: jnp.ndarray
    peak_power: jnp.ndarray
    avg_power: jnp.ndarray
    w_prompt: jnp.ndarray
    w_token: jnp.ndarray
    w_peak_power: jnp.ndarray
    w_avg_power: jnp.ndarray


def _residuals(theta: RawParams, data, keys, cfg: FitConfig, dev_mask) -> list[Residuals]:
    """The fit's residuals per (model, TP) group (the loss and the Laplace step share them)."""
    out = []
    for k, (model, tp) in enumerate(keys):
        d = data[k]
        raw = theta.shared[None, :] + theta.deviation[d.gpu_index] * dev_mask[None, :]
        params = _params_of(_from_raw(raw))
        pred = predict_rows(params, d.machine, get_llm(model), d.prompt_size, d.batch_size, d.token_size, tp=tp,
                            cap_frac=d.cap_frac)
        out.append(Residuals(
            prompt=jnp.log(pred.prompt_s) - d.log_prompt_s, token=jnp.log(pred.token_s) - d.log_token_s,
            peak_power=jnp.log(pred.peak_frac / d.peak_frac), avg_power=jnp.log(pred.avg_frac / d.avg_frac),
            w_prompt=cfg.w_prompt * d.w_prompt, w_token=cfg.w_token * d.w_token,
            w_peak_power=cfg.w_power * d.w_power, w_avg_power=cfg.w_power * d.w_avg_power))
    return out


def _make_loss(keys, cfg: FitConfig, dev_mask, raw_start):
    def loss(theta: RawParams, data):
        h = cfg.huber_scale
        total = 0.0
        n = 0.0
        for k, r in enumerate(_residuals(theta, data, keys, cfg, dev_mask)):
            total = total + jnp.sum(r.w_prompt * _pseudo_huber(r.prompt, h))
            total = total + jnp.sum(r.w_token * _pseudo_huber(r.token, h))
            total = total + jnp.sum(r.w_peak_power * _pseudo_huber(r.peak_power, h)
                                    + r.w_avg_power * _pseudo_huber(r.avg_power, h))
            n = n + jnp.sum(data[k].w_prompt)
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


def _prepare(medians: pd.DataFrame, config: FitConfig, train_ids=None):
    """The fit's data: ((model, TP) keys, GPUs, per-group arrays, which GPUs have
    training rows [n_gpus], which rows of `med` are fitted, `med`: the medians sorted by
    config_id with the row weights; the groups hold its rows grouped by (model, TP))."""
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
    return keys, gpus, data, gpu_has_data, use, med


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

    keys, gpus, data, gpu_has_data, use, _ = _prepare(medians, config, train_ids)
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

