"""The traced problem: relaxed variables -> (metrics, constraints, objective), and
batches of configurations evaluated by one compiled program.

Two compiled functions serve the whole optimiser: the gradient round (`gradient.py`)
and `assess_batch` here. Static names are stripped from the pytrees (`uniform_names`)
so Splitwise-AA, -HH, -HA and -HHcap share one compilation, and every number the
problem needs (SLOs, budgets, bounds, fixed caps and rate) is a traced leaf of `Spec`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from splitwise_jax.phases._caps import cap_floor_frac
from splitwise_jax._batching import padded_blocks
from splitwise_jax._exported import cached_jit
from splitwise_jax.cluster.cluster import Cluster, ClusterMetrics, Resolution, evaluate
from splitwise_jax.cluster.designs import uniform_names
from splitwise_jax.optimize.problem import CONSTRAINT_NAMES, Problem
from splitwise_jax.phases.timing import CalibratedTiming
from splitwise_jax.cluster.workload import Workload

CHUNK = 64  # points per vectorised evaluation: one compiled shape serves every batch
FEAS_TOL = 1e-9  # budgets met with equality (40 machines on a 40-machine budget) count
RATE_BOUNDS = (0.05, 5000.0)  # req/s searched by throughput problems
_TINY = 1e-12


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Spec:
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




class SpecInfo(NamedTuple):
    """Host copies of what the Python side of the solver reads about a problem
    (indexing the device arrays of `Spec` eagerly would compile a small XLA program per
    operation)."""

    hi_p: int                  # largest prompt pool searched
    hi_t: int                  # largest token pool searched (0 for a baseline)
    free_p: bool               # prompt cap free
    free_t: bool               # token cap free
    rate: float                # load of cost/power problems (req/s)
    splitwise: bool
    cap_step: float            # granularity of free caps
    cap_lo: tuple              # (prompt, token) cap floors, fraction of TDP
    cap_fixed: tuple           # (prompt, token) caps used when not free
    mask: np.ndarray           # (14,) constraints in force
    free: np.ndarray           # (5,) 1 where the variable is optimised


def caps_of(timing) -> float:
    return float(np.asarray(timing.cap_frac))


def cap_floor(timing) -> float:
    return float(cap_floor_frac(timing.machine.gpu))


def free_flags(cluster: Cluster, free_caps: str) -> tuple[bool, bool]:
    """(prompt cap free, token cap free) for this cluster, or ValueError."""
    want_p = free_caps in ("prompt", "both")
    want_t = free_caps in ("token", "both")
    if want_t and not cluster.strategy.token_pool:
        raise ValueError("free_caps 'token' needs a Splitwise design (a colocated design has one pool: use 'prompt')")
    for want, t in ((want_p, cluster.prompt), (want_t, cluster.token)):
        if want and not isinstance(t, CalibratedTiming):
            raise ValueError("free_caps needs phase_model 'calibrated' (the SplitwiseSim table knows "
                             "fixed caps only)")
    return want_p, want_t


def pool_bounds(cluster: Cluster, problem: Problem, free_p: bool, free_t: bool) -> tuple[int, int]:
    """Largest prompt and token pools searched (budgets bound throughput problems)."""
    hi_p = problem.max_machines
    hi_t = problem.max_machines if cluster.strategy.token_pool else 0
    if problem.objective == "throughput":
        lo_t = 1 if cluster.strategy.token_pool else 0
        caps = tuple(cap_floor(t) if free else caps_of(t)
                     for t, free in ((cluster.prompt, free_p), (cluster.token, free_t)))
        units = ((problem.cost_budget_per_h, unit_cost(cluster)), (problem.power_budget_kw, unit_power(cluster, caps)))
        for budget, (up, ut) in units:
            if budget is None:
                continue
            hi_p = min(hi_p, int(math.floor((budget - lo_t * ut) / up + 1e-9)))
            if cluster.strategy.token_pool:
                hi_t = min(hi_t, int(math.floor((budget - up) / ut + 1e-9)))
        if hi_p < 1 or (cluster.strategy.token_pool and hi_t < 1):
            raise ValueError(f"the budget cannot buy one machine per pool of {cluster.name!r}")
    return hi_p, hi_t


def unit_cost(cluster: Cluster):
    """$/h per machine of each pool."""
    return float(cluster.prompt.machine.cost_per_hour), float(cluster.token.machine.cost_per_hour)


def unit_power(cluster: Cluster, caps):
    """Provisioned kW per machine of each pool at the given caps."""
    return (float(cluster.prompt.machine.provisioned_power_w) * caps[0] / 1e3,
            float(cluster.token.machine.provisioned_power_w) * caps[1] / 1e3)


def make_spec(cluster: Cluster, workload: Workload, problem: Problem) -> tuple[Spec, SpecInfo]:
    free_p, free_t = free_flags(cluster, problem.free_caps)
    hi_p, hi_t = pool_bounds(cluster, problem, free_p, free_t)
    splitwise = cluster.strategy.token_pool
    rate = float(np.asarray(workload.rate_per_s)) if problem.rate_per_s is None else float(problem.rate_per_s)
    throughput = problem.objective == "throughput"
    free = np.array([1.0, 1.0 if splitwise else 0.0, float(free_p), float(free_t), float(throughput)])
    # Caps are optimised as they are, projected onto [floor, 1] (a sigmoid would starve
    # the gradient at the usual start, cap = 1); pools and rate in log space.
    u_lo = np.array([0.0, 0.0, cap_floor(cluster.prompt), cap_floor(cluster.token), math.log(RATE_BOUNDS[0])])
    u_hi = np.array([math.log(hi_p), math.log(max(hi_t, 1)), 1.0, 1.0, math.log(RATE_BOUNDS[1])])
    budgets = np.array([problem.cost_budget_per_h or np.inf, problem.power_budget_kw or np.inf])
    mask = np.ones(len(CONSTRAINT_NAMES))
    mask[11] = float(splitwise)
    mask[12:] = np.isfinite(budgets)
    w = {"cost": [1.0, 0.0, 0.0], "power": [0.0, 1.0, 0.0], "throughput": [0.0, 0.0, 1.0]}[problem.objective]
    # numpy leaves: jit takes them as they are (jnp.asarray would compile a small
    # conversion program per array on this jax version).
    spec = Spec(
        cluster=uniform_names(cluster), workload=uniform_names(workload), slo=np.asarray(problem.slo, float),
        horizon_s=np.float64(problem.horizon_s), free=free, u_lo=u_lo, u_hi=u_hi,
        cap_lo=np.array([cap_floor(cluster.prompt), cap_floor(cluster.token)]),
        cap_fixed=np.array([caps_of(cluster.prompt), caps_of(cluster.token)]),
        rate_fixed=np.float64(rate), w_obj=np.asarray(w, float), budgets=budgets, con_mask=mask)
    # Host copies of what the Python side reads: indexing the device arrays eagerly would
    # compile a small XLA program per operation.
    info = SpecInfo(hi_p=hi_p, hi_t=hi_t, free_p=free_p, free_t=free_t, rate=rate, splitwise=splitwise,
                    cap_step=problem.cap_step, cap_lo=(cap_floor(cluster.prompt), cap_floor(cluster.token)),
                    cap_fixed=(caps_of(cluster.prompt), caps_of(cluster.token)), mask=mask, free=free)
    return spec, info


def with_cap(timing, cap):
    if isinstance(timing, CalibratedTiming):
        return dataclasses.replace(timing, cap_frac=cap)
    return timing  # table timing: caps are fixed (free caps were refused earlier)


def physical(spec: Spec, u):
    """Variables -> (n_prompt, n_token, prompt cap, token cap, rate)."""
    f = spec.free
    caps = f[2:4] * u[2:4] + (1.0 - f[2:4]) * spec.cap_fixed
    rate = f[4] * jnp.exp(u[4]) + (1.0 - f[4]) * spec.rate_fixed
    n_t = jnp.exp(u[1]) if spec.cluster.strategy.token_pool else jnp.asarray(0.0)
    return jnp.stack([jnp.exp(u[0]), n_t, caps[0], caps[1], rate])


def assess(spec: Spec, phys, resolution: Resolution):
    """One configuration: (metrics, constraints g (14,) with g >= 0 feasible, objective)."""
    c = spec.cluster
    cluster = c.replace(n_prompt=phys[0], n_token=phys[1] if c.strategy.token_pool else 0.0,
                        prompt=with_cap(c.prompt, phys[2]), token=with_cap(c.token, phys[3]))
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



@cached_jit(static_argnames=("resolution",))
def assess_batch(phys, spec: Spec, resolution: Resolution, n_valid=None):
    """A batch of configurations (rows of phys) in one compiled call.

    `lax.map` rather than `vmap`: the model's inner loops (fixed points, bisections)
    batch poorly, and a map traces and compiles in half the time and runs as fast on CPU.
    Rows from `n_valid` on (the padding of a short batch to the one compiled shape) are
    skipped: a `lax.cond` inside the map runs one branch per row, and theirs returns
    zeros. A rate bisection over a few cells used to pay for all 64 rows at every step."""
    if n_valid is None:
        return jax.lax.map(lambda p: assess(spec, p, resolution), phys)

    def row(args):
        i, p = args
        return jax.lax.cond(i < n_valid, lambda q: assess(spec, q, resolution), _skipped, p)

    return jax.lax.map(row, (jnp.arange(phys.shape[0]), phys))



def _skipped(p):
    """What `assess` returns, as zeros, for a padding row of `assess_batch` (built by hand:
    `jax.eval_shape` of `assess` would trace the whole model a second time)."""
    z = jnp.zeros((), p.dtype)
    three = jnp.zeros(3, p.dtype)
    m = ClusterMetrics(**{name: z for name in ClusterMetrics._fields})._replace(
        ttft_s=three, tbt_s=three, e2e_s=three, slowdown_ttft=three, slowdown_tbt=three, slowdown_e2e=three,
        slo_margin=jnp.zeros((3, 3), p.dtype), meets_slo=jnp.zeros((), bool))
    return m, jnp.zeros(len(CONSTRAINT_NAMES), p.dtype), z


def prefetch_batch(cluster, workload, problem, resolution: Resolution):
    """Start building (or loading) `assess_batch`'s program for this problem in the
    background (`_exported.cached_jit.prefetch`; nothing without a CLI's cache), and
    return the problem's `Spec`, or None where `make_spec` rejects the problem (left for
    the run itself to reject: a prefetch never fails a run)."""
    try:
        spec, _ = make_spec(cluster, workload, problem)
    except Exception:  # noqa: BLE001
        return None
    assess_batch.prefetch(np.zeros((CHUNK, 5)), spec, resolution, np.int32(1))
    return spec


def progress_bar(progress, **kw):
    from tqdm.auto import tqdm

    return tqdm(disable=not progress, leave=False, dynamic_ncols=True, **kw)


def evaluate_points(spec: Spec, phys: np.ndarray, resolution: Resolution, progress=False, desc="evaluate",
                     keep_metrics=False):
    """Evaluate rows of phys (N, 5) in chunks of CHUNK (one compiled shape).

    Returns (g (N, 14), cost (N,), provisioned power (N,)), plus the list of per-row
    `ClusterMetrics` (numpy) when keep_metrics."""
    n = len(phys)
    g_all = np.empty((n, len(CONSTRAINT_NAMES)))
    cost = np.empty(n)
    power = np.empty(n)
    rows = []
    with progress_bar(progress and n > CHUNK, total=n, desc=desc, unit="cfg") as bar:
        for start, k, (pad,) in padded_blocks([phys], CHUNK):
            m, g, _ = assess_batch(pad, spec, resolution, np.int32(k))
            g_all[start:start + k] = np.asarray(g)[:k]
            cost[start:start + k] = np.asarray(m.cost_per_hour)[:k]
            power[start:start + k] = np.asarray(m.provisioned_power_kw)[:k]
            if keep_metrics:
                m_np = jax.tree_util.tree_map(np.asarray, m)
                rows.extend(jax.tree_util.tree_map(lambda x, i=i: x[i], m_np) for i in range(k))
            bar.update(k)
    return (g_all, cost, power, rows) if keep_metrics else (g_all, cost, power)


def is_feasible(g: np.ndarray) -> np.ndarray:
    return np.all(g >= -FEAS_TOL, axis=-1)

