"""Latency percentiles of the cluster model's mixtures, and the wait laws they read.

`cluster.evaluate` describes every latency metric as a mixture: per route, component
(count of prompt iterations sat through x prompt class) and output class, a
deterministic shift with a small logistic noise, plus the route's prompt wait (an atom
at zero and a tabulated busy-wait CDF). This module tabulates each route's wait law on
a log grid and solves the mixture CDF for P50/P90/P99 (quantiles.py: bracketing,
Illinois refinement, implicit gradients).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from splitwise_jax.quantiles import mixture_quantiles
from splitwise_jax.queueing import WaitModel, wait_cdf_busy

PERCENTILES = (0.5, 0.9, 0.99)


@dataclasses.dataclass(frozen=True)
class Resolution:
    """Numerical resolution of `evaluate` (static; trades accuracy for speed).

    Attributes:
        window_points: quadrature points over the arrival window.
        table_points: log-spaced points tabulating each pool's wait CDF.
        grid_points: coarse grid that brackets each percentile.
        refine_iters: Illinois refinement steps per percentile.
    """

    window_points: int = 8
    table_points: int = 64
    grid_points: int = 24
    refine_iters: int = 6


class BusyTable(NamedTuple):
    """A route's busy-wait CDF tabulated on a log grid (interpolated per component)."""

    p_wait: jax.Array
    log_x0: jax.Array
    dlog: jax.Array
    values: jax.Array
    x_max: jax.Array


def busy_table(wm: WaitModel, res: Resolution) -> BusyTable:
    # Far enough to cover queues growing over the window plus 8 standard deviations.
    x_max = jax.lax.stop_gradient(
        jnp.maximum(wm.drift, 0.0) * wm.horizon_s + 8.0 * jnp.sqrt(wm.var * wm.horizon_s)
        + 40.0 * wm.var / jnp.maximum(-wm.drift, 1e-3) + 1e-2)
    log_x0 = jnp.log(1e-5)
    dlog = (jnp.log(x_max) - log_x0) / (res.table_points - 1)
    xs = jnp.exp(log_x0 + dlog * jnp.arange(res.table_points))
    return BusyTable(wm.p_wait, log_x0, dlog, wait_cdf_busy(xs, wm, res.window_points), x_max)


def _busy_cdf(x, tab: BusyTable):
    n = tab.values.shape[0]
    u = jnp.clip((jnp.log(jnp.maximum(x, 1e-30)) - tab.log_x0) / tab.dlog, 0.0, n - 1.0)
    i = jnp.clip(jnp.floor(u), 0, n - 2).astype(int)
    frac = u - i
    v = tab.values[i] * (1.0 - frac) + tab.values[i + 1] * frac
    below = jnp.clip(x / jnp.exp(tab.log_x0), 0.0, 1.0)  # linear to zero under the grid
    return jnp.where(x > jnp.exp(tab.log_x0), v, tab.values[0] * below)


def quantiles(shift, sd, weight, scale, tabs: BusyTable, res: Resolution):
    """P50/P90/P99 of sum_j weight_j P((W_r + shift_j + noise_j) / scale_j <= t).

    Arrays are (R, C, M): routes x components x output classes; `tabs` holds each
    route's wait law. The noise is logistic with the scale of a normal of s.d. `sd`
    (1.702 matches the normal's slope at the median): cheaper than erf, equally smooth.
    """

    def cdf_one(t):
        x = t * scale - shift
        atom = jax.nn.sigmoid(1.702 * x / sd)
        busy = jax.vmap(_busy_cdf)(x, tabs)
        c = tabs.p_wait[:, None, None]
        return jnp.sum(weight * ((1.0 - c) * atom + c * busy))

    def cdf(ts):
        return jax.vmap(cdf_one)(ts)

    extra = tabs.x_max[:, None, None] * (tabs.p_wait[:, None, None] > 0)
    lo = 0.5 * jnp.min(jnp.maximum(shift - 6.0 * sd, 0.05 * shift) / scale)
    hi = 2.0 * jnp.max((shift + 8.0 * sd + extra) / scale)
    return mixture_quantiles(cdf, jnp.asarray(PERCENTILES), lo, hi, res.grid_points, res.refine_iters)


def busy_wait_moments(wm: WaitModel, res: Resolution):
    """E[W] and E[W^2] given that the arrival waits, integrating the tabulated survival
    function (E[W^2] = integral of 2 x P(W > x))."""
    tab = busy_table(wm, res)
    xs = jnp.exp(tab.log_x0 + tab.dlog * jnp.arange(tab.values.shape[0]))
    surv = 1.0 - tab.values
    dx = jnp.diff(xs)
    m1 = jnp.sum(0.5 * (surv[1:] + surv[:-1]) * dx)
    m2 = jnp.sum((xs[1:] * surv[1:] + xs[:-1] * surv[:-1]) * dx)
    return m1, m2
