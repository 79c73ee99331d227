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

_NEWTON_ITERS = 8
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


def _prompt_times(timing, p_tok, p_sq, batch, ctx):
    """Per-class prompt iteration time with B decodes riding along (Poisson count)."""
    none = jnp.exp(-batch)
    ride = batch / jnp.maximum(1.0 - none, 1e-9)  # mean batch given at least one decoder
    alone = timing.prompt_s(p_tok, p_sq)
    mixed = timing.mixed_s(p_tok, p_sq, ride, ctx)
    return none * alone + (1.0 - none) * mixed


def pool_state(timing, n_machines, prompt_rate, prompt_w, p_tok, p_sq, decode_rate, mean_decode_iters,
               ctx_tokens, batch_cap) -> PoolState:
    """Steady state of a pool.

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

    def rates(batch):
        t_p = _prompt_times(timing, p_tok, p_sq, batch, ctx_tokens)
        e_t = jnp.dot(prompt_w, t_p)
        rho = lam_p * e_t
        busy = smooth_min_one(rho, _RHO_TEMPERATURE)
        t_d = timing.decode_s(jnp.maximum(batch, 1.0), ctx_tokens)
        r = busy / e_t + (1.0 - busy) / t_d
        return t_p, e_t, rho, busy, t_d, r

    def need(batch):
        return lam_d * mean_decode_iters / rates(batch)[-1]

    def residual(log_b):
        b = jnp.exp(log_b)
        return log_b - jnp.log(jnp.maximum(smooth_min_pos(need(b), batch_cap, p=8.0), 1e-12))

    # Newton in log B. The map B -> need(B) grows less than proportionally (decode time is
    # affine in B), so the residual's slope lies in (0, 1]; flooring it at 0.05 and
    # clipping steps to +-2 (a factor e^2) keeps the iteration safe from a poor start.
    b0 = smooth_min_pos(lam_d * mean_decode_iters * timing.decode_s(1.0, ctx_tokens), batch_cap, p=8.0)
    log_b = jnp.log(jnp.maximum(b0, 1e-12))
    for _ in range(_NEWTON_ITERS):  # unrolled: XLA fuses the short, fixed loop
        r_val, slope = jax.jvp(residual, (log_b,), (jnp.ones_like(log_b),))
        log_b = log_b - jnp.clip(r_val / jnp.maximum(slope, 0.05), -2.0, 2.0)
    batch = jnp.exp(log_b)
    batch_need = need(batch)
    t_p, e_t, rho, busy, t_d, r = rates(batch)
    e_t2 = jnp.dot(prompt_w, t_p**2)
    scv = jnp.maximum(e_t2 / e_t**2 - 1.0, 0.0)
    # Iterations a decoder sees: prompt iterations at rate busy/E[T], decode ones otherwise.
    q = (busy / e_t) / r
    m1 = 1.0 / r
    m2 = q * e_t2 + (1.0 - q) * t_d**2
    var = jnp.maximum(m2 - m1**2, 0.0)
    decoding = 1.0 - jnp.exp(-batch)
    residual = (1.0 - busy) * decoding * 0.5 * t_d
    return PoolState(rho, batch, batch_need, r, t_p, e_t, scv, t_d, m1, var, residual)
