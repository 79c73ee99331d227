"""GPU power and the continuous power cap (DVFS) model.

Power above idle is proportional to activity: compute utilisation draws
`p_compute_frac` of (TDP - idle), memory-bandwidth utilisation `p_memory_frac`
(Splitwise insight VI: prompt power rises with batch, decode power is flat).
A cap below the demand lowers the clock until demand fits: power above idle scales
as clock**dvfs_exponent, so clock = ((cap - idle) / (demand - idle))**(1/dvfs_exponent),
at most 1 (Splitwise insight VII and Fig. 9; MODELING.md "Power"). The capped clock
itself, with the time components that stretch as 1/clock, is solved in
`phases.py` (`_CLOCK_NEWTON_STEPS`); this module holds the draw and the accounting.

References:
    Patel et al., Splitwise, ISCA 2024, §III-F, Figs. 8-9.
"""

from __future__ import annotations

import jax.numpy as jnp

from splitwise_jax._smooth import smooth_min_pos
from splitwise_jax.specs.hardware import GPU, Machine
from splitwise_jax.phases.params import PhaseParams


def power_cap_w(gpu: GPU, cap_frac):
    """Cap in watts from a fraction of TDP."""
    return cap_frac * gpu.tdp_w


def power_demand_w(params: PhaseParams, gpu: GPU, u_compute, u_memory):
    """Power one GPU would draw at full clock (W), from utilisations in [0, 1]."""
    activity = params.p_compute_frac * u_compute + params.p_memory_frac * u_memory
    return gpu.idle_w + (gpu.tdp_w - gpu.idle_w) * activity


def capped_power_w(gpu: GPU, demand_w, cap_frac=1.0):
    """Power actually drawn: the demand, limited (smoothly) by the cap (W)."""
    return smooth_min_pos(demand_w, power_cap_w(gpu, cap_frac), p=16.0)


def machine_power_w(machine: Machine, gpu_power_w):
    """Whole-machine draw from per-GPU draw (W): GPUs plus host."""
    return machine.gpus_per_machine * gpu_power_w + machine.host_power_w


def provisioned_power_w(machine: Machine, cap_frac=1.0):
    """Power provisioned for a machine at a cap (W), SplitwiseSim's accounting (HHcap
    token machines count cap x the machine's power)."""
    return machine.provisioned_power_w * cap_frac
