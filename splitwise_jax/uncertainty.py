"""Error bars on the cluster model's answers: intervals and probabilities of meeting SLOs.

Two sources of uncertainty, combined as independent log-normal spreads:

1. **Parameters**: the calibration's Laplace covariance (`params.ParamUncertainty`,
   `calibrate/laplace.py`), carried through `cluster.evaluate` by *statistical
   linearisation*: central differences at the sigma points z0 +- sqrt(lambda_k) v_k of
   the covariance of each GPU's raw parameters (lambda_k, v_k its eigenpairs), so
   var(log m) = sum_k ((log m(z0 + u_k) - log m(z0 - u_k)) / 2)^2. That equals
   J Cov J^T for a model linear over one standard deviation, and it reuses the compiled
   `evaluate` (the parameters are traced leaves): on 2 cores a forward-mode Jacobian
   of the full `evaluate` took 160-360 s to compile for an 8-s evaluation, whereas the
   2k sigma points (k = 23 free fields per GPU type) cost 2k calls of ~0.4 s and no
   compile. The same trick evaluates a whole batch of candidate clusters per sigma point
   in the optimiser (`optimize/confidence.py`).
2. **Model form**: the cluster model's measured error against the reference simulator
   (`python studies/validate_cluster.py`, per run and percentile), summarised per
   (metric, percentile) and predicted prompt-pool load as zero-centred log-normal
   spreads of e = log(ours / reference) (`model_form_from_runs`, shipped as
   `data/model_form_error.json` by `studies/model_form_error.py`), two of them:
   * for intervals, two-sided: the 90th percentile of |e| / 1.645, so a 90% interval
     covers 90% of the validation runs;
   * for SLO probabilities, one-sided: an SLO is missed only when the model
     *under*-predicts (e < -margin), so the spread is the 10th percentile of e, negated,
     / 1.2816 (floor 1%: the profiles' repeat noise), so that a design predicted to
     meet an SLO with probability 0.9 did meet it in 90% of the validation runs.
     Over-prediction (the model pessimistic) does not widen it.
   Zero-centred, not bias-corrected: a systematic error is the model's to fix, and a
   shifted centre would be a second, hidden model (it would also let a design the model
   itself says fails count as likely to pass). The phase model's residual scatter is not
   added again: the validation runs in "calibrated" mode already contain it.

Each SLO's probability of being met is Phi(margin / sd), margin = log(limit /
slowdown) (`ClusterMetrics.slo_margin`) and sd the total s.d. of the log slowdown
(parameter part and one-sided model-form part). The probability that all nine hold is
their product: the errors of the nine percentiles come from the same parameters and the
same queue model, hence are positively correlated, and for positively correlated
Gaussian margins the product is a lower bound on the joint probability (Slepian's
inequality); the minimum would be an upper bound. Since a probability above 0.5 needs a
positive margin, a design held to any confidence >= 0.5 also meets every SLO on the
point estimate.

References:
    docs/uncertainty.md; S. J. Julier and J. K. Uhlmann, "Unscented filtering and
    nonlinear estimation", Proc. IEEE 92 (2004) (sigma points); D. Slepian, "The one-sided
    barrier problem for Gaussian noise", Bell Syst. Tech. J. 41 (1962).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from statistics import NormalDist
from typing import Callable

import jax
import numpy as np

from splitwise_jax._paths import PACKAGE_DATA
from splitwise_jax.cluster.cluster import Cluster, ClusterMetrics, evaluate
from splitwise_jax.cluster.metrics import KEYS
from splitwise_jax.phases.param_space import _from_raw, _to_raw
from splitwise_jax.phases.params import FIELD_NAMES, ParamUncertainty, PhaseParams, load_uncertainty
from splitwise_jax.phases.timing import CalibratedTiming

MODEL_FORM_FILE = PACKAGE_DATA / "model_form_error.json"
METRICS = ("ttft", "tbt", "e2e")
PCTS = KEYS  # "p50", "p90", "p99"
#: Outputs of `evaluate` with a log-normal interval, in the order of `log_outputs`.
#: Latencies and slowdowns are (metric, percentile); the rest are scalars.
SCALARS = ("throughput_rps", "power_kw", "rho_prompt_pool", "rho_token_pool", "memory_pressure",
           "batch_prompt_pool", "batch_token_pool")
#: Outputs that are exact functions of the design (no interval: lo = hi).
EXACT = ("cost_per_hour", "provisioned_power_kw")
_TINY = 1e-30
_MIN_RUNS = 8  # a load bin with fewer validation runs takes the spread of all runs
#: Smallest one-sided model-form spread: a validation set the model never under-predicted
#: does not make it exact; 1% is the profiles' repeat-to-repeat noise of phase times.
SLO_SD_FLOOR = 0.01


# ---------------------------------------------------------------------------------------
# Model-form error


@dataclasses.dataclass(frozen=True)
class ModelFormError:
    """Measured spread of the cluster model against the reference simulator.

    Attributes:
        rho_edges: lower edges of the predicted prompt-pool load bins (first 0).
        log_sd: phase-timing mode ("calibrated", "splitwise-sim-table") -> (3, 3, bins)
            two-sided s.d. of log(ours / reference) for intervals, rows TTFT/TBT/E2E,
            columns P50/P90/P99; non-decreasing with load.
        log_sd_slo: the same shape, the one-sided (under-prediction) s.d. for SLO
            probabilities.
        meta: provenance (source file, level, counts, biases).
    """

    rho_edges: tuple
    log_sd: dict
    log_sd_slo: dict
    meta: dict = dataclasses.field(default_factory=dict)

    def sd(self, rho_prompt, mode: str = "calibrated", kind: str = "interval") -> np.ndarray:
        """(..., 3, 3) s.d. at predicted prompt-pool loads (any shape); kind "interval"
        (two-sided) or "slo" (one-sided). A mode the validation did not run falls back
        to "calibrated"."""
        tables = self.log_sd if kind == "interval" else self.log_sd_slo
        table = tables.get(mode, tables.get("calibrated"))
        rho = np.asarray(rho_prompt, float)
        if table is None:
            return np.zeros(rho.shape + (3, 3))
        b = np.maximum(np.searchsorted(np.asarray(self.rho_edges), rho, side="right") - 1, 0)
        return np.moveaxis(np.asarray(table)[:, :, b], (0, 1), (-2, -1))

    @classmethod
    def from_dict(cls, d: dict) -> "ModelFormError":
        def table(mode, key):
            return np.array([[d["modes"][mode][f"{met}_{p}"][key] for p in PCTS] for met in METRICS], float)

        try:
            edges = tuple(float(e) for e in d["rho_edges"])
            log_sd = {m: table(m, "log_sd") for m in d["modes"]}
            log_sd_slo = {m: table(m, "log_sd_slo") for m in d["modes"]}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"model-form file: malformed ({e!r}); regenerate it with "
                             "`python studies/model_form_error.py`") from None
        for m in log_sd:
            for t in (log_sd[m], log_sd_slo[m]):
                if t.shape != (3, 3, len(edges)) or not np.all(np.isfinite(t)) or np.any(t < 0):
                    raise ValueError(f"model-form file: mode {m!r} needs 3 x 3 x {len(edges)} finite s.d. >= 0")
        return cls(edges, log_sd, log_sd_slo, {k: v for k, v in d.items() if k != "modes"})


def model_form_from_runs(per_run, level: float = 0.9, rho_edges=(0.0, 0.8)) -> dict:
    """The model-form spread from per-run validation errors (the shipped JSON's content).

    Args:
        per_run: `studies/validate_cluster.py`'s ``validation_runs.csv`` as a DataFrame:
            columns mode, rho_prompt and err_{metric}_{pct} = ours / reference - 1.
        level: the spread makes a central interval at this level cover that share of
            the runs (per metric, percentile and load bin).
        rho_edges: lower edges of the load bins (predicted prompt-pool load).

    Returns:
        {"level", "rho_edges", "modes": {mode: {"ttft_p50": {"log_sd": [per bin],
        "log_sd_slo": [...], "n": [...], "bias": [...], "rms": [...]}, ...}}}: log_sd the
        two-sided spread (a central interval at `level` covers that share of the runs),
        log_sd_slo the one-sided one (-quantile(e, 1 - level) / z_level, at least
        `SLO_SD_FLOOR`: that share of the runs is under-predicted by less). Both are
        non-decreasing with load (a pool under more load is not taken to be more
        predictable), and a bin with fewer than 8 runs takes the spread of all runs of
        its mode.
    """
    import pandas as pd

    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    z = NormalDist().inv_cdf(0.5 + 0.5 * level)
    z1 = NormalDist().inv_cdf(level)
    edges = np.asarray(rho_edges, float)
    if edges[0] != 0.0 or np.any(np.diff(edges) <= 0):
        raise ValueError(f"rho_edges must start at 0 and increase, got {rho_edges!r}")
    missing = [c for c in ["mode", "rho_prompt"] + [f"err_{m}_{p}" for m in METRICS for p in PCTS]
               if c not in per_run.columns]
    if missing:
        raise ValueError(f"validation runs lack columns {missing} (written by studies/validate_cluster.py)")
    modes = {}
    for mode, g in per_run.groupby("mode", sort=True):
        b = np.searchsorted(edges, g["rho_prompt"].to_numpy(float), side="right") - 1
        table = {}
        for met in METRICS:
            for p in PCTS:
                e = np.log1p(pd.to_numeric(g[f"err_{met}_{p}"], errors="coerce").to_numpy(float))
                ok = np.isfinite(e)

                def two_sided(x):
                    return float(np.quantile(np.abs(x), level) / z)

                def one_sided(x):
                    return max(float(-np.quantile(x, 1.0 - level) / z1), SLO_SD_FLOOR)

                sd, sd_slo, n, bias, rms = [], [], [], [], []
                for k in range(len(edges)):
                    sel = ok & (b == k)
                    part = e[sel] if sel.sum() >= _MIN_RUNS else e[ok]
                    sd.append(max([two_sided(part) if len(part) else 0.0] + sd))
                    sd_slo.append(max([one_sided(part) if len(part) else SLO_SD_FLOOR] + sd_slo))
                    n.append(int(sel.sum()))
                    bias.append(round(float(e[sel].mean()), 4) if sel.any() else None)
                    rms.append(round(float(np.sqrt(np.mean(e[sel] ** 2))), 4) if sel.any() else None)
                table[f"{met}_{p}"] = {"log_sd": [round(v, 5) for v in sd], "log_sd_slo": [round(v, 5) for v in sd_slo],
                                       "n": n, "bias": bias, "rms": rms}
        modes[str(mode)] = table
    return {"level": level, "rho_edges": edges.tolist(), "modes": modes}


def load_model_form(path: str | Path | None = None) -> ModelFormError | None:
    """The model-form spread (default: the shipped file; None when none ships)."""
    p = Path(path) if path is not None else MODEL_FORM_FILE
    if path is None and not p.exists():
        return None
    try:
        return ModelFormError.from_dict(json.loads(p.read_text()))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"model-form file {p} cannot be read: {e}") from None


# ---------------------------------------------------------------------------------------
# Parameter uncertainty through the cluster model


def _calibrated(timing):
    """The CalibratedTiming inside a timing strategy (the table timing's power model)."""
    return timing if isinstance(timing, CalibratedTiming) else getattr(timing, "power_model", None)


_ROLES = ("prompt", "token", "alone")


def role_gpus(cluster: Cluster) -> tuple:
    """Whose fitted parameters each timing (prompt, token, alone) runs on: its GPU's name,
    or for a GPU without profiles the calibrated GPU it borrows them from
    (`provenance.params_for`); None for a timing without calibrated parameters. Read it
    off the cluster before `designs.uniform_names` erases the names."""
    from splitwise_jax.phases.provenance import calibrated_gpus, nearest_calibrated_gpu

    fitted = calibrated_gpus()
    out = []
    for role in _ROLES:
        c = _calibrated(getattr(cluster, role))
        if c is None:
            out.append(None)
            continue
        name = c.machine.gpu.name
        out.append(name if name in fitted or not fitted else (nearest_calibrated_gpu(c.machine.gpu) or name))
    return tuple(out)


def cluster_gpus(cluster: Cluster) -> tuple[str, ...]:
    """GPU names whose parameters the cluster's timings use, each once."""
    return tuple(dict.fromkeys(g for g in role_gpus(cluster) if g is not None))


def sigma_directions(cov: np.ndarray, rtol: float = 1e-9) -> np.ndarray:
    """Rows u_k = sqrt(lambda_k) v_k of a covariance (eigenpairs with lambda_k above
    rtol x the largest): sum_k u_k u_k^T = cov."""
    lam, vec = np.linalg.eigh(0.5 * (cov + cov.T))
    keep = lam > rtol * max(float(lam.max()), _TINY)
    return (vec[:, keep] * np.sqrt(lam[keep])).T


def sigma_deltas(roles: tuple, unc: ParamUncertainty | None) -> list[tuple]:
    """Per sigma direction u_k, the raw-parameter shift of each timing (prompt, token,
    alone; None where the timing has no calibrated parameters): the joint covariance of
    the GPUs in `roles` (`role_gpus`) factored as sum_k u_k u_k^T. Empty without an
    uncertainty. Shift by +delta and -delta for the central difference."""
    gpus = tuple(dict.fromkeys(g for g in roles if g is not None))
    if unc is None or not gpus:
        return []
    n_f = len(FIELD_NAMES)
    out = []
    for u in sigma_directions(unc.raw_covariance(gpus)):
        u = u.reshape(len(gpus), n_f)
        out.append(tuple(None if g is None else u[gpus.index(g)] for g in roles))
    return out


def perturb_cluster(cluster: Cluster, deltas: tuple, sign: float = 1.0) -> Cluster:
    """The cluster with each timing's raw parameters moved by sign x its delta
    (`sigma_deltas`; order prompt, token, alone).

    Parameters stay plain Python floats, so a jitted `evaluate` (or the optimiser's
    batched evaluation) runs the perturbed cluster without recompiling."""
    def move(params: PhaseParams, d) -> PhaseParams:
        v = np.asarray(_from_raw(_to_raw(params) + sign * d))
        return PhaseParams(**{f: float(v[i]) for i, f in enumerate(FIELD_NAMES)})

    def timing(t, d):
        c = _calibrated(t)
        if c is None or d is None:
            return t
        moved = dataclasses.replace(c, params=move(c.params, d))
        return moved if c is t else dataclasses.replace(t, power_model=moved)

    return cluster.replace(**{role: timing(getattr(cluster, role), d) for role, d in zip(_ROLES, deltas)})


def log_outputs(m: ClusterMetrics) -> np.ndarray:
    """log of every output with an interval: latencies (9), slowdowns (9), `SCALARS`."""
    lat = [np.asarray(getattr(m, f"{met}_s"), float) for met in METRICS]
    sd = [np.asarray(getattr(m, f"slowdown_{met}"), float) for met in METRICS]
    sc = [np.asarray(getattr(m, s), float)[None] for s in SCALARS]
    return np.log(np.maximum(np.concatenate(lat + sd + sc), _TINY))


def central_sd(plus: np.ndarray, minus: np.ndarray) -> np.ndarray:
    """sqrt(sum_k ((f(z0 + u_k) - f(z0 - u_k)) / 2)^2) over the leading axis k."""
    if len(plus) == 0:
        return np.zeros(np.shape(plus)[1:])
    return np.sqrt(np.sum((0.5 * (np.asarray(plus) - np.asarray(minus))) ** 2, axis=0))


_EVALUATE = jax.jit(evaluate, static_argnames=("resolution",))


def param_log_sd(cluster: Cluster, workload, horizon_s=120.0, *, unc: ParamUncertainty | None = None,
                 evaluate_fn: Callable | None = None, **evaluate_kw) -> np.ndarray:
    """S.d. of each log output (`log_outputs` order) from the parameter uncertainty.

    Args:
        cluster, workload, horizon_s: as for `evaluate`.
        unc: the calibration's uncertainty (default: the shipped one; None there: zeros).
        evaluate_fn: a jitted `evaluate` to reuse (its compiled program serves every
            sigma point); default a module-level jitted one.
        evaluate_kw: slo, resolution, passed on.

    Returns:
        Array (9 + 9 + len(SCALARS),).
    """
    unc = load_uncertainty() if unc is None else unc
    fn = evaluate_fn or _EVALUATE
    deltas = sigma_deltas(role_gpus(cluster), unc)

    def run(d, sign):
        m = fn(perturb_cluster(cluster, d, sign), workload, horizon_s, **evaluate_kw)
        return log_outputs(jax.tree_util.tree_map(np.asarray, m))

    plus = [run(d, 1.0) for d in deltas]
    minus = [run(d, -1.0) for d in deltas]
    n_out = 18 + len(SCALARS)
    return central_sd(np.reshape(plus, (-1, n_out)), np.reshape(minus, (-1, n_out)))


def _ndtr(x) -> np.ndarray:
    """The standard normal CDF on host arrays, 0.5 erfc(-x / sqrt 2): within 2.2e-16 of
    `scipy.special.ndtr` over [-40, 40] (whose import is 0.1-0.3 s of every command
    line's start; these arrays hold a few SLOs)."""
    return np.vectorize(lambda v: 0.5 * math.erfc(-v / math.sqrt(2.0)), otypes=[float])(x)


def slo_probability(margin, log_sd) -> np.ndarray:
    """P(slowdown <= limit) = Phi(margin / sd) per SLO (margin = log(limit / slowdown)).

    A zero s.d. gives 1 for a met SLO (margin > 0), 0 for a missed one and 0.5 on the
    limit."""
    margin = np.asarray(margin, float)
    sd = np.broadcast_to(np.asarray(log_sd, float), margin.shape)
    safe = np.where(sd > 0, sd, 1.0)
    return np.where(sd > 0, _ndtr(margin / safe), np.where(margin > 0, 1.0, np.where(margin < 0, 0.0, 0.5)))


def joint_probability(p) -> np.ndarray:
    """P(all SLOs met) as the product of the per-SLO probabilities over the last two
    axes (a lower bound for positively correlated errors; module docstring)."""
    p = np.asarray(p, float)
    return np.prod(p.reshape(p.shape[:-2] + (-1,)), axis=-1)


def timing_mode(cluster: Cluster) -> str:
    return "calibrated" if isinstance(cluster.prompt, CalibratedTiming) else "splitwise-sim-table"


def uncertainty_dict(cluster: Cluster, workload, metrics: ClusterMetrics, horizon_s=120.0, *, level: float = 0.9,
                     unc: ParamUncertainty | None = None, model_form: ModelFormError | None = None,
                     evaluate_fn: Callable | None = None, **evaluate_kw) -> dict:
    """The `uncertainty` object of `python -m splitwise_jax.evaluate --json`.

    Args:
        cluster, workload, horizon_s: as evaluated.
        metrics: `evaluate`'s point estimate for them.
        level: central probability of every interval, in (0, 1).
        unc, model_form: the two sources (default: the shipped files).
        evaluate_fn, evaluate_kw: as for `param_log_sd`.

    Returns:
        A JSON-ready dict: for each output its interval lo / hi and log s.d. (total,
        parameter part, model-form part), each SLO's probability of being met, and the
        probability that all nine are met.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    unc = load_uncertainty() if unc is None else unc
    model_form = load_model_form() if model_form is None else model_form
    m = jax.tree_util.tree_map(np.asarray, metrics)
    point = np.exp(log_outputs(m))
    sd_param = param_log_sd(cluster, workload, horizon_s, unc=unc, evaluate_fn=evaluate_fn, **evaluate_kw)
    mode = timing_mode(cluster)
    rho = float(m.rho_prompt_pool)
    sd_mf = model_form.sd(rho, mode) if model_form is not None else np.zeros((3, 3))
    sd_mf_slo = model_form.sd(rho, mode, "slo") if model_form is not None else np.zeros((3, 3))
    sd_model = np.concatenate([sd_mf.reshape(-1), sd_mf.reshape(-1), np.zeros(len(SCALARS))])
    sd = np.sqrt(sd_param**2 + sd_model**2)
    z = NormalDist().inv_cdf(0.5 + 0.5 * level)

    def entry(i):
        return {"lo": float(point[i] * math.exp(-z * sd[i])), "hi": float(point[i] * math.exp(z * sd[i])),
                "log_sd": float(sd[i]), "log_sd_param": float(sd_param[i]), "log_sd_model": float(sd_model[i])}

    def triple(offset, k):
        return {p: entry(offset + 3 * k + j) for j, p in enumerate(PCTS)}

    sd_slo = np.sqrt(sd_param[9:18].reshape(3, 3) ** 2 + sd_mf_slo**2)
    p_slo = slo_probability(np.asarray(m.slo_margin), sd_slo)
    out = {
        "level": level,
        "ttft_s": triple(0, 0), "tbt_s": triple(0, 1), "e2e_s": triple(0, 2),
        "slowdown": {met: triple(9, k) for k, met in enumerate(METRICS)},
        **{name: entry(18 + i) for i, name in enumerate(SCALARS)},
        **{name: {"lo": float(getattr(m, name)), "hi": float(getattr(m, name)), "log_sd": 0.0} for name in EXACT},
        "slo_probability": {met: {p: float(p_slo[k, j]) for j, p in enumerate(PCTS)} for k, met in enumerate(METRICS)},
        "slo_log_sd": {met: {p: float(sd_slo[k, j]) for j, p in enumerate(PCTS)} for k, met in enumerate(METRICS)},
        "all_slos_probability": float(joint_probability(p_slo)),
        "sources": {
            "parameters": None if unc is None else {
                "gpus": list(cluster_gpus(cluster)), "sigma_points": 2 * len(sigma_deltas(role_gpus(cluster), unc)),
                "method": "central differences at the sigma points of the Laplace covariance"},
            "model_form": None if model_form is None else {
                "mode": mode, "rho_prompt": float(m.rho_prompt_pool),
                "load_bin": _bin_label(model_form.rho_edges, float(m.rho_prompt_pool)),
                "source": model_form.meta.get("source")},
            "joint_rule": "product of the nine SLO probabilities (a lower bound for positively correlated errors)",
        },
    }
    return out


def _bin_label(edges, rho) -> str:
    e = list(edges) + [math.inf]
    b = max(int(np.searchsorted(np.asarray(edges), rho, side="right") - 1), 0)
    return f"{e[b]:g} <= rho_prompt < {e[b + 1]:g}"
