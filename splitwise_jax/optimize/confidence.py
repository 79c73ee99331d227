"""Confidence-aware answers: the best design whose SLOs all hold with a given probability.

`optimize` answers on the point estimate. `confident_answer` takes that answer and asks
instead for the cheapest (least power; highest throughput) integer design whose nine
SLOs all hold with probability >= `confidence` under the model's error bars
(`splitwise_jax.uncertainty`: the parameters' Laplace covariance and the measured
model-form spread). The joint probability is the product of the nine per-SLO
probabilities Phi(margin / sd) (a lower bound for positively correlated errors; see
`uncertainty`). Every other constraint (KV memory, pool loads, budgets) must hold on the
point estimate. A probability above 0.5 needs a positive margin, so for confidence
>= 0.5 the answer meets every SLO on the point estimate too, and the search starts at
the point answer's spend: the confident answer is never cheaper (less power, faster).

The search reuses the optimiser's batched evaluation (`spec.evaluate_points`, one
compiled program):

1. the parameter part of each margin's s.d. at the point answer: central differences
   at the 2k sigma points of the covariance (`uncertainty.param_log_sd`: one jitted
   `evaluate`, compiled once, every perturbation a new set of traced leaves);
2. cost / power: integer cells (pools x cap grid) in order of spend from the point
   answer's up to `SPEND_CEILING` times it, in batches; each cell's probability from its
   margins with the model-form s.d. of its load and the point answer's parameter s.d.;
   throughput: each cell near the point answer gets the largest rate with that
   probability (the vectorised boundary search);
3. the best few confident cells are re-checked with their own sigma points; the best that
   still passes is the answer.

References:
    docs/uncertainty.md; Patel et al., Splitwise, ISCA 2024, §VI-A (Fig. 12).
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import numpy as np

from splitwise_jax.cluster.cluster import Cluster
from splitwise_jax.optimize.integer import _box, _cap_values, _neighbourhood, _spend, _within_budget
from splitwise_jax.optimize.problem import SLO_NAMES, Candidate, OptimizeResult, Problem, SolverConfig
from splitwise_jax.optimize.search import search_boundary
from splitwise_jax.optimize.spec import (CHUNK, RATE_BOUNDS, evaluate_points, is_feasible, make_spec, progress_bar,
                                         with_cap)
from splitwise_jax.phases.params import ParamUncertainty, load_uncertainty
from splitwise_jax.uncertainty import (ModelFormError, joint_probability, load_model_form, param_log_sd, role_gpus,
                                       sigma_deltas, slo_probability, timing_mode)
from splitwise_jax.cluster.workload import Workload

#: Cost / power problems search designs spending up to this multiple of the point answer.
SPEND_CEILING = 2.0
#: Confident candidates re-checked with their own sigma points per round.
VERIFY = 4
_PROMPT_LOAD = 10  # index of the prompt-pool load constraint, -log(rho), in the constraint vector


class ConfidentAnswer(NamedTuple):
    """Outcome of `confident_answer`.

    Attributes:
        confidence: the probability asked for.
        best: the confident integer design (None: none found in the searched range).
        probability: P(all nine SLOs) of `best` (its own sigma points).
        slo_probability: (9,) per-SLO probabilities of `best`, `SLO_NAMES` order.
        point: the point-estimate answer it started from.
        point_probability: P(all nine SLOs) of the point answer.
        point_slo_probability: (9,) of the point answer.
        cells_evaluated: integer designs evaluated (sigma points not counted).
        sigma_evaluations: evaluations of single designs spent on sigma points.
        wall_s: wall time.
        searched_spend: (lowest, highest) spend searched (cost/power), or None.
    """

    confidence: float
    best: Candidate | None
    probability: float | None
    slo_probability: np.ndarray | None
    point: Candidate | None
    point_probability: float | None
    point_slo_probability: np.ndarray | None
    cells_evaluated: int
    sigma_evaluations: int
    wall_s: float
    searched_spend: tuple | None


def check_confidence(confidence) -> float:
    """The confidence as a float in (0, 1), or ValueError naming the argument."""
    try:
        c = float(confidence)
    except (TypeError, ValueError):
        raise ValueError(f"confidence must be a probability in (0, 1), got {confidence!r}") from None
    if not (0.0 < c < 1.0) or math.isnan(c):
        raise ValueError(f"confidence must be a probability in (0, 1), got {confidence!r}")
    return c


def _cells_phys(cells: np.ndarray, rate) -> np.ndarray:
    rate = np.broadcast_to(np.asarray(rate, float), (len(cells),))
    return np.concatenate([cells[:, :4], rate[:, None]], axis=1)


class _Assessor:
    """Probabilities of batches of designs for one problem (host side)."""

    def __init__(self, cluster: Cluster, workload: Workload, problem: Problem, config: SolverConfig,
                 unc: ParamUncertainty | None, model_form: ModelFormError | None):
        self.cluster, self.workload, self.problem = cluster, workload, problem
        self.spec, self.info = make_spec(cluster, workload, problem)
        self.config = config
        self.unc = unc
        self.model_form = model_form
        self.mode = timing_mode(cluster)
        self.n_sigma = 2 * len(sigma_deltas(role_gpus(cluster), unc))
        self.sigma_evaluations = 0
        self.cells = 0

    def point(self, phys):
        """(g (N, 14), cost, power) on the point estimate (the optimiser's batched evaluation)."""
        self.cells += len(phys)
        return evaluate_points(self.spec, phys, self.config.resolution)

    def param_sd(self, phys) -> np.ndarray:
        """(N, 9) parameter s.d. of each SLO margin (= of each log slowdown), by central
        differences at the sigma points, one jitted `evaluate` per point: a batched
        evaluation pads every call to CHUNK configurations, 64x the work for one design."""
        out = []
        for row in np.asarray(phys, float):
            c = self.cluster
            cl = c.replace(n_prompt=float(row[0]), n_token=float(row[1]) if c.strategy.token_pool else 0.0,
                           prompt=with_cap(c.prompt, float(row[2])), token=with_cap(c.token, float(row[3])))
            sd = param_log_sd(cl, self.workload.with_rate(float(row[4])), self.problem.horizon_s, unc=self.unc,
                              resolution=self.config.resolution)
            out.append(sd[9:18])
            self.sigma_evaluations += self.n_sigma
        return np.reshape(out, (-1, 9))

    def probabilities(self, g, sd_param) -> np.ndarray:
        """(N, 9) per-SLO probabilities from constraint rows g and the parameter s.d."""
        rho = np.exp(-g[:, _PROMPT_LOAD])
        sd_mf = (self.model_form.sd(rho, self.mode, "slo").reshape(len(g), 9) if self.model_form is not None
                 else np.zeros((len(g), 9)))
        sd = np.sqrt(np.asarray(sd_param) ** 2 + sd_mf**2)
        return slo_probability(g[:, :9], sd)


def _joint(p9: np.ndarray) -> np.ndarray:
    return joint_probability(p9.reshape(p9.shape[:-1] + (3, 3)))


def confident_answer(cluster: Cluster, workload: Workload, problem: Problem, point: OptimizeResult,
                     confidence: float = 0.9, config: SolverConfig = SolverConfig(), *,
                     unc: ParamUncertainty | None = None, model_form: ModelFormError | None = None,
                     progress: bool = False) -> ConfidentAnswer:
    """The best integer design whose SLOs all hold with probability >= `confidence`.

    Args:
        cluster, workload, problem, config: as given to `optimize`.
        point: `optimize`'s answer to the same problem (the search starts from it).
        confidence: the probability that all nine SLOs hold, in (0, 1).
        unc: the calibration's parameter uncertainty (default: the shipped one).
        model_form: the model-form spread (default: the shipped one).
        progress: tqdm bars.

    Returns:
        `ConfidentAnswer`; `best` is None when the point answer is None or nothing in
        the searched range reaches the confidence.

    Raises:
        ValueError: a confidence outside (0, 1).

    Example:
        >>> res = optimize(cluster, wl, Problem("cost"))                         # doctest: +SKIP
        >>> ans = confident_answer(cluster, wl, Problem("cost"), res, 0.9)      # doctest: +SKIP
        >>> ans.best.cost_per_hour >= res.best.cost_per_hour                    # doctest: +SKIP
        True
    """
    c = check_confidence(confidence)
    t0 = time.perf_counter()
    unc = load_uncertainty() if unc is None else unc
    model_form = load_model_form() if model_form is None else model_form
    a = _Assessor(cluster, workload, problem, config, unc, model_form)
    if point.best is None or not point.best.feasible:
        return ConfidentAnswer(c, None, None, None, point.best, None, None, 0, 0, time.perf_counter() - t0, None)
    p0 = point.best.as_row()[None]
    g0, _, _ = a.point(p0)
    sd0 = a.param_sd(p0)                       # (1, 9): taken as constant over the search
    pp0 = a.probabilities(g0, sd0)[0]
    if problem.objective == "throughput":
        found, searched = _search_throughput(a, cluster, problem, point.best, sd0[0], c, progress)
    else:
        found, searched = _search_spend(a, cluster, problem, point.best, sd0[0], c, progress)
    best, p_best = None, None
    while found:
        # Re-check the best few with their own sigma points (one batch), keep the best that passes.
        head, found = found[:VERIFY], found[VERIFY:]
        phys = np.array([f.as_row() for f in head])
        g, _, _ = a.point(phys)
        p9 = a.probabilities(g, a.param_sd(phys))
        ok = (_joint(p9) >= c) & is_feasible(g)
        if ok.any():
            i = int(np.flatnonzero(ok)[0])
            best, p_best = head[i], p9[i]
            break
    return ConfidentAnswer(c, best, None if p_best is None else float(_joint(p_best)), p_best, point.best,
                           float(_joint(pp0)), pp0, a.cells, a.sigma_evaluations, time.perf_counter() - t0, searched)


def _candidate(cell, rate, g, cost, power, objective) -> Candidate:
    obj = {"cost": cost, "power": power, "throughput": rate}[objective]
    return Candidate(int(round(cell[0])), int(round(cell[1])), float(cell[2]), float(cell[3]), float(rate), True,
                     float(obj), g, float(cost), float(power))


def _search_spend(a: _Assessor, cluster, problem, point: Candidate, sd0, c, progress):
    """Cost / power: cells in order of spend from the point answer's; the confident ones
    (approximate probability) in rank order, the cheapest level first."""
    info = a.info
    cells = _box(range(1, info.hi_p + 1), range(1, info.hi_t + 1) if info.splitwise else [0],
                 _cap_values(info, info.free_p, 0), _cap_values(info, info.free_t, 1))
    cost, power = _spend(cluster, cells)
    spend, other = (cost, power) if problem.objective == "cost" else (power, cost)
    lo = point.objective * (1.0 - 1e-9)
    hi = point.objective * SPEND_CEILING
    keep = (spend >= lo) & (spend <= hi * (1 + 1e-9))
    cells, spend, other = cells[keep], spend[keep], other[keep]
    order = np.lexsort((other, spend))
    cells, spend = cells[order], spend[order]
    found: list[Candidate] = []
    with progress_bar(progress, total=len(cells), desc=f"{cluster.name}: confidence {c:g}", unit="cfg") as bar:
        for start in range(0, len(cells), CHUNK):
            if found and spend[start] > found[0].objective * (1 + 1e-9):
                break  # every cell at the confident spend level has been seen
            block = cells[start:start + CHUNK]
            phys = _cells_phys(block, info.rate)
            g, cst, pwr = a.point(phys)
            p = _joint(a.probabilities(g, np.broadcast_to(sd0, (len(g), 9))))
            for i in np.flatnonzero(is_feasible(g) & (p >= c)):
                found.append(_candidate(block[i], info.rate, g[i], cst[i], pwr[i], problem.objective))
            bar.update(len(block))
    found.sort(key=lambda f: (round(f.objective, 9), round(f.provisioned_power_kw if problem.objective == "cost"
                                                           else f.cost_per_hour, 9)))
    return found, (float(lo), float(hi))


def _search_throughput(a: _Assessor, cluster, problem, point: Candidate, sd0, c, progress):
    """Throughput: the cells near the point answer (within budget), each at the largest
    rate where it is confident (vectorised bisection below the point answer's rate)."""
    info, config = a.info, a.config
    center = (point.prompt_machines, point.token_machines, point.prompt_cap_frac, point.token_cap_frac)
    cells = _neighbourhood(info, a.spec, problem, center, config)
    cells = cells[_within_budget(cluster, problem, cells)]
    n = len(cells)
    lo = np.full(n, math.log(RATE_BOUNDS[0]))
    hi = np.full(n, math.log(point.rate_per_s * 1.5))
    best_g = {}

    def ok_fn(rows, log_r):
        g, _, _ = a.point(_cells_phys(cells[rows], np.exp(log_r[:, 0])))
        ok = is_feasible(g) & (_joint(a.probabilities(g, np.broadcast_to(sd0, (len(g), 9)))) >= c)
        for r, okr, gr in zip(rows, ok, g):
            if okr:
                best_g[int(r)] = gr
        return ok[:, None]

    with progress_bar(progress, desc=f"{cluster.name}: confidence {c:g}", unit="it"):
        b = search_boundary(ok_fn, lo, hi, rel_tol=config.rate_tol)
    found = []
    for i in range(n):
        if b.ok_lo[i] and i in best_g:
            cell = cells[i]
            cost, power = _spend(cluster, cell[None])
            found.append(_candidate(cell, float(b.value[i]), best_g[i], cost[0], power[0], "throughput"))
    found.sort(key=lambda f: (-round(f.rate_per_s, 9), round(f.cost_per_hour, 9)))
    return found, None


def confidence_dict(ans: ConfidentAnswer, splitwise: bool) -> dict:
    """JSON object of a confident answer and what the confidence costs."""
    def cand(x: Candidate | None, p, p9):
        if x is None:
            return None
        d = ({"prompt_machines": x.prompt_machines, "token_machines": x.token_machines,
              "prompt_cap_frac": x.prompt_cap_frac, "token_cap_frac": x.token_cap_frac} if splitwise
             else {"machines": x.prompt_machines, "cap_frac": x.prompt_cap_frac})
        d.update(rate_per_s=x.rate_per_s, cost_per_hour=x.cost_per_hour, provisioned_power_kw=x.provisioned_power_kw,
                 all_slos_probability=p, slo_probability=None if p9 is None else
                 {n: float(v) for n, v in zip(SLO_NAMES, p9)})
        return d

    out = {"confidence": ans.confidence, "answer": cand(ans.best, ans.probability, ans.slo_probability),
           "point_answer": cand(ans.point, ans.point_probability, ans.point_slo_probability),
           "cells_evaluated": ans.cells_evaluated, "sigma_evaluations": ans.sigma_evaluations, "wall_s": ans.wall_s,
           "joint_rule": "product of the nine SLO probabilities (a lower bound for positively correlated errors)"}
    if ans.best is not None and ans.point is not None:
        b, p = ans.best, ans.point
        out["cost_of_confidence"] = {
            "machines": (b.prompt_machines + b.token_machines) - (p.prompt_machines + p.token_machines),
            "cost_per_hour": b.cost_per_hour - p.cost_per_hour,
            "provisioned_power_kw": b.provisioned_power_kw - p.provisioned_power_kw,
            "rate_per_s": b.rate_per_s - p.rate_per_s}
    return out


def confidence_text(ans: ConfidentAnswer, splitwise: bool) -> str:
    """Lines for the table view: the confident answer and what it costs over the point one."""
    def pools(x: Candidate):
        return (f"{x.prompt_machines} prompt + {x.token_machines} token" if splitwise
                else f"{x.prompt_machines} machines")

    lines = [f"  confidence {ans.confidence:g} (P(all nine SLOs) = product of the per-SLO probabilities):"]
    if ans.point is not None and ans.point_probability is not None:
        lines.append(f"    point answer  {pools(ans.point)}: P = {ans.point_probability:.3f}")
    if ans.best is None:
        where = (f" spending up to {SPEND_CEILING:g}x the point answer" if ans.searched_spend else " near the point answer")
        lines.append(f"    no design{where} reaches P >= {ans.confidence:g} (the error bars are wider than the "
                     "margins any design gets; docs/uncertainty.md)")
    else:
        b, p = ans.best, ans.point
        lines.append(f"    confident     {pools(b)}: P = {ans.probability:.3f}   ${b.cost_per_hour:,.2f}/h   "
                     f"{b.provisioned_power_kw:.1f} kW" + (f"   {b.rate_per_s:.2f} req/s" if b.rate_per_s != p.rate_per_s
                                                         else ""))
        dm = (b.prompt_machines + b.token_machines) - (p.prompt_machines + p.token_machines)
        lines.append(f"    cost of confidence: {dm:+d} machines, {b.cost_per_hour - p.cost_per_hour:+,.2f} $/h, "
                     f"{b.provisioned_power_kw - p.provisioned_power_kw:+.1f} kW provisioned"
                     + (f", {b.rate_per_s - p.rate_per_s:+.2f} req/s" if b.rate_per_s != p.rate_per_s else ""))
        weakest = int(np.argmin(ans.slo_probability))
        lines.append(f"    weakest SLO: {SLO_NAMES[weakest]} (P = {ans.slo_probability[weakest]:.3f})")
    lines.append(f"    ({ans.cells_evaluated} designs and {ans.sigma_evaluations} sigma-point evaluations in "
                 f"{ans.wall_s:.1f} s)")
    return "\n".join(lines)
