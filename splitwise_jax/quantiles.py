"""Percentiles of mixture distributions, differentiable by the implicit function theorem.

A latency percentile is a percentile of a mixture over request classes (and routes).
We solve F(t) = q by bisection in log t (robust, fixed iteration count, vmappable) and
attach the exact gradient dt/dtheta = -dF/dtheta / dF/dt with one Newton step whose
value is zero (STYLE.md: smooth, differentiable by design; MODELING.md: mixture CDF
inverted by bisection).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

# Slope floor (per unit of log t) when a percentile falls where the CDF is flat, so the
# implicit gradient stays finite; far below any slope met at a real class boundary.
_MIN_LOG_SLOPE = 1e-4


def mixture_quantiles(cdf: Callable, qs, lo: float = 1e-5, hi: float = 1e6, iters: int = 44):
    """Solve cdf(t) = q for each q in qs (cdf must be non-decreasing in t > 0).

    Args:
        cdf: t (array of shape qs.shape) -> CDF values of the same shape.
        qs: percentile levels in (0, 1).
        lo, hi: bracket (the answer is clipped to it). 44 halvings of log(hi/lo) = 25
            give a relative precision of 1.4e-12.
    """
    qs = jnp.asarray(qs, dtype=float)
    llo = jnp.full(qs.shape, jnp.log(lo))
    lhi = jnp.full(qs.shape, jnp.log(hi))

    def body(_, bounds):
        a, b = bounds
        mid = 0.5 * (a + b)
        below = jax.lax.stop_gradient(cdf(jnp.exp(mid))) < qs
        return jnp.where(below, mid, a), jnp.where(below, b, mid)

    a, b = jax.lax.fori_loop(0, iters, body, (llo, lhi))
    log_t0 = jax.lax.stop_gradient(0.5 * (a + b))

    def f_log(lt):
        return cdf(jnp.exp(lt))

    f0, slope = jax.jvp(f_log, (log_t0,), (jnp.ones_like(log_t0),))
    slope = jax.lax.stop_gradient(jnp.maximum(slope, _MIN_LOG_SLOPE))
    log_t = log_t0 - (f0 - jax.lax.stop_gradient(f0)) / slope
    return jnp.exp(log_t)
