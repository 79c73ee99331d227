"""A prompt pool that drafts: the work an arrival finds, when arrivals that would find
too much leave for another pool (issue 39, docs/cluster.md §4, "The drafting regime").

SplitwiseSim's mixed-pool scheduler sends a prompt of p_k tokens to the least-loaded
prompt machine unless that machine has a queue and its pending tokens plus p_k pass
`draft_pending_tokens` D; then the prompt is drafted onto a token machine. So the
prompt pool admits a class only while the work W its arrivals find is below the class's
threshold theta_k = (D - E[p] - p_k) tau (tau seconds per prompt token; the running
prompt counted whole, as the scheduler's pending tokens count it), or while the machine
has no queue. Large prompts have small thresholds: once the pool has a queue they are
the first drafted, and the work they would have brought is what keeps the queue from
growing. The pool regulates itself; where the prompts offered exceed its capacity
(rho > 1 at full intake), the queue settles where the drafted work balances the excess.

The law: W given that the arrival waits is a diffusion reflected at 0 whose drift at
level w is the admitted load less one,

    rho(w) - 1,  rho(w) = sum_k rho_k (1 - d_k(w)),  d_k(w) = 1[w > theta_k] q(w),

rho_k = lambda w_k s_k / c each class's offered load, q(w) = 1 - exp(-w / r) the chance
the machine holding work w has a queue behind its running prompt (r = E[S^2] / 2 E[S],
the running prompt's mean residual, taken as exponential). Its stationary density is
f(w) ~ exp((2 / var) int_0^w (rho(u) - 1) du) (the diffusion's speed measure, constant
variance per second `var`), in closed form since int_0^w d_k = G(w, theta_k) =
[(w - theta_k) - r (exp(-theta_k / r) - exp(-w / r))]^+. The class's drafted share given
that it waits is P_k = E[d_k(W)], read on a grid of `n_points`.

Without the thresholds (every class admitted) this is the stationary law of the
model's unregulated diffusion, an exponential of mean var / (2 (1 - rho)). The window
(finite horizon) is not modelled here: a queue held by drafting reaches its level in
seconds (the drift is rho - 1 ~ 0.3 per second below it, strongly negative above), far
inside a 120 s run.

Measured against our simulator (Splitwise-HH 20 + 30, BLOOM-176B, coding at 80 req/s,
calibrated timing; docs/cluster.md §4): drafted share 6.6 % against the simulation's
5.6-6.6 % over four seeds (the earlier law: 24 %), none below 2,000 tokens as in the
simulation (the earlier law drafted 10-18 % of them); the admitted prompts' wait given
that they wait, P50 / P90 / P99 0.24 / 0.39 / 0.51 s in this law against the
simulation's 0.27 / 0.49 / 0.69 s.

Where the other pool refuses a share 1 - take of the drafts (every token machine holds a
drafted queue), the refused ones stay: the drift's cut is scaled by take.

Assumptions (named in docs/cluster.md §7): constant variance per second; W is the
least-loaded machine's work, as in the model's central-queue diffusion; the running
prompt's residual is exponential.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from splitwise_jax._smooth import softplus

# Quantile of the admitted wait (given that it waits) taken as its upper end (`cap_s`).
CAP_QUANTILE = 0.999


class Balking(NamedTuple):
    """The drafting law's answer.

    Attributes:
        drafted: (K,) P(class k would be drafted | it finds every machine busy), before
            the other pool's refusals (a share 1 - take of these stay).
        cap_s: the wait an admitted arrival does not exceed given that it waits (its
            `CAP_QUANTILE`), s.
        rho_full: the load offered to the pool before drafting, lambda E[S] / c.
    """

    drafted: jax.Array
    cap_s: jax.Array
    rho_full: jax.Array


def balking(p, wp, prompt_s, rate, servers, threshold_tokens, var, take=1.0, n_points: int = 256) -> Balking:
    """The drafting regime's law (module docstring).

    Args:
        p: (K,) prompt tokens of each class.
        wp: (K,) each class's share of arrivals (sums to 1).
        prompt_s: (K,) each class's prompt time on a prompt machine (s).
        rate: arrivals per second offered to the pool.
        servers: machines in the pool (c).
        threshold_tokens: the scheduler's `draft_pending_tokens` (D).
        var: the workload diffusion's variance per second (s^2 / s).
        take: the share of drafts the other pool takes (the rest stay and queue).
        n_points: grid points over the work levels (static).
    """
    c = jnp.maximum(servers, 1e-6)
    mean_p = jnp.maximum(jnp.dot(wp, p), 1.0)
    e_s = jnp.maximum(jnp.dot(wp, prompt_s), 1e-9)
    tau = e_s / mean_p
    theta = softplus(threshold_tokens - mean_p - p, 64.0) * tau                 # (K,)
    resid = 0.5 * jnp.dot(wp, prompt_s**2) / e_s                                # r
    load_k = rate * wp * prompt_s / c                                            # (K,)
    rho_full = jnp.sum(load_k)
    var = jnp.maximum(var, 1e-12)
    # Above the largest threshold every class with a queue leaves: the drift there is
    # rho_full exp(-w / r) - 1, negative past r ln(rho_full), and the density falls on
    # the scale var / 2 after that. Below capacity it falls at least as fast as the
    # unregulated law's, on the scale var / (2 (1 - rho_full)).
    w_hi = jnp.minimum(jnp.max(theta) + resid * (4.0 + jnp.log1p(rho_full)) + 20.0 * var,
                       30.0 * var / (2.0 * jnp.maximum(1.0 - rho_full, 1e-9)))
    w_hi = jax.lax.stop_gradient(w_hi + 1e-3)
    w = w_hi * jnp.arange(n_points) / (n_points - 1.0)                          # (N,)
    h = w_hi / (n_points - 1.0)
    # int_0^w d_k(u) du, with [.]^+ smoothed on the grid's own scale.
    m = theta[None, :] + softplus(w[:, None] - theta[None, :], h)              # (N, K)
    g = (m - theta[None, :]) - resid * (jnp.exp(-theta[None, :] / resid) - jnp.exp(-m / resid))
    log_f = (2.0 / var) * ((rho_full - 1.0) * w - take * (g @ load_k))
    f = jnp.exp(log_f - jax.lax.stop_gradient(jnp.max(log_f)))
    trap = jnp.full((n_points,), h).at[0].set(0.5 * h).at[-1].set(0.5 * h)
    mass = f * trap
    mass = mass / jnp.sum(mass)
    q = -jnp.expm1(-w / resid)
    d_k = jax.nn.sigmoid((w[:, None] - theta[None, :]) / h) * q[:, None]      # (N, K)
    drafted = mass @ d_k
    # The admitted arrivals' wait: the density weighted by what it admits.
    adm = mass * (1.0 - take * (d_k @ (wp / jnp.sum(wp))))
    cdf = jnp.cumsum(adm) / jnp.sum(adm)
    cdf = cdf + 1e-9 * jnp.arange(n_points) / n_points                          # strictly increasing
    cap = jnp.interp(CAP_QUANTILE, cdf, w)
    return Balking(drafted, cap, rho_full)
