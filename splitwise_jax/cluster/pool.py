"""One pool of identical machines as a fluid model of continuous batching.

Each machine receives prompts (served first, whole, at most `max_batch_tokens` tokens per
iteration) and decoding requests (one token per iteration while they hold KV memory).
Per machine, in steady state:

    busy   = min(lambda_p E[T_prompt], 1)              fraction of time in prompt iterations
    nu     = phi_e(B) busy / E[T_prompt]               prompt iterations a decoder sits through, per s
    step   = t_d(B) + e,  e = t_d nu E[X] / (1 - nu E[X])   time per decode iteration
    B      = lambda_d E[o - 1] step                    Little's law, capped by memory

* Routing by fewest pending tokens (SplitwiseSim's token-JSQ and mixed-pool schedulers)
  sends a prompt to the machine with the fewest pending tokens; prompt tokens dominate,
  so a prompt lands on a machine with no prompt queued and the fewest decoding
  requests. With JSQ keeping the decoders balanced, that machine holds about
  floor(B + U) of them for U uniform on (-1/2, 1/2), i.e. max(B - 1/2, 0) on average
  (smoothed with `_JSQ_TEMPERATURE`), instead of B under random routing. `phi(B)` is
  that ratio: 0 at light load (prompts always find a machine without decoders), -> 1 at
  large B. Checked against the reference runs' per-request data (docs/cluster.md §4b):
  chosen-machine decoders 0.15 / 0.79 / 1.1 / 2.4 / 4.0 / 25.0 observed where
  B = 0.68 / 1.32 / 1.6 / 2.75 / 4.28 / 25.5.
* A decoder that sits through a prompt iteration loses X = the prompt iteration minus
  its own decode step when it rides along (prompt + decodes <= max_batch_tokens), the
  whole prompt iteration when it does not fit (larger prompts run alone and the decodes
  wait: SplitwiseSim's batch-token rule).
* At most `_MAX_PREEMPTIONS` prompt iterations pass a decoder before it runs again
  (SplitwiseSim schedules a task preempted 4 times ahead of prompts), which bounds the
  interference per decode iteration when prompts saturate the machine.

The number of prompt iterations a request sits through is Poisson with mean
(o - 1) e / E[X]; cluster.py turns it into a mixture over counts (a coding request of 13
tokens sits through zero, one or two, and its TBT is multi-modal, not Gaussian).

The fixed point is found by damped Newton iteration in log B with a fixed trip count,
so it is jit/vmap/grad-able; the iteration itself is not differentiated, its gradient
is the implicit one at the root (exact; `_steady_state`). A pool with no decode traffic is a prompt pool (B = 0);
one with no prompts is a token pool.

References:
    Little's law; fluid limits of batching under KV memory (Ao et al., arXiv
    2504.11320); join-the-shortest-queue balance (Winston, J. Appl. Prob. 14, 1977).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from splitwise_jax._roots import damped_log_newton_step, log_slope_step
from splitwise_jax._smooth import smooth_min_one, smooth_min_pos, softplus
from splitwise_jax.cluster.queueing import prob_wait
from splitwise_jax.cluster.segments import queue_segments
from splitwise_jax.specs.batch import Batch

_NEWTON_ITERS = 12
# The iteration stops once a step moves log B less than this (in float64; `_newton_tol`),
# at most _NEWTON_ITERS + 1 evaluations either way. The state carried out is the one at
# the last iterate evaluated, moved to the next iterate along the Newton slope's pair
# (first order: off by ~ curvature x step^2 + slope step x step, < 1e-14 in float64).
_NEWTON_TOL = 1e-8
# Largest last step the state is moved along (past it, a loop that ran out of steps: the
# state stays at its last iterate, as it did before the move existed).
_EXTRAPOLATE_MAX = 1e-6
# p-norm sharpness of min(B, B_max): KV memory is a hard limit. p = 32 moves B by 0.04%
# at 87% of capacity and by 2.2% exactly at it; p = 8 moved 3.5% of decodes off a token
# pool that was only 87% full, which inflated TBT tails against the reference runs.
_MEMORY_P = 32.0
# Temperature of min(rho_p, 1): beyond saturation the machine runs prompt iterations
# only; 0.02 keeps the corner within ~1.4%.
_RHO_TEMPERATURE = 0.02
# Width (in decoding requests) of the corner of max(B - 1/2, 0), the decoders a JSQ-routed
# prompt finds: 0.1 reproduces 0.15 decoders observed at B = 0.68 (0.19 predicted).
_JSQ_TEMPERATURE = 0.1
# SplitwiseSim runs a decode ahead of prompts once it was passed over this many times.
_MAX_PREEMPTIONS = 4.0
# Width (tokens) of the switch between riding along and waiting at max_batch_tokens.
_BATCH_TOKEN_TEMPERATURE = 64.0


def jsq_share(batch):
    """phi(B): decoders on the machine a JSQ-routed prompt joins, over the mean B.

    max(B - 1/2, 0) / B smoothed as softplus(B - 1/2) / (softplus(B - 1/2) + 1/2), which
    is monotone in B, 0 at B = 0 and 1 - 1/(2B) for B >> 1.
    """
    g = softplus(batch - 0.5, _JSQ_TEMPERATURE)
    return g / (g + 0.5)


# Decoders' exposure to prompt iterations (`exposure_share`): the batch size past which
# JSQ's preference for machines with few decoders stops showing in the decoders' share
# of time in prompt iterations (measured on seven baselines; docs/cluster.md §4b).
EXPOSURE_JSQ = True
_EXPOSURE_B0 = 6.0


def exposure_share(batch):
    """The decoders' share of time in prompt iterations over the machines' prompt share.

    JSQ sends a prompt to the machine with the fewest decoders when one runs no prompt,
    so at small B decoders see fewer prompts (`jsq_share`); at large B a machine that
    runs prompts also gains the decoders they leave, and the two cancel. Measured in our
    simulator (decodes inside 20-120 s, their lives on their machines against the
    machines' prompt share): 0.59 / 0.60 / 0.85 / 1.00 / 1.02 / 1.00 / 1.01 at mean
    decoders 0.9 / 1.4 / 2.7 / 7.7 / 25 / 26 / 228 (jsq_share: 0.43 / 0.64 / 0.82 /
    0.94 / 0.98 / 0.98 / 1.00). 1 - (1 - jsq_share) exp(-(B / B0)^2), B0 = 6.
    """
    if not EXPOSURE_JSQ:
        return jsq_share(batch)
    return 1.0 - (1.0 - jsq_share(batch)) * jnp.exp(-jnp.square(batch / _EXPOSURE_B0))


class PoolState(NamedTuple):
    """Steady state of one machine in a pool (per-machine quantities)."""

    rho_prompt: jnp.ndarray        # offered prompt load (may exceed 1)
    batch: jnp.ndarray             # mean decoding requests B
    batch_need: jnp.ndarray        # B the decode load would need without the memory cap
    prompt_s: jnp.ndarray          # (K,) prompt iteration time per prompt class
    mean_prompt_s: jnp.ndarray
    scv_prompt: jnp.ndarray
    decode_s: jnp.ndarray          # decode-only iteration time t_d(B)
    step_s: jnp.ndarray            # mean time per decode iteration, interference included
    events_per_step: jnp.ndarray   # prompt iterations a decoder sits through per decode step
    interf_mean_s: jnp.ndarray     # E[X], time a decoder loses per prompt iteration
    interf_var_s2: jnp.ndarray     # Var[X]
    residual_s: jnp.ndarray        # mean wait for the iteration in flight at a prompt's arrival
    carry_share: jnp.ndarray       # share of prompt iterations a decoder on the machine rides along
    decode_slope_s: jnp.ndarray    # d t_d / d B: the decode-only iteration's time per decoder more


def _iteration_times(timing, p_tok, p_sq, batch, ctx, max_batch_tokens, batching=False, mean_p=None,
                     mean_p_sq=None):
    """Prompt iterations per class (with the decoders that ride along) and the decode-only
    iteration, from ONE timing call (one inlined phase model: compile time).

    Returns (t_prompt (K,), P(a decoder on the machine rides along) (K,), t_decode, and what a
    decoder on the machine loses per prompt iteration (K,)). The last is conditional on
    that decoder being there: it rides along whenever the prompt fits next to the batch
    (p + decoders <= max_batch_tokens), whatever the chance that a prompt finds decoders
    at all; a prompt too large for the batch runs alone and the decoder waits it out.

    With `batching`, the same iterations with the room left under `max_batch_tokens`
    (after the prompt and its riders) filled by other prompts of the mean size
    (`mean_p`, `mean_p_sq`) are evaluated in the same call, and three more (K,) arrays
    are returned: that room (tokens), and the iteration and the decoder's loss with it
    full (`_batched_rates` interpolates between empty and full)."""
    k = p_tok.shape[0]
    found = batch * jsq_share(batch)                    # decoders on the chosen machine
    none = jnp.exp(-found)
    ride = found / jnp.maximum(1.0 - none, 1e-9)        # given at least one
    room = softplus(max_batch_tokens - p_tok, _BATCH_TOKEN_TEMPERATURE)
    fits = jax.nn.sigmoid((max_batch_tokens - p_tok - 1.0) / _BATCH_TOKEN_TEMPERATURE)
    ride_k = smooth_min_pos(ride * jnp.ones(k), jnp.maximum(room, 1e-6), p=8.0)
    b_dec = jnp.maximum(batch, 1.0)
    b_up = b_dec + _SLOPE_DECODERS
    zeros, ones = jnp.zeros(k), jnp.ones(k)
    tok, seqs, sq = [p_tok, p_tok], [ones, ones], [p_sq, p_sq]
    dec, dctx = [zeros, ride_k], [zeros, ride_k * ctx]
    if batching:
        # Room for other prompts next to the prompt: SplitwiseSim picks the waiting prompts
        # before the decodes (`PROMPTS_FIRST_ROOM`; the decodes left out wait the
        # iteration out, as riders do).
        riders = 0.0 if PROMPTS_FIRST_ROOM else (1.0 - none) * ride_k
        extra = softplus(max_batch_tokens - p_tok - riders, _BATCH_TOKEN_TEMPERATURE)
        n_extra = extra / jnp.maximum(mean_p, 1.0)
        tok += [p_tok + extra, p_tok + extra]
        seqs += [ones + n_extra, ones + n_extra]
        sq += [p_sq + n_extra * mean_p_sq, p_sq + n_extra * mean_p_sq]
        dec += [zeros, ride_k]
        dctx += [zeros, ride_k * ctx]
    t = timing.iteration_s(Batch(
        prompt_tokens=jnp.concatenate(tok + [jnp.zeros(2)]),
        prompt_seqs=jnp.concatenate(seqs + [jnp.zeros(2)]),
        prompt_sq_tokens=jnp.concatenate(sq + [jnp.zeros(2)]),
        decode_seqs=jnp.concatenate(dec + [b_dec[None], b_up[None]]),
        decode_ctx_tokens=jnp.concatenate(dctx + [(b_dec * ctx)[None], (b_up * ctx)[None]]),
    ))
    mix_prob = (1.0 - none) * fits
    t_d = t[-2]
    slope = (t[-1] - t_d) / _SLOPE_DECODERS

    def mixture(alone, mixed):
        lost = (1.0 - fits) * alone + fits * jnp.maximum(mixed - t_d, 1e-6)
        return (1.0 - mix_prob) * alone + mix_prob * mixed, lost

    t_p, lost = mixture(t[:k], t[k:2 * k])
    if not batching:
        return t_p, fits, t_d, lost, slope
    t_full, lost_full = mixture(t[2 * k:3 * k], t[3 * k:4 * k])
    return t_p, fits, t_d, lost, extra, t_full, lost_full, slope


# Decoders more at which the decode-only iteration is timed a second time, for its slope
# in the batch (`PoolState.decode_slope_s`; components.arrival_profile).
_SLOPE_DECODERS = 8.0


def interruptions_per_step(frac, t_decode, mean_loss):
    """Prompt iterations a decoder sits through per decode step when it loses a share
    ``frac`` of its time to them, each costing it ``mean_loss`` (E[X]) against its own
    step ``t_decode``: frac / (1 - frac) x t_d / E[X], at most `_MAX_PREEMPTIONS`."""
    per_step = frac / jnp.maximum(1.0 - frac, 1e-6) * t_decode / mean_loss
    return smooth_min_pos(per_step, _MAX_PREEMPTIONS, p=8.0)


def _rates(timing, lam_p, prompt_w, p_tok, p_sq, ctx_tokens, batch, max_batch_tokens, servers=None,
           segments=None):
    """Per-machine rates at decode batch B. Returns (t_p (K,) a prompt's own iteration,
    E[T] the prompt work per prompt, busy, t_d, step, events, E[X], Var[X], carry share,
    s (K,) each class's prompt work)); with `servers` (the pool's machines) queued
    prompts share iterations (`_batched_rates`, with `segments` the long queue's
    companions, `segments.queue_segments`), without it one prompt per iteration
    (s = t_p)."""
    if servers is None:
        t_p, fits, t_d, x_k, slope = _iteration_times(timing, p_tok, p_sq, batch, ctx_tokens, max_batch_tokens)
        s_k = t_p
    else:
        mean_p = jnp.dot(prompt_w, p_tok)
        t0, fits, t_d, x0, room, t1, x1, slope = _iteration_times(timing, p_tok, p_sq, batch, ctx_tokens, max_batch_tokens,
                                                           True, mean_p, jnp.dot(prompt_w, p_sq))
        t_p, s_k, x_k = _batched_rates(lam_p, prompt_w, p_tok, servers, t0, x0, room, t1, x1, segments)
    e_t = jnp.dot(prompt_w, s_k)
    # Iterations, not prompts: a prompt of class k brings s_k / t_k of its iteration
    # (the rest is the prompts batched with it), so iterations weigh the classes by
    # w_k s_k / t_k; unbatched (s = t) that is w.
    it_w = prompt_w * s_k / jnp.maximum(t_p, 1e-12)
    it_w = it_w / jnp.maximum(jnp.sum(it_w), 1e-12)
    e_it = jnp.dot(it_w, t_p)       # a prompt iteration's length (batched or not)
    busy = smooth_min_one(lam_p * e_t, _RHO_TEMPERATURE)
    # What a decoder loses per prompt iteration it sits through (x_k): the prompt
    # iteration, less its own decode step when it rides along.
    e_x = jnp.dot(it_w, x_k)
    var_x = jnp.maximum(jnp.dot(it_w, x_k**2) - e_x**2, 0.0)
    frac = exposure_share(batch) * busy * e_x / e_it     # share of a decoder's time lost
    events = interruptions_per_step(frac, t_d, e_x)
    step = t_d + events * e_x
    return t_p, e_t, busy, t_d, step, events, e_x, var_x, jnp.dot(prompt_w, fits), s_k, slope


# Substitution steps of the batch-size fixed point (`_batched_rates`): the map is a
# contraction with a small slope (the extra tokens change the load by their share of
# the iteration). Measured (thirteenth session) against 12 steps on four baselines
# (A100 x 13 Llama2-70B conversation 60.45 req/s, H100 x 40 BLOOM coding 70, A100 x 20
# BLOOM conversation 40, H100 x 10 Llama2-70B coding 30): TTFT/TBT/E2E percentiles
# within 4e-5 relative after 3 steps, 3e-8 after 6.
_BATCH_FIXED_POINT_STEPS = 3
# The room a queued prompt has for others is the token budget less its own tokens: the
# waiting prompts are picked before the decodes (SplitwiseSim's batch selection), not
# next to them (issue 39, twenty-eighth session).
PROMPTS_FIRST_ROOM = True
# The tokens that join a waiting prompt's iteration grow, with the queue it finds, to
# what a long queue gives from each prompt's side (`segments.queue_segments`), not only
# the two prompts behind it (issue 39, twenty-eighth session).
QUEUE_SEGMENTS = True
# Largest load at which the queue a waiting prompt finds is counted (rho / (1 - rho)).
_QUEUE_RHO_MAX = 0.98


def _packing(prompt_w, p_tok, room, second=True):
    """Prompt tokens that fill a room of `room` (K,) tokens, first come first served
    (SplitwiseSim's batch-token rule: the next queued prompt joins if it fits, and
    batching stops at the first that does not): (K,) the tokens of the first queued
    prompt if it fits, (K,) those of the second if the first did and both fit (None
    without `second`). Prompt sizes are the workload's classes; "fits" is smoothed over
    `_BATCH_TOKEN_TEMPERATURE`."""
    fit1 = jax.nn.sigmoid((room[:, None] - p_tok[None, :]) / _BATCH_TOKEN_TEMPERATURE)       # (K, J)
    first = fit1 @ (prompt_w * p_tok)
    if not second:
        return first, None
    left = room[:, None, None] - p_tok[None, :, None] - p_tok[None, None, :]
    fit2 = jax.nn.sigmoid(left / _BATCH_TOKEN_TEMPERATURE)                                    # (K, J, I)
    return first, jnp.einsum("kj,j,kji,i->k", fit1, prompt_w, fit2, prompt_w * p_tok)


def prompt_batching(prompt_w, p_tok, max_batch_tokens):
    """`batch_prompts` for a pool whose queued prompts share iterations: the long
    queue's companions (`segments.queue_segments`) with `QUEUE_SEGMENTS`, else 1.0."""
    return queue_segments(prompt_w, p_tok, max_batch_tokens) if QUEUE_SEGMENTS else 1.0


def _batched_rates(lam_p, prompt_w, p_tok, servers, t0, x0, room, t1, x1, segments=None):
    """Prompts that queue share an iteration (SplitwiseSim's prompt batching, up to
    max_batch_tokens). A prompt that waits (all machines busy: Sakasegawa's C at the
    batched load) is joined by the prompts that arrived at its machine over one
    iteration (Poisson, mean a = lambda t) plus its share of the pool's queue
    (r / (1 - r) / N, the M/M/c queue given a wait, r = rho smoothly capped at
    `_QUEUE_RHO_MAX`), first come first served while they fit in
    the room its iteration has left (`_packing`; the first two are counted):
    E = C [(1 - e^-a) E1 + (1 - e^-a (1 + a)) E2] tokens; with `segments` (L (K,), the
    companions a long queue gives each prompt, `segments.queue_segments`) the queue's
    prompts join from both sides of it, E = C L (1 - exp(-a E1 / L)): a E1 for a short
    queue, L for a long one. Its own iteration is the one
    with E more tokens (interpolated linearly in E between empty and full room), its
    share of it by tokens, p / (p + E), is the prompt work it brings (the pool's load),
    and a decoder riding along loses the whole batched iteration. The fixed point in
    (a, C) is taken by `_BATCH_FIXED_POINT_STEPS` substitutions from no batching.
    Returns (t (K,) the prompt's iteration, s (K,) its work, x (K,) a rider's loss)."""
    full = jnp.maximum(room, 1e-6)
    first, second = _packing(prompt_w, p_tok, room, second=segments is None)
    long_queue = None if segments is None else jnp.maximum(segments, 1e-6)
    extra = jnp.zeros_like(t0)
    for _ in range(_BATCH_FIXED_POINT_STEPS):
        g = extra / full
        t = t0 + g * (t1 - t0)
        s = t * p_tok / (p_tok + extra)
        rho = lam_p * jnp.dot(prompt_w, s)
        # queued at its machine: the arrivals over one iteration, and the pool's queue
        # (M/M/c: rho / (1 - rho) given that it waits, shared by the c machines)
        r = _QUEUE_RHO_MAX * smooth_min_one(rho / _QUEUE_RHO_MAX, _RHO_TEMPERATURE)
        a = lam_p * jnp.dot(prompt_w, t) + r / (1.0 - r) / jnp.maximum(servers, 1.0)
        none = jnp.exp(-a)
        if segments is None:
            found = prob_wait(rho, servers) * ((1.0 - none) * first + (1.0 - none * (1.0 + a)) * second)
        else:
            found = prob_wait(rho, servers) * long_queue * -jnp.expm1(-a * first / long_queue)
        extra = smooth_min_pos(found, full, p=8.0)  # the smoothed "fits" may overshoot the room
    g = extra / full
    t = t0 + g * (t1 - t0)
    return t, t * p_tok / (p_tok + extra), x0 + g * (x1 - x0)


def interfered_share(duration_s, window_s):
    """The share of a decode's steps that fall inside the arrival window, where prompts
    run, and that share's variance over where the decode starts. A decode of length D
    starting uniformly in a window of length T that ends with the last arrival (after
    it the run drains and no prompt runs) keeps I = min(T - t, D) of its time there:

        E[I] / D   = 1 - x / 2 (x = D / T <= 1),   1 / (2 x) beyond,
        E[I^2] / D^2 = 1 - 2 x / 3,                1 / (3 x^2) beyond,

    both continuous with their slopes at x = 1 (fourteenth session: a colocated decode's
    count of prompt iterations in our simulator grows with its length as ~10 + 0.3 per
    step, not as the model's 0.7 per step; docs/validation.md). Returns (E[I] / D,
    Var[I] / D^2)."""
    x = duration_s / jnp.maximum(window_s, 1e-9)
    big = jnp.maximum(x, 1.0)
    inside = x <= 1.0
    mean = jnp.where(inside, 1.0 - 0.5 * x, 0.5 / big)
    sq = jnp.where(inside, 1.0 - 2.0 * x / 3.0, 1.0 / (3.0 * big**2))
    return mean, jnp.maximum(sq - mean**2, 0.0)


def window_share(residence_s, window_s):
    """The decoding population a decode step sees, over a window of arrivals that starts
    empty, as a share of Little's law's lambda R.

    Requests arrive at rate lambda over [0, T] and stay R on average (exponential
    residence: output lengths are spread, the conversation trace's coefficient of
    variation is ~1): the population is lambda R (1 - e^{-t/R}) while they arrive and
    decays as e^{-(t - T)/R} after, as a simulation that runs a trace and drains it.
    A decode step at a random moment of the decoding (weight B(t)) sees
    int B^2 dt / int B dt = lambda R g(T / R),

        g(theta) = 1 - (1 - e^{-theta}) / theta,

    1 for R << T (Little's law), theta / 2 for R >> T (bounded by lambda T / 2: a pool
    whose decode throughput cannot keep up grows through the window, it does not run to
    its memory).
    """
    theta = window_s / jnp.maximum(residence_s, 1e-9)
    return 1.0 - (-jnp.expm1(-theta)) / theta


def pool_state_at(timing, n_machines, prompt_rate, prompt_w, p_tok, p_sq, decode_rate, mean_decode_iters,
                  ctx_tokens, batch, max_batch_tokens=2048.0, window_s=None, batch_prompts=None) -> PoolState:
    """A pool's state at a given decode batch B (no fixed-point solve).

    `batch_need` is what Little's law asks for at the resulting step time: equal to B at
    the fixed point, larger when B is held down by memory. With `window_s` (the arrival
    window T, s) it is the population a decode step sees over a window that starts
    empty and drains (`window_share`); without, the stationary one.
    """
    n = jnp.maximum(n_machines, 1e-6)
    lam_p = prompt_rate / n
    lam_d = decode_rate / n
    servers = None if batch_prompts is None else n
    segments = None if batch_prompts is None or jnp.ndim(batch_prompts) == 0 else batch_prompts
    t_p, e_t, busy, t_d, step, events, e_x, var_x, carry, s_k, slope = _rates(timing, lam_p, prompt_w, p_tok, p_sq, ctx_tokens,
                                                                      batch, max_batch_tokens, servers, segments)
    e_t2 = jnp.dot(prompt_w, s_k**2)
    scv = jnp.maximum(e_t2 / e_t**2 - 1.0, 0.0)
    decoding = 1.0 - jnp.exp(-batch)
    # A prompt routed by fewest pending tokens goes to a machine that runs no prompt
    # whenever one exists (the wait law's 1 - C), and that machine is decoding: it waits
    # for the iteration in flight, t_d / 2 on average, whatever the pool's prompt load
    # (thirteenth session; it was (1 - busy) x that, a machine chosen at random).
    residual = decoding * 0.5 * t_d
    need = lam_d * mean_decode_iters * step
    if window_s is not None:
        need = need * window_share(mean_decode_iters * step, window_s)
    return PoolState(lam_p * e_t, batch, need, t_p, e_t, scv, t_d, step, events, e_x,
                     var_x, residual, carry, slope)


def pool_state(timing, n_machines, prompt_rate, prompt_w, p_tok, p_sq, decode_rate, mean_decode_iters,
               ctx_tokens, batch_cap, max_batch_tokens=2048.0, window_s=None, batch_prompts=None) -> PoolState:
    """Steady state of a pool: solves Little's law for the decode batch B.

    Args:
        timing: phase-timing strategy (`PhaseTiming`) of the pool's machine type.
        n_machines: machines in the pool (continuous).
        prompt_rate: prompts per second into the pool.
        prompt_w, p_tok, p_sq: (K,) prompt class probabilities, tokens, tokens^2.
        decode_rate: decoding requests per second into the pool.
        mean_decode_iters: E[o - 1], decode iterations per request.
        ctx_tokens: mean KV context of a decoding request (tokens).
        batch_cap: most decoding requests a machine's KV memory holds.
        max_batch_tokens: tokens one iteration may carry (prompts + one per decode).
        window_s: arrival window T (s) of a run that starts empty and drains: Little's
            law then counts the population a decode step sees over it
            (`window_share`); None: the stationary law.
        batch_prompts: None (one prompt per iteration), or prompts that queue share an
            iteration up to `max_batch_tokens` (`_batched_rates`): 1.0 for the two
            prompts behind each, or (K,) the long queue's companions of each class
            (`prompt_batching`, which picks).
    """
    if isinstance(decode_rate, (int, float)) and decode_rate == 0:
        # No decode traffic: Little's law's root is the floor of its log, B = 1e-12, with
        # no iteration to run (half the pool states a Splitwise cluster builds).
        return pool_state_at(timing, n_machines, prompt_rate, prompt_w, p_tok, p_sq, decode_rate, mean_decode_iters,
                             ctx_tokens, jnp.asarray(_NO_BATCH), max_batch_tokens, batch_prompts=batch_prompts)
    args = (timing, n_machines, prompt_rate, prompt_w, p_tok, p_sq, decode_rate, mean_decode_iters, ctx_tokens,
            batch_cap, max_batch_tokens, window_s, batch_prompts)
    return _steady_state(args)


def pool_states(*calls: dict) -> list[PoolState]:
    """`pool_state` of several independent pools (each a dict of its keyword
    arguments), as one vmapped call when their timings have the same structure (the
    same machine model, or two machine types under one phase model): the program then
    holds one copy of the iteration instead of one per pool. Otherwise one call each.
    Same answers either way."""
    names = ("timing", "n_machines", "prompt_rate", "prompt_w", "p_tok", "p_sq", "decode_rate",
             "mean_decode_iters", "ctx_tokens", "batch_cap", "max_batch_tokens", "window_s", "batch_prompts")
    rows = [tuple(c.get(n) for n in names) for c in calls]
    flat = [jax.tree_util.tree_flatten(r) for r in rows]
    same = all(f[1] == flat[0][1] and [jnp.shape(x) for x in f[0]] == [jnp.shape(x) for x in flat[0][0]]
               for f in flat)
    if len(calls) < 2 or not same:
        return [pool_state(**c) for c in calls]
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack([jnp.asarray(x, float) for x in xs]), *rows)
    if all(isinstance(c["decode_rate"], (int, float)) and c["decode_rate"] == 0 for c in calls):
        # prompt-only pools (as `pool_state`): the state at B = _NO_BATCH, no loop
        out = jax.vmap(lambda a: pool_state_at(*a[:9], jnp.asarray(_NO_BATCH), a[10], a[11], a[12]))(stacked)
    else:
        out = jax.vmap(_steady_state)(stacked)
    return [jax.tree_util.tree_map(lambda a, i=i: a[i], out) for i in range(len(calls))]


def _newton_tol():
    """`_NEWTON_TOL` in float64; in float32, where one step of the residual's round-off
    moves log B by ~1e-6, 1e-5 (read when traced, as `_roots.log_slope_step`)."""
    return _NEWTON_TOL if jnp.result_type(float) == jnp.float64 else 1e-5


# B of a pool without decode traffic: where the residual's floor (need >= 1e-12) puts it.
_NO_BATCH = 1e-12


def _state_and_residual(args, log_b):
    """The pool's state at B = exp(log_b), and Little's-law residual r = log B - log need."""
    (timing, n_machines, prompt_rate, prompt_w, p_tok, p_sq, decode_rate, mean_decode_iters, ctx_tokens, batch_cap,
     max_batch_tokens, window_s, batch_prompts) = args
    st = pool_state_at(timing, n_machines, prompt_rate, prompt_w, p_tok, p_sq, decode_rate, mean_decode_iters,
                       ctx_tokens, jnp.exp(log_b), max_batch_tokens, window_s, batch_prompts)
    return st, log_b - jnp.log(jnp.maximum(smooth_min_pos(st.batch_need, batch_cap, p=_MEMORY_P), _NO_BATCH))


def _root(args):
    """Newton in log B for the root of the residual (not differentiated: see
    `_steady_state`): (log B*, the state there).

    The map B -> need(B) grows less than proportionally (decode time is affine in B), so
    the residual's slope lies in (0, 1]; flooring it at 0.05 and clipping steps to +-2
    (a factor e^2) keeps the iteration safe from a poor start (the initial guess assumes
    a 40 ms iteration; 12 steps reach machine precision from any start within a factor
    e^8 of the answer). The slope is a forward difference over a step eps in log B, the
    pair evaluated as one vmapped call (relative error ~ eps + ulp / eps: it sets how fast
    the iteration converges, not where it stops). The loop carries the states at the
    iterate it evaluated and at its slope's partner, so the program holds one copy of the
    phase model; the answer is the next iterate, its state the last one moved there along
    the pair (first order in a step below `_NEWTON_TOL`), which saves the evaluation that
    only confirmed convergence (docs/speed.md §2 item 11)."""
    n_machines, decode_rate, mean_decode_iters, batch_cap = args[1], args[6], args[7], args[9]
    lam_d = decode_rate / jnp.maximum(n_machines, 1e-6)

    def newton(carry):
        i, log_b, _, _ = carry
        st, r = jax.vmap(lambda lb: _state_and_residual(args, lb))(jnp.stack([log_b, log_b + log_slope_step()]))
        new = damped_log_newton_step(log_b, r)
        return i + 1, new, (log_b, st), jnp.abs(new - log_b)

    def going(carry):
        i, _, _, moved = carry
        return (i < _NEWTON_ITERS + 1) & (moved > _newton_tol())

    b0 = smooth_min_pos(lam_d * mean_decode_iters * 0.04 + 1e-9, batch_cap, p=_MEMORY_P)
    log_b0 = jnp.log(b0)
    zero = jnp.zeros((2,), log_b0.dtype)
    empty = (log_b0, PoolState(*(zero,) * 3, jnp.zeros((2,) + jnp.shape(args[4]), log_b0.dtype), *(zero,) * 10))
    _, new, (log_b, pair), moved = jax.lax.while_loop(
        going, newton, (0, log_b0, empty, jnp.asarray(jnp.inf, log_b0.dtype)))
    # The state at the last iterate, moved to the next one along the pair's difference
    # (`_NEWTON_TOL`): saves the evaluation that would only have confirmed it.
    near = moved < _EXTRAPOLATE_MAX
    frac = jnp.where(near, (new - log_b) / log_slope_step(), 0.0)
    st = jax.tree_util.tree_map(lambda a: a[0] + (a[1] - a[0]) * frac, pair)
    return jnp.where(near, new, log_b), st


@jax.custom_jvp
def _steady_state(args) -> PoolState:
    """The state at the root B* of Little's law. Its derivative is the implicit one
    (`_steady_state_jvp`), so neither the forward program nor a gradient carries the
    Newton iteration's derivative: tracing a gradient through the loop was half of a
    cluster gradient program's tracing time; the forward program holds one copy of the
    phase model, in the loop (docs/speed.md §4)."""
    return _root(args)[1]


@_steady_state.defjvp
def _steady_state_jvp(primals, tangents):
    """Implicit function theorem at the root, exact: with r(theta, log B*) = 0,
    dlog B* = -(dr/dtheta . dtheta) / (dr/dlog B), and the state moves by its partial
    derivative along theta plus its derivative along log B times dlog B*. One
    linearisation of the state, applied to both directions."""
    (args,), (args_dot,) = primals, tangents
    log_b = _root(args)[0]
    (st, _), lin = jax.linearize(_state_and_residual, args, log_b)
    st_theta, r_theta = lin(args_dot, jnp.zeros_like(log_b))
    zeros = jax.tree_util.tree_map(jnp.zeros_like, args_dot)
    st_b, r_b = lin(zeros, jnp.ones_like(log_b))
    dlog_b = -r_theta / jnp.where(jnp.abs(r_b) > 1e-6, r_b, 1e-6)
    return st, jax.tree_util.tree_map(lambda t, b: t + b * dlog_b, st_theta, st_b)
