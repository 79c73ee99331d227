"""`quantiles.mixture_quantiles` on mixtures whose quantiles are known, and its implicit
gradients against the analytic derivative and finite differences.

Mixtures:
* two uniforms far apart, 0.5 U(1, 2) + 0.5 U(10, 20): piecewise-linear CDF, quantiles
  in closed form on either component (q < 0.5: 1 + 2q; q > 0.5: 10 + 20 (q - 0.5));
* two log-logistics far apart (components 6 log-units apart, scale 0.1): below the
  first component's weight w the second contributes < sigma(-50) ~ 2e-22, so
  q-quantile = exp(mu1 + s1 logit(q / w)) to double precision, and
  d t / d mu1 = t, d t / d s1 = t logit(q / w), d t / d w = -t s1 / (w (1 - q / w)).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from splitwise_jax.cluster.quantiles import mixture_quantiles

QS = jnp.asarray([0.1, 0.25, 0.4])


def _uniforms_cdf(t):
    return 0.5 * jnp.clip(t - 1.0, 0.0, 1.0) + 0.5 * jnp.clip((t - 10.0) / 10.0, 0.0, 1.0)


def _loglogistic_cdf(theta):
    mu1, s1, w = theta[0], theta[1], theta[2]

    def cdf(t):
        lt = jnp.log(t)
        return w * jax.nn.sigmoid((lt - mu1) / s1) + (1.0 - w) * jax.nn.sigmoid((lt - (mu1 + 6.0)) / 0.1)

    return cdf


def _quantiles(theta, qs=QS, grid_points=24, refine_iters=6):
    return mixture_quantiles(_loglogistic_cdf(theta), qs, 0.01, 1e4, grid_points, refine_iters)


def _exact(theta, qs=QS):
    mu1, s1, w = (float(v) for v in theta)
    p = np.asarray(qs) / w
    return np.exp(mu1 + s1 * np.log(p / (1.0 - p)))


THETA = jnp.asarray([0.3, 0.1, 0.5])


@pytest.mark.parametrize("q, expected", [(0.1, 1.2), (0.25, 1.5), (0.45, 1.9), (0.6, 12.0), (0.9, 18.0),
                                         (0.99, 19.8)])
def test_two_uniforms(q, expected):
    """Relative tolerance 1e-5. Inside one linear piece the solver lands on the answer to
    rounding (measured < 1e-15); at q = 0.99 the bracket still straddles the kink where
    the CDF reaches 1 (t = 20) after six Illinois steps, and the final secant step
    across a kink is off by 1.6e-6 (measured)."""
    t = mixture_quantiles(_uniforms_cdf, jnp.asarray([q]), 0.5, 40.0)
    assert float(t[0]) == pytest.approx(expected, rel=1e-5)


def test_flat_stretch_between_components_is_finite():
    """q = 0.5 falls anywhere in the flat [2, 10]: the answer lies there and its
    gradient stays finite (the slope floor `_MIN_LOG_SLOPE`)."""
    def q50(shift):
        return mixture_quantiles(lambda t: _uniforms_cdf(t - shift), jnp.asarray([0.5]), 0.5, 40.0)[0]

    t, g = jax.value_and_grad(q50)(0.0)
    assert 2.0 - 1e-6 <= float(t) <= 10.0 + 1e-6
    assert np.isfinite(float(g))


def test_loglogistic_mixture_quantiles_are_exact():
    """Relative tolerance 1e-8: the components overlap by < 2e-22 and the Illinois steps
    converge superlinearly on this smooth CDF (measured error < 1e-9)."""
    np.testing.assert_allclose(np.asarray(_quantiles(THETA)), _exact(THETA), rtol=1e-8)


def test_implicit_gradient_matches_the_analytic_derivative():
    """d t_q / d (mu1, s1, w) from the implicit function theorem (one Newton step at the
    root) against the closed form. Tolerance 1e-6 relative: the root is exact to 1e-9,
    and the implicit gradient is exact at an exact root."""
    jac = np.asarray(jax.jacrev(_quantiles)(THETA))  # (len(QS), 3)
    t = _exact(THETA)
    mu1, s1, w = (float(v) for v in THETA)
    p = np.asarray(QS) / w
    analytic = np.stack([t, t * np.log(p / (1.0 - p)), -t * s1 / (w * (1.0 - p))], axis=1)
    np.testing.assert_allclose(jac, analytic, rtol=1e-6, atol=1e-12)


def test_implicit_gradient_matches_finite_differences():
    """`check_grads` (reverse mode, first order) against central differences of the
    solved quantiles. Tolerance 1e-4: central differences with step 1e-4 have
    truncation error ~ eps^2 |t'''| ~ 1e-7 relative here; the rest is the solver's
    residual (< 1e-9), so 1e-4 is loose enough to be about gradients, not rounding."""
    check_grads(_quantiles, (THETA,), order=1, modes=["rev"], eps=1e-4, atol=1e-4, rtol=1e-4)


def test_coarse_grid_and_few_steps_still_bracket_the_answer():
    """The low resolution the studies' smoke runs use (16 grid points, 4 Illinois steps):
    within 1e-3 relative (measured 4.8e-4; the smoke studies' percentiles are stated as
    indicative to a few per cent, so 0.1% from the solver is negligible there)."""
    np.testing.assert_allclose(np.asarray(_quantiles(THETA, grid_points=16, refine_iters=4)), _exact(THETA),
                               rtol=1e-3)


def test_vmapped_and_jitted_agree():
    thetas = jnp.stack([THETA, THETA.at[0].set(1.0), THETA.at[1].set(0.2)])
    batched = jax.jit(jax.vmap(_quantiles))(thetas)
    for i in range(len(thetas)):
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(_quantiles(thetas[i])), rtol=1e-12)
