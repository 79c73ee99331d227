"""Latency components: what each request class waits and runs on each route, as mixtures.

`components` turns a design's flows (`types.Flows`: its prompt and decode routes) into
the three latency metrics' mixtures (`Mixtures`: TTFT, TBT, E2E, each over routes,
request classes and the count of prompt iterations a decode sits through), which
`percentiles.quantiles` solves. The count of prompt iterations a decode sits through is
Poisson (its rate from the route's pool state) as `_EXACT_COUNTS` exact atoms and one
lumped tail (`_count_mixture`). docs/cluster.md §5-6 derives each term.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from splitwise_jax._smooth import safe_div, smooth_min_one, smooth_min_pos
from splitwise_jax.cluster.percentiles import Mixture, Resolution, busy_table
from splitwise_jax.cluster.pool import window_share
from splitwise_jax.cluster.types import Classes, Flows

# Components of the count mixture: 0, 1, ..., _EXACT_COUNTS - 1 prompt iterations a
# decode sits through, exactly, plus one lumped component for all larger counts (its
# conditional mean and variance; for long decodes it is the old Gaussian sum).
_EXACT_COUNTS = 4


def _count_mixture(lam):
    """Poisson(lam) as _EXACT_COUNTS exact atoms plus one lumped tail: weights, means and
    variances of the count, each (_EXACT_COUNTS + 1, *lam.shape).

    Tail moments from E[N 1{N >= a}] = lam P(N >= a - 1) and
    E[N(N - 1) 1{N >= a}] = lam^2 P(N >= a - 2), with P(N >= a) from `_poisson_tails`.
    """
    a = _EXACT_COUNTS
    n = jnp.arange(a, dtype=lam.dtype).reshape((a,) + (1,) * lam.ndim)
    log_lam = jnp.log(jnp.maximum(lam, 1e-30))
    exact = jnp.exp(n * log_lam - lam - jax.scipy.special.gammaln(n + 1.0))
    tail_2, tail_1, tail = _poisson_tails(lam, exact)
    m1 = lam * tail_1
    m2 = lam**2 * tail_2 + m1
    # The tail's own moments only where tail**2 stays a normal number: the gradient of
    # m / tail is -m / tail**2, whose square underflows in float32 below ~1e-19 (inf
    # times a zero cotangent is NaN). Below that the tail weighs < 1e-16 and sits at a.
    ok = tail > _tail_floor(lam.dtype)
    safe_tail = jnp.where(ok, tail, 1.0)
    mean_t = jnp.where(ok, jnp.maximum(m1 / safe_tail, a), float(a))
    var_t = jnp.where(ok, jnp.maximum(m2 / safe_tail - mean_t**2, 0.0), 0.0)
    weights = jnp.concatenate([exact, tail[None]], axis=0)
    means = jnp.concatenate([jnp.broadcast_to(n, exact.shape), mean_t[None]], axis=0)
    variances = jnp.concatenate([jnp.zeros_like(exact), var_t[None]], axis=0)
    return weights, means, variances


def _tail_floor(dtype) -> float:
    """Smallest lumped tail weight given its own mean and variance: 1e-30 in float64,
    1e-16 in float32 (1e3 x the square root of the smallest normal number, so that the
    tail squared, in the gradient of m / tail, stays normal)."""
    return max(1e-30, 1e3 * float(jnp.finfo(dtype).tiny) ** 0.5)


# Below this mean the tail P(N >= _EXACT_COUNTS) is summed as a series (its terms fall
# by lam / n <= 1/8 each, so 16 terms reach 1e-16 of it); above, 1 - P(N < a) loses at
# most 1e-16 / P(N >= 4 | lam = 0.5) ~ 6e-14 of it to cancellation.
_SERIES_BELOW = 0.5
_SERIES_TERMS = 16


def _poisson_tails(lam, exact):
    """P(N >= a - 2), P(N >= a - 1), P(N >= a) for N ~ Poisson(lam), a = _EXACT_COUNTS,
    given the atoms P(N = n), n < a: gammainc(a - k, lam) for integer shapes at a
    hundredth of its cost (jax's gammainc iterates a series or continued fraction,
    ~0.5 us per element in float64, and dominated the count mixture)."""
    a = _EXACT_COUNTS
    small = lam < _SERIES_BELOW
    lam_s = jnp.where(small, lam, _SERIES_BELOW)  # safe mask: the untaken branch stays finite
    k = jnp.arange(a, a + _SERIES_TERMS, dtype=lam.dtype).reshape((-1,) + (1,) * lam.ndim)
    terms = jnp.exp(k * jnp.log(jnp.maximum(lam_s, 1e-30)) - lam_s - jax.scipy.special.gammaln(k + 1.0))
    tail = jnp.maximum(jnp.where(small, jnp.sum(terms, axis=0), 1.0 - jnp.sum(exact, axis=0)), 0.0)
    tail_1 = tail + exact[a - 1]
    return tail_1 + exact[a - 2], tail_1, tail


# The batch a decode sees depends on when it arrives in a run that starts empty and
# drains (`arrival_profile`): on by default (issue 39, twenty-ninth session).
ARRIVAL_PROFILE = True
# Gauss-Legendre nodes and weights on [0, 1] for the arrival time (4 points).
_GL_X = (0.0694318442029737, 0.3300094782075719, 0.6699905217924281, 0.9305681557970263)
_GL_W = (0.1739274225687269, 0.3260725774312731, 0.3260725774312731, 0.1739274225687269)
# Time steps of the decoding population's fluid equation (`arrival_profile`).
_PROFILE_POINTS = 64
# Relative excess of the batch Little's law asks for over the one the pool holds (a
# memory- or slot-capped pool) over which the profile fades out.
_CAPPED_WIDTH = 0.05


def arrival_profile(st, cls: Classes, window_s):
    """Weights (A,) and the decode-only step's ratio (A, M) for A arrival times.

    The pool's batch B (`pool.window_share`) is what a decode step sees on average over
    a run whose arrivals start empty at 0, stop at T = `window_s` and drain. A decode
    that arrives at t and stays S sees the mean of the population over [t, t + S]: less
    than B at the start, more mid-window. The population follows the fluid equation

        dB/du = Lambda 1[u < T] - B / R(B),   R(B) = I (t_s + (B - B_w) dt_d/dB),

    (Lambda the decodes per second and I the mean decode iterations per machine, t_s the
    step at the pool's batch B_w, dt_d/dB the pool's `decode_slope_s`): where the step
    grows with the batch, the residence does too and the population climbs above
    Lambda R(B_w). It is integrated on `_PROFILE_POINTS` steps over [0, T + the longest
    residence], each step exact for its own R (an exponential approach to Lambda R). The
    percentiles are over requests, which arrive uniformly over [0, T]: 4 Gauss-Legendre
    arrival times; a decode of output class m stays S_m = iters_m t_s; its decode-only
    iteration at the population b it sees is t_d + (b - B_w) dt_d/dB (both at max(., 1)
    decoders). After T the population decays at its own pace (no arrivals). Faded out
    where the pool's batch is not Little's law's at its step (held below it by a full
    memory or batch slots, or set by a memory-full baseline's admissions: the population
    sits at its cap through most of the window). Measured in our simulator
    (docs/validation.md, twenty-ninth session): Splitwise-HHcap 24 + 16, BLOOM-176B conversation at 0.42 of capacity, the token
    machines hold 45.9 decoders over 20-120 s where the model's window mean is 41.1.
    """
    lam_i = st.batch_need / jnp.maximum(st.step_s * window_share(cls.mean_iters * st.step_s, window_s), 1e-12)
    lam = lam_i / jnp.maximum(cls.mean_iters, 1e-9)                          # Lambda
    b_w = jnp.maximum(st.batch, 1.0)

    def step_at(b):
        return jnp.maximum(st.step_s + st.decode_slope_s * (jnp.maximum(b, 1.0) - b_w), 0.5 * st.step_s)

    s_m = jnp.maximum(cls.iters * st.step_s, 1e-9)                           # (M,) residence
    horizon = window_s + jnp.max(s_m)
    h = horizon / _PROFILE_POINTS

    def advance(b, u):
        big_r = jnp.maximum(cls.mean_iters * step_at(b), 1e-9)
        arriving = jnp.clip((window_s - u) / h, 0.0, 1.0)
        b_eq = lam * arriving * big_r
        nxt = b_eq + (b - b_eq) * jnp.exp(-h / big_r)
        return nxt, nxt

    u = h * jnp.arange(_PROFILE_POINTS, dtype=s_m.dtype)
    _, path = jax.lax.scan(advance, jnp.zeros((), s_m.dtype), u)
    pop = jnp.concatenate([jnp.zeros((1,), s_m.dtype), path])                # B at u_0..u_N
    cum = jnp.concatenate([jnp.zeros((1,), s_m.dtype), jnp.cumsum(0.5 * h * (pop[1:] + pop[:-1]))])
    t = window_s * jnp.asarray(_GL_X, s_m.dtype)[:, None]                    # (A, 1)

    def at(x):  # `cum` read on its uniform grid, linearly (no search)
        pos = jnp.clip(x / h, 0.0, float(_PROFILE_POINTS))
        i = jnp.minimum(jnp.floor(pos), _PROFILE_POINTS - 1.0)
        lo = jnp.take(cum, i.astype(jnp.int32))
        return lo + (pos - i) * (jnp.take(cum, i.astype(jnp.int32) + 1) - lo)

    seen = (at(t + s_m) - at(t)) / s_m                                       # (A, M)
    ratio = 1.0 + st.decode_slope_s * (jnp.maximum(seen, 1.0) - b_w) / jnp.maximum(st.decode_s, 1e-12)
    capped = jnp.exp(-jnp.abs(st.batch_need / jnp.maximum(st.batch, 1e-12) - 1.0) / _CAPPED_WIDTH)
    ratio = 1.0 + capped * (jnp.maximum(ratio, 0.0) - 1.0)
    return jnp.asarray(_GL_W, s_m.dtype), ratio


class Mixtures(NamedTuple):
    """The three latency metrics as mixtures (`percentiles.Mixture`), each in two
    variants: the time and the slowdown."""

    ttft: Mixture
    tbt: Mixture
    e2e: Mixture


def components(cluster, cls: Classes, flows: Flows, res: Resolution, window_s=None) -> Mixtures:
    """Mixture components of every metric, each over only what it depends on:
    TTFT ends with the prompt: (prompt route, prompt class), with the route's wait.
    TBT has no prompt wait and does not depend on the prompt route: (decode route,
    count of prompt iterations sat through x prompt class x output class).
    E2E: (prompt route x decode route, count x prompt class x output class), with the
    prompt route's wait. Merging identical components leaves every CDF as it was and
    halves (TBT) or all but removes (TTFT) the percentile solver's work.

    With `window_s` (a run of Poisson arrivals over that window, `ARRIVAL_PROFILE`)
    TBT's count axis also runs over the arrival times of `arrival_profile`."""
    jit_rel = cluster.scheduling.service_jitter_rel
    a_ttft, a_tbt = cluster.alone.alone_s(cls.p, cls.p_sq)
    a_e2e = a_ttft[:, None] + a_tbt[:, None] * cls.iters[None, :]
    o = cls.o[None, None, :]
    decodes = []    # per decode route: decode time, its variance, weight, each (J, K, M)
    by_arrival = []  # the same over (arrival time, count) for TBT (`arrival_profile`)
    for dr in flows.decode_routes:
        st = dr.state
        steps = smooth_min_pos(cls.iters * dr.interfered_share, dr.interfered_steps, 8.0)
        lam = steps[None, :] * st.events_per_step * jnp.ones_like(cls.p)[:, None]         # (K, M)
        # The first step's wait joins the count as one more Poisson event whose chance
        # of at least one is `first_busy` (mean -log(1 - b)); each event costs the blend
        # of an interruption and a residual iteration by their expected numbers (for a
        # short decode the residual dominates, for a long one the interruptions).
        mu_1 = -jnp.log1p(-0.95 * jnp.maximum(smooth_min_one(jnp.asarray(dr.first_busy, float)), 0.0))
        lam_all = lam + mu_1
        share_1 = safe_div(mu_1, lam_all)
        x_mean = st.interf_mean_s + share_1 * (dr.first_wait_s - st.interf_mean_s)
        x_sq = (st.interf_var_s2 + st.interf_mean_s**2
                + share_1 * (dr.first_wait_s2 - st.interf_var_s2 - st.interf_mean_s**2))
        x_var = jnp.maximum(x_sq - x_mean**2, 0.0)
        cw, cm, cv = _count_mixture(lam_all)                                              # (J, K, M)
        rest = dr.transfer_s[None, :, None] + dr.join_s + cm * x_mean + dr.burst_iters * st.interf_mean_s
        dec_var = (cm * x_var + cv * x_mean**2 + dr.burst_iters * st.interf_var_s2
                   + dr.burst_iters_var * st.interf_mean_s**2
                   + dr.interfered_var * (st.events_per_step * st.interf_mean_s)**2 + dr.join_var_s2)
        weight = dr.weight * cls.w[None] * cw
        decodes.append((rest + cls.iters[None, None, :] * st.decode_s, dec_var, weight))
        if window_s is None or not ARRIVAL_PROFILE:
            by_arrival.append(decodes[-1])
            continue
        # TBT: the count axis runs over (arrival time, count), (A J, K, M). E2E keeps
        # the window's mean population (docs/cluster.md §2, *When a decode arrives*).
        gl_w, ratio = arrival_profile(st, cls, window_s)
        steps = cls.iters[None, :] * st.decode_s * ratio                                  # (A, M)
        shape = (gl_w.shape[0],) + rest.shape
        dec_a = (rest[None] + steps[:, None, None, :]).reshape((-1,) + rest.shape[1:])
        var_a = jnp.broadcast_to(dec_var, shape).reshape(dec_a.shape)
        w_a = (gl_w[:, None, None, None] * jnp.broadcast_to(weight, shape)).reshape(dec_a.shape)
        by_arrival.append((dec_a, var_a, w_a))
    prompts, ttft_parts = [], []
    for pr in flows.prompt_routes:
        s_k = pr.backlog_s + pr.state.residual_s + pr.state.prompt_s
        tab = busy_table(pr.wait, res)
        if pr.other_state is None:
            ttft_parts.append((s_k, pr.weight, tab))
        else:
            s_o = pr.backlog_s + pr.other_state.residual_s + pr.other_state.prompt_s
            ttft_parts += [(s_k, pr.weight * (1.0 - pr.other_share), tab), (s_o, pr.weight * pr.other_share, tab)]
            s_k = s_k + pr.other_share * (s_o - s_k)
        prompts.append((s_k, pr.weight, tab))
    stack = lambda *xs: jnp.stack(xs)  # noqa: E731
    flat = lambda x: x.reshape(x.shape[0], -1)  # noqa: E731

    # TTFT: weights summed over decode routes, counts and output classes.
    w_k = sum(jnp.sum(w, axis=(0, 2)) for _, _, w in decodes)
    s = jnp.stack([jnp.broadcast_to(s_k, cls.p.shape) for s_k, _, _ in ttft_parts])
    ttft = Mixture(s, jit_rel * s, jnp.stack([pw * w_k for _, pw, _ in ttft_parts]),
                   jnp.stack([jnp.ones_like(s), jnp.broadcast_to(a_ttft, s.shape)]),
                   jax.tree_util.tree_map(stack, *[tab for _, _, tab in ttft_parts]))

    # TBT: every prompt route's share summed.
    w_p = sum(pw for _, pw, _ in prompts)[None, :, None]
    tbt = jnp.stack([dec / o for dec, _, _ in by_arrival])
    tbt_sd = jnp.stack([jnp.sqrt((jit_rel * dec / o) ** 2 + var / o**2) for dec, var, _ in by_arrival])
    a_tbt_r = jnp.broadcast_to(a_tbt[None, None, :, None], tbt.shape)
    tbt = Mixture(flat(tbt), flat(tbt_sd), flat(jnp.stack([w_p * w for _, _, w in by_arrival])),
                  jnp.stack([jnp.ones_like(flat(tbt)), flat(a_tbt_r)]), None)

    # E2E: every (prompt route, decode route) pair with its prompt route's wait.
    e2e, e2e_sd, w_e2e, tabs = [], [], [], []
    for s_k, pw, tab in prompts:
        for dec, var, w in decodes:
            e = s_k[None, :, None] + dec
            e2e.append(e)
            e2e_sd.append(jnp.sqrt((jit_rel * e) ** 2 + var))
            w_e2e.append(pw[None, :, None] * w)
            tabs.append(tab)
    e2e = flat(jnp.stack(e2e))
    a_e2e_r = flat(jnp.broadcast_to(a_e2e[None, None], (len(tabs),) + decodes[0][0].shape))
    e2e = Mixture(e2e, flat(jnp.stack(e2e_sd)), flat(jnp.stack(w_e2e)), jnp.stack([jnp.ones_like(e2e), a_e2e_r]),
                  jax.tree_util.tree_map(stack, *tabs))
    return Mixtures(ttft, tbt, e2e)
