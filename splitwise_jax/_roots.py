"""Scalar root solvers that carry implicit-function gradients, shared by the model.

* `fixed_point_01`: u = h(u) on [0, 1] for non-increasing h (the Splitwise flows'
  drafting share and KV overflow, `cluster.flows_splitwise`): a safeguarded Illinois
  search on stopped values, then one Newton step that carries the gradient.
* `newton_implicit`: Newton's method on a residual rising through its root, run on
  stopped values from a start below it, and one last step, with the slope held, that
  carries the gradient dx = -dr / r'(x*) (the capped clock, `phases.phases`; the serving
  engine's running batch, `cluster.engine`).

* `newton_log_root`: damped Newton in log B on a residual whose slope lies in (0, 1]
  (Little's law of a batching pool: `damped_log_newton_step`, its slope a forward
  difference over `log_slope_step`), undifferentiated, with the exact implicit
  derivative as its `custom_jvp` (chunked prefill's running batch, `cluster.chunked`).
  The pool's own fixed point (`cluster.pool._root`) takes the same steps in a loop that
  also carries the pool's state out, so it stays with the pool and imports the step.

Differentiating through the unrolled iterations instead gives the same first
derivatives at a many times larger reverse-mode graph (the calibration's jit took
minutes to compile); the last step's derivative is exact at the root.

The percentile search stays in `cluster.quantiles` (`search`, `bracket`, `rebracket`,
`refine`, `implicit_root`) with its caller `cluster.percentiles`: it solves F(t) = q for
a vector of levels at once on a CDF, in logit F, from a tabulated bracket, and its
implicit gradient floors a CDF's slope per unit of log t. None of the solvers here can
stand in for it without changing its answers (a different iteration converges to a
different last ulp and, on the piecewise-smooth mixtures, takes different steps), and
moving it here as it is would make this module a percentile module.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp

# Steps of the bracketing root search in `fixed_point_01` (after its two end points).
ROOT_STEPS = 22
# It stops once an evaluated point moved less than this from the one before (then one
# Newton step), or the bracket is narrower than ROOT_WIDTH.
ROOT_MOVE = 1e-10
ROOT_WIDTH = 1e-12


def fixed_point_01(h):
    """The u in [0, 1] with u = h(u), for h non-increasing with values in [0, 1] (so
    g(u) = u - h(u) rises through zero once): a bracketing search, then one Newton step,
    which also carries the implicit-function gradient.

    The search is regula falsi with the Illinois modification, safeguarded: every third
    step, if the bracket has not halved over the three steps before, the step is a
    bisection (Dekker's rule, relaxed: checked after every step it turned the search into
    a bisection, since regula falsi converges from one side and keeps the far end). It
    stops once an evaluated point moved less than `ROOT_MOVE` from the one before, or the
    bracket is narrower than `ROOT_WIDTH`, or after `ROOT_STEPS` steps; the Newton step
    from the bracket's interpolated root (clipped to the bracket) leaves it within 1e-13
    of a 60-step search over a 10 x 10 pool grid at 30, 70 and 150 req/s, at 7-13
    evaluations of h (median) instead of the 24 the step-by-step safeguard took
    (docs/speed.md §2 item 11)."""
    def g(u):
        return u - h(u)

    # The search runs on stop-gradient copies of what h closes over, so the loop is
    # neither differentiated nor traced for differentiation (docs/speed.md §4).
    h_closed, consts = jax.closure_convert(h, jnp.asarray(0.5))
    frozen = jax.lax.stop_gradient(consts)

    def g_closed(u):
        return u - h_closed(u, *frozen)

    def step(i, state):
        a, b, ga, gb, side, width, c_prev, _ = state
        falsi = a - ga * (b - a) / jnp.where(gb - ga > 0, gb - ga, 1.0)
        check = i % 3 == 2
        slow = check & ((b - a) > 0.5 * width)
        c = jnp.clip(jnp.where(slow, 0.5 * (a + b), falsi), a, b)
        # The first two evaluations are the bracket's ends (in the loop, so the program
        # holds one copy of h, not three).
        c = jnp.where(i == 0, 0.0, jnp.where(i == 1, 1.0, c))
        gc = g_closed(c)
        left = gc < 0  # the root lies in [c, b]: c replaces a
        a_new, ga_new = jnp.where(left, c, a), jnp.where(left, gc, ga)
        b_new, gb_new = jnp.where(left, b, c), jnp.where(left, gb, gc)
        # Illinois: when the same end is kept twice running, halve its residual.
        gb_new = jnp.where(left & (side == -1), 0.5 * gb_new, gb_new)
        ga_new = jnp.where(~left & (side == 1), 0.5 * ga_new, ga_new)
        ends = i < 2
        return (jnp.where(ends, a, a_new), jnp.where(ends, b, b_new),
                jnp.where(i == 0, gc, jnp.where(ends, ga, ga_new)), jnp.where(i == 1, gc, jnp.where(ends, gb, gb_new)),
                jnp.where(ends, 0, jnp.where(left, -1, 1)), jnp.where(ends, 2.0, jnp.where(check, b - a, width)),
                c, jnp.where(ends, 1.0, jnp.abs(c - c_prev)))

    zero = jnp.asarray(0.0)
    state = (zero, zero + 1.0, zero, zero, jnp.asarray(0), zero + 2.0, zero, zero + 1.0)
    # A `while_loop`, so that one evaluation stops when its root is found and a vmapped
    # batch when its slowest element's is.
    _, (a, b, ga, gb, _, _, _, _) = jax.lax.while_loop(
        lambda c: (c[0] < 2) | ((c[0] < ROOT_STEPS + 2) & (c[1][1] - c[1][0] > ROOT_WIDTH)
                               & (c[1][7] > ROOT_MOVE)),
        lambda c: (c[0] + 1, step(c[0], c[1])), (jnp.asarray(0), state))
    u0 = jax.lax.stop_gradient(jnp.clip(a - ga * (b - a) / jnp.where(gb - ga > 0, gb - ga, 1.0), a, b))
    val, slope = jax.jvp(g, (u0,), (jnp.ones_like(u0),))
    slope = jax.lax.stop_gradient(jnp.maximum(slope, 1e-6))
    u1 = jnp.clip(u0 - jax.lax.stop_gradient(val) / slope, a, b)
    return u1 - (val - jax.lax.stop_gradient(val)) / slope


def newton_implicit(residual: Callable, residual_sg: Callable, x0, steps: int, slope_floor=None, x_max=None):
    """The root x of a residual rising through zero: `steps` Newton steps on
    `residual_sg` (the same residual closed over stop-gradient inputs) from x0 (below
    the root where the residual is concave, so no step overshoots), then one on
    `residual` with the slope held, which carries the implicit gradient.

    Args:
        residual, residual_sg: x -> r(x), elementwise; the second on stopped inputs.
        x0: the start (no gradient flows from it).
        steps: Newton steps before the last (a `fori_loop`: the program holds one).
        slope_floor: floor on the slope r'(x) of every step (None: none).
        x_max: ceiling on every iterate, the last included (None: none).

    Returns:
        x, the last step's iterate.
    """
    def clamp(x):
        return x if x_max is None else jnp.minimum(x, x_max)

    def floor(slope):
        return slope if slope_floor is None else jnp.maximum(slope, slope_floor)

    def newton(_, x):
        r, dr = jax.jvp(residual_sg, (x,), (jnp.ones_like(x),))
        return clamp(x - r / floor(dr))

    x = jax.lax.stop_gradient(jax.lax.fori_loop(0, steps, newton, x0))
    _, slope = jax.jvp(residual_sg, (x,), (jnp.ones_like(x),))
    return clamp(x - residual(x) / floor(slope))


@partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def newton_log_root(residual: Callable, iters: int, args, log_b0):
    """The root log B of `residual(args, log_b)` (slope in (0, 1]) by `iters` damped
    Newton steps (`damped_log_newton_step`) from log_b0, undifferentiated; its
    derivative is the implicit one, exact at the root: dlog B = -(dr/dargs . dargs) /
    (dr/dlog B). For fixed points whose state is rebuilt at the root by the caller
    (`cluster.chunked.chunked_state`); `cluster.pool.pool_state` carries its state out
    of the loop instead (`pool._root`)."""
    def newton(_, log_b):
        r = jax.vmap(lambda lb: residual(args, lb))(jnp.stack([log_b, log_b + log_slope_step()]))
        return damped_log_newton_step(log_b, r)

    return jax.lax.fori_loop(0, iters, newton, log_b0)


@newton_log_root.defjvp
def _newton_log_root_jvp(residual, iters, primals, tangents):
    args, log_b0 = primals
    args_dot, _ = tangents
    log_b = newton_log_root(residual, iters, args, log_b0)
    _, lin = jax.linearize(residual, args, log_b)
    r_theta = lin(args_dot, jnp.zeros_like(log_b))
    r_b = lin(jax.tree_util.tree_map(jnp.zeros_like, args_dot), jnp.ones_like(log_b))
    return log_b, -r_theta / jnp.where(jnp.abs(r_b) > 1e-6, r_b, 1e-6)


def log_slope_step():
    """Step in log B of the Newton slope's forward difference: 1e-6 in float64, 1e-3 in
    float32 (read when traced, so it follows the x64 flag)."""
    return 1e-6 if jnp.result_type(float) == jnp.float64 else 1e-3


def damped_log_newton_step(log_b, r):
    """One Newton step from the residual at log B and at log B + `log_slope_step()`
    (r, shape (2,) + log_b's): damped (the slope floored at 0.05, the step clipped to
    +-2: safe from a poor start, `cluster.pool._root`) unless the full step (slope floored
    at 1e-3) is shorter than 0.25. Near a pool's decode limit the slope falls to ~0.01,
    where the floored steps converged at ~0.8 per step and 13 of them left B 1.3e-2 off
    (docs/speed.md §2 item 11)."""
    slope = (r[1] - r[0]) / log_slope_step()
    damped = jnp.clip(r[0] / jnp.maximum(slope, 0.05), -2.0, 2.0)
    newton = r[0] / jnp.maximum(slope, 1e-3)
    return log_b - jnp.where(jnp.abs(newton) < 0.25, newton, damped)
