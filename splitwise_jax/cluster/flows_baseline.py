"""The paper's baseline design and its flows.

The colocated designs (`strategy.Colocated`: one pool whose machines run both phases,
requests routed to the machine with the fewest pending tokens) are the baselines and
chunked prefill (`chunked.Chunked`); they differ only in their iterations.

`Baseline` (Splitwise §V): N machines, each running prompts and decodes with mixed
continuous batching (a whole prompt first; the decodes wait for it). Where the decodes
need more KV memory than the machines hold (a request holding its prompt and its whole
output, as the simulators reserve it), prompts also wait for memory: once it has filled,
the machines admit what the full memory turns over (`_memory_full`, `MEMORY_FULL`;
docs/cluster.md §4, "A full memory's turnover"; the older law, `memory_wait`, with
`MEMORY_FULL` off). A run starts empty, so the decodes riding each prompt
iteration, and with them the prompt load, build up through its window
(`_rising_load`, `RISING_LOAD`; docs/cluster.md §3, "A load that rises through the
window").
"""

from __future__ import annotations

from typing import ClassVar

import jax
import jax.numpy as jnp

from splitwise_jax._smooth import softplus
from splitwise_jax.cluster import memory_wait
from splitwise_jax.cluster.pool import interfered_share, pool_state, pool_state_at, prompt_batching, window_share
from splitwise_jax.cluster.queueing import ROUTED_SHARE_COLOCATED, Burstiness, burst_size, wait_model
from splitwise_jax.cluster.strategy import Colocated
from splitwise_jax.cluster.types import Classes, DecodeRoute, Flows, PromptRoute, _kv_capacity_tokens

# Prompts wait for KV memory where the decodes need more than the machines hold
# (`memory_wait`; issue 39, twenty-third session).
MEMORY_WAIT = True
# The prompt load rises through a run's window as the decoding population builds and
# each prompt iteration carries more of it (`_rising_load`; issue 39, twenty-fourth
# session).
RISING_LOAD = True
# Memory counted as the simulators reserve it (prompt + whole output), and a pool whose
# memory fills admits at the rate its full memory turns over from then (`_memory_full`;
# issue 39, twenty-fifth session).
MEMORY_FULL = True


class Baseline(Colocated):
    """The paper's baselines: whole prompts, mixed continuous batching (prompts first)."""

    __slots__ = ()
    kind: ClassVar[str] = "baseline"
    label: ClassVar[str] = "a baseline"

    def flows(self, cluster, cls, rate, ca2, horizon_s, res, window_s=None):
        del res  # no drafting: nothing here needs the wait-CDF resolution
        return baseline_flows(cluster, cls, rate, ca2, horizon_s, window_s)

    def window_load(self, cluster, cls, rate, flows):
        """The queue's load, not the machines': where the memory is full they run only what
        it admits (`_memory_full`), and the arrivals' backlog grows at the memory's load
        (the prompt route's wait law's rho; the machines' compute load elsewhere)."""
        rho = flows.prompt_routes[0].wait.rho if MEMORY_FULL else flows.st_p.rho_prompt
        return rho, jnp.ones_like(rho)


def baseline_flows(cluster, cls: Classes, lam, ca2, horizon_s, window_s=None) -> Flows:
    """A baseline's flows: one route for prompts, one for decodes, on the one pool."""
    P = cluster.prompt
    n_p = jnp.asarray(cluster.n_prompt, float)
    mem_ctx = cls.ctx if (cls.mem_ctx is None or not MEMORY_FULL) else cls.mem_ctx
    cap_P = _kv_capacity_tokens(P, cluster) / mem_ctx
    mbt = cluster.scheduling.max_batch_tokens
    # issue 39: decodes over a window that starts empty (pool.window_share); queued
    # prompts share iterations (pool._batched_rates; `batching`: computed once, here)
    batching = prompt_batching(cls.wp, cls.p, mbt)

    def state_at(rate):  # requests (prompts, then their decodes) at this rate
        return pool_state(P, n_p, rate, cls.wp, cls.p, cls.p_sq, rate, cls.mean_iters, cls.ctx, cap_P, mbt,
                          window_s=window_s, batch_prompts=batching)

    st = st_full = state_at(lam)
    pressure = st.batch_need / cap_P
    # routed on arrival: a waiting prompt waits on its machine (queueing.routed_residual_s)
    mem_on = memory_wait.switch(pressure)
    if MEMORY_WAIT and MEMORY_FULL:
        st, scale, onset = _memory_full(st, lam, n_p, cap_P, cls, mbt, window_s, P, batching)
        wm = wait_model(lam, st.mean_prompt_s * scale, st.scv_prompt, n_p, ca2, horizon_s, ROUTED_SHARE_COLOCATED)
        if window_s is not None:  # the memory's load comes once it has filled (`queueing.drift_at`)
            # (a trace's windows, each `horizon_s` of the run's `window_s`: the same share of each)
            wm = wm._replace(jump=wm.rho * (1.0 - 1.0 / scale), jump_s=onset * horizon_s / window_s)
        mem_on = 0.0
    elif MEMORY_WAIT:
        st, scale, onset = _memory_wait(st, pressure, lam, n_p, cap_P, state_at)
        wm = memory_wait.after_onset(wait_model(lam, st.mean_prompt_s * scale, st.scv_prompt, n_p, ca2, horizon_s,
                                                ROUTED_SHARE_COLOCATED), onset, window_s)
    else:
        wm = wait_model(lam, st.mean_prompt_s, st.scv_prompt, n_p, ca2, horizon_s, ROUTED_SHARE_COLOCATED)
    # a trace's windows (`Burstiness`) each start where the run's population stands:
    # the rise is the run's, not each window's, and is left out there
    if RISING_LOAD and window_s is not None and not isinstance(ca2, Burstiness):
        wm = _rising_load(wm, st_full, mem_on if MEMORY_WAIT else 0.0, cls, lam, n_p, mbt, window_s, P, batching)
    zero = jnp.zeros_like(cls.p)
    burst, burst_var = own_burst_iters(ca2, st.mean_prompt_s, n_p)
    # prompts run only while requests arrive: a decode's steps past the window's end
    # sit through none (pool.interfered_share)
    window = horizon_s if window_s is None else window_s
    inside, inside_var = interfered_share(cls.iters * st.step_s, window)
    decode = DecodeRoute(st, jnp.ones_like(cls.w), zero, 0.0, burst, burst_var, interfered_share=inside,
                         interfered_var=inside_var * cls.iters**2)
    return Flows((PromptRoute(st, wm, jnp.ones_like(cls.p)),), (decode,),
                 st, None, zero, jnp.asarray(0.0), pressure, (st.rho_prompt, pressure))


def _memory_wait(st, pressure, lam, n_p, cap_P, state_at):
    """Decodes that need more KV memory than the machines hold (`memory_wait`, f = 1):
    memory admits a share of the arrivals, the machines run prompts and decodes at that
    rate (`state_at(rate)`, the pool's state there, solved only where memory binds: a
    change below 1e-7 of the rate otherwise; under vmap both branches run), and the rest
    queue from when memory has filled. Past the machines' compute capacity (rho > 1)
    requests are admitted at its rate, not the arrival rate, so the decodes need that
    much less memory. Returns (the pool's state, the factor on its prompt service time
    that gives its queue the memory's load, the wait's onset in s)."""
    rho = lam * st.mean_prompt_s / n_p
    need = pressure / (1.0 + softplus(rho - 1.0, memory_wait.TEMPERATURE))
    scale, admitted = memory_wait.memory_bound(st.decode_s, st.step_s, need, 1.0, rho)
    onset = memory_wait.switch(need) * cap_P * n_p / jnp.maximum(lam, 1e-9)  # memory filled from empty

    def admitted_state():
        return jax.tree.map(lambda a, b: jnp.asarray(a, jnp.result_type(b)), state_at(lam * admitted), st)

    st_a = jax.lax.cond(jnp.any(admitted < 1.0 - 1e-7), admitted_state, lambda: st)
    # the queue's service law stays the full rate's (`scale` carries the memory's load)
    return st_a._replace(mean_prompt_s=st.mean_prompt_s, scv_prompt=st.scv_prompt), scale, onset


def _memory_full(st, lam, n_p, cap, cls, mbt, window_s, timing, batching):
    """A pool whose KV memory fills (f = 1): after it fills, requests are admitted at
    the rate the full memory turns over, and the rest queue.

    With the memory full, B = cap decodes each hold it for R(a) = iters x step(a), and
    a share a of the arrivals is admitted: a lambda / n x R(a) = cap. A decode's step
    with prompts first is t_d / (1 - a q), q = 1 - t_d / step the prompt iterations'
    share of its time at full admission, so a = 1 / (1 + u (rho_m - 1)), u = t_d /
    step, rho_m = lambda R / (n cap) the memory needed at full admission (stationary:
    the memory holds the decodes past the window's start). The memory fills from empty
    in -R log(1 - 1 / rho_m) (the population lambda R (1 - e^{-t/R}) reaching cap); the
    share of the window after that is the share that runs memory-full, at B = cap (the
    pool's state there at the admitted rate, `pool_state_at`: no solve). Past
    the machines' compute capacity (rho > 1) they admit at most 1 / rho of the arrivals
    (prompts back to back), so the memory is asked for rho_m / rho and the share
    admitted is a / rho: the queue's load is rho_q = max(rho, 1) (1 + u (rho_m / max(rho,
    1) - 1)) (smooth), 1 / a below compute capacity.
    Returns (the pool's state, the factor on the prompt service time giving the queue
    the memory's load once it has filled, and when it has (s))."""
    rho = lam * st.mean_prompt_s / n_p
    rho_cap = 1.0 + softplus(rho - 1.0, memory_wait.TEMPERATURE)     # max(rho, 1)
    resid = cls.mean_iters * st.step_s
    g = 1.0 if window_s is None else window_share(resid, window_s)
    rho_m = st.batch_need / jnp.maximum(g, 1e-9) / cap / rho_cap
    over = softplus(rho_m - 1.0, memory_wait.TEMPERATURE)
    u = st.decode_s / jnp.maximum(st.step_s, 1e-9)
    rho_q = rho_cap * (1.0 + u * over)
    fill = resid * -jnp.log1p(-1.0 / (1.0 + over + 1e-6))
    full = 1.0 if window_s is None else jax.nn.sigmoid((memory_wait.ONSET_MAX - fill / window_s) / _FULL_WIDTH)
    on = memory_wait.switch(rho_m) * full
    rho_c = jnp.maximum(rho, 1e-9)
    scale = 1.0 + on * softplus(rho_q - rho_c, memory_wait.TEMPERATURE) / rho_c
    admitted = 1.0 / (1.0 + on * softplus(rho_q - 1.0, memory_wait.TEMPERATURE))

    def admitted_state():
        b = st.batch + on * (cap - st.batch)   # the window's population, full memory after T_f
        st_m = pool_state_at(timing, n_p, lam * admitted, cls.wp, cls.p, cls.p_sq, lam * admitted, cls.mean_iters,
                             cls.ctx, b, mbt, window_s, batch_prompts=batching)
        return jax.tree.map(lambda a, b_: jnp.asarray(a, jnp.result_type(b_)), st_m, st)

    st_a = jax.lax.cond(jnp.any(admitted < 1.0 - 1e-7), admitted_state, lambda: st)
    return st_a._replace(mean_prompt_s=st.mean_prompt_s, scv_prompt=st.scv_prompt), scale, fill


def _rising_load(wm, st, mem_on, cls, lam, n_p, mbt, window_s, timing, batching):
    """The prompt queue's load rising through the window (`queueing.drift_at`).

    A run starts empty and its decoding population builds as lambda R (1 - exp(-t / R))
    (R the decode's residence; `pool.window_share`), and each prompt iteration carries
    the decodes that ride along with it (prompts first), so the prompt work per prompt
    grows with it: from the pool's load with no decodes (the state at B ~ 0, one more
    evaluation of the iterations, no solve) at the window's start to more than the
    window's mean (`st`, the state at the population's mean over the window) at its
    end. The queue builds only once that load has passed 1 (in our simulator, Llama2-70B
    conversation baselines at 0.9 of capacity: the prompt queue starts to grow 20-40 s
    into a 120 s window). Where the decodes need more KV memory than the machines hold,
    the memory's load joins it once the memory has filled (a jump, `_memory_full`);
    with `MEMORY_FULL` off the old memory queue (`memory_wait`) sets the wait instead and
    the ramp is switched off with it (`mem_on`, its switch)."""
    st0 = pool_state_at(timing, n_p, lam, cls.wp, cls.p, cls.p_sq, lam, cls.mean_iters, cls.ctx,
                        jnp.asarray(_EMPTY_BATCH), mbt, window_s, batch_prompts=batching)
    rise = jnp.maximum(st.rho_prompt - st0.rho_prompt, 0.0) * (1.0 - mem_on)
    return wm._replace(rise=rise, ramp_s=cls.mean_iters * st.step_s)


# Width (in fill time over the window) of the switch that turns the memory-full regime
# off where the memory would fill only at the window's end (`_memory_full`).
_FULL_WIDTH = 0.05

# The decoding population at the window's start (requests per machine; `_rising_load`).
_EMPTY_BATCH = 1e-6


def own_burst_iters(ca2, mean_prompt_s, n_machines):
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
