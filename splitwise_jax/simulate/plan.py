"""The cluster as the simulator sees it: plain numbers and the timing tables, no JAX.

A `Cluster` is a pytree of JAX arrays and strategy objects (`designs.make_cluster`).
The event loop (`engine`) and the report (`report`) need only a few numbers of it -
per pool its machine count, name, KV memory, idle and host power, price and
provisioned power; the model's KV bytes per token and weights; the link - and the
timing tables of its machine types. `SimPlan` holds those numbers (`plan_of` reads them
from a cluster, once, on the JAX side) and `SimTables` the tables (`tables_of` builds
them from the cluster's strategies, `timing`). Every run goes through them
(`api.run_plan`): `simulate(cluster, trace)` builds both, and a warm command line
(`cli.simulate_warm`) reads both back from disk and runs without importing JAX, with the same
numbers and the same tables, so the same output byte for byte.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from splitwise_jax.simulate.policies import SPLITWISESIM_WEIGHTS_BYTES, SimConfig
from splitwise_jax.simulate.tables import FastTiming, GridTable, TokenTable

__all__ = ["PoolPlan", "SimPlan", "SimTables", "plan_of", "tables_of"]


@dataclasses.dataclass(frozen=True)
class PoolPlan:
    """One pool's machines as the simulator and its report use them.

    Attributes:
        count: machines (whole).
        hw_name: the hardware name of SplitwiseSim's records (GPU name, "-pcap" capped).
        kv_capacity_bytes: bytes a machine holds (all its GPUs' HBM less the reserve).
        gpus: GPUs per machine.
        idle_w: per-GPU idle power, W.
        host_power_w: per-machine host power, W.
        cost_per_hour: per-machine price, $/h.
        provisioned_power_w: per-machine provisioned power at its cap, W.
    """

    count: int
    hw_name: str
    kv_capacity_bytes: float
    gpus: float
    idle_w: float
    host_power_w: float
    cost_per_hour: float
    provisioned_power_w: float


@dataclasses.dataclass(frozen=True)
class SimPlan:
    """The numbers of a cluster the simulator runs (see the module docstring).

    Attributes:
        kind: the design's kind (for messages).
        token_pool: whether the design has a token pool (Splitwise) or one pool.
        prompt: the prompt pool (a colocated design's only pool).
        token: the token pool (count 0 without one).
        kv_bytes_per_token: KV-cache bytes per token (the link's GQA reading).
        weights_bytes: weight bytes per machine (SplitwiseSim's figure where its memory
            accounting is asked for).
        link_bytes_per_s: KV-transfer bandwidth; link_setup_s: per-transfer set-up.
        layerwise: layer-wise transfer (else serialized); n_layers: the model's layers.
    """

    kind: str
    token_pool: bool
    prompt: PoolPlan
    token: PoolPlan
    kv_bytes_per_token: float
    weights_bytes: float
    link_bytes_per_s: float
    link_setup_s: float
    layerwise: bool
    n_layers: int

    def pools(self) -> tuple[tuple[str, PoolPlan], ...]:
        """(role, pool) of the pools with machines, prompt first."""
        return tuple((r, p) for r, p in (("prompt", self.prompt), ("token", self.token)) if p.count)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SimPlan":
        return cls(**{**d, "prompt": PoolPlan(**d["prompt"]), "token": PoolPlan(**d["token"])})


@dataclasses.dataclass
class SimTables:
    """The timing tables of a run: per pool the iteration times the loop reads and the
    power its blocks are charged, and the slowdown reference (each whole prompt size's
    TTFT and TBT alone, `timing.alone_s`)."""

    prompt: FastTiming
    token: FastTiming
    prompt_power: GridTable | None
    token_power: GridTable | None
    alone_ttft_s: np.ndarray
    alone_tbt_s: np.ndarray

    def alone_s(self, prompt_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(TTFT, TBT) alone of whole prompt sizes (`timing.alone_s`'s table)."""
        i = np.asarray(prompt_tokens).astype(np.int64)
        return self.alone_ttft_s[i], self.alone_tbt_s[i]

    def covers(self, extents: dict, max_prompt: int) -> bool:
        """Whether the tables reach a run's extents (`engine.table_extents`) and prompt
        sizes (tables grown on demand can still raise `TablesTooSmall` mid-run)."""
        if max_prompt >= self.alone_ttft_s.size:
            return False
        for t in (self.prompt, self.token, self.prompt_power, self.token_power):
            if t is None:
                return False
            if t.max_tokens < extents["max_tokens"] or t.max_batch < extents["max_batch"]:
                return False
            if isinstance(t, GridTable) and t.max_context < extents["max_context"]:
                return False
        return True


def _hw_name(timing) -> str:
    name = str(timing.machine.gpu.name)
    cap = float(np.asarray(timing.cap_frac))
    # SplitwiseSim names its capped H100 profile "h100-80gb-pcap"
    return name if cap >= 1.0 else f"{name}-pcap"


def _whole(name: str, x) -> int:
    import math

    x = float(np.asarray(x))
    if not (math.isfinite(x) and x >= 1 and abs(x - round(x)) < 1e-9):
        raise ValueError(f"the simulator needs whole machines: cluster.{name} = {x!r} (round the pool size)")
    return int(round(x))


def plan_of(cluster, cfg: SimConfig = SimConfig()) -> SimPlan:
    """The numbers the simulator reads from a cluster (whole pool sizes), under `cfg`.

    Raises:
        ValueError: a design the simulator does not run as it is (`policies.simulated`
            gives what it runs), or a pool size that is not a whole number of machines.
    """
    from splitwise_jax.phases import power as _power

    design = cluster.strategy
    design.check(cluster)
    if not design.simulated_as_is:
        raise ValueError(f"a {cluster.kind!r} cluster runs in the simulator as simulate.policies.simulated(cluster) "
                         "gives it (the cluster to run and its SimConfig), not as it is")
    llm = cluster.prompt.llm
    tr = cluster.transfer
    ref = cfg.reference_memory if cfg.reference_memory is not None else bool(tr.ignore_gqa)
    if ref and llm.name in SPLITWISESIM_WEIGHTS_BYTES:
        weights = SPLITWISESIM_WEIGHTS_BYTES[llm.name]
    else:
        weights = float(llm.weight_bytes)
    reserve = float(cluster.scheduling.memory_reserve_frac)

    def pool(timing, count: int) -> PoolPlan:
        m = timing.machine
        return PoolPlan(count=count, hw_name=_hw_name(timing),
                        kv_capacity_bytes=float(m.gpus_per_machine) * float(m.gpu.hbm_bytes) * (1.0 - reserve),
                        gpus=float(m.gpus_per_machine), idle_w=float(m.gpu.idle_w), host_power_w=float(m.host_power_w),
                        cost_per_hour=float(m.cost_per_hour),
                        provisioned_power_w=float(_power.provisioned_power_w(m, timing.cap_frac)))

    n_t = _whole("n_token", cluster.n_token) if design.token_pool else 0
    return SimPlan(kind=str(cluster.kind), token_pool=bool(design.token_pool),
                   prompt=pool(cluster.prompt, _whole("n_prompt", cluster.n_prompt)), token=pool(cluster.token, n_t),
                   kv_bytes_per_token=float(llm.kv_bytes_per_token(bool(tr.ignore_gqa))), weights_bytes=float(weights),
                   link_bytes_per_s=float(tr.bandwidth_bytes_per_s), link_setup_s=float(tr.setup_s),
                   layerwise=tr.mode == "layerwise", n_layers=int(llm.n_layers))


def tables_of(cluster, extents: dict, max_prompt: int, fast: dict | None = None, power: bool = True) -> SimTables:
    """A cluster's tables at a run's extents (`engine.table_extents`), from its
    strategies (`timing.fast_timing`, `timing.power_grid`, `timing.alone_s`; kept in
    the process and, for a command line, on disk). `fast` reuses prebuilt iteration
    timings ({"prompt", "token"}, `engine.build_fast_timings`); without `power` the
    power grids are left out (None)."""
    from splitwise_jax.simulate import timing as _timing

    if fast is None:
        prompt = _timing.fast_timing(cluster.prompt, **extents)
        token = _timing.fast_timing(cluster.token, **extents) if cluster.strategy.token_pool else prompt
    else:
        prompt, token = fast["prompt"], fast["token"]
    ttft, tbt = _timing.alone_table(cluster.alone, max_prompt)
    grids = [_timing.power_grid(t, **extents) if power else None for t in (cluster.prompt, cluster.token)]
    return SimTables(prompt=prompt, token=token, prompt_power=grids[0], token_power=grids[1], alone_ttft_s=ttft,
                     alone_tbt_s=tbt)


def table_kind(t: FastTiming) -> str:
    """"token" (`TokenTable`) or "grid" (`GridTable`): how a stored table is rebuilt."""
    if isinstance(t, TokenTable):
        return "token"
    if isinstance(t, GridTable):
        return "grid"
    raise TypeError(f"a {type(t).__name__} is neither a TokenTable nor a GridTable")
