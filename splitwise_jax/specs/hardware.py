"""GPU and machine specifications as frozen pytree dataclasses (SI units in names).

Numeric fields are pytree leaves, so `jax.grad` with respect to bandwidth, FLOP/s,
TDP or cost needs nothing special. Fields that are names or counts that change shapes
are static metadata.

References:
    Patel et al., Splitwise, ISCA 2024, Table I (A100 vs H100 and DGX machines).
"""

from __future__ import annotations

import dataclasses
from dataclasses import field

import jax

from splitwise_jax._validate import check_positive

_STATIC = dict(static=True)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GPU:
    """One accelerator.

    Attributes:
        name: catalogue name, e.g. "a100-80gb" (static).
        peak_flops_per_s: dense fp16/bf16 tensor-core FLOP/s (no sparsity).
        peak_fp8_flops_per_s: dense fp8 tensor-core FLOP/s (no sparsity), used by models
            with fp8 weights; None for a GPU without fp8 tensor cores, whose fp8 weights
            are up-converted and run at `peak_flops_per_s` (catalogue GPUs state it
            explicitly, e.g. A100 = its fp16 figure, so all of them share one pytree
            structure and stack for `jax.vmap`).
        hbm_bytes: HBM capacity in bytes.
        hbm_bw_bytes_per_s: HBM bandwidth in bytes/s.
        tdp_w: board power limit at full clock (W).
        idle_w: power drawn by an idle, clocked-up GPU (W).
        min_cap_w: lowest power cap the board accepts (W).
    """

    peak_flops_per_s: float
    hbm_bytes: float
    hbm_bw_bytes_per_s: float
    tdp_w: float
    idle_w: float
    min_cap_w: float
    peak_fp8_flops_per_s: float | None = None
    name: str = field(default="custom-gpu", metadata=_STATIC)

    def __post_init__(self):
        # Only plain numbers are checked: JAX rebuilds these classes with tracers and with
        # cotangents (which may be negative) when differentiating with respect to them.
        for f in ("peak_flops_per_s", "hbm_bytes", "hbm_bw_bytes_per_s", "tdp_w", "idle_w", "min_cap_w",
                  "peak_fp8_flops_per_s"):
            if isinstance(getattr(self, f), (int, float)):
                check_positive(f"GPU({self.name}).{f}", getattr(self, f))

    def peak_flops_for(self, fp8: bool):
        """Dense tensor-core FLOP/s for fp8 GEMMs (`fp8=True`) or fp16/bf16 ones."""
        if fp8 and self.peak_fp8_flops_per_s is not None:
            return self.peak_fp8_flops_per_s
        return self.peak_flops_per_s


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Machine:
    """A server of identical GPUs; one model instance per machine (tensor parallel = GPUs).

    Attributes:
        gpu: the accelerator.
        nvlink_bytes_per_s: intra-machine GPU-to-GPU bandwidth per GPU per direction
            (NVLink, or AMD Infinity Fabric on MI300X platforms), bytes/s.
        ib_bytes_per_s: inter-machine (InfiniBand or RoCE) bandwidth per GPU (bytes/s).
        cost_per_hour: rental cost of the whole machine ($/h).
        provisioned_power_w: power provisioned for the whole machine at an uncapped
            TDP (W); used for iso-power budgets. Scales with the power-cap fraction.
        host_power_w: non-GPU power of the machine (CPUs, NICs, fans), in the
            physical power model (W).
        kv_setup_s: fixed software cost of one KV-cache transfer (connection set-up,
            synchronisation), seconds.
        gpus_per_machine: GPUs in the machine (static).
        name: catalogue name (static).
    """

    gpu: GPU
    nvlink_bytes_per_s: float
    ib_bytes_per_s: float
    cost_per_hour: float
    provisioned_power_w: float
    host_power_w: float
    kv_setup_s: float
    gpus_per_machine: int = field(default=8, metadata=_STATIC)
    name: str = field(default="custom-machine", metadata=_STATIC)

    def __post_init__(self):
        for f in ("nvlink_bytes_per_s", "ib_bytes_per_s", "cost_per_hour", "provisioned_power_w"):
            if isinstance(getattr(self, f), (int, float)):
                check_positive(f"Machine({self.name}).{f}", getattr(self, f))
        for f in ("host_power_w", "kv_setup_s"):
            if isinstance(getattr(self, f), (int, float)):
                check_positive(f"Machine({self.name}).{f}", getattr(self, f), allow_zero=True)
        if not isinstance(self.gpus_per_machine, int) or self.gpus_per_machine < 1:
            raise ValueError(
                f"Machine({self.name}).gpus_per_machine must be an integer >= 1, got {self.gpus_per_machine!r}"
            )

    def replace(self, **changes) -> "Machine":
        return dataclasses.replace(self, **changes)
