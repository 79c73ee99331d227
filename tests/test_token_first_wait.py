"""The token machines' first-step wait (`flows_splitwise._token_first_wait`, issue 39).

On by default (`TOKEN_FIRST_WAIT`, with the drafting regime; the thirty-second
session); these tests set it for themselves, so that they keep checking the wait if the
default changes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from splitwise_jax.cluster import flows_splitwise as fs
from splitwise_jax.cluster.cluster import _classes
from splitwise_jax.cluster.designs import make_cluster
from splitwise_jax.cluster.percentiles import Resolution
from splitwise_jax.cluster.workload import workload


def _parts(n_p, n_t, rate, monkeypatch, horizon=120.0):
    monkeypatch.setattr(fs, "TOKEN_FIRST_WAIT", True)
    c, wl = make_cluster("splitwise-hh", n_p, n_t), workload("coding", rate)
    cls = _classes(wl)
    s = fs._setup(c, cls, jnp.asarray(wl.rate_per_s, float), jnp.asarray(wl.arrival_cv2, float), horizon,
                  Resolution(), horizon)
    return s, fs._step1_drafting(s)


def test_on_by_default_and_nothing_waits_when_off(monkeypatch):
    assert fs.TOKEN_FIRST_WAIT is True
    monkeypatch.setattr(fs, "TOKEN_FIRST_WAIT", False)
    assert fs._token_first_wait(None, None, 1.0, None) == (0.0, 0.0, 0.0)


def test_the_chance_lies_between_the_lag_limited_and_the_pasta_law(monkeypatch):
    # A drafted token pool (HH 20 + 4 on coding at 80 req/s drafts ~4 %): the chance is
    # the blend r [a E[D] + (1 - a) E[min(D, L)]], so at most PASTA's r E[D] and at least
    # the lag-limited r E[min(D, L)]; the residual waits are positive and at most the
    # longest draft.
    s, d = _parts(20.0, 4.0, 80.0, monkeypatch)
    lag = jnp.asarray(np.linspace(0.05, 3.0, d.t_alone.shape[0]))
    hit, w1, w2 = (np.asarray(x)[:, 0] for x in fs._token_first_wait(s, d, 1.0, lag))
    r = float(s.lam * d.x_tot / s.n_t)
    pasta = r * float(jnp.dot(d.w_t, d.t_alone))
    lagged = r * np.asarray(jnp.sum(d.w_t[None, :] * jnp.minimum(d.t_alone[None, :], lag[:, None]), axis=1))
    assert r > 0.05
    # The law's min(D, L) is the p = 8 smooth min, at least 2^(-1/8) of the hard one (its
    # worst case, D = L); PASTA's bound is exact up to round-off.
    assert np.all(hit <= pasta * (1 + 1e-9)) and np.all(hit >= 2 ** (-1 / 8) * lagged), (hit, pasta, lagged)
    assert np.all(np.diff(hit) >= -1e-12)            # a longer lag, more chance
    assert np.all(w1 > 0) and np.all(w1 <= float(jnp.max(d.t_alone))) and np.all(w2 >= w1**2)


def test_drained_share_follows_the_drafts_per_token_machine(monkeypatch):
    # E_u[(1 - exp(-z u))^N_t]: ~0 with few drafts per machine, -> 1 with many, and
    # lower for a larger token pool at the same drafts per machine.
    s, d = _parts(20.0, 4.0, 80.0, monkeypatch)
    z = float(s.lam * d.x_tot * s.horizon_s / s.n_t)
    a = float(fs._drained_time(s, d))
    u = (np.arange(4096) + 0.5) / 4096
    assert a == pytest.approx(np.mean((1 - np.exp(-z * u)) ** 4), rel=2e-3)  # the 32-point rule vs a fine one
    few = float(fs._drained_time(s, d._replace(x_tot=d.x_tot * 1e-5)))
    more_machines = float(fs._drained_time(s._replace(n_t=jnp.asarray(12.0)), d._replace(x_tot=d.x_tot * 3.0)))
    assert few < 1e-3 and more_machines < a


def test_finite_gradients_with_the_wait_on(monkeypatch):
    # The flows that carry the wait (the token route's chance and residual, the moved
    # share the reservations set); the percentile solver already differentiates the
    # same first-step event on the mixed route (tests/test_percentiles.py).
    monkeypatch.setattr(fs, "TOKEN_FIRST_WAIT", True)  # read when the program is traced: a jit of its own
    wl = workload("coding", 70.0)
    hh, cls = make_cluster("splitwise-hh", 20.0, 4.0), _classes(wl)

    def f(x):
        fl = fs.splitwise_flows(hh.replace(n_prompt=x[0], n_token=x[1]), cls, x[2], jnp.asarray(1.0), 120.0,
                                Resolution(), 120.0)
        tok = fl.decode_routes[0]
        return (jnp.sum(tok.first_busy) + jnp.sum(tok.first_wait_s) + jnp.sum(jnp.sqrt(tok.first_wait_s2))
                + jnp.sum(fl.decode_routes[1].weight))

    g_f = jax.jit(jax.value_and_grad(f))  # one trace for the three points
    for x in ((20.0, 4.0, 60.0), (26.0, 6.0, 70.0), (30.0, 12.0, 110.0)):
        v, g = g_f(jnp.asarray(x))
        assert np.isfinite(float(v)) and np.all(np.isfinite(np.asarray(g))), (x, v, g)
        assert float(v) > 0.0
