"""Design search: the cheapest, least power-hungry or highest-throughput cluster that
meets every SLO, found by gradient and proved on the integer neighbourhood.

The paper sizes its clusters by brute-force simulation over a grid of prompt and token
machine counts (Splitwise §VI-A, Fig. 12: Splitwise-HH on coding at 70 req/s needs 27
prompt + 3 token machines). Here the pool sizes (and, optionally, the power caps) are
relaxed to continuous variables and optimised by gradient through `cluster.evaluate`:

1. *Start*: one vectorised evaluation of a coarse log-spaced grid (64 points) picks a
   starting point (the best feasible one, else the least violating).
2. *Gradient*: Adam (optax) on a smooth augmented Lagrangian in log-space of the
   variables. Constraints, all written g >= 0 in log units: the nine SLO margins
   log(limit / slowdown) of Table VI, -log(memory pressure), -log(pool load) for each
   pool (stability), and log(budget / spend) for throughput problems. The
   Powell-Hestenes-Rockafellar term (1 / 2 rho) [s(lam - rho g)^2 - lam^2] uses a
   softplus s in place of max(0, .) so the Lagrangian is smooth; multipliers follow
   lam <- s(lam - rho g) between rounds and rho grows while violations persist.
3. *Repair*: round, then evaluate the integer box +-`radius` around the rounded point
   (and +-`cap_radius` cap steps when caps are free) in one vectorised call; keep the
   best feasible cell, re-centring while the best lies on the box's edge. Throughput
   problems bisect each candidate's largest feasible rate, all candidates at once.
4. *Verify* (optional): `grid_search` evaluates the whole integer box (vectorised,
   in chunks). Cells that provably cannot beat a verified feasible incumbent are
   skipped: cost and provisioned power are known linear functions of the pool sizes,
   and a cell whose rate cannot reach the incumbent's fails at the incumbent's rate.
   The skip is exact; `prune=False` evaluates every cell anyway.

Two compiled functions serve everything (one gradient step, one batch of 64
evaluations), shared across objectives, budgets, SLOs and designs of the same kind:
static names are stripped from the pytrees so Splitwise-AA, -HH, -HA and -HHcap reuse
one compilation.

Example:
    >>> from splitwise_jax.designs import make_cluster
    >>> from splitwise_jax.workload import workload, coarsen
    >>> wl = coarsen(workload("coding", 70.0), 16, 16)
    >>> res = optimize(make_cluster("splitwise-hh", 1, 1), wl, Problem("cost"))  # doctest: +SKIP
    >>> res.prompt_machines, res.token_machines  # doctest: +SKIP

References:
    Patel et al., Splitwise, ISCA 2024: §VI-A (Fig. 12, grid search), §VI-C (Figs. 18-19,
    iso-power / iso-cost / iso-throughput designs), Table VI (SLOs).
    Nocedal & Wright, Numerical Optimization, §17.4 (augmented Lagrangian, inequalities).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from splitwise_jax import catalog
from splitwise_jax._smooth import softplus
from splitwise_jax._validate import check_choice, check_int, check_positive
from splitwise_jax.cluster import PAPER_SLO, Cluster, ClusterMetrics, Resolution, evaluate
from splitwise_jax.designs import uniform_names
from splitwise_jax.timing import CalibratedTiming
from splitwise_jax.workload import Workload

OBJECTIVES = ("cost", "power", "throughput")
FREE_CAPS = ("none", "token", "prompt", "both")
SLO_NAMES = tuple(f"{m} P{p}" for m in ("TTFT", "TBT", "E2E") for p in (50, 90, 99))
CONSTRAINT_NAMES = SLO_NAMES + ("KV memory", "prompt-pool load", "token-pool load", "cost budget",
                                "power budget")
# Variables of the relaxed problem, in this order (log pool sizes, caps, log rate).
VARIABLES = ("log_prompt_machines", "log_token_machines", "prompt_cap_frac", "token_cap_frac", "log_rate")
CHUNK = 64  # points per vectorised evaluation: one compiled shape serves every batch
REFERENCE_MACHINES = 40  # the paper's iso-power / iso-cost reference: 40 DGX-H100 (§VI-C)
_FEAS_TOL = 1e-9  # budgets met with equality (40 machines on a 40-machine budget) count
_RATE_BOUNDS = (0.05, 5000.0)  # req/s searched by throughput problems
_TINY = 1e-12


# --------------------------------------------------------------------------------------
# Problem and solver configuration
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Problem:
    """What to optimise and under which constraints.

    Attributes:
        objective: "cost" ($/h), "power" (provisioned kW, the paper's accounting:
            machine power x cap) at `rate_per_s`, or "throughput" (req/s) under budgets.
        rate_per_s: target load of cost/power problems (None: the workload's own rate).
        power_budget_kw: provisioned-power budget of throughput problems (kW).
        cost_budget_per_h: cost budget of throughput problems ($/h). A throughput
            problem without a budget gets the paper's iso-power budget (40 DGX-H100).
        slo: (3, 3) slowdown limits, rows TTFT/TBT/E2E, columns P50/P90/P99 (Table VI).
        free_caps: which pools' power caps are free variables ("none", "token",
            "prompt", "both"); a baseline's machines are its prompt pool.
        cap_step: granularity of free caps (fraction of TDP) for the integer repair.
        max_machines: largest pool size searched (per pool); throughput problems are
            further bounded by their budget.
        horizon_s: arrival window of `evaluate` (s).
    """

    objective: str = "cost"
    rate_per_s: float | None = None
    power_budget_kw: float | None = None
    cost_budget_per_h: float | None = None
    slo: tuple = PAPER_SLO
    free_caps: str = "none"
    cap_step: float = 0.05
    max_machines: int = 128
    horizon_s: float = 120.0

    def __post_init__(self):
        check_choice("objective", self.objective, OBJECTIVES)
        check_choice("free_caps", self.free_caps, FREE_CAPS)
        check_int("max_machines", self.max_machines, 1)
        check_positive("cap_step", self.cap_step)
        check_positive("horizon_s", self.horizon_s)
        slo = np.asarray(self.slo, dtype=float)
        if slo.shape != (3, 3) or not np.all(np.isfinite(slo)) or np.any(slo <= 0):
            raise ValueError(f"slo must be 3x3 positive slowdown limits (rows TTFT/TBT/E2E, columns "
                             f"P50/P90/P99), got {self.slo!r}")
        object.__setattr__(self, "slo", tuple(tuple(float(v) for v in row) for row in slo))
        budgets = (self.power_budget_kw, self.cost_budget_per_h)
        if self.objective == "throughput":
            if self.rate_per_s is not None:
                raise ValueError("rate_per_s is the answer of a throughput problem; give power_budget_kw "
                                 "or cost_budget_per_h instead")
            if all(b is None for b in budgets):
                object.__setattr__(self, "power_budget_kw", reference_budget()[0])
            for name, b in (("power_budget_kw", self.power_budget_kw), ("cost_budget_per_h", self.cost_budget_per_h)):
                if b is not None:
                    check_positive(name, b)
        else:
            if any(b is not None for b in budgets):
                raise ValueError(f"power_budget_kw / cost_budget_per_h apply to objective 'throughput' only, "
                                 f"not {self.objective!r} (which is solved at rate_per_s)")
            if self.rate_per_s is not None:
                check_positive("rate_per_s", self.rate_per_s, unit="req/s")


@dataclasses.dataclass(frozen=True)
class SolverConfig:
    """Numerical settings of `optimize` and `grid_search`.

    Attributes:
        rounds: augmented-Lagrangian rounds (multiplier updates).
        steps_per_round: Adam steps per round.
        learning_rate: first round's step size in log units (a 0.08 step changes a pool
            by ~8%); it shrinks by `lr_decay` each round.
        rho0, rho_growth, rho_max: penalty weight, its growth while violations persist.
        temperature: softplus temperature of the smooth max(0, .) in the Lagrangian
            (multiplier units); smaller follows the kink closer, larger is smoother.
        radius: half-width of the integer repair box (machines).
        cap_radius: half-width of the cap repair box (cap steps).
        rate_tol: resolution of throughput problems' rate bisection (log units: 5e-4 = 0.05%).
        resolution: `evaluate`'s numerical resolution.
    """

    rounds: int = 5
    steps_per_round: int = 30
    learning_rate: float = 0.08
    lr_decay: float = 0.6
    rho0: float = 10.0
    rho_growth: float = 4.0
    rho_max: float = 1e3
    temperature: float = 0.01
    radius: int = 3
    cap_radius: int = 2
    rate_tol: float = 5e-4
    resolution: Resolution = Resolution()

    def __post_init__(self):
        for name in ("rounds", "steps_per_round"):
            check_int(name, getattr(self, name), 1)
        for name in ("radius", "cap_radius"):
            check_int(name, getattr(self, name), 0)
        for name in ("learning_rate", "lr_decay", "rho0", "rho_growth", "rho_max", "temperature", "rate_tol"):
            check_positive(name, getattr(self, name))


def reference_budget(machine: str = "dgx-h100", count: int = REFERENCE_MACHINES) -> tuple[float, float]:
    """(provisioned kW, $/h) of `count` machines: the paper's iso-power and iso-cost
    budgets are those of 40 DGX-H100 (§VI-C: 40 DGX-H100 ~ 70 DGX-A100 in power)."""
    m = catalog.get_machine(machine)
    return count * float(m.provisioned_power_w) / 1e3, count * float(m.cost_per_hour)


# --------------------------------------------------------------------------------------
# The traced problem: variables -> (metrics, constraints, objective)
# --------------------------------------------------------------------------------------

@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Spec:
    """Everything the compiled functions need, as traced leaves (no recompiles across
    objectives, budgets, SLOs, caps or designs of the same kind)."""

    cluster: Cluster
    workload: Workload
    slo: jax.Array          # (3, 3)
    horizon_s: jax.Array
    free: jax.Array         # (5,) 1 where the variable is optimised
    u_lo: jax.Array         # (5,) bounds of the variables
    u_hi: jax.Array
    cap_lo: jax.Array       # (2,) lowest cap (prompt, token), fraction of TDP
    cap_fixed: jax.Array    # (2,) caps used when not free
    rate_fixed: jax.Array   # load of cost/power problems
    w_obj: jax.Array        # (3,) weights of log cost, log power, -log rate
    budgets: jax.Array      # (2,) cost $/h, provisioned power kW (inf: none)
    con_mask: jax.Array     # (14,) constraints in force


def _caps_of(timing) -> float:
    return float(np.asarray(timing.cap_frac))


def _cap_floor(timing) -> float:
    gpu = timing.machine.gpu
    return float(gpu.min_cap_w / gpu.tdp_w)


def _free_flags(cluster: Cluster, free_caps: str) -> tuple[bool, bool]:
    """(prompt cap free, token cap free) for this cluster, or ValueError."""
    want_p = free_caps in ("prompt", "both")
    want_t = free_caps in ("token", "both")
    if want_t and cluster.kind == "baseline":
        raise ValueError("free_caps 'token' needs a Splitwise design (a baseline has one pool: use 'prompt')")
    for want, t in ((want_p, cluster.prompt), (want_t, cluster.token)):
        if want and not isinstance(t, CalibratedTiming):
            raise ValueError("free_caps needs phase_model 'calibrated' (the SplitwiseSim table knows "
                             "fixed caps only)")
    return want_p, want_t


def _pool_bounds(cluster: Cluster, problem: Problem, free_p: bool, free_t: bool) -> tuple[int, int]:
    """Largest prompt and token pools searched (budgets bound throughput problems)."""
    hi_p = problem.max_machines
    hi_t = problem.max_machines if cluster.kind == "splitwise" else 0
    if problem.objective == "throughput":
        lo_t = 1 if cluster.kind == "splitwise" else 0
        caps = tuple(_cap_floor(t) if free else _caps_of(t)
                     for t, free in ((cluster.prompt, free_p), (cluster.token, free_t)))
        units = ((problem.cost_budget_per_h, _unit_cost(cluster)), (problem.power_budget_kw, _unit_power(cluster, caps)))
        for budget, (up, ut) in units:
            if budget is None:
                continue
            hi_p = min(hi_p, int(math.floor((budget - lo_t * ut) / up + 1e-9)))
            if cluster.kind == "splitwise":
                hi_t = min(hi_t, int(math.floor((budget - up) / ut + 1e-9)))
        if hi_p < 1 or (cluster.kind == "splitwise" and hi_t < 1):
            raise ValueError(f"the budget cannot buy one machine per pool of {cluster.name!r}")
    return hi_p, hi_t


def _unit_cost(cluster: Cluster):
    """$/h per machine of each pool."""
    return float(cluster.prompt.machine.cost_per_hour), float(cluster.token.machine.cost_per_hour)


def _unit_power(cluster: Cluster, caps):
    """Provisioned kW per machine of each pool at the given caps."""
    return (float(cluster.prompt.machine.provisioned_power_w) * caps[0] / 1e3,
            float(cluster.token.machine.provisioned_power_w) * caps[1] / 1e3)


def _make_spec(cluster: Cluster, workload: Workload, problem: Problem) -> tuple[_Spec, dict]:
    free_p, free_t = _free_flags(cluster, problem.free_caps)
    hi_p, hi_t = _pool_bounds(cluster, problem, free_p, free_t)
    splitwise = cluster.kind == "splitwise"
    rate = float(np.asarray(workload.rate_per_s)) if problem.rate_per_s is None else float(problem.rate_per_s)
    throughput = problem.objective == "throughput"
    free = np.array([1.0, 1.0 if splitwise else 0.0, float(free_p), float(free_t), float(throughput)])
    # Caps are optimised as they are, projected onto [floor, 1] (a sigmoid would starve
    # the gradient at the usual start, cap = 1); pools and rate in log space.
    u_lo = np.array([0.0, 0.0, _cap_floor(cluster.prompt), _cap_floor(cluster.token), math.log(_RATE_BOUNDS[0])])
    u_hi = np.array([math.log(hi_p), math.log(max(hi_t, 1)), 1.0, 1.0, math.log(_RATE_BOUNDS[1])])
    budgets = np.array([problem.cost_budget_per_h or np.inf, problem.power_budget_kw or np.inf])
    mask = np.ones(len(CONSTRAINT_NAMES))
    mask[11] = float(splitwise)
    mask[12:] = np.isfinite(budgets)
    w = {"cost": [1.0, 0.0, 0.0], "power": [0.0, 1.0, 0.0], "throughput": [0.0, 0.0, 1.0]}[problem.objective]
    # numpy leaves: jit takes them as they are (jnp.asarray would compile a small
    # conversion program per array on this jax version).
    spec = _Spec(
        cluster=uniform_names(cluster), workload=uniform_names(workload), slo=np.asarray(problem.slo, float),
        horizon_s=np.float64(problem.horizon_s), free=free, u_lo=u_lo, u_hi=u_hi,
        cap_lo=np.array([_cap_floor(cluster.prompt), _cap_floor(cluster.token)]),
        cap_fixed=np.array([_caps_of(cluster.prompt), _caps_of(cluster.token)]),
        rate_fixed=np.float64(rate), w_obj=np.asarray(w, float), budgets=budgets, con_mask=mask)
    # Host copies of what the Python side reads: indexing the device arrays eagerly would
    # compile a small XLA program per operation.
    info = dict(hi_p=hi_p, hi_t=hi_t, free_p=free_p, free_t=free_t, rate=rate, splitwise=splitwise,
                cap_step=problem.cap_step, cap_lo=(_cap_floor(cluster.prompt), _cap_floor(cluster.token)),
                cap_fixed=(_caps_of(cluster.prompt), _caps_of(cluster.token)), mask=mask, free=free)
    return spec, info


def _with_cap(timing, cap):
    if isinstance(timing, CalibratedTiming):
        return dataclasses.replace(timing, cap_frac=cap)
    return timing  # table timing: caps are fixed (free caps were refused earlier)


def _physical(spec: _Spec, u):
    """Variables -> (n_prompt, n_token, prompt cap, token cap, rate)."""
    f = spec.free
    caps = f[2:4] * u[2:4] + (1.0 - f[2:4]) * spec.cap_fixed
    rate = f[4] * jnp.exp(u[4]) + (1.0 - f[4]) * spec.rate_fixed
    n_t = jnp.exp(u[1]) if spec.cluster.kind == "splitwise" else jnp.asarray(0.0)
    return jnp.stack([jnp.exp(u[0]), n_t, caps[0], caps[1], rate])


def _assess(spec: _Spec, phys, resolution: Resolution):
    """One configuration: (metrics, constraints g (14,) with g >= 0 feasible, objective)."""
    c = spec.cluster
    cluster = c.replace(n_prompt=phys[0], n_token=phys[1] if c.kind == "splitwise" else 0.0,
                        prompt=_with_cap(c.prompt, phys[2]), token=_with_cap(c.token, phys[3]))
    m = evaluate(cluster, spec.workload.with_rate(phys[4]), horizon_s=spec.horizon_s, slo=spec.slo,
                 resolution=resolution)
    g = jnp.concatenate([
        m.slo_margin.reshape(-1),
        -jnp.log(jnp.maximum(m.memory_pressure, _TINY))[None],
        -jnp.log(jnp.maximum(m.rho_prompt_pool, _TINY))[None],
        -jnp.log(jnp.maximum(m.rho_token_pool, _TINY))[None],
        # log(B) - log(spend), not log(B / spend): with B = inf (no budget) the quotient's
        # gradient is inf * 0 = NaN even where the mask discards the value.
        (jnp.log(spec.budgets[0]) - jnp.log(m.cost_per_hour))[None],
        (jnp.log(spec.budgets[1]) - jnp.log(m.provisioned_power_kw))[None],
    ])
    g = jnp.where(spec.con_mask > 0, g, 1.0)  # constraints not in force read as met (inf budgets too)
    f = (spec.w_obj[0] * jnp.log(m.cost_per_hour) + spec.w_obj[1] * jnp.log(m.provisioned_power_kw)
         - spec.w_obj[2] * jnp.log(phys[4]))
    return m, g, f


_ADAM = optax.scale_by_adam(b1=0.8, b2=0.9)


@partial(jax.jit, static_argnames=("steps", "resolution"))
def _al_round(u, opt_state, lam, rho, lr, temperature, spec: _Spec, steps: int, resolution: Resolution):
    """`steps` Adam steps on the smooth augmented Lagrangian at fixed multipliers (the
    only gradient compile; a scan, so one dispatch per round)."""

    def lagrangian(u):
        m, g, f = _assess(spec, _physical(spec, u), resolution)
        s = softplus(lam - rho * g, temperature)
        penalty = jnp.sum(spec.con_mask * (s * s - lam * lam)) / (2.0 * rho)
        return f + penalty, (g, f)

    def step(carry, _):
        u, opt_state = carry
        (_, (g, f)), grad = jax.value_and_grad(lagrangian, has_aux=True)(u)
        grad = jnp.where(spec.free > 0, grad, 0.0)
        updates, opt_state = _ADAM.update(grad, opt_state, u)
        u_new = jnp.clip(u - lr * updates, spec.u_lo, spec.u_hi)
        return (jnp.where(spec.free > 0, u_new, u), opt_state), (u, g, f)

    (u, opt_state), (us, gs, fs) = jax.lax.scan(step, (u, opt_state), None, length=steps)
    return u, opt_state, us, gs, fs


@partial(jax.jit, static_argnames=("resolution",))
def _assess_batch(phys, spec: _Spec, resolution: Resolution):
    """A batch of configurations (rows of phys) in one compiled call.

    `lax.map` rather than `vmap`: the model's inner loops (fixed points, bisections)
    batch poorly, and a map traces and compiles in half the time and runs as fast on CPU."""
    return jax.lax.map(lambda p: _assess(spec, p, resolution), phys)


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------

class Candidate(NamedTuple):
    """One integer configuration and its evaluation (host numpy values)."""

    prompt_machines: int
    token_machines: int        # 0 for a baseline
    prompt_cap_frac: float
    token_cap_frac: float
    rate_per_s: float
    feasible: bool
    objective: float           # $/h, provisioned kW or req/s
    constraints: np.ndarray    # (14,) g, >= 0 met
    cost_per_hour: float
    provisioned_power_kw: float
    metrics: ClusterMetrics | None = None  # numpy scalars, on the workload searched

    def as_row(self) -> np.ndarray:
        """(n_p, n_t, cap_p, cap_t, rate): the physical variables."""
        return np.array([self.prompt_machines, self.token_machines, self.prompt_cap_frac, self.token_cap_frac,
                         self.rate_per_s], float)


@dataclasses.dataclass(frozen=True)
class GridResult:
    """Outcome of `grid_search` over the integer box."""

    best: Candidate | None
    cells_in_box: int
    cells_evaluated: int
    evaluations: int
    wall_s: float


@dataclasses.dataclass(frozen=True)
class OptimizeResult:
    """Outcome of `optimize`.

    Attributes:
        design, objective: what was solved.
        best: the integer answer (None if nothing feasible was found).
        metrics: `ClusterMetrics` of the answer (on the workload given to optimize).
        continuous: the relaxed optimum (pools, caps, rate) before rounding, and the
            constraints it still violates (`violated`: name -> g < 0, log units).
        multipliers: final Lagrange multipliers by constraint name (> 0: active at the
            continuous optimum).
        binding: constraints that stop a cheaper (or faster) neighbour: for each pool,
            the constraints the configuration with one machine fewer (rate: 1% more) violates.
        history: objective (its own units) and worst constraint violation (log units)
            per gradient step.
        evaluations: configurations evaluated (gradient steps count one each).
        timings_s: wall time of each phase ("start", "gradient", "repair"), the first
            call of each compiled function included.
        bounds: largest pools searched.
    """

    design: str
    objective: str
    best: Candidate | None
    metrics: ClusterMetrics | None
    continuous: dict
    multipliers: dict
    binding: dict
    history: dict
    evaluations: int
    timings_s: dict
    bounds: tuple
    problem: Problem

    @property
    def feasible(self) -> bool:
        return self.best is not None and self.best.feasible

    def slo_headroom(self) -> dict:
        """Per SLO, limit / slowdown - 1 (> 0: met with that relative headroom)."""
        if self.best is None:
            return {}
        return {n: float(np.expm1(self.best.constraints[i])) for i, n in enumerate(SLO_NAMES)}


# --------------------------------------------------------------------------------------
# Evaluation of integer candidates
# --------------------------------------------------------------------------------------

def _progress(progress, **kw):
    from tqdm.auto import tqdm

    return tqdm(disable=not progress, leave=False, dynamic_ncols=True, **kw)


def _evaluate_points(spec: _Spec, phys: np.ndarray, resolution: Resolution, progress=False, desc="evaluate",
                     keep_metrics=False):
    """Evaluate rows of phys (N, 5) in chunks of CHUNK (one compiled shape).

    Returns (g (N, 14), cost (N,), provisioned power (N,)), plus the list of per-row
    `ClusterMetrics` (numpy) when keep_metrics."""
    n = len(phys)
    g_all = np.empty((n, len(CONSTRAINT_NAMES)))
    cost = np.empty(n)
    power = np.empty(n)
    rows = []
    with _progress(progress and n > CHUNK, total=n, desc=desc, unit="cfg") as bar:
        for start in range(0, n, CHUNK):
            block = phys[start:start + CHUNK]
            pad = np.concatenate([block, np.repeat(block[-1:], CHUNK - len(block), axis=0)])
            m, g, _ = _assess_batch(pad, spec, resolution)
            k = len(block)
            g_all[start:start + k] = np.asarray(g)[:k]
            cost[start:start + k] = np.asarray(m.cost_per_hour)[:k]
            power[start:start + k] = np.asarray(m.provisioned_power_kw)[:k]
            if keep_metrics:
                m_np = jax.tree_util.tree_map(np.asarray, m)
                rows.extend(jax.tree_util.tree_map(lambda x, i=i: x[i], m_np) for i in range(k))
            bar.update(k)
    return (g_all, cost, power, rows) if keep_metrics else (g_all, cost, power)


def _is_feasible(g: np.ndarray) -> np.ndarray:
    return np.all(g >= -_FEAS_TOL, axis=-1)


def _candidates(phys, g, cost, power, objective, metrics=None) -> list[Candidate]:
    out = []
    feas = _is_feasible(g)
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


def _best(cands: list[Candidate], objective: str) -> Candidate | None:
    feas = [c for c in cands if c.feasible]
    return min(feas, key=lambda c: _rank_key(c, objective)) if feas else None


def _max_rates(spec: _Spec, cells: np.ndarray, lo: float, hi: float, rate_tol: float, resolution: Resolution,
               progress=False, desc="rate"):
    """Largest feasible rate of each cell (rows: n_p, n_t, cap_p, cap_t) by vectorised
    bisection in log rate on [lo, hi], hi widened (x4) while some cell still passes there.

    Returns (rates, g at that rate, cost, power, evaluations); rate NaN where the cell
    fails at lo. Feasibility is taken as monotone in the rate (more load never shortens
    a queue), as in the paper's own search for the highest load meeting the SLOs."""
    n = len(cells)
    at = lambda idx, log_r: np.concatenate([cells[idx], np.exp(log_r)[:, None]], axis=1)
    everyone = np.arange(n)
    g_lo, cost, power = _evaluate_points(spec, at(everyone, np.full(n, math.log(lo))), resolution, progress, desc)
    n_evals = n
    ok = _is_feasible(g_lo)
    a = np.full(n, math.log(lo))
    b = np.full(n, math.log(min(hi, _RATE_BOUNDS[1])))
    g_best = g_lo.copy()
    top = math.log(_RATE_BOUNDS[1])
    idx = np.flatnonzero(ok)
    while len(idx):
        g_hi, _, _ = _evaluate_points(spec, at(idx, b[idx]), resolution)
        n_evals += len(idx)
        up = _is_feasible(g_hi)
        a[idx[up]] = b[idx[up]]
        g_best[idx[up]] = g_hi[up]
        idx = idx[up & (b[idx] < top)]
        b[idx] = np.minimum(b[idx] + math.log(4.0), top)
    idx = np.flatnonzero(ok)
    if len(idx):
        iters = max(1, math.ceil(math.log2(max(np.max(b[idx] - a[idx]), 1e-12) / rate_tol)))
    else:
        iters = 0
    with _progress(progress and iters > 0, total=iters, desc=f"{desc}: rate bisection", unit="it") as bar:
        for _ in range(iters):
            mid = 0.5 * (a[idx] + b[idx])
            g_mid, _, _ = _evaluate_points(spec, at(idx, mid), resolution)
            n_evals += len(idx)
            up = _is_feasible(g_mid)
            a[idx[up]] = mid[up]
            g_best[idx[up]] = g_mid[up]
            b[idx[~up]] = mid[~up]
            bar.update(1)
    rates = np.where(ok, np.exp(a), np.nan)
    return rates, g_best, cost, power, n_evals


def _cap_grid(lo: float, step: float) -> np.ndarray:
    """Caps searched by the integer repair and the grid: 1, 1 - step, ... down to the floor."""
    grid = 1.0 - step * np.arange(int(math.floor((1.0 - lo) / step + 1e-9)) + 1)
    return np.unique(np.round(np.append(grid, lo), 12))


def _box(p_range, t_range, cp_values, ct_values) -> np.ndarray:
    """Integer cells (n_p, n_t, cap_p, cap_t) of a box."""
    return np.array(list(itertools.product(p_range, t_range, cp_values, ct_values)), dtype=float).reshape(-1, 4)


def _spend(cluster: Cluster, cells: np.ndarray):
    """Exact cost ($/h) and provisioned power (kW) of cells, as `evaluate` accounts them."""
    cp, ct = _unit_cost(cluster)
    pp = float(cluster.prompt.machine.provisioned_power_w) / 1e3
    pt = float(cluster.token.machine.provisioned_power_w) / 1e3
    cost = cells[:, 0] * cp + cells[:, 1] * ct
    power = cells[:, 0] * pp * cells[:, 2] + cells[:, 1] * pt * cells[:, 3]
    return cost, power


def _within_budget(cluster: Cluster, problem: Problem, cells: np.ndarray) -> np.ndarray:
    cost, power = _spend(cluster, cells)
    ok = np.ones(len(cells), bool)
    if problem.cost_budget_per_h is not None:
        ok &= cost <= problem.cost_budget_per_h * (1 + _FEAS_TOL)
    if problem.power_budget_kw is not None:
        ok &= power <= problem.power_budget_kw * (1 + _FEAS_TOL)
    return ok


def _cap_values(info, spec, free, which):
    if not free:
        return np.array([info["cap_fixed"][which]])
    return _cap_grid(info["cap_lo"][which], info["cap_step"])


def _score_cells(cluster, spec, info, problem, cells, config, *, rate_lo=None, rate_hi=None, progress=False,
                 desc="evaluate"):
    """Evaluate integer cells for the problem: fixed-rate problems at the target rate,
    throughput problems by rate bisection. Returns candidates."""
    if len(cells) == 0:
        return [], 0
    if problem.objective != "throughput":
        phys = np.concatenate([cells, np.full((len(cells), 1), info["rate"])], axis=1)
        g, cost, power, rows = _evaluate_points(spec, phys, config.resolution, progress, desc, keep_metrics=True)
        return _candidates(phys, g, cost, power, problem.objective, rows), len(cells)
    rates, g, cost, power, n_evals = _max_rates(spec, cells, rate_lo, rate_hi, config.rate_tol,
                                                config.resolution, progress, desc)
    ok = np.isfinite(rates)
    phys = np.concatenate([cells, np.where(ok, rates, rate_lo)[:, None]], axis=1)
    cands = _candidates(phys, g, cost, power, "throughput")
    cands = [c._replace(feasible=bool(ok[i]) and c.feasible) for i, c in enumerate(cands)]
    return cands, n_evals


# --------------------------------------------------------------------------------------
# The optimiser
# --------------------------------------------------------------------------------------

def _frontier(cluster: Cluster, problem: Problem, info: dict, caps) -> np.ndarray:
    """Pool sizes that spend the whole budget: n_p from 1 to its bound, n_t the rest."""
    if not info["splitwise"]:
        return np.array([[float(info["hi_p"]), 0.0]])
    n_p = np.unique(np.round(np.linspace(1, info["hi_p"], CHUNK), 6))
    n_t = np.full_like(n_p, float(info["hi_t"]))
    for budget, (up, ut) in ((problem.cost_budget_per_h, _unit_cost(cluster)),
                             (problem.power_budget_kw, _unit_power(cluster, caps))):
        if budget is not None:
            n_t = np.minimum(n_t, (budget - n_p * up) / ut)
    keep = n_t >= 1.0
    return np.stack([n_p[keep], n_t[keep]], axis=1)


def _start_points(spec: _Spec, info: dict, problem: Problem, cluster: Cluster, config: SolverConfig):
    """A coarse vectorised sweep to start from; returns u0 (5,) and the evaluations spent.

    Cost/power: an 8 x 8 log-spaced grid of pool sizes at the target load (one batch).
    Throughput: CHUNK splits of the budget between the pools, each with its largest
    feasible rate by a coarse vectorised bisection (~3% resolution)."""
    hi_p, hi_t = info["hi_p"], info["hi_t"]
    cp, ct = info["cap_fixed"]
    if problem.objective != "throughput":
        if info["splitwise"]:
            ps, ts = np.geomspace(1, hi_p, 8), np.geomspace(1, hi_t, 8)
            pts = np.array([(p, t) for p in ps for t in ts])
        else:
            pts = np.stack([np.geomspace(1, hi_p, CHUNK), np.zeros(CHUNK)], axis=1)
        phys = np.concatenate([pts, np.tile([cp, ct, info["rate"]], (len(pts), 1))], axis=1)
        g, cost, power = _evaluate_points(spec, phys, config.resolution)
        n_evals = len(phys)
        feas = _is_feasible(g)
        obj = cost if problem.objective == "cost" else power
        if feas.any():
            i = int(np.argmin(np.where(feas, obj, np.inf)))
        else:
            i = int(np.argmax(np.min(np.where(info["mask"] > 0, g, np.inf), axis=1)))
        p = phys[i]
    else:
        # Just inside the budget, so the budget constraint starts satisfied.
        pts = _frontier(cluster, problem, info, (cp, ct)) * (1.0 - 1e-6)
        cells = np.concatenate([pts, np.tile([cp, ct], (len(pts), 1))], axis=1)
        rates, _, _, _, n_evals = _max_rates(spec, cells, _RATE_BOUNDS[0], 64.0, 0.03, config.resolution)
        if np.isfinite(rates).any():
            i = int(np.nanargmax(rates))
            p = np.append(cells[i], rates[i])
        else:
            p = np.append(cells[len(cells) // 2], _RATE_BOUNDS[0])
    u0 = np.array([math.log(max(p[0], 1.0)), math.log(max(p[1], 1.0)), cp, ct, math.log(p[4])])
    return u0, n_evals


def _softplus_np(x, temperature):
    """Host twin of `_smooth.softplus` (multiplier updates run between compiled rounds)."""
    return temperature * np.logaddexp(0.0, np.asarray(x) / temperature)


def optimize(cluster: Cluster, workload: Workload, problem: Problem = Problem(),
             config: SolverConfig = SolverConfig(), *, progress: bool = False) -> OptimizeResult:
    """Optimise pool sizes (and free caps) of a design by gradient, then repair to integers.

    Args:
        cluster: the design (e.g. `make_cluster("splitwise-hh", 1, 1)`); its pool sizes
            are ignored, its caps are used unless freed by `problem.free_caps`.
        workload: request classes and arrival process (coarsen it for speed; its rate
            is the target of cost/power problems unless `problem.rate_per_s` is set).
        problem: objective and constraints.
        config: solver settings.
        progress: show tqdm progress bars (stderr).

    Returns:
        OptimizeResult; `best` is None when no feasible integer configuration lies in the
        repaired neighbourhood (the continuous answer and multipliers then say why).

    Example:
        >>> res = optimize(make_cluster("splitwise-hh", 1, 1), coarsen(workload("coding"), 16, 16))  # doctest: +SKIP

    References:
        Splitwise §VI-A (Fig. 12), §VI-C (Figs. 18-19); Nocedal & Wright §17.4.
    """
    if not isinstance(cluster, Cluster):
        raise ValueError(f"cluster must be a Cluster (see designs.make_cluster), got {type(cluster).__name__}")
    if not isinstance(workload, Workload):
        raise ValueError(f"workload must be a Workload (see workload.workload), got {type(workload).__name__}")
    spec, info = _make_spec(cluster, workload, problem)
    timings = {}

    t0 = time.perf_counter()
    u0, n_evals = _start_points(spec, info, problem, cluster, config)
    timings["start"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    # Host (numpy) state between rounds; the compiled round takes it as is.
    u = np.asarray(u0, float)
    opt_state = optax.ScaleByAdamState(count=np.zeros((), np.int32), mu=np.zeros_like(u), nu=np.zeros_like(u))
    lam = np.zeros(len(CONSTRAINT_NAMES))
    rho = config.rho0
    mask = info["mask"]
    hist_obj, hist_viol = [], []
    prev_viol = np.inf
    total = config.rounds * config.steps_per_round
    with _progress(progress, total=total, desc=f"{cluster.name}: gradient", unit="step") as bar:
        for r in range(config.rounds):
            lr = config.learning_rate * config.lr_decay**r
            u, opt_state, _, gs, fs = _al_round(u, opt_state, lam, np.float64(rho), np.float64(lr),
                                                np.float64(config.temperature), spec, config.steps_per_round,
                                                config.resolution)
            gs = np.asarray(gs)
            viols = np.max(np.where(mask > 0, np.maximum(-gs, 0.0), 0.0), axis=1)
            # f is log cost, log power or -log rate: back to the objective's own units.
            fs = np.exp(-np.asarray(fs) if problem.objective == "throughput" else np.asarray(fs))
            hist_obj.extend(fs.tolist())
            hist_viol.extend(viols.tolist())
            bar.update(config.steps_per_round)
            bar.set_postfix(obj=f"{fs[-1]:.4g}", viol=f"{viols[-1]:.3f}")
            # Multiplier update at the round's last point (PHR, smoothed), then the penalty.
            lam = mask * _softplus_np(lam - rho * gs[-1], config.temperature)
            viol = float(viols[-1])
            if viol > 0.5 * prev_viol and viol > 1e-3:
                rho = min(rho * config.rho_growth, config.rho_max)
            prev_viol = viol
    n_evals += total
    timings["gradient"] = time.perf_counter() - t0
    u = np.asarray(u)
    f = info["free"]
    phys_c = np.array([math.exp(u[0]), math.exp(u[1]) if info["splitwise"] else 0.0,
                       *(f[2:4] * u[2:4] + (1.0 - f[2:4]) * np.asarray(info["cap_fixed"])),
                       math.exp(u[4]) if f[4] else info["rate"]])
    continuous = dict(prompt_machines=float(phys_c[0]), token_machines=float(phys_c[1]),
                      prompt_cap_frac=float(phys_c[2]), token_cap_frac=float(phys_c[3]), rate_per_s=float(phys_c[4]),
                      violated={n: float(v) for n, v, k in zip(CONSTRAINT_NAMES, gs[-1], mask) if k > 0 and v < 0})

    t0 = time.perf_counter()
    best, n_rep = _repair(cluster, spec, info, problem, config, phys_c, progress)
    n_evals += n_rep
    binding, n_bind = _binding(cluster, spec, info, problem, config, best)
    n_evals += n_bind
    metrics = None if best is None else best.metrics
    if best is not None and metrics is None:  # throughput: the metrics at the rate found
        _, _, _, rows = _evaluate_points(spec, best.as_row()[None], config.resolution, keep_metrics=True)
        metrics = rows[0]
        best = best._replace(metrics=metrics)
    timings["repair"] = time.perf_counter() - t0
    mult = {n: float(v) for n, v, k in zip(CONSTRAINT_NAMES, np.asarray(lam), mask) if k > 0}
    return OptimizeResult(design=cluster.name, objective=problem.objective, best=best, metrics=metrics,
                          continuous=continuous, multipliers=mult, binding=binding,
                          history=dict(objective=hist_obj, violation=hist_viol), evaluations=n_evals,
                          timings_s=timings, bounds=(info["hi_p"], info["hi_t"]), problem=problem)


def _neighbourhood(info, spec, problem, center, config):
    """Integer box around center = (n_p, n_t, cap_p, cap_t) (caps snapped to their grid)."""
    R = config.radius
    p_rng = range(max(1, center[0] - R), min(info["hi_p"], center[0] + R) + 1)
    t_rng = range(max(1, center[1] - R), min(info["hi_t"], center[1] + R) + 1) if info["splitwise"] else [0]
    caps = []
    for which, free in ((0, info["free_p"]), (1, info["free_t"])):
        grid = _cap_values(info, spec, free, which)
        k = int(np.argmin(np.abs(grid - center[2 + which])))
        caps.append(grid[max(0, k - config.cap_radius):k + config.cap_radius + 1])
    return _box(p_rng, t_rng, caps[0], caps[1])


def _repair(cluster, spec, info, problem, config, phys_c, progress):
    """Best feasible integer cell near the continuous answer, re-centred up to 4 times."""
    center = (int(np.clip(round(phys_c[0]), 1, info["hi_p"])),
              int(np.clip(round(phys_c[1]), 1, max(info["hi_t"], 1))) if info["splitwise"] else 0,
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
        cands, n = _score_cells(cluster, spec, info, problem, new, config, rate_lo=0.25 * rate, rate_hi=1.5 * rate)
        n_evals += n
        for cell, cand in zip(new, cands):
            seen[tuple(cell)] = cand
        best = _best(list(seen.values()), problem.objective)
        if best is None:
            break
        R = config.radius
        on_edge = (abs(best.prompt_machines - center[0]) == R and 1 < best.prompt_machines < info["hi_p"]) or (
            info["splitwise"] and abs(best.token_machines - center[1]) == R and 1 < best.token_machines < info["hi_t"])
        for which, free in ((0, info["free_p"]), (1, info["free_t"])):
            grid = _cap_values(info, spec, free, which)
            k_c = int(np.argmin(np.abs(grid - center[2 + which])))
            k_b = int(np.argmin(np.abs(grid - (best.prompt_cap_frac, best.token_cap_frac)[which])))
            on_edge |= free and abs(k_b - k_c) == config.cap_radius and 0 < k_b < len(grid) - 1
        if not on_edge:
            break
        center = (best.prompt_machines, best.token_machines, best.prompt_cap_frac, best.token_cap_frac)
    return best, n_evals


def _binding(cluster, spec, info, problem, config, best):
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
            probes["prompt -1" if info["splitwise"] else "machines -1"] = p
        if info["splitwise"] and best.token_machines > 1:
            p = base.copy()
            p[1] -= 1
            probes["token -1"] = p
        cap_steps = ((2, info["free_p"], "prompt cap"), (3, info["free_t"], "token cap"))
        for col, free, name in cap_steps:
            if free and base[col] - problem.cap_step >= info["cap_lo"][col - 2] - 1e-9:
                p = base.copy()
                p[col] -= problem.cap_step
                probes[f"{name} -{problem.cap_step:g}"] = p
    if not probes:
        return {}, 0
    g, _, _ = _evaluate_points(spec, np.array(list(probes.values())), config.resolution)
    out = {}
    for (name, _), gi in zip(probes.items(), g):
        out[name] = [CONSTRAINT_NAMES[j] for j in range(len(gi)) if gi[j] < -_FEAS_TOL]
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
    spec, info = _make_spec(cluster, workload, problem)
    t0 = time.perf_counter()
    cells = _box(range(1, info["hi_p"] + 1),
                   range(1, info["hi_t"] + 1) if info["splitwise"] else [0],
                   _cap_values(info, spec, info["free_p"], 0), _cap_values(info, spec, info["free_t"], 1))
    if problem.objective == "throughput":
        cells = cells[_within_budget(cluster, problem, cells)]
    in_box = len(cells)
    desc = f"{cluster.name}: grid"
    if incumbent is not None and prune and incumbent.feasible:
        if problem.objective == "throughput":
            r = incumbent.rate_per_s
            phys = np.concatenate([cells, np.full((len(cells), 1), r)], axis=1)
            g, _, _ = _evaluate_points(spec, phys, config.resolution, progress, desc + " screen")
            survivors = cells[_is_feasible(g)]
            cands, n = _score_cells(cluster, spec, info, problem, survivors, config, rate_lo=r, rate_hi=1.5 * r,
                                    progress=progress, desc=desc)
            n += len(cells)
            evaluated = len(cells)
        else:
            cost, power = _spend(cluster, cells)
            spend = cost if problem.objective == "cost" else power
            keep = spend <= incumbent.objective * (1 + 1e-9)
            cands, n = _score_cells(cluster, spec, info, problem, cells[keep], config, progress=progress, desc=desc)
            evaluated = int(keep.sum())
    else:
        cands, n = _score_cells(cluster, spec, info, problem, cells, config, rate_lo=_RATE_BOUNDS[0], rate_hi=64.0,
                                progress=progress, desc=desc)
        evaluated = len(cells)
    return GridResult(best=_best(cands, problem.objective), cells_in_box=in_box, cells_evaluated=evaluated,
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
    spec, _ = _make_spec(cluster, workload, problem)  # pool bounds do not matter here
    g, cost, power, rows = _evaluate_points(spec, candidate.as_row()[None], config.resolution, keep_metrics=True)
    return _candidates(candidate.as_row()[None], g, cost, power, problem.objective, rows)[0]


def evaluate_plane(cluster: Cluster, workload: Workload, problem: Problem, answer: Candidate, p_max: int,
                   t_max: int, config: SolverConfig = SolverConfig(), *, progress: bool = False):
    """Feasibility and objective over the (prompt, token) plane at the answer's caps and rate
    (the paper's Fig. 12 view). Returns (prompt counts, token counts, feasible (P, T),
    objective (P, T)); a baseline has one token column (0)."""
    spec, info = _make_spec(cluster, workload, problem)  # pool bounds do not matter here
    ps = np.arange(1, p_max + 1)
    ts = np.arange(1, t_max + 1) if info["splitwise"] else np.array([0])
    cells = _box(ps, ts, [answer.prompt_cap_frac], [answer.token_cap_frac])
    phys = np.concatenate([cells, np.full((len(cells), 1), answer.rate_per_s)], axis=1)
    g, cost, power = _evaluate_points(spec, phys, config.resolution, progress, f"{cluster.name}: plane")
    feas = _is_feasible(g).reshape(len(ps), len(ts))
    obj = (power if problem.objective == "power" else cost).reshape(len(ps), len(ts))
    return ps, ts, feas, obj


# The paper's headline ratios (Splitwise §VI-C, Figs. 18-19; shared/paper/splitwise_targets.md).
# HA's 1.18x and -10% are read against Baseline-H100: at equal provisioned power an
# H100+A100 cluster cannot cost less than an all-A100 one (A100: $0.71 per provisioned
# power unit, H100: $0.87), so "10% lower cost" only makes sense against Baseline-H100.
PAPER_HEADLINES = (
    dict(problem="iso-power", design="splitwise-aa", reference="baseline-a100", metric="throughput", paper=2.15,
         text="Fig. 18 iso-power: Splitwise-AA throughput / Baseline-A100"),
    dict(problem="iso-power", design="splitwise-ha", reference="baseline-h100", metric="throughput", paper=1.18,
         text="Fig. 18 iso-power: Splitwise-HA throughput / Baseline-H100"),
    dict(problem="iso-power", design="splitwise-ha", reference="baseline-h100", metric="cost", paper=0.90,
         text="Fig. 18 iso-power: Splitwise-HA cost / Baseline-H100"),
    dict(problem="iso-cost", design="splitwise-aa", reference="baseline-h100", metric="throughput", paper=1.4,
         text="Fig. 18 iso-cost: Splitwise-AA throughput / Baseline-H100"),
    dict(problem="iso-cost", design="splitwise-aa", reference="baseline-h100", metric="power", paper=1.25,
         text="Fig. 18 iso-cost: Splitwise-AA power / Baseline-H100"),
    dict(problem="power", design="splitwise-hhcap", reference="baseline-h100", metric="power", paper=0.75,
         text="Fig. 19 iso-throughput, power-optimised: Splitwise-HHcap power / Baseline-H100"),
    dict(problem="cost", design="splitwise-aa", reference="baseline-h100", metric="cost", paper=0.75,
         text="Fig. 19 iso-throughput, cost-optimised: Splitwise-AA cost / Baseline-H100"),
)
# Fig. 12: Splitwise-HH, coding, 70 req/s, cheapest design meeting every SLO.
PAPER_FIG12 = dict(design="splitwise-hh", workload="coding", rate_per_s=70.0, prompt_machines=27, token_machines=3)


def problem_kind(problem: Problem) -> str:
    """"cost", "power", "iso-power", "iso-cost" or "iso-power+cost" (which headlines apply)."""
    if problem.objective != "throughput":
        return problem.objective
    kinds = [k for k, b in (("power", problem.power_budget_kw), ("cost", problem.cost_budget_per_h)) if b is not None]
    return "iso-" + "+".join(kinds)


def _metric_of(res: OptimizeResult, metric: str) -> float:
    b = res.best
    return {"throughput": b.rate_per_s, "cost": b.cost_per_hour, "power": b.provisioned_power_kw}[metric]


def headline_ratios(results: dict[str, OptimizeResult], problem: Problem) -> list[dict]:
    """Our value of each of the paper's headline ratios that this problem reproduces."""
    out = []
    for h in PAPER_HEADLINES:
        if h["problem"] != problem_kind(problem):
            continue
        a, b = results.get(h["design"]), results.get(h["reference"])
        ours = None
        if a is not None and b is not None and a.feasible and b.feasible:
            ours = _metric_of(a, h["metric"]) / _metric_of(b, h["metric"])
        out.append({**h, "ours": ours})
    return out


def compare_designs(make: callable, designs, workload: Workload, problem: Problem,
                    config: SolverConfig = SolverConfig(), *, progress: bool = False) -> dict[str, OptimizeResult]:
    """Optimise each design on the same problem (the paper's Figs. 18-19 comparison).

    Args:
        make: design name -> Cluster (e.g. `lambda d: make_cluster(d, 1, 1)`).
        designs: design names.
        workload, problem, config: as for `optimize`. A baseline has no token pool, so
            free token caps apply to Splitwise designs only.
    """
    out = {}
    for d in designs:
        cluster = make(d)
        p = problem
        if cluster.kind == "baseline" and problem.free_caps in ("token", "both"):
            p = dataclasses.replace(problem, free_caps="prompt" if problem.free_caps == "both" else "none")
        out[d] = optimize(cluster, workload, p, config, progress=progress)
    return out


# --------------------------------------------------------------------------------------
# Command line (the I/O edge: argparse, printing, files)
# --------------------------------------------------------------------------------------

_UNIT = {"cost": "$/h", "power": "kW provisioned", "throughput": "req/s"}


def _label(design: str) -> str:
    head, _, tail = design.partition("-")
    return f"{head.capitalize()}-{tail.upper() if head == 'splitwise' else tail.upper()}".replace("HHCAP", "HHcap")


def _pools_text(c: Candidate, splitwise: bool) -> str:
    return f"{c.prompt_machines} prompt + {c.token_machines} token" if splitwise else f"{c.prompt_machines} machines"


def _metrics_dict(m: ClusterMetrics | None) -> dict | None:
    if m is None:
        return None
    return {k: np.asarray(v).tolist() for k, v in m._asdict().items()}


def _candidate_dict(c: Candidate | None, splitwise: bool) -> dict | None:
    if c is None:
        return None
    d = {}
    if splitwise:
        d.update(prompt_machines=c.prompt_machines, token_machines=c.token_machines,
                 prompt_cap_frac=c.prompt_cap_frac, token_cap_frac=c.token_cap_frac)
    else:
        d.update(machines=c.prompt_machines, cap_frac=c.prompt_cap_frac)
    d.update(feasible=c.feasible, rate_per_s=c.rate_per_s, objective_value=c.objective, cost_per_hour=c.cost_per_hour,
             provisioned_power_kw=c.provisioned_power_kw,
             slo_margins={n: float(c.constraints[i]) for i, n in enumerate(SLO_NAMES)},
             slo_headroom={n: float(np.expm1(c.constraints[i])) for i, n in enumerate(SLO_NAMES)},
             constraints={n: float(c.constraints[i]) for i, n in enumerate(CONSTRAINT_NAMES)})
    if c.metrics is not None:
        d.update(power_kw=float(c.metrics.power_kw), throughput_rps=float(c.metrics.throughput_rps),
                 memory_pressure=float(c.metrics.memory_pressure), rho_prompt_pool=float(c.metrics.rho_prompt_pool),
                 rho_token_pool=float(c.metrics.rho_token_pool))
    return d


def _result_dict(res: OptimizeResult, splitwise: bool, full: Candidate | None, grid: GridResult | None,
                 opt_wall_s: float) -> dict:
    d = dict(design=res.design, objective=res.objective, feasible=res.feasible)
    d.update(_candidate_dict(res.best, splitwise) or ({"prompt_machines": None, "token_machines": None}
                                                       if splitwise else {"machines": None}))
    d.update(metrics=_metrics_dict(res.metrics), binding=res.binding, multipliers=res.multipliers,
             continuous=res.continuous, evaluations=res.evaluations, timings_s=dict(res.timings_s, total=opt_wall_s),
             bounds=dict(prompt=res.bounds[0], token=res.bounds[1]))
    if full is not None:
        d["full_resolution"] = dict(_candidate_dict(full, splitwise), metrics=_metrics_dict(full.metrics))
    if grid is not None:
        d["verification"] = dict(grid_best=_candidate_dict(grid.best, splitwise),
                                 matches=same_answer(res.best, grid.best, res.objective), grid_s=grid.wall_s,
                                 optimizer_s=opt_wall_s, cells_in_box=grid.cells_in_box,
                                 cells_evaluated=grid.cells_evaluated, evaluations=grid.evaluations)
    return d


def _print_result(res: OptimizeResult, cluster: Cluster, title: str, full: Candidate | None, grid: GridResult | None,
                  opt_wall_s: float, bins_text: str, fig12: bool):
    splitwise = cluster.kind == "splitwise"
    print(title)
    b = res.best
    if b is None:
        c = res.continuous
        print("  no feasible integer configuration found near the continuous optimum "
              f"({c['prompt_machines']:.2f} prompt, {c['token_machines']:.2f} token, {c['rate_per_s']:.2f} req/s)")
        if c["violated"]:
            print("  still violated there: " + ", ".join(f"{n} ({np.expm1(v):+.1%})" for n, v in c["violated"].items()))
        print(f"  pools searched up to {res.bounds[0]} (prompt) and {res.bounds[1]} (token): raise --max-machines "
              "or the budget, or relax --slo")
    else:
        caps = (f"caps {b.prompt_cap_frac:.0%} / {b.token_cap_frac:.0%} of TDP" if splitwise
                else f"cap {b.prompt_cap_frac:.0%} of TDP")
        print(f"  answer: {_pools_text(b, splitwise)} machines, {caps}  ->  feasible: {'yes' if b.feasible else 'NO'}")
        m = b.metrics
        print(f"  load {b.rate_per_s:.2f} req/s   cost ${b.cost_per_hour:,.2f}/h   provisioned {b.provisioned_power_kw:.1f} kW"
              f"   drawn {float(m.power_kw):.1f} kW")
        c = res.continuous
        cont = (f"{c['prompt_machines']:.2f} prompt + {c['token_machines']:.2f} token" if splitwise
                else f"{c['prompt_machines']:.2f} machines")
        extra = f", caps {c['prompt_cap_frac']:.2f}/{c['token_cap_frac']:.2f}" if cluster and res.problem.free_caps != "none" else ""
        rate = f", {c['rate_per_s']:.2f} req/s" if res.objective == "throughput" else ""
        print(f"  continuous optimum: {cont}{extra}{rate}")
        for probe, names in res.binding.items():
            print(f"  binding: {probe:<18} breaks {', '.join(names) if names else 'nothing (ties or bound)'}")
        print(f"  {'SLO':<9} {'limit':>6} {'slowdown':>9} {'headroom':>9}")
        slo = np.asarray(res.problem.slo).reshape(-1)
        sd = np.concatenate([np.ravel(m.slowdown_ttft), np.ravel(m.slowdown_tbt), np.ravel(m.slowdown_e2e)])
        for i, n in enumerate(SLO_NAMES):
            print(f"  {n:<9} {slo[i]:>6.2f} {sd[i]:>9.3f} {np.expm1(b.constraints[i]):>+9.1%}")
        print(f"  KV memory pressure {float(m.memory_pressure):.2f}   prompt-pool load {float(m.rho_prompt_pool):.2f}"
              + (f"   token-pool prompt load {float(m.rho_token_pool):.3f}" if splitwise else ""))
    if full is not None:
        worst = float(np.min(np.expm1(full.constraints[:9])))
        print(f"  full-resolution check (all workload classes): {'meets every constraint' if full.feasible else 'FAILS'}"
              f" (smallest SLO headroom {worst:+.1%})")
    if fig12:
        print(f"  paper (Fig. 12, SplitwiseSim grid search): {PAPER_FIG12['prompt_machines']} prompt + "
              f"{PAPER_FIG12['token_machines']} token machines")
    if grid is not None:
        same = same_answer(res.best, grid.best, res.objective)
        gb = grid.best
        what = "nothing feasible" if gb is None else f"{_pools_text(gb, splitwise)} ({gb.objective:,.4g} {_UNIT[res.objective]})"
        print(f"  grid (exhaustive over {grid.cells_in_box:,} cells, {grid.cells_evaluated:,} evaluated after exact "
              f"pruning): {what} -> {'matches' if same else 'DIFFERS'}; grid {grid.wall_s:.1f} s vs optimizer {opt_wall_s:.1f} s")
    t = res.timings_s
    print(f"  timings: start {t['start']:.2f} s, gradient {t['gradient']:.2f} s, repair {t['repair']:.2f} s "
          f"({res.evaluations} evaluations on {bins_text}; first calls include compilation)")


def _print_compare(results: dict, clusters: dict, problem: Problem, ref: str, title: str):
    print(title)
    r0 = results.get(ref)
    ok0 = r0 is not None and r0.feasible
    hdr = (f"  {'design':<16} {'machines (P+T)':>15} {'caps':>9} {'req/s':>8} {'$/h':>9} {'kW prov':>8} "
           f"{'thr/ref':>8} {'cost/ref':>9} {'power/ref':>10}")
    print(hdr)
    for d, r in results.items():
        sw = clusters[d].kind == "splitwise"
        if not r.feasible:
            why = ", ".join(f"{n} {np.expm1(v):+.0%}" for n, v in r.continuous["violated"].items())
            print(f"  {d:<16} {'infeasible':>15}  (up to {r.bounds[0]} machines per pool; at the continuous optimum: "
                  f"{why or 'no single constraint'})")
            continue
        b = r.best
        pools = f"{b.prompt_machines}+{b.token_machines}" if sw else f"{b.prompt_machines}"
        caps = f"{b.prompt_cap_frac:.2f}/{b.token_cap_frac:.2f}" if sw else f"{b.prompt_cap_frac:.2f}"
        norm = ["-"] * 3
        if ok0:
            norm = [f"{_metric_of(r, k) / _metric_of(r0, k):.2f}x" for k in ("throughput", "cost", "power")]
        print(f"  {d:<16} {pools:>15} {caps:>9} {b.rate_per_s:>8.1f} {b.cost_per_hour:>9,.0f} "
              f"{b.provisioned_power_kw:>8.1f} {norm[0]:>8} {norm[1]:>9} {norm[2]:>10}")
    heads = headline_ratios(results, problem)
    if heads:
        print("  paper's headline ratios for this problem (paper vs ours):")
        for h in heads:
            ours = "n/a" if h["ours"] is None else f"{h['ours']:.2f}x"
            print(f"    {h['text']:<72} paper {h['paper']:.2f}x   ours {ours}")


def _plot(path, res: OptimizeResult, cluster: Cluster, workload: Workload, problem: Problem, config: SolverConfig,
          grid: GridResult | None, progress: bool):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = res.best
    if b is None:
        raise ValueError("--plot needs a feasible answer to centre the plane on")
    splitwise = cluster.kind == "splitwise"
    hi_p, hi_t = res.bounds
    p_max = min(hi_p, max(2 * b.prompt_machines, b.prompt_machines + 8))
    t_max = min(hi_t, max(2 * b.token_machines, b.token_machines + 8)) if splitwise else 0
    ps, ts, feas, obj = evaluate_plane(cluster, workload, problem, b, p_max, t_max, config, progress=progress)
    fig, ax = plt.subplots(figsize=(7, 5))
    what = "provisioned power (kW)" if problem.objective == "power" else "cost ($/h)"
    if splitwise:
        z = np.where(feas, obj, np.nan).T
        ax.imshow(np.where(feas, np.nan, 1.0).T, origin="lower", cmap="Greys", vmin=0, vmax=3, aspect="auto",
                  extent=(0.5, p_max + 0.5, 0.5, t_max + 0.5))
        im = ax.imshow(z, origin="lower", cmap="viridis", aspect="auto", extent=(0.5, p_max + 0.5, 0.5, t_max + 0.5))
        fig.colorbar(im, ax=ax, label=f"{what}, where every constraint holds")
        ax.plot(b.prompt_machines, b.token_machines, marker="*", ms=16, color="red", ls="", label="gradient answer")
        if grid is not None and grid.best is not None:
            ax.plot(grid.best.prompt_machines, grid.best.token_machines, marker="o", ms=12, mfc="none", mec="white",
                    ls="", label="grid optimum")
        ax.set_xlabel("prompt machines")
        ax.set_ylabel("token machines")
    else:
        z = np.where(feas[:, 0], obj[:, 0], np.nan)
        ax.plot(ps, obj[:, 0], color="0.7", label="infeasible")
        ax.plot(ps, z, "o-", label="feasible")
        ax.plot(b.prompt_machines, b.objective if problem.objective != "throughput" else b.cost_per_hour, "r*", ms=16,
                label="gradient answer")
        ax.set_xlabel("machines")
        ax.set_ylabel(what)
    ax.set_title(f"{_label(res.design)}: {problem.objective}-optimal at {b.rate_per_s:.1f} req/s "
                 f"(grey: an SLO, memory or stability limit fails)", fontsize=9)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_compare(path, results: dict, ref: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    r0 = results.get(ref)
    if r0 is None or not r0.feasible:
        raise ValueError(f"--plot with --compare-designs needs a feasible reference {ref!r}")
    names = [d for d, r in results.items() if r.feasible]
    keys = ("throughput", "cost", "power")
    fig, ax = plt.subplots(figsize=(8, 4))
    w = 0.8 / len(keys)
    for j, k in enumerate(keys):
        vals = [_metric_of(results[d], k) / _metric_of(r0, k) for d in names]
        ax.bar(np.arange(len(names)) + (j - 1) * w, vals, w, label=k)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(names)), [_label(d) for d in names], fontsize=8)
    ax.set_ylabel(f"normalised to {_label(ref)}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _parse_slo(text: str) -> tuple:
    try:
        vals = [float(v) for v in text.replace(";", ",").split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--slo must be 9 comma-separated numbers (TTFT, TBT, E2E x P50, P90, P99), got {text!r}")
    if len(vals) != 9:
        raise ValueError(f"--slo must be 9 comma-separated numbers (TTFT, TBT, E2E x P50, P90, P99), got {len(vals)}")
    return tuple(tuple(vals[3 * i:3 * i + 3]) for i in range(3))


def _enable_cache():
    """Persistent XLA cache: a second run skips compilation (the Fig. 12 problem then
    answers in a few seconds from process start). SPLITWISE_JAX_CACHE moves it."""
    import os
    from pathlib import Path

    path = Path(os.environ.get("SPLITWISE_JAX_CACHE", Path.home() / ".cache" / "splitwise_jax" / "xla"))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def _build_parser():
    import argparse

    from splitwise_jax.designs import DESIGNS, PHASE_MODELS, TRANSFER_MODES

    ap = argparse.ArgumentParser(
        prog="python -m splitwise_jax.optimize",
        description="Find the cheapest / least-power / highest-throughput cluster meeting every SLO, by gradient "
                    "(default: the paper's Fig. 12 problem: Splitwise-HH, coding, 70 req/s, cost).")
    ap.add_argument("--design", default="splitwise-hh", choices=sorted(DESIGNS))
    ap.add_argument("--workload", default="coding", help="preset (coding, conversation) or an Azure/SplitwiseSim trace CSV")
    ap.add_argument("--objective", default="cost", choices=OBJECTIVES)
    ap.add_argument("--rate", type=float, metavar="R", help="target load, req/s, of cost/power problems (default 70 for presets)")
    ap.add_argument("--power-budget", type=float, metavar="KW",
                    help="provisioned-power budget of a throughput problem (default: 40 DGX-H100, iso-power)")
    ap.add_argument("--cost-budget", type=float, metavar="USD_PER_H", help="cost budget of a throughput problem ($/h)")
    ap.add_argument("--free-caps", default="none", choices=FREE_CAPS,
                    help="optimise these pools' power caps too (e.g. HHcap's token cap instead of a fixed 70%%)")
    ap.add_argument("--cap-step", type=float, default=0.05, help="granularity of free caps (fraction of TDP)")
    ap.add_argument("--max-machines", type=int, default=128, help="largest pool searched")
    ap.add_argument("--bins", type=int, default=16,
                    help="request classes per marginal for the search (0: full resolution); the answer is re-checked at full resolution")
    ap.add_argument("--slo", help="9 slowdown limits TTFT,TBT,E2E x P50,P90,P99 (default Table VI: 2,3,6,1.25,1.5,5,1.25,1.5,5)")
    ap.add_argument("--model", default="bloom-176b")
    ap.add_argument("--phase-model", default="calibrated", choices=PHASE_MODELS)
    ap.add_argument("--transfer-mode", default="serialized", choices=TRANSFER_MODES)
    ap.add_argument("--steps", type=int, help="gradient steps per augmented-Lagrangian round (default 30)")
    ap.add_argument("--verify", action="store_true", help="also evaluate the exhaustive integer grid and compare")
    ap.add_argument("--no-prune", action="store_true", help="with --verify: evaluate every cell (no exact pruning)")
    ap.add_argument("--compare-designs", action="store_true",
                    help="solve the same problem for every design; print the Fig. 18/19-style table")
    ap.add_argument("--designs", help="comma-separated designs for --compare-designs (default: all)")
    ap.add_argument("--baseline", default="baseline-h100", choices=sorted(DESIGNS),
                    help="design the --compare-designs table is normalised to")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--plot", metavar="PATH", help="write the objective over the (prompt, token) plane (Fig. 12 view)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    ap.add_argument("--no-cache", action="store_true", help="do not use the persistent compilation cache")
    return ap


def main(argv=None) -> int:
    """Command-line entry point (see docs/optimize.md)."""
    import json
    import sys

    from splitwise_jax.designs import DESIGNS, make_cluster
    from splitwise_jax.workload import coarsen
    from splitwise_jax.workload import workload as load_workload

    t_start = time.perf_counter()
    ap = _build_parser()
    args = ap.parse_args(argv)
    try:
        if args.bins < 0 or (0 < args.bins < 1):
            raise ValueError(f"--bins must be >= 0, got {args.bins}")
        check_int("--max-machines", args.max_machines, 1)
        for flag, v in (("--rate", args.rate), ("--power-budget", args.power_budget), ("--cost-budget", args.cost_budget),
                        ("--cap-step", args.cap_step)):
            if v is not None:
                check_positive(flag, v)
        if args.steps is not None:
            check_int("--steps", args.steps, 1)
        slo = _parse_slo(args.slo) if args.slo else PAPER_SLO
        if args.objective != "throughput" and (args.power_budget is not None or args.cost_budget is not None):
            raise ValueError(f"--power-budget / --cost-budget apply to --objective throughput, not {args.objective!r} "
                             "(use --rate)")
        if args.objective == "throughput" and args.rate is not None:
            raise ValueError("--rate is the answer of --objective throughput; give --power-budget or --cost-budget")
        problem = Problem(args.objective, rate_per_s=args.rate, power_budget_kw=args.power_budget,
                          cost_budget_per_h=args.cost_budget, slo=slo, free_caps=args.free_caps,
                          cap_step=args.cap_step, max_machines=args.max_machines)
        config = SolverConfig() if args.steps is None else SolverConfig(steps_per_round=args.steps)
        designs = [args.design]
        if args.compare_designs:
            designs = [d.strip() for d in args.designs.split(",")] if args.designs else list(DESIGNS)
            for d in designs:
                check_choice("--designs", d, sorted(DESIGNS))
            if args.baseline not in designs:
                designs.append(args.baseline)
        kw = dict(model=args.model, phase_model=args.phase_model, transfer_mode=args.transfer_mode)
        clusters = {d: make_cluster(d, 1.0, 1.0, **kw) for d in designs}
        for d in designs:  # structural checks before any compilation
            if not args.compare_designs or clusters[d].kind == "splitwise" or problem.free_caps in ("none", "prompt"):
                _free_flags(clusters[d], problem.free_caps)
        wl_full = load_workload(args.workload, args.rate if args.objective != "throughput" else None)
        wl = coarsen(wl_full, args.bins, args.bins) if args.bins else wl_full
    except (ValueError, OSError) as e:
        ap.error(str(e))

    jax.config.update("jax_enable_x64", True)
    if not args.no_cache:
        _enable_cache()
    progress = not args.quiet and not (args.json and not sys.stderr.isatty())
    bins_text = "all workload classes" if not args.bins else f"{len(wl.prompt_tokens)}x{len(wl.output_tokens)} classes"
    load = (f"at {float(np.asarray(wl.rate_per_s)) if problem.rate_per_s is None else problem.rate_per_s:g} req/s"
            if problem.objective != "throughput" else
            "under " + " and ".join(t for t in (
                f"{problem.power_budget_kw:g} kW provisioned" if problem.power_budget_kw else "",
                f"${problem.cost_budget_per_h:g}/h" if problem.cost_budget_per_h else "") if t))
    goal = {"cost": "minimise cost", "power": "minimise provisioned power", "throughput": "maximise throughput"}[
        problem.objective]

    try:
        if args.compare_designs:
            t0 = time.perf_counter()
            results = compare_designs(lambda d: clusters[d], designs, wl, problem, config, progress=progress)
            wall = time.perf_counter() - t0
            if args.json:
                out = dict(workload=args.workload, objective=problem.objective, problem=problem_kind(problem),
                           baseline=args.baseline, wall_s=wall,
                           designs={d: _result_dict(r, clusters[d].kind == "splitwise", None, None, r.timings_s["gradient"])
                                    for d, r in results.items()},
                           headlines=headline_ratios(results, problem))
                print(json.dumps(out, indent=2))
            else:
                _print_compare(results, clusters, problem, args.baseline,
                               f"{args.workload}: {goal} {load}, every design ({bins_text}); normalised to {args.baseline}")
                print(f"  ({wall:.1f} s for {len(results)} designs, {time.perf_counter() - t_start:.1f} s from start)")
            if args.plot:
                _plot_compare(args.plot, results, args.baseline)
            return 0

        cluster = clusters[args.design]
        t0 = time.perf_counter()
        res = optimize(cluster, wl, problem, config, progress=progress)
        opt_wall = time.perf_counter() - t0
        full = None
        if args.bins and res.best is not None:
            full = evaluate_candidate(cluster, wl_full, res.best, problem, config)
        grid = None
        if args.verify:
            grid = grid_search(cluster, wl, problem, config, incumbent=res.best, prune=not args.no_prune,
                               progress=progress)
        fig12 = (args.design == PAPER_FIG12["design"] and args.workload == PAPER_FIG12["workload"]
                 and problem.objective == "cost" and abs(float(np.asarray(wl.rate_per_s)) - 70.0) < 1e-9)
        if args.json:
            d = _result_dict(res, cluster.kind == "splitwise", full, grid, opt_wall)
            d.update(workload=args.workload, problem=dict(kind=problem_kind(problem), **dataclasses.asdict(problem)),
                     bins=args.bins, wall_s_from_start=time.perf_counter() - t_start)
            if fig12:
                d["paper"] = {k: PAPER_FIG12[k] for k in ("prompt_machines", "token_machines")}
            print(json.dumps(d, indent=2))
        else:
            _print_result(res, cluster, f"{_label(args.design)} on {args.workload}: {goal} {load} ({bins_text})",
                          full, grid, opt_wall, bins_text, fig12)
            print(f"  {time.perf_counter() - t_start:.1f} s from process start")
        if args.plot:
            _plot(args.plot, res, cluster, wl, problem, config, grid, progress)
        return 0
    except ValueError as e:
        ap.error(str(e))


if __name__ == "__main__":
    raise SystemExit(main())
