"""Memory model: weights per GPU, KV-cache bytes per token, tokens and batch that fit.

References:
    Splitwise §II-B and insight V (token batching is memory-capacity bound);
    KV cache = 2 (K and V) x layers x KV heads x head dim x bytes per value.
"""

from __future__ import annotations

import jax.numpy as jnp

from splitwise_jax._smooth import softplus
from splitwise_jax._validate import check_positive, check_range
from splitwise_jax.hardware import Machine
from splitwise_jax.llm import LLM


def resolve_tp(machine: Machine | None, tp: int | None) -> int:
    """The tensor-parallel degree: `tp`, or all GPUs of `machine` when None.

    Raises:
        ValueError: `tp` is not an integer in [1, machine.gpus_per_machine].
    """
    if tp is None:
        if machine is None:
            raise ValueError("tp must be given (an integer >= 1) when no machine is")
        return machine.gpus_per_machine
    hi = machine.gpus_per_machine if machine is not None else None
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or (hi is not None and tp > hi):
        accepted = f"an integer in [1, {hi}] (GPUs of {machine.name})" if hi is not None else "an integer >= 1"
        raise ValueError(f"tp must be {accepted}, got {tp!r}")
    return tp


def weights_bytes_per_gpu(llm: LLM, tp: int):
    """Model weights held by each GPU under tensor parallelism `tp` (bytes)."""
    tp = resolve_tp(None, tp)
    return llm.weight_bytes / tp


def kv_bytes_per_token(llm: LLM, ignore_gqa: bool = False):
    """KV-cache bytes for one token, all layers, whole model (bytes).

    `ignore_gqa=True` reproduces SplitwiseSim, which sizes the cache with every
    attention head (2 x tokens x hidden x layers x 2 bytes).
    """
    return llm.kv_bytes_per_token(ignore_gqa)


def kv_capacity_tokens(llm: LLM, machine: Machine, tp: int | None = None, reserve_frac=0.0,
                       ignore_gqa: bool = False, temperature_bytes=1e9):
    """Tokens of KV cache that fit on one model instance.

    Free memory = tp x (HBM x (1 - reserve_frac)) - weights, floored smoothly at zero
    (softplus with a 1 GB temperature: a model that does not fit reports ~0 tokens and
    a finite gradient, rather than a negative capacity).

    Args:
        reserve_frac: fraction of HBM kept for activations and the framework.
    """
    tp = resolve_tp(machine, tp)
    check_range("reserve_frac", reserve_frac, 0.0, 1.0, unit="(fraction of HBM)")
    check_positive("temperature_bytes", temperature_bytes, unit="bytes")
    free = tp * machine.gpu.hbm_bytes * (1.0 - reserve_frac) - llm.weight_bytes
    return softplus(free, temperature_bytes) / kv_bytes_per_token(llm, ignore_gqa)


def max_batch(llm: LLM, machine: Machine, context_tokens, tp: int | None = None, reserve_frac=0.0,
              ignore_gqa: bool = False):
    """Largest decode batch whose KV cache fits, at a mean context length (tokens)."""
    check_positive("context_tokens", context_tokens, unit="tokens")
    cap = kv_capacity_tokens(llm, machine, tp, reserve_frac, ignore_gqa)
    return cap / jnp.maximum(context_tokens, 1.0)


def fits(llm: LLM, machine: Machine, tp: int | None = None) -> bool:
    """Whether the weights fit in the instance's HBM at all (concrete check)."""
    tp = resolve_tp(machine, tp)
    return float(weights_bytes_per_gpu(llm, tp)) < float(machine.gpu.hbm_bytes)
