"""Integer answers: repair of the relaxed optimum, the largest feasible rate of each
candidate, and the exhaustive grid that verifies both.

*Repair*: round, then evaluate the integer box +-`radius` around the rounded point
(and +-`cap_radius` cap steps when caps are free) in one vectorised call; keep the best
feasible cell, re-centring while the best lies on the box's edge. Throughput problems
search each candidate's largest feasible rate (`search.search_boundary`), all
candidates at once.

*Verify*: `grid_search` evaluates the whole integer box (vectorised, in chunks). Cells
that provably cannot beat a verified feasible incumbent are skipped: cost and
provisioned power are known linear functions of the pool sizes, and a cell whose rate
cannot reach the incumbent's fails at the incumbent's rate. The skip is exact;
`prune=False` evaluates every cell anyway.

References:
    Patel et al., Splitwise, ISCA 2024, §VI-A (Fig. 12: the paper's exhaustive grid).
"""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from splitwise_jax.cluster.cluster import Cluster, Resolution
from splitwise_jax.optimize.problem import CONSTRAINT_NAMES, Candidate, GridResult, Problem, SolverConfig
from splitwise_jax.optimize.search import search_boundary
from splitwise_jax.optimize.spec import (FEAS_TOL, RATE_BOUNDS, Spec, SpecInfo, evaluate_points, is_feasible,
                                         make_spec, progress_bar, unit_cost)
from splitwise_jax.cluster.workload import Workload

def candidates(phys, g, cost, power, objective, metrics=None) -> list[Candidate]:
    out = []
    feas = is_feasible(g)
    for i in range(len(phys)):
        obj = {"cost": cost[i], "power": power[i], "throughput": phys[i, 4]}[objective]
        out.append(Candidate(int(round(phys[i, 0])), int(round(phys[i, 1])), float(phys[i, 2]), float(phys[i, 3]),
                             float(phys[i, 4]), bool(feas[i]), float(obj), g[i], float(cost[i]), float(power[i]),
                             metrics[i] if metrics else None))
    return out


def _rank_key(c: Candidate, objective: str):
    """Sort key, best first: the objective, then the other spend, then SLO headroom.

    The grid and the repair share it, so equal-objective ties resolve the same way."""
    obj = round(c.objective, 9)
    primary = -obj if objective == "throughput" else obj
    secondary = c.provisioned_power_kw if objective == "cost" else c.cost_per_hour
    return (not c.feasible, primary, round(secondary, 9), -float(np.min(c.constraints[:9])))


def best_of(cands: list[Candidate], objective: str) -> Candidate | None:
    feas = [c for c in cands if c.feasible]
    return min(feas, key=lambda c: _rank_key(c, objective)) if feas else None



def max_rates(spec: Spec, cells: np.ndarray, lo: float, hi: float, rate_tol: float, resolution: Resolution,
              progress=False, desc="rate"):
    """Largest feasible rate of each cell (rows: n_p, n_t, cap_p, cap_t) by vectorised
    bisection in log rate on [lo, hi], hi widened (x4) while some cell still passes there.

    Returns (rates, g at that rate, cost, power, evaluations); rate NaN where the cell
    fails at lo. Feasibility is taken as monotone in the rate (more load never shortens
    a queue), as in the paper's own search for the highest load meeting the SLOs; the
    search is `search.search_boundary`, the one the studies use."""
    n = len(cells)
    g_lo, cost, power = evaluate_points(spec, np.concatenate([cells, np.full((n, 1), lo)], axis=1), resolution,
                                        progress, desc)
    g_best = g_lo.copy()

    with progress_bar(progress, desc=f"{desc}: rate bisection", unit="it") as bar:
        def feasible(rows, log_r):
            # One rate per cell and step (bisection): the passing point is the new lower
            # end of the bracket, so its constraints are the answer's so far.
            g, _, _ = evaluate_points(spec, np.concatenate([cells[rows], np.exp(log_r)], axis=1), resolution)
            ok = is_feasible(g)
            g_best[rows[ok]] = g[ok]
            bar.update(1)
            return ok[:, None]

        found = search_boundary(feasible, np.full(n, math.log(lo)), np.full(n, math.log(min(hi, RATE_BOUNDS[1]))),
                                rel_tol=rate_tol, ok_lo=is_feasible(g_lo), ceiling=math.log(RATE_BOUNDS[1]))
    rates = np.where(found.ok_lo, found.value, np.nan)
    return rates, g_best, cost, power, n + found.evaluations


def _cap_grid(lo: float, step: float) -> np.ndarray:
    """Caps searched by the integer repair and the grid: 1, 1 - step, ... down to the floor."""
    grid = 1.0 - step * np.arange(int(math.floor((1.0 - lo) / step + 1e-9)) + 1)
    return np.unique(np.round(np.append(grid, lo), 12))


def _box(p_range, t_range, cp_values, ct_values) -> np.ndarray:
    """Integer cells (n_p, n_t, cap_p, cap_t) of a box."""
    return np.array(list(itertools.product(p_range, t_range, cp_values, ct_values)), dtype=float).reshape(-1, 4)


def _spend(cluster: Cluster, cells: np.ndarray):
    """Exact cost ($/h) and provisioned power (kW) of cells, as `evaluate` accounts them."""
    cp, ct = unit_cost(cluster)
    pp = float(cluster.prompt.machine.provisioned_power_w) / 1e3
    pt = float(cluster.token.machine.provisioned_power_w) / 1e3
    cost = cells[:, 0] * cp + cells[:, 1] * ct
    power = cells[:, 0] * pp * cells[:, 2] + cells[:, 1] * pt * cells[:, 3]
    return cost, power


def _within_budget(cluster: Cluster, problem: Problem, cells: np.ndarray) -> np.ndarray:
    cost, power = _spend(cluster, cells)
    ok = np.ones(len(cells), bool)
    if problem.cost_budget_per_h is not None:
        ok &= cost <= problem.cost_budget_per_h * (1 + FEAS_TOL)
    if problem.power_budget_kw is not None:
        ok &= power <= problem.power_budget_kw * (1 + FEAS_TOL)
    return ok



def _cap_values(info: SpecInfo, free: bool, which: int) -> np.ndarray:
    if not free:
        return np.array([info.cap_fixed[which]])
    return _cap_grid(info.cap_lo[which], info.cap_step)


def score_cells(cluster, spec, info, problem, cells, config, *, rate_lo=None, rate_hi=None, progress=False,
                 desc="evaluate"):
    """Evaluate integer cells for the problem: fixed-rate problems at the target rate,
    throughput problems by rate bisection. Returns candidates."""
    if len(cells) == 0:
        return [], 0
    if problem.objective != "throughput":
        phys = np.concatenate([cells, np.full((len(cells), 1), info.rate)], axis=1)
        g, cost, power, rows = evaluate_points(spec, phys, config.resolution, progress, desc, keep_metrics=True)
        return candidates(phys, g, cost, power, problem.objective, rows), len(cells)
    rates, g, cost, power, n_evals = max_rates(spec, cells, rate_lo, rate_hi, config.rate_tol,
                                                config.resolution, progress, desc)
    ok = np.isfinite(rates)
    phys = np.concatenate([cells, np.where(ok, rates, rate_lo)[:, None]], axis=1)
    cands = candidates(phys, g, cost, power, "throughput")
    cands = [c._replace(feasible=bool(ok[i]) and c.feasible) for i, c in enumerate(cands)]
    return cands, n_evals




def _neighbourhood(info, spec, problem, center, config):
    """Integer box around center = (n_p, n_t, cap_p, cap_t) (caps snapped to their grid)."""
    R = config.radius
    p_rng = range(max(1, center[0] - R), min(info.hi_p, center[0] + R) + 1)
    t_rng = range(max(1, center[1] - R), min(info.hi_t, center[1] + R) + 1) if info.splitwise else [0]
    caps = []
    for which, free in ((0, info.free_p), (1, info.free_t)):
        grid = _cap_values(info, free, which)
        k = int(np.argmin(np.abs(grid - center[2 + which])))
        caps.append(grid[max(0, k - config.cap_radius):k + config.cap_radius + 1])
    return _box(p_rng, t_rng, caps[0], caps[1])


def repair(cluster, spec, info, problem, config, phys_c, progress):
    """Best feasible integer cell near the continuous answer, re-centred up to 4 times.

    A throughput problem's continuous answer can end past its budget (the relaxation
    stopped infeasible); its pools are then scaled down together onto the budget first,
    so that the box holds cells the budget allows (else the repair found none: Splitwise-AA
    at iso-cost, 58.6 + 35.6 machines against a budget of 86)."""
    if problem.objective == "throughput":
        cost, power = _spend(cluster, np.asarray([phys_c[:4]], float))
        scale = 1.0
        if problem.cost_budget_per_h is not None:
            scale = min(scale, problem.cost_budget_per_h / max(float(cost[0]), 1e-9))
        if problem.power_budget_kw is not None:
            scale = min(scale, problem.power_budget_kw / max(float(power[0]), 1e-9))
        phys_c = np.concatenate([np.asarray(phys_c[:2], float) * scale, np.asarray(phys_c[2:], float)])
    center = (int(np.clip(round(phys_c[0]), 1, info.hi_p)),
              int(np.clip(round(phys_c[1]), 1, max(info.hi_t, 1))) if info.splitwise else 0,
              float(phys_c[2]), float(phys_c[3]))
    seen: dict[tuple, Candidate] = {}
    n_evals = 0
    best = None
    for _ in range(5):
        cells = _neighbourhood(info, spec, problem, center, config)
        if problem.objective == "throughput":
            cells = cells[_within_budget(cluster, problem, cells)]
        new = np.array([c for c in cells if tuple(c) not in seen]).reshape(-1, 4)
        rate = phys_c[4]
        cands, n = score_cells(cluster, spec, info, problem, new, config, rate_lo=0.25 * rate, rate_hi=1.5 * rate)
        n_evals += n
        for cell, cand in zip(new, cands):
            seen[tuple(cell)] = cand
        best = best_of(list(seen.values()), problem.objective)
        if best is None:
            break
        R = config.radius
        on_edge = (abs(best.prompt_machines - center[0]) == R and 1 < best.prompt_machines < info.hi_p) or (
            info.splitwise and abs(best.token_machines - center[1]) == R and 1 < best.token_machines < info.hi_t)
        for which, free in ((0, info.free_p), (1, info.free_t)):
            grid = _cap_values(info, free, which)
            k_c = int(np.argmin(np.abs(grid - center[2 + which])))
            k_b = int(np.argmin(np.abs(grid - (best.prompt_cap_frac, best.token_cap_frac)[which])))
            on_edge |= free and abs(k_b - k_c) == config.cap_radius and 0 < k_b < len(grid) - 1
        if not on_edge:
            break
        center = (best.prompt_machines, best.token_machines, best.prompt_cap_frac, best.token_cap_frac)
    return best, n_evals


def binding_constraints(cluster, spec, info, problem, config, best):
    """What stops a better neighbour: constraints violated by the answer with one machine
    fewer in each pool (cost/power), or by the answer at 1% more load (throughput)."""
    if best is None:
        return {}, 0
    base = np.array([best.prompt_machines, best.token_machines, best.prompt_cap_frac, best.token_cap_frac,
                     best.rate_per_s], float)
    probes = {}
    if problem.objective == "throughput":
        p = base.copy()
        p[4] *= 1.01
        probes["rate +1%"] = p
    else:
        if best.prompt_machines > 1:
            p = base.copy()
            p[0] -= 1
            probes["prompt -1" if info.splitwise else "machines -1"] = p
        if info.splitwise and best.token_machines > 1:
            p = base.copy()
            p[1] -= 1
            probes["token -1"] = p
        cap_steps = ((2, info.free_p, "prompt cap"), (3, info.free_t, "token cap"))
        for col, free, name in cap_steps:
            if free and base[col] - problem.cap_step >= info.cap_lo[col - 2] - 1e-9:
                p = base.copy()
                p[col] -= problem.cap_step
                probes[f"{name} -{problem.cap_step:g}"] = p
    if not probes:
        return {}, 0
    g, _, _ = evaluate_points(spec, np.array(list(probes.values())), config.resolution)
    out = {}
    for (name, _), gi in zip(probes.items(), g):
        out[name] = [CONSTRAINT_NAMES[j] for j in range(len(gi)) if gi[j] < -FEAS_TOL]
    return out, len(probes)



# --------------------------------------------------------------------------------------
# Exhaustive verification
# --------------------------------------------------------------------------------------

def grid_search(cluster: Cluster, workload: Workload, problem: Problem = Problem(),
                config: SolverConfig = SolverConfig(), *, incumbent: Candidate | None = None,
                prune: bool = True, progress: bool = False) -> GridResult:
    """The exhaustive integer optimum over the box [1, max]^2 (x the cap grid), vectorised.

    Args:
        cluster, workload, problem, config: as for `optimize`.
        incumbent: a feasible configuration (e.g. `optimize(...).best`) used, with
            `prune`, to skip cells that provably cannot beat it: cells whose (exactly
            known) cost or power exceeds it, or, for throughput, cells that fail at its
            rate (feasibility is monotone in rate). The incumbent is re-evaluated, not trusted.
        prune: skip those cells (exact); False evaluates every cell of the box.
        progress: tqdm bars.

    Returns:
        GridResult with the best cell (ties broken as in `optimize`).
    """
    spec, info = make_spec(cluster, workload, problem)
    t0 = time.perf_counter()
    cells = _box(range(1, info.hi_p + 1),
                   range(1, info.hi_t + 1) if info.splitwise else [0],
                   _cap_values(info, info.free_p, 0), _cap_values(info, info.free_t, 1))
    if problem.objective == "throughput":
        cells = cells[_within_budget(cluster, problem, cells)]
    in_box = len(cells)
    desc = f"{cluster.name}: grid"
    if incumbent is not None and prune and incumbent.feasible:
        if problem.objective == "throughput":
            r = incumbent.rate_per_s
            phys = np.concatenate([cells, np.full((len(cells), 1), r)], axis=1)
            g, _, _ = evaluate_points(spec, phys, config.resolution, progress, desc + " screen")
            survivors = cells[is_feasible(g)]
            cands, n = score_cells(cluster, spec, info, problem, survivors, config, rate_lo=r, rate_hi=1.5 * r,
                                    progress=progress, desc=desc)
            n += len(cells)
            evaluated = len(cells)
        else:
            cost, power = _spend(cluster, cells)
            spend = cost if problem.objective == "cost" else power
            keep = spend <= incumbent.objective * (1 + 1e-9)
            cands, n = score_cells(cluster, spec, info, problem, cells[keep], config, progress=progress, desc=desc)
            evaluated = int(keep.sum())
    else:
        cands, n = score_cells(cluster, spec, info, problem, cells, config, rate_lo=RATE_BOUNDS[0], rate_hi=64.0,
                                progress=progress, desc=desc)
        evaluated = len(cells)
    return GridResult(best=best_of(cands, problem.objective), cells_in_box=in_box, cells_evaluated=evaluated,
                      evaluations=n, wall_s=time.perf_counter() - t0)


def same_answer(a: Candidate | None, b: Candidate | None, objective: str, rate_tol: float = 2e-3) -> bool:
    """Whether two answers are equally good: the same objective value (cost/power exactly,
    throughput within the bisection's resolution), or both infeasible."""
    if a is None or b is None:
        return a is None and b is None
    if objective == "throughput":
        return abs(a.objective - b.objective) <= rate_tol * max(a.objective, b.objective)
    return abs(a.objective - b.objective) <= 1e-9 * max(abs(a.objective), 1.0)


def evaluate_candidate(cluster: Cluster, workload: Workload, candidate: Candidate, problem: Problem = Problem(),
                       config: SolverConfig = SolverConfig()) -> Candidate:
    """Re-evaluate an answer on another workload (e.g. the full-resolution one).

    Returns the candidate with its constraints, feasibility and metrics on `workload`
    (the rate and caps are the candidate's)."""
    spec, _ = make_spec(cluster, workload, problem)  # pool bounds do not matter here
    g, cost, power, rows = evaluate_points(spec, candidate.as_row()[None], config.resolution, keep_metrics=True)
    return candidates(candidate.as_row()[None], g, cost, power, problem.objective, rows)[0]


def full_resolution_step_up(cluster: Cluster, workload: Workload, candidate: Candidate, problem: Problem = Problem(),
                            config: SolverConfig = SolverConfig(), reach: int = 2) -> Candidate | None:
    """The best configuration on `workload` (full resolution) among the answer and the
    ones with up to `reach` more machines in each pool, caps and rate kept.

    The search runs on coarsened request classes; near an SLO limit its answer can miss
    a limit by a fraction of a per cent at full resolution (a margin of -0.3% on TBT P50
    was seen for BLOOM-176B on DGX-A100 at 20 req/s). Adding machines never lowers a
    cost or power objective's feasibility in the model's valid region, so the cheapest
    feasible of these (reach + 1)^2 cells (a baseline: reach + 1) is the nearest answer
    that meets every constraint at full resolution. One batched evaluation. Returns
    None where none of them is feasible, or for the throughput objective (there the
    rate, not the pools, would move)."""
    if problem.objective == "throughput":
        return None
    base = candidate.as_row()
    splitwise = cluster.strategy.token_pool
    rows = [base + np.array([dp, dt, 0.0, 0.0, 0.0]) for dp in range(reach + 1)
            for dt in (range(reach + 1) if splitwise else (0,))]
    rows = np.stack([r for r in rows if r[0] <= problem.max_machines and r[1] <= problem.max_machines])
    spec, _ = make_spec(cluster, workload, problem)
    g, cost, power, metrics = evaluate_points(spec, rows, config.resolution, keep_metrics=True)
    return best_of(candidates(rows, g, cost, power, problem.objective, metrics), problem.objective)


def evaluate_plane(cluster: Cluster, workload: Workload, problem: Problem, answer: Candidate, p_max: int,
                   t_max: int, config: SolverConfig = SolverConfig(), *, progress: bool = False):
    """Feasibility and objective over the (prompt, token) plane at the answer's caps and rate
    (the paper's Fig. 12 view). Returns (prompt counts, token counts, feasible (P, T),
    objective (P, T)); a baseline has one token column (0)."""
    spec, info = make_spec(cluster, workload, problem)  # pool bounds do not matter here
    ps = np.arange(1, p_max + 1)
    ts = np.arange(1, t_max + 1) if info.splitwise else np.array([0])
    cells = _box(ps, ts, [answer.prompt_cap_frac], [answer.token_cap_frac])
    phys = np.concatenate([cells, np.full((len(cells), 1), answer.rate_per_s)], axis=1)
    g, cost, power = evaluate_points(spec, phys, config.resolution, progress, f"{cluster.name}: plane")
    feas = is_feasible(g).reshape(len(ps), len(ts))
    obj = (power if problem.objective == "power" else cost).reshape(len(ps), len(ts))
    return ps, ts, feas, obj


# The paper's headline ratios (Splitwise §VI-C, Figs. 18-19; shared/paper/splitwise_targets.md).
# HA's 1.18x and -10% are read against Baseline-H100: at equal provisioned power an
# H100+A100 cluster cannot cost less than an all-A100 one (A100: $0.71 per provisioned
