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
    step: 13 damped evaluations left B 1.3e-6 off Little's law at 14 (_roots.damped_log_newton_step
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


# ----------------------------------------------------------------------------- a window that starts empty


@jax.jit
def _solve_window(timing, decode_rate, window_s):
    return pool_state(timing, n_machines=4.0, prompt_rate=0.0, prompt_w=P_W, p_tok=P_TOK, p_sq=P_TOK**2,
                      decode_rate=decode_rate, mean_decode_iters=MEAN_ITERS, ctx_tokens=CTX, batch_cap=BIG_CAP,
                      window_s=window_s)


def test_window_share_limits():
    """g(theta) = 1 - (1 - e^-theta) / theta: 1 - 1/theta for a long window (Little's law),
    theta / 2 - theta^2 / 6 for a short one. Tolerances: the next term of each series."""
    from splitwise_jax.cluster.pool import window_share
    for theta in (50.0, 500.0):
        assert float(window_share(1.0, theta)) == pytest.approx(1.0 - 1.0 / theta, abs=2 * np.exp(-theta) / theta)
    for theta in (1e-3, 1e-2):
        assert float(window_share(1.0, theta)) == pytest.approx(theta / 2 - theta**2 / 6, abs=theta**3 / 20)


def test_window_share_is_what_a_population_started_empty_shows():
    """M/M/infinity from empty over [0, T], then drained: the population a decode step
    sees, int B^2 dt / int B dt, against lambda R g(T / R). Simulated (20 repetitions of
    lambda = 5/s, R = 40 s, T = 120 s: ~12,000 requests); tolerance 5 %, several
    standard errors of the simulated mean (its spread over repetitions is ~1.5 %)."""
    from splitwise_jax.cluster.pool import window_share
    rng = np.random.default_rng(0)
    lam, r_mean, t_end = 5.0, 40.0, 120.0
    grid = np.linspace(0.0, t_end + 12 * r_mean, 20001)
    seen = []
    for _ in range(20):
        n = rng.poisson(lam * t_end)
        start = rng.uniform(0.0, t_end, n)
        stop = start + rng.exponential(r_mean, n)
        pop = (np.searchsorted(np.sort(start), grid, side="right")
               - np.searchsorted(np.sort(stop), grid, side="right"))
        seen.append(np.sum(pop.astype(float) ** 2) / np.sum(pop))
    want = lam * r_mean * float(window_share(r_mean, t_end))
    assert np.mean(seen) == pytest.approx(want, rel=0.05)


def test_a_window_lowers_the_batch_and_bounds_an_overloaded_one(timing):
    """With a window, Little's law counts a run that starts empty: B below the stationary
    root, by little where a decode lasts a fraction of the window (lambda_d 3/s: R ~ 5 s
    of 120 s, g ~ 0.96) and the window's lambda T / 2 bound past the decode limit (~14
    requests/s per machine, `test_littles_law_holds_near_the_decode_limit`): at 20/s
    the stationary B runs to the memory cap, the windowed one stays below 20 x 120 / 2."""
    light, light_w = _state(timing, 4.0, 0.0, 12.0), _solve_window(timing, jnp.asarray(12.0), jnp.asarray(120.0))
    assert 0.9 * float(light.batch) < float(light_w.batch) < float(light.batch)
    over_w = _solve_window(timing, jnp.asarray(80.0), jnp.asarray(120.0))
    assert 0.0 < float(over_w.batch) < 20.0 * 120.0 / 2.0
    # Little's law with the window's share holds at the root (1e-9, as the stationary law).
    from splitwise_jax.cluster.pool import window_share
    r = MEAN_ITERS * float(over_w.step_s)
    assert float(over_w.batch) == pytest.approx(20.0 * r * float(window_share(r, 120.0)), rel=1e-9)
    # A window far longer than any decode is the stationary law.
    long_w = _solve_window(timing, jnp.asarray(12.0), jnp.asarray(1e12))
    assert float(long_w.batch) == pytest.approx(float(light.batch), rel=1e-9)


def test_windowed_gradients_are_finite(timing):
    """Finite gradients past the decode limit and with respect to the window; a longer
    window holds more decodes."""
    g_rate, g_win = jax.grad(lambda lam, t: _solve_window(timing, lam, t).batch, argnums=(0, 1))(
        jnp.asarray(80.0), jnp.asarray(120.0))
    assert np.isfinite(float(g_rate)) and np.isfinite(float(g_win))
    assert float(g_rate) > 0.0 and float(g_win) > 0.0


def test_interfered_share_is_the_uniform_start_law():
    """A decode of length D started uniformly in a window of length T keeps
    I = min(T - t, D) inside it; `interfered_share` is (E[I] / D, Var[I] / D^2). Checked
    against the law's closed forms at D = T / 2 and D = 2 T, against a Monte Carlo
    of 400,000 starts (its standard error ~5e-4 on the mean), and at the seam x = 1
    (uniform on (0, D): mean 1/2, variance 1/12); gradients finite across 0 .. 10 T."""
    from splitwise_jax.cluster.pool import interfered_share

    mean, var = interfered_share(jnp.asarray([60.0, 240.0, 120.0]), 120.0)
    np.testing.assert_allclose(mean, [0.75, 0.25, 0.5], rtol=1e-12)
    np.testing.assert_allclose(var, [2 / 3 - 0.75**2, 1 / 12 - 1 / 16, 1 / 12], rtol=1e-12)
    rng = np.random.default_rng(0)
    for d in (30.0, 150.0):
        inside = np.minimum(120.0 - rng.uniform(0.0, 120.0, 400_000), d) / d
        m, v = interfered_share(jnp.asarray(d), 120.0)
        assert float(m) == pytest.approx(inside.mean(), abs=3e-3)
        assert float(v) == pytest.approx(inside.var(), abs=3e-3)
    g = jax.vmap(jax.grad(lambda x: sum(interfered_share(x, 120.0))))(jnp.linspace(0.0, 1200.0, 101))
    assert np.all(np.isfinite(np.asarray(g)))
