"""The split cluster as one vectorised fluid/queueing model.

Designs (Splitwise §V):
* `baseline`: N machines, each running prompts and decodes with mixed continuous
  batching (prompts first), join-the-shortest-queue routing.
* `splitwise`: a prompt pool (Np machines) and a token pool (Nt machines). Prompts go
  to the prompt pool; a prompt is drafted onto a token machine (the paper's mixed
  pool) when the least-loaded prompt machine's queue would pass `draft_pending_tokens`,
  which happens to large prompts in bursts well below saturation. The token machine is
  chosen at arrival and reserves the request's whole KV cache from then on; when the
  token pool's reservations are full the decode runs on a prompt machine (mixed pool
  again). The KV cache moves from the prompt machine to the token machine, serialized
  or layer-wise.

`evaluate` reads as its stages: request classes -> pool flows (who runs where, each
pool's steady state and wait law) -> latency components per route, class and number
of prompt iterations a decode sits through -> percentiles -> throughput, power, cost
and status (docs/cluster.md derives each).

Each pool is a fluid model of continuous batching (pool.py) plus a c-server queue for
prompts (queueing.py). Latency percentiles are percentiles of the mixture over request
classes (prompt size x output size, from the workload) and routes, solved by bisection
with implicit gradients (quantiles.py). Metric definitions follow the reference
simulator (shared/validation/README.md): TTFT ends when the prompt ends (transfer not
included); TBT = (E2E - TTFT) / output tokens per request; slowdowns against the request
alone on one DGX-A100.

Everything is a pure function of pytrees: `evaluate` jits, vmaps over pool sizes, caps,
bandwidths and rates, and differentiates with respect to all of them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.stats import norm

from splitwise_jax.phases import kv_transfer, memory, power
from splitwise_jax.specs.batch import Batch
from splitwise_jax.specs.paper import TABLE_VI_SLO
from splitwise_jax._smooth import safe_div, smooth_max_pos, smooth_min_one, smooth_min_pos, softplus
from splitwise_jax.cluster.pool import PoolState, interruptions_per_step, pool_state, pool_states
from splitwise_jax.cluster.percentiles import (PERCENTILES, Mixture, Resolution, busy_table, busy_wait_moments,
                                     merge_routes, quantiles)
from splitwise_jax.cluster.queueing import Burstiness, WaitModel, burst_size, wait_cdf_busy, wait_model
from splitwise_jax.cluster.workload import Workload
from splitwise_jax.cluster.types import Classes, DecodeRoute, Flows, PromptRoute
from splitwise_jax.cluster.types import Cluster as Cluster
from splitwise_jax.cluster.types import ClusterMetrics as ClusterMetrics
from splitwise_jax.cluster.types import Scheduling as Scheduling
from splitwise_jax.cluster.types import Transfer as Transfer
from splitwise_jax.cluster.types import _kv_capacity_tokens

# Splitwise Table VI: slowdown limits at P50, P90, P99 for TTFT, TBT, E2E (paper.py).
PAPER_SLO = TABLE_VI_SLO


# Components of the count mixture: 0, 1, ..., _EXACT_COUNTS - 1 prompt iterations a
# decode sits through, exactly, plus one lumped component for all larger counts (its
# conditional mean and variance; for long decodes it is the old Gaussian sum).
_EXACT_COUNTS = 4


def _classes(wl: Workload) -> Classes:
    p = jnp.asarray(wl.prompt_tokens, float)
    o = jnp.asarray(wl.output_tokens, float)
    w = jnp.asarray(wl.weights, float)
    wp = jnp.sum(w, axis=1)
    iters = jnp.maximum(o - 1.0, 0.0)
    mean_iters = jnp.sum(w * iters[None, :])
    # Context of a decoding request, averaged over its decode iterations.
    ctx = jnp.sum(w * iters[None, :] * (p[:, None] + 0.5 * o[None, :])) / jnp.maximum(mean_iters, 1e-9)
    return Classes(p, p * p, o, w, wp, iters, mean_iters, ctx)


def _transfer_s(cluster: "Cluster", p, prompt_s):
    tr = cluster.transfer
    nbytes = p * memory.kv_bytes_per_token(cluster.prompt.llm, tr.ignore_gqa)
    return kv_transfer.visible_transfer_s(nbytes, tr.bandwidth_bytes_per_s, tr.setup_s, cluster.prompt.llm.n_layers,
                                          prompt_s, tr.mode)


# Temperature of the smooth max(1 - rho, 0) and min(share, 1) in the drafting law.
_DRAFT_TEMPERATURE = 0.02


def _queue_share(wm: WaitModel, mean_s):
    """Given that an arrival finds every machine of a pool busy (P(wait) = C), the
    chance that the one it is routed to (the least loaded by pending tokens) already
    holds a queue.

    Pending tokens count a running prompt whole and prompt sizes span 100-7,500 tokens,
    so which busy machine is least loaded is about independent of which ones hold a
    queue: the chance is the share of machines with one, E[min(Q, c)] / c ~
    E[Q | wait] / c = rho E[W | wait] / E[S] (Little's law on the queue; rho / (c (1 -
    rho)) for M/M/c), E[W | wait] the diffusion's stationary mean var / (2 (1 - rho)),
    capped at 1 (smoothly; in overload every machine has a queue). Checked on the
    reference's boundary runs (studies/drafting_check.py, docs/cluster.md §4): the share
    of >6k-token prompts drafted is within 1.6x of C rho / (c (1 - rho)) from rho 0.75
    to 0.88 on coding.
    """
    # The floor keeps the mean finite (and its gradient) where deep overload makes the
    # smooth max(1 - rho, 0) underflow; the share is 1 there either way.
    mean_busy_wait = wm.var / jnp.maximum(2.0 * softplus(-wm.drift, _DRAFT_TEMPERATURE), 1e-9)
    return smooth_min_one(wm.rho * mean_busy_wait / jnp.maximum(mean_s, 1e-9), _DRAFT_TEMPERATURE)


def _drafted_share(wm: WaitModel, st: PoolState, cls: Classes, sched: Scheduling, res: Resolution):
    """Share of each prompt class the prompt pool would draft onto token machines.

    SplitwiseSim drafts a prompt of p tokens when the least-loaded prompt machine has a
    queue (P(wait) x `_queue_share`; the earlier "W > E[S]", C exp(-c (1 - rho)) in
    M/M/c, gave 3-300x too few of the largest prompts below saturation) and
    p_running + queued + p > draft_pending_tokens: with JSQ by pending work the
    least-loaded machine holds the work W an arrival waits for, W / tau queued tokens
    (tau = s per prompt token), so P(W > (D - E[p] - p_k) tau | wait). The two events
    are positively correlated (a long queue means every machine has one); their joint
    probability is taken as the smaller (a smooth min).
    """
    mean_p = jnp.dot(cls.wp, cls.p)
    tau = st.mean_prompt_s / jnp.maximum(mean_p, 1.0)
    w_k = softplus(sched.draft_pending_tokens - mean_p - cls.p, 64.0) * tau
    beyond = 1.0 - wait_cdf_busy(w_k, wm, res.window_points)
    return wm.p_wait * smooth_min_pos(_queue_share(wm, st.mean_prompt_s), beyond, 8.0)


# Steps of the bracketing root search in `_fixed_point_01` (after its two end points).
_ROOT_STEPS = 22
# It stops once an evaluated point moved less than this from the one before (then one
# Newton step), or the bracket is narrower than _ROOT_WIDTH.
_ROOT_MOVE = 1e-10
_ROOT_WIDTH = 1e-12
# Drafts per token machine over the window at which the token pool has drained into the
# mixed pool with probability 1 - 1/e (`_splitwise_flows`, step 2b).
_DRAIN_DRAFTS = 6.0


def _fixed_point_01(h):
    """The u in [0, 1] with u = h(u), for h non-increasing with values in [0, 1] (so
    g(u) = u - h(u) rises through zero once): a bracketing search, then one Newton step,
    which also carries the implicit-function gradient.

    The search is regula falsi with the Illinois modification, safeguarded: every third
    step, if the bracket has not halved over the three steps before, the step is a
    bisection (Dekker's rule, relaxed: checked after every step it turned the search into
    a bisection, since regula falsi converges from one side and keeps the far end). It
    stops once an evaluated point moved less than `_ROOT_MOVE` from the one before, or the
    bracket is narrower than `_ROOT_WIDTH`, or after `_ROOT_STEPS` steps; the Newton step
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
        lambda c: (c[0] < 2) | ((c[0] < _ROOT_STEPS + 2) & (c[1][1] - c[1][0] > _ROOT_WIDTH)
                               & (c[1][7] > _ROOT_MOVE)),
        lambda c: (c[0] + 1, step(c[0], c[1])), (jnp.asarray(0), state))
    u0 = jax.lax.stop_gradient(jnp.clip(a - ga * (b - a) / jnp.where(gb - ga > 0, gb - ga, 1.0), a, b))
    val, slope = jax.jvp(g, (u0,), (jnp.ones_like(u0),))
    slope = jax.lax.stop_gradient(jnp.maximum(slope, 1e-6))
    u1 = jnp.clip(u0 - jax.lax.stop_gradient(val) / slope, a, b)
    return u1 - (val - jax.lax.stop_gradient(val)) / slope


def _overflow_share(cls: Classes, lam, m_tok, sojourn, var, capacity):
    """Share f_km of each request class whose reservation finds the token pool full.

    Reservations in flight form an M/G/infinity shot noise; with least-memory routing the
    token machines fill evenly, so a request of m tokens overflows when the pool's free
    memory is below m: f_km = P(R + m_km > capacity), R ~ Normal(mean, var). Large
    requests overflow first (small ones fit in the gaps), and they hold most of the
    memory-time, so overflow is per class. The carried mean solves
    R = lambda sum_km w_km (1 - f_km(R)) m_km s_km; the right side falls as R rises, so
    the root is unique (solved as a share u = R / demand in [0, 1]).

    Measured alternative, not taken: the occupancy reflected below the capacity
    (an Ornstein-Uhlenbeck process's reflected law is the truncated normal, which makes
    the selection of large reservations sharp) matches conversation runs better (HH
    16+6: 8.5% moved vs 9% in the reference, against 30% here) but moved far fewer
    decodes on coding runs near saturation, where the reference's overflow comes in
    cascades (a drafted 7k-token prompt blocks a token machine for 1.3 s and every
    reservation on it waits); over both reference files it agreed on 115 of 124 SLO
    verdicts, as this form does, but with 7 false "meets" instead of 4
    (docs/cluster.md, §4).
    """
    demand = lam * jnp.sum(cls.w * m_tok * sojourn)
    sd = jnp.sqrt(var + 1e-12 * capacity**2)

    def share(u):
        return norm.cdf((u * demand + m_tok - capacity) / sd)

    u = _fixed_point_01(lambda u_: safe_div(lam * jnp.sum(cls.w * (1.0 - share(u_)) * m_tok * sojourn), demand))
    return share(u), u * demand


def _baseline_flows(cluster, cls: Classes, lam, ca2, horizon_s, window_s=None) -> Flows:
    P = cluster.prompt
    n_p = jnp.asarray(cluster.n_prompt, float)
    cap_P = _kv_capacity_tokens(P, cluster) / cls.ctx
    mbt = cluster.scheduling.max_batch_tokens
    st = pool_state(P, n_p, lam, cls.wp, cls.p, cls.p_sq, lam, cls.mean_iters, cls.ctx, cap_P, mbt,
                    window_s=window_s)  # issue 39: decodes over a window that starts empty (pool.window_share)
    wm = wait_model(lam, st.mean_prompt_s, st.scv_prompt, n_p, ca2, horizon_s)
    zero = jnp.zeros_like(cls.p)
    pressure = st.batch_need / cap_P
    burst, burst_var = _own_burst_iters(ca2, st.mean_prompt_s, n_p)
    decode = DecodeRoute(st, jnp.ones_like(cls.w), zero, 0.0, burst, burst_var)
    return Flows((PromptRoute(st, wm, jnp.ones_like(cls.p)),), (decode,),
                 st, None, zero, jnp.asarray(0.0), pressure, (st.rho_prompt, pressure))


def _own_burst_iters(ca2, mean_prompt_s, n_machines):
    """Prompt iterations of a request's own burst that a colocated decode sits through.

    With a trace's burstiness (`Burstiness`, read as Poisson batches of geometric size m
    at the prompt service time, as the wait law reads it), the K requests of the burst
    behind a request (geometric, mean m - 1) are queued across the c machines by fewest
    pending tokens, K / c on each, and on its machine they run before its decode steps
    (prompts first): mean (m - 1) / c, variance m (m - 1) / c^2. A renewal ca^2 (no
    bursts measured): none.
    """
    if not isinstance(ca2, Burstiness):
        return 0.0, 0.0
    m = burst_size(ca2.at(mean_prompt_s))
    c = jnp.maximum(n_machines, 1.0)
    return (m - 1.0) / c, m * (m - 1.0) / c**2


def _splitwise_flows(cluster, cls: Classes, lam, ca2, horizon_s, res: Resolution, window_s=None) -> Flows:
    P, T, sched = cluster.prompt, cluster.token, cluster.scheduling
    n_p = jnp.asarray(cluster.n_prompt, float)
    n_t = jnp.asarray(cluster.n_token, float)
    mbt = sched.max_batch_tokens
    cap_tok_P = _kv_capacity_tokens(P, cluster)
    cap_tok_T = _kv_capacity_tokens(T, cluster)
    cap_P, cap_T = cap_tok_P / cls.ctx, cap_tok_T / cls.ctx
    pool = dict(p_tok=cls.p, p_sq=cls.p_sq, mean_decode_iters=cls.mean_iters, ctx_tokens=cls.ctx,
                max_batch_tokens=mbt, window_s=window_s)  # issue 39: pool.window_share

    # 1. Drafting, from the prompt pool as if it took every prompt and no decodes.
    #    Self-consistent: the prompts drafted away shorten the queue that drafts them, so
    #    the share X solves X = E[x_k(wait law at rate lambda (1 - X))].
    #    A draft converts a token machine unless every token machine already holds a
    #    drafted queue (the same law on the token side; then the request runs wholly on
    #    the least-loaded machine of either pool), which balances the pools in overload.
    st_p0, st_t_alone = pool_states(dict(timing=P, n_machines=n_p, prompt_rate=lam, prompt_w=cls.wp, decode_rate=0.0,
                                         batch_cap=cap_P, **pool),
                                    dict(timing=T, n_machines=n_t, prompt_rate=lam, prompt_w=cls.wp, decode_rate=0.0,
                                         batch_cap=cap_T, **pool))
    t_alone = st_t_alone.prompt_s

    def drafting(n_pp, n_dd):
        """With n_pp machines in the prompt pool and n_dd to draft onto: the drafted share
        (total, per class), the prompt pool's wait law, and the share of requests that
        find the pool past its threshold and every machine to draft onto queued too
        (the reference then runs them on the least-loaded machine of all)."""
        has_t = n_dd / (n_dd + 1e-3)

        def drafted(x_tot):
            wm = wait_model(lam * (1.0 - x_tot), st_p0.mean_prompt_s, st_p0.scv_prompt, n_pp, ca2, horizon_s)
            want = _drafted_share(wm, st_p0, cls, sched, res)
            w_d = safe_div(cls.wp * want, jnp.dot(cls.wp, want)) + 1e-12 * cls.wp
            e_s = jnp.dot(w_d, t_alone) / jnp.sum(w_d)
            scv = jnp.maximum(jnp.dot(w_d, t_alone**2) / jnp.sum(w_d) / e_s**2 - 1.0, 0.0)
            wm_t = wait_model(lam * x_tot, e_s, scv, n_dd, ca2, horizon_s)
            full = wm_t.p_wait * _queue_share(wm_t, e_s)
            return want * (1.0 - full) * has_t, (wm, jnp.dot(cls.wp, want) * full, full)

        x = _fixed_point_01(lambda u: jnp.dot(cls.wp, drafted(u)[0]))
        x_cls, (wm, devolved, full) = drafted(x)
        return x, x_cls, wm, devolved, full

    x_tot, x_k, wm_p0, _, _ = drafting(n_p, n_t)
    w_t = (cls.wp * x_k + 1e-12 * cls.wp) / (x_tot + 1e-12)
    w_p = (cls.wp * (1.0 - x_k) + 1e-12 * cls.wp) / (1.0 - x_tot + 1e-12)

    # 2. Token-pool KV reservations: each request reserves (p + 1 + o) tokens on its
    #    token machine from arrival (the machine is chosen with the prompt's) to its
    #    last token. Sojourn from the prompt pool's wait and the token pool's step time.
    st_t0 = pool_state(T, n_t, lam * x_tot, w_t, decode_rate=lam, batch_cap=1e3 * cap_T, **pool)
    mean_busy, mean_busy_sq = busy_wait_moments(wm_p0, res)
    mean_wait = wm_p0.p_wait * mean_busy
    var_wait = jnp.maximum(wm_p0.p_wait * mean_busy_sq - mean_wait**2, 0.0)
    kv0 = _transfer_s(cluster, cls.p, st_p0.prompt_s)
    sojourn = (mean_wait + st_p0.prompt_s + kv0)[:, None] + cls.iters[None, :] * st_t0.step_s
    m_tok = cls.p[:, None] + 1.0 + cls.o[None, :]
    demand = lam * jnp.sum(cls.w * m_tok * sojourn)
    # Shot noise, plus the queue wait every request in flight shares (a burst that
    # lengthens the prompt queue holds every reservation longer at once).
    var = lam * jnp.sum(cls.w * m_tok**2 * sojourn) + (lam * jnp.sum(cls.w * m_tok))**2 * var_wait
    capacity = n_t * cap_tok_T
    f_km, carried = _overflow_share(cls, lam, m_tok, sojourn, var, capacity)
    f_km = f_km * (n_p / (n_p + 1e-3))
    f = jnp.sum(cls.w * f_km)

    # 2b. The mixed pool's size (docs/cluster.md §4, "The mixed pool"). A prompt machine
    #    that takes an overflowing decode leaves the prompt pool until it is idle again.
    #    Least-memory routing spreads later overflow over every mixed machine, so few
    #    ever empty: their number ratchets up to what the peak overflow needed, the
    #    reservations' peak over the horizon, mean plus sd sqrt(2 ln(1 + T / tau)) (tau
    #    the memory-weighted sojourn, the shot noise's correlation time), less the token
    #    pool's memory. At most 4/5 of the prompt pool, so that some is left to draft from.
    tau = safe_div(lam * jnp.sum(cls.w * m_tok * sojourn**2), demand)
    z_peak = jnp.sqrt(2.0 * jnp.log1p(horizon_s / jnp.maximum(tau, 1e-3)))
    peak = demand + z_peak * jnp.sqrt(var + 1e-12 * capacity**2)
    n_mixed = softplus(peak - capacity, 0.05 * cap_tok_P) / cap_tok_P
    n_mixed = 0.8 * n_p * smooth_min_one(n_mixed / (0.8 * jnp.maximum(n_p, 1e-6)))
    #    The drained token pool (docs/cluster.md §4, "The cascade"). A token machine that
    #    takes a draft leaves the token pool until it is idle, which under load it seldom
    #    is; once every token machine has, each new request's decode goes to the mixed
    #    machine with the least memory, prompt machines converted earlier included, so
    #    decodes spread over the n_mixed + N_t machines by memory whatever the overflow
    #    law says. The chance the pool has drained grows with the drafts per token
    #    machine over the window, z = lambda X T / N_t, as 1 - exp(-z / 6) (the constant
    #    read off the reference's per-request records of five boundary runs).
    drained = -jnp.expm1(-lam * x_tot * horizon_s / jnp.maximum(n_t, 1e-6) / _DRAIN_DRAFTS)
    f_km = f_km + (1.0 - f_km) * drained * n_mixed / jnp.maximum(n_mixed + n_t, 1e-6)
    f = jnp.sum(cls.w * f_km)

    # 3. The pools with their final flows; each pool decodes its own mix of requests
    #    (overflow favours long ones), so its decode length and context are its own.
    def decode_mix(share_km):
        wd = cls.w * share_km
        iters = jnp.sum(wd * cls.iters[None, :])
        ctx = safe_div(jnp.sum(wd * cls.iters[None, :] * (cls.p[:, None] + 0.5 * cls.o[None, :])), iters)
        tot = jnp.sum(wd)
        mean_iters = safe_div(iters, tot)
        # A pool with (nearly) no decodes keeps the workload's means: finite, and unused.
        keep = tot > 1e-9
        return (jnp.where(keep, mean_iters, cls.mean_iters), jnp.where(keep, ctx, cls.ctx))

    it_t, ctx_t = decode_mix(1.0 - f_km)
    it_p, ctx_p = decode_mix(f_km)
    pool_t = dict(pool, mean_decode_iters=it_t, ctx_tokens=ctx_t)
    pool_p = dict(pool, mean_decode_iters=it_p, ctx_tokens=ctx_p)
    st_t, st_p = pool_states(
        dict(timing=T, n_machines=n_t, prompt_rate=lam * x_tot, prompt_w=w_t, decode_rate=lam * (1.0 - f),
             batch_cap=cap_tok_T / ctx_t, **pool_t),
        dict(timing=P, n_machines=n_p, prompt_rate=lam * (1.0 - x_tot), prompt_w=w_p, decode_rate=lam * f,
             batch_cap=cap_tok_P / ctx_p, **pool_p))
    wm_t = wait_model(lam * x_tot, st_t.mean_prompt_s, st_t.scv_prompt, n_t, ca2, horizon_s)
    kv = _transfer_s(cluster, cls.p, st_p.prompt_s)

    # 4. The mixed pool's prompts (docs/cluster.md §4, "The mixed pool"). Its machines
    #    get prompts only when the prompt pool drafts (its least-loaded machine past the
    #    threshold), before any token machine is converted.
    #    The rest of the prompt pool drafts onto the mixed and token machines; a mixed
    #    machine's prompt rate relative to a prompt machine's, d (at least one machine
    #    holds the moved decodes; a machine is never more than fully busy), scales the
    #    prompt interference the moved decodes sit through. A request that finds every
    #    machine to draft onto queued too (`devolved`) runs on the least-loaded machine
    #    of all, a mixed one as likely as any (d = 1 for it).
    n_free = n_p - n_mixed
    x_m, x_mk, _, devolved, full_m = drafting(n_free, n_mixed + n_t)
    d = (x_m / jnp.maximum(n_mixed, 1.0)) / jnp.maximum((1.0 - x_m) / n_free, 1e-9)
    d = d + devolved * (1.0 - d)
    d = smooth_min_pos(d, 1.0 / jnp.maximum(smooth_min_one(st_p.rho_prompt), 1e-3), 8.0)
    events_m = d * st_p.events_per_step
    #    The prompt pool's own queue runs on its free machines: the prompts neither
    #    drafted from them (X_m) nor devolved to a mixed or token machine.
    away = x_m + devolved * (n_mixed + n_t) / (n_p + n_t)
    wm_p = wait_model(lam * (1.0 - away), st_p.mean_prompt_s, st_p.scv_prompt, n_free, ca2, horizon_s)
    #    A prompt routed in the prompt pool runs on a free machine (no decoders: it
    #    neither waits for a decode iteration nor carries decoders) unless it is one of
    #    the mixed machines' share, d n_mixed / (n_free + d n_mixed).
    on_mixed = d * n_mixed / jnp.maximum(n_free + d * n_mixed, 1e-9)
    prompt_routes = (PromptRoute(st_p0, wm_p, 1.0 - x_k, other_state=st_p, other_share=on_mixed),
                     PromptRoute(st_t, wm_t, x_k))
    #    A moved decode arriving at a mixed machine busy with a drafted prompt waits out
    #    the rest of that iteration (PASTA: the chance is the machine's busy share with
    #    drafted prompts, spread over mixed and token machines in proportion to their
    #    numbers, plus the devolved requests; the wait is the residual E[T^2] / 2E[T],
    #    second moment E[T^3] / 3E[T], over the drafted prompts' sizes).
    w_dm = cls.wp * x_mk + 1e-12 * cls.wp
    w_dm = w_dm / jnp.sum(w_dm)
    e_m, e2_m, e3_m = jnp.dot(w_dm, st_p0.prompt_s), jnp.dot(w_dm, st_p0.prompt_s**2), jnp.dot(w_dm, st_p0.prompt_s**3)
    to_mixed = n_mixed / jnp.maximum(n_t + n_mixed, 1e-6)
    busy_m = lam * (x_tot * to_mixed + devolved * n_mixed / (n_p + n_t)) * e_m / jnp.maximum(n_mixed, 1.0)
    #    What a moved decode sits through (docs/cluster.md §4, "Which prompts a moved
    #    decode sits through"). A mixed machine runs the drafted prompts (the large
    #    ones, at the rate above) and the devolved requests (any size); a moved decode
    #    loses that busy share of its time, in events the size of those prompts (too
    #    large to ride along: waited out), so large and rare, not the prompt pool's
    #    many small ones. Where the pools are full (every prompt machine queued, share
    #    full_p; every machine to draft onto queued, full_m; or the whole cluster
    #    saturated with prompts, full_all: Erlang C times the queue share at rate lambda
    #    on all N_p + N_t machines) the mixed machines run the prompt pool's queue like
    #    any of its machines, and their decodes lose what d times a prompt machine's
    #    interference takes: the two blend by 1 - (1 - full_p)(1 - full_m)(1 - full_all).
    r_draft = jnp.maximum(lam * x_tot * to_mixed / jnp.maximum(n_mixed, 1.0), 0.0)
    r_dev = jnp.maximum(lam * devolved / (n_p + n_t), 0.0)
    w_mix = r_draft * w_dm + r_dev * cls.wp + 1e-12 * cls.wp
    ex_m = jnp.dot(w_mix, st_p0.prompt_s) / jnp.sum(w_mix)
    var_m = jnp.maximum(jnp.dot(w_mix, st_p0.prompt_s**2) / jnp.sum(w_mix) - ex_m**2, 0.0)
    lost_full = events_m * st_p.interf_mean_s
    frac_full = lost_full / (st_p.decode_s + lost_full)
    full_p = wm_p.p_wait * _queue_share(wm_p, st_p.mean_prompt_s)
    e_all = (n_p + n_t) / (n_p / st_p0.mean_prompt_s + n_t / jnp.dot(cls.wp, t_alone))
    wm_all = wait_model(lam, e_all, st_p0.scv_prompt, n_p + n_t, ca2, horizon_s)
    full_all = wm_all.p_wait * _queue_share(wm_all, e_all)
    w_full = 1.0 - (1.0 - full_p) * (1.0 - full_m) * (1.0 - full_all)
    frac_m = smooth_min_one((r_draft + r_dev) * ex_m)
    frac_m = frac_m + w_full * (frac_full - frac_m)
    ev_m = interruptions_per_step(frac_m, st_p.decode_s, ex_m)
    st_m = st_p._replace(events_per_step=ev_m, step_s=st_p.decode_s + ev_m * ex_m,
                         interf_mean_s=ex_m, interf_var_s2=var_m)
    decode_routes = (DecodeRoute(st_t, 1.0 - f_km, kv, 0.5 * st_t.decode_s),
                     DecodeRoute(st_m, f_km, kv, 0.5 * st_m.decode_s,
                                 first_busy=busy_m, first_wait_s=e2_m / (2.0 * e_m), first_wait_s2=e3_m / (3.0 * e_m)))
    pressure = (demand + jnp.sum(cls.w * m_tok)) / capacity
    loads = (st_p.rho_prompt, st_t.rho_prompt, st_t.batch_need * ctx_t / cap_tok_T,
             st_p.batch_need * ctx_p / cap_tok_P)
    return Flows(prompt_routes, decode_routes, st_p, st_t, x_k, f, pressure, loads)


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


class Mixtures(NamedTuple):
    """The three latency metrics as mixtures (`percentiles.Mixture`), each in two
    variants: the time and the slowdown."""

    ttft: Mixture
    tbt: Mixture
    e2e: Mixture


def _components(cluster, cls: Classes, flows: Flows, res: Resolution) -> Mixtures:
    """Mixture components of every metric, each over only what it depends on:
    TTFT ends with the prompt: (prompt route, prompt class), with the route's wait.
    TBT has no prompt wait and does not depend on the prompt route: (decode route,
    count of prompt iterations sat through x prompt class x output class).
    E2E: (prompt route x decode route, count x prompt class x output class), with the
    prompt route's wait. Merging identical components leaves every CDF as it was and
    halves (TBT) or all but removes (TTFT) the percentile solver's work."""
    jit_rel = cluster.scheduling.service_jitter_rel
    a_ttft, a_tbt = cluster.alone.alone_s(cls.p, cls.p_sq)
    a_e2e = a_ttft[:, None] + a_tbt[:, None] * cls.iters[None, :]
    o = cls.o[None, None, :]
    decodes = []    # per decode route: decode time, its variance, weight, each (J, K, M)
    for dr in flows.decode_routes:
        st = dr.state
        steps = smooth_min_pos(cls.iters, dr.interfered_steps, 8.0)
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
        dec = (dr.transfer_s[None, :, None] + dr.join_s + cls.iters[None, None, :] * st.decode_s
               + cm * x_mean + dr.burst_iters * st.interf_mean_s)
        dec_var = (cm * x_var + cv * x_mean**2 + dr.burst_iters * st.interf_var_s2
                   + dr.burst_iters_var * st.interf_mean_s**2)
        decodes.append((dec, dec_var, dr.weight * cls.w[None] * cw))
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
    tbt = jnp.stack([dec / o for dec, _, _ in decodes])
    tbt_sd = jnp.stack([jnp.sqrt((jit_rel * dec / o) ** 2 + var / o**2) for dec, var, _ in decodes])
    a_tbt_r = jnp.broadcast_to(a_tbt[None, None, :, None], tbt.shape)
    tbt = Mixture(flat(tbt), flat(tbt_sd), flat(jnp.stack([w_p * w for _, _, w in decodes])),
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


# Quadrature points over a sub-bin for the mean backlog its arrivals find, and the
# temperature (s) of the smooth max(backlog, 0) (a few ms: below one prompt's service).
_BACKLOG_POINTS = 4
_BACKLOG_TEMPERATURE_S = 0.005
# A sub-bin ends "flat out" while its backlog exceeds this fraction of a prompt's
# service time (smoothly: U / (U + edge E[S])); the product of these over a busy stretch
# must stay near 1, so the edge is sharp.
_BUSY_EDGE = 0.02


def _backlog_fluid(rho_sub, capacity, draft_at, service, h, decode_s, n_machines):
    """The prompt pool's fluid backlog over a trace's sub-bins (docs/cluster.md §3c).

    Args: each sub-bin's prompt load (W, S); per window the capacity once drafting
    starts, the backlog (s of work) at which it starts, the mean prompt service time,
    the mean decode's length (each (W,)); the sub-bin length h (s); the prompt pool's
    machines c.

    Returns (W, S): the mean backlog a sub-bin's arrivals find (s of one prompt
    machine's work), the mean wait it means (that work over the drain rate c(U): past
    the drafting threshold the token machines drain it too), and how long the pool
    stays flat out after the sub-bin ends, and the share of the next `decode_s` seconds
    the pool is flat out (an exponential look-ahead over the sub-bins' flat-out shares).
    """
    shape = rho_sub.shape
    per_sub = lambda x: jnp.broadcast_to(x[:, None], shape).reshape(-1)  # noqa: E731
    rho = rho_sub.reshape(-1)
    u = h * (jnp.arange(_BACKLOG_POINTS) + 0.5) / _BACKLOG_POINTS

    def rate(backlog, cap, u_d):
        return 1.0 + (cap - 1.0) * jax.nn.sigmoid((backlog - u_d) / (0.25 * u_d))

    def step(backlog, x):
        r, cap, u_d = x
        c = rate(backlog, cap, u_d)
        ramp = softplus(backlog + (r - c) * u, _BACKLOG_TEMPERATURE_S)
        end = softplus(backlog + (r - c) * h, _BACKLOG_TEMPERATURE_S)
        # The work an arrival finds drains at the rate the pool then has.
        return end, (jnp.mean(ramp), jnp.mean(ramp / rate(ramp, cap, u_d)), end, ramp)

    _, (found, wait, ends, ramps) = jax.lax.scan(step, jnp.asarray(0.0),
                                                 (rho, per_sub(capacity), per_sub(draft_at)))
    busy_end = ends / (ends + _BUSY_EDGE * per_sub(service))
    # Backwards: a busy end lasts the next sub-bin and beyond if that one ends busy too,
    # else until its backlog drains at the next sub-bin's spare rate.
    drain = smooth_min_pos(ends / jnp.maximum(jnp.roll(per_sub(capacity) - rho, -1), 0.05), h, 8.0)

    def back(later, x):
        be, be_next, dr = x
        d = be * ((1.0 - be_next) * dr + be_next * (h + later))
        return d, d

    _, busy_for = jax.lax.scan(back, jnp.asarray(0.0), (busy_end, jnp.roll(busy_end, -1).at[-1].set(0.0), drain),
                               reverse=True)
    # Flat out while a backlog is held, smoothly U / (U + E[S] / c) as the queued share
    # of arrivals (c U / E[S] prompts queued in the pool; `_windowed_components`), per
    # sub-bin the mean over its points; looked ahead with weight e^{-t / decode_s}.
    flat = jnp.mean(ramps / (ramps + per_sub(service / n_machines)[:, None]), axis=1)
    keep = jnp.exp(-h / jnp.maximum(per_sub(decode_s), 1e-3))

    def ahead(later, x):
        f, a = x
        g = (1.0 - a) * f + a * later
        return g, g

    _, flat_ahead = jax.lax.scan(ahead, jnp.asarray(0.0), (flat, keep), reverse=True)
    return found.reshape(shape), wait.reshape(shape), busy_for.reshape(shape), flat_ahead.reshape(shape)


def _windowed_components(cluster, cls: Classes, lam, prof, flows_at, res: Resolution):
    """`_components` for every window of an arrival profile, merged into one mixture:
    each window's routes become routes of the whole, weighted by its share of arrivals.

    Queues carry over as a fluid on the profile's sub-bins (docs/cluster.md §3c): the
    prompt pool's per-machine backlog U (s of work) grows at rho_w x sub_rel - 1 through
    each sub-bin of window w and never falls below zero. Each window's arrivals split in
    two regimes by the backlog their sub-bin finds (smoothly, q = U / (U + E[S] / c):
    c U / E[S] prompts are queued in the pool, and an arrival finds the queue empty
    with chance 1 / (1 + c U / E[S]), a geometric queue length of that mean):
    *queued* arrivals find the arrival-weighted mean U of their sub-bins and wait U / c(U)
    (c the pool's drain rate, token machines included past the drafting threshold),
    while the pool runs flat out (prompt load 1: the decodes sharing its machines sit
    through prompt after prompt); *free* arrivals see the load of their own sub-bins and
    the in-window wait law (bursts shorter than a sub-bin), and their decodes run flat
    out for the share of their length the pool is (a backlog that builds after them).
    """
    share = prof.rate_rel / jnp.sum(prof.rate_rel)
    dt = prof.window_s
    n_sub = prof.sub_rel.shape[1]
    h = dt / n_sub
    bursts = Burstiness(prof.idc, jnp.broadcast_to(prof.idc_scale_s, prof.idc.shape))

    def load(rel, b):
        flows = flows_at(lam * rel, b, dt)
        st = flows.st_p
        # How long a decode on a prompt machine lasts when the pool runs flat out.
        decode_s = cls.mean_iters * _flat_out(st).step_s
        if flows.st_t is None:
            return st.rho_prompt, st.mean_prompt_s, jnp.ones_like(st.rho_prompt), decode_s
        # Splitwise: the prompt pool's load were it to take every prompt, and the
        # capacity the token machines add once drafting starts (each drafts at its own
        # prompt speed), per prompt machine.
        n_p = jnp.asarray(cluster.n_prompt, float)
        speed = jnp.dot(cls.wp, st.prompt_s) / jnp.maximum(jnp.dot(cls.wp, flows.st_t.prompt_s), 1e-9)
        extra = jnp.asarray(cluster.n_token, float) / n_p * speed
        return lam * rel * st.mean_prompt_s / n_p, st.mean_prompt_s, 1.0 + extra, decode_s

    first, service, capacity, decode_s = jax.vmap(load)(prof.rate_rel, bursts)
    # Drafting starts once a prompt would take the least-loaded prompt machine past
    # draft_pending_tokens: that much work (s) per machine less one mean prompt.
    mean_p = jnp.dot(cls.wp, cls.p)
    draft_at = softplus(cluster.scheduling.draft_pending_tokens - mean_p, 64.0) * service / mean_p
    rho_sub = first[:, None] * prof.sub_rel
    n_queue = jnp.maximum(jnp.asarray(cluster.n_prompt, float), 1.0)
    found, found_wait, busy_for, flat_ahead = _backlog_fluid(rho_sub, capacity, draft_at, service, h, decode_s, n_queue)
    queued = found / (found + service[:, None] / n_queue)
    # Flat-out time left after a queued arrival's own wait, from the middle of its sub-bin.
    left = softplus(0.5 * h + busy_for - found_wait, _BACKLOG_TEMPERATURE_S)
    arrivals_q = prof.sub_rel * queued
    arrivals_f = prof.sub_rel * (1.0 - queued)
    share_q = jnp.sum(arrivals_q, axis=1) / n_sub
    mean_over = lambda wts, x: jnp.sum(wts * x, axis=1) / jnp.maximum(jnp.sum(wts, axis=1), 1e-12)  # noqa: E731
    backlog_q, left_q = mean_over(arrivals_q, found_wait), mean_over(arrivals_q, left)
    backlog_f = mean_over(arrivals_f, found_wait)
    # A free arrival's decode runs flat out for the share of its length the pool is.
    flat_f = mean_over(arrivals_f, flat_ahead)
    # Free arrivals see the mean load of their own sub-bins (time-weighted).
    rho_f = mean_over(1.0 - queued, rho_sub)
    safe_first = jnp.maximum(first, 1e-9)

    # Past the drafting threshold on every machine (token machines already drafted), the
    # reference runs a request wholly on the least-loaded machine: a queued arrival's
    # decode then stays on its prompt's machine, flat out like a colocated one (the
    # HH 10+3 code replay: 51 % of decodes on their prompt's machine, ~0.25 s a step).
    whole = jax.nn.sigmoid((mean_over(arrivals_q, found) - draft_at) / (0.25 * draft_at))

    def one(rel, b, w, backlog, sc, waits, flat_w, busy_s, colocated):
        flows = flows_at(lam * rel * sc, b, dt)
        # The backlog is the fluid's, of the prompt pool and the machines drafted to help
        # it: every prompt route finds it; queued arrivals wait it and nothing more.
        prompts = tuple(r._replace(backlog_s=backlog, wait=r.wait._replace(p_wait=r.wait.p_wait * waits))
                        for r in flows.prompt_routes)
        # Flat out, a prompt machine's decoders cannot be avoided by the prompts (every
        # machine holds a queue) and the machine is never idle: each decode step waits
        # through prompt iterations until one carries it (`_flat_out`).
        flat = _flat_out(flows.st_p)
        # Decoders on prompt machines: the colocated pool's; in Splitwise every route but
        # the token pool's (the mixed machines, `_splitwise_flows` step 4).
        on_prompt_machines = ((lambda st: st is flows.st_p) if flows.st_t is None
                              else (lambda st: st is not flows.st_t))
        # A share f of the decode's *time* flat out is a share f/t_flat / (f/t_flat +
        # (1 - f)/t_own) of its *steps* (queued arrivals: f = 1, all of them until the
        # pool drains, `busy_s`).
        def blend(st):
            rate_flat = flat_w / jnp.maximum(flat.step_s, 1e-9)
            phi = safe_div(rate_flat, rate_flat + (1.0 - flat_w) / jnp.maximum(st.step_s, 1e-9))
            return jax.tree_util.tree_map(lambda a, b: (1.0 - phi) * a + phi * b, st, flat)

        decodes = tuple(dr._replace(state=blend(dr.state) if on_prompt_machines(dr.state) else dr.state)
                        for dr in flows.decode_routes)
        decodes = tuple(dr._replace(interfered_steps=busy_s / jnp.maximum(dr.state.step_s, 1e-9)) for dr in decodes)
        if flows.st_t is not None:   # Splitwise: decodes on (the token pool, the prompt pool)
            tok, own = decodes
            decodes = (tok._replace(weight=tok.weight * (1.0 - colocated)),
                       own._replace(weight=own.weight + tok.weight * colocated))
        flows = flows._replace(prompt_routes=prompts, decode_routes=decodes)
        return Mixtures(*(m._replace(weight=m.weight * w) for m in _components(cluster, cls, flows, res)))

    two = lambda a, b: jnp.concatenate([a, b])  # noqa: E731
    per_regime = jax.vmap(one)(
        two(prof.rate_rel, prof.rate_rel), jax.tree_util.tree_map(two, bursts, bursts),
        two(share * (1.0 - share_q), share * share_q), two(backlog_f, backlog_q),
        two(rho_f / safe_first, capacity / safe_first), two(jnp.ones_like(first), jnp.zeros_like(first)),
        two(flat_f, jnp.ones_like(first)), two(jnp.full_like(first, 1e9), left_q), two(jnp.zeros_like(first), whole))
    return Mixtures(*(merge_routes(m) for m in per_regime))


def _flat_out(st: PoolState) -> PoolState:
    """A pool's state for its decoders while its prompt queue never empties: busy 1 and
    no routing around them. A decoder advances in every prompt iteration it rides along
    (the prompt fits next to the batch, a share c of them) and waits out the others, so
    a step spans 1 / c prompt iterations, losing E[X] each (X: a riding iteration less
    the decoder's own step, or the whole of one it cannot ride): step = t_d + E[X] / c,
    at most 4 iterations (`pool.interruptions_per_step`'s cap)."""
    x = jnp.maximum(st.interf_mean_s, 1e-9)
    frac = x / (x + jnp.maximum(st.carry_share, 1e-6) * st.decode_s)   # share of its time lost
    events = interruptions_per_step(frac, st.decode_s, x)
    return st._replace(events_per_step=events, step_s=st.decode_s + events * st.interf_mean_s)


def _pool_power_w(timing, n, st: PoolState, mean_p, mean_p2, ctx):
    busy = smooth_min_one(st.rho_prompt, 0.02)
    decoding = 1.0 - jnp.exp(-st.batch)
    gpu = timing.machine.gpu
    b = jnp.maximum(st.batch, 1.0)
    p_prompt, p_decode = timing.power_w(Batch(prompt_tokens=jnp.stack([mean_p, 0.0]), prompt_seqs=jnp.array([1.0, 0.0]),
                                              prompt_sq_tokens=jnp.stack([mean_p2, 0.0]), decode_seqs=jnp.stack([0.0, b]),
                                              decode_ctx_tokens=jnp.stack([0.0, b * ctx])))
    per_gpu = busy * p_prompt + (1.0 - busy) * (decoding * p_decode + (1.0 - decoding) * gpu.idle_w)
    return n * power.machine_power_w(timing.machine, per_gpu)


def _totals(cluster, cls: Classes, flows: Flows, lam):
    """Throughput (the offered rate, scaled down by the worst saturation), power, cost."""
    worst = flows.loads[0]
    for l_ in flows.loads[1:]:
        worst = smooth_max_pos(worst, l_, 16.0)
    throughput = lam / smooth_max_pos(1.0, worst, 16.0)
    mean_p = jnp.dot(cls.wp, cls.p)
    mean_p2 = jnp.dot(cls.wp, cls.p_sq)
    P, T = cluster.prompt, cluster.token
    n_p = jnp.asarray(cluster.n_prompt, float)
    power_w = _pool_power_w(P, n_p, flows.st_p, mean_p, mean_p2, cls.ctx)
    cost = n_p * P.machine.cost_per_hour
    prov = n_p * power.provisioned_power_w(P.machine, P.cap_frac)
    if flows.st_t is not None:
        n_t = jnp.asarray(cluster.n_token, float)
        power_w = power_w + _pool_power_w(T, n_t, flows.st_t, mean_p, mean_p2, cls.ctx)
        cost = cost + n_t * T.machine.cost_per_hour
        prov = prov + n_t * power.provisioned_power_w(T.machine, T.cap_frac)
    return throughput, power_w, cost, prov


def evaluate(cluster: Cluster, workload: Workload, horizon_s=120.0, slo=PAPER_SLO,
             resolution: Resolution = Resolution()) -> ClusterMetrics:
    """Predict a cluster's latency percentiles, SLO verdict, throughput, power and cost.

    Args:
        cluster: the design, its pool sizes and timings (see `make_cluster`).
        workload: request classes and arrival process.
        horizon_s: length of the arrival window (s); with overload, queues grow for
            this long (finite-window prediction, never infinite).
        slo: (3, 3) slowdown limits, rows TTFT/TBT/E2E, columns P50/P90/P99.
        resolution: numerical resolution (static).

    Returns:
        ClusterMetrics.
    """
    lam = jnp.asarray(workload.rate_per_s, float)
    ca2 = jnp.asarray(workload.arrival_cv2, float)
    cls = _classes(workload)

    prof = workload.profile
    # issue 39: the decoding population over the whole run, started empty and drained
    # (pool.window_share); a trace's windows share one run.
    window = horizon_s if prof is None else prof.window_s * prof.rate_rel.shape[0]

    def flows_at(rate, cv2, horizon):
        if cluster.kind == "baseline":
            return _baseline_flows(cluster, cls, rate, cv2, horizon, window)
        if cluster.kind == "chunked":
            from splitwise_jax.cluster.chunked import chunked_flows  # only chunked designs need it
            return chunked_flows(cluster, cls, rate, cv2, horizon, resolution)
        return _splitwise_flows(cluster, cls, rate, cv2, horizon, resolution, window)

    if prof is None:
        flows = flows_at(lam, ca2, horizon_s)
        stacked = _components(cluster, cls, flows, resolution)
    else:
        # A trace's own arrival curve: the model window by window (each window's rate,
        # burstiness and length), latencies the arrival-weighted mixture over windows.
        # Throughput, power and cost are those of the mean rate.
        mean_idc = jnp.dot(prof.rate_rel, prof.idc) / jnp.sum(prof.rate_rel)  # as the arrivals see it
        flows = flows_at(lam, Burstiness(mean_idc, prof.idc_scale_s), prof.window_s * prof.rate_rel.shape[0])
        stacked = _windowed_components(cluster, cls, lam, prof, flows_at, resolution)
    (ttft, sd_ttft), (tbt, sd_tbt), (e2e, sd_e2e) = (quantiles(m, resolution) for m in stacked)
    slowdowns = jnp.stack([sd_ttft, sd_tbt, sd_e2e])
    margin = jnp.log(jnp.asarray(slo, float) / slowdowns)

    throughput, power_w, cost, prov = _totals(cluster, cls, flows, lam)
    st_p, st_t = flows.st_p, flows.st_t
    rho_t = st_t.rho_prompt if st_t is not None else jnp.asarray(0.0)
    batch_t = st_t.batch if st_t is not None else jnp.asarray(0.0)
    x_tot = jnp.dot(cls.wp, flows.drafted)
    status = (1.0 * (st_p.rho_prompt > 1.0) + 2.0 * (rho_t > 1.0) + 4.0 * (flows.memory_pressure > 1.0)
              + 8.0 * ((x_tot > 0.05) | (flows.moved > 0.05)))
    return ClusterMetrics(
        ttft_s=ttft, tbt_s=tbt, e2e_s=e2e,
        slowdown_ttft=sd_ttft, slowdown_tbt=sd_tbt, slowdown_e2e=sd_e2e,
        slo_margin=margin, meets_slo=jnp.all(margin > 0), throughput_rps=throughput,
        cost_per_hour=cost, power_kw=power_w / 1e3, provisioned_power_kw=prov / 1e3,
        rho_prompt_pool=st_p.rho_prompt, rho_token_pool=rho_t,
        batch_prompt_pool=st_p.batch, batch_token_pool=batch_t, memory_pressure=flows.memory_pressure,
        mixed_prompt_frac=x_tot, mixed_decode_frac=flows.moved, status=status,
    )
