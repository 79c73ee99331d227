"""The power-cap floor: the lowest cap a GPU accepts, as a fraction of its TDP.

One definition for the optimiser's cap bounds, the design builder's cap check, the
phase model's cap check and the power model (a cap is `cap_frac` x TDP and must lie in
[min_cap_w / tdp_w, 1]; the H100's is 200 W / 700 W).
"""

from __future__ import annotations


def cap_floor_frac(gpu):
    """min_cap_w / tdp_w of a GPU (a float for a catalogue GPU, an array for stacked rows).

    Args:
        gpu: a `hardware.GPU` (fields in W).

    Returns:
        The lowest `cap_frac` the GPU accepts (dimensionless, in (0, 1]).
    """
    return gpu.min_cap_w / gpu.tdp_w
