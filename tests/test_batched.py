"""`sj.evaluate` (cluster/batched.py): the model function with a batching rule.

Its `vmap` maps one configuration at a time on CPU; its values and gradients must be the
model function's. The baseline design, a small resolution and a 4 x 4-class workload
keep the programs small (the batching rule, not the model, is under test).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import splitwise_jax as sj
from splitwise_jax.cluster import cluster as model
from splitwise_jax.cluster.cluster import Resolution
from splitwise_jax.cluster.designs import make_cluster
from splitwise_jax.cluster.workload import coarsen, workload

RES = Resolution(window_points=4, table_points=32, grid_points=12, refine_iters=4, lookup_points=256)


@pytest.fixture(scope="module")
def setup():
    return make_cluster("baseline-h100", 10.0), coarsen(workload("coding", 30.0), 4, 4)


def _e2e(fn, c, wl):
    return lambda n: fn(c.replace(n_prompt=n[0]), wl.with_rate(n[1]), resolution=RES).e2e_s


def test_vmap_matches_the_model_function(setup):
    """Same rows through the batching rule (`lax.map`) and the model's own `vmap`: the
    same program per row but for batching, so rounding-level differences only (1e-9)."""
    c, wl = setup
    rows = jnp.asarray([[10.0, 30.0], [8.0, 20.0], [14.0, 40.0]])
    ours = jax.jit(jax.vmap(_e2e(sj.evaluate, c, wl)))(rows)
    theirs = jax.jit(jax.vmap(_e2e(model.evaluate, c, wl)))(rows)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-9)
    # The whole metrics tree, with the workload batched too (a rate per row), against one
    # compiled model function called per row (eager op-by-op calls were ~1 minute here).
    rates = jnp.asarray([20.0, 30.0, 40.0])
    m = jax.jit(jax.vmap(lambda r: sj.evaluate(c, wl.with_rate(r), resolution=RES)))(rates)
    single = jax.jit(lambda r: model.evaluate(c, wl.with_rate(r), resolution=RES))
    for i, r in enumerate(np.asarray(rates)):
        one = single(float(r))
        np.testing.assert_allclose(np.asarray(m.tbt_s[i]), np.asarray(one.tbt_s), rtol=1e-9)
        assert bool(m.meets_slo[i]) == bool(one.meets_slo)


def test_vmap_is_mapped_on_cpu(setup):
    """On CPU the batched program holds a loop over the rows (the rule's `lax.map`, a
    scan of length 7, the rows), not the model vectorised (whose own loops know nothing
    of 7)."""
    c, wl = setup
    rows = jnp.stack([jnp.linspace(8.0, 14.0, 7), jnp.full(7, 30.0)], axis=1)
    text = str(jax.make_jaxpr(jax.vmap(_e2e(sj.evaluate, c, wl)))(rows))
    assert ("length=7" in text) == (jax.default_backend() == "cpu")
    assert "length=7" not in str(jax.make_jaxpr(jax.vmap(_e2e(model.evaluate, c, wl)))(rows))


def test_gradients_are_the_model_functions(setup):
    """grad, jvp and a vmap of grad go through the model function's own derivatives."""
    c, wl = setup
    x = jnp.asarray([10.0, 30.0])

    def p99(fn):
        return lambda n: _e2e(fn, c, wl)(n)[2]

    # One program for the three of ours (compiled once; eager op-by-op calls of the model
    # were most of this test's 6 minutes on the loaded 2-core machine).
    @jax.jit
    def ours(x):
        g = jax.grad(p99(sj.evaluate))(x)
        _, t = jax.jvp(p99(sj.evaluate), (x,), (jnp.asarray([1.0, 0.0]),))
        gs = jax.vmap(jax.grad(p99(sj.evaluate)))(jnp.stack([x, x + 1.0]))
        return g, t, gs

    g_ours, t, gs = ours(x)
    g_theirs = jax.jit(jax.grad(p99(model.evaluate)))(x)
    np.testing.assert_allclose(np.asarray(g_ours), np.asarray(g_theirs), rtol=1e-9)
    np.testing.assert_allclose(float(t), float(g_theirs[0]), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gs[0]), np.asarray(g_theirs), rtol=1e-9)
    assert np.all(np.isfinite(np.asarray(gs)))
