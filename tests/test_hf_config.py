"""Tests for splitwise_jax.specs.hf_config: LLMs from local Hugging Face config.json files.

Fixtures: tests/fixtures/hf_configs/*/config.json, hand-written from each model's
published hyper-parameters (README there). Tolerances:
    * parameter counts vs published: 2%. Published figures are rounded to 0.1B-1B (e.g.
      "37B" active for DeepSeek-V3, "405B"); the count from the architecture lands within
      1.5% of every one of them (DeepSeek-V3 active: 37.55B vs "37B").
    * fixtures vs catalogue: exact. The catalogue (catalog.py) and the fixtures are two
      independent transcriptions of the same hyper-parameters; they must agree.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from splitwise_jax.specs import catalog
from splitwise_jax.specs.hf_config import llm_from_hf_config, load_hf_config
from splitwise_jax.specs.llm import param_count

FIXTURES = Path(__file__).parent / "fixtures" / "hf_configs"

# folder: (published total, published active or None for dense, catalogue name or None)
PUBLISHED = {
    "llama-3.1-8b": (8.03e9, None, "llama3.1-8b"),
    "llama-3.1-70b": (70.6e9, None, "llama3.1-70b"),
    "llama-3.1-405b": (405e9, None, "llama3.1-405b"),
    "mistral-7b-v0.3": (7.3e9, None, None),
    "mixtral-8x7b": (46.7e9, 12.9e9, "mixtral-8x7b"),
    "qwen2.5-72b": (72.7e9, None, "qwen2.5-72b"),
    "qwen3-30b-a3b": (30.5e9, 3.3e9, None),
    "deepseek-v3": (671e9, 37e9, "deepseek-v3"),
}
PUBLISHED_REL_TOL = 0.02


def _raw(folder: str) -> dict:
    return json.loads((FIXTURES / folder / "config.json").read_text())


@pytest.mark.parametrize("folder", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_ones(folder):
    llm = load_hf_config(FIXTURES / folder)
    total, active, _ = PUBLISHED[folder]
    assert abs(float(llm.n_params) / total - 1) < PUBLISHED_REL_TOL
    if active is None:
        assert llm.moe is None and llm.n_active_params == llm.n_params
    else:
        assert abs(float(llm.n_active_params) / active - 1) < PUBLISHED_REL_TOL


@pytest.mark.parametrize("folder", sorted(f for f, v in PUBLISHED.items() if v[2]))
def test_fixtures_and_catalogue_agree(folder):
    llm = load_hf_config(FIXTURES / folder, name=PUBLISHED[folder][2])
    assert llm == catalog.get_llm(PUBLISHED[folder][2])


def test_architecture_fields_are_read():
    ds = load_hf_config(FIXTURES / "deepseek-v3")
    assert ds.name == "deepseek-v3"  # the folder's name
    assert (ds.n_layers, ds.d_model, ds.n_heads, ds.d_ff) == (61, 7168, 128, 18432)
    assert (ds.moe.n_experts, ds.moe.experts_per_token, ds.moe.d_ff_expert) == (256, 8, 2048)
    assert (ds.moe.n_moe_layers, ds.moe.d_ff_shared) == (61 - 3, 2048)  # first_k_dense_replace = 3
    assert (ds.mla.kv_lora_rank, ds.mla.qk_rope_head_dim, ds.mla.q_lora_rank) == (512, 64, 1536)
    # fp8 checkpoint (quantization_config), bf16 activations and KV cache
    assert (ds.weight_dtype, ds.kv_dtype) == ("fp8", "bf16")
    # MLA caches 512 + 64 values per layer: 61 x 576 x 2 bytes
    assert ds.kv_bytes_per_token() == 61 * 576 * 2
    mx = load_hf_config(FIXTURES / "mixtral-8x7b" / "config.json")
    assert (mx.moe.n_experts, mx.moe.experts_per_token, mx.moe.n_moe_layers, mx.moe.d_ff_shared) == (8, 2, 32, 0)
    assert (mx.n_kv_heads, mx.head_dim, mx.weight_dtype, mx.kv_dtype) == (8, 128, "bf16", "bf16")
    q3 = load_hf_config(FIXTURES / "qwen3-30b-a3b")
    assert q3.head_dim == 128 and q3.d_model // q3.n_heads == 64  # explicit head_dim wins
    assert q3.kv_bytes_per_token() == 2 * 48 * 4 * 128 * 2


def test_parameter_formula_by_hand_for_mixtral():
    """The docstring formula, term by term, for Mixtral-8x7B."""
    d, v, ff, L, E, k = 4096, 32000, 14336, 32, 8, 2
    attn = 2 * d * d + 2 * d * 8 * 128
    per_layer = attn + d * E + E * 3 * d * ff + 2 * d
    total = 2 * v * d + d + L * per_layer
    llm = load_hf_config(FIXTURES / "mixtral-8x7b")
    assert llm.n_params == total
    assert llm.n_active_params == total - L * (E - k) * 3 * d * ff


def test_precision_overrides_and_dtype_aliases():
    cfg = _raw("llama-3.1-70b")
    base = llm_from_hf_config(cfg, name="x")
    fp8 = llm_from_hf_config(cfg, name="x", weight_dtype="float8_e4m3fn", kv_dtype="fp8")
    assert (fp8.weight_dtype, fp8.kv_dtype) == ("fp8", "fp8")
    assert fp8.weight_bytes == base.weight_bytes / 2
    assert fp8.kv_bytes_per_token() == base.kv_bytes_per_token() / 2
    half = dict(cfg, torch_dtype="float16")
    assert llm_from_hf_config(half, name="x").weight_dtype == "fp16"
    newer = {k: v for k, v in cfg.items() if k != "torch_dtype"} | {"dtype": "bfloat16"}  # transformers >= 4.56
    assert llm_from_hf_config(newer, name="x").weight_dtype == "bf16"


def test_tied_embeddings_and_biases_count():
    cfg = _raw("qwen2.5-72b")
    untied = llm_from_hf_config(cfg, name="x").n_params
    tied = llm_from_hf_config(dict(cfg, tie_word_embeddings=True), name="x").n_params
    assert untied - tied == 152064 * 8192
    # Qwen2 has q/k/v biases: h_q hd + 2 h_kv hd per layer over a bias-free count
    no_bias = param_count(n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, d_ff=29568, vocab_size=152064)
    assert untied - no_bias == 80 * (64 * 128 + 2 * 8 * 128)


def _write(tmp_path, data) -> Path:
    p = tmp_path / "config.json"
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def _without(cfg: dict, key: str) -> dict:
    out = copy.deepcopy(cfg)
    out.pop(key)
    return out


@pytest.mark.parametrize("make,message", [
    (lambda: _without(_raw("llama-3.1-8b"), "num_hidden_layers"),
     r"missing key 'num_hidden_layers' \(model_type 'llama' needs it\)"),
    (lambda: dict(_raw("llama-3.1-8b"), hidden_size="4096"), r"'hidden_size' must be an integer >= 1, got '4096'"),
    (lambda: dict(_raw("llama-3.1-8b"), num_key_value_heads=0), r"'num_key_value_heads' must be an integer >= 1"),
    (lambda: dict(_raw("llama-3.1-8b"), num_key_value_heads=5), r"'num_attention_heads' \(32\) must be divisible"),
    (lambda: dict(_raw("llama-3.1-8b"), model_type="gpt2"), r"'model_type' must be one of \[.*'llama'.*\], got 'gpt2'"),
    (lambda: _without(_raw("mixtral-8x7b"), "num_local_experts"), r"missing key 'num_local_experts'"),
    (lambda: _without(_raw("deepseek-v3"), "kv_lora_rank"), r"missing key 'kv_lora_rank'"),
    (lambda: dict(_raw("llama-3.1-8b"), torch_dtype="int7"), r"'torch_dtype' must be one of"),
    (lambda: dict(_raw("llama-3.1-8b"), tie_word_embeddings="no"), r"'tie_word_embeddings' must be true or false"),
    (lambda: dict(_raw("llama-3.1-8b"), quantization_config={"quant_method": "awq", "bits": 4}),
     r"'quantization_config.quant_method' 'awq' is not supported"),
    (lambda: dict(_raw("qwen3-30b-a3b"), mlp_only_layers="all"), r"'mlp_only_layers' must be a list"),
    (lambda: [1, 2], r"must hold a JSON object"),
    (lambda: "{not json", r"cannot be read"),
])
def test_bad_config_files_name_the_file_and_key(tmp_path, make, message):
    p = _write(tmp_path, make())
    with pytest.raises(ValueError, match=message) as e:
        load_hf_config(p)
    assert str(p) in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"config.json .*nope.* does not exist"):
        load_hf_config(tmp_path / "nope")


def test_unsupported_quantization_can_be_overridden():
    cfg = dict(_raw("llama-3.1-8b"), quantization_config={"quant_method": "awq", "bits": 4})
    assert llm_from_hf_config(cfg, name="x", weight_dtype="fp16").weight_dtype == "fp16"
