"""Pareto fronts across designs, pool sizes and caps (the paper's Figs. 18-19 as fronts).

`optimize` answers one objective; the paper compares designs at single iso-power and
iso-cost points. `pareto_front` returns every non-dominated design instead:

* without throughput (e.g. ``cost,power``): at the problem's load, each design's
  *staircase*, the fewest prompt machines that meet every constraint for each token-pool
  size (and cap), found by a k-ary search over integers that asks every open column at
  once (one batched evaluation per step), inside brackets a coarse probe (8 x 8 log grid)
  gives. Feasibility is monotone in the prompt pool, so every other feasible cell is
  dominated by a staircase cell of the same column. The columns searched reach a little
  past the token pools of the probe's cheap feasible cells.
* with throughput (e.g. ``cost,throughput``): each cell of a log grid of pool sizes (and
  caps) at its largest feasible rate (`integer.max_rates`, the optimiser's bisection).

Then the non-dominated set over all designs' candidates (`non_dominated`). Everything
runs through the optimiser's one compiled batched evaluation (`spec.evaluate_points`).

References:
    Patel et al., Splitwise, ISCA 2024, §VI-C (Figs. 18-19: iso-power, iso-cost).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Callable, NamedTuple

import numpy as np

if TYPE_CHECKING:  # imported where used: pandas is 0.2 s of every command line's start
    import pandas as pd

from splitwise_jax.cluster.cluster import Cluster
from splitwise_jax.optimize.integer import _box, _cap_values, _spend, max_rates
from splitwise_jax.optimize.problem import Problem, SolverConfig
from splitwise_jax.optimize.spec import CHUNK, RATE_BOUNDS, evaluate_points, is_feasible, make_spec, progress_bar
from splitwise_jax.cluster.workload import Workload

PARETO_OBJECTIVES = ("cost", "power", "throughput")
#: +1 minimise, -1 maximise; the CSV column each objective reads.
SENSE = {"cost": 1.0, "power": 1.0, "throughput": -1.0}
COLUMN = {"cost": "cost_per_hour", "power": "provisioned_power_kw", "throughput": "rate_per_s"}
_PROBE = 8  # points per axis of the coarse probe and of the throughput grid


def parse_objectives(text: str) -> tuple[str, ...]:
    """'cost,power' -> ('cost', 'power'); ValueError naming the bad entry otherwise."""
    names = [t.strip().lower() for t in str(text).split(",") if t.strip()]
    for n in names:
        if n not in PARETO_OBJECTIVES:
            raise ValueError(f"--pareto: unknown objective {n!r}; accepted: {', '.join(PARETO_OBJECTIVES)} "
                             "(two or three, comma-separated, e.g. cost,power)")
    if len(set(names)) != len(names) or not 2 <= len(names) <= 3:
        raise ValueError(f"--pareto needs two or three different objectives of {', '.join(PARETO_OBJECTIVES)}, "
                         f"got {text!r}")
    return tuple(names)


def non_dominated(values: np.ndarray, senses) -> np.ndarray:
    """Mask of the rows of values (N, m) that no other row dominates.

    Row a dominates b when a is at least as good in every column and better in one
    (good = small for sense +1, large for -1). Values within 1e-9 of each column's
    largest magnitude count as equal (30 machines cost the same however the pools split
    them, up to rounding). Duplicates keep their first copy.
    """
    v = np.asarray(values, float) * np.asarray(senses, float)[None, :]
    scale = np.maximum(np.max(np.abs(v), axis=0, initial=0.0), 1e-300)
    v = np.round(v / scale, 9)
    n = len(v)
    keep = np.ones(n, bool)
    for i in range(n):
        if not keep[i]:
            continue
        le = np.all(v <= v[i], axis=1)
        lt = np.any(v < v[i], axis=1)
        if np.any(le & lt):
            keep[i] = False
            continue
        dup = np.all(v == v[i], axis=1)
        dup[: i + 1] = False
        keep &= ~dup
    return keep


class ParetoResult(NamedTuple):
    """Outcome of `pareto_front`.

    Attributes:
        objectives: the objectives, e.g. ("cost", "power").
        front: the non-dominated designs (DataFrame: design, prompt_machines,
            token_machines, prompt_cap_frac, token_cap_frac, rate_per_s, cost_per_hour,
            provisioned_power_kw), sorted by the first objective.
        candidates: every feasible candidate considered (same columns plus `on_front`).
        evaluations: configurations evaluated, all designs together.
        wall_s: wall time; per_design_s: per design.
    """

    objectives: tuple
    front: pd.DataFrame
    candidates: pd.DataFrame
    evaluations: int
    wall_s: float
    per_design_s: dict


def _feasible_cells(spec, info, cells, rate, config):
    phys = np.concatenate([cells, np.full((len(cells), 1), rate)], axis=1)
    g, _, _ = evaluate_points(spec, phys, config.resolution)
    return is_feasible(g)


def _dominated(points: np.ndarray, by: np.ndarray) -> np.ndarray:
    """Which rows of points (n, 2; both minimised) some row of `by` dominates (ties up
    to 1e-9 of the scale count as equal, as in `non_dominated`)."""
    if not len(points) or not len(by):
        return np.zeros(len(points), bool)
    scale = np.maximum(np.max(np.abs(np.concatenate([points, by])), axis=0), 1e-300)
    p, b = np.round(points / scale, 9), np.round(by / scale, 9)
    le = np.all(b[None, :, :] <= p[:, None, :], axis=2)
    lt = np.any(b[None, :, :] < p[:, None, :], axis=2)
    return np.any(le & lt, axis=1)


class _Staircase:
    """One design's search for its staircase at the problem's load: per column (token
    pool, caps) the fewest prompt machines meeting every constraint.

    Feasibility is taken as monotone in each pool and cap (more machines or a higher cap
    never break an SLO), as the optimiser's own pruning does. A coarse probe at the
    highest caps brackets every column (a feasible probe cell with fewer token machines
    bounds it above; an infeasible one with more bounds it below); each `step` is one
    batched evaluation: the open columns' top checks and k-ary points inside their
    brackets. `prune` drops columns whose cheapest possible cell is already dominated
    in (cost, power) by a known feasible design of any family: exact, since cost and
    power are known functions of the cell that grow with the prompt pool.
    """

    def __init__(self, cluster: Cluster, workload: Workload, problem: Problem, config: SolverConfig):
        self.cluster = cluster
        self.spec, self.info = make_spec(cluster, workload, problem)
        self.config = config
        self.evaluations = 0
        info = self.info
        caps_p, caps_t = _cap_values(info, info.free_p, 0), _cap_values(info, info.free_t, 1)
        ps = np.unique(np.round(np.geomspace(1, info.hi_p, _PROBE)))
        ts = np.unique(np.round(np.geomspace(1, info.hi_t, _PROBE))) if info.splitwise else np.array([0.0])
        probe = _box(ps, ts, [caps_p[-1]], [caps_t[-1]])
        ok = self._feasible(probe)
        self.probe_feasible = probe[ok]
        t_cols = np.arange(1, info.hi_t + 1, dtype=float) if info.splitwise else np.array([0.0])
        self.cols = np.array([(t, cp, ct) for t in t_cols for cp in caps_p for ct in caps_t], float)
        n = len(self.cols)
        top_caps = (self.cols[:, 1] == caps_p[-1]) & (self.cols[:, 2] == caps_t[-1])
        self.lo = np.zeros(n)
        self.hi = np.full(n, float(info.hi_p))
        self.known_hi = np.zeros(n, bool)
        for cell, good in zip(probe, ok):
            if good:
                sel = top_caps & (self.cols[:, 0] >= cell[1]) & (cell[0] <= self.hi)
                self.hi[sel] = cell[0]
                self.known_hi |= sel
            else:
                sel = (self.cols[:, 0] <= cell[1]) & (cell[0] > self.lo)
                self.lo[sel] = cell[0]
        self.lo = np.minimum(self.lo, self.hi - 1)
        self.alive = np.ones(n, bool) if ok.any() else np.zeros(n, bool)

    def _feasible(self, cells):
        self.evaluations += len(cells)
        phys = np.concatenate([cells, np.full((len(cells), 1), self.info.rate)], axis=1)
        g, _, _ = evaluate_points(self.spec, phys, self.config.resolution)
        return is_feasible(g)

    def spend(self, n_p, cols) -> np.ndarray:
        cost, power = _spend(self.cluster, np.column_stack([n_p, cols]))
        return np.column_stack([cost, power])

    def known_feasible(self) -> np.ndarray:
        """(cost, power) of the design's cells known to be feasible."""
        pts = [self.spend(self.probe_feasible[:, 0], self.probe_feasible[:, 1:])] if len(self.probe_feasible) else []
        sel = self.alive & self.known_hi
        if sel.any():
            pts.append(self.spend(self.hi[sel], self.cols[sel]))
        return np.concatenate(pts) if pts else np.empty((0, 2))

    @property
    def open(self) -> bool:
        return bool(np.any(self.alive & (~self.known_hi | (self.hi - self.lo > 1))))

    def prune(self, known: np.ndarray) -> None:
        idx = np.flatnonzero(self.alive)
        best_case = self.spend(self.lo[idx] + 1, self.cols[idx])
        self.alive[idx[_dominated(best_case, known)]] = False

    def step(self) -> None:
        top = np.flatnonzero(self.alive & ~self.known_hi)
        mid = np.flatnonzero(self.alive & self.known_hi & (self.hi - self.lo > 1))
        k = max(1, (CHUNK - len(top)) // max(len(mid), 1))
        rows, pts = list(top), list(self.hi[top].astype(int))
        for i in mid:
            lo, hi = int(self.lo[i]), int(self.hi[i])
            cand = np.unique(np.round(np.linspace(lo + 1, hi - 1, min(k, hi - lo - 1))).astype(int))
            rows.extend([i] * len(cand))
            pts.extend(cand.tolist())
        rows, pts = np.asarray(rows, int), np.asarray(pts, float)
        ok = self._feasible(np.column_stack([pts, self.cols[rows]]))
        for i in top:  # the largest pool fails: nothing in this column
            good = ok[(rows == i) & (pts == self.hi[i])][0]
            self.known_hi[i] = good
            self.alive[i] &= good
        for i in mid:
            sel = rows == i
            p, o = pts[sel], ok[sel]
            if o.any():
                first = int(np.argmax(o))
                self.hi[i] = p[first]
                if first > 0:
                    self.lo[i] = p[first - 1]
            else:
                self.lo[i] = p.max()

    def cells(self) -> np.ndarray:
        """Every cell known feasible: the staircase of the columns still in play (exact
        minima) and, for the record and the plot, the probe's and the pruned columns'."""
        sel = self.known_hi & (self.alive | (self.hi < self.info.hi_p))
        cells = np.concatenate([np.column_stack([self.hi[sel], self.cols[sel]]), self.probe_feasible])
        return np.unique(cells, axis=0)


def _staircases(clusters: dict, workload: Workload, problems: dict, config: SolverConfig):
    """Every design's staircase, searched together so each prunes the others."""
    states = {d: _Staircase(c, workload, problems[d], config) for d, c in clusters.items()}
    while True:
        known = np.concatenate([st.known_feasible() for st in states.values()])
        for st in states.values():
            st.prune(known)
        active = [st for st in states.values() if st.open]
        if not active:
            break
        for st in active:
            st.step()
    return {d: (st.cells(), st.evaluations) for d, st in states.items()}


def _rate_grid(cluster: Cluster, workload: Workload, problem: Problem, config: SolverConfig):
    """A log grid of pool sizes (x caps), each at its largest feasible rate."""
    spec, info = make_spec(cluster, workload, problem)
    caps_p, caps_t = _cap_values(info, info.free_p, 0), _cap_values(info, info.free_t, 1)
    ps = np.unique(np.round(np.geomspace(1, info.hi_p, _PROBE)))
    ts = np.unique(np.round(np.geomspace(1, info.hi_t, _PROBE))) if info.splitwise else np.array([0.0])
    cells = _box(ps, ts, caps_p, caps_t)
    rates, _, _, _, n = max_rates(spec, cells, RATE_BOUNDS[0], 64.0, 0.01, config.resolution)
    ok = np.isfinite(rates)
    return cells[ok], rates[ok], n


def pareto_front(make: Callable[[str], Cluster], designs, workload: Workload, problem: Problem,
                 objectives=("cost", "power"), config: SolverConfig = SolverConfig(), *,
                 progress: bool = False) -> ParetoResult:
    """The non-dominated designs across design families, pool sizes and caps.

    Args:
        make: design name -> Cluster (e.g. `lambda d: make_cluster(d, 1, 1)`).
        designs: design names.
        workload: request classes; its rate (or `problem.rate_per_s`) is the load of
            fronts without throughput.
        problem: SLOs, free caps, cap step, largest pools (its objective is ignored; a
            baseline's token cap is never free).
        objectives: two or three of "cost", "power" (provisioned kW), "throughput".
        config: solver settings (resolution).
        progress: a tqdm bar over designs.

    Returns:
        `ParetoResult`.

    Raises:
        ValueError: unknown or repeated objectives.

    Example:
        >>> res = pareto_front(lambda d: make_cluster(d, 1, 1), ["splitwise-hh", "splitwise-ha"],
        ...                    coarsen(workload("coding", 70.0), 16, 16), Problem("cost"))  # doctest: +SKIP
        >>> res.front[["design", "cost_per_hour", "provisioned_power_kw"]]  # doctest: +SKIP
    """
    import pandas as pd  # imported here, not at the top (see the top's note)
    import dataclasses

    objectives = parse_objectives(",".join(objectives))
    t0 = time.perf_counter()
    rows, per_design, n_evals = [], {}, 0
    throughput = "throughput" in objectives
    base = dataclasses.replace(problem, objective="cost", power_budget_kw=None, cost_budget_per_h=None) \
        if problem.objective == "throughput" else problem
    problems, clusters = {}, {}
    for d in designs:
        clusters[d] = make(d)
        p = base
        if not clusters[d].strategy.token_pool and p.free_caps in ("token", "both"):
            p = dataclasses.replace(p, free_caps="prompt" if p.free_caps == "both" else "none")
        problems[d] = p
    if throughput:
        found = {}
        with progress_bar(progress, total=len(designs), desc="pareto", unit="design") as bar:
            for d in designs:
                t1 = time.perf_counter()
                cells, rates, n = _rate_grid(clusters[d], workload, problems[d], config)
                found[d] = (cells, rates, n)
                per_design[d] = time.perf_counter() - t1
                bar.update(1)
    else:
        found = {}
        for d, (cells, n) in _staircases(clusters, workload, problems, config).items():
            _, info = make_spec(clusters[d], workload, problems[d])
            found[d] = (cells, np.full(len(cells), info.rate), n)
    for d in designs:
        cells, rates, n = found[d]
        n_evals += n
        cost, power = _spend(clusters[d], cells) if len(cells) else (np.empty(0), np.empty(0))
        for i in range(len(cells)):
            rows.append({"design": d, "prompt_machines": int(cells[i, 0]), "token_machines": int(cells[i, 1]),
                         "prompt_cap_frac": float(cells[i, 2]), "token_cap_frac": float(cells[i, 3]),
                         "rate_per_s": float(rates[i]), "cost_per_hour": float(cost[i]),
                         "provisioned_power_kw": float(power[i])})
    cols = ["design", "prompt_machines", "token_machines", "prompt_cap_frac", "token_cap_frac", "rate_per_s",
            "cost_per_hour", "provisioned_power_kw"]
    cand = pd.DataFrame(rows, columns=cols)
    if len(cand):
        mask = non_dominated(cand[[COLUMN[o] for o in objectives]].to_numpy(), [SENSE[o] for o in objectives])
    else:
        mask = np.zeros(0, bool)
    cand["on_front"] = mask
    front = cand[mask].drop(columns="on_front").sort_values(
        [COLUMN[o] for o in objectives], ascending=[SENSE[o] > 0 for o in objectives]).reset_index(drop=True)
    return ParetoResult(objectives, front, cand, n_evals, time.perf_counter() - t0, per_design)


def plot_pareto(res: ParetoResult):
    """Each pair of objectives: every candidate (faint) and the front (joined), by design.

    Returns:
        A `matplotlib.figure.Figure` (not attached to pyplot).
    """
    from matplotlib.figure import Figure

    pairs = [(a, b) for i, a in enumerate(res.objectives) for b in res.objectives[i + 1:]]
    fig = Figure(figsize=(5.5 * len(pairs), 4.5))
    axes = np.atleast_1d(fig.subplots(1, len(pairs)))
    label = {"cost": "cost ($/h)", "power": "provisioned power (kW)", "throughput": "throughput (req/s)"}
    designs = list(dict.fromkeys(res.candidates["design"]))
    colours = {d: f"C{i}" for i, d in enumerate(designs)}
    for ax, (a, b) in zip(axes, pairs):
        for d in designs:
            c = res.candidates[res.candidates["design"] == d]
            ax.scatter(c[COLUMN[a]], c[COLUMN[b]], s=10, alpha=0.25, color=colours[d])
            f = c[c["on_front"]]
            ax.scatter(f[COLUMN[a]], f[COLUMN[b]], s=40, color=colours[d], edgecolors="k", label=d)
        # The 2-D front of this pair (the full front may hold more points in 3-D).
        sub = res.candidates
        m = non_dominated(sub[[COLUMN[a], COLUMN[b]]].to_numpy(), [SENSE[a], SENSE[b]])
        f2 = sub[m].sort_values(COLUMN[a])
        ax.step(f2[COLUMN[a]], f2[COLUMN[b]], where="post", color="k", lw=1)
        ax.set(xlabel=label[a], ylabel=label[b], title=f"Pareto front: {a} vs {b}")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig
