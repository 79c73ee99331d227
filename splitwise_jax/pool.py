"""One pool of identical machines as a fluid model of continuous batching.

Each machine receives prompts (served with priority, one iteration each) and decoding
requests (one token per iteration while they hold KV memory). In steady state:

    rho_p  = lambda_p E[T_prompt(B)]                      prompt busy fraction
    r      = rho_p / E[T_prompt] + (1 - rho_p) / t_d(B)   iterations per second
    B      = lambda_d E[o - 1] / r                        Little's law, capped by memory

where T_prompt(B) is a prompt iteration carrying B decodes (a mixed iteration: the
decodes ride along; with probability exp(-B) there are none) and t_d(B) a decode-only
iteration. A decoding request sees iterations of mean 1/r; the fraction of them that are
prompt iterations gives the variance of its time between tokens (MODELING.md: mixed
batching interference; Splitwise Figs. 2 and 16). The fixed point is found by damped
Newton iteration in log B with a fixed trip count, so it is jit/vmap/grad-able
(gradients flow through the unrolled iterations, which converge to machine precision). A pool with no decode
traffic is a prompt pool (B = 0); one with no prompts is a token pool.

References:
    Little's law; MODELING.md "Continuous batching as a fluid model" (Ao et al.,
    arXiv 2504.11320).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from splitwise_jax._smooth import smooth_min_one, smooth_min_pos
from splitwise_jax.batch import Batch

_NEWTON_ITERS = 12
# p-norm sharpness of min(B, B_max): KV memory is a hard limit. p = 32 moves B by 0.04%
# at 87% of capacity and by 2.2% exactly at it; p = 8 moved 3.5% of decodes off a token
# pool that was only 87% full, which inflated TBT tails against the reference runs.
_MEMORY_P = 32.0
# Temperature of min(rho_p, 1) in the iteration-rate equation: beyond saturation the
# machine runs prompt iterations only; 0.02 keeps the corner within ~1.4%.
_RHO_TEMPERATURE = 0.02


class PoolState(NamedTuple):
    """Steady state of one machine in a pool (per-machine quantities)."""

    rho_prompt: jnp.ndarray        # offered prompt load (may exceed 1)
    batch: jnp.ndarray             # mean decoding requests B
    batch_need: jnp.ndarray        # B the decode load would need without the memory cap
    iter_rate: jnp.ndarray         # iterations per second seen by decoders
    prompt_s: jnp.ndarray          # (K,) prompt iteration time per prompt class
    mean_prompt_s: jnp.ndarray
    scv_prompt: jnp.ndarray
    decode_s: jnp.ndarray          # decode-only iteration time t_d(B)
    tbt_mean_s: jnp.ndarray        # mean time per decode iteration seen by a decoder
    tbt_var_s2: jnp.ndarray        # its variance per iteration
    residual_s: jnp.ndarray        # mean wait for the iteration in flight at a prompt's arrival


def _iteration_times(timing, p_tok, p_sq, batch, ctx):
    """Prompt iterations per class, alone and with B decodes riding along, and the
    decode-only iteration, from ONE timing call (one inlined phase model: compile time)."""
    k = p_tok.shape[0]
    none = jnp.exp(-batch)
    ride = batch / jnp.maximum(1.0 - none, 1e-9)  # mean batch given at least one decoder
    b_dec = jnp.maximum(batch, 1.0)
    zeros, ones = jnp.zeros(k), jnp.ones(k)
    t = timing.iteration_s(Batch(
        prompt_tokens=jnp.concatenate([p_tok, p_tok, jnp.zeros(1)]),
        prompt_seqs=jnp.concatenate([ones, ones, jnp.zeros(1)]),
        prompt_sq_tokens=jnp.concatenate([p_sq, p_sq, jnp.zeros(1)]),
        decode_seqs=jnp.concatenate([zeros, ride * ones, b_dec[None]]),
        decode_ctx_tokens=jnp.concatenate([zeros, ride * ctx * ones, (b_dec * ctx)[None]]),
    ))
    alone, mixed, t_d = t[:k], t[k:2 * k], t[2 * k]
    return none * alone + (1.0 - none) * mixed, t_d


def _rates(timing, lam_p, prompt_w, p_tok, p_sq, ctx_tokens, batch):
    t_p, t_d = _iteration_times(timing, p_tok, p_sq, batch, ctx_tokens)
    e_t = jnp.dot(prompt_w, t_p)
    busy = smooth_min_one(lam_p * e_t, _RHO_TEMPERATURE)
    r = busy / e_t + (1.0 - busy) / t_d
    return t_p, e_t, busy, t_d, r


def pool_state_at(timing, n_machines, prompt_rate, prompt_w, p_tok, p_sq, decode_rate, mean_decode_iters,
                  ctx_tokens, batch) -> PoolState:
    """A pool's state at a given decode batch B (no fixed-point solve).

    `batch_need` is what Little's law asks for at the resulting iteration rate: equal to
    B at the fixed point, larger when B is held down by memory.
    """
    n = jnp.maximum(n_machines, 1e-6)
    lam_p = prompt_rate / n
    lam_d = decode_rate / n
    t_p, e_t, busy, t_d, r = _rates(timing, lam_p, prompt_w, p_tok, p_sq, ctx_tokens, batch)
    e_t2 = jnp.dot(prompt_w, t_p**2)
    scv = jnp.maximum(e_t2 / e_t**2 - 1.0, 0.0)
    # Iterations a decoder sees: prompt iterations at rate busy/E[T], decode ones otherwise.
    q = (busy / e_t) / r
    m1 = 1.0 / r
    m2 = q * e_t2 + (1.0 - q) * t_d**2
    var = jnp.maximum(m2 - m1**2, 0.0)
    decoding = 1.0 - jnp.exp(-batch)
    residual = (1.0 - busy) * decoding * 0.5 * t_d
    return PoolState(lam_p * e_t, batch, lam_d * mean_decode_iters / r, r, t_p, e_t, scv, t_d, m1, var, residual)


def pool_state(timing, n_machines, prompt_rate, prompt_w, p_tok, p_sq, decode_rate, mean_decode_iters,
               ctx_tokens, batch_cap) -> PoolState:
    """Steady state of a pool: solves Little's law for the decode batch B.

    Args:
        timing: phase-timing strategy of the pool's machine type.
        n_machines: machines in the pool (continuous).
        prompt_rate: prompts per second into the pool.
        prompt_w, p_tok, p_sq: (K,) prompt class probabilities, tokens, tokens^2.
        decode_rate: decoding requests per second into the pool.
        mean_decode_iters: E[o - 1], decode iterations per request.
        ctx_tokens: mean KV context of a decoding request (tokens).
        batch_cap: most decoding requests a machine's KV memory holds.
    """
    n = jnp.maximum(n_machines, 1e-6)
    lam_p = prompt_rate / n
    lam_d = decode_rate / n

    def residual(log_b):
        r = _rates(timing, lam_p, prompt_w, p_tok, p_sq, ctx_tokens, jnp.exp(log_b))[-1]
        need = lam_d * mean_decode_iters / r
        return log_b - jnp.log(jnp.maximum(smooth_min_pos(need, batch_cap, p=_MEMORY_P), 1e-12))

    # Newton in log B. The map B -> need(B) grows less than proportionally (decode time is
    # affine in B), so the residual's slope lies in (0, 1]; flooring it at 0.05 and
    # clipping steps to +-2 (a factor e^2) keeps the iteration safe from a poor start
    # (the initial guess assumes a 40 ms iteration; 12 steps reach machine precision
    # from any start within a factor e^8 of the answer).
    def newton(_, log_b):
        r_val, slope = jax.jvp(residual, (log_b,), (jnp.ones_like(log_b),))
        return log_b - jnp.clip(r_val / jnp.maximum(slope, 0.05), -2.0, 2.0)

    b0 = smooth_min_pos(lam_d * mean_decode_iters * 0.04 + 1e-9, batch_cap, p=_MEMORY_P)
    log_b = jax.lax.fori_loop(0, _NEWTON_ITERS, newton, jnp.log(b0))
    return pool_state_at(timing, n_machines, prompt_rate, prompt_w, p_tok, p_sq, decode_rate, mean_decode_iters,
                         ctx_tokens, jnp.exp(log_b))
