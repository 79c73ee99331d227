"""Parameter uncertainty of a calibration: a Laplace approximation at the fit.

Why Laplace and not a bootstrap: a full fit is ~2,000 Adam steps (13 s on 2 cores
after a ~30 s compile), so a bootstrap of 100 refits costs ~25 min per calibration and
again per held-out split and seed; the Laplace step is one forward-mode Jacobian of
the fit's residuals at the optimum (one direction per free parameter) and a small
linear solve: seconds. It is local (a Gaussian around the optimum, in the fit's
unconstrained space, where the bounded fields' curvature is closest to quadratic), which
is what the linearised propagation downstream assumes anyway.

Method: the fit minimises a pseudo-Huber loss rho of the log errors r (scale h), an
M-estimator. Its asymptotic covariance is E[psi^2] / E[psi']^2 (J^T J)^-1 (Huber 1981,
§7.6; psi = rho'), i.e. a Gauss-Newton precision sum_i w_i psi'(r_i) J_i^T J_i / c_t
with the scale c_t = sum w psi^2 / sum w psi' per residual type t (prompt time, token
time, peak and average power): for small residuals c_t is their variance, and a row
far outside h (psi' ~ 0) adds no information, as it adds no pull in the fit. The fit's
penalties (deviation_penalty on per-GPU deviations, prior_penalty on shared values)
are a Gaussian prior, put on the same scale by the loss's own normalisation
(loss = data / (n h^2) + penalties, so precision = 2 lambda n h^2 / c with the pooled
c). Gauss-Newton rather than `jax.hessian` of the loss: it is positive semi-definite by
construction (Adam stops near, not at, the optimum, where the full Hessian of the
nonlinear model can be indefinite), and costs one Jacobian, not a Hessian.

The residual scatter (what the parameters do not explain) is recorded per phase and
profile hardware: s^2 = sum r^2 / (n - sum of leverages) over the fitted rows, the
leverage h_i = w_i psi'_i / c_t J_i Cov J_i^T counting the degrees of freedom the fit
spent on them. A prediction's variance is then J Cov J^T + s^2 (`intervals.py`).

References:
    P. J. Huber, Robust Statistics (1981), §7.6 (covariance of M-estimators).
    D. J. C. MacKay, "Bayesian interpolation", Neural Computation 4 (1992)
    (Laplace approximation with a Gauss-Newton Hessian).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from splitwise_jax.calibrate.fit import FIELDS, FitConfig, Fitted, RawParams, _prepare, _residuals, _to_raw
from splitwise_jax.phases.params import ParamUncertainty

#: Residual types, in the order `_residual_vector` stacks them.
_TYPES = ("prompt", "token", "peak_power", "avg_power")


def _psi(r, h):
    """rho'(r) and rho''(r) of the pseudo-Huber loss h^2 (sqrt(1 + (r/h)^2) - 1)."""
    q = 1.0 + (r / h) ** 2
    return r / np.sqrt(q), q**-1.5


def _free_components(fitted: Fitted, gpus, has, config: FitConfig):
    """Names, (shared field indices), (deviation gpu, field indices) of the fit's free
    components, and the raw values of the whole RawParams at the fit."""
    raw_shared = _to_raw(fitted.shared)
    dev_mask = np.array([f in config.per_gpu_fields for f in FIELDS], float)
    deviation = np.zeros((len(gpus), len(FIELDS)))
    names, s_idx, d_gpu, d_idx = [], [], [], []
    for j, f in enumerate(FIELDS):
        if f not in config.frozen_fields:
            names.append(f"shared:{f}")
            s_idx.append(j)
    for gi, gpu in enumerate(gpus):
        if not has[gi] or gpu not in fitted.per_gpu:
            continue  # no training rows, or folded into shared (a single-GPU fit)
        deviation[gi] = (_to_raw(fitted.params_for(gpu)) - raw_shared) * dev_mask
        for j, f in enumerate(FIELDS):
            if f in config.per_gpu_fields and f not in config.frozen_fields:
                names.append(f"{gpu}:{f}")
                d_gpu.append(gi)
                d_idx.append(j)
    return names, np.array(s_idx, int), np.array(d_gpu, int), np.array(d_idx, int), raw_shared, deviation


_COMPILED: dict = {}


def _compiled(keys, config: FitConfig, s_idx, d_gpu, d_idx):
    """Jitted (residuals, their Jacobian, their weights) for one layout of the problem,
    cached: every seed of a split shares one compile, as the fit's chunk of steps does."""
    ck = (keys, config.replace(steps=0, learning_rate=0.0), tuple(s_idx), tuple(d_gpu), tuple(d_idx))
    if ck in _COMPILED:
        return _COMPILED[ck]
    dev_mask = jnp.asarray([1.0 if f in config.per_gpu_fields else 0.0 for f in FIELDS])
    ns = len(s_idx)

    @jax.jit
    def run(x, raw_shared, deviation, data):
        def residual_vector(x):
            shared = raw_shared.at[s_idx].set(x[:ns])
            dev = deviation.at[d_gpu, d_idx].set(x[ns:])
            groups = _residuals(RawParams(shared, dev), data, keys, config, dev_mask)
            return jnp.concatenate([getattr(g, t) for t in _TYPES for g in groups])

        groups = _residuals(RawParams(raw_shared, deviation), data, keys, config, dev_mask)
        weights = jnp.concatenate([getattr(g, "w_" + t) for t in _TYPES for g in groups])
        return residual_vector(x), jax.jacfwd(residual_vector)(x), weights

    _COMPILED[ck] = run
    return run


def laplace(fitted: Fitted, medians: pd.DataFrame, *, config: FitConfig = FitConfig(),
            train_ids=None) -> ParamUncertainty:
    """The Laplace covariance of a fit's parameters and the residual scatter of its rows.

    Args:
        fitted: the fit (`fit.fit` on the same medians, options and training rows).
        medians: `profiles.profile_medians` output.
        config: the fit's options (its loss scale, weights, penalties, frozen and
            per-GPU fields).
        train_ids: the config_ids the fit used (default: all).

    Returns:
        `ParamUncertainty` (components named "shared:<field>" and "<gpu>:<field>").

    Example:
        >>> fitted, _ = fit(med, progress=False)
        >>> unc = laplace(fitted, med)
        >>> np.sqrt(np.diag(unc.covariance))[:3]   # raw-space s.d. of the first fields  # doctest: +SKIP
    """
    keys, gpus, data, gpu_has_data, use, med = _prepare(medians, config, train_ids)
    has = np.asarray(gpu_has_data) > 0
    names, s_idx, d_gpu, d_idx, raw_shared, deviation = _free_components(fitted, gpus, has, config)
    ns = len(s_idx)
    x0 = np.concatenate([raw_shared[s_idx], deviation[d_gpu, d_idx]])

    run = _compiled(keys, config, s_idx, d_gpu, d_idx)
    r, jac, w = (np.asarray(v) for v in run(jnp.asarray(x0), jnp.asarray(raw_shared), jnp.asarray(deviation), data))
    sizes = [len(np.asarray(d.prompt_size)) for d in data]
    kind = np.concatenate([np.full(n_rows, k) for k in range(len(_TYPES)) for n_rows in sizes])
    # Each group holds the rows of `med` of one (model, TP), in med's order.
    hardware = np.concatenate([med.loc[sel.index, "hardware"].to_numpy()
                               for _, sel in med.groupby(["model", "tensor_parallel"], sort=True)])
    hardware = np.tile(hardware, len(_TYPES))

    h = config.huber_scale
    on = w > 0
    psi, dpsi = _psi(np.where(on, r, 0.0), h)
    scale = {}
    for k, t in enumerate(_TYPES):
        sel = on & (kind == k)
        if sel.any():
            scale[t] = float(np.sum(w[sel] * psi[sel] ** 2) / np.sum(w[sel] * dpsi[sel]))
    c_row = np.array([scale.get(_TYPES[k], 1.0) for k in kind])
    info = np.where(on, w * dpsi / c_row, 0.0)
    precision = (jac * info[:, None]).T @ jac
    c_pool = float(np.sum(w[on] * psi[on] ** 2) / np.sum(w[on] * dpsi[on]))
    n = float(sum(np.sum(np.asarray(d.w_prompt)) for d in data))
    kappa = n * h**2 / c_pool
    prior = np.concatenate([np.full(ns, 2.0 * kappa * config.prior_penalty),
                            np.full(len(d_idx), 2.0 * kappa * config.deviation_penalty)])
    precision = precision + np.diag(prior)
    cov = np.linalg.inv(precision)
    cov = 0.5 * (cov + cov.T)

    leverage = info * np.einsum("ip,pq,iq->i", jac, cov, jac)
    residual_sd = {}
    for phase in ("prompt", "token"):
        k = _TYPES.index(phase)
        residual_sd[phase] = {}
        for hw in sorted(set(hardware[on & (kind == k)])):
            sel = on & (kind == k) & (hardware == hw)
            dof = max(sel.sum() - leverage[sel].sum(), 0.5 * sel.sum())
            residual_sd[phase][str(hw)] = float(np.sqrt(np.sum(r[sel] ** 2) / dof))
    meta = {
        "method": "laplace (Gauss-Newton, Huber M-estimator scale per residual type, penalties as prior)",
        "space": "unconstrained: log of positive fields, logit of bounded ones (calibrate.fit.BOUNDS)",
        "n_configs": int(n),
        "n_residuals": int(on.sum()),
        "n_free": len(names),
        "scale_per_type": {t: round(float(np.sqrt(v)), 6) for t, v in scale.items()},
        "prior_precision": {"shared": float(prior[0]) if ns else None,
                            "deviation": float(prior[-1]) if len(d_idx) else None},
        "leverage_sum": round(float(leverage.sum()), 3),
    }
    return ParamUncertainty(tuple(names), x0, cov, residual_sd, {}, meta)
