"""Tests for splitwise_jax.phases.memory: weights, KV-cache bytes, capacity, max batch, MoE traffic, fit errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from splitwise_jax.specs.catalog import get_llm, get_machine
from splitwise_jax.phases.memory import (
    check_fits,
    experts_touched,
    fits,
    kv_bytes_per_token,
    kv_capacity_tokens,
    max_batch,
    streamed_weight_bytes_per_gpu,
    weights_bytes_per_gpu,
)

LLAMA, BLOOM = get_llm("llama2-70b"), get_llm("bloom-176b")
DGX_A100, DGX_H100 = get_machine("dgx-a100"), get_machine("dgx-h100")
GIB = 2.0**30


def test_kv_bytes_per_token_fp16():
    # 2 (K, V) x layers x KV heads x head dim x 2 bytes, exactly
    assert kv_bytes_per_token(LLAMA) == 327_680  # 2 x 80 x 8 x 128 x 2 (GQA)
    assert kv_bytes_per_token(BLOOM) == 4_014_080  # 2 x 70 x 112 x 128 x 2
    # SplitwiseSim sizes every head: GQA's 64/8 saving undone; BLOOM (MHA) unchanged
    assert kv_bytes_per_token(LLAMA, ignore_gqa=True) == 8 * 327_680
    assert kv_bytes_per_token(BLOOM, ignore_gqa=True) == 4_014_080


def test_weights_per_gpu():
    # "about 17 GB": 68.98e9 params x 2 bytes / 8 = 17.2 GB; +-0.5 GB is the rounding of "about 17"
    assert abs(weights_bytes_per_gpu(LLAMA, 8) - 17e9) < 0.5e9
    assert weights_bytes_per_gpu(BLOOM, 8) == pytest.approx(176.2e9 * 2 / 8, rel=1e-12)
    assert weights_bytes_per_gpu(LLAMA, 4) == 2 * weights_bytes_per_gpu(LLAMA, 8)


def test_fits():
    for m in (DGX_A100, DGX_H100):
        assert fits(BLOOM, m) and fits(LLAMA, m)
        assert not fits(BLOOM, m, tp=4)  # 88 GB per GPU > 80 GiB
        assert fits(LLAMA, m, tp=2)  # 69 GB per GPU < 80 GiB


def test_kv_capacity_is_free_memory_over_bytes_per_token():
    for m in (DGX_A100, DGX_H100):
        for llm in (BLOOM, LLAMA):
            free = 8 * 80 * GIB - float(llm.weight_bytes)
            # softplus(free, 1 GB) differs from free by 1 GB x exp(-free / 1 GB): e^-300
            np.testing.assert_allclose(kv_capacity_tokens(llm, m), free / float(kv_bytes_per_token(llm)), rtol=1e-12)
    # GQA: Llama2-70B keeps ~20x the tokens of BLOOM-176B on the same machine
    assert kv_capacity_tokens(LLAMA, DGX_A100) > 15 * kv_capacity_tokens(BLOOM, DGX_A100)


def test_capacity_of_a_model_that_does_not_fit_is_about_zero_with_finite_gradient():
    cap = kv_capacity_tokens(BLOOM, DGX_A100, tp=2)  # 352 GB of weights on 160 GiB
    # softplus of -180 GB at a 1 GB temperature: 1e9 x e^-180 bytes, far below one token
    assert 0.0 <= float(cap) < 1e-3
    g = jax.grad(lambda r: kv_capacity_tokens(BLOOM, DGX_A100, tp=2, reserve_frac=r))(0.1)
    assert np.isfinite(g) and g <= 0.0


def test_capacity_falls_with_reserve_and_rises_with_hbm():
    reserves = jnp.linspace(0.0, 0.4, 9)
    caps = jax.vmap(lambda r: kv_capacity_tokens(BLOOM, DGX_H100, reserve_frac=r))(reserves)
    assert caps.shape == (9,) and np.all(np.diff(np.asarray(caps)) < 0)

    def cap_of(hbm_scale, reserve):
        gpu = dataclasses.replace(DGX_H100.gpu, hbm_bytes=DGX_H100.gpu.hbm_bytes * hbm_scale)
        return kv_capacity_tokens(LLAMA, DGX_H100.replace(gpu=gpu), reserve_frac=reserve)

    # relative inputs keep finite differences meaningful; jax's float64 default tolerance
    check_grads(cap_of, (1.0, 0.1), order=1, modes=("rev", "fwd"))
    d_hbm, d_reserve = jax.grad(cap_of, argnums=(0, 1))(1.0, 0.1)
    assert d_hbm > 0 and d_reserve < 0


def test_max_batch():
    ctx = jnp.array([256.0, 1024.0, 1500.0, 4096.0])
    b = np.asarray(max_batch(BLOOM, DGX_A100, ctx))
    assert np.all(np.diff(b) < 0)
    # the batch at each context exactly fills the KV capacity
    np.testing.assert_allclose(b * ctx, kv_capacity_tokens(BLOOM, DGX_A100), rtol=1e-12)
    # Splitwise insight IV: BLOOM-176B decode ran out of memory around batch 64 on a
    # DGX; at a coding-median context of 1500 + 13 tokens the model allows 55 (within 2x)
    assert 32 < float(max_batch(BLOOM, DGX_A100, 1513.0)) < 128


def test_bad_inputs_raise_value_errors_naming_the_argument():
    for bad in (0.0, -5.0, float("nan")):
        with pytest.raises(ValueError, match="context_tokens"):
            max_batch(LLAMA, DGX_H100, bad)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"reserve_frac must lie in \[0, 1\]"):
            kv_capacity_tokens(LLAMA, DGX_H100, reserve_frac=bad)
    for bad in (0, 9, 2.5, True):
        with pytest.raises(ValueError, match=r"tp must be an integer in \[1, 8\]"):
            kv_capacity_tokens(LLAMA, DGX_H100, tp=bad)
        with pytest.raises(ValueError, match=r"tp must be an integer in \[1, 8\]"):
            fits(LLAMA, DGX_H100, tp=bad)
    with pytest.raises(ValueError, match=r"tp must be an integer >= 1"):
        weights_bytes_per_gpu(LLAMA, 0)


_PINS = json.loads((Path(__file__).parent / "fixtures" / "dense_pins.json").read_text())


def test_dense_paper_models_memory_is_bit_identical_to_before():
    """Weights per GPU, KV capacity, max batch and KV bytes per token of BLOOM-176B and
    Llama2-70B are exactly (float.hex) those pinned before issue 13 added precisions,
    MoE and MLA (tests/fixtures/make_dense_pins.py)."""
    for pin in _PINS["memory"]:
        machine, llm, tp = get_machine(pin["machine"]), get_llm(pin["llm"]), pin["tp"]
        assert float(weights_bytes_per_gpu(llm, tp)).hex() == pin["weights_bytes_per_gpu"]
        assert float(kv_capacity_tokens(llm, machine, tp)).hex() == pin["kv_capacity_tokens"]
        assert float(kv_capacity_tokens(llm, machine, tp, reserve_frac=0.1)).hex() == pin["kv_capacity_tokens_reserve"]
        assert float(max_batch(llm, machine, 2048.0, tp)).hex() == pin["max_batch_2048"]
        assert fits(llm, machine, tp) == pin["fits"]
    for name, kv in _PINS["kv"].items():
        llm = get_llm(name)
        assert float(kv_bytes_per_token(llm)).hex() == kv["gqa"]
        assert float(kv_bytes_per_token(llm, ignore_gqa=True)).hex() == kv["ignore_gqa"]
        assert float(llm.weight_bytes).hex() == kv["weight_bytes"]


# ---- precisions, MoE, MLA ------------------------------------------------------------------

NEW_MACHINES = ("dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200", "mi300x-x8")


@pytest.mark.parametrize("llm_name", ["llama3.1-70b", "mixtral-8x7b", "qwen2.5-72b", "deepseek-v3"])
def test_an_fp8_kv_cache_holds_twice_the_tokens_of_fp16(llm_name):
    llm = get_llm(llm_name)
    fp16, fp8 = llm.replace(kv_dtype="fp16"), llm.replace(kv_dtype="fp8")
    assert kv_bytes_per_token(fp8) == kv_bytes_per_token(fp16) / 2
    for m in NEW_MACHINES:
        machine = get_machine(m)
        if fits(llm, machine):
            # same weights, half the bytes per token: exactly twice (round-off only)
            np.testing.assert_allclose(kv_capacity_tokens(fp8, machine), 2 * kv_capacity_tokens(fp16, machine),
                                       rtol=1e-12)
            np.testing.assert_allclose(max_batch(fp8, machine, 4096.0), 2 * max_batch(fp16, machine, 4096.0),
                                       rtol=1e-12)


def test_fp8_weights_halve_the_weight_bytes():
    llm = get_llm("llama3.1-405b")
    fp8 = llm.replace(weight_dtype="fp8")
    assert fp8.weight_bytes == llm.weight_bytes / 2 and fp8.n_params == llm.n_params
    # 811 GB of bf16 weights do not fit on 8 x 80 GiB; 406 GB of fp8 do
    assert not fits(llm, DGX_H100) and fits(fp8, DGX_H100)


def test_mla_latent_is_stored_on_every_gpu():
    """DeepSeek-V3 under TP8: each GPU holds the whole 576-value latent of every token."""
    ds, m = get_llm("deepseek-v3"), get_machine("dgx-h200")
    assert ds.kv_replication(8) == 8.0
    free = 8 * 141 * GIB - float(ds.weight_bytes)
    np.testing.assert_allclose(kv_capacity_tokens(ds, m), free / (61 * 576 * 2 * 8), rtol=1e-12)
    # GQA with at least tp KV heads stores each head once; fewer KV heads than GPUs replicate
    assert get_llm("llama3.1-70b").kv_replication(8) == 1.0
    assert get_llm("llama3.1-70b").replace(n_kv_heads=4).kv_replication(8) == 2.0


def test_experts_touched_matches_uniform_top_k_routing():
    """E (1 - (1 - k/E)^B) is the exact expectation when each token picks k distinct
    experts uniformly: compared with a Monte-Carlo of 2,000 batches (tolerance 4
    standard errors of the simulated mean, plus E / 2,000: the simulated mean cannot
    resolve a shortfall smaller than that when every sample touches all E experts)."""
    rng = np.random.default_rng(0)
    for name in ("mixtral-8x7b", "deepseek-v3"):
        llm = get_llm(name)
        e, k = llm.moe.n_experts, llm.moe.experts_per_token
        for b in (1, 3, 16, 64):
            picks = np.argpartition(rng.random((2000, b, e), dtype=np.float32), k, axis=-1)[..., :k]  # k distinct
            hit = np.bincount((np.arange(len(picks))[:, None, None] * e + picks).ravel(), minlength=len(picks) * e)
            touched = (hit.reshape(len(picks), e) > 0).sum(axis=1)  # distinct experts per batch
            se = touched.std() / np.sqrt(len(touched))
            assert abs(float(experts_touched(llm, float(b))) - touched.mean()) <= 4 * se + e / 2000, (name, b)
        assert float(experts_touched(llm, 1.0)) == pytest.approx(k, rel=1e-12)
        assert float(experts_touched(llm, 1e5)) == pytest.approx(e, rel=1e-12)
    # smooth, increasing, finite gradient at zero tokens
    mx = get_llm("mixtral-8x7b")
    g = jax.vmap(jax.grad(lambda b: experts_touched(mx, b)))(jnp.array([0.0, 0.5, 1.0, 8.0, 64.0]))
    assert np.all(np.isfinite(g)) and np.all(g >= 0)
    check_grads(lambda b: experts_touched(mx, b), (3.0,), order=2)


def test_streamed_weights_lie_between_active_and_total():
    for name, tp in (("mixtral-8x7b", 2), ("deepseek-v3", 8)):
        llm = get_llm(name)
        b = jnp.array([1.0, 4.0, 32.0, 256.0, 4096.0])
        s = np.asarray(streamed_weight_bytes_per_gpu(llm, tp, b))
        lo = float(llm.n_active_params) * llm.bytes_per_param / tp
        hi = float(weights_bytes_per_gpu(llm, tp))
        # rises with the batch until every expert is touched (then equal to the total)
        assert np.all(np.diff(s) >= 0) and s[1] > s[0] and s[-1] == pytest.approx(hi, rel=1e-12)
        assert s[0] == pytest.approx(lo, rel=1e-12) and np.all(s <= hi * (1 + 1e-12))
    # dense models stream everything, whatever the batch
    assert streamed_weight_bytes_per_gpu(LLAMA, 8, 1.0) == weights_bytes_per_gpu(LLAMA, 8)


def test_models_that_do_not_fit_are_reported_clearly():
    ds16 = get_llm("deepseek-v3").replace(weight_dtype="bf16", name="deepseek-v3-bf16")
    assert not fits(ds16, DGX_A100)  # 1,342 GB of weights on 640 GiB
    with pytest.raises(ValueError, match=r"deepseek-v3-bf16 \(bf16 weights, 1,342 GB\) does not fit on dgx-a100 "
                                         r"at tp=8: 167\.8 GB of weights per GPU > 85\.9 GB of a100-80gb HBM"):
        check_fits(ds16, DGX_A100)
    check_fits(get_llm("deepseek-v3"), get_machine("dgx-h200"))  # fp8 on 8 x 141 GB: no error
    # which catalogue pairs fit (weights only): the 405B model in bf16 needs > 80 GB per GPU
    assert not fits(get_llm("llama3.1-405b"), DGX_H100)
    assert all(fits(get_llm("llama3.1-405b"), get_machine(m)) for m in ("dgx-h200", "dgx-b200", "mi300x-x8"))
