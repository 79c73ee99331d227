"""Prediction intervals of phase times, and their coverage on held-out rows.

A prediction's log-variance is the parameter part J Cov J^T (J: the Jacobian of the
log prompt / token time with respect to the GPU's raw parameters, `Cov`: their Laplace
covariance, `laplace.py`) plus the residual scatter s^2 of its phase on its hardware
(what the parameters do not explain; for a GPU without profiles, the spec-transfer
scatter). The interval is log-normal: exp(log t +- z sd), z the normal quantile of the
level. The residual part dominates on profiled hardware (it is ~5-10x the parameter
part); the parameter part grows where the model extrapolates.

References:
    docs/uncertainty.md (method and measured coverage).
"""

from __future__ import annotations

from functools import partial
from statistics import NormalDist

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from splitwise_jax.calibrate.fit import _from_raw, _params_of, _to_raw
from splitwise_jax.calibrate.rows import _bucket, gpu_of_hardware, predict_frame, predict_rows
from splitwise_jax.specs.catalog import CAP_OF_HARDWARE, MACHINE_OF_HARDWARE, get_llm, get_machine
from splitwise_jax.phases.profiles import SERIES_KEYS

_PHASES = ("prompt", "token")


@partial(jax.jit, static_argnames=("tp",))
def _log_time_jacobian(z, machine, llm, p, b, t, cap, *, tp):
    """d log(prompt_s, token_s) / d z, each [n, n_fields], at raw parameters z."""
    def log_times(z):
        pred = predict_rows(_params_of(_from_raw(z)), machine, llm, p, b, t, tp=tp, cap_frac=cap)
        return jnp.log(pred.prompt_s), jnp.log(pred.token_s)

    return jax.jacfwd(log_times)(z)


def _check_level(level: float) -> float:
    if not (isinstance(level, (int, float)) and 0.0 < float(level) < 1.0):
        raise ValueError(f"interval level must be in (0, 1), got {level!r}")
    return float(level)


def predict_intervals(fitted, rows: pd.DataFrame, level: float = 0.9) -> pd.DataFrame:
    """Point predictions of prompt and token time (ms) with log-normal intervals.

    Args:
        fitted: a calibration with `uncertainty` (`fit.Fitted`; the shipped fit has it).
        rows: columns model, hardware, tensor_parallel, prompt_size, batch_size,
            token_size (validated, e.g. by `calibrate.queries.validate_queries`).
        level: central probability of each interval, in (0, 1).

    Returns:
        DataFrame indexed like `rows`: prompt_time, token_time (ms, as `predict_frame`),
        {prompt,token}_time_lo / _hi (ms), and {prompt,token}_log_sd (total), and
        {prompt,token}_log_sd_param (the parameter part alone).

    Raises:
        ValueError: a level outside (0, 1), or a calibration without uncertainty.
    """
    level = _check_level(level)
    unc = fitted.uncertainty
    if unc is None:
        raise ValueError("this params file has no uncertainty (written before it was stored); rerun "
                         "`python -m splitwise_jax.calibrate` to compute it")
    z_q = NormalDist().inv_cdf(0.5 + 0.5 * level)
    point = predict_frame(fitted, rows)
    out = point[["prompt_time", "token_time"]].copy()
    for ph in _PHASES:
        for col in (f"{ph}_log_sd_param", f"{ph}_log_sd"):
            out[col] = np.nan
    for (model, hardware, tp), q in rows.groupby(list(SERIES_KEYS), sort=False):
        machine = get_machine(MACHINE_OF_HARDWARE[hardware])
        gpu = machine.gpu.name
        z0 = jnp.asarray(_to_raw(fitted.params_for(gpu)))
        cov = unc.raw_covariance([gpu])
        n = len(q)
        pad = _bucket(n) - n

        def col(name):
            v = q[name].to_numpy(float)
            return jnp.asarray(np.concatenate([v, np.full(pad, v[0])]))

        jacs = _log_time_jacobian(z0, machine, get_llm(model), col("prompt_size"), col("batch_size"),
                                  col("token_size"), float(CAP_OF_HARDWARE[hardware]), tp=int(tp))
        profiled = gpu_of_hardware(hardware) in _profiled_gpus(unc)
        for ph, jac in zip(_PHASES, jacs):
            jac = np.asarray(jac)[:n]
            var_param = np.einsum("if,fg,ig->i", jac, cov, jac)
            s = unc.phase_sd(ph, hardware if profiled else None)
            out.loc[q.index, f"{ph}_log_sd_param"] = np.sqrt(np.maximum(var_param, 0.0))
            out.loc[q.index, f"{ph}_log_sd"] = np.sqrt(np.maximum(var_param, 0.0) + s**2)
    for ph in _PHASES:
        half = z_q * out[f"{ph}_log_sd"]
        out[f"{ph}_time_lo"] = out[f"{ph}_time"] * np.exp(-half)
        out[f"{ph}_time_hi"] = out[f"{ph}_time"] * np.exp(half)
    return out


def _profiled_gpus(unc) -> set[str]:
    return {gpu_of_hardware(h) for table in unc.residual_sd.values() for h in table if h in MACHINE_OF_HARDWARE}


def coverage_table(predictions: pd.DataFrame) -> pd.DataFrame:
    """Share of held-out measurements inside their intervals, per split and phase.

    Args:
        predictions: rows of `splits.evaluate_split` with interval columns
            (model_{prompt,token}_lo / _hi) and the measured prompt_time / token_time.

    Returns:
        Columns split, phase, level, n, covered (fraction in [0, 1]).
    """
    rows = []
    for split, g in predictions.groupby("split", sort=False):
        for ph in _PHASES:
            lo, hi, y = g[f"model_{ph}_lo"], g[f"model_{ph}_hi"], g[f"{ph}_time"]
            ok = lo.notna() & hi.notna()
            if ok.any():
                inside = (y[ok] >= lo[ok]) & (y[ok] <= hi[ok])
                rows.append({"split": split, "phase": ph, "level": float(g["interval_level"].iloc[0]),
                             "n": int(ok.sum()), "covered": float(inside.mean())})
    return pd.DataFrame(rows, columns=["split", "phase", "level", "n", "covered"])


def unseen_gpu_sd(predictions: pd.DataFrame) -> dict:
    """Log-normal s.d. of the spec-transfer split's held-out errors per phase (the
    scatter to expect on a GPU without profiles), {} without that split."""
    g = predictions[predictions["split"] == "spec_transfer"]
    out = {}
    for ph in _PHASES:
        r = np.log(g[f"model_{ph}_time"] / g[f"{ph}_time"]).to_numpy(float)
        r = r[np.isfinite(r)]
        if len(r):
            out[ph] = float(np.sqrt(np.mean(r**2)))
    return out
