"""Percentiles of mixture distributions, differentiable by the implicit function theorem.

A latency percentile is a percentile of a mixture over request classes (and routes).
We solve F(t) = q in log t in two parts:

* `search` (no gradient): the CDF tabulated once on a coarse log-spaced grid brackets
  every q; Illinois (modified regula falsi) steps refine inside the bracket, all levels
  at once, and a last secant step gives the answer.
* `implicit_root` (the gradient): the answer's tangent is
  dlog t/dtheta = -(dF/dtheta) / (dF/dlog t), the implicit function theorem at the
  root. It is a `jax.custom_jvp`, so a forward evaluation pays nothing for it and a
  gradient pays one JVP of F at the root (STYLE.md, "Numerics that stay differentiable").

`mixture_quantiles` joins the two for any CDF given as a closure; `percentiles.py`
calls `search` and `implicit_root` itself, so it can search in float32 and attach the
gradient in the caller's precision.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp

# Slope floor (per unit of log t) when a percentile falls where the CDF is flat, so the
# implicit gradient stays finite; far below any slope met at a real class boundary.
_MIN_LOG_SLOPE = 1e-4
# Floor of a CDF difference in the secant step. 1e-300 rounds to 0 in float32, where equal
# CDF values at both ends of a bracket are common, and gave 0/0 = NaN percentiles; 1e-30
# is representable in float32 and far below any CDF step that matters.
_MIN_CDF_STEP = 1e-30


def _logit_of(f, dtype):
    """logit of CDF values, clipped one float step inside (0, 1)."""
    tiny = jnp.finfo(dtype).tiny
    eps = jnp.finfo(dtype).epsneg
    f = jnp.clip(f, tiny, 1.0 - eps)
    return jnp.log(f) - jnp.log1p(-f)


def search(cdf: Callable, qs, llo, lhi, grid_points: int = 16, refine_iters: int = 3, *,
           zoom_points: int = 0, cdf_slope: Callable | None = None, logit: bool = True):
    """log t with cdf(log t) = q for each q in qs; no gradient (the caller stops it).

    1. The CDF tabulated on `grid_points` log-spaced points brackets every q; with
       `zoom_points`, a second table inside each bracket narrows it.
    2. The first guess interpolates logit F (or F, `logit=False`) linearly in log t
       inside the bracket: a log-logistic component, and the tails of the mixtures
       here, are straight lines in logit F, so the guess starts close.
    3. With `cdf_slope`: `refine_iters` safeguarded Newton steps (a step that would
       leave the bracket, which every evaluation shrinks, falls back to the secant, or
       to the midpoint when the bracket has not halved since the step before); the
       last iterate is evaluated and the answer interpolated inside the final bracket,
       so it never leaves it. Without: Illinois steps (superlinear, one CDF evaluation
       per step), the answer interpolated inside the final bracket.

    Args:
        cdf: maps log-times of shape (P,) to CDF values (P,), non-decreasing.
        qs: levels in (0, 1), shape (n,).
        llo, lhi: log-bracket (answers are clipped to it).
        grid_points: points of the bracketing table.
        refine_iters: refinement steps.
        cdf_slope: maps log-times (P,) to (F, dF/dlog t), each (P,); enables Newton.
        logit: interpolate logit F (True) or F itself (False). On the cluster's latency
            mixtures (logistic components in t, long right tails) logit F is the better
            coordinate: with 24 grid points and 6 steps the largest error against a
            converged solve (400 points, 40 steps) over four designs' 18 percentiles
            was 2e-4 relative, against 2.1% for F (a TBT-slowdown P99 where F is nearly
            flat). Where F saturates below 1 over a stretch (one component of a mixture
            of widely separated ones), F converges faster: `mixture_quantiles` uses F.

    Returns:
        (n,) log-times.
    """
    a, b, ha, hb = bracket(cdf, qs, llo, lhi, grid_points, zoom_points=zoom_points, logit=logit)
    return refine(cdf, qs, a, b, ha, hb, llo, lhi, refine_iters, cdf_slope=cdf_slope, logit=logit)


def bracket(cdf: Callable, qs, llo, lhi, grid_points: int = 16, *, zoom_points: int = 0, logit: bool = True):
    """Steps 1 of `search`: a bracket [a, b] of each level and (logit) F at its ends."""
    dtype = jnp.result_type(llo, lhi)
    qs = jnp.asarray(qs, dtype)
    _logit = _logit_of if logit else (lambda f, dtype: f)
    grid = llo + (lhi - llo) * jnp.linspace(0.0, 1.0, grid_points, dtype=dtype)
    fg = cdf(grid)
    idx = jnp.clip(jnp.sum(fg[None, :] < qs[:, None], axis=1), 1, grid_points - 1)
    hg, hq = _logit(fg, dtype), _logit(qs, dtype)
    a, b = grid[idx - 1], grid[idx]
    ha, hb = hg[idx - 1], hg[idx]
    if zoom_points:
        # A second table inside each bracket: points in all brackets at once.
        frac = jnp.arange(1, zoom_points + 1, dtype=dtype) / (zoom_points + 1)
        pts = a[:, None] + (b - a)[:, None] * frac[None, :]
        hz = _logit(cdf(pts.reshape(-1)), dtype).reshape(pts.shape)
        xs = jnp.concatenate([a[:, None], pts, b[:, None]], axis=1)
        hs = jnp.concatenate([ha[:, None], hz, hb[:, None]], axis=1)
        j = jnp.clip(jnp.sum(hs < hq[:, None], axis=1), 1, zoom_points + 1)
        take = lambda v, k: jnp.take_along_axis(v, k[:, None], axis=1)[:, 0]  # noqa: E731
        a, b, ha, hb = take(xs, j - 1), take(xs, j), take(hs, j - 1), take(hs, j)
    return a, b, ha, hb


# Most doublings `rebracket` takes: from a width of 1e-2 in log t, 2^10 x 1e-2 ~ 10 covers
# any bracket `percentiles` searches (its lhi - llo is a few units).
_REBRACKET_STEPS = 10


def rebracket(cdf: Callable, qs, a, b, llo, lhi, *, logit: bool = True):
    """(a, b, F(a), F(b)) with F(a) < q <= F(b) for a CDF other than the one that found
    [a, b] (a search on part of a mixture): F is evaluated at both ends, and an end on
    the wrong side moves outwards by a width that doubles each time, until every level
    is bracketed or the end reaches [llo, lhi]. A `while_loop`: a batch pays for its
    worst element only, and one step when the first bracket holds."""
    dtype = jnp.result_type(a, b)
    _logit = _logit_of if logit else (lambda f, dtype: f)
    hq = _logit(jnp.asarray(qs, dtype), dtype)
    n = qs.shape[0]

    def ends(a, b):
        h = _logit(cdf(jnp.concatenate([a, b])), dtype)
        return h[:n], h[n:]

    ha, hb = ends(a, b)

    def bad(state):
        a, b, ha, hb, _, k = state
        low = (ha >= hq) & (a > llo)
        high = (hb < hq) & (b < lhi)
        return jnp.any(low | high) & (k < _REBRACKET_STEPS)

    def widen(state):
        a, b, ha, hb, width, k = state
        low = ha >= hq   # the root lies left of a: b moves to a, a moves out
        high = hb < hq   # the root lies right of b
        a2 = jnp.where(low, jnp.maximum(a - width, llo), jnp.where(high, b, a))
        b2 = jnp.where(high, jnp.minimum(b + width, lhi), jnp.where(low, a, b))
        ha2, hb2 = ends(a2, b2)
        return a2, b2, ha2, hb2, 2.0 * width, k + 1

    width = jnp.maximum(b - a, 1e-2)
    a, b, ha, hb, _, _ = jax.lax.while_loop(bad, widen, (a, b, ha, hb, width, jnp.asarray(0)))
    return a, b, ha, hb


# A Newton step shorter than this (log t) counts as converged for `refine`'s extra steps:
# float32's resolution of log t near 5 is ~5e-7, and `percentiles._polish` takes the
# float64 remainder (up to 1e-3).
_REFINE_TOL = 1e-5


def refine(cdf: Callable, qs, a, b, ha, hb, llo, lhi, refine_iters: int = 3, *,
           cdf_slope: Callable | None = None, logit: bool = True, max_iters: int | None = None,
           extra_if=True):
    """Steps 2-3 of `search`: refine inside [a, b] (F(a) < q <= F(b), (logit) values
    ha, hb), the answer clipped to [llo, lhi]. With `max_iters` (Newton only), steps go
    on past `refine_iters` while some level's last step exceeds `_REFINE_TOL`, up to
    `max_iters` (a `while_loop`: a batch pays for its slowest element), for a bracket
    that may be wide (`rebracket`'s); `extra_if` (a boolean, traced or not) allows
    those extra steps only where it is true."""
    dtype = jnp.result_type(a, b)
    qs = jnp.asarray(qs, dtype)
    _logit = _logit_of if logit else (lambda f, dtype: f)
    hq = _logit(qs, dtype)

    def secant(a, b, ha, hb):
        c = a + (hq - ha) * (b - a) / jnp.maximum(hb - ha, _MIN_CDF_STEP)
        return jnp.clip(c, a + 1e-3 * (b - a), b - 1e-3 * (b - a))

    if cdf_slope is not None:
        def newton(_, state):
            a, b, ha, hb, x, width = state
            f, df = cdf_slope(x)
            hx = _logit(f, dtype)
            left = hx < hq  # the root lies in [x, b]: x replaces a
            a, ha = jnp.where(left, x, a), jnp.where(left, hx, ha)
            b, hb = jnp.where(left, b, x), jnp.where(left, hb, hx)
            # d logit F / d log t = F' / (F (1 - F)), F' per unit of log t.
            dh = df / jnp.maximum(f * (1.0 - f), jnp.finfo(dtype).tiny) if logit else df
            step = (hq - hx) / jnp.maximum(dh, _MIN_CDF_STEP)
            x_new = x + step
            inside = (dh > 0) & (x_new > a) & (x_new < b)
            # Where Newton leaves the bracket: the secant, unless the bracket has not
            # halved since the step before (a near-step CDF, where the secant creeps
            # from one side): then its midpoint (Dekker's safeguard).
            fallback = jnp.where(b - a < 0.5 * width, secant(a, b, ha, hb), 0.5 * (a + b))
            return a, b, ha, hb, jnp.where(inside, x_new, fallback), b - a

        state = (a, b, ha, hb, secant(a, b, ha, hb), jnp.full(qs.shape, jnp.inf, dtype))
        if max_iters is None or max_iters <= refine_iters:
            a, b, ha, hb, x, _ = jax.lax.fori_loop(0, refine_iters, newton, state)
        else:
            def more(carry):
                i, state, moved = carry
                return (i < refine_iters) | ((i < max_iters) & extra_if & (moved > _REFINE_TOL))

            def step(carry):
                i, state, _ = carry
                new_state = newton(i, state)
                return i + 1, new_state, jnp.max(jnp.abs(new_state[4] - state[4]))

            _, (a, b, ha, hb, x, _), _ = jax.lax.while_loop(
                more, step, (jnp.asarray(0), state, jnp.asarray(jnp.inf, dtype)))
        # The last iterate, evaluated, narrows the bracket once more, and the answer is
        # the logit interpolation inside it: Newton's last step alone is unchecked (on
        # these piecewise-smooth CDFs it can overshoot within the bracket, by up to 3%
        # measured), the bracket always holds the root.
        hx = _logit(cdf(x), dtype)
        left = hx < hq
        a, ha = jnp.where(left, x, a), jnp.where(left, hx, ha)
        b, hb = jnp.where(left, b, x), jnp.where(left, hb, hx)
        log_t = a + (hq - ha) * (b - a) / jnp.maximum(hb - ha, _MIN_CDF_STEP)
        return jnp.clip(log_t, llo, lhi)

    def illinois(_, state):
        a, b, ha, hb, side = state
        c = secant(a, b, ha, hb)
        hc = _logit(cdf(c), dtype)
        left = hc < hq  # the root lies in [c, b]: c replaces a
        a_new, ha_new = jnp.where(left, c, a), jnp.where(left, hc, ha)
        b_new, hb_new = jnp.where(left, b, c), jnp.where(left, hb, hc)
        # Illinois: when the same end is replaced twice running, halve the other's residual.
        hb_new = jnp.where(left & (side == -1), hq + 0.5 * (hb_new - hq), hb_new)
        ha_new = jnp.where(~left & (side == 1), hq + 0.5 * (ha_new - hq), ha_new)
        return a_new, b_new, ha_new, hb_new, jnp.where(left, -1, 1).astype(side.dtype)

    state = (a, b, ha, hb, jnp.zeros(qs.shape, jnp.int32))
    a, b, ha, hb, _ = jax.lax.fori_loop(0, refine_iters, illinois, state)
    log_t = a + (hq - ha) * (b - a) / jnp.maximum(hb - ha, _MIN_CDF_STEP)
    return jnp.clip(log_t, llo, lhi)


@partial(jax.custom_jvp, nondiff_argnums=(0,))
def implicit_root(cdf: Callable, log_t, theta):
    """Return `log_t` (a root of cdf(log_t, theta) = q found without gradient) with the
    implicit-function-theorem tangent -(dF/dtheta . dtheta) / (dF/dlog t).

    Args:
        cdf: ``cdf(log_t, theta)``, a function defined without closing over traced values
            (use `jax.closure_convert` for a closure).
        log_t: the root, shape (n,); its own tangent is ignored.
        theta: pytree of the CDF's parameters.
    """
    del cdf, theta
    return log_t


@implicit_root.defjvp
def _implicit_root_jvp(cdf, primals, tangents):
    log_t, theta = primals
    _, theta_dot = tangents
    log_t = jax.lax.stop_gradient(log_t)
    _, df = jax.jvp(lambda th: cdf(log_t, th), (theta,), (theta_dot,))
    _, slope = jax.jvp(lambda lt: cdf(lt, theta), (log_t,), (jnp.ones_like(log_t),))
    # The floor keeps the tangent finite where q falls on a flat stretch of the CDF.
    slope = jnp.maximum(slope, _MIN_LOG_SLOPE)
    return log_t, -df / slope


def mixture_quantiles(cdf: Callable, qs, lo, hi, grid_points: int = 24, refine_iters: int = 6):
    """Solve cdf(t) = q for each q in qs (cdf non-decreasing in t > 0), with implicit
    gradients with respect to everything `cdf` closes over.

    Args:
        cdf: maps t of any shape (P,) to CDF values of that shape.
        qs: percentile levels in (0, 1), shape (n,).
        lo, hi: bracket in seconds (answers are clipped to it); not differentiated.
        grid_points: coarse log-spaced grid that brackets every q.
        refine_iters: Illinois steps inside the bracket (superlinear convergence).

    Returns:
        (n,) times.

    Example:
        >>> t = mixture_quantiles(lambda t: 1.0 - jnp.exp(-t), jnp.asarray([0.5]), 1e-3, 1e3)
        >>> bool(jnp.abs(t[0] - jnp.log(2.0)) < 1e-6)
        True
    """
    qs = jnp.asarray(qs, dtype=float)
    llo = jax.lax.stop_gradient(jnp.log(lo))
    lhi = jax.lax.stop_gradient(jnp.log(hi))
    log_cdf, consts = jax.closure_convert(lambda lt: cdf(jnp.exp(lt)), qs)
    # closure_convert fixes the argument's shape, so the search (a grid and steps of
    # other shapes) calls the closure itself; the stop_gradient on its answer drops any
    # tangent that flowed through it.
    log_t = jax.lax.stop_gradient(search(lambda lt: cdf(jnp.exp(lt)), qs, llo, lhi, grid_points, refine_iters,
                                         logit=False))
    return jnp.exp(implicit_root(_ClosedCdf(log_cdf), log_t, tuple(consts)))


class _ClosedCdf:
    """``cdf(log_t, consts)`` from a closure-converted ``f(log_t, *consts)``."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, log_t, consts):
        return self.fn(log_t, *consts)
