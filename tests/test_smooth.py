"""The smooth stand-ins' closed-form derivatives (`_smooth`'s custom JVP rules) against
JAX's own differentiation of the plain expressions they replaced: values bit for bit,
first and second derivatives to 1e-9 (measured on these inputs: <= 3.4e-15 for the
derivatives in the arguments, <= 2.4e-12 for the second derivatives, 3.7e-10 for the
p-norm max's derivative in p, a sum over elements that cancels; 1e-9 keeps ~3x headroom)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from splitwise_jax import _smooth as S


def _plain_max(a, b, p):
    la, lb = jnp.log(jnp.maximum(a, 1e-30)), jnp.log(jnp.maximum(b, 1e-30))
    return jnp.exp(jnp.logaddexp(p * la, p * lb) / p)


def _plain_min(a, b, p):
    la, lb = jnp.log(jnp.maximum(a, 1e-30)), jnp.log(jnp.maximum(b, 1e-30))
    return jnp.exp(-jnp.logaddexp(-p * la, -p * lb) / p)


def _plain_softplus(x, t):
    return t * jax.nn.softplus(x / t)


def _plain_pow(x, y):
    return jnp.exp(y * jnp.log(jnp.maximum(x, 1e-30)))


CASES = {
    "max": (S.smooth_max_pos, _plain_max),
    "min": (S.smooth_min_pos, _plain_min),
    "softplus": (lambda a, b, p: S.softplus(jnp.log(a) - jnp.log(b), p), lambda a, b, p: _plain_softplus(jnp.log(a) - jnp.log(b), p)),
    "pow": (lambda a, b, p: S.safe_pow(a, 0.1 * p), lambda a, b, p: _plain_pow(a, 0.1 * p)),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("p", [1.3, 4.0, 16.0])
def test_custom_rules_match_the_plain_expressions(name, p):
    new, old = CASES[name]
    rng = np.random.default_rng(0)
    a = jnp.asarray(np.exp(rng.normal(0.0, 4.0, 64)))
    b = jnp.asarray(np.exp(rng.normal(0.0, 4.0, 64)))
    if name in ("max", "min", "pow"):  # at and below the floor
        a = a.at[:2].set(0.0)
    np.testing.assert_array_equal(np.asarray(new(a, b, p)), np.asarray(old(a, b, p)))
    for g_new, g_old in zip(jax.grad(lambda *x: new(*x).sum(), (0, 1, 2))(a, b, p),
                            jax.grad(lambda *x: old(*x).sum(), (0, 1, 2))(a, b, p)):
        assert np.all(np.isfinite(np.asarray(g_new)))
        np.testing.assert_allclose(g_new, g_old, rtol=1e-9, atol=1e-300)
    # second order: the derivative of the gradient with respect to p
    h_new = jax.grad(lambda q: jax.grad(lambda x: new(x, b, q).sum())(a).sum())(p)
    h_old = jax.grad(lambda q: jax.grad(lambda x: old(x, b, q).sum())(a).sum())(p)
    np.testing.assert_allclose(h_new, h_old, rtol=1e-9)


def test_python_scalars_broadcasting_and_precision():
    """Constants as arguments (their tangents are symbolic zeros), broadcasting, jit,
    vmap and float32 all keep the plain expressions' answers and dtypes."""
    w = jnp.asarray([0.5, 2.0, 7.0])
    np.testing.assert_array_equal(S.smooth_max_pos(1.0, w, 16.0), _plain_max(1.0, w, 16.0))
    np.testing.assert_allclose(jax.jit(jax.grad(lambda x: S.smooth_min_pos(x, 3.0, 8.0)))(2.0),
                               jax.grad(lambda x: _plain_min(x, 3.0, 8.0))(2.0), rtol=1e-12)
    np.testing.assert_allclose(jax.vmap(jax.grad(lambda t: S.softplus(0.3, t)))(w),
                               jax.vmap(jax.grad(lambda t: _plain_softplus(0.3, t)))(w), rtol=1e-12)
    x32 = jnp.asarray([0.5, 2.0], jnp.float32)
    assert S.smooth_max_pos(x32, jnp.float32(1.0)).dtype == jnp.float32
    assert jax.grad(lambda x: S.softplus(x, 0.1).sum())(x32).dtype == jnp.float32
