"""Splitwise's token pool past its batch-size cap: decodes wait for a batch slot
(`flows_splitwise._slot_wait`, `BATCH_SLOTS`; issue 39, twenty-sixth session)."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from splitwise_jax.cluster import flows_splitwise as fs


def _setup(slots=512.0, horizon_s=120.0):
    return SimpleNamespace(pool={"window_s": None}, horizon_s=horizon_s,
                           cluster=SimpleNamespace(scheduling=SimpleNamespace(max_batch_size=slots)))


def _fluid_waits(lam, R, S, T, n=200_001):
    """The slots' fluid, integrated: the decoding population rises as dB/dt = lam - B/R
    until it fills the S slots; from then S/R decodes leave a second and the queue
    grows at lam - S/R; an arrival at t waits its queue over S/R (first come first
    served). Returns E[W] and E[W^2] over arrivals uniform in [0, T]."""
    t = np.linspace(0.0, T, n)
    dt = t[1] - t[0]
    b, q = 0.0, 0.0
    w = np.empty(n)
    for i in range(n):
        w[i] = q / (S / R)
        if b < S:
            b = min(b + (lam - b / R) * dt, S)
        else:
            q = max(q + (lam - S / R) * dt, 0.0)
    return w.mean(), (w**2).mean()


def test_on_by_default():
    assert fs.BATCH_SLOTS is True


@pytest.mark.parametrize("rho,R", [(1.3, 40.0), (1.9, 51.0), (3.0, 20.0)])
def test_slot_wait_is_the_slots_fluid(rho, R):
    """The closed form (mean and second moment over the window's arrivals) against the
    fluid it summarises, integrated numerically (Euler steps of 6e-4 s: the two agree
    to 1 % where the temperatures' corners are far, rho - 1 >> 0.02, T - t0 >> 2.4 s)."""
    S, T = 512.0, 120.0
    lam = rho * S / R
    m1, var = fs._slot_wait(_setup(S, T), SimpleNamespace(step_s=jnp.asarray(R / 200.0)), jnp.asarray(lam),
                            jnp.asarray(200.0))
    want1, want2 = _fluid_waits(lam, R, S, T)
    assert float(m1) == pytest.approx(want1, rel=0.01)
    assert float(var + m1**2) == pytest.approx(want2, rel=0.01)


def test_no_wait_below_the_cap_and_finite_gradients_across_it():
    """Below the cap nothing waits; the wait rises continuously through the cap's load
    and through the window's end (the slots filling just as the window closes), with
    finite gradients in rho, in float64 and float32."""
    st = SimpleNamespace(step_s=jnp.asarray(0.25))

    def mean_wait(rho):
        return fs._slot_wait(_setup(), st, rho * 512.0 / (200.0 * 0.25), jnp.asarray(200.0))[0]

    assert float(mean_wait(0.8)) < 1e-9
    rhos = jnp.linspace(0.5, 4.0, 701)
    vals = np.asarray(jax.vmap(mean_wait)(rhos))
    grads = np.asarray(jax.vmap(jax.grad(mean_wait))(rhos))
    assert np.all(np.isfinite(vals)) and np.all(np.isfinite(grads))
    assert np.all(np.diff(vals) >= -1e-12)              # more load never waits less
    assert np.max(np.diff(vals)) <= 1.5 * np.max(grads) * float(rhos[1] - rhos[0]) + 1e-9
    st32 = SimpleNamespace(step_s=jnp.float32(0.25))
    g32 = jax.vmap(jax.grad(lambda r: fs._slot_wait(_setup(), st32, r * 512.0 / 50.0, jnp.float32(200.0))[0]))(
        jnp.linspace(0.5, 4.0, 71, dtype=jnp.float32))
    assert g32.dtype == jnp.float32 and np.all(np.isfinite(np.asarray(g32)))


@pytest.fixture(scope="module")
def slots_run():
    """Splitwise-HHcap 23 + 12, Llama2-70B, conversation at 227 req/s
    (`studies/validate_simulator.py` configuration 95 of seed 0). Its token machines
    decode at most ~2,090 tokens/s each at 512 requests (the calibrated step, 0.245 s)
    against ~4,000 asked of them, so in our simulator (same timing, 120 s) their batches
    fill ~40 s in and decodes then wait for a slot: TBT P50 / P90 0.34 / 0.64 s, E2E P50
    54 s (measured 2026-12-08; 3.4 % of decodes moved to the mixed pool). Returns the
    simulation's metrics and the model's with and without the cap."""
    import splitwise_jax as sj

    cluster = sj.make_cluster("splitwise-hhcap", 23, 12, model="llama2-70b")
    wl = sj.load_workload("conversation", rate_per_s=226.97)
    sim = sj.simulate(cluster, sj.poisson_trace(wl, wl.rate_per_s, 120.0, 95)).metrics
    # A fresh jit per law (the flag is read when the program is traced): two compiled
    # programs are quicker here than the eager op-by-op calls (the test alone: 62.8 ->
    # 46.3 s, 2-core machine, 2026-12-07).
    new = jax.jit(lambda c, w: sj.evaluate(c, w, 120.0))(cluster, wl)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fs, "BATCH_SLOTS", False)
        old = jax.jit(lambda c, w: sj.evaluate(c, w, 120.0))(cluster, wl)
    return sim, new, old


def test_token_pool_slots_as_our_simulator(slots_run):
    """Without the cap the model's batch grew past 512 and its decodes moved off the token
    pool: TBT P50 / P90 -53 / -78 %, E2E P50 -17 %. With it (and the drafting regime,
    the default since the thirty-second session): TBT P50 within 30 % (one seed: the
    measured error of the twenty-sixth session and a margin for the seed), and the old
    law's TBT P90 more than half below. TBT P90 and E2E P50: the next test."""
    sim, new, old = slots_run
    assert abs(float(new.tbt_s[0]) / sim["tbt_s"]["p50"] - 1.0) < 0.30, (float(new.tbt_s[0]), sim["tbt_s"]["p50"])
    assert float(old.tbt_s[1]) < 0.5 * sim["tbt_s"]["p90"], (float(old.tbt_s[1]), sim["tbt_s"]["p90"])


@pytest.mark.xfail(strict=True, reason=(
    "a known deviation (docs/validation.md, thirty-second session): the model's slot queue is "
    "first come first served (a fluid backlog, 31 s on average); the simulation shares the slots "
    "between the decodes it has passed over (its later arrivals start sooner and run slower); "
    "TBT P90 1.04 s against "
    "0.64 s, E2E P50 66 s against 54 s. The old drafting law passed (+29 %, E2E within 15 %) by "
    "moving 17 % of the decodes to the mixed pool, against the simulation's 3.4 % (the regime: 0 %)"))
def test_token_pool_slots_tbt_p90_and_e2e_as_our_simulator(slots_run):
    """TBT P90 within 30 % of the simulation's, as P50 above; E2E P50 within 15 %."""
    sim, new, _ = slots_run
    assert abs(float(new.e2e_s[0]) / sim["e2e_s"]["p50"] - 1.0) < 0.15, (float(new.e2e_s[0]), sim["e2e_s"]["p50"])
    assert abs(float(new.tbt_s[1]) / sim["tbt_s"]["p90"] - 1.0) < 0.30, (float(new.tbt_s[1]), sim["tbt_s"]["p90"])
