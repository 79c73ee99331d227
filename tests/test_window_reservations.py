"""The token pool's KV reservations building up through a run's window
(`flows_splitwise._overflow_over_window`, `WINDOW_RESERVATIONS`; issue 39)."""

import jax
import jax.numpy as jnp
import numpy as np

from splitwise_jax.cluster import flows_splitwise as fs
from splitwise_jax.cluster.cluster import _classes
from splitwise_jax.cluster.workload import workload


def test_off_by_default():
    assert fs.WINDOW_RESERVATIONS is False


def _inputs(sojourn_s, rate=60.0):
    cls = _classes(workload("conversation", rate))
    m_tok = cls.p[:, None] + 1.0 + cls.o[None, :]
    sojourn = jnp.full_like(m_tok, sojourn_s)
    demand = rate * jnp.sum(cls.w * m_tok * sojourn)
    return cls, jnp.asarray(rate), m_tok, sojourn, demand


def _stationary(cls, lam, m_tok, sojourn, capacity):
    var = lam * jnp.sum(cls.w * m_tok**2 * sojourn)
    return fs._overflow_share(cls, lam, m_tok, sojourn, var, capacity)[0]


def test_short_holds_are_the_stationary_law():
    """Reservations held 1 s in a 120 s window: in flight at their stationary level from
    the first quadrature node on (7.5 s), so the share is the stationary one."""
    cls, lam, m_tok, sojourn, demand = _inputs(1.0)
    capacity = 0.9 * demand
    got = fs._overflow_over_window(cls, lam, m_tok, sojourn, 0.0, capacity, 120.0, 8)
    want = _stationary(cls, lam, m_tok, sojourn, capacity)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)


def test_long_holds_overflow_only_late():
    """Held 200 s (longer than the window), a pool that the stationary reservations fill
    2.5x over is full only from ~80 s (lambda u E[m] = capacity), so about a third of
    the arrivals overflow where the stationary law says ~60 % do."""
    cls, lam, m_tok, sojourn, demand = _inputs(200.0)
    capacity = demand / 2.5
    w_share = float(jnp.sum(cls.w * fs._overflow_over_window(cls, lam, m_tok, sojourn, 0.0, capacity, 120.0, 8)))
    s_share = float(jnp.sum(cls.w * _stationary(cls, lam, m_tok, sojourn, capacity)))
    fill_s = float(capacity / (lam * jnp.sum(cls.w * m_tok)))
    assert 120.0 > fill_s > 60.0
    assert w_share < 0.75 * s_share, (w_share, s_share)
    # no arrival before the fill time overflows; after it, at most all of them do
    assert w_share < (120.0 - 0.8 * fill_s) / 120.0


def test_gradients_finite():
    cls, lam, m_tok, sojourn, demand = _inputs(60.0)

    def share(cap, soj):
        f = fs._overflow_over_window(cls, lam, m_tok, sojourn * soj, 0.0, cap, 120.0, 8)
        return jnp.sum(cls.w * f)

    for cap in (0.2, 0.9, 1.5, 5.0):
        g = jax.grad(share, argnums=(0, 1))(cap * demand, 1.0)
        assert all(np.isfinite(float(x)) for x in g), cap
