"""Queue waiting times that stay finite and smooth from light load through overload.

A pool of `c` machines serving prompts in FCFS order behind join-the-shortest-queue by
pending work behaves like a central M/G/c queue. Its waiting time is modelled as

    W = 0                      with probability 1 - C        (a server is free)
    W = R(u) / c               with probability C            (all busy)

where C is the probability of waiting (Sakasegawa's approximation of Erlang C, smooth
in c and rho) and R(u) is the *workload* seen by an arrival at time u after the start
of the arrival window: a reflected Brownian motion started empty, with drift
m = lambda E[S] - c (work per second) and variance s^2 = c E[S] (ca^2 + cs^2) max(rho, 1)
per second: the heavy-traffic diffusion of the workload, lambda E[S]^2 (ca^2 + cs^2), taken
over the busy time (divided by P(busy) ~ rho) because R is the wait *given* that the
arrival waits; C x its stationary mean is then Kingman's mean wait (exact for M/G/1) and
Erlang C's for M/M/c. In overload every arrival waits and the unconditional variance
applies. Arrivals are uniform over the window [0, T], so the wait distribution
is the average of R(u) over u, taken by midpoint quadrature.

Routed on arrival (colocated pools): the simulator sends a prompt to one machine when it
arrives, so a prompt that waits waits first for that machine's iteration in flight; the
busy branch is then shift + R(u) / c (`routed_residual_s`, `WaitModel.shift_s`).

Why a diffusion rather than Pollaczek-Khinchine/Allen-Cunneen: the transient RBM law
is one formula that is the stationary exponential tail when rho < 1, grows linearly
(queues building over the window) when rho > 1, and passes smoothly through rho = 1.
Nothing is infinite or NaN, and gradients flow through rho = 1 (MODELING.md's
"Where the numbers come from", on overload over a finite window; STYLE.md's "Numerics
that stay differentiable": overload is a state the model reports).

References:
    Harrison, "Brownian Motion and Stochastic Flow Systems", 1985, §1.8 (transient
    law of reflected Brownian motion). Kingman, 1961. Sakasegawa, Ann. Inst. Stat.
    Math. 29 (1977) (Lq ~ rho^sqrt(2(c+1)) / (1 - rho)).
"""

from __future__ import annotations

from typing import NamedTuple

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.special import gammaincc, gammaln

from splitwise_jax._smooth import safe_pow, smooth_min_one, softplus

# Temperature of min(C, 1): C overshoots 1 only when rho > 1, where waiting is certain.
_C_TEMPERATURE = 0.01


class WaitModel(NamedTuple):
    """Parameters of one pool's prompt waiting-time law (all scalars).

    Attributes:
        p_wait: probability an arrival waits (C).
        drift: drift of the wait process, seconds of wait per second (= rho - 1).
        var: variance of the wait process per second (s^2 / c^2).
        horizon_s: length of the arrival window T (s).
        rho: offered load lambda E[S] / c.
        shift_s: the wait's floor given that the arrival waits (s): the iteration in
            flight on the machine it was routed to (`routed_residual_s`); 0 for a
            central queue.
        residual_s: mean of an exponential wait added, given that the arrival waits,
            to the queue's (s): the routed machine's iteration in flight as a random
            residual (`routed_residual_s`; Splitwise prompt pools); 0 for none.
        cap_s: the wait (given that the arrival waits) an admitted arrival does not
            exceed (s): the law is taken conditioned on W <= cap_s. A Splitwise prompt
            pool drafts the arrivals that would find more (`balking.balking`); None
            (static) for none.
        rise: how much the load rises over the window (`drift_at`): the load at the
            window's start is rho - rise, and it grows as 1 - exp(-u / ramp_s) to a
            mean of rho over the window; None (static) for a constant load.
        ramp_s: the time constant of that rise (s); None with `rise`.
        jump: load added from `jump_s` on (`drift_at`): a pool whose KV memory fills
            at `jump_s` admits only what the full memory turns over from then
            (`flows_baseline._memory_full`); `drift` includes it (the load after the
            jump), the load before is rho - jump. None (static) for none.
        jump_s: when the jump comes (s, from the window's start); None with `jump`.
    """

    p_wait: jnp.ndarray
    drift: jnp.ndarray
    var: jnp.ndarray
    horizon_s: jnp.ndarray
    rho: jnp.ndarray
    shift_s: jnp.ndarray | float = 0.0
    residual_s: jnp.ndarray | float = 0.0
    cap_s: jnp.ndarray | None = None
    rise: jnp.ndarray | None = None
    ramp_s: jnp.ndarray | None = None
    jump: jnp.ndarray | None = None
    jump_s: jnp.ndarray | None = None


def drift_at(model: WaitModel, u):
    """The wait process's drift to use for an arrival at time u of the window (s).

    Constant (`model.drift`) without a ramp or a jump. With a ramp (a colocated pool
    whose decoding population builds from empty through the window, each prompt
    iteration carrying more decodes: `flows_baseline`), the load at time v is

        rho(v) = rho + rise (h(v) / g - 1),   h(v) = 1 - exp(-v / R),

    g = 1 - (1 - exp(-T / R)) / (T / R) the mean of h over the window [0, T], so that
    its mean is rho. With a jump (the pool's KV memory full from t_j on), rho(v) is that
    plus `jump` past t_j, and `drift` is the load after the jump (rho here is that less
    the jump). Where the load is still below 1 at u the arrival sees the queue of that
    load (drift rho(u) - 1, started empty at 0); the load only rises, so past the time
    v0 where it crossed 1 the queue has grown by the fluid backlog F(u) = int_v0^u
    (rho(v) - 1) dv, and the law is the reflected diffusion over [0, u] with the drift
    F(u) / u that gives that backlog. Both are 0 at u = v0 (continuous; a kink in u
    there)."""
    if model.rise is None and model.jump is None:
        return model.drift
    t_end = jnp.maximum(model.horizon_s, 1e-9)
    jump = 0.0 if model.jump is None else model.jump
    t_j = 0.0 if model.jump_s is None else jnp.maximum(model.jump_s, 0.0)
    base = model.drift - jump                             # the mean load less 1, before the jump
    if model.rise is None:                                # no ramp: a load constant but for the jump
        rise, r, g = 0.0, jnp.asarray(1e9), jnp.asarray(1.0)
    else:
        rise = model.rise
        r = jnp.maximum(model.ramp_s, 1e-9)
        g = jnp.maximum(1.0 + jnp.expm1(-t_end / r) * r / t_end, 1e-9)
    h = -jnp.expm1(-u / r)
    start = base - rise                                   # the drift at v = 0

    def integral(v):                                      # int_0^v (rho(v') - 1) dv', the jump left out
        return start * v + rise / g * (v + r * jnp.expm1(-v / r))

    def crossing(level):  # where the ramp's rho(v) - 1 + level passes 0 (0 if it starts above, 1e9 if never)
        h0 = g * (1.0 - (base + level) / jnp.maximum(rise, 1e-12))
        v = -r * jnp.log1p(-jnp.clip(h0, 0.0, 1.0 - 1e-6))
        return jnp.where(h0 < 1.0 - 1e-6, v, 1e9)

    # the queue starts where the load passes 1: before the jump on the ramp alone, or
    # after it (at the jump, or where the ramp and the jump together pass 1)
    v_start = jnp.minimum(crossing(0.0), jnp.maximum(t_j, crossing(jump)))
    v_in = jnp.minimum(v_start, u)
    backlog = integral(u) - integral(v_in) + jump * jnp.maximum(u - jnp.maximum(t_j, v_in), 0.0)
    if model.jump is None:
        drift = base + rise * (h / g - 1.0)
        return jnp.where(drift > 0.0, jnp.maximum(backlog, 0.0) / jnp.maximum(u, 1e-9), drift)
    # A jump can start the queue from a load below 1 (the drift steps from < 0 to ~0):
    # the two laws blend over a short time, so that the law is continuous in t_j.
    width = _JUMP_WIDTH * t_end
    drift = base + rise * (h / g - 1.0) + jump * jax.nn.sigmoid((u - t_j) / width)
    up = jax.nn.sigmoid((u - v_start) / width)
    return drift + up * (jnp.maximum(backlog, 0.0) / jnp.maximum(u, 1e-9) - drift)


# Time (a share of the window) over which the wait law passes from before a load's jump
# to after it (`drift_at`).
_JUMP_WIDTH = 0.02


# `routed_residual_s`'s share on colocated pools (the baselines), measured against our
# simulator (docs/cluster.md §3, *Routed on arrival*); Splitwise prompt pools: 0.
ROUTED_SHARE_COLOCATED = 0.5
# The same residual's share on Splitwise prompt pools, as an exponential wait (the
# iteration in flight of the machine a prompt was routed to; `WaitModel.residual_s`).
# 0.2 fits our simulator near saturation (docs/validation.md, seventeenth session) but
# is OFF (0.0) until it keeps TTFT falling as prompt machines are added (it broke
# tests/test_cluster.py::test_more_machines_never_raise_ttft) and the paper's iso-power
# rows, which it moved to knife-edge misses (docs/cluster.md §3).
ROUTED_RESIDUAL_SHARE_PROMPT_POOL = 0.0
# Splitwise prompt pools' TTFT wait law with Erlang C itself (`prob_wait_erlang`).
EXACT_C_PROMPT_POOL = False


def routed_residual_s(mean_service_s, scv_service, servers, share):
    """What routing at arrival adds to a wait: part of the iteration in flight.

    SplitwiseSim routes a prompt on arrival to the machine with the fewest pending
    tokens and it waits there; pending tokens count a running prompt whole, so when
    every machine is busy the one chosen is about independent of how far its iteration
    has run (as `flows_splitwise._queue_share` reads it), and the arrival waits for that
    iteration's residual, E[S] (1 + cs^2) / 2, where a central queue waits for the first
    of c to free, which the diffusion's R / c already holds (1 / c of it): the
    difference is (1 - 1/c) E[S] (1 + cs^2) / 2, 0 for one machine. Fewest pending
    tokens favours machines running small prompts, so a waiting arrival waits `share`
    of that (docs/cluster.md §3, *Routed on arrival*, for the value and its origin).
    """
    c = jnp.maximum(servers, 1.0)
    return share * (1.0 - 1.0 / c) * mean_service_s * (1.0 + scv_service) * 0.5


def prob_wait(rho, servers):
    """Sakasegawa's smooth approximation of the Erlang-C waiting probability."""
    expo = jnp.sqrt(2.0 * (jnp.maximum(servers, 1e-6) + 1.0)) - 1.0
    return smooth_min_one(safe_pow(rho, expo), _C_TEMPERATURE)


def prob_wait_erlang(rho, servers):
    """Erlang C itself, continuous in the number of servers c (for whole c it is the
    M/M/c waiting probability to round-off; tests/test_queueing.py).

    Erlang B's continuous extension, 1 / B(c, a) = a int_0^inf e^{-a t} (1 + t)^c dt =
    e^a a^{-c} Gamma(c + 1, a) (Jagerman, 1974), with a = c rho offered erlangs, then
    C = B / (1 - rho (1 - B)). Computed in logs through the regularised upper incomplete
    gamma, whose derivatives in both arguments JAX provides. For rho >= 1 every arrival
    waits: C is continued linearly past 1 and capped smoothly at 1 with Sakasegawa's
    temperature, as `prob_wait` is. Where Sakasegawa's form overstates C most is
    moderate load on many servers (rho = 0.6 on 40 machines: 0.016 against 0.0019).

    Reference: Jagerman, "Some properties of the Erlang loss function", BSTJ 53 (1974).
    """
    c = jnp.maximum(servers, 1e-6)
    r = jnp.clip(rho, 0.0, 1.0)
    a = jnp.maximum(r * c, 1e-12)
    log_inv_b = jnp.log(gammaincc(c + 1.0, a)) + gammaln(c + 1.0) + a - c * jnp.log(a)
    b = jnp.exp(-jnp.maximum(log_inv_b, 0.0))  # B <= 1
    erlang = b / jnp.maximum(1.0 - r * (1.0 - b), 1e-30)
    return smooth_min_one(erlang + jnp.maximum(rho - 1.0, 0.0), _C_TEMPERATURE)


class Burstiness(NamedTuple):
    """A measured arrival stream's burstiness at the time scales a queue sees: its index
    of dispersion of counts, IDC(tau) = Var N(tau) / E N(tau), on log-spaced scales
    (1 for Poisson at every scale; 2 m - 1 at every scale for Poisson batches of
    geometric size with mean m). `wait_model` reads it at tau = E[S].

    Attributes:
        idc: (L,) IDC at each scale.
        scale_s: (L,) the scales tau (s), increasing.
    """

    idc: jnp.ndarray
    scale_s: jnp.ndarray

    def at(self, tau_s):
        """IDC at tau_s, linear in log tau between scales, the end values outside."""
        log_s = jnp.log(self.scale_s)
        return jnp.interp(jnp.log(jnp.maximum(tau_s, 1e-30)), log_s, self.idc)


# Smoothing (in units of IDC) of max(IDC - 1, 0) in `burst_size`: x^2 / (x + delta) for
# x > 0, 0 below; C1 at x = 0 and exactly 0 for Poisson or smoother counts.
_BURST_SMOOTH = 0.1


def burst_size(idc):
    """Mean batch size m of Poisson batches of geometric size with the given index of
    dispersion (IDC = E[B^2] / E[B] = 2 m - 1; such a stream's inter-arrival ca^2 is also
    2 m - 1): m = 1 (no bursts) for IDC <= 1, smoothly (C1) above."""
    x = jnp.asarray(idc, float) - 1.0
    pos = x > 0.0
    xs = jnp.where(pos, x, 1.0)  # safe mask: the untaken branch stays finite
    return 1.0 + 0.5 * jnp.where(pos, xs * xs / (xs + _BURST_SMOOTH), 0.0)


def wait_model(arrival_rate, mean_service_s, scv_service, servers, arrival_cv2, horizon_s,
               routed_share=0.0, routed_residual_share=0.0, exact_c=False) -> WaitModel:
    """Wait law of a c-server FCFS queue.

    With a scalar ca^2 the arrivals are a renewal stream and the law is Kingman's (module
    docstring). With a measured `Burstiness` (a trace's windows), they are read as Poisson
    batches: the IDC at the queue's own time scale E[S] gives the mean batch m =
    (IDC + 1) / 2 (`burst_size`); arrivals closer together than a service time are what
    make a request wait behind others at light load. A request finds J others of its own
    burst ahead of it, J geometric with P(J >= j) = q^j, q = 1 - 1/m (the size-biased
    view of a geometric batch). It waits when the burst finds every server busy
    (Sakasegawa's C) or when J reaches the free servers, f = c (1 - rho) / (1 - C) on
    average when not all are busy: P(wait) = 1 - (1 - C)(1 - q^f). The mean wait is

        E[S] / (c (1 - rho)) x [C (a + cs^2) / 2 + C (m - 1) + (1 - C) m q^f]

    with a = IDC - 2 (m - 1) (~1: the non-burst part). A burst that finds every server
    busy queues whole (its J ahead, mean m - 1, shared by c servers: the M^X/G/1 term);
    one that finds servers free makes only its requests beyond the f-th wait
    (E[(J - f + 1)^+] = m q^f). With one server this is the exact M^X/G/1 mean wait; in
    overload (C = 1) the variance is Kingman's with ca^2 = IDC. Against a simulated
    M^X/M/c queue (tests/test_queueing.py): P(wait) within 0.06, the mean within the
    simulation's noise, for bursts of 10-25 on 1-10 servers; small bursts (m = 3) on 10
    servers wait more often than this says (mean wait 50-57% low). References: Cooper,
    "Introduction to Queueing Theory", §5.2 (M^X/G/1); Whitt, "The queueing network
    analyzer", BSTJ 62 (1983) (IDC of a batch stream).

    Args:
        arrival_rate: jobs per second into the pool.
        mean_service_s: E[S], seconds.
        scv_service: squared coefficient of variation of S.
        servers: c (continuous; machines in the pool).
        arrival_cv2: ca^2 of inter-arrival times of a renewal stream (1 = Poisson), or a
            `Burstiness`.
        horizon_s: arrival window T, seconds.
        routed_share: share of the routed machine's iteration in flight a waiting
            arrival waits beyond the central queue (`routed_residual_s`; 0: a central
            queue; the colocated pools use `ROUTED_SHARE_COLOCATED`).
        routed_residual_share: the same share of the iteration in flight, waited as an
            exponential of that mean rather than a fixed floor (`WaitModel.residual_s`;
            Splitwise prompt pools use `ROUTED_RESIDUAL_SHARE_PROMPT_POOL`).
        exact_c: the probability of waiting from Erlang C itself (`prob_wait_erlang`)
            rather than Sakasegawa's approximation (`prob_wait`); a Python bool.
    """
    c = jnp.maximum(servers, 1e-6)
    rho = arrival_rate * mean_service_s / c
    drift = rho - 1.0
    c_wait = prob_wait_erlang(rho, c) if exact_c else prob_wait(rho, c)
    # Conditional on waiting: the diffusion of the busy period's workload. For a renewal
    # stream its variance per second is E[S] (ca^2 + cs^2) / c, the unconditional
    # lambda E[S]^2 (ca^2 + cs^2) / c^2 over P(busy) ~ rho, so that P(wait) x (its
    # stationary mean E[S] (ca^2 + cs^2) / (2 c (1 - rho))) is Kingman's / Erlang C's
    # mean wait; in overload (rho > 1, every arrival waits) it is the unconditional rho x
    # that, max(rho, 1) taken smoothly.
    busy = 1.0 + softplus(rho - 1.0, _C_TEMPERATURE)
    shift = routed_residual_s(mean_service_s, scv_service, c, routed_share)
    # a plain 0.0 when there is none, so that `busy_table` keeps its one-grid program
    residual = (0.0 if isinstance(routed_residual_share, (int, float)) and routed_residual_share == 0
                else routed_residual_s(mean_service_s, scv_service, c, routed_residual_share))
    if not isinstance(arrival_cv2, Burstiness):
        var = mean_service_s * (arrival_cv2 + scv_service) / c * busy
        return WaitModel(c_wait, drift, jnp.maximum(var, 1e-12), jnp.asarray(horizon_s, float), rho, shift, residual)
    # Batches: the variance scaled so that P(wait) x the stationary mean is the mean wait
    # above (in overload, where C = P(wait) = 1, again E[S] (IDC + cs^2) / c x rho).
    idc = arrival_cv2.at(mean_service_s)
    m = burst_size(idc)
    q = 1.0 - 1.0 / m
    has_burst = q > 0.0
    free = c * softplus(1.0 - rho, _C_TEMPERATURE) / jnp.maximum(1.0 - c_wait, 1e-6)
    q_f = jnp.where(has_burst, jnp.exp(free * jnp.log(jnp.where(has_burst, q, 1.0))), 0.0)  # safe mask at q = 0
    p_wait = c_wait + (1.0 - c_wait) * q_f  # = 1 - (1 - C)(1 - q^f)
    in_burst = 2.0 * ((m - 1.0) * c_wait + m * q_f * (1.0 - c_wait))
    # An empty pool (rho = 0: C = 0, and q^f = 0 without bursts) has P(wait) = 0; its
    # conditional law is then the limit as C -> 0: ratio 1, in-burst term 2 (m - 1).
    some = p_wait > 0.0
    p_safe = jnp.where(some, p_wait, 1.0)
    ratio = jnp.where(some, c_wait / p_safe, 1.0)
    in_burst = jnp.where(some, in_burst / p_safe, 2.0 * (m - 1.0))
    excess = (idc - 2.0 * (m - 1.0) + scv_service) * ratio + in_burst
    var = mean_service_s * excess / c * busy
    return WaitModel(p_wait, drift, jnp.maximum(var, 1e-12), jnp.asarray(horizon_s, float), rho, shift, residual)


def ndtr(z):
    """Standard normal CDF, 0.5 erfc(-z / sqrt 2): the same function as
    `jax.scipy.stats.norm.cdf` (accurate in both tails: erfc keeps relative precision
    as it falls to zero) at a sixth of its cost in float64 (5.7 vs 34 ns per element on
    the 2-core CPU; jax computes erf and erfc and selects)."""
    return 0.5 * lax.erfc(-z * (1.0 / math.sqrt(2.0)))


def log_ndtr(z):
    """log of the standard normal CDF: log(ndtr(z)) above the point where ndtr would
    underflow, the asymptotic series of `jax.scipy.special.log_ndtr` (order 3, relative
    error 105 / z^8 < 5e-9 there) below. Same values as `norm.logcdf` to 1e-14 in
    float64 at a quarter of its cost; its absolute error near z >> 0 (log(1 - tiny)) is
    below what `rbm_cdf`, which exponentiates it, can see."""
    lower = -20.0 if jnp.result_type(z) == jnp.float64 else -10.0
    mid = z > lower
    z_mid = jnp.where(mid, z, lower)   # safe masks: neither branch sees the other's inputs
    z_low = jnp.where(mid, lower, z)
    z2 = z_low * z_low
    series = 1.0 - 1.0 / z2 + 3.0 / z2**2 - 15.0 / z2**3
    low = -0.5 * z2 - jnp.log(-z_low) - 0.5 * math.log(2.0 * math.pi) + jnp.log(series)
    return jnp.where(mid, jnp.log(ndtr(z_mid)), low)


def rbm_cdf(x, drift, var, t):
    """P(R(t) <= x) for reflected Brownian motion from 0 with given drift and variance."""
    x = jnp.maximum(x, 0.0)
    t = jnp.maximum(t, 1e-9)
    sd = jnp.sqrt(var * t)
    z1 = (x - drift * t) / sd
    z2 = (-x - drift * t) / sd
    # exp(2 m x / s^2) Phi(z2) in log space: the exponent and log Phi cancel when m > 0.
    second = jnp.exp(jnp.minimum(2.0 * drift * x / var + log_ndtr(z2), 0.0))
    return jnp.clip(ndtr(z1) - second, 0.0, 1.0)


def wait_cdf_busy(w, model: WaitModel, n_points: int):
    """CDF of the wait given that the arrival waits, averaged over the arrival window:
    the routed machine's iteration in flight (`shift_s`) and then the queue's workload;
    conditioned on W <= `cap_s` where the model has one."""
    u = model.horizon_s * (jnp.arange(n_points) + 0.5) / n_points
    x = jnp.maximum(jnp.asarray(w) - model.shift_s, 0.0)
    drift = drift_at(model, u)
    vals = jnp.mean(rbm_cdf(x[..., None], drift, model.var, u), axis=-1)
    if model.cap_s is None:
        return vals
    # Conditioned on W <= cap (the arrivals that would find more were drafted).
    x_cap = jnp.maximum(model.cap_s - model.shift_s, 1e-9)
    top = jnp.mean(rbm_cdf(x_cap[..., None], drift, model.var, u), axis=-1)
    ratio = jnp.minimum(vals / jnp.maximum(top, 1e-12), 1.0)
    # Where the unregulated queue grows past the cap within the window (drift > 0), P(W
    # <= cap) underflows and the ratio is round-off; the queue the drafts hold is then
    # the diffusion reflected at 0 and at the cap, whose stationary CDF is
    # expm1(k x) / expm1(k cap), k = 2 drift / var (uniform as k -> 0). The two blend as
    # log10 P(W <= cap) goes from -5 to -3 (float32 keeps ~1e-7 of the CDF).
    held = _held_cdf(jnp.minimum(x, x_cap), x_cap, 2.0 * model.drift / jnp.maximum(model.var, 1e-12))
    w = jnp.clip((jnp.log10(jnp.maximum(top, 1e-30)) + 5.0) / 2.0, 0.0, 1.0)
    return held + w * (ratio - held)


def _held_cdf(x, x_cap, k):
    """expm1(k x) / expm1(k x_cap) for 0 <= x <= x_cap, in logs (stable for any sign of k)."""
    def log_abs_expm1(a):
        a_abs = jnp.maximum(jnp.abs(a), 1e-30)
        return jnp.maximum(a, 0.0) + jnp.log(-jnp.expm1(-a_abs))

    k = jnp.where(jnp.abs(k) < 1e-12, 1e-12, k)
    return jnp.exp(jnp.minimum(log_abs_expm1(k * x) - log_abs_expm1(k * x_cap), 0.0))
