"""The colocated baselines' prompt load rising through a run's window as the decoding
population builds (`queueing.drift_at`, `flows_baseline.RISING_LOAD`; issue 39)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from splitwise_jax.cluster import flows_baseline as fb
from splitwise_jax.cluster.queueing import WaitModel, drift_at, wait_cdf_busy


def _model(rho=1.1, rise=0.3, ramp_s=90.0, horizon_s=120.0):
    return WaitModel(jnp.asarray(1.0), jnp.asarray(rho - 1.0), jnp.asarray(0.2), jnp.asarray(horizon_s),
                     jnp.asarray(rho), rise=jnp.asarray(rise), ramp_s=jnp.asarray(ramp_s))


def _fluid_backlog(m: WaitModel, u, n=200_000):
    """The reflected fluid path of the drift rho(v) - 1, integrated numerically."""
    r, t = float(m.ramp_s), float(m.horizon_s)
    g = 1.0 - (1.0 - np.exp(-t / r)) / (t / r)
    v = np.linspace(0.0, u, n)
    drift = float(m.drift) + float(m.rise) * ((1.0 - np.exp(-v / r)) / g - 1.0)
    q = 0.0
    dv = v[1] - v[0]
    for d in drift[:-1] * dv:  # Lindley's recursion of the fluid queue
        q = max(q + d, 0.0)
    return q


def test_on_by_default():
    assert fb.RISING_LOAD is True


def test_no_ramp_is_the_constant_drift():
    m = _model()._replace(rise=None, ramp_s=None)
    assert float(drift_at(m, jnp.asarray(30.0))) == pytest.approx(0.1)


def test_the_load_averages_to_rho_over_the_window():
    """rho(v) = rho + rise (h(v) / g - 1) has mean rho over [0, T]: the ramp moves load
    in time, not in total (below 1 throughout, the drift is rho(u) - 1 itself)."""
    m = _model(rho=0.5, rise=0.3)
    u = jnp.linspace(0.0, 120.0, 200_001)[1:]
    assert float(jnp.mean(drift_at(m, u))) == pytest.approx(-0.5, abs=2e-4)


@pytest.mark.parametrize("rho,rise", [(1.1, 0.3), (1.18, 0.28), (0.97, 0.4), (1.5, 0.2)])
def test_backlog_is_the_fluid_queues(rho, rise):
    """Past the crossing, drift x u is the fluid queue's backlog (Lindley's recursion of
    the same rising load, to the integration step)."""
    m = _model(rho=rho, rise=rise)
    for u in (20.0, 60.0, 110.0):
        got = float(drift_at(m, jnp.asarray(u))) * u
        want = _fluid_backlog(m, u)
        if want > 0:
            assert got == pytest.approx(want, rel=1e-3, abs=1e-3), (u, got, want)


def test_continuous_through_the_crossing():
    m = _model(rho=1.05, rise=0.4)
    u = jnp.linspace(1.0, 119.0, 5_000)
    d = np.asarray(drift_at(m, u))
    assert np.max(np.abs(np.diff(d))) < 1e-3  # no jump where the load passes 1
    assert d[0] < 0 < d[-1]


def test_gradients_finite_across_the_domain():
    def p50_ish(rho, rise, ramp):
        m = _model(rho=rho, rise=rise, ramp_s=ramp)
        return jnp.sum(wait_cdf_busy(jnp.asarray([0.5, 5.0, 20.0]), m, 8))

    g = jax.grad(p50_ish, argnums=(0, 1, 2))
    for rho in (0.3, 0.9, 1.0, 1.1, 2.0):
        for rise in (0.0, 0.1, 0.6):
            for ramp in (1.0, 90.0, 5_000.0):
                assert all(np.isfinite(float(x)) for x in g(rho, rise, ramp)), (rho, rise, ramp)


def test_rising_load_queues_later():
    """With the same mean load, a load that rises through the window builds its queue
    later: early arrivals wait less, the median arrival less than at the constant load."""
    const = _model(rise=0.0)
    ramp = _model(rise=0.3)
    w = jnp.asarray([2.0])
    assert float(wait_cdf_busy(w, ramp, 16)[0]) > float(wait_cdf_busy(w, const, 16)[0])


def _llama_conversation_baseline():
    import splitwise_jax as sj
    from splitwise_jax.cluster.designs import make_cluster
    from splitwise_jax.cluster.workload import workload

    cluster = make_cluster("baseline-a100", 7, model="llama2-70b")
    return sj, cluster, workload("conversation", 33.12)


def test_queue_builds_as_our_simulator_does(monkeypatch):
    """Baseline-A100 x 7, Llama2-70B, conversation at 33.1 req/s (0.89 of the prompt
    capacity estimate; `studies/validate_simulator.py` configuration 183 of seed 0). In our
    simulator (same calibrated timing, 120 s, four seeds, measured 2026-12-07) the
    machines run prompts ~98 % of the window but the queue starts only 20-40 s in: TTFT
    P50 2.6 s. The model with a constant load grew it from the start (9.5 s, +266 %);
    with the rising load 4.4 s (+69 %, the rest mostly its load at the window's end:
    TTFT P99 +50 % either way). With the queue's prompts batched as a long queue cuts
    them (`segments.queue_segments`, twenty-eighth session) 3.0 s rising and 6.0 s
    constant. Checked here on two seeds (their mean 2.8 s): the rising load within a
    factor 1.5 of the simulation (+6 %, and the seeds' spread, ~15 %), the constant load
    beyond 1.8x (its +112 %, less that spread)."""
    sj, cluster, wl = _llama_conversation_baseline()
    sim = np.mean([sj.simulate(cluster, sj.poisson_trace(wl, wl.rate_per_s, 120.0, seed)).metrics["ttft_s"]["p50"]
                   for seed in (183, 1183)])
    rising = float(sj.evaluate(cluster, wl, 120.0).ttft_s[0])
    monkeypatch.setattr(fb, "RISING_LOAD", False)
    constant = float(sj.evaluate(cluster, wl, 120.0).ttft_s[0])
    assert sim / 1.5 < rising < 1.5 * sim, (rising, sim)
    assert constant > 1.8 * sim, (constant, sim)
