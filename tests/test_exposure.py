"""The decoders' exposure to prompt iterations on a machine that runs both phases
(`pool.exposure_share`, `pool.EXPOSURE_JSQ`; issue 39, twenty-seventh session)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from splitwise_jax.cluster import pool

# Measured in our simulator (2026-12-07; studies/validate_simulator.py configurations of
# seed 0, first repetition, decodes inside 20-120 s): the decoders' share of their lives
# in prompt iterations over the machines' prompt share, at the mean decoders per machine.
# Baseline-A100 36 Llama2-70B coding at 0.49 (configuration 96), Baseline-A100 14 at 0.73
# (126), Baseline-A100 25 BLOOM-176B coding at 0.95 (45), Baseline-H100 22 Llama2-70B
# coding at 0.91 (158), Baseline-A100 13 Llama2-70B conversation at 0.87 (35).
MEASURED = [(2.73, 0.849), (7.65, 1.004), (24.6, 1.022), (26.1, 1.004), (227.6, 1.007)]


def test_on_by_default():
    assert pool.EXPOSURE_JSQ is True


@pytest.mark.parametrize("batch,share", MEASURED)
def test_exposure_as_measured(batch, share):
    """From 2.7 decoders per machine up, within 3 % of the measured share (the law's
    largest residual there is 2.2 %, at 24.6; JSQ's discount alone was 0.93-0.98 where
    the simulation shows none). Below, the law is `jsq_share`'s (the decoders a prompt
    finds, checked on the reference's runs: docs/cluster.md §4b)."""
    got = float(pool.exposure_share(jnp.asarray(batch)))
    assert got == pytest.approx(share, rel=0.03)
    if batch > 5:  # closer than JSQ's discount
        assert abs(got - share) < abs(float(pool.jsq_share(jnp.asarray(batch))) - share)


def test_limits_monotone_and_finite_gradients():
    b = jnp.concatenate([jnp.zeros(1), jnp.logspace(-3, 3, 601)])
    e = np.asarray(jax.vmap(pool.exposure_share)(b))
    g = np.asarray(jax.vmap(jax.grad(pool.exposure_share))(b))
    assert e[0] == pytest.approx(float(pool.jsq_share(0.0)), abs=1e-12)
    assert np.all(e >= np.asarray(jax.vmap(pool.jsq_share)(b)) - 1e-12) and np.all(e <= 1.0)
    assert np.all(np.diff(e) >= -1e-12)
    assert e[-1] == pytest.approx(1.0, abs=1e-9)
    assert np.all(np.isfinite(g))
    g32 = jax.vmap(jax.grad(pool.exposure_share))(jnp.logspace(-3, 3, 61, dtype=jnp.float32))
    assert g32.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(g32)))


def test_off_restores_jsq(monkeypatch):
    monkeypatch.setattr(pool, "EXPOSURE_JSQ", False)
    b = jnp.asarray([0.5, 3.0, 30.0])
    np.testing.assert_allclose(np.asarray(jax.vmap(pool.exposure_share)(b)), np.asarray(jax.vmap(pool.jsq_share)(b)))
