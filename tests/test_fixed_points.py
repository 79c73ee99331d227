"""`cluster._fixed_point_01`: u = h(u) on [0, 1] for non-increasing h, the solver of the
drafting and overflow shares. Checked against a float64 bisection run to the last bit,
on the overflow law's form (a sum of normal tails, sharp and smooth), with its implicit
gradient, and for the evaluations of h it takes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from splitwise_jax.cluster.cluster import _ROOT_STEPS, _fixed_point_01
from splitwise_jax.cluster.queueing import ndtr

# Reservations of three sizes (tokens, shares) against a capacity: the overflow law's
# form, h(u) = sum_k w_k m_k (1 - Phi((u D + m_k - cap) / sd)) / D, D = sum_k w_k m_k.
M = np.array([500.0, 3000.0, 8000.0])
W = np.array([0.5, 0.3, 0.2])


def _h(u, cap, sd):
    demand = float(np.dot(W, M)) * 20.0
    z = (u * demand + jnp.asarray(M) - cap) / sd
    return jnp.dot(jnp.asarray(W * M), 1.0 - ndtr(z)) / float(np.dot(W, M))


def _bisection(cap, sd):
    """The root of u - h(u) by 200 float64 bisections (to the last bit)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid - float(_h(mid, cap, sd)) < 0:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@jax.jit
def _solve(cap, sd):
    return _fixed_point_01(lambda u: _h(u, cap, sd))


# Capacity (tokens) and spread: from no overflow to most, smooth (sd 20,000) to nearly
# a step (sd 300: h falls by ~1 over 1e-3 of u).
CASES = [(80_000.0, 20_000.0), (50_000.0, 20_000.0), (50_000.0, 2_000.0), (40_000.0, 300.0), (10_000.0, 5_000.0)]


@pytest.mark.parametrize("cap, sd", CASES)
def test_the_root_is_the_bisections_to_round_off(cap, sd):
    """Within 1e-13 of the bisection: the search stops once a point moves < 1e-10 and one
    Newton step follows (error ~ curvature x 1e-20), so what is left is float64
    round-off of g near the root (~1e-16 x the slope's inverse)."""
    u = float(_solve(cap, sd))
    assert u == pytest.approx(_bisection(cap, sd), abs=1e-13)


@pytest.mark.parametrize("cap, sd", CASES)
def test_the_search_stops_well_before_its_cap(cap, sd):
    """The evaluations of h, counted at run time: at most 16 of the 24 the cap allows
    (the step-by-step Dekker safeguard it replaced took all 24 on most of these)."""
    count = []

    def h(u):
        jax.debug.callback(lambda: count.append(1))
        return _h(u, cap, sd)

    jax.block_until_ready(jax.jit(lambda: _fixed_point_01(h))())
    # The loop's evaluations (the two ends at least) plus the one in the final Newton
    # step's jvp; the cap would allow _ROOT_STEPS + 2 + 1 = 25.
    assert _ROOT_STEPS + 2 + 1 == 25
    assert 3 <= len(count) <= 17


@pytest.mark.parametrize("cap, sd", CASES[:3])
def test_the_gradient_is_the_implicit_one(cap, sd):
    """du/dcap against central differences of the bisection (step 1 token: truncation
    ~ u''' h^2 / 6, round-off 1e-16 / 1; tolerance 1e-6 relative + 1e-12)."""
    grad = float(jax.grad(_solve)(jnp.asarray(cap), jnp.asarray(sd)))
    fd = (_bisection(cap + 1.0, sd) - _bisection(cap - 1.0, sd)) / 2.0
    assert grad == pytest.approx(fd, rel=1e-6, abs=1e-12)
