"""The queueing core (`queueing.wait_model`, `wait_cdf_busy`, `prob_wait`) against the
laws it approximates: the transient diffusion converges to its stationary law, the
stationary law's mean is Kingman's, and the waiting probability and mean wait are close
to Erlang C for M/M/c in light and in heavy traffic.

Notation: rho = lambda E[S] / c, one second of mean service (E[S] = 1 s), Poisson
arrivals (ca^2 = 1). Means of the wait laws are integrals of 1 - CDF on a fine grid.

References:
    Kingman (1961): E[W] ~ rho / (1 - rho) (ca^2 + cs^2) / 2 E[S] for one server,
    exact for M/G/1 (Pollaczek-Khinchine). Erlang C for M/M/c: P(wait) = C(c, a),
    E[W] = C E[S] / (c (1 - rho)). Sakasegawa (1977): C ~ rho^(sqrt(2(c+1)) - 1).
    Harrison (1985) §1.8: reflected Brownian motion with drift -m < 0 and variance s^2
    is stationary at an exponential law of mean s^2 / (2 m).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from splitwise_jax.cluster.queueing import (Burstiness, burst_size, prob_wait, prob_wait_erlang, wait_cdf_busy,
                                           wait_model)

N_POINTS = 64  # window quadrature points


def _busy_mean(wm, n_points: int = N_POINTS, x_max: float | None = None) -> float:
    """E[wait | the arrival waits] = integral of 1 - CDF (trapezoid on 40,001 points up
    to `x_max`, by default where 1 - CDF < e^-40 or 10 standard deviations past the
    queue at the window's end)."""
    if x_max is None and float(wm.drift) < 0:  # 40 stationary means: the tail left is e^-40
        x_max = 40.0 * float(wm.var) / (2.0 * -float(wm.drift))
    elif x_max is None:  # overload: the queue at the window's end plus 10 standard deviations
        t = float(wm.horizon_s)
        x_max = float(wm.drift) * t + 10.0 * math.sqrt(float(wm.var) * t)
    x = np.linspace(0.0, x_max, 40_001)
    f = np.asarray(wait_cdf_busy(jnp.asarray(x), wm, n_points))
    return float(np.trapezoid(1.0 - f, x))


def _erlang_c(c: int, a: float) -> float:
    rho = a / c
    head = sum(a**k / math.factorial(k) for k in range(c))
    tail = a**c / math.factorial(c) / (1.0 - rho)
    return tail / (head + tail)


def _mm(rho: float, c: int, horizon_s: float = 1e7, cs2: float = 1.0):
    """wait_model of an M/G/c queue with E[S] = 1 s at load rho (long window: stationary)."""
    return wait_model(rho * c, 1.0, cs2, float(c), 1.0, horizon_s)


# --------------------------------------------------------------------------------------
# The transient law converges to the stationary one


@pytest.mark.parametrize("rho", [0.5, 0.8, 0.95])
def test_transient_busy_wait_grows_to_the_stationary_mean(rho):
    """Started empty, the reflected diffusion is stochastically increasing in time, so
    the window-averaged wait grows with the window and tends to the stationary mean
    s^2 / (2 m). Tolerance 1%: at the longest window every quadrature point sits
    thousands of relaxation times (s^2 / m^2) in, so what is left is the trapezoid's
    error (< 1e-3 on 40,001 points over 40 means)."""
    base = _mm(rho, 1)
    stationary = float(base.var) / (2.0 * -float(base.drift))
    tau = float(base.var) / float(base.drift) ** 2  # relaxation time of the diffusion
    means = [_busy_mean(base._replace(horizon_s=jnp.asarray(k * tau)), x_max=40.0 * stationary)
             for k in (0.1, 1.0, 10.0, 1e3, 1e5)]
    assert all(b >= a * (1 - 1e-6) for a, b in zip(means, means[1:])), means
    assert means[0] < 0.5 * stationary  # a short window has not filled up
    assert means[-1] == pytest.approx(stationary, rel=1e-2)


@pytest.mark.parametrize("cs2", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("rho", [0.3, 0.7, 0.95])
def test_stationary_busy_wait_mean_is_kingmans_formula(rho, cs2):
    """The diffusion's drift and variance are chosen so its stationary mean is the mean
    wait *given* that the arrival waits: Kingman's (ca^2 + cs^2) / 2 E[S] / (1 - rho)
    over P(wait) = rho for one server (exact for M/G/1). Tolerance 1% (trapezoid, as above)."""
    wm = _mm(rho, 1, cs2=cs2)
    kingman_given_wait = (1.0 + cs2) / 2.0 / (1.0 - rho)
    assert _busy_mean(wm) == pytest.approx(kingman_given_wait, rel=1e-2)


# Sakasegawa's P(wait) is an approximation of Erlang C that is close in heavy traffic
# (within 1% at rho = 0.95) but not at moderate load with several servers: at rho = 0.5
# it is 0.223 vs 0.174 (c = 4) and 0.035 vs 0.009 (c = 16), so the mean wait there is
# off by that ratio (waits of 0.1% - 10% of a service time, which no SLO sees).
_SAKASEGAWA = ("queueing.prob_wait: Sakasegawa's approximation overstates Erlang C at rho = 0.5 with 4 and "
               "16 servers (1.28x, 3.9x); the conditional mean itself is exact")


@pytest.mark.parametrize("rho", [0.3, 0.6, 0.9, 0.97])
@pytest.mark.parametrize("cs2", [0.0, 1.0])
def test_one_server_mean_wait_is_kingmans(rho, cs2):
    """E[W] = P(wait) E[W | wait] against Kingman's mean, which is exact for M/G/1
    (M/D/1 and M/M/1 here). Tolerance 5%: the trapezoid (< 0.1%) and the smoothed
    min(C, 1) (temperature 0.01) leave far less; the rest is the model's."""
    wm = _mm(rho, 1, cs2=cs2)
    model = float(wm.p_wait) * _busy_mean(wm)
    kingman = rho / (1.0 - rho) * (1.0 + cs2) / 2.0
    assert model == pytest.approx(kingman, rel=0.05)


# --------------------------------------------------------------------------------------
# Erlang C for M/M/c


@pytest.mark.parametrize("c", [1, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("rho", [0.9, 0.95, 0.98])
def test_probability_of_waiting_heavy_traffic(rho, c):
    """Sakasegawa's approximation is exact for one server and as rho -> 1; in heavy
    traffic its error on C is a few per cent. Tolerance 5% (relative)."""
    assert float(prob_wait(rho, float(c))) == pytest.approx(_erlang_c(c, rho * c), rel=0.05)


@pytest.mark.parametrize("c", [1, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("rho", [0.1, 0.3, 0.5])
def test_probability_of_waiting_light_traffic(rho, c):
    """In light traffic C is small and Sakasegawa's heavy-traffic interpolation
    overestimates it by a large factor (x5.7 at c = 8, rho = 0.3) but by little in
    absolute terms: tolerance 0.06 in probability (the worst case over c <= 32,
    rho <= 0.5 is 0.051 at c = 4, rho = 0.5); the approximation never underestimates."""
    approx, exact = float(prob_wait(rho, float(c))), _erlang_c(c, rho * c)
    assert abs(approx - exact) < 0.06
    assert approx >= exact * (1 - 1e-3)


@pytest.mark.parametrize("c", [1, 2, 3, 4, 8, 16, 40, 100])
@pytest.mark.parametrize("rho", [0.05, 0.3, 0.6, 0.9, 0.97])
def test_erlang_c_continuous_is_erlang_c_at_whole_c(rho, c):
    """`prob_wait_erlang` (Erlang B's continuous extension through the incomplete gamma)
    is Erlang C at whole c. Tolerance: 1e-9 relative (1e-12 absolute for C near 0), the
    incomplete gamma's float64 round-off; plus the smoothed cap's own shift, T log(1 + e^{-(1-C)/T})
    at temperature T = 0.01 (2e-4 at rho 0.97 on one server, 1e-8 at 0.9)."""
    exact = _erlang_c(c, rho * c)
    got = float(prob_wait_erlang(rho, float(c)))
    cap = 0.01 * math.log1p(math.exp(-(1.0 - exact) / 0.01))  # smooth_min_one's shift at temperature 0.01
    assert abs(got - exact) <= 1e-9 * exact + 1.001 * cap + 1e-12


def test_erlang_c_continuous_smooth_and_finite():
    """Between whole c it is monotone (more servers wait less, more load waits more),
    through overload it stays in [0, 1] and reaches 1, and its gradients in rho and c
    are finite everywhere on the domain (rho 0 to 10, c from 0.5 to 500), in float32
    too."""
    rho = jnp.linspace(0.0, 3.0, 61)
    for c in (0.5, 1.0, 2.5, 7.3, 40.0, 500.0):
        p = np.asarray(prob_wait_erlang(rho, c))
        assert np.all(np.diff(p) >= -1e-12) and np.all((p >= 0) & (p <= 1)), c
        assert p[-1] == pytest.approx(1.0, abs=1e-9)
    cs = jnp.linspace(1.0, 60.0, 119)
    p = np.asarray(prob_wait_erlang(0.8, cs))
    assert np.all(np.diff(p) < 0)
    grad = jax.vmap(jax.grad(prob_wait_erlang, argnums=(0, 1)))
    r, c = jnp.meshgrid(jnp.array([0.0, 1e-6, 0.3, 0.99, 1.0, 1.01, 2.0, 10.0]),
                        jnp.array([0.5, 1.0, 3.0, 40.0, 500.0]))
    for g in grad(r.ravel(), c.ravel()):
        assert np.all(np.isfinite(np.asarray(g)))
    g32 = grad(r.ravel().astype(jnp.float32), c.ravel().astype(jnp.float32))
    assert all(np.all(np.isfinite(np.asarray(g))) for g in g32)
    assert np.all(np.isfinite(np.asarray(prob_wait_erlang(r.astype(jnp.float32), c.astype(jnp.float32)))))


@pytest.mark.parametrize("c, rho", [
    (1, 0.95), (4, 0.95), (16, 0.95), (1, 0.5),
    pytest.param(4, 0.5, marks=pytest.mark.xfail(strict=True, reason=_SAKASEGAWA)),
    pytest.param(16, 0.5, marks=pytest.mark.xfail(strict=True, reason=_SAKASEGAWA)),
])
def test_mm_c_mean_wait_is_erlang_c(c, rho):
    """E[W] = P(wait) E[W | wait] against Erlang C's C E[S] / (c (1 - rho)). Tolerance
    10%: Sakasegawa's C is within 1% at rho = 0.95 (test above); the rest is the
    diffusion's conditional mean, exact in heavy traffic."""
    wm = _mm(rho, c)
    model = float(wm.p_wait) * _busy_mean(wm)
    exact = _erlang_c(c, rho * c) / (c * (1.0 - rho))
    assert model == pytest.approx(exact, rel=0.10)


# --------------------------------------------------------------------------------------
# Overload and rho = 1: finite, growing, differentiable


@pytest.mark.parametrize("rho", [1.2, 2.0])
def test_overload_wait_grows_linearly_through_the_window(rho):
    """Past saturation the queue grows at (rho - 1) seconds of work per second; averaged
    over arrivals uniform in [0, T] the mean wait tends to (rho - 1) T / 2. Tolerance 5%
    at T = 1000 relaxation times (the diffusion's spread adds O(sqrt(T)))."""
    base = _mm(rho, 1)
    tau = float(base.var) / float(base.drift) ** 2
    for k in (1e3, 1e4):
        wm = base._replace(horizon_s=jnp.asarray(k * tau))
        mean = _busy_mean(wm)
        assert np.isfinite(mean)
        assert mean == pytest.approx((rho - 1.0) * k * tau / 2.0, rel=0.05)


@pytest.mark.parametrize("rho", [0.999, 1.0, 1.001])
def test_wait_law_is_finite_and_differentiable_through_saturation(rho):
    def cdf_at(lam):
        wm = wait_model(lam, 1.0, 1.0, 4.0, 1.0, 120.0)
        return wm.p_wait * wait_cdf_busy(jnp.asarray(5.0), wm, 8)

    lam = 4.0 * rho
    value, grad = jax.value_and_grad(cdf_at)(lam)
    assert np.isfinite(float(value)) and 0.0 <= float(value) <= 1.0
    assert np.isfinite(float(grad)) and float(grad) < 0.0  # more load: less mass below 5 s


# --------------------------------------------------------------------------------------
# Bursty arrivals: compound Poisson with geometric batches (M^X/M/c)


def _flat(idc: float) -> Burstiness:
    """The same IDC at every scale (Poisson batches of geometric size)."""
    return Burstiness(jnp.full(3, idc), jnp.array([0.1, 1.0, 10.0]))


def _mx_m_c(lam: float, c: int, m: float, n: int = 60_000, seed: int = 0):
    """FCFS c-server queue fed by Poisson batches of geometric size (mean m), exponential
    service of mean 1 s: each customer's wait (first tenth dropped as warm-up) and the
    stream's index of dispersion at 1 s, by the Kiefer-Wolfowitz recursion."""
    rng = np.random.default_rng(seed)
    sizes = rng.geometric(1.0 / m, int(2 * n / m) + 100)  # at least n customers (mean 2 n)
    arrivals = np.repeat(np.cumsum(rng.exponential(m / lam, len(sizes))), sizes)[:n]
    service = rng.exponential(1.0, n)
    free = [0.0] * c
    wait = np.empty(n)
    for i in range(n):
        j = min(range(c), key=free.__getitem__)
        start = max(arrivals[i], free[j])
        wait[i] = start - arrivals[i]
        free[j] = start + service[i]
    counts = np.bincount(arrivals.astype(int))
    return wait[n // 10:], float(counts.var() / counts.mean())


def test_poisson_counts_keep_the_kingman_law():
    """m = 1 for IDC <= 1: P(wait) is Sakasegawa's C and the variance E[S](IDC + cs^2)/c,
    as for a renewal stream of that ca^2."""
    for idc in (0.0, 0.5, 1.0):
        wm = wait_model(3.0, 1.0, 0.4, 4.0, _flat(idc), 1e7)
        renewal = wait_model(3.0, 1.0, 0.4, 4.0, idc, 1e7)
        assert float(wm.p_wait) == float(renewal.p_wait) == float(prob_wait(0.75, 4.0))
        assert float(wm.var) == pytest.approx(float(renewal.var), rel=1e-14)


def test_burstiness_is_read_at_the_service_time():
    b = Burstiness(jnp.array([1.0, 5.0, 25.0]), jnp.array([0.1, 1.0, 10.0]))
    assert float(b.at(1.0)) == pytest.approx(5.0)
    assert float(b.at(jnp.sqrt(10.0))) == pytest.approx(15.0)  # linear in log tau
    assert float(b.at(1e-3)) == 1.0 and float(b.at(1e3)) == 25.0  # end values outside


@pytest.mark.parametrize("rho", [0.3, 0.8])
@pytest.mark.parametrize("idc", [5.0, 49.0])
def test_one_server_burst_mean_wait_is_the_batch_poisson_formula(rho, idc):
    """One server: P(wait) x its mean is the exact M^X/G/1 mean wait, rho E[S] (1 + cs^2) /
    (2 (1 - rho)) + E[S] (m - 1) / (1 - rho), m = burst_size(ca^2) (Cooper §5.2)."""
    cs2 = 0.5
    wm = wait_model(rho, 1.0, cs2, 1.0, _flat(idc), 1e7)
    m = float(burst_size(idc))
    expected = rho * (1.0 + cs2) / (2.0 * (1.0 - rho)) + (m - 1.0) / (1.0 - rho)
    # The burst part's "1 + cs^2" carries the smoothing's leftover a = ca^2 - 2 (m - 1) ~ 1.1.
    a = idc - 2.0 * (m - 1.0)
    expected += rho * (a - 1.0) / (2.0 * (1.0 - rho))
    assert float(wm.p_wait) * _busy_mean(wm) == pytest.approx(expected, rel=1e-3)


# Tolerances, measured on this grid with 60,000 customers over seeds 0-2 (the IDC at 1 s
# measured from the simulated stream): P(wait) is within
# 0.058 everywhere (largest at c = 10, where bursts meet busy servers more often than
# Sakasegawa's C says). The simulated mean wait is noisy (batch-correlated, heavy-tailed):
# with one server, where the model's mean is exact (test above), it scatters by up to 15%
# between seeds; the model is within 17% at c = 4 and 10. So 0.07 and 25%.
_BURST_CASES = [(c, rho, m) for c in (1, 4, 10) for rho in (0.3, 0.6) for m in (10.0, 25.0)]


@pytest.mark.parametrize("c,rho,m", _BURST_CASES)
def test_burst_wait_matches_a_batch_poisson_queue(c, rho, m):
    wait, idc = _mx_m_c(rho * c, c, m)
    wm = wait_model(rho * c, 1.0, 1.0, float(c), _flat(idc), 1e7)
    assert float(wm.p_wait) == pytest.approx(float(np.mean(wait > 1e-12)), abs=0.07)
    mean = float(wm.p_wait) * _busy_mean(wm)
    assert mean == pytest.approx(float(wait.mean()), rel=0.25)


@pytest.mark.xfail(strict=True, reason="small bursts (m = 3) on 10 servers: a batch finds all busy more often "
                   "than Sakasegawa's C for single Poisson arrivals says; mean wait 50-57% low over seeds 0-2 "
                   "(P(wait) 0.07 low)")
def test_small_bursts_on_many_servers():
    wait, idc = _mx_m_c(3.0, 10, 3.0)
    wm = wait_model(3.0, 1.0, 1.0, 10.0, _flat(idc), 1e7)
    assert float(wm.p_wait) * _busy_mean(wm) == pytest.approx(float(wait.mean()), rel=0.25)


def test_burst_law_is_differentiable_in_the_burstiness():
    def mean_wait(idc):
        wm = wait_model(6.0, 1.0, 1.0, 10.0, _flat(idc), 1e7)
        return wm.p_wait * wm.var / (2.0 * -wm.drift)

    for idc in (0.5, 1.0, 1.0 + 1e-9, 1.05, 20.0, 200.0):
        g = float(jax.grad(mean_wait)(idc))
        assert np.isfinite(g) and g >= 0.0  # burstier arrivals never shorten the mean wait


def test_burst_law_is_finite_for_an_empty_pool():
    """No arrivals (a Splitwise token pool that drafts nothing): without bursts P(wait) =
    0, with them the requests of one burst still wait for each other (q^f); the law and
    its gradient are finite either way (found by studies/burst_check.py: 0/0 was NaN)."""
    def law(lam, idc):
        return wait_model(lam, 0.3, 0.5, 4.0, _flat(idc), 100.0)

    assert float(law(0.0, 1.0).p_wait) == 0.0
    assert 0.0 < float(law(0.0, 20.0).p_wait) < 1.0
    for idc in (1.0, 20.0):
        wm = law(0.0, idc)
        assert np.isfinite(float(wm.var)) and float(wm.var) > 0.0
        g = jax.grad(lambda lam: law(lam, idc).p_wait * law(lam, idc).var)(0.0)
        assert np.isfinite(float(g))


def test_burst_law_is_differentiable_in_the_service_time():
    """E[S] moves the scale the IDC is read at (linear in log tau between scales): the
    gradient is finite between scales, at a scale and beyond the last."""
    b = Burstiness(jnp.array([1.0, 4.0, 20.0, 60.0]), jnp.array([0.01, 0.1, 1.0, 10.0]))

    def mean_wait(es):
        wm = wait_model(0.5 * 8.0 / es, es, 1.0, 8.0, b, 1e7)
        return wm.p_wait * wm.var / (2.0 * -wm.drift)

    for es in (0.05, 0.1, 0.3, 20.0):
        g = float(jax.grad(mean_wait)(es))
        assert np.isfinite(g) and g > 0.0  # longer service, same load: longer waits


def test_a_held_queue_past_its_cap_is_the_doubly_reflected_law():
    """With a cap (the drafting regime holds the queue) and a queue that would grow past it
    within the window (drift > 0), P(W <= cap) underflows float32 and the windowed ratio
    was round-off (three overloaded Llama2-70B conversation clusters got one value for
    P50, P90 and P99; docs/validation.md, twenty-third session). The law is then the
    diffusion reflected at 0 and at the cap, expm1(k x) / expm1(k cap), k = 2 drift /
    var. Below capacity (P(W <= cap) ~ 1) it is the windowed ratio as before."""
    from splitwise_jax.cluster.queueing import WaitModel

    def law(drift, var, cap):
        return WaitModel(jnp.float32(1.0), jnp.float32(drift), jnp.float32(var), jnp.float32(120.0),
                         jnp.float32(1.0 + drift), jnp.float32(0.0), 0.0, jnp.float32(cap))

    from splitwise_jax.cluster.percentiles import Resolution

    n = Resolution().window_points   # the model's window quadrature (8: its first point at 7.5 s)
    xs = jnp.linspace(0.0, 0.33, 34, dtype=jnp.float32)
    wm = law(0.3055, 0.0081, 0.33)   # the prompt pool of Splitwise-HH 34 + 15 with the cascade's pass
    cdf = np.asarray(wait_cdf_busy(xs, wm, n))
    k = 2.0 * 0.3055 / 0.0081
    exact = np.expm1(k * np.asarray(xs, float)) / np.expm1(k * 0.33)
    # Tolerance: float32 logs of expm1 at k cap ~ 25 (a few ulps of e^25 relative).
    np.testing.assert_allclose(cdf, exact, rtol=1e-4, atol=1e-6)
    assert np.all(np.diff(cdf) >= 0.0) and cdf[-1] == pytest.approx(1.0, abs=1e-6)
    # Deep below capacity the cap is never reached: the unconditioned law, as before.
    low = law(-0.5, 0.0081, 5.0)
    np.testing.assert_allclose(np.asarray(wait_cdf_busy(xs, low, n)),
                               np.asarray(wait_cdf_busy(xs, low._replace(cap_s=None), n)), rtol=1e-5, atol=1e-6)
    g = jax.grad(lambda d: jnp.sum(wait_cdf_busy(xs[1:], law(d, 0.0081, 0.33), n)))(jnp.float32(0.3))
    assert np.isfinite(float(g))
