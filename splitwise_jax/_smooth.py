"""Smooth, everywhere-differentiable stand-ins for max, min, relu and clip.

Every smoothing here carries an explicit temperature. The trade: a smaller temperature
follows the sharp function more closely but gives larger curvature (harder for gradient
optimisers and for finite-difference checks); the defaults were chosen so the smoothing
error is below the measurement noise of the profiles (about 1%).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

_TINY = 1e-30


def den_floor(dtype) -> float:
    """Floor of a denominator in this dtype: 1e-30 in float64, 1e-18 in float32.

    The derivative of n / d with respect to d is -n / d**2, which JAX evaluates even where
    a floor max(d, eps) holds d constant (its tangent is then zero): 1e-30**-2 overflows
    float32 to inf, and zero times inf is NaN. 1e-18 keeps d**-2 (1e36) finite there;
    float64 keeps the smaller floor it always had.
    """
    return 1e-30 if jnp.finfo(dtype).bits > 32 else 1e-18


def softplus(x, temperature=1.0):
    """temperature * log(1 + exp(x / temperature)): a smooth relu, exact as T -> 0."""
    t = jnp.asarray(temperature)
    return t * jax.nn.softplus(x / t)


def smooth_max_pos(a, b, p=4.0):
    """p-norm max of two positive numbers: (a^p + b^p)^(1/p).

    Used to combine compute time and memory time (a roofline with a soft corner).
    Computed in log space so neither large nor tiny arguments overflow; at a == b it
    returns 2^(1/p) * a, which is the physical overlap inefficiency the fit calibrates.
    """
    la = jnp.log(jnp.maximum(a, _TINY))
    lb = jnp.log(jnp.maximum(b, _TINY))
    return jnp.exp(jnp.logaddexp(p * la, p * lb) / p)


def smooth_min_pos(a, b, p=4.0):
    """p-norm min of two positive numbers: (a^-p + b^-p)^(-1/p)."""
    la = jnp.log(jnp.maximum(a, _TINY))
    lb = jnp.log(jnp.maximum(b, _TINY))
    return jnp.exp(-jnp.logaddexp(-p * la, -p * lb) / p)


def smooth_min_one(x, temperature=0.02):
    """min(x, 1) smoothed: 1 - softplus(1 - x). Off by at most T*log 2 at x = 1."""
    return 1.0 - softplus(1.0 - x, temperature)


def safe_div(num, den, eps=None):
    """num / den with den bounded away from zero (both branches stay finite for grad);
    eps defaults to `den_floor` of the result's dtype."""
    den = jnp.asarray(den)
    if eps is None:
        eps = den_floor(jnp.result_type(num, den, float))
    return num / jnp.maximum(den, eps)


def safe_pow(x, y, eps=1e-30):
    """x**y for x >= 0 with a finite gradient at x = 0."""
    return jnp.exp(y * jnp.log(jnp.maximum(x, eps)))
