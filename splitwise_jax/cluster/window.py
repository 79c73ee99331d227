"""A trace's own arrival curve: the model window by window, with queues carried over.

`evaluate` runs these stages for a workload with an arrival profile (a trace's windows,
their rates, burstiness and sub-bin shapes; `workload.ArrivalProfile`):

1. `window_loads`: each window's flows (the design's `strategy.flows` at the window's
   rate, burstiness and length), read as the prompt pool's load, service time, drain
   capacity and decode length;
2. `window_regimes`: the prompt pool's backlog as a fluid over the sub-bins
   (`backlog_fluid`), and each window's arrivals split into those that find a queue
   (*queued*) and those that do not (*free*);
3. `window_components`: each (window, regime)'s latency components (the design's flows
   again, with the backlog's wait and the flat-out decodes), merged into one mixture
   weighted by its share of arrivals.

Queues carry over as a fluid on the profile's sub-bins (docs/cluster.md §3c): the
prompt pool's per-machine backlog U (s of work) grows at rho_w x sub_rel - 1 through
each sub-bin of window w and never falls below zero. Each window's arrivals split in
two regimes by the backlog their sub-bin finds (smoothly, q = U / (U + E[S] / c):
c U / E[S] prompts are queued in the pool, and an arrival finds the queue empty with
chance 1 / (1 + c U / E[S]), a geometric queue length of that mean): *queued* arrivals
find the arrival-weighted mean U of their sub-bins and wait U / c(U) (c the pool's drain
rate, token machines included past the drafting threshold), while the pool runs flat
out (prompt load 1: the decodes sharing its machines sit through prompt after prompt);
*free* arrivals see the load of their own sub-bins and the in-window wait law (bursts
shorter than a sub-bin), and their decodes run flat out for the share of their length
the pool is (a backlog that builds after them).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from splitwise_jax._smooth import safe_div, smooth_min_pos, softplus
from splitwise_jax.cluster.components import Mixtures, components
from splitwise_jax.cluster.percentiles import Resolution, merge_routes
from splitwise_jax.cluster.pool import PoolState, interruptions_per_step
from splitwise_jax.cluster.queueing import Burstiness
from splitwise_jax.cluster.types import Classes

# Quadrature points over a sub-bin for the mean backlog its arrivals find, and the
# temperature (s) of the smooth max(backlog, 0) (a few ms: below one prompt's service).
_BACKLOG_POINTS = 4
_BACKLOG_TEMPERATURE_S = 0.005
# A sub-bin ends "flat out" while its backlog exceeds this fraction of a prompt's
# service time (smoothly: U / (U + edge E[S])); the product of these over a busy stretch
# must stay near 1, so the edge is sharp.
_BUSY_EDGE = 0.02


class WindowLoads(NamedTuple):
    """Per window (W,): the prompt pool's load per prompt machine were it to take every
    prompt, its mean prompt service time (s), its drain capacity once drafting starts (in
    prompt machines), and how long a decode on a prompt machine lasts flat out (s)."""

    first: jax.Array
    service: jax.Array
    capacity: jax.Array
    decode_s: jax.Array


class Regimes(NamedTuple):
    """Per (regime, window), (2W,): free arrivals' windows then queued arrivals'."""

    rate_rel: jax.Array      # the window's rate relative to the mean
    bursts: Burstiness       # its burstiness
    weight: jax.Array        # share of all arrivals
    backlog_s: jax.Array     # the backlog's wait its arrivals find (s)
    load_scale: jax.Array    # the rate the regime's flows see, relative to the window's
    wait_scale: jax.Array    # the in-window wait law's P(wait) factor (queued: 0)
    flat: jax.Array          # share of a decode's time flat out
    busy_s: jax.Array        # how long the pool stays flat out after the wait (s)
    whole: jax.Array         # share run wholly on the prompt's machine (`run_whole`)


def _bursts(prof) -> Burstiness:
    return Burstiness(prof.idc, jnp.broadcast_to(prof.idc_scale_s, prof.idc.shape))


def _per_row(fn, *xs):
    """`jax.vmap(fn)(*xs)`, but one row at a time (`lax.map`) on CPU.

    Each row solves its own fixed points (pool Newton steps, the drafting and
    overflow shares: `while_loop`s). Vectorised, every loop runs until the slowest
    row has converged, each exit a select over the batch, and its arrays grow by the
    batch; on CPU one row at a time is faster (as `sweep` and `cluster.batched` map a
    grid), the same values up to round-off (a converged row's loop state is left as it
    is either way). An accelerator keeps the vectorised batch.
    """
    if jax.default_backend() != "cpu":
        return jax.vmap(fn)(*xs)
    return jax.lax.map(lambda row: fn(*row), xs)


def window_loads(strategy, cluster, cls: Classes, lam, prof, res: Resolution, window_s=None) -> WindowLoads:
    """Stage 1: each window's flows, read as the load the backlog fluid needs."""
    def load(rel, b):
        rate = lam * rel
        flows = strategy.flows(cluster, cls, rate, b, prof.window_s, res, window_s)
        st = flows.st_p
        # How long a decode on a prompt machine lasts when the pool runs flat out.
        decode_s = cls.mean_iters * flat_out(st).step_s
        first, capacity = strategy.window_load(cluster, cls, rate, flows)
        return first, st.mean_prompt_s, capacity, decode_s

    return WindowLoads(*_per_row(load, prof.rate_rel, _bursts(prof)))


def window_regimes(cluster, cls: Classes, prof, loads: WindowLoads) -> Regimes:
    """Stage 2: the backlog fluid over the sub-bins, and each window's arrivals split
    into the free and the queued regime."""
    first, service, capacity, decode_s = loads
    share = prof.rate_rel / jnp.sum(prof.rate_rel)
    n_sub = prof.sub_rel.shape[1]
    h = prof.window_s / n_sub
    # Drafting starts once a prompt would take the least-loaded prompt machine past
    # draft_pending_tokens: that much work (s) per machine less one mean prompt.
    mean_p = jnp.dot(cls.wp, cls.p)
    draft_at = softplus(cluster.scheduling.draft_pending_tokens - mean_p, 64.0) * service / mean_p
    rho_sub = first[:, None] * prof.sub_rel
    n_queue = jnp.maximum(jnp.asarray(cluster.n_prompt, float), 1.0)
    found, found_wait, busy_for, flat_ahead = backlog_fluid(rho_sub, capacity, draft_at, service, h, decode_s, n_queue)
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
    bursts = _bursts(prof)
    two = lambda a, b: jnp.concatenate([a, b])  # noqa: E731
    return Regimes(
        two(prof.rate_rel, prof.rate_rel), jax.tree_util.tree_map(two, bursts, bursts),
        two(share * (1.0 - share_q), share * share_q), two(backlog_f, backlog_q),
        two(rho_f / safe_first, capacity / safe_first), two(jnp.ones_like(first), jnp.zeros_like(first)),
        two(flat_f, jnp.ones_like(first)), two(jnp.full_like(first, 1e9), left_q), two(jnp.zeros_like(first), whole))


def window_components(strategy, cluster, cls: Classes, lam, prof, regimes: Regimes, res: Resolution,
                      window_s=None) -> Mixtures:
    """Stage 3: `components` for every (regime, window), merged into one mixture: each
    one's routes become routes of the whole, weighted by its share of arrivals."""
    def one(rel, b, w, backlog, sc, waits, flat_w, busy_s, whole):
        flows = strategy.flows(cluster, cls, lam * rel * sc, b, prof.window_s, res, window_s)
        # The backlog is the fluid's, of the prompt pool and the machines drafted to help
        # it: every prompt route finds it; queued arrivals wait it and nothing more.
        prompts = tuple(r._replace(backlog_s=backlog, wait=r.wait._replace(p_wait=r.wait.p_wait * waits))
                        for r in flows.prompt_routes)
        # Flat out, a prompt machine's decoders cannot be avoided by the prompts (every
        # machine holds a queue) and the machine is never idle: each decode step waits
        # through prompt iterations until one carries it (`flat_out`).
        flat = flat_out(flows.st_p)

        # A share f of the decode's *time* flat out is a share f/t_flat / (f/t_flat +
        # (1 - f)/t_own) of its *steps* (queued arrivals: f = 1, all of them until the
        # pool drains, `busy_s`).
        def blend(st):
            rate_flat = flat_w / jnp.maximum(flat.step_s, 1e-9)
            phi = safe_div(rate_flat, rate_flat + (1.0 - flat_w) / jnp.maximum(st.step_s, 1e-9))
            return jax.tree_util.tree_map(lambda a, b: (1.0 - phi) * a + phi * b, st, flat)

        # Decoders on prompt machines (`strategy.on_prompt_machines`) run flat out.
        decodes = tuple(dr._replace(state=blend(dr.state) if strategy.on_prompt_machines(flows, dr.state)
                                    else dr.state)
                        for dr in flows.decode_routes)
        decodes = tuple(dr._replace(interfered_steps=busy_s / jnp.maximum(dr.state.step_s, 1e-9)) for dr in decodes)
        decodes = strategy.run_whole(decodes, whole)
        flows = flows._replace(prompt_routes=prompts, decode_routes=decodes)
        return Mixtures(*(m._replace(weight=m.weight * w) for m in components(cluster, cls, flows, res)))

    per_regime = _per_row(one, *regimes)
    return Mixtures(*(merge_routes(m) for m in per_regime))


def backlog_fluid(rho_sub, capacity, draft_at, service, h, decode_s, n_machines):
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
    # of arrivals (c U / E[S] prompts queued in the pool; `window_regimes`), per
    # sub-bin the mean over its points; looked ahead with weight e^{-t / decode_s}.
    flat = jnp.mean(ramps / (ramps + per_sub(service / n_machines)[:, None]), axis=1)
    keep = jnp.exp(-h / jnp.maximum(per_sub(decode_s), 1e-3))

    def ahead(later, x):
        f, a = x
        g = (1.0 - a) * f + a * later
        return g, g

    _, flat_ahead = jax.lax.scan(ahead, jnp.asarray(0.0), (flat, keep), reverse=True)
    return found.reshape(shape), wait.reshape(shape), busy_for.reshape(shape), flat_ahead.reshape(shape)


def flat_out(st: PoolState) -> PoolState:
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
