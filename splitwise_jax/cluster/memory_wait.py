"""Waiting for KV memory: a pool whose decodes need more KV memory than its machines
hold admits fewer requests than arrive, and the rest queue (issue 39; docs/cluster.md
§4, "Waiting for KV memory").

A machine starts a prompt only when its memory holds the request. Where the decodes on
it need rho_m = B_need / B_max > 1 of that memory, the pool admits only a share a of the
requests whose decodes it holds (a share f of all). Fewer admissions also mean fewer
prompt iterations for those decodes to sit through: their step is t_d + a I (I = step -
t_d, the prompt interference at full admission, taken as proportional to the prompt
rate), so the memory they need is a (t_d + a I) / (t_d + I) of rho_m's, and a solves
I a^2 + t_d a = (t_d + I) / rho_m. Arrivals then outrun admissions by rho_q = 1 / (1 -
f + f a), and the queue grows at rho_q - 1 seconds per second whatever the machines'
compute load: the pool's queue load is max(rho, rho_q), switched on smoothly as rho_m
passes 1. A run starts empty, so the wait starts only once memory has filled
(`after_onset`).

Used by Splitwise's prompt pool (`flows_splitwise`, the moved decodes, f their share).
The colocated baselines (every decode, f = 1) use `flows_baseline._memory_full` (the
admissions a full memory turns over, from when it fills), and this law only with
`flows_baseline.MEMORY_FULL` off.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from splitwise_jax._smooth import smooth_min_one, softplus
from splitwise_jax.cluster.queueing import WaitModel

# Width of the switch (in rho_m and in load) by which a full KV memory makes arrivals wait.
TEMPERATURE = 0.02
# Most of a run's window the wait's onset may take (`after_onset`).
ONSET_MAX = 0.95


def switch(rho_m):
    """The smooth switch that turns the memory wait on as rho_m (memory needed over memory
    held) passes 1."""
    return jax.nn.sigmoid((rho_m - 1.0) / TEMPERATURE)


def memory_bound(decode_s, step_s, rho_m, f, rho):
    """(scale, admitted): the factor on the pool's service time that makes its queue load
    max(rho, rho_q), and the share of arrivals memory admits, 1 / max(rho_q, 1) (both
    smooth), for decodes of own step t_d = `decode_s` and step `step_s` needing `rho_m` of
    the memory, a share `f` of the requests, and the pool's compute load `rho`."""
    on = switch(rho_m)
    t_d = jnp.maximum(decode_s, 1e-9)
    interf = jnp.maximum(step_s - decode_s, 1e-9 * t_d)
    c = (t_d + interf) / jnp.maximum(rho_m, 1e-9)
    a = 2.0 * c / (t_d + jnp.sqrt(t_d**2 + 4.0 * interf * c))  # the root, written stably
    rho_q = 1.0 / jnp.maximum(1.0 - f + f * a, 1e-6)
    rho = jnp.maximum(rho, 1e-9)
    return (1.0 + on * softplus(rho_q - rho, TEMPERATURE) / rho,
            1.0 / (1.0 + on * softplus(rho_q - 1.0, TEMPERATURE)))


def after_onset(wm: WaitModel, onset_s, window_s) -> WaitModel:
    """The memory wait of arrivals after its onset only: the share of the run's window
    before it does not wait for memory, the rest waits over what is left of the window
    (a Poisson run's window is the wait law's horizon; a trace's windows lose the same
    share of their waits, their horizon about unchanged). Stationary flows (no window):
    as before."""
    if window_s is None:
        return wm
    window = jnp.maximum(jnp.asarray(window_s, float), 1e-9)
    before = ONSET_MAX * smooth_min_one(onset_s / (ONSET_MAX * window))
    return wm._replace(p_wait=wm.p_wait * (1.0 - before), horizon_s=wm.horizon_s * (1.0 - before * wm.horizon_s / window))
