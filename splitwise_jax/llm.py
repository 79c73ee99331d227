"""LLM architecture specifications as frozen pytree dataclasses.

References:
    BLOOM: BigScience, arXiv 2211.05100 (70 layers, hidden 14336, 112 heads).
    Llama 2: Touvron et al., arXiv 2307.09288 (70B: 80 layers, hidden 8192, 64 heads,
    grouped-query attention with 8 KV heads, FFN 28672).
"""

from __future__ import annotations

import dataclasses
from dataclasses import field

import jax

from splitwise_jax._validate import check_positive

_STATIC = dict(static=True)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LLM:
    """A decoder-only transformer.

    Attributes:
        n_params: parameter count.
        bytes_per_param: bytes per weight (2 for fp16/bf16).
        n_layers, d_model, n_heads, n_kv_heads, d_ff: architecture (static ints).
        name: catalogue name (static).
    """

    n_params: float
    bytes_per_param: float
    n_layers: int = field(metadata=_STATIC)
    d_model: int = field(metadata=_STATIC)
    n_heads: int = field(metadata=_STATIC)
    n_kv_heads: int = field(metadata=_STATIC)
    d_ff: int = field(metadata=_STATIC)
    name: str = field(default="custom-llm", metadata=_STATIC)

    def __post_init__(self):
        # Plain numbers only: JAX rebuilds the class with tracers and cotangents.
        for f in ("n_params", "bytes_per_param"):
            if isinstance(getattr(self, f), (int, float)):
                check_positive(f"LLM({self.name}).{f}", getattr(self, f))
        for f in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"LLM({self.name}).{f} must be an integer >= 1, got {v!r}")
        if self.d_model % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"LLM({self.name}): d_model ({self.d_model}) must be divisible by n_heads "
                f"({self.n_heads}) and n_heads by n_kv_heads ({self.n_kv_heads})"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def weight_bytes(self):
        return self.n_params * self.bytes_per_param

    def kv_bytes_per_token(self, ignore_gqa: bool = False):
        """K and V for one token over all layers (bytes). ignore_gqa mimics SplitwiseSim."""
        kv_heads = self.n_heads if ignore_gqa else self.n_kv_heads
        return 2.0 * self.n_layers * kv_heads * self.head_dim * self.bytes_per_param
