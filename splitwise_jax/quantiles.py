"""Percentiles of mixture distributions, differentiable by the implicit function theorem.

A latency percentile is a percentile of a mixture over request classes (and routes).
We solve F(t) = q in log t: a coarse grid brackets each q, Illinois (modified regula
falsi) steps refine inside the bracket, and the exact gradient
dt/dtheta = -dF/dtheta / dF/dt is attached with one Newton step whose value is zero
(STYLE.md: smooth, differentiable by design; MODELING.md: mixture CDF inverted).
"""

from __future__ import annotations

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


def mixture_quantiles(cdf: Callable, qs, lo, hi, grid_points: int = 24, refine_iters: int = 6):
    """Solve cdf(t) = q for each q in qs (cdf non-decreasing in t > 0).

    Args:
        cdf: maps t of shape qs.shape to CDF values of that shape.
        qs: percentile levels in (0, 1), shape (n,).
        lo, hi: bracket in seconds (answers are clipped to it); not differentiated.
        grid_points: coarse log-spaced grid that brackets every q.
        refine_iters: Illinois steps inside the bracket (superlinear convergence).
    """
    qs = jnp.asarray(qs, dtype=float)
    llo = jax.lax.stop_gradient(jnp.log(lo))
    lhi = jax.lax.stop_gradient(jnp.log(hi))
    grid = llo + (lhi - llo) * jnp.linspace(0.0, 1.0, grid_points)

    def f_scalar(lt):
        return cdf(jnp.exp(lt)[None])[0]

    fg = jax.lax.stop_gradient(jax.vmap(f_scalar)(grid))
    idx = jnp.clip(jnp.sum(fg[None, :] < qs[:, None], axis=1), 1, grid_points - 1)
    a, b = grid[idx - 1], grid[idx]
    fa, fb = fg[idx - 1], fg[idx]

    def f_vec(lt):
        return jax.lax.stop_gradient(cdf(jnp.exp(lt)))

    def illinois(_, state):
        a, b, fa, fb, side = state
        c = a + (qs - fa) * (b - a) / jnp.maximum(fb - fa, _MIN_CDF_STEP)
        c = jnp.clip(c, a + 1e-3 * (b - a), b - 1e-3 * (b - a))
        fc = f_vec(c)
        left = fc < qs  # the root lies in [c, b]: c replaces a
        a_new, fa_new = jnp.where(left, c, a), jnp.where(left, fc, fa)
        b_new, fb_new = jnp.where(left, b, c), jnp.where(left, fb, fc)
        # Illinois: when the same end is replaced twice running, halve the other's residual.
        fb_new = jnp.where(left & (side == -1), qs + 0.5 * (fb_new - qs), fb_new)
        fa_new = jnp.where(~left & (side == 1), qs + 0.5 * (fa_new - qs), fa_new)
        return a_new, b_new, fa_new, fb_new, jnp.where(left, -1, 1)

    state = (a, b, fa, fb, jnp.zeros(qs.shape, int))
    state = jax.lax.fori_loop(0, refine_iters, illinois, state)
    a, b, fa, fb, _ = state
    log_t0 = jax.lax.stop_gradient(a + (qs - fa) * (b - a) / jnp.maximum(fb - fa, _MIN_CDF_STEP))
    log_t0 = jnp.clip(log_t0, llo, lhi)

    f0, slope = jax.jvp(lambda lt: cdf(jnp.exp(lt)), (log_t0,), (jnp.ones_like(log_t0),))
    slope = jax.lax.stop_gradient(jnp.maximum(slope, _MIN_LOG_SLOPE))
    log_t = log_t0 - (f0 - jax.lax.stop_gradient(f0)) / slope
    return jnp.exp(log_t)
