"""The prompts that share an iteration when a machine's prompt queue is long.

SplitwiseSim starts each iteration with the queued prompts, first come first served,
while the next one fits under `max_batch_tokens` (a prompt counts its tokens; the first
always runs): a long queue is cut into consecutive segments, one per iteration. What a
prompt brings to the pool's load is its share of its segment's iteration, so what
matters is the tokens of the other prompts in its segment, counted from each prompt's
side. Counting only the prompts behind it (the head's view, `pool._packing`) misses
those ahead of it in the same segment: in pairs alone that is a factor 2 / (1 + phi),
phi the chance the next prompt fits, and on the Llama2-70B conversation prompt sizes a
long queue gives 631 tokens per prompt where the head's view gives 470 (a Monte Carlo
of the rule on the simulated sizes; docs/cluster.md §2, *Queued prompts share an
iteration*).

The segment's fill is a Markov chain: from fill s the next prompt (class j, probability
w_j) joins if s + p_j fits, else it starts a new segment at p_j. On a grid of
`GRID + 1` fill levels (linear interpolation onto it; "fits" a sigmoid of width
`TEMPERATURE` tokens):

    V(s)  = sum_j w_j [J(s, j) V(s + p_j) + (1 - J(s, j)) s]   the segment's final tokens
    pi    = the fill a prompt finds (the chain's stationary law)
    E_k   = sum_s pi(s) [J(s, k) (V(s + p_k) - p_k) + (1 - J(s, k)) (V(p_k) - p_k)]

V is upper triangular in the fill (a segment only fills up) and is solved by back
substitution; pi by squaring the lazy chain (P + I) / 2 (same law, aperiodic): no
`jnp.linalg.solve` (a first version with two of them hung twice in three validation
runs, idle in a futex wait inside a compiled call; not diagnosed further). Against the Monte Carlo: 637 vs 631 tokens
(Llama2-70B conversation sizes), 316 vs 303 (coding), at 32 levels; 64 levels change
them by < 0.1 %.

It depends only on the workload's prompt classes and the token budget: computed once
per evaluation, outside the pool's Newton solve.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Fill levels of the chain (tokens: max_batch_tokens / GRID apart).
GRID = 32
# Squarings of the lazy chain: its 2^8-th power (the fill mixes within a few segments).
_SQUARINGS = 8
# Width (tokens) of the sigmoid for "the next prompt fits" (as `pool._BATCH_TOKEN_TEMPERATURE`).
TEMPERATURE = 64.0


def queue_segments(prompt_w, p_tok, max_batch_tokens):
    """(K,) mean tokens of the other prompts in a class-k prompt's iteration when the
    queue is long (first come first served, while they fit in `max_batch_tokens`).

    Args:
        prompt_w: (K,) prompt class probabilities.
        p_tok: (K,) prompt tokens per class.
        max_batch_tokens: tokens one iteration may carry (scalar).
    """
    n = GRID
    mbt = jnp.maximum(jnp.asarray(max_batch_tokens, jnp.result_type(float)), 1.0)
    grid = jnp.linspace(0.0, 1.0, n + 1) * mbt
    levels = jnp.arange(n + 1)

    def hat(x):  # interpolation weights of x on the grid, clipped to it
        u = jnp.clip(x / mbt * n, 0.0, float(n))
        return jnp.maximum(1.0 - jnp.abs(u[..., None] - levels), 0.0)

    joins = jax.nn.sigmoid((mbt - grid[:, None] - p_tok[None, :]) / TEMPERATURE)   # (S, K)
    up = hat(grid[:, None] + p_tok[None, :])                                       # (S, K, S)
    own = jnp.minimum(p_tok, mbt)
    new = hat(own)                                                                 # (K, S)
    stay = jnp.einsum("k,sk,skt->st", prompt_w, joins, up)                         # upper triangular
    closes = grid * jnp.dot(1.0 - joins, prompt_w)

    def back(value, s):  # V(s) from the levels above it (and its own weight, p < one level)
        v = (closes[s] + stay[s] @ value) / (1.0 - stay[s, s])
        return value.at[s].set(v), None

    value, _ = jax.lax.scan(back, jnp.zeros(n + 1, grid.dtype), jnp.arange(n, -1, -1))
    move = stay + jnp.einsum("k,sk,kt->st", prompt_w, 1.0 - joins, new)
    lazy = 0.5 * (move + jnp.eye(n + 1, dtype=grid.dtype))
    for _ in range(_SQUARINGS):
        lazy = lazy @ lazy
    found = lazy[0] / jnp.sum(lazy[0])                                             # stationary law
    joined = jnp.einsum("skt,t->sk", up, value) - p_tok[None, :]
    alone = new @ value - own
    return found @ (joins * joined + (1.0 - joins) * alone[None, :])
