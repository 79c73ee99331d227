"""Splitwise's flows: a prompt pool, a token pool and the mixed pool between them.

Prompts go to the prompt pool; a prompt is drafted onto a token machine (the paper's
mixed pool) when the least-loaded prompt machine's queue would pass
`draft_pending_tokens`, which happens to large prompts in bursts well below saturation.
The token machine is chosen at arrival and reserves the request's whole KV cache from
then on; when the token pool's reservations are full the decode runs on a prompt
machine (mixed pool again). The KV cache moves from the prompt machine to the token
machine, serialized or layer-wise.

`splitwise_flows` reads as its steps (docs/cluster.md §4 derives each):

1. `_step1_drafting`: the share of each prompt class drafted onto token machines, a
   fixed point of the prompt pool's wait law;
2. `_step2_reservations`: the token pool's KV reservations and the share of each class
   that overflows onto prompt machines;
2b. `_step2b_mixed_pool`: how many prompt machines hold moved decodes (the mixed pool),
   and the drained token pool's cascade;
3. `_step3_pools`: both pools' steady states with their final flows;
4. `_step4_prompt_routes`: the prompt pool's own queue, on its free machines (waiting
   for KV memory too where the moved decodes fill it: `_memory_bound`), and the share
   of its prompts that run on mixed machines;
4b. `_step4b_decode_routes`: what a decode on a token machine and a moved decode on a
   mixed machine sit through;
5. `_step5_memory_drafting` (`MEMORY_DRAFTS`, off): where the moved decodes fill the
   prompt machines' KV memory, drafting read again at the queue that memory makes,
   steps 2-4 again with those drafts, and every prompt waiting that queue
   (`_step5b_memory_waits`).

References:
    Patel et al., Splitwise, ISCA 2024 §IV-C (the mixed pool), §V; SplitwiseSim's
    scheduler (shared/validation/README.md).
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.special import log_ndtr
from jax.scipy.stats import norm

from splitwise_jax._roots import fixed_point_01
from splitwise_jax._smooth import safe_div, smooth_min_one, smooth_min_pos, softplus
from splitwise_jax.cluster import memory_wait
from splitwise_jax.cluster.balking import balking
from splitwise_jax.cluster.percentiles import Resolution, busy_wait_moments
from splitwise_jax.cluster.pool import PoolState, interruptions_per_step, pool_state, pool_states
from splitwise_jax.cluster.queueing import (EXACT_C_PROMPT_POOL, ROUTED_RESIDUAL_SHARE_PROMPT_POOL, WaitModel,
                                           wait_cdf_busy, wait_model)
from splitwise_jax.cluster.strategy import DesignStrategy
from splitwise_jax.cluster.types import Classes, DecodeRoute, Flows, PromptRoute, Scheduling, _kv_capacity_tokens
from splitwise_jax.phases import kv_transfer, memory

# Temperature of the smooth max(1 - rho, 0) and min(share, 1) in the drafting law.
_DRAFT_TEMPERATURE = 0.02
# The drafting law: the regime of a pool that drafts (`balking.balking`, issue 39; the
# default since the thirty-second session), or the law on the unregulated wait
# (`_drafted_share`, the default before it). The regime agrees far better with our
# simulator near saturation; alone it drafted fewer prompts than the reference simulator
# at its SLO boundary (5 false "meets", reference timing), so it goes with the token
# machines' first-step wait, the cascade's pass and the drafts' spike (below), with which
# the reference's runs keep 0 false "meets" (docs/validation.md, nineteenth to
# thirty-second sessions).
BALKING_DRAFTS = True
# Drafts per token machine over the window at which the token pool has drained into the
# mixed pool with probability 1 - 1/e (`_step2b_mixed_pool`).
_DRAIN_DRAFTS = 6.0
# The token machines' first-step wait (`_token_first_wait`): on, with the drafting
# regime (docs/cluster.md §4 and §7).
TOKEN_FIRST_WAIT = True
# Drafting read again at the memory-bound queue (`_step5_memory_drafting`): off. It
# brings the drafted share of conversation prompts near saturation to the simulation's
# and the 0.8-0.95 band's TBT P50 / P90 closer on two sets of configurations, but on the
# held-out set it made the overloaded runs' TTFT and E2E P50 worse (docs/validation.md,
# twenty-second session).
MEMORY_DRAFTS = False
# The token pool's occupancy reflected below its memory (`_overflow_share_reflected`):
# off. It brings the moved shares of full pools to the reference's without changing a
# reference verdict, and TTFT closer on fresh configurations, but E2E P50 further
# (docs/validation.md, twenty-second session).
REFLECTED_OVERFLOW = False
# The cascade's pass (`_cascade_pass`): on, with the drafting regime. Drafting read
# again on the prompt machines the mixed pool has not taken, its extra drafts reaching
# token machines in the share the token machines hold of the mixed pool. With the
# drafting regime and the first-step wait it leaves no false "meets" on the reference's
# runs (docs/validation.md, twenty-third session).
CASCADE_PASS = True
# Drafted prompts wait the prompt pool's KV-memory queue where the prompt machines'
# memory is full (`_step5b_memory_waits` without step 5's drafting): off.
DRAFTS_WAIT_MEMORY = False
# The token pool's reservations build up from empty through a run's window, so that
# requests overflow only once they fill it (`_overflow_over_window`; issue 39,
# twenty-fourth session): off. Moved shares come closer to our simulator's; alone it
# moves E2E P50 further near saturation, and with the drafting regime, the first-step
# wait and the cascade's pass (the best configuration measured) the programs take
# 1.2-1.9x as long to compile (docs/validation.md, twenty-fourth session).
WINDOW_RESERVATIONS = False
# The token pool's batch holds at most `Scheduling.max_batch_size` decodes (512 in both
# simulators); past it a decode waits for a slot (`_slot_wait`; issue 39, twenty-sixth
# session). Off: the batch grows to what KV memory holds.
BATCH_SLOTS = True
# The mixed pool's peak counts the reservations a burst of drafts piles up on the token
# machines (`_draft_spike`; issue 39, thirty-first session): on, with the drafting
# regime it belongs to (docs/validation.md, thirty-first and thirty-second sessions).
DRAFT_SPIKES = True
# Width of the smooth max(rho - 1, 0) of the slot queue's load.
_SLOT_TEMPERATURE = 0.02
# The reflected occupancy's search (`_overflow_share_reflected`): bisection steps in
# x = asinh((mu - C) / sd) over [asinh(-C / sd - 10), 12] (mu up to ~8e4 sd above C).
_REFLECTED_BISECTIONS = 60
_REFLECTED_X_MAX = 12.0


class Splitwise(DesignStrategy):
    """Splitwise: a prompt pool and a token pool, with the mixed pool between them."""

    __slots__ = ()
    kind: ClassVar[str] = "splitwise"
    roles: ClassVar[tuple[str, ...]] = ("prompt", "token")
    label: ClassVar[str] = "Splitwise"

    def flows(self, cluster, cls, rate, ca2, horizon_s, res, window_s=None):
        return splitwise_flows(cluster, cls, rate, ca2, horizon_s, res, window_s)

    def window_load(self, cluster, cls, rate, flows):
        # The prompt pool's load were it to take every prompt, and the capacity the token
        # machines add once drafting starts (each drafts at its own prompt speed), per
        # prompt machine.
        st = flows.st_p
        n_p = jnp.asarray(cluster.n_prompt, float)
        speed = jnp.dot(cls.wp, st.prompt_s) / jnp.maximum(jnp.dot(cls.wp, flows.st_t.prompt_s), 1e-9)
        extra = jnp.asarray(cluster.n_token, float) / n_p * speed
        return rate * st.mean_prompt_s / n_p, 1.0 + extra

    def on_prompt_machines(self, flows, state) -> bool:
        # Every decode route but the token pool's runs on prompt machines (the mixed ones).
        return state is not flows.st_t

    def run_whole(self, decode_routes, share):
        # Decodes on (the token pool, the prompt pool): a share moves to its prompt's machine.
        tok, own = decode_routes
        return (tok._replace(weight=tok.weight * (1.0 - share)), own._replace(weight=own.weight + tok.weight * share))

    def pools(self, cluster) -> tuple:
        return (("prompt", cluster.prompt, cluster.n_prompt), ("token", cluster.token, cluster.n_token))


def _transfer_s(cluster, p, prompt_s):
    tr = cluster.transfer
    nbytes = p * memory.kv_bytes_per_token(cluster.prompt.llm, tr.ignore_gqa)
    return kv_transfer.visible_transfer_s(nbytes, tr.bandwidth_bytes_per_s, tr.setup_s, cluster.prompt.llm.n_layers,
                                          prompt_s, tr.mode)


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


def _overflow_share(cls: Classes, lam, m_tok, sojourn, var, capacity):
    """Share f_km of each request class whose reservation finds the token pool full.

    Reservations in flight form an M/G/infinity shot noise; with least-memory routing the
    token machines fill evenly, so a request of m tokens overflows when the pool's free
    memory is below m: f_km = P(R + m_km > capacity), R ~ Normal(mean, var). Large
    requests overflow first (small ones fit in the gaps), and they hold most of the
    memory-time, so overflow is per class. The carried mean solves
    R = lambda sum_km w_km (1 - f_km(R)) m_km s_km; the right side falls as R rises, so
    the root is unique (solved as a share u = R / demand in [0, 1]).

    The alternative, off (`REFLECTED_OVERFLOW`, `_overflow_share_reflected`): the
    occupancy reflected below the capacity (an Ornstein-Uhlenbeck process's reflected
    law is the truncated normal, which makes the selection of large reservations
    sharp). First measured with fewer of the cascade's parts modelled (7 false "meets"
    over both reference files, against 4); retried 2026-12-06 with its location solved
    from the truncated mean: 119 / 120 Poisson reference verdicts, as this form, with the
    moved shares of full pools nearer the reference's (conversation HH 16+6: 18 % against
    9 %, 31 % here), and on our simulator near saturation TTFT closer on fresh
    configurations but E2E P50 further (docs/validation.md, twenty-second session).
    """
    demand = lam * jnp.sum(cls.w * m_tok * sojourn)
    sd = jnp.sqrt(var + 1e-12 * capacity**2)
    if REFLECTED_OVERFLOW:
        return _overflow_share_reflected(cls, lam, m_tok, sojourn, sd, capacity)

    def share(u):
        return norm.cdf((u * demand + m_tok - capacity) / sd)

    u = fixed_point_01(lambda u_: safe_div(lam * jnp.sum(cls.w * (1.0 - share(u_)) * m_tok * sojourn), demand))
    return share(u), u * demand


def _overflow_over_window(cls: Classes, lam, m_tok, sojourn, var_shared, capacity, window_s, n_points):
    """`_overflow_share` over a run that starts empty (`WINDOW_RESERVATIONS`): at time
    u of the window a class holding its reservation for s has lambda min(u, s) of them in
    flight, so the reservations build up as the run goes on and a request overflows only
    once they have filled the token pool. The share is the mean over arrivals uniform
    in the window (midpoint quadrature, `n_points`) of the share at each u, the law's
    holding time min(u, s) there (`var_shared`: the variance every request in flight
    shares, as at the end of the window)."""
    u = window_s * (jnp.arange(n_points) + 0.5) / n_points

    def at(u_i):
        held = smooth_min_pos(sojourn, u_i, p=8.0)
        var = lam * jnp.sum(cls.w * m_tok**2 * held) + var_shared
        return _overflow_share(cls, lam, m_tok, held, var, capacity)[0]

    return jnp.mean(jax.vmap(at)(u), axis=0)


def _overflow_share_reflected(cls: Classes, lam, m_tok, sojourn, sd, capacity):
    """`_overflow_share` with the occupancy reflected below the capacity C (issue 39,
    `REFLECTED_OVERFLOW`): R ~ Normal(mu, sd) given R <= C, so a request of m tokens
    overflows with f = P(R > C - m | R <= C) = 1 - Phi(z - m / sd) / Phi(z), z = (C - mu)
    / sd: in a full pool the room left is small and the large requests overflow, the
    small ones fit (the reference's full token pools move 9 % of conversation requests
    and 25 % of the memory-time). The location mu solves
    E[R | R <= C] = mu - sd phi(z) / Phi(z) = lambda sum_km w_km (1 - f_km(mu)) m_km s_km
    (left side rising in mu, right side falling: one root), found by bisection in
    x = asinh((mu - C) / sd), which reaches the deep overload where mu >> C, then one
    Newton step that carries the implicit gradient. Log-space tails (log_ndtr) keep it
    finite there. Returns (f_km, the carried mean)."""

    def f_of(mu):
        z = (capacity - mu) / sd
        return -jnp.expm1(log_ndtr(z - m_tok / sd) - log_ndtr(z))

    def carried(mu):
        z = (capacity - mu) / sd
        return mu - sd * jnp.exp(norm.logpdf(z) - log_ndtr(z))

    def g(x):
        mu = capacity + sd * jnp.sinh(x)
        return carried(mu) - lam * jnp.sum(cls.w * (1.0 - f_of(mu)) * m_tok * sojourn)

    g_sg = lambda x: jax.lax.stop_gradient(g(x))  # noqa: E731  (the search is not differentiated)

    def halve(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        up = g_sg(mid) > 0.0
        return jnp.where(up, lo, mid), jnp.where(up, mid, hi)

    lo = jax.lax.stop_gradient(jnp.arcsinh(-capacity / sd - 10.0))
    lo, hi = jax.lax.fori_loop(0, _REFLECTED_BISECTIONS, halve, (lo, jnp.full_like(lo, _REFLECTED_X_MAX)))
    x = jax.lax.stop_gradient(0.5 * (lo + hi))
    x = x - g(x) / jax.lax.stop_gradient(jax.grad(g)(x) + 1e-30)
    mu = capacity + sd * jnp.sinh(x)
    return f_of(mu), carried(mu)


class _Setup(NamedTuple):
    """What every step reads: the cluster, the classes, the arrival process and the
    pools' sizes and KV capacities."""

    cluster: object
    cls: Classes
    lam: object
    ca2: object
    horizon_s: object
    res: Resolution
    n_p: object
    n_t: object
    cap_tok_P: object       # KV tokens one prompt machine holds
    cap_tok_T: object       # ... one token machine
    pool: dict              # `pool_state` arguments every pool shares


class _Drafting(NamedTuple):
    st_p0: PoolState        # the prompt pool as if it took every prompt and no decodes
    t_alone: object         # (K,) each class's prompt time on a token machine
    x_tot: object           # share of prompts drafted
    x_k: object             # (K,) share of each class drafted
    wm_p0: WaitModel        # the prompt pool's wait law at the undrafted rate
    w_t: object             # (K,) the token machines' prompt mix
    w_p: object             # (K,) the prompt pool's prompt mix


class _Reservations(NamedTuple):
    m_tok: object           # (K, M) KV tokens a request reserves
    sojourn: object         # (K, M) how long it holds them (s)
    demand: object          # mean tokens reserved
    var: object             # their variance
    capacity: object        # the token pool's KV tokens
    f_km: object            # (K, M) share of each class that overflows
    lag: object             # (K,) mean time from arrival to the KV cache's end (s)


class _Pools(NamedTuple):
    st_t: PoolState
    st_p: PoolState
    wm_t: WaitModel         # the token machines' wait law for drafted prompts
    kv: object              # (K,) visible KV transfer
    ctx_t: object           # mean decode context on token machines (tokens)
    ctx_p: object           # ... on prompt machines
    it_t: object = 1.0      # mean decode iterations of the token machines' decodes


class _MixedPrompts(NamedTuple):
    routes: tuple           # the prompt routes (prompt pool, token machines)
    x_mk: object            # (K,) share of each class drafted by the free machines
    devolved: object        # share run on the least-loaded machine of all
    full_m: object          # chance every machine to draft onto is queued
    events_m: object        # prompt events per step a moved decode sees at full exposure
    wm_p: WaitModel         # the free prompt machines' wait law for their compute alone
    memory_scale: object    # the KV-memory wait's factor on the prompt service (`_memory_bound`)


def splitwise_flows(cluster, cls: Classes, lam, ca2, horizon_s, res: Resolution, window_s=None) -> Flows:
    """Splitwise's flows (`types.Flows`): routes, pool states, drafted and moved shares."""
    s = _setup(cluster, cls, lam, ca2, horizon_s, res, window_s)
    d = _step1_drafting(s)
    r, n_mixed, f_km, f, pools, mp = _steps_2_to_4(s, d)
    if CASCADE_PASS:
        d = _cascade_pass(s, d, n_mixed, pools)
        r, n_mixed, f_km, f, pools, mp = _steps_2_to_4(s, d)
    if MEMORY_DRAFTS:
        d = _step5_memory_drafting(s, d, mp)
        r, n_mixed, f_km, f, pools, mp5 = _steps_2_to_4(s, d)
        mp = _step5b_memory_waits(s, pools, mp5, mp.routes[0].wait)
    elif DRAFTS_WAIT_MEMORY:
        mp = _step5b_memory_waits(s, pools, mp, mp.routes[0].wait)
    decode_routes = _step4b_decode_routes(s, d, r, n_mixed, f_km, pools, mp)
    st_p, st_t = pools.st_p, pools.st_t
    pressure = (r.demand + jnp.sum(cls.w * r.m_tok)) / r.capacity
    loads = (st_p.rho_prompt, st_t.rho_prompt, st_t.batch_need * pools.ctx_t / s.cap_tok_T,
             st_p.batch_need * pools.ctx_p / s.cap_tok_P)
    return Flows(mp.routes, decode_routes, st_p, st_t, d.x_k, f, pressure, loads)


def _setup(cluster, cls, lam, ca2, horizon_s, res, window_s=None) -> _Setup:
    P, T = cluster.prompt, cluster.token
    pool = dict(p_tok=cls.p, p_sq=cls.p_sq, mean_decode_iters=cls.mean_iters, ctx_tokens=cls.ctx,
                max_batch_tokens=cluster.scheduling.max_batch_tokens,
                window_s=window_s)  # issue 39: pool.window_share
    return _Setup(cluster, cls, lam, ca2, horizon_s, res, jnp.asarray(cluster.n_prompt, float),
                  jnp.asarray(cluster.n_token, float), _kv_capacity_tokens(P, cluster), _kv_capacity_tokens(T, cluster),
                  pool)


def _drafting(s: _Setup, st_p0: PoolState, t_alone, n_pp, n_dd):
    """With n_pp machines in the prompt pool and n_dd to draft onto: the drafted share
    (total, per class), the prompt pool's wait law, and the share of requests that find
    the pool past its threshold and every machine to draft onto queued too (the
    reference then runs them on the least-loaded machine of all), and that chance.

    Self-consistent: the prompts drafted away shorten the queue that drafts them. With
    the old law (`_drafted_share`, `BALKING_DRAFTS` off) the share X solves X =
    E[x_k(wait law at rate lambda (1 - X))]. With the drafting regime (`balking.balking`,
    `BALKING_DRAFTS`, the default) class k is drafted with probability C P_k, P_k the
    chance that the work an arrival finds, given that it waits, passes the class's threshold with a queue behind
    the running prompt, in the law of a queue that drafts those arrivals (large prompts
    first); X solves X = C(admitted load) sum_k w_k P_k (1 - full(X)), the admitted
    load lambda sum_k w_k (1 - x_k) s_k / c with x_k proportional to P_k. Either way a
    draft converts a token machine unless every token machine already holds a drafted
    queue (the same law on the token side), which balances the pools in overload."""
    cls, lam, ca2, horizon_s = s.cls, s.lam, s.ca2, s.horizon_s
    has_t = n_dd / (n_dd + 1e-3)
    if BALKING_DRAFTS:
        wm_all = wait_model(lam, st_p0.mean_prompt_s, st_p0.scv_prompt, n_pp, ca2, horizon_s)
        # the diffusion's variance per second at unit load (its busy factor taken out)
        var = wm_all.var / (1.0 + softplus(wm_all.rho - 1.0, _DRAFT_TEMPERATURE))
        law = lambda take: balking(cls.p, cls.wp, st_p0.prompt_s, lam, n_pp,  # noqa: E731
                                   s.cluster.scheduling.draft_pending_tokens, var, take)
        mix = law(1.0).drafted   # the drafts' mix on the token side

    def token_side(x_tot, want):
        w_d = safe_div(cls.wp * want, jnp.dot(cls.wp, want)) + 1e-12 * cls.wp
        e_s = jnp.dot(w_d, t_alone) / jnp.sum(w_d)
        scv = jnp.maximum(jnp.dot(w_d, t_alone**2) / jnp.sum(w_d) / e_s**2 - 1.0, 0.0)
        wm_t = wait_model(lam * x_tot, e_s, scv, n_dd, ca2, horizon_s)
        return wm_t.p_wait * _queue_share(wm_t, e_s)

    def drafted(x_tot):
        if BALKING_DRAFTS:
            full = token_side(x_tot, mix)
            take = (1.0 - full) * has_t
            bk = law(take)
            shape = bk.drafted * take
            reach = jnp.maximum(jnp.dot(cls.wp, shape), 1e-12)
            kept = 1.0 - jnp.minimum(x_tot / reach, 1.0) * shape                    # (K,) admitted share
            w_a = cls.wp * kept / jnp.maximum(jnp.sum(cls.wp * kept), 1e-12)
            e_a = jnp.dot(w_a, st_p0.prompt_s)
            scv_a = jnp.maximum(jnp.dot(w_a, st_p0.prompt_s**2) / e_a**2 - 1.0, 0.0)
            wm = wait_model(lam * jnp.dot(cls.wp, kept), e_a, scv_a, n_pp, ca2, horizon_s)
            # Admitted arrivals wait at most the cap where the other pool takes the
            # drafts; above every threshold the pool still receives rho_inf = rho_full
            # (1 - take), so the queue is held less as rho_inf nears 1, not at all past it.
            held = jnp.maximum(softplus(1.0 - bk.rho_full * (1.0 - take), _DRAFT_TEMPERATURE), 1e-6)
            wm = wm._replace(cap_s=bk.cap_s / held)
            want = wm.p_wait * bk.drafted
        else:
            wm = wait_model(lam * (1.0 - x_tot), st_p0.mean_prompt_s, st_p0.scv_prompt, n_pp, ca2, horizon_s)
            want = _drafted_share(wm, st_p0, cls, s.cluster.scheduling, s.res)
            full = token_side(x_tot, want)
        return want * (1.0 - full) * has_t, (wm, jnp.dot(cls.wp, want) * full, full)

    x = fixed_point_01(lambda u: jnp.dot(cls.wp, drafted(u)[0]))
    x_cls, (wm, devolved, full) = drafted(x)
    return x, x_cls, wm, devolved, full


def _step1_drafting(s: _Setup) -> _Drafting:
    """1. Drafting, from the prompt pool as if it took every prompt and no decodes."""
    P, T, cls, lam = s.cluster.prompt, s.cluster.token, s.cls, s.lam
    cap_P, cap_T = s.cap_tok_P / cls.ctx, s.cap_tok_T / cls.ctx
    st_p0, st_t_alone = pool_states(dict(timing=P, n_machines=s.n_p, prompt_rate=lam, prompt_w=cls.wp,
                                         decode_rate=0.0, batch_cap=cap_P, **s.pool),
                                    dict(timing=T, n_machines=s.n_t, prompt_rate=lam, prompt_w=cls.wp,
                                         decode_rate=0.0, batch_cap=cap_T, **s.pool))
    t_alone = st_t_alone.prompt_s
    x_tot, x_k, wm_p0, _, _ = _drafting(s, st_p0, t_alone, s.n_p, s.n_t)
    return _with_drafts(s, _Drafting(st_p0, t_alone, x_tot, x_k, wm_p0, None, None), x_tot, x_k)


def _with_drafts(s: _Setup, d: _Drafting, x_tot, x_k) -> _Drafting:
    """`d` with the drafted shares (x_tot, x_k) and the two pools' prompt mixes they give."""
    wp = s.cls.wp
    w_t = (wp * x_k + 1e-12 * wp) / (x_tot + 1e-12)
    w_p = (wp * (1.0 - x_k) + 1e-12 * wp) / (1.0 - x_tot + 1e-12)
    return d._replace(x_tot=x_tot, x_k=x_k, w_t=w_t, w_p=w_p)


def _steps_2_to_4(s: _Setup, d: _Drafting):
    """Steps 2-4 for the drafts `d`: (reservations, n_mixed, f_km, f, pools, prompt routes)."""
    r = _step2_reservations(s, d)
    n_mixed, f_km, f = _step2b_mixed_pool(s, d, r)
    pools = _step3_pools(s, d, f_km, f)
    return (r, n_mixed, f_km, f, pools, _step4_prompt_routes(s, d, n_mixed, f, pools))


def _cascade_pass(s: _Setup, d: _Drafting, n_mixed, pools: _Pools) -> _Drafting:
    """The cascade's feedback on drafting (`CASCADE_PASS`, on; docs/cluster.md §4).

    A prompt machine that took a moved decode has left the prompt pool, so the pool's
    least-loaded machine is chosen among n_p - n_mixed, passes the threshold more often
    and refuses more prompts. A refused prompt goes to the mixed pool's least-loaded
    machine: a converted token machine (its pending tokens are its decodes, one each)
    or a converted prompt machine, about in proportion to their numbers once a token
    machine has been converted, which the step-1 drafts do within the window with the
    chance 1 - (1 - e^-a) / a, a = lambda X_1 T (a token machine with decodes seldom
    empties, so it stays converted), or at once where the prompt machines' KV memory is
    full (every machine then holds a queue; `_memory_switch`). So the drafts are step
    1's plus that share of the extra refusals.

    The prompt pool's wait law stays step 1's. Until the thirty-first session it moved
    towards the smaller pool's by the same share (a refused prompt that is not drafted
    waits on a converted prompt machine), but under the drafting regime that law is the
    smaller pool's capped wait, so where the mixed pool is large the pass lowered the
    prompt pool's wait: Splitwise-HH 30 + 10 on coding at 110 req/s, TTFT P50 0.25 s
    against our simulator's 0.77-0.80 s (0.59-0.64 s without the blend), and one more
    token machine raised TTFT (tests/test_cluster.py); on the reference's runs and our
    simulator's near saturation the blend moved the medians by < 2 points
    (docs/validation.md, thirty-first session)."""
    _, xk_n, _, _, _ = _drafting(s, d.st_p0, d.t_alone, s.n_p - n_mixed, s.n_t)
    a = s.lam * d.x_tot * s.horizon_s
    converted = 1.0 + jnp.expm1(-a) / jnp.maximum(a, 1e-9)
    _, on = _memory_switch(s, pools)  # a full KV memory queues every machine: refusals convert token machines
    converted = 1.0 - (1.0 - converted) * (1.0 - on)
    to_t = converted * s.n_t / jnp.maximum(s.n_t + n_mixed, 1e-6)
    x_k = d.x_k + to_t * (xk_n - d.x_k)
    return _with_drafts(s, d, jnp.dot(s.cls.wp, x_k), x_k)


def _drafts_per_token_machine(s: _Setup, d: _Drafting):
    """z = lambda X T / N_t: the drafts per token machine over the window."""
    return s.lam * d.x_tot * s.horizon_s / jnp.maximum(s.n_t, 1e-6)


def _drained(s: _Setup, d: _Drafting):
    """The chance the token pool has drained (every token machine took a draft and left
    it): 1 - exp(-z / 6), z the drafts per token machine over the window (docs/cluster.md
    §4, "The cascade")."""
    return -jnp.expm1(-_drafts_per_token_machine(s, d) / _DRAIN_DRAFTS)


def _drained_time(s: _Setup, d: _Drafting):
    """The share of the window the token pool spends drained: a drafted token machine
    stays in the mixed pool while it has work (under load, to the end), each token
    machine takes its first draft at rate z / T, z = lambda X T / N_t, so the pool is
    drained at time u T with chance (1 - exp(-z u))^N_t; averaged over the window
    (32-point midpoint rule in t = sqrt(u), which puts points where the chance rises,
    u < 1 / z)."""
    z = _drafts_per_token_machine(s, d)
    t = (jnp.arange(32) + 0.5) / 32.0
    f = jnp.exp(jnp.maximum(s.n_t, 1e-6) * jnp.log(jnp.maximum(-jnp.expm1(-z * t**2), 1e-30)))
    return jnp.mean(2.0 * t * f)


def _token_first_wait(s: _Setup, d: _Drafting, share, lag):
    """A decode that lands on a token machine while it runs a drafted prompt waits out
    the rest of that iteration (docs/cluster.md §4, "The token machines' first-step
    wait"; `TOKEN_FIRST_WAIT`). Returns (K, 1) arrays per decode class: the chance, and
    the residual iteration's mean and second moment (s, s^2).

    The machine was in the token pool when the request arrived (a machine that takes a
    draft leaves it), so the draft started within the request's lag L_k from arrival to
    its KV cache's end: chance r E[min(D, L_k)] (r drafts per token machine per second,
    ``share`` of all drafts; D a draft's run time on a token machine), and given a hit
    the draft's elapsed part is uniform on [0, min(D, L_k)]. While the token pool is
    drained (`_drained_time`) a decode goes to the least-memory machine of the mixed
    pool, drafted token machines included, at whatever it runs: PASTA, chance r E[D],
    residual E[D^2] / 2E[D]. The two blend by the drained share of the window."""
    if not TOKEN_FIRST_WAIT:
        return 0.0, 0.0, 0.0
    D = d.t_alone[None, :]                                     # (1, K) drafts
    m = smooth_min_pos(D, lag[:, None], 8.0)                   # (K, K) decode x draft
    wm = d.w_t[None, :] * m
    q = jnp.sum(wm, axis=1)                                    # E[min(D, L_k)]
    q1 = jnp.sum(wm * (D - 0.5 * m), axis=1)                   # q x E[residual]
    q2 = jnp.sum(wm * (D**2 - D * m + m**2 / 3.0), axis=1)     # q x E[residual^2]
    e1, e2, e3 = jnp.dot(d.w_t, d.t_alone), jnp.dot(d.w_t, d.t_alone**2), jnp.dot(d.w_t, d.t_alone**3)
    a = _drained_time(s, d)
    r = s.lam * d.x_tot * share / jnp.maximum(s.n_t, 1e-6)
    den = a * e1 + (1.0 - a) * q
    hit = r * den
    w1 = (a * e2 / 2.0 + (1.0 - a) * q1) / den
    w2 = (a * e3 / 3.0 + (1.0 - a) * q2) / den
    return hit[:, None], w1[:, None], w2[:, None]


def _step2_reservations(s: _Setup, d: _Drafting) -> _Reservations:
    """2. Token-pool KV reservations: each request reserves (p + 1 + o) tokens on its
    token machine from arrival (the machine is chosen with the prompt's) to its last
    token. Sojourn from the prompt pool's wait and the token pool's step time."""
    cls, lam = s.cls, s.lam
    cap_T = s.cap_tok_T / cls.ctx
    st_t0 = pool_state(s.cluster.token, s.n_t, lam * d.x_tot, d.w_t, decode_rate=lam,
                       batch_cap=_slots_cap(s, 1e3 * cap_T), **s.pool)
    mean_busy, mean_busy_sq = busy_wait_moments(d.wm_p0, s.res)
    mean_wait = d.wm_p0.p_wait * mean_busy
    var_wait = jnp.maximum(d.wm_p0.p_wait * mean_busy_sq - mean_wait**2, 0.0)
    kv0 = _transfer_s(s.cluster, cls.p, d.st_p0.prompt_s)
    lag = mean_wait + d.st_p0.prompt_s + kv0
    sojourn = lag[:, None] + cls.iters[None, :] * st_t0.step_s
    if TOKEN_FIRST_WAIT:  # each reservation is also held through its first-step wait
        hit_1, w_1, _ = _token_first_wait(s, d, 1.0, lag)
        sojourn = sojourn + -jnp.log1p(-0.95 * smooth_min_one(hit_1)) * w_1
    m_tok = cls.p[:, None] + 1.0 + cls.o[None, :]
    demand = lam * jnp.sum(cls.w * m_tok * sojourn)
    # Shot noise, plus the queue wait every request in flight shares (a burst that
    # lengthens the prompt queue holds every reservation longer at once).
    shared = (lam * jnp.sum(cls.w * m_tok))**2 * var_wait
    var = lam * jnp.sum(cls.w * m_tok**2 * sojourn) + shared
    capacity = s.n_t * s.cap_tok_T
    window = s.pool["window_s"]
    if WINDOW_RESERVATIONS and window is not None:
        f_km = _overflow_over_window(cls, lam, m_tok, sojourn, shared, capacity, window, s.res.window_points)
    else:
        f_km, _ = _overflow_share(cls, lam, m_tok, sojourn, var, capacity)
    f_km = f_km * (s.n_p / (s.n_p + 1e-3))
    return _Reservations(m_tok, sojourn, demand, var, capacity, f_km, lag)


def _step2b_mixed_pool(s: _Setup, d: _Drafting, r: _Reservations):
    """2b. The mixed pool's size (docs/cluster.md §4, "The mixed pool"): (n_mixed, the
    share of each class whose decode runs on a prompt machine, its mean over classes).

    A prompt machine that takes an overflowing decode leaves the prompt pool until it is
    idle again. Least-memory routing spreads later overflow over every mixed machine, so
    few ever empty: their number ratchets up to what the peak overflow needed, the
    reservations' peak over the horizon, mean plus sd sqrt(2 ln(1 + T / tau)) (tau the
    memory-weighted sojourn, the shot noise's correlation time), plus the drafts' spike
    where `DRAFT_SPIKES` is on (the default), less the token pool's memory. At most 4/5 of the
    prompt pool, so that some is left to draft from.

    The drained token pool (docs/cluster.md §4, "The cascade"). A token machine that
    takes a draft leaves the token pool until it is idle, which under load it seldom is;
    once every token machine has, each new request's decode goes to the mixed machine
    with the least memory, prompt machines converted earlier included, so decodes spread
    over the n_mixed + N_t machines by memory whatever the overflow law says. The chance
    the pool has drained grows with the drafts per token machine over the window,
    z = lambda X T / N_t, as 1 - exp(-z / 6) (the constant read off the reference's
    per-request records of five boundary runs)."""
    cls, lam, n_p, n_t, cap_tok_P = s.cls, s.lam, s.n_p, s.n_t, s.cap_tok_P
    tau = safe_div(lam * jnp.sum(cls.w * r.m_tok * r.sojourn**2), r.demand)
    z_peak = jnp.sqrt(2.0 * jnp.log1p(s.horizon_s / jnp.maximum(tau, 1e-3)))
    peak = r.demand + z_peak * jnp.sqrt(r.var + 1e-12 * r.capacity**2)
    if DRAFT_SPIKES:
        peak = peak + _draft_spike(s, d, r)
    n_mixed = softplus(peak - r.capacity, 0.05 * cap_tok_P) / cap_tok_P
    n_mixed = 0.8 * n_p * smooth_min_one(n_mixed / (0.8 * jnp.maximum(n_p, 1e-6)))
    drained = _drained(s, d)
    f_km = r.f_km + (1.0 - r.f_km) * drained * n_mixed / jnp.maximum(n_mixed + n_t, 1e-6)
    return n_mixed, f_km, jnp.sum(cls.w * f_km)


def _draft_spike(s: _Setup, d: _Drafting, r: _Reservations):
    """The KV reservations a burst of drafts adds to the token pool at once, over the
    mean (`DRAFT_SPIKES`, on; docs/cluster.md §4, "The cascade").

    Drafts come when the prompt queue spikes, so the token machines take theirs together
    (our simulator, Splitwise-HH 20 + 4 on coding at 60 req/s: each prompt machine that
    joined the mixed pool did so while every token machine held 350-360 of its 358 GB,
    just after 17-26 prompts had queued). While a token machine runs a drafted prompt
    (D s on average) none of its decodes finishes and new requests keep reserving, so the
    pool's reservations rise by lambda E[m] D, with the chance that every token machine
    took a draft (`_drained`). A token machine already busy with drafts a share rho of
    its time holds that share in its mean step (the reservations' sojourn), so the spike
    is the rest, (1 - rho) of it: steady drafting in overload makes no spike."""
    e_m = jnp.sum(s.cls.w * r.m_tok)
    e_d = jnp.dot(d.w_t, d.t_alone)
    rho = smooth_min_one(s.lam * d.x_tot * e_d / jnp.maximum(s.n_t, 1e-6))
    return _drained(s, d) * s.lam * e_m * e_d * (1.0 - rho)


def _step3_pools(s: _Setup, d: _Drafting, f_km, f) -> _Pools:
    """3. The pools with their final flows; each pool decodes its own mix of requests
    (overflow favours long ones), so its decode length and context are its own."""
    cls, lam = s.cls, s.lam

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
    pool_t = dict(s.pool, mean_decode_iters=it_t, ctx_tokens=ctx_t)
    pool_p = dict(s.pool, mean_decode_iters=it_p, ctx_tokens=ctx_p)
    st_t, st_p = pool_states(
        dict(timing=s.cluster.token, n_machines=s.n_t, prompt_rate=lam * d.x_tot, prompt_w=d.w_t,
             decode_rate=lam * (1.0 - f), batch_cap=_slots_cap(s, s.cap_tok_T / ctx_t), **pool_t),
        dict(timing=s.cluster.prompt, n_machines=s.n_p, prompt_rate=lam * (1.0 - d.x_tot), prompt_w=d.w_p,
             decode_rate=lam * f, batch_cap=s.cap_tok_P / ctx_p, **pool_p))
    wm_t = wait_model(lam * d.x_tot, st_t.mean_prompt_s, st_t.scv_prompt, s.n_t, s.ca2, s.horizon_s)
    kv = _transfer_s(s.cluster, cls.p, st_p.prompt_s)
    return _Pools(st_t, st_p, wm_t, kv, ctx_t, ctx_p, it_t)


def _step4_prompt_routes(s: _Setup, d: _Drafting, n_mixed, f, pools: _Pools) -> _MixedPrompts:
    """4. The mixed pool's prompts (docs/cluster.md §4, "The mixed pool"). Its machines
    get prompts only when the prompt pool drafts (its least-loaded machine past the
    threshold), before any token machine is converted.

    The rest of the prompt pool drafts onto the mixed and token machines; a mixed
    machine's prompt rate relative to a prompt machine's, d (at least one machine holds
    the moved decodes; a machine is never more than fully busy), scales the prompt
    interference the moved decodes sit through. A request that finds every machine to
    draft onto queued too (`devolved`) runs on the least-loaded machine of all, a mixed
    one as likely as any (d = 1 for it)."""
    n_p, n_t, st_p = s.n_p, s.n_t, pools.st_p
    n_free = n_p - n_mixed
    x_m, x_mk, wm_m, devolved, full_m = _drafting(s, d.st_p0, d.t_alone, n_free, n_mixed + n_t)
    rel = (x_m / jnp.maximum(n_mixed, 1.0)) / jnp.maximum((1.0 - x_m) / n_free, 1e-9)
    rel = rel + devolved * (1.0 - rel)
    rel = smooth_min_pos(rel, 1.0 / jnp.maximum(smooth_min_one(st_p.rho_prompt), 1e-3), 8.0)
    events_m = rel * st_p.events_per_step
    # The prompt pool's own queue runs on its free machines: the prompts neither drafted
    # from them (X_m) nor devolved to a mixed or token machine.
    away = x_m + devolved * (n_mixed + n_t) / (n_p + n_t)
    rate_p = s.lam * (1.0 - away)
    # What a prompt waits for also includes KV memory; how busy the machines are (the
    # moved decodes' interference, step 4b) is their compute's at the rate memory admits.
    scale, admitted, onset = _memory_bound(s, f, pools, rate_p * st_p.mean_prompt_s / jnp.maximum(n_free, 1e-6))
    # Routed on arrival: a waiting prompt also waits out part of its machine's prompt in
    # flight (queueing.ROUTED_RESIDUAL_SHARE_PROMPT_POOL; TTFT and E2E only, the
    # reservations and the drafting keep the central queue).
    wm_wait = _after_onset(wait_model(rate_p, st_p.mean_prompt_s * scale, st_p.scv_prompt, n_free, s.ca2,
                                      s.horizon_s, routed_residual_share=ROUTED_RESIDUAL_SHARE_PROMPT_POOL,
                                      exact_c=EXACT_C_PROMPT_POOL)._replace(cap_s=_memory_cap(s, pools, wm_m.cap_s)),
                           onset, s.pool["window_s"])
    wm_p = wait_model(rate_p * admitted, st_p.mean_prompt_s, st_p.scv_prompt, n_free, s.ca2, s.horizon_s)
    # A prompt routed in the prompt pool runs on a free machine (no decoders: it neither
    # waits for a decode iteration nor carries decoders) unless it is one of the mixed
    # machines' share, d n_mixed / (n_free + d n_mixed).
    on_mixed = rel * n_mixed / jnp.maximum(n_free + rel * n_mixed, 1e-9)
    routes = (PromptRoute(d.st_p0, wm_wait, 1.0 - d.x_k, other_state=st_p, other_share=on_mixed),
              PromptRoute(pools.st_t, pools.wm_t, d.x_k))
    return _MixedPrompts(routes, x_mk, devolved, full_m, events_m, wm_p, scale)


def _memory_cap(s: _Setup, pools: _Pools, cap_s):
    """The drafting regime's cap on the admitted wait, lifted where the prompt machines'
    KV memory is full: a queue for memory is not held by drafting (its drafts wait for
    memory too). Without a cap (the default law) nothing changes."""
    if cap_s is None:
        return cap_s
    _, on = _memory_switch(s, pools)
    return cap_s / jnp.maximum(1.0 - on, 1e-3)


def _step5_memory_drafting(s: _Setup, d: _Drafting, mp: _MixedPrompts) -> _Drafting:
    """5. Drafting read again at the memory-bound queue (issue 39; docs/cluster.md §4,
    "Drafting at the memory-bound queue").

    Step 1 drafts from the prompt pool as if it held no decodes. Where the moved decodes
    fill the prompt machines' KV memory, prompts queue for memory (`_memory_bound`), the
    pending tokens pass the drafting threshold, and the simulator drafts 9-36 % of
    conversation prompts where step 1 drafts 0-14 % (63 near-saturation configurations
    x 4 seeds). So the drafting law is solved once more on the prompt pool with its
    service stretched by the memory wait's factor; with no memory wait the factor is 1
    and the drafts are step 1's."""
    sc = mp.memory_scale
    st0 = d.st_p0._replace(mean_prompt_s=d.st_p0.mean_prompt_s * sc, prompt_s=d.st_p0.prompt_s * sc)
    x_tot, x_k, _, _, _ = _drafting(s, st0, d.t_alone, s.n_p, s.n_t)
    return _with_drafts(s, d, x_tot, x_k)


def _step5b_memory_waits(s: _Setup, pools: _Pools, mp: _MixedPrompts, wait_p: WaitModel) -> _MixedPrompts:
    """5b. The prompt routes' waits with step 5's drafts: the prompt pool keeps the
    memory-bound queue of the first pass (`wait_p`), which the drafts do not shorten
    (they start only once the queue is that long), and a drafted prompt waits it too
    where the prompt machines' memory is full (the token machines' then is as well: in
    our simulator a drafted conversation prompt waits as long as the others or longer,
    TTFT P50 33 / 60 / 43 s against 25 / 25 / 37 s on three such configurations), its
    token machines' own wait law where it is not (switched as `_memory_bound` switches)."""
    _, on = _memory_switch(s, pools)
    wait_t = jax.tree.map(lambda a, b: a + on * (b - a), mp.routes[1].wait, wait_p._replace(cap_s=None))
    return mp._replace(routes=(mp.routes[0]._replace(wait=wait_p), mp.routes[1]._replace(wait=wait_t)))


def _memory_bound(s: _Setup, f, pools: _Pools, rho):
    """When the moved decodes' KV memory on the prompt machines is full (issue 39): how
    much longer a prompt waits, as a factor on the prompt pool's service time, the share
    of arrivals memory admits, at which the machines run prompts, and when the wait
    starts (`memory_wait.memory_bound`, f the moved share; docs/cluster.md §4,
    "Waiting for KV memory")."""
    st_p = pools.st_p
    rho_m, on = _memory_switch(s, pools)
    scale, admitted = memory_wait.memory_bound(st_p.decode_s, st_p.step_s, rho_m, f, rho)
    # When the wait starts: a run starts empty, the token machines' memory fills first
    # (every decode goes there until then), then the prompt machines' with the moved ones.
    fill_t = s.cap_tok_T / jnp.maximum(pools.ctx_t * s.lam / jnp.maximum(s.n_t, 1e-6), 1e-9)
    fill_p = s.cap_tok_P / jnp.maximum(pools.ctx_p * s.lam * f / jnp.maximum(s.n_p, 1e-6), 1e-9)
    return scale, admitted, on * (fill_t + fill_p)


def _memory_switch(s: _Setup, pools: _Pools):
    """(rho_m, on): the KV memory the moved decodes need on a prompt machine over what it
    holds, and the smooth switch that turns the memory wait on as rho_m passes 1."""
    rho_m = pools.st_p.batch_need * pools.ctx_p / jnp.maximum(s.cap_tok_P, 1e-9)
    return rho_m, memory_wait.switch(rho_m)


_after_onset = memory_wait.after_onset


def pools_f(f_km, cls: Classes):
    """The share of decodes moved onto prompt machines (the mean of f_km over classes)."""
    return jnp.sum(cls.w * f_km)


def _slots_cap(s: _Setup, cap):
    """A pool's batch cap `cap` (decodes, from KV memory) held under the batch-size cap
    (`BATCH_SLOTS`)."""
    if not BATCH_SLOTS:
        return cap
    return smooth_min_pos(cap, s.cluster.scheduling.max_batch_size, p=32.0)


def _slot_wait(s: _Setup, st: PoolState, lam_d, iters):
    """A decode's wait for a batch slot on a token machine past its batch-size cap S
    (`BATCH_SLOTS`; docs/cluster.md §4, *Batch slots*): (mean s, variance s^2).

    With every slot taken a machine completes S / R decodes a second (R = iterations x
    the step at S), so the slots' load is rho = lambda_d R / S (lambda_d the machine's
    decode arrivals). A run starts empty: the decoding population rises as
    lambda_d R (1 - e^{-t/R}) and fills the slots at t0 = -R ln(1 - 1 / rho); from then
    the backlog grows and a decode that arrives at t waits (rho - 1)(t - t0), first come
    first served, until the window T ends. Over arrivals uniform in the window, with
    L = (T - t0)+: E[W] = (rho - 1) L^2 / 2T, E[W^2] = (rho - 1)^2 L^3 / 3T. Both smooth
    (max(rho - 1, 0) and (T - t0)+ as softplus), zero below the cap."""
    if not BATCH_SLOTS:
        return 0.0, 0.0
    window = s.pool["window_s"]
    T = s.horizon_s if window is None else window
    R = jnp.maximum(iters * st.step_s, 1e-9)
    e = jnp.maximum(softplus(lam_d * R / s.cluster.scheduling.max_batch_size - 1.0, _SLOT_TEMPERATURE), 1e-9)
    t0 = R * jnp.log1p(1.0 / e)                       # -R ln(1 - 1 / rho), rho = 1 + e
    L = softplus(T - t0, _SLOT_TEMPERATURE * T)
    m1 = e * L**2 / (2.0 * T)
    m2 = e**2 * L**3 / (3.0 * T)
    return m1, jnp.maximum(m2 - m1**2, 0.0)


def _step4b_decode_routes(s: _Setup, d: _Drafting, r: _Reservations, n_mixed, f_km, pools: _Pools,
                          mp: _MixedPrompts):
    """4b. The decode routes: on token machines, and moved onto mixed machines.

    A moved decode arriving at a mixed machine busy with a drafted prompt waits out the
    rest of that iteration (PASTA: the chance is the machine's busy share with drafted
    prompts, spread over mixed and token machines in proportion to their numbers, plus
    the devolved requests; the wait is the residual E[T^2] / 2E[T], second moment
    E[T^3] / 3E[T], over the drafted prompts' sizes).

    What a moved decode sits through (docs/cluster.md §4, "Which prompts a moved decode
    sits through"). A mixed machine runs the drafted prompts (the large ones, at the rate
    above) and the devolved requests (any size); a moved decode loses that busy share of
    its time, in events the size of those prompts (too large to ride along: waited out),
    so large and rare, not the prompt pool's many small ones. Where the pools are full
    (every prompt machine queued, share full_p; every machine to draft onto queued,
    full_m; or the whole cluster saturated with prompts, full_all: Erlang C times the
    queue share at rate lambda on all N_p + N_t machines) the mixed machines run the
    prompt pool's queue like any of its machines, and their decodes lose what d times a
    prompt machine's interference takes: the two blend by
    1 - (1 - full_p)(1 - full_m)(1 - full_all)."""
    cls, lam, n_p, n_t = s.cls, s.lam, s.n_p, s.n_t
    st_p, st_t, st_p0 = pools.st_p, pools.st_t, d.st_p0
    w_dm = cls.wp * mp.x_mk + 1e-12 * cls.wp
    w_dm = w_dm / jnp.sum(w_dm)
    e_m, e2_m, e3_m = jnp.dot(w_dm, st_p0.prompt_s), jnp.dot(w_dm, st_p0.prompt_s**2), jnp.dot(w_dm, st_p0.prompt_s**3)
    to_mixed = n_mixed / jnp.maximum(n_t + n_mixed, 1e-6)
    busy_m = lam * (d.x_tot * to_mixed + mp.devolved * n_mixed / (n_p + n_t)) * e_m / jnp.maximum(n_mixed, 1.0)
    r_draft = jnp.maximum(lam * d.x_tot * to_mixed / jnp.maximum(n_mixed, 1.0), 0.0)
    r_dev = jnp.maximum(lam * mp.devolved / (n_p + n_t), 0.0)
    w_mix = r_draft * w_dm + r_dev * cls.wp + 1e-12 * cls.wp
    ex_m = jnp.dot(w_mix, st_p0.prompt_s) / jnp.sum(w_mix)
    var_m = jnp.maximum(jnp.dot(w_mix, st_p0.prompt_s**2) / jnp.sum(w_mix) - ex_m**2, 0.0)
    lost_full = mp.events_m * st_p.interf_mean_s
    frac_full = lost_full / (st_p.decode_s + lost_full)
    full_p = mp.wm_p.p_wait * _queue_share(mp.wm_p, st_p.mean_prompt_s)
    e_all = (n_p + n_t) / (n_p / st_p0.mean_prompt_s + n_t / jnp.dot(cls.wp, d.t_alone))
    wm_all = wait_model(lam, e_all, st_p0.scv_prompt, n_p + n_t, s.ca2, s.horizon_s)
    full_all = wm_all.p_wait * _queue_share(wm_all, e_all)
    w_full = 1.0 - (1.0 - full_p) * (1.0 - mp.full_m) * (1.0 - full_all)
    frac_m = smooth_min_one((r_draft + r_dev) * ex_m)
    frac_m = frac_m + w_full * (frac_full - frac_m)
    ev_m = interruptions_per_step(frac_m, st_p.decode_s, ex_m)
    st_m = st_p._replace(events_per_step=ev_m, step_s=st_p.decode_s + ev_m * ex_m,
                         interf_mean_s=ex_m, interf_var_s2=var_m)
    busy_t, w1_t, w2_t = _token_first_wait(s, d, 1.0 - to_mixed, r.lag)
    slot_s, slot_var = _slot_wait(s, st_t, lam * (1.0 - pools_f(f_km, cls)) / jnp.maximum(n_t, 1e-6), pools.it_t)
    return (DecodeRoute(st_t, 1.0 - f_km, pools.kv, 0.5 * st_t.decode_s + slot_s,
                        first_busy=busy_t, first_wait_s=w1_t, first_wait_s2=w2_t, join_var_s2=slot_var),
            DecodeRoute(st_m, f_km, pools.kv, 0.5 * st_m.decode_s,
                        first_busy=busy_m, first_wait_s=e2_m / (2.0 * e_m), first_wait_s2=e3_m / (3.0 * e_m)))
