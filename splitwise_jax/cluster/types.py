"""The cluster model's data types below the designs: the KV link and the scheduler
(`Transfer`, `Scheduling`; parts of a `cluster.Cluster`), and what every design's flow
model builds and the shared stages read: the request classes (`Classes`), the routes
(`PromptRoute`, `DecodeRoute`) and the flows (`Flows`). `ClusterMetrics` lives in
`metrics` (re-exported here). The flow modules (`flows_baseline`, `flows_splitwise`,
`chunked`) import these, and `cluster` imports them, so none imports `cluster`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import NamedTuple

import jax

from splitwise_jax.cluster.metrics import ClusterMetrics as ClusterMetrics
from splitwise_jax.cluster.pool import PoolState
from splitwise_jax.cluster.queueing import WaitModel
from splitwise_jax.phases import memory
from splitwise_jax.phases.timing import PhaseTiming

_STATIC = dict(static=True)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Transfer:
    """How the KV cache moves between machines.

    Attributes:
        bandwidth_bytes_per_s: bytes/s of one transfer.
        setup_s: fixed cost per transfer (s).
        mode: "serialized" or "layerwise" (static).
        ignore_gqa: size the cache with every attention head, as SplitwiseSim does (static).
    """

    bandwidth_bytes_per_s: jax.Array | float
    setup_s: jax.Array | float
    mode: str = field(default="serialized", metadata=_STATIC)
    ignore_gqa: bool = field(default=False, metadata=_STATIC)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Scheduling:
    """Scheduler knobs (floats are traced). Defaults are SplitwiseSim's settings
    (shared/validation/README.md and its scheduler configuration).

    Attributes:
        max_batch_tokens: tokens one iteration may carry (prompt tokens + one per
            decode); a larger prompt runs alone and the decodes wait (2,048).
        draft_pending_tokens: a prompt is drafted onto a token machine (the mixed pool)
            when the least-loaded prompt machine has a queue and its pending tokens plus
            this prompt would exceed this (8,192).
        memory_reserve_frac: HBM fraction not available to the KV cache.
        max_batch_size: decoding requests one iteration may carry; past it decodes wait
            for a slot (512, SplitwiseSim's; the simulator runs with it,
            `simulate.policies.simulated`). The model holds Splitwise's token pool under
            it (`flows_splitwise.BATCH_SLOTS`); the colocated and mixed pools' batches
            are not capped (docs/cluster.md §4, *Batch slots*).
        service_jitter_rel: relative spread given to each class's deterministic
            latency (the width of a workload bin and the profiles' ~1-2% repeat noise);
            it also turns CDF steps into slopes so percentiles have gradients.
    """

    max_batch_tokens: jax.Array | float = 2048.0
    draft_pending_tokens: jax.Array | float = 8192.0
    memory_reserve_frac: jax.Array | float = 0.0
    max_batch_size: jax.Array | float = 512.0
    service_jitter_rel: jax.Array | float = 0.03


class Classes(NamedTuple):
    """Request classes of a workload: K prompt sizes x M output sizes."""

    p: jax.Array          # (K,) prompt tokens
    p_sq: jax.Array       # (K,)
    o: jax.Array          # (M,) output tokens
    w: jax.Array          # (K, M) joint probability
    wp: jax.Array         # (K,) prompt marginal
    iters: jax.Array      # (M,) decode iterations o - 1
    mean_iters: jax.Array
    ctx: jax.Array        # mean KV context of a decoding request (tokens)
    # KV tokens a decoding request holds under the simulators' reservation (prompt and
    # its whole output, reserved when it starts), averaged over its decode iterations;
    # None: `ctx` (memory grown token by token).
    mem_ctx: jax.Array | None = None


class PromptRoute(NamedTuple):
    state: PoolState
    wait: WaitModel
    weight: jax.Array     # (K,) share of each prompt class taking this route
    backlog_s: jax.Array | float = 0.0  # queue left by earlier windows of a trace (s)
    # A share of the route's prompts that run on machines in another state (the prompt
    # pool's mixed machines, which hold moved decodes): same wait, their own prompt
    # iteration and residual. TTFT keeps the two apart; E2E blends their means.
    other_state: PoolState | None = None
    other_share: jax.Array | float = 0.0


class DecodeRoute(NamedTuple):
    state: PoolState
    weight: jax.Array     # (K, M) share of each class's decodes taking this route
    transfer_s: jax.Array  # (K,) KV transfer before the decode
    join_s: jax.Array     # wait to join the running batch
    # Prompt iterations of the decode's own burst (a trace's arrivals) queued behind its
    # prompt on its machine, which run before its decode steps: mean and variance.
    burst_iters: jax.Array | float = 0.0
    burst_iters_var: jax.Array | float = 0.0
    # Decode steps that sit through prompt interference at this route's rate: all of
    # them in a steady state; in a trace's queued regime only those before the pool's
    # backlog drains (`window.window_components`).
    interfered_steps: jax.Array | float = 1e9
    # (M,) share of each output class's steps inside the arrival window, where prompts
    # run (`pool.interfered_share`; 1: all of them).
    interfered_share: jax.Array | float = 1.0
    # (M,) variance of the number of those steps over where the decode starts (steps^2).
    interfered_var: jax.Array | float = 0.0
    # The decode's first step waits out the prompt iteration its machine is running when
    # it arrives (the moved decodes, on mixed machines that run drafted prompts): that
    # chance, and the residual iteration's mean and second moment (s, s^2).
    first_busy: jax.Array | float = 0.0
    first_wait_s: jax.Array | float = 0.0
    first_wait_s2: jax.Array | float = 0.0
    # The wait for a batch slot before the first step (a pool past its batch-size cap):
    # variance over where in the window the decode arrives (s^2); its mean is in join_s.
    join_var_s2: jax.Array | float = 0.0


class Flows(NamedTuple):
    """Who runs where: each pool's steady state and each route's share."""

    prompt_routes: tuple
    decode_routes: tuple
    st_p: PoolState
    st_t: PoolState | None
    drafted: jax.Array        # (K,) share of each prompt class drafted onto token machines
    moved: jax.Array          # share of decodes run on prompt machines
    memory_pressure: jax.Array
    loads: tuple              # saturation measures (1 = full) that cap throughput


def _kv_capacity_tokens(timing: PhaseTiming, cluster):
    """KV-cache tokens one machine of this timing holds in this cluster (its scheduler's
    memory reserve, its transfer's GQA convention)."""
    return memory.kv_capacity_tokens(timing.llm, timing.machine, reserve_frac=cluster.scheduling.memory_reserve_frac,
                                     ignore_gqa=cluster.transfer.ignore_gqa)
