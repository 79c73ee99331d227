"""The fitted phase parameters' unconstrained space.

Every field of `PhaseParams` lives in an unconstrained space mapped onto its physical
range: (lo, hi) through lo + (hi - lo) sigmoid(z), (lo, inf) through lo + exp(z).
Efficiencies are fractions of a spec-sheet peak, so no fit can claim more than the spec
sheet; p-norm and DVFS exponents exceed 1; a unit's power draw at full use is at most
(TDP - idle) for memory and NVLink and 1.5 x (TDP - idle) for the tensor cores (a board
can demand more than its TDP and then throttles: the A100 profiles' prompt power sits
at 1.00-1.03 x TDP). Without these bounds a fit gave NVLink transfers 3.4 x (TDP - idle)
to make the capped H100 prompts slow at TP8.

The calibration fits in this space (`calibrate.fit`), and the parameter error bars
(`uncertainty`, `params.ParamUncertainty`) are a Gaussian in it. Its own module, below
both, so that the model's command lines read it without importing the calibration
package (and the pandas it tabulates with).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from splitwise_jax.phases.params import PhaseParams

FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(PhaseParams))

_INF = float("inf")
BOUNDS: dict[str, tuple[float, float]] = {
    **{f: (0.0, 1.0) for f in ("mfu_max", "attn_eff", "bw_eff", "kv_bw_eff", "link_eff", "kv_link_eff",
                               "mem_clock_sensitivity", "p_memory_frac", "p_comm_frac")},
    **{f: (1.0, _INF) for f in ("roofline_p", "overlap_p", "dvfs_exponent")},
    "p_compute_frac": (0.0, 1.5),
}
_LO = np.array([BOUNDS.get(f, (0.0, _INF))[0] for f in FIELDS])
_HI = np.array([BOUNDS.get(f, (0.0, _INF))[1] for f in FIELDS])
_BOUNDED = np.isfinite(_HI)


def _to_raw(params: PhaseParams) -> np.ndarray:
    """Unconstrained values of a parameter set (inverse of `_from_raw`)."""
    v = np.array([float(getattr(params, f)) for f in FIELDS])
    bad = [f"{f}={x:g} not in ({lo:g}, {hi:g})" for f, x, lo, hi in zip(FIELDS, v, _LO, _HI) if not lo < x < hi]
    if bad:
        raise ValueError(f"starting values out of range: {bad}")
    span = np.where(_BOUNDED, _HI - _LO, 1.0)
    u = np.where(_BOUNDED, (v - _LO) / span, 0.5)
    return np.where(_BOUNDED, np.log(u) - np.log1p(-u), np.log(v - _LO))


def _from_raw(z):
    """Field values (last axis = FIELDS) from unconstrained values."""
    lo = jnp.asarray(_LO)
    span = jnp.asarray(np.where(_BOUNDED, _HI - _LO, 1.0))
    # where() between two finite branches: both are finite for every z
    return jnp.where(jnp.asarray(_BOUNDED), lo + span * jax.nn.sigmoid(z), lo + jnp.exp(z))
