"""Latency percentiles of the cluster model's mixtures, and the wait laws they read.

`cluster.evaluate` describes every latency metric as a `Mixture`: per route r and
component i (request class, count of prompt iterations sat through) a deterministic
shift with a small logistic noise, plus the route's prompt wait W_r (an atom at zero and
a tabulated busy-wait CDF):

    F(t) = sum_ri w_ri [(1 - C_r) sigma(1.702 (t s_ri - mu_ri) / sd_ri) + C_r B_r(t s_ri - mu_ri)]

with s = 1 for a time and s = the request's latency alone for a slowdown. This module
tabulates each route's wait law on a log grid and solves F(t) = q for P50/P90/P99
(quantiles.py: one table of F brackets all three, safeguarded Newton steps on logit F refine, implicit
gradients).

Where the time goes (benchmarks/eval_speed.py): a metric has up to
4 routes x 5 counts x 32 x 32 classes = 20,480 components, and F is evaluated
at `grid_points + 3 zoom_points + 3 (refine_iters + 1)` points per metric (the Newton
steps also read its slope). Three choices keep that cheap:

* each evaluation is written as elementwise work on a (points, components) array
  followed by one matrix-vector product with the weights (XLA's CPU reductions of a
  fused elementwise expression ran 3-8x slower than the product);
* the per-component constants (sigmoid slope and offset, the weights split into the
  no-wait and wait parts) are computed once per metric, not per evaluation;
* the search may run in float32 (`Resolution.search_dtype`), the gradient always in the
  caller's precision.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from splitwise_jax._smooth import den_floor
from splitwise_jax.cluster.quantiles import _logit_of, bracket, implicit_root, rebracket, refine
from splitwise_jax.cluster.queueing import WaitModel, drift_at, wait_cdf_busy
from splitwise_jax.cluster.metrics import LEVELS as PERCENTILES
# Logistic scale matching a normal of s.d. 1 at the median: cheaper than erf, as smooth.
_LOGISTIC = 1.702


@dataclasses.dataclass(frozen=True)
class Resolution:
    """Numerical resolution of `evaluate` (static; trades accuracy for speed).

    Attributes:
        window_points: quadrature points over the arrival window.
        table_points: log-spaced points tabulating each pool's wait CDF.
        grid_points: points of the coarse table of each metric's CDF that brackets
            its percentiles.
        zoom_points: points of a second table inside each percentile's bracket.
        refine_iters: safeguarded Newton steps per percentile (on logit F).
        lookup_points: points of the same wait CDF resampled uniformly in sqrt(wait),
            which the percentile solver reads (`BusyTable.fine`). 4,096: in overload
            the table spans ~2,000 s while the mass sits below a few seconds, and 1,024
            points left the resampled CDF 1.8e-3 off the log interpolant there (4,096:
            2.3e-4); a lookup costs the same whatever the table's length.
        search_dtype: precision of the percentile search ("float32", the default, or
            None for the inputs' own); the answer's gradient (implicit) is always in
            the inputs' precision. float32 by default since 2026-12-01, its root then
            polished by one Newton step in the inputs' precision (`_polish`): on the
            Fig. 12 grid closer to a converged float64 solve than the float64 search
            (docs/speed.md §2), and the TBT search 1.7x, the E2E search 1.17x faster
            (SIMD width; the E2E one is bound by its table lookups).
        search_components: a mixture with more than four times
            max(search_components, C / 64) components is searched on a stand-in: with a
            wait table, that many of its heaviest components as they are and the rest
            binned by location (`_stand_in`, 64 bins per route); without one (TBT), all
            of them binned (128 bins). From the stand-in's root, two Newton steps
            on the whole mixture in the search's precision and one in the inputs'; where
            a step ran long (> 1e-3 in log t) or F was flat, the whole mixture's root is
            bracketed narrowly around the stand-in's (`quantiles.rebracket`, which widens
            where it must) and refined (`quantiles.refine`) instead. Either way the
            answer is the whole mixture's root. None searches the whole mixture. E2E
            solve on Splitwise-HH 26+6, coding at 70 req/s (17,920 components): 11.0 ->
            6.7 ms with the heaviest alone, weights renormalised (docs/speed.md §2 item
            8); 8.5 -> 6.6 ms with the stand-in (item 9); 4.4-5.0 -> 3.5-4.0 ms with the
            Newton steps first and 2,048 kept (item 10).
        whole_steps: how the answer of a mixture searched on a stand-in is confirmed.
            None (the default, full resolution): it is the whole mixture's root, as
            above. An integer k: k Newton steps on logit F of the whole mixture in the
            search's precision from the stand-in's root are the answer, with no
            polishing step and no safeguarded search; the sweep resolution
            (`SWEEP_RESOLUTION`, k = 1) for design-space grids. Mixtures searched whole
            (below the stand-in's threshold) are unaffected.
    """

    window_points: int = 8
    table_points: int = 64
    grid_points: int = 16
    zoom_points: int = 8
    refine_iters: int = 3
    lookup_points: int = 4096
    search_dtype: str | None = "float32"
    search_components: int | None = 2048
    whole_steps: int | None = None

    def __post_init__(self):
        w = self.whole_steps
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 0):
            raise ValueError(f"whole_steps must be None or an integer >= 0, got {w!r}")


SWEEP_RESOLUTION = Resolution(whole_steps=1)
"""The sweep resolution, for design-space grids (issue 40 item 3): the percentile search
as at full resolution, its stand-in's root followed by one float32 Newton step on the
whole mixture and taken as the answer (no float64 polish, no safeguarded fallback).
Meant with float32 inputs (``jax.enable_x64(False)``, or arrays cast to float32), which
also run the flows in float32. On the Fig. 12 grid (1,521 clusters, 27,378 percentiles,
`benchmarks/grid_speed.py`) against full resolution in float64: median difference
< 1e-5, largest 1.9 %, about 2x faster (docs/speed.md §12). Final answers (`evaluate`'s
default, the optimiser's check, certification) stay at full resolution."""


class BusyTable(NamedTuple):
    """A route's busy-wait CDF B(x), x >= 0: tabulated on a log grid from 1e-5 s to
    `x_max`, linear in log x between its points and linear to zero below the first.

    That interpolant is the model's wait law. The percentile solver reads it resampled
    on `fine`, a grid uniform in sqrt(x) (index = sqrt(x) * fine_scale, no logarithm):
    a log inside the same loop as the table lookup kept XLA's CPU code scalar, 4x slower
    than the lookup alone. Uniform in sqrt(x) so the first points are fine where the log
    grid is (x_max / L^2) and the last still 2 / L of x_max apart, far finer than the
    log grid's 20-30% steps; the resampled curve differs from the interpolant by
    < 1e-3 (tests/test_percentiles.py).
    """

    p_wait: jax.Array
    log_x0: jax.Array
    dlog: jax.Array
    values: jax.Array
    x_max: jax.Array
    fine: jax.Array        # (L,) B at x_max (l / (L - 1))^2
    fine_scale: jax.Array  # (L - 1) / sqrt(x_max)


class Mixture(NamedTuple):
    """One latency metric as a mixture over routes and components.

    Attributes:
        shift: (R, C) deterministic part of each component (s).
        sd: (R, C) standard deviation of its noise (s).
        weight: (R, C) probabilities (sum to 1 over all routes and components).
        scale: (V, R, C): each of V variants of the metric divides the time by this
            (1 for the time itself, the latency alone for a slowdown).
        wait: per-route wait tables (fields with leading axis R), or None when the
            metric includes no prompt wait (TBT).
    """

    shift: jax.Array
    sd: jax.Array
    weight: jax.Array
    scale: jax.Array
    wait: BusyTable | None


def merge_routes(mix: Mixture) -> Mixture:
    """Mixtures stacked along a leading axis (W, R, ...) as one mixture over all their
    routes (W R); the weights must already carry each one's share."""
    def rows(a):
        return a.reshape((a.shape[0] * a.shape[1],) + a.shape[2:])

    scale = jnp.moveaxis(mix.scale, 0, 1)
    scale = scale.reshape((scale.shape[0], -1) + scale.shape[3:])
    wait = None if mix.wait is None else jax.tree_util.tree_map(rows, mix.wait)
    return Mixture(rows(mix.shift), rows(mix.sd), rows(mix.weight), scale, wait)


def busy_table(wm: WaitModel, res: Resolution) -> BusyTable:
    # Far enough to cover queues growing over the window plus 8 standard deviations.
    # (with a rising load, the drift at the window's end: `queueing.drift_at`)
    last = wm.drift if (wm.rise is None and wm.jump is None) else drift_at(wm, wm.horizon_s)
    x_max = jax.lax.stop_gradient(
        jnp.maximum(last, 0.0) * wm.horizon_s + 8.0 * jnp.sqrt(wm.var * wm.horizon_s)
        + 40.0 * wm.var / jnp.maximum(-wm.drift, 1e-3) + 1e-2 + wm.shift_s + 16.0 * wm.residual_s)
    if wm.cap_s is not None:  # the law ends at the cap (queueing.WaitModel.cap_s)
        x_max = jnp.minimum(x_max, jax.lax.stop_gradient(wm.cap_s + 1e-2 + wm.shift_s + 16.0 * wm.residual_s))
    log_x0 = jnp.log(1e-5)
    dlog = (jnp.log(x_max) - log_x0) / (res.table_points - 1)
    if isinstance(wm.residual_s, float) and wm.residual_s == 0.0:  # no residual (static): the law itself
        xs = jnp.exp(log_x0 + dlog * jnp.arange(res.table_points))
        values = wait_cdf_busy(xs, wm, res.window_points)
    else:
        # The exponential residual (`WaitModel.residual_s`) is convolved on a grid twice
        # as fine, then read at the table's points (its error falls as the step squared:
        # 1.8e-3 -> 4.6e-4 of the CDF on a hypoexponential, tests/test_percentiles.py).
        xs = jnp.exp(log_x0 + 0.5 * dlog * jnp.arange(2 * res.table_points - 1))
        values = with_exponential(xs, wait_cdf_busy(xs, wm, res.window_points), wm.residual_s)[::2]
    n = res.lookup_points
    x_fine = x_max * (jnp.arange(n) / (n - 1.0)) ** 2
    fine = _log_interp(x_fine, log_x0, dlog, values)
    return BusyTable(wm.p_wait, log_x0, dlog, values, x_max, fine, (n - 1.0) / jnp.sqrt(x_max))


def with_exponential(xs, values, mean_s):
    """CDF of Y + E, E exponential of mean `mean_s` independent of Y, at `xs` from Y's
    CDF `values` there (xs increasing and positive; Y's CDF taken linear between the
    points and from 0 at x = 0 to the first). Exact for that piecewise-linear Y: a cell
    [a, b] of slope g adds int_a^b g (1 - exp(-(x - y) / mean)) dy to the CDF at x >= b,

        dG [1 - exp(-(x - b) / mean) phi((b - a) / mean)],   phi(z) = (1 - e^-z) / z,

    so the result is a sum of non-negative terms increasing in x (monotone), equal to Y's
    CDF at mean 0, and its absolute round-off is that of the CDF (no 1 / mean growth)."""
    # Floors in the arrays' precision (`_smooth.den_floor`): at a traced mean of 0 the
    # derivative of 1 / max(mean, 1e-30) overflowed float32 (NaN gradients; 2026-12-07).
    floor = den_floor(jnp.result_type(mean_s, xs))
    lam = 1.0 / jnp.maximum(mean_s, floor)
    lo = jnp.concatenate([jnp.zeros_like(xs[:1]), xs[:-1]])
    d_g = values - jnp.concatenate([jnp.zeros_like(values[:1]), values[:-1]])
    z = jnp.maximum((xs - lo) * lam, floor)
    phi = -jnp.expm1(-z) / z
    gap = xs[:, None] - xs[None, :]                      # x_j - b_i
    below = gap >= 0.0
    kernel = 1.0 - jnp.exp(-lam * jnp.where(below, gap, 0.0)) * phi[None, :]
    return jnp.sum(jnp.where(below, kernel, 0.0) * d_g[None, :], axis=1)


def _log_interp(x, log_x0, dlog, values):
    """The model's wait CDF at x: linear in log x between table points, linear to zero
    below the first, flat beyond the last."""
    n = values.shape[0]
    u = jnp.clip((jnp.log(jnp.maximum(x, 1e-30)) - log_x0) / dlog, 0.0, n - 1.0)
    i = jnp.clip(jnp.floor(u), 0, n - 2).astype(jnp.int32)
    v = values[i] * (1.0 - (u - i)) + values[i + 1] * (u - i)
    x0 = jnp.exp(log_x0)
    return jnp.where(x > x0, v, values[0] * jnp.clip(x / x0, 0.0, 1.0))


class _Params(NamedTuple):
    """What one CDF evaluation reads, computed once per metric variant."""

    slope: jax.Array      # (R C,) 1.702 s / sd
    offset: jax.Array     # (R C,) 1.702 mu / sd
    w_atom: jax.Array     # (R C,) w (1 - C_r)
    scale: jax.Array      # (R C,) s
    shift: jax.Array      # (R C,) mu (s)
    k: jax.Array          # (R C,) the route's sqrt-grid index per sqrt(second)
    w_busy: jax.Array     # (R C,) w C_r
    route: jax.Array      # (R C,) int: the first row of `values` the component reads
    values: jax.Array     # (R L,) every route's wait CDF on its sqrt grid, flattened
    steps: jax.Array      # (R L,) values[l + 1] - values[l]


def _params(mix: Mixture, scale, has_wait: bool) -> _Params:
    r, c = mix.shift.shape
    flat = lambda a: jnp.broadcast_to(a, (r, c)).reshape(-1)  # noqa: E731
    slope = flat(_LOGISTIC * scale / mix.sd)
    offset = flat(_LOGISTIC * mix.shift / mix.sd)
    if not has_wait:
        z = jnp.zeros((1,), slope.dtype)
        return _Params(slope, offset, flat(mix.weight), z, z, z, z, jnp.zeros((1,), jnp.int32), z, z)
    tab = mix.wait
    n = tab.fine.shape[-1]
    c_r = tab.p_wait[:, None]
    route = jnp.broadcast_to(jnp.arange(r, dtype=jnp.int32)[:, None] * n, (r, c)).reshape(-1)
    steps = jnp.concatenate([jnp.diff(tab.fine, axis=-1), jnp.zeros((r, 1), tab.fine.dtype)], axis=-1)
    # x = t s - mu is formed in seconds and scaled to grid units after the square root:
    # folding k^2 (~1e7 / x_max) into s and mu first costs float32 its digits where
    # t s and mu nearly cancel (a 9% TTFT error was measured that way).
    return _Params(slope, offset, flat(mix.weight * (1.0 - c_r)), flat(scale), flat(mix.shift),
                   flat(tab.fine_scale[:, None]), flat(mix.weight * c_r), route, tab.fine.reshape(-1),
                   steps.reshape(-1))


def _busy_lookup(t, p: _Params, n: int):
    """Each component's route wait CDF at x = t s - mu, (P, R C), by the sqrt-grid
    lookup; also that CDF's slope per unit of log t."""
    x = t * p.scale - p.shift
    # The floor keeps sqrt's gradient finite where the wait has not begun (x <= 0).
    root = jnp.sqrt(jnp.maximum(x, 1e-30)) * p.k
    u = jnp.minimum(root, n - 1.0)
    i = jnp.minimum(u.astype(jnp.int32), n - 2)
    j = p.route + i
    step = p.steps.at[j].get(mode="promise_in_bounds")
    value = p.values.at[j].get(mode="promise_in_bounds") + step * (u - i)
    inside = (x > 0) & (root < n - 1.0)
    # du/dlog t = k t s / (2 sqrt x) = k^2 t s / (2 u).
    return value, jnp.where(inside, step * (t * p.scale) * p.k * p.k / (2.0 * root), 0.0)


def _cdf(log_t, p: _Params, n_table: int):
    """F at log-times (P,): elementwise (P, R C), then a product with the weights."""
    t = jnp.exp(log_t)[:, None]
    f = jax.nn.sigmoid(p.slope * t - p.offset) @ p.w_atom
    if n_table:
        f = f + _busy_lookup(t, p, n_table)[0] @ p.w_busy
    return f


def _cdf_slope(log_t, p: _Params, n_table: int):
    """(F, dF/dlog t) at log-times (P,), for the Newton steps of the search."""
    t = jnp.exp(log_t)[:, None]
    s = jax.nn.sigmoid(p.slope * t - p.offset)
    f = s @ p.w_atom
    df = (s * (1.0 - s) * (p.slope * t)) @ p.w_atom
    if n_table:
        value, d_value = _busy_lookup(t, p, n_table)
        f = f + value @ p.w_busy
        df = df + d_value @ p.w_busy
    return f, df


class _Cdf:
    """``cdf(log_t, params)`` for `quantiles.implicit_root` (a hashable static callable)."""

    def __init__(self, n_table: int):
        self.n_table = n_table

    def __call__(self, log_t, p):
        return _cdf(log_t, p, self.n_table)

    def __hash__(self):
        return hash(("percentiles._Cdf", self.n_table))

    def __eq__(self, other):
        return isinstance(other, _Cdf) and other.n_table == self.n_table


def _bracket(mix: Mixture, scale):
    """[lo, hi] in s holding every percentile: below every component's left tail, above
    every right tail plus its route's longest wait. Not differentiated."""
    shift, sd = mix.shift, mix.sd
    extra = 0.0
    if mix.wait is not None:
        # The longest wait: where the route's table reaches its last value (x_max itself
        # is a generous bound, 40 var / |drift| near saturation: the grid would be wasted).
        tab = mix.wait
        n = tab.fine.shape[-1]
        last = jnp.sum(tab.fine < tab.fine[:, -1:] - 1e-12, axis=-1) + 1.0
        longest = tab.x_max * (jnp.minimum(last, n - 1.0) / (n - 1.0)) ** 2
        extra = (longest * (tab.p_wait > 0))[:, None]
    # Components without weight (padding classes, empty routes) must not move the
    # bracket: the search's path, and so its last digits, would depend on them.
    live = mix.weight > 0
    lo = 0.5 * jnp.min(jnp.where(live, jnp.maximum(shift - 6.0 * sd, 0.05 * shift) / scale, jnp.inf))
    hi = 2.0 * jnp.max(jnp.where(live, (shift + 8.0 * sd + extra) / scale, 0.0))
    return jax.lax.stop_gradient(jnp.log(lo)), jax.lax.stop_gradient(jnp.log(hi))


# Newton steps `refine` may add where the bracket around the stand-in's root had to be
# widened by `rebracket`: safeguarded (at worst a bisection every other step), 16 more
# steps halve a bracket of a few units in log t to < 1e-3 at the very worst.
_EXTRA_REFINE = 16


# Bins per route of the components left out of the search's stand-in (`_stand_in`),
# uniform in the log of their location mu / s.
_REST_BINS = 64
# A mixture without a wait table (TBT) is a sum of logistics, which bins merge well by
# their moments: its stand-in is bins alone, this many, no components kept. On the TBT
# mixture of Splitwise-HH coding at 70 req/s (8,960 components, 64 configurations
# 3-40 x 1-30 machines, `lax.map`): 0.58-0.62 -> 0.39-0.47 ms per configuration against
# the whole-mixture search; 32 to 1,024 bins all ran faster than it, 128 fastest, and the
# answers within 7e-10 of a converged solve either way (docs/speed.md §2 item 12).
_NO_WAIT_BINS = 128


def _stand_in(p: _Params, idx, n_table: int, bins: int = _REST_BINS) -> _Params:
    """The search's stand-in for a large mixture: the components `idx` as they are,
    plus every other component merged, per route, into `bins` bins uniform in the log of
    its location mu / s (the time its CDF rises at). A bin keeps its components' total
    weight (no-wait and wait parts), their weighted mean location, and for the logistic
    part their pooled spread (each component's s.d. in t, sd / s = 1.702 / slope, and the
    spread of the locations); for the wait part their weighted mean scale s. So the
    stand-in's weights sum to the whole mixture's and its CDF differs from the whole's
    only by the left-out components' spread within a bin (2-3 % of log t wide); the
    search on it is then corrected on the whole mixture (`quantiles.rebracket`,
    `quantiles.refine`). A mixture without a wait table (n_table = 0) is binned as one
    route and `idx` may be empty (bins alone). Not differentiated (the search's
    parameters are stopped)."""
    n = p.slope.shape[0]
    keep = jnp.zeros((n,), bool).at[idx].set(True)
    w = jnp.where(keep, 0.0, p.w_atom + p.w_busy)
    live = w > 0
    # mu / s; components without weight (padding classes, empty routes) may have
    # sd = 0 and so no finite location: they are kept out of every sum.
    loc = jnp.where(live, p.offset / jnp.where(live, p.slope, 1.0), 1.0)
    loc = jnp.where(jnp.isfinite(loc), loc, 1.0)
    live = live & (loc > 0)
    w = jnp.where(live, w, 0.0)
    log_loc = jnp.log(jnp.maximum(loc, 1e-6))
    lo = jnp.min(jnp.where(live, log_loc, jnp.inf))
    hi = jnp.max(jnp.where(live, log_loc, -jnp.inf))
    lo = jnp.where(jnp.isfinite(lo), lo, 0.0)
    hi = jnp.where(jnp.isfinite(hi), hi, 1.0)
    width = jnp.maximum(hi - lo, 1e-6) / bins
    b = jnp.clip(((log_loc - lo) / width).astype(jnp.int32), 0, bins - 1)
    # A mixture without a wait table is binned as one route (its components differ
    # only in their logistic parts).
    n_routes = p.values.shape[0] // n_table if n_table else 1
    seg = (p.route // n_table) * bins + b if n_table else b
    n_seg = n_routes * bins
    # One scatter of six columns (six scatters of one cost ~5x as much on CPU): the
    # no-wait and wait weights, the weight for the means, and the weighted location,
    # second moment and scale.
    w_atom = jnp.where(keep | ~live, 0.0, p.w_atom)
    w_busy = jnp.where(keep | ~live, 0.0, p.w_busy)
    sd_t = _LOGISTIC / jnp.where(live, p.slope, 1.0)
    cols = jnp.stack([w_atom, w_busy, w, jnp.where(live, w * loc, 0.0), jnp.where(live, w * (sd_t**2 + loc**2), 0.0),
                      jnp.where(live, w * p.scale, 0.0)], axis=-1)
    sums = jax.ops.segment_sum(cols, seg, n_seg)
    w_atom, w_busy, w_tot = sums[:, 0], sums[:, 1], sums[:, 2]
    # Bins with (next to) no weight sit at their centre; the means use the same weights
    # as their totals (float32: weights below ~1e-38 are denormal or zero).
    has = w_tot > 1e-20
    safe = jnp.where(has, w_tot, 1.0)
    centre = jnp.exp(lo + width * (jnp.arange(n_seg) % bins + 0.5))
    loc_b = jnp.where(has, jnp.clip(sums[:, 3] / safe, jnp.exp(lo), jnp.exp(hi)), centre)
    var_b = jnp.where(has, sums[:, 4] / safe - loc_b**2, 0.0)
    sd_b = jnp.sqrt(jnp.maximum(var_b, (1e-3 * loc_b) ** 2))
    slope_b = _LOGISTIC / sd_b
    scale_b = jnp.where(has, sums[:, 5] / safe, 1.0)
    cat = lambda a, c: jnp.concatenate([a[idx], c.astype(a.dtype)])  # noqa: E731
    p_new = p._replace(slope=cat(p.slope, slope_b), offset=cat(p.offset, slope_b * loc_b),
                       w_atom=cat(p.w_atom, w_atom))
    if not n_table:
        return p_new
    route_b = (jnp.arange(n_seg, dtype=jnp.int32) // bins) * n_table
    # Each route's own lookup scale (the same for all its components).
    k_b = jnp.repeat(p.k.reshape(n_routes, -1)[:, 0], bins)
    return p_new._replace(scale=cat(p.scale, scale_b), shift=cat(p.shift, scale_b * loc_b), k=cat(p.k, k_b),
                          w_busy=cat(p.w_busy, w_busy), route=jnp.concatenate([p.route[idx], route_b]))


# Half-width (log t) of the whole mixture's first bracket around the stand-in's root:
# the stand-in's root is within ~1e-3 of the whole's where the left-out components hold
# a few per cent of the weight; `rebracket` widens it where it is not.
_STAND_IN_BRACKET = 2e-3


# Largest polishing step (log t) taken: a float32 search ends within ~1e-6 of where the
# float64 one would (its table and steps read the same CDF to float32's 1.2e-7), so a
# longer step says the search itself had not converged there (a near-flat CDF, up to
# ~1e-4 measured), where the search's own bracket answer is kept.
_POLISH_MAX_STEP = 1e-3


# Newton steps on the whole mixture from the stand-in's root (in the search's precision,
# then one in the inputs'), and the longest step (log t) the first ones may take for the
# result to be accepted without the safeguarded search (`quantiles`): the stand-in's
# root is within ~1e-3 of the whole's (docs/speed.md §2 item 10).
_WHOLE_STEPS = 2
_WHOLE_TOL = 1e-3


def _newton(log_t, qs, p: _Params, n_table: int, llo, lhi):
    """One Newton step on logit F from `log_t` in its precision, clipped to [llo, lhi]:
    (new log t, the step, whether F rises there). No step where F is flat."""
    dtype = log_t.dtype
    f, df = _cdf_slope(log_t, p, n_table)
    # d logit F / d log t = F' / (F (1 - F)), as in the search's own Newton steps.
    dh = df / jnp.maximum(f * (1.0 - f), jnp.finfo(dtype).tiny)
    rising = dh > 0
    step = jnp.where(rising, (_logit_of(qs, dtype) - _logit_of(f, dtype)) / jnp.maximum(dh, 1e-30), 0.0)
    return jnp.clip(log_t + step, llo, lhi), step, rising


def _heaviest(w, k: int, steps: int = 24):
    """Indices of k components with the largest weights w (1-D, float32, >= 0): the
    threshold found by bisection on the count above it, then the components above it
    gathered by their running count. The same set as `jax.lax.top_k(w, k)` up to ties
    and to weights within 2^-steps of the largest (which one of equals is kept does not
    matter: it only seeds the search), at a third of its cost on CPU (1.0 -> 0.3 ms
    for 4,096 of 17,920; a full sort 3.4 ms)."""
    n = w.shape[0]
    hi = jnp.max(w) * (1.0 + 1e-6) + 1e-37
    lo = jnp.zeros((), w.dtype)

    def halve(_, c):
        lo, hi = c
        mid = 0.5 * (lo + hi)
        enough = jnp.sum(w >= mid) >= k
        return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

    lo, hi = jax.lax.fori_loop(0, steps, halve, (lo, hi))
    # Every weight >= hi (fewer than k), then the first of those in [lo, hi) to make k.
    top = w >= hi
    near = (w >= lo) & ~top
    counts = _running_count(jnp.stack([top, near]))
    rank = jnp.where(top, counts[0], counts[0][-1] + counts[1])
    pos = jnp.where((top | near) & (rank <= k), rank - 1, k)
    return jnp.zeros((k,), jnp.int32).at[pos].set(jnp.arange(n, dtype=jnp.int32), mode="drop")


def _running_count(masks, block: int = 128):
    """Inclusive running counts of boolean rows (m, n), as int32: in blocks of `block`,
    one product with a triangular matrix and a short cumulative sum of the block totals
    (XLA's CPU cumsum of 17,920 elements took 2x as long)."""
    m, n = masks.shape
    nb = -(-n // block)
    x = jnp.zeros((m, nb * block), jnp.float32).at[:, :n].set(masks.astype(jnp.float32)).reshape(m, nb, block)
    within = x @ jnp.triu(jnp.ones((block, block), jnp.float32))
    totals = within[..., -1]
    before = jnp.cumsum(totals, axis=-1) - totals
    return (within + before[..., None]).reshape(m, -1)[:, :n].astype(jnp.int32)


def _polish(log_t, qs, p: _Params, n_table: int, max_step: float = _POLISH_MAX_STEP):
    """One Newton step on logit F in the precision of `log_t` and `p` from a root found
    in lower precision (or on part of the mixture): in the inputs' precision the answer
    then no longer depends on float32 rounding (jit and eager, batched and single
    evaluations agree to float64 round-off), and finite differences of it see the
    float64 CDF. A step longer than `max_step` is not taken."""
    moved, step, rising = _newton(log_t, qs, p, n_table, -jnp.inf, jnp.inf)
    return jnp.where(rising & (jnp.abs(step) < max_step), moved, log_t)


def quantiles(mix: Mixture, res: Resolution = Resolution()):
    """P50/P90/P99 of each variant of a mixture.

    Args:
        mix: the metric's mixture (`Mixture`; arrays (R, C), scales (V, R, C)).
        res: numerical resolution (static).

    Returns:
        (V, 3) times (or slowdowns), differentiable with respect to every field of
        `mix` through the implicit function theorem.

    References:
        Splitwise (ISCA 2024) §VI-A: SLOs on P50/P90/P99 of TTFT, TBT and E2E.
    """
    has_wait = mix.wait is not None
    n_table = mix.wait.fine.shape[-1] if has_wait else 0
    cdf = _Cdf(n_table)
    qs = jnp.asarray(PERCENTILES, mix.shift.dtype)
    dtype = mix.shift.dtype
    search_dtype = jnp.dtype(res.search_dtype) if res.search_dtype else dtype

    n_comp = mix.weight.size
    heaviest = None
    if res.search_components is not None:
        n_keep = max(res.search_components, n_comp // 64)
        if n_comp > 4 * n_keep and has_wait:
            # The same components for every variant (their weights are shared).
            w = jax.lax.stop_gradient(mix.weight).reshape(-1).astype(jnp.float32)
            heaviest, bins = _heaviest(w, n_keep), _REST_BINS
        elif n_comp > 4 * n_keep:
            heaviest, bins = jnp.zeros((0,), jnp.int32), _NO_WAIT_BINS

    def setup(scale):
        p = _params(mix, scale, has_wait)
        llo, lhi = _bracket(mix, scale)
        p_fixed = jax.tree_util.tree_map(jax.lax.stop_gradient, p)
        p_search = jax.tree_util.tree_map(
            lambda a: a.astype(search_dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, p_fixed)
        return p, p_fixed, p_search, llo, lhi, llo.astype(search_dtype), lhi.astype(search_dtype)

    q_s = qs.astype(search_dtype)

    def answer(scale, log_t):
        p = _params(mix, scale, has_wait)
        return jnp.exp(implicit_root(cdf, jax.lax.stop_gradient(log_t), p))

    if heaviest is None:
        def one(scale):
            _, p_fixed, p_search, _, _, llo_s, lhi_s = setup(scale)
            full = lambda lt: cdf(lt, p_search)  # noqa: E731
            a, b, ha, hb = bracket(full, q_s, llo_s, lhi_s, res.grid_points, zoom_points=res.zoom_points)
            log_t = refine(full, q_s, a, b, ha, hb, llo_s, lhi_s, res.refine_iters,
                           cdf_slope=lambda lt: _cdf_slope(lt, p_search, n_table)).astype(dtype)
            if search_dtype != dtype:
                log_t = _polish(log_t, qs, p_fixed, n_table)
            return answer(scale, log_t)

        return jax.vmap(one)(mix.scale)

    def stand_in_root(p_search, llo_s, lhi_s):
        """The search (table, zoom, Newton steps) on the stand-in: the heaviest
        components and the rest binned; without a wait table, bins alone."""
        p_part = _stand_in(p_search, heaviest, n_table, bins)
        part = lambda lt: cdf(lt, p_part)  # noqa: E731
        a, b, ha, hb = bracket(part, q_s, llo_s, lhi_s, res.grid_points, zoom_points=res.zoom_points)
        return refine(part, q_s, a, b, ha, hb, llo_s, lhi_s, res.refine_iters,
                      cdf_slope=lambda lt: _cdf_slope(lt, p_part, n_table))

    def whole_steps(x, p_search, llo_s, lhi_s, steps: int):
        """`steps` Newton steps on the whole mixture in the search's precision: (x, the
        last step, whether F rose there). A loop, so that the program holds one copy of
        the whole mixture's CDF for them."""
        return jax.lax.fori_loop(0, steps, lambda _, c: _newton(c[0], q_s, p_search, n_table, llo_s, lhi_s),
                                 (x, jnp.zeros_like(x), jnp.zeros(x.shape, bool)))

    def near(scale):
        """The stand-in's root (the heaviest components and the rest binned; without a
        wait table, bins alone), then
        Newton on the whole mixture from it: two steps in the search's precision, one in
        the inputs'; `short` where every step ended short (the root was near and F rising)."""
        _, p_fixed, p_search, llo, lhi, llo_s, lhi_s = setup(scale)
        x_part = stand_in_root(p_search, llo_s, lhi_s)
        x, step, rising = whole_steps(x_part, p_search, llo_s, lhi_s, _WHOLE_STEPS)
        short = jnp.all(rising & (jnp.abs(step) < _WHOLE_TOL))
        x, step, rising = _newton(x.astype(dtype), qs, p_fixed, n_table, llo, lhi)
        return x, x_part, short & jnp.all(rising & (jnp.abs(step) < _POLISH_MAX_STEP))

    def safeguarded(scale, x_part):
        """The whole mixture's root bracketed around the stand-in's (`quantiles.rebracket`
        widens the bracket where it must) and refined by safeguarded Newton steps."""
        _, p_fixed, p_search, _, _, llo_s, lhi_s = setup(scale)
        full = lambda lt: cdf(lt, p_search)  # noqa: E731
        a0 = jnp.maximum(x_part - _STAND_IN_BRACKET, llo_s)
        b0 = jnp.minimum(x_part + _STAND_IN_BRACKET, lhi_s)
        a, b, ha, hb = rebracket(full, q_s, a0, b0, llo_s, lhi_s)
        # More steps only where the narrow bracket missed the root and had to widen.
        widened = jnp.any((a < a0) | (b > b0))
        log_t = refine(full, q_s, a, b, ha, hb, llo_s, lhi_s, 1,
                       cdf_slope=lambda lt: _cdf_slope(lt, p_search, n_table),
                       max_iters=1 + _EXTRA_REFINE, extra_if=widened)
        return _polish(log_t.astype(dtype), qs, p_fixed, n_table)

    if res.whole_steps is not None:
        def stepped(scale):
            """The stand-in's root and `res.whole_steps` Newton steps on the whole
            mixture in the search's precision: the answer (the sweep resolution)."""
            _, _, p_search, _, _, llo_s, lhi_s = setup(scale)
            x = stand_in_root(p_search, llo_s, lhi_s)
            if res.whole_steps:
                x, _, _ = whole_steps(x, p_search, llo_s, lhi_s, res.whole_steps)
            return answer(scale, x.astype(dtype))

        return jax.vmap(stepped)(mix.scale)

    log_t, x_part, short = jax.vmap(near)(mix.scale)
    # Where a Newton step ran long, every variant takes the safeguarded path: a
    # `while_loop` that runs once at most, so that an evaluation that does not need it
    # never pays for it, and a vmapped batch only when one of its elements does.
    _, log_t = jax.lax.while_loop(
        lambda c: ~c[0], lambda c: (jnp.asarray(True), jax.vmap(safeguarded)(mix.scale, x_part)),
        (jnp.all(short), log_t))
    return jax.vmap(answer)(mix.scale, log_t)


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
