"""The gradient solver: an augmented Lagrangian over relaxed pool sizes, caps and rate.

1. *Start*: one vectorised evaluation of a coarse log-spaced grid (64 points) picks a
   starting point (the best feasible one, else the least violating).
2. *Gradient*: Adam (optax) on a smooth augmented Lagrangian in log-space of the
   variables. Constraints, all written g >= 0 in log units: the nine SLO margins
   log(limit / slowdown) of Table VI, -log(memory pressure), -log(pool load) for each
   pool (stability), and log(budget / spend) for throughput problems. The
   Powell-Hestenes-Rockafellar term (1 / 2 rho) [s(lam - rho g)^2 - lam^2] uses a
   softplus s in place of max(0, .) so the Lagrangian is smooth; multipliers follow
   lam <- s(lam - rho g) between rounds and rho grows while violations persist.
3. *Repair* to integers and the binding constraints: `integer.py`.

References:
    Nocedal & Wright, Numerical Optimization, §17.4 (augmented Lagrangian, inequalities).
    Patel et al., Splitwise, ISCA 2024, §VI-A (Fig. 12), §VI-C (Figs. 18-19).
"""

from __future__ import annotations

import math
import time
import warnings
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from splitwise_jax._smooth import softplus
from splitwise_jax._exported import cached_jit
from splitwise_jax.cluster.cluster import Cluster, Resolution
from splitwise_jax.optimize.integer import binding_constraints, max_rates, repair
from splitwise_jax.optimize.problem import CONSTRAINT_NAMES, OptimizeResult, Problem, SolverConfig
from splitwise_jax.optimize.spec import (CHUNK, RATE_BOUNDS, Spec, SpecInfo, assess, evaluate_points, is_feasible,
                                         make_spec, physical, prefetch_batch, progress_bar, unit_cost, unit_power)
from splitwise_jax.cluster.workload import Workload

_ADAM = optax.scale_by_adam(b1=0.8, b2=0.9)


@cached_jit(static_argnames=("steps", "resolution"))
def _al_round(u, opt_state, lam, rho, lr, temperature, spec: Spec, steps: int, resolution: Resolution):
    """`steps` Adam steps on the smooth augmented Lagrangian at fixed multipliers (the
    only gradient compile; a scan, so one dispatch per round)."""

    def lagrangian(u):
        m, g, f = assess(spec, physical(spec, u), resolution)
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



def _frontier(cluster: Cluster, problem: Problem, info: SpecInfo, caps) -> np.ndarray:
    """Pool sizes that spend the whole budget: n_p from 1 to its bound, n_t the rest."""
    if not info.splitwise:
        return np.array([[float(info.hi_p), 0.0]])
    n_p = np.unique(np.round(np.linspace(1, info.hi_p, CHUNK), 6))
    n_t = np.full_like(n_p, float(info.hi_t))
    for budget, (up, ut) in ((problem.cost_budget_per_h, unit_cost(cluster)),
                             (problem.power_budget_kw, unit_power(cluster, caps))):
        if budget is not None:
            n_t = np.minimum(n_t, (budget - n_p * up) / ut)
    keep = n_t >= 1.0
    return np.stack([n_p[keep], n_t[keep]], axis=1)


def _start_points(spec: Spec, info: SpecInfo, problem: Problem, cluster: Cluster, config: SolverConfig):
    """A coarse vectorised sweep to start from; returns u0 (5,) and the evaluations spent.

    Cost/power: an 8 x 8 log-spaced grid of pool sizes at the target load (one batch).
    Throughput: CHUNK splits of the budget between the pools, each with its largest
    feasible rate by a coarse vectorised bisection (~3% resolution)."""
    hi_p, hi_t = info.hi_p, info.hi_t
    cp, ct = info.cap_fixed
    if problem.objective != "throughput":
        if info.splitwise:
            ps, ts = np.geomspace(1, hi_p, 8), np.geomspace(1, hi_t, 8)
            pts = np.array([(p, t) for p in ps for t in ts])
        else:
            pts = np.stack([np.geomspace(1, hi_p, CHUNK), np.zeros(CHUNK)], axis=1)
        phys = np.concatenate([pts, np.tile([cp, ct, info.rate], (len(pts), 1))], axis=1)
        g, cost, power = evaluate_points(spec, phys, config.resolution)
        n_evals = len(phys)
        feas = is_feasible(g)
        obj = cost if problem.objective == "cost" else power
        if feas.any():
            i = int(np.argmin(np.where(feas, obj, np.inf)))
        else:
            i = int(np.argmax(np.min(np.where(info.mask > 0, g, np.inf), axis=1)))
        p = phys[i]
    else:
        # Just inside the budget, so the budget constraint starts satisfied.
        pts = _frontier(cluster, problem, info, (cp, ct)) * (1.0 - 1e-6)
        cells = np.concatenate([pts, np.tile([cp, ct], (len(pts), 1))], axis=1)
        rates, _, _, _, n_evals = max_rates(spec, cells, RATE_BOUNDS[0], 64.0, 0.03, config.resolution)
        if np.isfinite(rates).any():
            i = int(np.nanargmax(rates))
            p = np.append(cells[i], rates[i])
        else:
            p = np.append(cells[len(cells) // 2], RATE_BOUNDS[0])
    u0 = np.array([math.log(max(p[0], 1.0)), math.log(max(p[1], 1.0)), cp, ct, math.log(p[4])])
    return u0, n_evals


def _softplus_np(x, temperature):
    """Host twin of `_smooth.softplus` (multiplier updates run between compiled rounds)."""
    return temperature * np.logaddexp(0.0, np.asarray(x) / temperature)


def _first_round(u, config: SolverConfig):
    """The augmented Lagrangian's state before its first round: (u, Adam state,
    multipliers, penalty), host (numpy) arrays the compiled round takes as they are."""
    u = np.asarray(u, float)
    opt_state = optax.ScaleByAdamState(count=np.zeros((), np.int32), mu=np.zeros_like(u), nu=np.zeros_like(u))
    return u, opt_state, np.zeros(len(CONSTRAINT_NAMES)), config.rho0


def _round_args(spec: Spec, config: SolverConfig, u, opt_state, lam, rho, r: int):
    """`_al_round`'s arguments for round r."""
    lr = config.learning_rate * config.lr_decay**r
    return (u, opt_state, lam, np.float64(rho), np.float64(lr), np.float64(config.temperature), spec,
            config.steps_per_round, config.resolution)


def prefetch(cluster: Cluster, workload: Workload, problem: Problem = Problem(),
             config: SolverConfig = SolverConfig()) -> None:
    """Start loading (or compiling) the programs `optimize` will run for this problem,
    in the background (`_exported.cached_jit.prefetch`; nothing without a CLI's cache):
    `compare_designs` loads every design kind's programs while the first design is
    solved. A problem `make_spec` rejects is left for `optimize` to reject."""
    spec = prefetch_batch(cluster, workload, problem, config.resolution)
    if spec is not None:
        _al_round.prefetch(*_round_args(spec, config, *_first_round(np.zeros(5), config), 0))


def optimize(cluster: Cluster, workload: Workload, problem: Problem = Problem(),
             config: SolverConfig = SolverConfig(), *, progress: bool = False,
             after_start: Callable[[], None] | None = None) -> OptimizeResult:
    """Optimise pool sizes (and free caps) of a design by gradient, then repair to integers.

    Args:
        cluster: the design (e.g. `make_cluster("splitwise-hh", 1, 1)`); its pool sizes
            are ignored, its caps are used unless freed by `problem.free_caps`.
        workload: request classes and arrival process (coarsen it for speed; its rate
            is the target of cost/power problems unless `problem.rate_per_s` is set).
        problem: objective and constraints.
        config: solver settings.
        progress: show tqdm progress bars (stderr).
        after_start: called once the start points are found, while the gradient program
            may still be loading: where a caller starts loading (prefetching) a program it
            needs after `optimize`, so that it does not compete with the two programs
            `optimize` needs first (the command line's full-resolution check: docs/speed.md
            §4, "Where a warm `optimize` waits").

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
    spec, info = make_spec(cluster, workload, problem)
    timings = {}

    # The gradient program is loaded (or compiled) while the start points are searched.
    _al_round.prefetch(*_round_args(spec, config, *_first_round(np.zeros(5), config), 0))
    t0 = time.perf_counter()
    u0, n_evals = _start_points(spec, info, problem, cluster, config)
    timings["start"] = time.perf_counter() - t0
    if after_start is not None:
        after_start()

    t0 = time.perf_counter()
    u, opt_state, lam, rho = _first_round(u0, config)
    mask = info.mask
    hist_obj, hist_viol = [], []
    prev_viol = np.inf
    total = config.rounds * config.steps_per_round
    last_finite = (np.asarray(u0, float), None)  # (an iterate, its constraints) to fall back on
    with progress_bar(progress, total=total, desc=f"{cluster.name}: gradient", unit="step") as bar:
        for r in range(config.rounds):
            u, opt_state, us, gs, fs = _al_round(*_round_args(spec, config, u, opt_state, lam, rho, r))
            gs = np.asarray(gs)
            us = np.asarray(us)
            finite = np.isfinite(us).all(axis=1) & np.isfinite(gs).all(axis=1) & np.isfinite(np.asarray(fs))
            if finite.any():
                i = int(np.flatnonzero(finite)[-1])
                last_finite = (us[i], gs[i])
            if not finite.all() or not np.isfinite(np.asarray(u)).all():
                # Never observed in float64 or, since 2026-12-03, float32 (docs/optimize.md);
                # a NaN would otherwise surface as an unrelated error in the repair.
                warnings.warn(f"{cluster.name}: the gradient phase reached a non-finite point in round {r}; "
                              "repairing from the last finite iterate", RuntimeWarning, stacklevel=2)
                u, g_last = last_finite
                gs = np.full((1, len(CONSTRAINT_NAMES)), np.nan) if g_last is None else g_last[None]
                break
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
    f = info.free
    phys_c = np.array([math.exp(u[0]), math.exp(u[1]) if info.splitwise else 0.0,
                       *(f[2:4] * u[2:4] + (1.0 - f[2:4]) * np.asarray(info.cap_fixed)),
                       math.exp(u[4]) if f[4] else info.rate])
    continuous = dict(prompt_machines=float(phys_c[0]), token_machines=float(phys_c[1]),
                      prompt_cap_frac=float(phys_c[2]), token_cap_frac=float(phys_c[3]), rate_per_s=float(phys_c[4]),
                      violated={n: float(v) for n, v, k in zip(CONSTRAINT_NAMES, gs[-1], mask) if k > 0 and v < 0})

    t0 = time.perf_counter()
    best, n_rep = repair(cluster, spec, info, problem, config, phys_c, progress)
    n_evals += n_rep
    binding, n_bind = binding_constraints(cluster, spec, info, problem, config, best)
    n_evals += n_bind
    metrics = None if best is None else best.metrics
    if best is not None and metrics is None:  # throughput: the metrics at the rate found
        _, _, _, rows = evaluate_points(spec, best.as_row()[None], config.resolution, keep_metrics=True)
        metrics = rows[0]
        best = best._replace(metrics=metrics)
    timings["repair"] = time.perf_counter() - t0
    mult = {n: float(v) for n, v, k in zip(CONSTRAINT_NAMES, np.asarray(lam), mask) if k > 0}
    return OptimizeResult(design=cluster.name, objective=problem.objective, best=best, metrics=metrics,
                          continuous=continuous, multipliers=mult, binding=binding,
                          history=dict(objective=hist_obj, violation=hist_viol), evaluations=n_evals,
                          timings_s=timings, bounds=(info.hi_p, info.hi_t), problem=problem)

