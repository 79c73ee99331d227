"""Input checks that raise ValueError naming the argument and what is accepted.

Checks run only on concrete (non-traced) values; under jit the model relies on its own
smooth clipping and on status fields, so sweeps never stop on one bad point.
"""

from __future__ import annotations

import math
from typing import Iterable

import jax
import numpy as np


def is_concrete(x) -> bool:
    """True for Python numbers and concrete arrays; False for tracers and for the
    placeholders JAX puts in pytrees while lowering (those skip validation)."""
    leaves = jax.tree_util.tree_leaves(x)
    return all(isinstance(leaf, (int, float, np.ndarray, np.number, jax.Array)) and not isinstance(leaf, jax.core.Tracer)
               for leaf in leaves)


def check_positive(name: str, value, *, allow_zero: bool = False, unit: str = "") -> None:
    """Raise ValueError if a concrete value is NaN, infinite, negative (or zero)."""
    if not is_concrete(value):
        return
    arr = np.asarray(value, dtype=float)
    what = f" {unit}" if unit else ""
    if np.any(np.isnan(arr)):
        raise ValueError(f"{name} must be a finite number{what}, got NaN")
    if np.any(np.isinf(arr)):
        raise ValueError(f"{name} must be finite{what}, got {value!r}")
    bad = arr < 0 if allow_zero else arr <= 0
    if np.any(bad):
        rule = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {rule}{what}, got {value!r}")


def check_range(name: str, value, lo: float, hi: float, *, unit: str = "") -> None:
    """Raise ValueError if a concrete value falls outside [lo, hi]."""
    if not is_concrete(value):
        return
    arr = np.asarray(value, dtype=float)
    if np.any(~np.isfinite(arr)) or np.any(arr < lo) or np.any(arr > hi):
        what = f" {unit}" if unit else ""
        raise ValueError(f"{name} must lie in [{lo:g}, {hi:g}]{what}, got {value!r}")


def check_choice(name: str, value, choices: Iterable[str]) -> str:
    """Return value if it is one of choices, else raise ValueError listing them."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_int(name: str, value, lo: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        if isinstance(value, float) and value.is_integer() and value >= lo and math.isfinite(value):
            return int(value)
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)
