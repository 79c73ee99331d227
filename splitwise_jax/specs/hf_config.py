"""An `LLM` from a local Hugging Face ``config.json`` (read from disk, never downloaded).

Families read (by ``model_type``): ``llama``, ``mistral``, ``mixtral``, ``qwen2``,
``qwen2_moe``, ``qwen3``, ``qwen3_moe``, ``deepseek_v2`` and ``deepseek_v3``. From each:
layers, heads, KV heads, hidden and MLP sizes, vocabulary, experts (routed, active per
token, shared, their MLP sizes, which layers are MoE), multi-latent attention's ranks
and head widths, and the precision (``torch_dtype``, or ``dtype`` in newer files; fp8
when ``quantization_config`` says so). The parameter count is computed from the
architecture (`llm.param_count`; formula in the `splitwise_jax.specs.llm` docstring): a
config file does not state it. DeepSeek-V3's multi-token-prediction module
(``num_nextn_predict_layers``, ~14B parameters) is not counted: it is not used to serve
tokens in the standard deployment (its 671B total excludes it).

Precision: weights take the checkpoint's precision (``torch_dtype``; fp8 under an fp8
``quantization_config``); the KV cache takes the activation precision ``torch_dtype``
(what vLLM's ``kv_cache_dtype="auto"`` does). Both can be overridden.

Every problem raises ValueError naming the file and the key, e.g.
``config.json x/config.json: 'num_hidden_layers' must be an integer >= 1, got '80'``.

References:
    Hugging Face transformers configuration classes: LlamaConfig, MistralConfig,
    MixtralConfig, Qwen2Config, Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig,
    DeepseekV2Config, DeepseekV3Config (key names and defaults).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from splitwise_jax.specs.llm import LLM, MLA, MoE, canonical_dtype, param_count

FAMILIES = ("deepseek_v2", "deepseek_v3", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3",
            "qwen3_moe")
# fp8 checkpoints: quantization_config.quant_method values whose weights are 8-bit floats
_FP8_QUANT_METHODS = ("fp8", "fbgemm_fp8")


class _Config:
    """Typed access to a config dict; every error names the file and the key."""

    def __init__(self, data: dict, source: str):
        self.data, self.source = data, source

    def error(self, msg: str) -> ValueError:
        return ValueError(f"config.json {self.source}: {msg}")

    def int(self, key: str, default: Any = ..., lo: int = 1) -> int:
        if key not in self.data or (self.data[key] is None and default is not ...):
            if default is ...:
                raise self.error(f"missing key {key!r} (model_type {self.data.get('model_type')!r} needs it)")
            return default
        v = self.data[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise self.error(f"{key!r} must be an integer >= {lo}, got {v!r}")
        return v

    def bool(self, key: str, default: bool) -> bool:
        v = self.data.get(key, default)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise self.error(f"{key!r} must be true or false, got {v!r}")
        return v

    def int_list(self, key: str) -> list[int]:
        v = self.data.get(key) or []
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise self.error(f"{key!r} must be a list of layer indices, got {v!r}")
        return v


def _precision(c: _Config, weight_dtype: str | None, kv_dtype: str | None) -> tuple[str, str]:
    key = "torch_dtype" if "torch_dtype" in c.data else "dtype"
    raw = c.data.get(key)
    if raw is None:
        act = "bf16"  # absent: the families' release precision
    else:
        try:
            act = canonical_dtype(raw, what=f"config.json {c.source}: {key!r}")
        except ValueError as e:
            raise ValueError(str(e)) from None
        if act == "fp8":
            raise c.error(f"{key!r} is the activation precision and cannot be fp8, got {raw!r}")
    weights = act
    q = c.data.get("quantization_config")
    if q is not None and weight_dtype is None:
        if not isinstance(q, dict):
            raise c.error(f"'quantization_config' must be an object, got {q!r}")
        method = q.get("quant_method")
        if method in _FP8_QUANT_METHODS or (method == "compressed-tensors" and _compressed_fp8(q)):
            weights = "fp8"
        else:
            raise c.error(f"'quantization_config.quant_method' {method!r} is not supported (fp8 checkpoints: "
                          f"{list(_FP8_QUANT_METHODS)} or compressed-tensors fp8); give weight_dtype to override")
    weights = canonical_dtype(weight_dtype, "weight_dtype") if weight_dtype is not None else weights
    kv = canonical_dtype(kv_dtype, "kv_dtype") if kv_dtype is not None else act
    return weights, kv


def _compressed_fp8(q: dict) -> bool:
    groups = q.get("config_groups") or {}
    weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, dict)]
    return bool(weights) and all(w.get("num_bits") == 8 and w.get("type") == "float" for w in weights)


def _moe(c: _Config, family: str, n_layers: int) -> tuple[MoE | None, dict]:
    """The MoE spec and the extra param_count flags of a family."""
    if family == "mixtral":
        return MoE(n_experts=c.int("num_local_experts"), experts_per_token=c.int("num_experts_per_tok"),
                   d_ff_expert=c.int("intermediate_size"), n_moe_layers=n_layers), {}
    if family in ("qwen2_moe", "qwen3_moe"):
        n_exp = c.int("num_experts")
        step = c.int("decoder_sparse_step", 1)
        dense = set(c.int_list("mlp_only_layers"))
        n_moe = sum(1 for i in range(n_layers) if i not in dense and (i + 1) % step == 0)
        shared = c.int("shared_expert_intermediate_size", 0, lo=0) if family == "qwen2_moe" else 0
        if n_moe == 0:
            return None, {}
        return (MoE(n_experts=n_exp, experts_per_token=c.int("num_experts_per_tok"),
                    d_ff_expert=c.int("moe_intermediate_size"), n_moe_layers=n_moe, d_ff_shared=shared),
                {"shared_expert_gate": shared > 0})
    if family in ("deepseek_v2", "deepseek_v3"):
        n_exp = c.int("n_routed_experts", None, lo=0)
        if not n_exp:
            return None, {}
        first = c.int("first_k_dense_replace", 0, lo=0)
        freq = c.int("moe_layer_freq", 1)
        n_moe = sum(1 for i in range(n_layers) if i >= first and i % freq == 0)
        d_ff_e = c.int("moe_intermediate_size")
        shared = c.int("n_shared_experts", 0, lo=0) * d_ff_e
        # DeepSeek-V3 routes with a learned per-expert bias (topk_method "noaux_tc")
        bias = family == "deepseek_v3" and c.data.get("topk_method", "noaux_tc") == "noaux_tc"
        return (MoE(n_experts=n_exp, experts_per_token=c.int("num_experts_per_tok"), d_ff_expert=d_ff_e,
                    n_moe_layers=n_moe, d_ff_shared=shared), {"router_bias": bias})
    return None, {}


def llm_from_hf_config(config: dict, *, name: str, source: str = "<dict>", weight_dtype: str | None = None,
                       kv_dtype: str | None = None) -> LLM:
    """An `LLM` from a parsed Hugging Face config (see the module docstring).

    Args:
        config: the parsed ``config.json``.
        name: catalogue name of the model.
        source: where the config came from, for error messages.
        weight_dtype, kv_dtype: override the precisions read from the config
            ("fp16", "bf16", "fp8", "fp32" or aliases such as "bfloat16").

    Returns:
        The LLM, its `n_params` counted from the architecture.

    Raises:
        ValueError: unknown ``model_type``, a missing or invalid key, an unsupported
            quantization; the message names the source and the key.
    """
    c = _Config(config, source)
    if not isinstance(config, dict):
        raise ValueError(f"config.json {source}: must hold a JSON object, got {type(config).__name__}")
    family = config.get("model_type")
    if family not in FAMILIES:
        raise c.error(f"'model_type' must be one of {list(FAMILIES)}, got {family!r}")
    n_layers = c.int("num_hidden_layers")
    d_model = c.int("hidden_size")
    n_heads = c.int("num_attention_heads")
    n_kv = c.int("num_key_value_heads", n_heads)
    d_ff = c.int("intermediate_size")
    vocab = c.int("vocab_size")
    head_dim = c.int("head_dim", None)
    if head_dim is None and d_model % n_heads:
        raise c.error(f"'hidden_size' ({d_model}) is not divisible by 'num_attention_heads' ({n_heads}) "
                      "and no 'head_dim' is given")
    if n_heads % n_kv:
        raise c.error(f"'num_attention_heads' ({n_heads}) must be divisible by 'num_key_value_heads' ({n_kv})")
    mla = None
    if family in ("deepseek_v2", "deepseek_v3"):
        mla = MLA(kv_lora_rank=c.int("kv_lora_rank"), qk_rope_head_dim=c.int("qk_rope_head_dim"),
                  qk_nope_head_dim=c.int("qk_nope_head_dim"), v_head_dim=c.int("v_head_dim"),
                  q_lora_rank=c.int("q_lora_rank", 0, lo=0))
    moe, extra = _moe(c, family, n_layers)
    weights, kv = _precision(c, weight_dtype, kv_dtype)
    arch = dict(n_layers=n_layers, d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, d_ff=d_ff,
                head_dim=head_dim, moe=moe, mla=mla)
    qkv_bias = family in ("qwen2", "qwen2_moe") or c.bool("attention_bias", False)
    n = param_count(vocab_size=vocab, tied_embeddings=c.bool("tie_word_embeddings", False), qkv_bias=qkv_bias,
                    qk_norm=family in ("qwen3", "qwen3_moe"), **extra, **arch)
    try:
        return LLM(name=name, n_params=float(n), weight_dtype=weights, kv_dtype=kv, **arch)
    except ValueError as e:
        raise c.error(str(e)) from None


def load_hf_config(path: str | Path, *, name: str | None = None, weight_dtype: str | None = None,
                   kv_dtype: str | None = None) -> LLM:
    """Read a local Hugging Face ``config.json`` (or a folder holding one) into an `LLM`.

    Args:
        path: the file, or the model folder that holds ``config.json``.
        name: catalogue name (default: the folder's name).
        weight_dtype, kv_dtype: precision overrides (see `llm_from_hf_config`).

    Example:
        >>> llm = load_hf_config("tests/fixtures/hf_configs/mixtral-8x7b/config.json", name="mixtral")
        >>> round(float(llm.n_params) / 1e9, 1), round(float(llm.n_active_params) / 1e9, 1)
        (46.7, 12.9)

    Raises:
        ValueError: a missing or unreadable file, malformed JSON, or any problem
            `llm_from_hf_config` reports; the message names the file.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"config.json {p} does not exist")
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"config.json {p} cannot be read: {e}") from None
    return llm_from_hf_config(data, name=name or p.parent.name, source=str(p), weight_dtype=weight_dtype,
                              kv_dtype=kv_dtype)
