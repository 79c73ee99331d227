"""Memory model: weights per GPU, weights an iteration streams, KV-cache bytes, what fits.

Weights are stored once per instance, split over `tp` GPUs; an MoE model stores every
expert. An iteration streams the weights it uses: all of a dense model's, and of an MoE
model's routed experts only those its tokens pick. B tokens each picking k of E experts
uniformly at random touch, in expectation,

    E_touched(B) = E (1 - (1 - k/E)^B)

distinct experts per MoE layer (each expert is missed by one token with probability
1 - k/E, independently). It is smooth in B, equals k x B for B -> 0 to first order in
B k / E, and tends to E for large batches (docs/model.md, MoE). Real routers are not
uniform; skewed routing touches fewer experts, so this is an upper bound on the traffic
of a batch of that size.

The KV cache is split over the GPUs by KV head; a model with fewer KV heads than GPUs,
and MLA (one latent shared by every head), stores replicas (`LLM.kv_replication`).

References:
    Splitwise §II-B and insight V (token batching is memory-capacity bound);
    KV cache = 2 (K and V) x layers x KV heads x head dim x bytes per value.
"""

from __future__ import annotations

import jax.numpy as jnp

from splitwise_jax._smooth import softplus
from splitwise_jax._validate import check_positive, check_range
from splitwise_jax.specs.hardware import Machine
from splitwise_jax.specs.llm import LLM

GB = 1e9


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
    """Model weights held by each GPU under tensor parallelism `tp` (bytes), all experts."""
    tp = resolve_tp(None, tp)
    return llm.weight_bytes / tp


def experts_touched(llm: LLM, tokens):
    """Expected distinct routed experts per MoE layer that `tokens` tokens pick (module docstring).

    Args:
        llm: an MoE model.
        tokens: tokens in the iteration (any shape; >= 0).

    Returns:
        E (1 - (1 - k/E)^tokens), same shape as `tokens`; smooth in `tokens`.
    """
    if llm.moe is None:
        raise ValueError(f"experts_touched needs an MoE model; {llm.name} is dense")
    e, k = float(llm.moe.n_experts), float(llm.moe.experts_per_token)
    b = jnp.maximum(jnp.asarray(tokens, dtype=float), 0.0)
    if k >= e:  # every token picks every expert (a dense MLP); log1p(-1) would be -inf
        return e * jnp.ones_like(b)
    return -e * jnp.expm1(b * jnp.log1p(-k / e))


def streamed_weight_bytes_per_gpu(llm: LLM, tp: int, new_tokens):
    """Weights one iteration of `new_tokens` tokens reads from HBM per GPU (bytes).

    Dense models: all weights (`weights_bytes_per_gpu`). MoE models: everything but the
    routed experts, plus the experts the batch touches (`experts_touched`) in every MoE layer.
    """
    if llm.moe is None:
        return weights_bytes_per_gpu(llm, tp)
    tp = resolve_tp(None, tp)
    resident = llm.n_params - llm.routed_expert_params
    touched = float(llm.moe.n_moe_layers * llm.expert_params) * experts_touched(llm, new_tokens)
    return (resident + touched) * llm.bytes_per_param / tp


def kv_bytes_per_token(llm: LLM, ignore_gqa: bool = False):
    """KV-cache bytes for one token, all layers, whole model (bytes).

    `ignore_gqa=True` reproduces SplitwiseSim, which sizes the cache with every
    attention head (2 x tokens x hidden x layers x 2 bytes).
    """
    return llm.kv_bytes_per_token(ignore_gqa)


def kv_bytes_per_token_stored(llm: LLM, tp: int, ignore_gqa: bool = False):
    """KV-cache bytes one token occupies over the whole instance, replicas included (bytes).

    kv_bytes_per_token x `LLM.kv_replication(tp)`; the same for the paper's models (and
    every GQA model with at least tp KV heads), tp times more for MLA.
    """
    kv = kv_bytes_per_token(llm, ignore_gqa)
    r = 1.0 if ignore_gqa else llm.kv_replication(resolve_tp(None, tp))
    return kv if r == 1.0 else kv * r  # bit-identical for the paper's models


def kv_capacity_tokens(llm: LLM, machine: Machine, tp: int | None = None, reserve_frac=0.0,
                       ignore_gqa: bool = False, temperature_bytes=1e9):
    """Tokens of KV cache that fit on one model instance.

    Free memory = tp x (HBM x (1 - reserve_frac)) - weights, floored smoothly at zero
    (softplus with a 1 GB temperature: a model that does not fit reports ~0 tokens and
    a finite gradient, rather than a negative capacity). An fp8 cache holds twice the
    tokens of an fp16 one; MLA's replicated latent counts once per GPU.

    Args:
        reserve_frac: fraction of HBM kept for activations and the framework.
    """
    tp = resolve_tp(machine, tp)
    check_range("reserve_frac", reserve_frac, 0.0, 1.0, unit="(fraction of HBM)")
    check_positive("temperature_bytes", temperature_bytes, unit="bytes")
    free = tp * machine.gpu.hbm_bytes * (1.0 - reserve_frac) - llm.weight_bytes
    return softplus(free, temperature_bytes) / kv_bytes_per_token_stored(llm, tp, ignore_gqa)


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


def check_fits(llm: LLM, machine: Machine, tp: int | None = None) -> None:
    """Raise ValueError, saying by how much and what would help, unless `fits`.

    Call it where a pool of `machine` running `llm` is built, so a model that cannot
    be loaded is an error at construction, not a pool with zero KV capacity.
    """
    tp = resolve_tp(machine, tp)
    if fits(llm, machine, tp):
        return
    per_gpu = float(weights_bytes_per_gpu(llm, tp))
    hbm = float(machine.gpu.hbm_bytes)
    hints = []
    if llm.weight_dtype != "fp8":
        hints.append(f"fp8 weights ({per_gpu / llm.bytes_per_param / GB:.1f} GB per GPU)")
    if tp < machine.gpus_per_machine:
        hints.append(f"tp={machine.gpus_per_machine}")
    hints.append(f"a machine with at least {per_gpu * tp / machine.gpus_per_machine / GB:.0f} GB per GPU "
                 f"x {machine.gpus_per_machine}")
    raise ValueError(
        f"{llm.name} ({llm.weight_dtype} weights, {float(llm.weight_bytes) / GB:,.0f} GB) does not fit on "
        f"{machine.name} at tp={tp}: {per_gpu / GB:,.1f} GB of weights per GPU > {hbm / GB:,.1f} GB of "
        f"{machine.gpu.name} HBM; try {' or '.join(hints)}"
    )
