"""Batch composition: what one model iteration processes.

A prompt (prefill) iteration processes all tokens of its prompts; a decode iteration
one new token per sequence, reading each sequence's KV cache; a mixed iteration both.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Batch:
    """Composition of one iteration (all fields float, may be traced).

    Attributes:
        prompt_tokens: total prompt tokens in the iteration.
        prompt_seqs: number of prompts.
        prompt_sq_tokens: sum over prompts of (prompt length)^2 (attention work).
        decode_seqs: number of decoding sequences (one new token each).
        decode_ctx_tokens: sum over decoding sequences of their context length.
    """

    prompt_tokens: jax.Array | float = 0.0
    prompt_seqs: jax.Array | float = 0.0
    prompt_sq_tokens: jax.Array | float = 0.0
    decode_seqs: jax.Array | float = 0.0
    decode_ctx_tokens: jax.Array | float = 0.0

    @classmethod
    def prompts(cls, prompt_size, batch_size=1.0) -> "Batch":
        """`batch_size` prompts of `prompt_size` tokens each."""
        p = jnp.asarray(prompt_size, dtype=float)
        b = jnp.asarray(batch_size, dtype=float)
        return cls(prompt_tokens=p * b, prompt_seqs=b, prompt_sq_tokens=b * p * p)

    @classmethod
    def decode(cls, batch_size, context_tokens) -> "Batch":
        """`batch_size` sequences each with `context_tokens` tokens of KV cache."""
        b = jnp.asarray(batch_size, dtype=float)
        c = jnp.asarray(context_tokens, dtype=float)
        return cls(decode_seqs=b, decode_ctx_tokens=b * c)

    def __add__(self, other: "Batch") -> "Batch":
        return jax.tree_util.tree_map(jnp.add, self, other)

    @property
    def new_tokens(self):
        return jnp.asarray(self.prompt_tokens) + jnp.asarray(self.decode_seqs)

    @property
    def seqs(self):
        return jnp.asarray(self.prompt_seqs) + jnp.asarray(self.decode_seqs)
