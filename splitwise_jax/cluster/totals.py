"""Throughput, power and cost of a cluster in its steady state (the last stage of
`evaluate`, beside the latency percentiles).

Each pool draws power by what its machines are doing: running prompts for the prompt
load's share of time, decoding (a batch of the pool's mean size) for the rest while
they hold decodes, idle otherwise (`phases.power`, per GPU, times the pool's machines);
cost and provisioned power are per machine. Throughput is the offered rate scaled down
by the worst saturation among the flows' loads (smoothly).
"""

from __future__ import annotations

import jax.numpy as jnp

from splitwise_jax._smooth import smooth_max_pos, smooth_min_one
from splitwise_jax.cluster.pool import PoolState
from splitwise_jax.cluster.types import Classes, Flows
from splitwise_jax.phases import power
from splitwise_jax.specs.batch import Batch


def pool_power_w(timing, n, st: PoolState, mean_p, mean_p2, ctx):
    """Mean power (W) of a pool of n machines in state `st`."""
    busy = smooth_min_one(st.rho_prompt, 0.02)
    decoding = 1.0 - jnp.exp(-st.batch)
    gpu = timing.machine.gpu
    b = jnp.maximum(st.batch, 1.0)
    p_prompt, p_decode = timing.power_w(Batch(prompt_tokens=jnp.stack([mean_p, 0.0]), prompt_seqs=jnp.array([1.0, 0.0]),
                                              prompt_sq_tokens=jnp.stack([mean_p2, 0.0]), decode_seqs=jnp.stack([0.0, b]),
                                              decode_ctx_tokens=jnp.stack([0.0, b * ctx])))
    per_gpu = busy * p_prompt + (1.0 - busy) * (decoding * p_decode + (1.0 - decoding) * gpu.idle_w)
    return n * power.machine_power_w(timing.machine, per_gpu)


def totals(strategy, cluster, cls: Classes, flows: Flows, lam):
    """(throughput (req/s), power (W), cost ($/h), provisioned power (W)).

    The pools are the design's (`strategy.pools`), in order with the flows' states
    (prompt or colocated pool `st_p`, token pool `st_t`)."""
    worst = flows.loads[0]
    for l_ in flows.loads[1:]:
        worst = smooth_max_pos(worst, l_, 16.0)
    throughput = lam / smooth_max_pos(1.0, worst, 16.0)
    mean_p = jnp.dot(cls.wp, cls.p)
    mean_p2 = jnp.dot(cls.wp, cls.p_sq)
    power_w = cost = prov = None
    for (_, timing, count), st in zip(strategy.pools(cluster), (flows.st_p, flows.st_t)):
        n = jnp.asarray(count, float)
        p_w = pool_power_w(timing, n, st, mean_p, mean_p2, cls.ctx)
        c = n * timing.machine.cost_per_hour
        pv = n * power.provisioned_power_w(timing.machine, timing.cap_frac)
        power_w, cost, prov = (p_w, c, pv) if power_w is None else (power_w + p_w, cost + c, prov + pv)
    return throughput, power_w, cost, prov
