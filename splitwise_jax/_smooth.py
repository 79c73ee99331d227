"""Smooth, everywhere-differentiable stand-ins for max, min, relu and clip.

Every smoothing here carries an explicit temperature. The trade: a smaller temperature
follows the sharp function more closely but gives larger curvature (harder for gradient
optimisers and for finite-difference checks); the defaults were chosen so the smoothing
error is below the measurement noise of the profiles (about 1%).

The four functions the cluster model calls most (`smooth_max_pos`, `smooth_min_pos`,
`softplus`, `safe_pow`; a Splitwise evaluation calls them ~300 times) carry their
derivatives as `jax.custom_jvp` rules in closed form, with symbolic zeros for arguments
that are constants. Their values are the same expressions as before, bit for bit; what
changes is the program a gradient builds: differentiated op by op, the floor
`max(x, 1e-30)`, `jnp.logaddexp`'s own custom rule and its infinity guards made one
`smooth_max_pos` 55 equations in a gradient, against 20-odd now, and these functions
were a third of the Fig. 12 objective's gradient program (docs/speed.md §4).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

_TINY = 1e-30


def den_floor(dtype) -> float:
    """Floor of a denominator in this dtype: 1e-30 in float64, 1e-18 in float32.

    The derivative of n / d with respect to d is -n / d**2, which JAX evaluates even where
    a floor max(d, eps) holds d constant (its tangent is then zero): 1e-30**-2 overflows
    float32 to inf, and zero times inf is NaN. 1e-18 keeps d**-2 (1e36) finite there;
    float64 keeps the smaller floor it always had.
    """
    return 1e-30 if jnp.finfo(dtype).bits > 32 else 1e-18


def _live(t) -> bool:
    return not isinstance(t, SymbolicZero)


def _float(x):
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(float)


def _sum_tangents(out, terms):
    """out's tangent from the live terms (zeros of out's shape when none is live)."""
    terms = [t for t in terms if t is not None]
    if not terms:
        return jnp.zeros_like(out)
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    if total.shape != out.shape:
        total = jnp.broadcast_to(total, out.shape)
    return total if total.dtype == out.dtype else total.astype(out.dtype)


# ---- softplus ------------------------------------------------------------------------


def _softplus_unit(z):
    """log(1 + e^z), as jnp.logaddexp(z, 0) computes it (same operations, same bits)."""
    return jnp.maximum(z, 0.0) + jnp.log1p(jnp.exp(-jnp.abs(z)))


@jax.custom_jvp
def _softplus(x, t):
    return t * _softplus_unit(x / t)


def _softplus_jvp(primals, tangents):
    x, t = primals
    tx, tt = tangents
    z = x / t
    sp = _softplus_unit(z)
    out = t * sp
    s = jax.nn.sigmoid(z)
    return out, _sum_tangents(out, [s * tx if _live(tx) else None,
                                    (sp - z * s) * tt if _live(tt) else None])


_softplus.defjvp(_softplus_jvp, symbolic_zeros=True)


def softplus(x, temperature=1.0):
    """temperature * log(1 + exp(x / temperature)): a smooth relu, exact as T -> 0."""
    return _softplus(_float(x), jnp.asarray(temperature))


# ---- p-norm max and min --------------------------------------------------------------


def _pnorm_parts(a, b, p):
    a_ = jnp.maximum(a, _TINY)
    b_ = jnp.maximum(b, _TINY)
    la, lb = jnp.log(a_), jnp.log(b_)
    x, y = p * la, p * lb
    lse = jnp.maximum(x, y) + jnp.log1p(jnp.exp(-jnp.abs(x - y)))  # jnp.logaddexp(x, y)
    return a_, b_, la, lb, x, y, lse


@jax.custom_jvp
def _pnorm(a, b, p):
    """(a^p + b^p)^(1/p) in log space, for p of either sign."""
    *_, lse = _pnorm_parts(a, b, p)
    return jnp.exp(lse / p)


def _pnorm_jvp(primals, tangents):
    a, b, p = primals
    ta, tb, tp = tangents
    a_, b_, la, lb, x, y, lse = _pnorm_parts(a, b, p)
    ly = lse / p
    out = jnp.exp(ly)
    wa = jnp.exp(x - lse)  # the share of a^p in the sum; d log out / d log a
    wb = jnp.exp(y - lse)
    terms = [out * wa * jnp.where(a > _TINY, ta, 0.0) / a_ if _live(ta) else None,
             out * wb * jnp.where(b > _TINY, tb, 0.0) / b_ if _live(tb) else None,
             out * (wa * la + wb * lb - ly) / p * tp if _live(tp) else None]
    return out, _sum_tangents(out, terms)


_pnorm.defjvp(_pnorm_jvp, symbolic_zeros=True)


def smooth_max_pos(a, b, p=4.0):
    """p-norm max of two positive numbers: (a^p + b^p)^(1/p).

    Used to combine compute time and memory time (a roofline with a soft corner).
    Computed in log space so neither large nor tiny arguments overflow; at a == b it
    returns 2^(1/p) * a, which is the physical overlap inefficiency the fit calibrates.
    """
    return _pnorm(_float(a), _float(b), jnp.asarray(p))


def smooth_min_pos(a, b, p=4.0):
    """p-norm min of two positive numbers: (a^-p + b^-p)^(-1/p)."""
    return _pnorm(_float(a), _float(b), -jnp.asarray(p))


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


# ---- safe power ----------------------------------------------------------------------


@jax.custom_jvp
def _safe_pow(x, y, eps):
    return jnp.exp(y * jnp.log(jnp.maximum(x, eps)))


def _safe_pow_jvp(primals, tangents):
    x, y, eps = primals
    tx, ty, _ = tangents
    x_ = jnp.maximum(x, eps)
    lx = jnp.log(x_)
    out = jnp.exp(y * lx)
    terms = [out * y * jnp.where(x > eps, tx, 0.0) / x_ if _live(tx) else None,
             out * lx * ty if _live(ty) else None]
    return out, _sum_tangents(out, terms)


_safe_pow.defjvp(_safe_pow_jvp, symbolic_zeros=True)


def safe_pow(x, y, eps=1e-30):
    """x**y for x >= 0 with a finite gradient at x = 0."""
    return _safe_pow(_float(x), _float(y), jnp.asarray(eps))
