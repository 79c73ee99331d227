"""LLM architecture specifications as frozen pytree dataclasses.

An `LLM` is a decoder-only transformer: its size (total parameters, the one traced
leaf), its shape (layers, heads, widths: static ints), the precision of its weights and
of its KV cache (each its own), and optionally a mixture-of-experts MLP (`MoE`) and
multi-latent attention (`MLA`). Dense multi-head or grouped-query models need neither.

Parameter count of a decoder-only transformer (`param_count`; the Hugging Face
`config.json` loader and the catalogue use it, and docs/specs.md derives it):

    N = V d (embedding) + [V d (output head, unless tied)] + d (final norm)
        + sum over layers [ attention + MLP + 2 d (norms) ]
    attention (MHA/GQA) = d h_q hd + 2 d h_kv hd + h_q hd d      (+ h_q hd + 2 h_kv hd biases, Qwen2)
    attention (MLA)     = q: d h_q (n + r)  or  d q_lora + q_lora + q_lora h_q (n + r)
                          kv: d (kv_lora + r) + kv_lora + kv_lora h_q (n + v);  out: h_q v d
    MLP (dense, gated)  = 3 d d_ff                               (gate, up, down)
    MLP (MoE layer)     = d E (router) + E 3 d d_ff_expert + 3 d d_ff_shared

with V vocabulary, d hidden size, h_q / h_kv query / KV heads of width hd, and MLA's
n = qk_nope_head_dim, r = qk_rope_head_dim, v = v_head_dim. Active parameters (what one
token multiplies through) replace the E routed experts of each MoE layer by the k it
picks: N_active = N - n_moe_layers (E - k) 3 d d_ff_expert.

KV cache per token (`LLM.kv_bytes_per_token`):

    MHA/GQA: 2 (K and V) x layers x KV heads x head dim x KV bytes per value
    MLA:     layers x (kv_lora_rank + qk_rope_head_dim) x KV bytes per value

MLA caches one compressed latent (plus the decoupled RoPE key) per token per layer, shared
by every head (DeepSeek-V2 §2.1.2): 576 values for DeepSeek-V3 against 2 x 128 x 128 =
32,768 for the same heads uncompressed.

References:
    BLOOM: BigScience, arXiv 2211.05100 (70 layers, hidden 14336, 112 heads).
    Llama 2: Touvron et al., arXiv 2307.09288 (70B: 80 layers, hidden 8192, 64 heads,
    grouped-query attention with 8 KV heads, FFN 28672).
    Llama 3: Grattafiori et al., arXiv 2407.21783, Table 3.
    Mixtral: Jiang et al., arXiv 2401.04088 (8 experts, top-2, 46.7B / 12.9B active).
    Qwen2.5: Qwen team, arXiv 2412.15115.
    DeepSeek-V2 (MLA): arXiv 2405.04434 §2.1; DeepSeek-V3: arXiv 2412.19437 §2, §4.2
    (671B total, 37B active, 61 layers, 256 routed + 1 shared expert, top-8).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field

import jax

from splitwise_jax._validate import check_positive

_STATIC = dict(static=True)

# Bytes per element of each storage precision. "fp8" is either 8-bit float format
# (e4m3 or e5m2); both store one byte.
DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}
# Names people and Hugging Face configs use for the same precisions.
DTYPE_ALIASES: dict[str, str] = {
    "float32": "fp32", "float": "fp32", "fp32": "fp32",
    "float16": "fp16", "half": "fp16", "fp16": "fp16",
    "bfloat16": "bf16", "bf16": "bf16",
    "fp8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e4m3": "fp8", "float8_e5m2": "fp8",
    "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "e4m3": "fp8", "e5m2": "fp8",
}


def canonical_dtype(name: str, what: str = "dtype") -> str:
    """The catalogue name ("fp32", "fp16", "bf16", "fp8") of a precision name.

    Raises:
        ValueError: an unknown name, listing the accepted ones.
    """
    key = name.lower() if isinstance(name, str) else name
    if key not in DTYPE_ALIASES:
        raise ValueError(f"{what} must be one of {sorted(DTYPE_ALIASES)}, got {name!r}")
    return DTYPE_ALIASES[key]


def dtype_from_bytes(bytes_per_value, what: str = "bytes_per_param") -> str:
    """The precision of a legacy `bytes_per_param` figure: 4 -> fp32, 2 -> fp16, 1 -> fp8."""
    by = {4.0: "fp32", 2.0: "fp16", 1.0: "fp8"}
    if isinstance(bytes_per_value, bool) or float(bytes_per_value) not in by:
        raise ValueError(f"{what} must be 4, 2 or 1 (fp32, fp16/bf16, fp8), got {bytes_per_value!r}")
    return by[float(bytes_per_value)]


def _check_int(owner: str, name: str, v, lo: int = 1) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ValueError(f"{owner}.{name} must be an integer >= {lo}, got {v!r}")


@dataclasses.dataclass(frozen=True)
class MoE:
    """Mixture-of-experts MLP (static: every field is an architecture count).

    Attributes:
        n_experts: routed experts per MoE layer, E.
        experts_per_token: routed experts each token picks, k (top-k).
        d_ff_expert: inner size of one routed expert's gated MLP (HF `moe_intermediate_size`;
            Mixtral's `intermediate_size`).
        n_moe_layers: layers whose MLP is MoE; the other n_layers - n_moe_layers have the
            dense MLP of size `LLM.d_ff` (DeepSeek-V3: 61 - first_k_dense_replace 3 = 58).
        d_ff_shared: summed inner size of the always-active shared experts of an MoE
            layer (DeepSeek: n_shared_experts x moe_intermediate_size; 0 for Mixtral).
    """

    n_experts: int
    experts_per_token: int
    d_ff_expert: int
    n_moe_layers: int
    d_ff_shared: int = 0

    def __post_init__(self):
        for f in ("n_experts", "experts_per_token", "d_ff_expert", "n_moe_layers"):
            _check_int("MoE", f, getattr(self, f))
        _check_int("MoE", "d_ff_shared", self.d_ff_shared, lo=0)
        if self.experts_per_token > self.n_experts:
            raise ValueError(f"MoE.experts_per_token ({self.experts_per_token}) must be <= n_experts "
                             f"({self.n_experts})")


@dataclasses.dataclass(frozen=True)
class MLA:
    """Multi-latent attention (DeepSeek-V2/V3); static architecture counts.

    Attributes:
        kv_lora_rank: width of the compressed KV latent cached per token per layer.
        qk_rope_head_dim: width of the decoupled RoPE key, cached alongside the latent.
        qk_nope_head_dim: per-head query/key width without RoPE.
        v_head_dim: per-head value width.
        q_lora_rank: width of the compressed query (0: queries are not compressed).
    """

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0

    def __post_init__(self):
        for f in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            _check_int("MLA", f, getattr(self, f))
        _check_int("MLA", "q_lora_rank", self.q_lora_rank, lo=0)

    @property
    def cached_width(self) -> int:
        """Values cached per token per layer: the latent plus the RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LLM:
    """A decoder-only transformer.

    Attributes:
        n_params: total parameter count (every expert of an MoE model); the one traced leaf.
        n_layers, d_model, n_heads, n_kv_heads, d_ff: architecture (static ints); d_ff is
            the dense MLP's inner size.
        name: catalogue name (static).
        weight_dtype: storage precision of the weights, "fp32" / "fp16" / "bf16" / "fp8"
            (static). fp8 weights also run on the GPU's fp8 tensor cores (W8A8), at
            `GPU.peak_fp8_flops_per_s`.
        kv_dtype: storage precision of the KV cache (static); independent of the weights.
        head_dim: attention head width; None means d_model / n_heads, resolved at
            construction (static).
        moe: the mixture-of-experts MLP, or None for a dense model (static).
        mla: multi-latent attention, or None for MHA/GQA (static).

    Example:
        >>> LLM(name="llama3-8b", n_params=8.03e9, n_layers=32, d_model=4096, n_heads=32,
        ...     n_kv_heads=8, d_ff=14336, weight_dtype="bf16", kv_dtype="fp8").kv_bytes_per_token()
        65536.0
    """

    n_params: float
    n_layers: int = field(metadata=_STATIC)
    d_model: int = field(metadata=_STATIC)
    n_heads: int = field(metadata=_STATIC)
    n_kv_heads: int = field(metadata=_STATIC)
    d_ff: int = field(metadata=_STATIC)
    name: str = field(default="custom-llm", metadata=_STATIC)
    weight_dtype: str = field(default="fp16", metadata=_STATIC)
    kv_dtype: str = field(default="fp16", metadata=_STATIC)
    head_dim: int | None = field(default=None, metadata=_STATIC)
    moe: MoE | None = field(default=None, metadata=_STATIC)
    mla: MLA | None = field(default=None, metadata=_STATIC)

    def __post_init__(self):
        # Plain numbers only: JAX rebuilds the class with tracers and cotangents.
        if isinstance(self.n_params, (int, float)):
            check_positive(f"LLM({self.name}).n_params", self.n_params)
        for f in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff"):
            _check_int(f"LLM({self.name})", f, getattr(self, f))
        for f in ("weight_dtype", "kv_dtype"):
            v = getattr(self, f)
            if v not in DTYPE_BYTES:
                raise ValueError(f"LLM({self.name}).{f} must be one of {sorted(DTYPE_BYTES)}, got {v!r} "
                                 "(splitwise_jax.specs.llm.canonical_dtype maps aliases such as 'bfloat16')")
        if self.head_dim is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"LLM({self.name}): d_model ({self.d_model}) must be divisible by n_heads "
                                 f"({self.n_heads}), or head_dim must be given")
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        _check_int(f"LLM({self.name})", "head_dim", self.head_dim)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"LLM({self.name}): n_heads ({self.n_heads}) must be divisible by n_kv_heads "
                             f"({self.n_kv_heads})")
        if self.moe is not None and not isinstance(self.moe, MoE):
            raise ValueError(f"LLM({self.name}).moe must be an MoE or None, got {type(self.moe).__name__}")
        if self.mla is not None and not isinstance(self.mla, MLA):
            raise ValueError(f"LLM({self.name}).mla must be an MLA or None, got {type(self.mla).__name__}")
        if self.moe is not None:
            if self.moe.n_moe_layers > self.n_layers:
                raise ValueError(f"LLM({self.name}).moe.n_moe_layers ({self.moe.n_moe_layers}) must be <= "
                                 f"n_layers ({self.n_layers})")
            if isinstance(self.n_params, (int, float)) and self.n_params <= self.routed_expert_params:
                raise ValueError(f"LLM({self.name}).n_params ({self.n_params:.4g}) must exceed its routed "
                                 f"experts' parameters ({self.routed_expert_params:.4g} = n_moe_layers x "
                                 "n_experts x 3 x d_model x d_ff_expert)")

    # ---- precision ---------------------------------------------------------------
    @property
    def bytes_per_param(self) -> float:
        """Bytes per weight element (2 for fp16/bf16, 1 for fp8)."""
        return DTYPE_BYTES[self.weight_dtype]

    @property
    def kv_bytes_per_value(self) -> float:
        """Bytes per cached K/V (or latent) element."""
        return DTYPE_BYTES[self.kv_dtype]

    @property
    def fp8_compute(self) -> bool:
        """Whether the GEMMs run on fp8 tensor cores (fp8 weights, W8A8)."""
        return self.weight_dtype == "fp8"

    # ---- parameters ----------------------------------------------------------------
    @property
    def weight_bytes(self):
        """All weights, every expert included (bytes)."""
        return self.n_params * self.bytes_per_param

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert in one layer: 3 d d_ff_expert (gated MLP); 0 if dense."""
        return 0 if self.moe is None else 3 * self.d_model * self.moe.d_ff_expert

    @property
    def routed_expert_params(self) -> int:
        """Parameters of all routed experts of all MoE layers; 0 for a dense model."""
        return 0 if self.moe is None else self.moe.n_moe_layers * self.moe.n_experts * self.expert_params

    @property
    def n_active_params(self):
        """Parameters one token multiplies through: all but the experts it does not pick."""
        if self.moe is None:
            return self.n_params
        m = self.moe
        return self.n_params - m.n_moe_layers * (m.n_experts - m.experts_per_token) * self.expert_params

    # ---- attention -------------------------------------------------------------------
    def kv_bytes_per_token(self, ignore_gqa: bool = False):
        """KV cache of one token over all layers, whole model (bytes).

        ignore_gqa mimics SplitwiseSim, which sizes the cache with every attention head
        (2 x layers x heads x head dim x bytes), also for MLA models.
        """
        if self.mla is not None and not ignore_gqa:
            return float(self.n_layers * self.mla.cached_width) * self.kv_bytes_per_value
        kv_heads = self.n_heads if ignore_gqa else self.n_kv_heads
        return 2.0 * self.n_layers * kv_heads * self.head_dim * self.kv_bytes_per_value

    def kv_replication(self, tp: int) -> float:
        """How many times tensor parallelism `tp` stores each token's KV cache.

        Heads are split across the tp GPUs; a GPU holds ceil(h_kv / tp) KV heads, so
        with fewer KV heads than GPUs the heads are replicated. MLA's latent is shared by
        every head and so held whole on every GPU (replication tp), the reason DeepSeek-V3
        deployments use data-parallel attention (arXiv 2412.19437 §3.4.1; not modelled).
        """
        if self.mla is not None:
            return float(tp)
        return math.ceil(self.n_kv_heads / tp) * tp / self.n_kv_heads

    @property
    def attn_prompt_flops_coef(self) -> int:
        """Prompt attention FLOPs per unit of sum(prompt length^2), all layers.

        Scores (q.k) and the weighted sum of values cost 2 (qk width + v width) FLOPs per
        (query, key) pair per layer, over the s^2/2 causal pairs of a prompt of s tokens:
        L (qk + v). MHA/GQA: qk = v = h_q hd (= d_model for the paper models, so 2 L d).
        MLA prefill attends per head over n + r (keys) and v (values).
        """
        if self.mla is not None:
            a = self.mla
            return self.n_layers * self.n_heads * (a.qk_nope_head_dim + a.qk_rope_head_dim + a.v_head_dim)
        return self.n_layers * 2 * self.n_heads * self.head_dim

    @property
    def attn_decode_flops_coef(self) -> int:
        """Decode attention FLOPs per context token of a decoding sequence, all layers.

        2 (qk + v) per layer: 4 L h_q hd for MHA/GQA. MLA decodes with the up-projections
        absorbed into the query and output (DeepSeek-V2 §2.1.2), attending per head over
        the cached latent: qk = kv_lora + r, v = kv_lora.
        """
        if self.mla is not None:
            a = self.mla
            return 2 * self.n_layers * self.n_heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim)
        return self.n_layers * 4 * self.n_heads * self.head_dim

    def replace(self, **changes) -> "LLM":
        """A copy with fields changed; a head width that was derived (d_model / n_heads)
        is derived afresh when d_model or n_heads change."""
        derived = self.head_dim * self.n_heads == self.d_model
        if "head_dim" not in changes and derived and ("d_model" in changes or "n_heads" in changes):
            changes["head_dim"] = None
        return dataclasses.replace(self, **changes)


def param_count(*, n_layers: int, d_model: int, n_heads: int, n_kv_heads: int, d_ff: int, vocab_size: int,
                head_dim: int | None = None, tied_embeddings: bool = False, qkv_bias: bool = False,
                qk_norm: bool = False, moe: MoE | None = None, mla: MLA | None = None,
                router_bias: bool = False, shared_expert_gate: bool = False) -> int:
    """Total parameters of a decoder-only transformer from its architecture (module docstring).

    Args:
        n_layers, d_model, n_heads, n_kv_heads, d_ff, vocab_size: as in `LLM` (counts).
        head_dim: attention head width (default d_model / n_heads).
        tied_embeddings: the output head shares the embedding matrix.
        qkv_bias: biases on the q, k, v projections (Qwen2).
        qk_norm: RMSNorm on each query and key head (Qwen3): 2 hd per layer.
        moe, mla: as in `LLM`.
        router_bias: a per-expert routing bias (DeepSeek-V3's e_score_correction_bias).
        shared_expert_gate: a d -> 1 gate on the shared expert (Qwen2-MoE).

    Returns:
        The parameter count (int).

    Example:
        >>> param_count(n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672,
        ...             vocab_size=128256)  # Llama-3.1-70B
        70553706496
    """
    d = d_model
    hd = head_dim if head_dim is not None else d // n_heads
    total = vocab_size * d * (1 if tied_embeddings else 2) + d
    if mla is not None:
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if mla.q_lora_rank:
            q = d * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * n_heads * qk
        else:
            q = d * n_heads * qk
        kv = (d * (mla.kv_lora_rank + mla.qk_rope_head_dim) + mla.kv_lora_rank
              + mla.kv_lora_rank * n_heads * (mla.qk_nope_head_dim + mla.v_head_dim))
        attn = q + kv + n_heads * mla.v_head_dim * d
    else:
        attn = 2 * d * n_heads * hd + 2 * d * n_kv_heads * hd
        if qkv_bias:
            attn += n_heads * hd + 2 * n_kv_heads * hd
        if qk_norm:
            attn += 2 * hd
    dense_mlp = 3 * d * d_ff
    n_moe = 0 if moe is None else moe.n_moe_layers
    total += n_layers * (attn + 2 * d) + (n_layers - n_moe) * dense_mlp
    if moe is not None:
        moe_mlp = (d * moe.n_experts + moe.n_experts * 3 * d * moe.d_ff_expert + 3 * d * moe.d_ff_shared
                   + (moe.n_experts if router_bias else 0) + (d if shared_expert_gate and moe.d_ff_shared else 0))
        total += n_moe * moe_mlp
    return int(total)
