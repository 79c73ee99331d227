"""GPU power and the continuous power cap (DVFS) model.

Power above idle is proportional to activity: compute utilisation draws
`p_compute_frac` of (TDP - idle), memory-bandwidth utilisation `p_memory_frac`
(Splitwise insight VI: prompt power rises with batch, decode power is flat).
A cap below the demand lowers the clock until demand fits: power above idle scales
as clock**dvfs_exponent, so clock = ((cap - idle) / (demand - idle))**(1/dvfs_exponent),
at most 1 (Splitwise insight VII and Fig. 9; MODELING.md "Power").

References:
    Patel et al., Splitwise, ISCA 2024, §III-F, Figs. 8-9.
"""

from __future__ import annotations

import jax.numpy as jnp

from splitwise_jax._smooth import safe_pow, smooth_min_one, smooth_min_pos
from splitwise_jax.hardware import GPU, Machine
from splitwise_jax.params import PhaseParams

# Clock-limit smoothing: min(x, 1) within 0.02 x log 2 ~ 1.4% at x = 1. Smaller makes
# the kink at "cap just binds" sharper for the optimiser; larger biases uncapped runs.
_CLOCK_TEMPERATURE = 0.02


def power_cap_w(gpu: GPU, cap_frac):
    """Cap in watts from a fraction of TDP."""
    return cap_frac * gpu.tdp_w


def min_cap_frac(gpu: GPU):
    return gpu.min_cap_w / gpu.tdp_w


def power_demand_w(params: PhaseParams, gpu: GPU, u_compute, u_memory):
    """Power one GPU would draw at full clock (W), from utilisations in [0, 1]."""
    activity = params.p_compute_frac * u_compute + params.p_memory_frac * u_memory
    return gpu.idle_w + (gpu.tdp_w - gpu.idle_w) * activity


def clock_fraction(params: PhaseParams, gpu: GPU, demand_w, cap_frac=1.0):
    """Clock as a fraction of maximum under a cap (1 when the cap does not bind)."""
    headroom = jnp.maximum(power_cap_w(gpu, cap_frac) - gpu.idle_w, 1e-3)
    need = jnp.maximum(demand_w - gpu.idle_w, 1e-3)
    return smooth_min_one(safe_pow(headroom / need, 1.0 / params.dvfs_exponent), _CLOCK_TEMPERATURE)


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
