"""`pool.pool_state`: the fixed point of one pool of continuous-batching machines.

Little's law is the equation the pool solves (B = lambda_d E[o - 1] x time per decode
step, per machine); these tests check that the solved state satisfies it across four
decades of load, for token pools and mixed pools, that the KV-memory cap holds, and that
the state is monotone in the load and differentiable.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from splitwise_jax.cluster.designs import make_timing
from splitwise_jax.cluster.pool import pool_state

# Three prompt classes (tokens) and their shares; 100 decode iterations per request
# (o - 1) at a mean context of 1,600 tokens: a conversation-like load.
P_TOK = jnp.asarray([500.0, 1500.0, 3000.0])
P_W = jnp.asarray([0.3, 0.5, 0.2])
MEAN_ITERS = 100.0
CTX = 1600.0
BIG_CAP = 1e6  # decoding requests: memory never binds


@pytest.fixture(scope="module")
def timing():
    return make_timing("dgx-h100", "bloom-176b")


@jax.jit
def _solve(timing, n, prompt_rate, decode_rate, cap):
    # One compiled program for every call (un-jitted, each call dispatched the Newton
    # loop op by op: minutes on two cores).
    return pool_state(timing, n_machines=n, prompt_rate=prompt_rate, prompt_w=P_W, p_tok=P_TOK, p_sq=P_TOK**2,
                      decode_rate=decode_rate, mean_decode_iters=MEAN_ITERS, ctx_tokens=CTX, batch_cap=cap)


def _state(timing, n, prompt_rate, decode_rate, cap=BIG_CAP):
    return _solve(timing, jnp.asarray(n, float), jnp.asarray(prompt_rate, float), jnp.asarray(decode_rate, float),
                  jnp.asarray(cap, float))


LOADS = [0.01, 0.1, 1.0, 3.0, 10.0]  # decoding requests per second per machine (10: B ~ 150)


@pytest.mark.parametrize("mixed", [False, True], ids=["token-pool", "mixed-pool"])
def test_littles_law_holds_at_the_fixed_point(timing, mixed):
    """B = lambda_d E[o - 1] step_s per machine. Tolerance 1e-9 relative: Newton in log B
    converges quadratically and its 12 steps reach machine precision from within e^8 of
    the answer (pool.py); the memory cap is 1e6 requests, where the smooth minimum
    (p = 32) moves B by (B / 1e6)^32 / 32, nothing in float64."""
    n = 4.0
    for lam_d in LOADS:
        decode_rate = lam_d * n
        prompt_rate = 0.05 * decode_rate if mixed else 0.0  # prompts on the same machines
        st = _state(timing, n, prompt_rate, decode_rate)
        little = lam_d * MEAN_ITERS * float(st.step_s)
        assert float(st.batch) == pytest.approx(little, rel=1e-9), lam_d
        assert float(st.batch_need) == pytest.approx(float(st.batch), rel=1e-9)
        assert float(st.step_s) >= float(st.decode_s) * (1 - 1e-12)  # interference only adds
        # The prompt load is the offered work per machine (no hidden capping).
        assert float(st.rho_prompt) == pytest.approx(prompt_rate / n * float(st.mean_prompt_s), rel=1e-12)


def test_littles_law_holds_near_the_decode_limit(timing):
    """Just below the load where decoding saturates the machines (here ~14.05 requests/s
    per machine: B from 250 at 12 to 1,556 at 14), the residual's slope in log B falls
    to ~0.01, below the 0.05 floor of the damped steps, which then converge at ~0.8 per
    step: 13 damped evaluations left B 1.3e-6 off Little's law at 14 (pool._newton_step
    now takes full steps once they are short). Same tolerance as above (1e-9)."""
    n = 4.0
    for lam_d in (12.0, 13.0, 13.6, 14.0):
        st = _state(timing, n, 0.0, lam_d * n)
        assert 200.0 < float(st.batch) < 2e3, lam_d  # a root far below the memory cap
        little = lam_d * MEAN_ITERS * float(st.step_s)
        assert float(st.batch) == pytest.approx(little, rel=1e-9), lam_d


def test_batch_grows_with_the_decode_load(timing):
    batches = [float(_state(timing, 4.0, 0.0, 4.0 * lam).batch) for lam in LOADS]
    assert all(b > a for a, b in zip(batches, batches[1:])), batches


def test_memory_cap_holds_the_batch_and_reports_the_need(timing):
    """With 10x the decode load the memory holds, B sits at the cap (the smooth minimum
    with p = 32 is within (1/10)^32 of it) and `batch_need` says how far over it is."""
    free = _state(timing, 4.0, 0.0, 4.0 * 3.0)
    cap = 0.1 * float(free.batch)
    held = _state(timing, 4.0, 0.0, 4.0 * 3.0, cap=cap)
    assert float(held.batch) == pytest.approx(cap, rel=1e-6)
    assert float(held.batch_need) > 5.0 * cap


def test_gradients_of_the_fixed_point_are_finite_and_signed(timing):
    """Through the unrolled Newton iterations (one reverse-mode compile): more decode
    load raises the batch, more machines for the same total load lower it."""
    def batch(n, decode_rate):
        return _solve(timing, n, 0.05 * decode_rate, decode_rate, jnp.asarray(BIG_CAP)).batch

    g_n, g_rate = jax.grad(batch, argnums=(0, 1))(jnp.asarray(4.0), jnp.asarray(12.0))
    assert np.isfinite(float(g_n)) and np.isfinite(float(g_rate))
    assert float(g_rate) > 0.0
    assert float(g_n) < 0.0
