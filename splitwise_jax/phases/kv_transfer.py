"""KV-cache transfer from the prompt machine to the token machine.

Each of the `tp` GPUs sends its shard of the cache over its own InfiniBand link, so
the transfer bandwidth is tp x ib_bytes_per_s x kv_link_eff.

* Serialized: starts when the prompt ends; the whole time is visible:
      t = setup + bytes / bw
* Layer-wise: layer l's KV leaves as soon as layer l is computed, overlapping the
  remaining layers. Only the last layer's share and any excess of the transfer over
  the overlapped compute are visible:
      t = setup + bytes / (L bw) + softplus(bytes (L-1)/(L bw) - prompt_s (L-1)/L)
  With fast links the excess is zero and the visible cost is about constant in prompt
  size (Splitwise Fig. 14: ~8 ms on A100, ~5 ms on H100 for BLOOM-176B).

References:
    Patel et al., Splitwise, ISCA 2024, §IV-C and Figs. 14-15.
"""

from __future__ import annotations

from splitwise_jax._smooth import softplus
from splitwise_jax._validate import check_positive
from splitwise_jax.specs.hardware import Machine
from splitwise_jax.specs.llm import LLM
from splitwise_jax.phases.memory import kv_bytes_per_token, resolve_tp
from splitwise_jax.phases.params import PhaseParams

# Softplus temperature (s) on the non-overlapped excess; 1 ms keeps the corner smooth
# and is below the profiles' timing noise.
_EXCESS_TEMPERATURE_S = 1e-3


def kv_transfer_bandwidth(params: PhaseParams, src: Machine, dst: Machine, tp: int | None = None):
    """Bytes/s available to one transfer: the slower endpoint's links, all GPUs at once."""
    tp = resolve_tp(src, tp)
    link = (src.ib_bytes_per_s + dst.ib_bytes_per_s - abs(src.ib_bytes_per_s - dst.ib_bytes_per_s)) / 2.0
    return tp * link * params.kv_link_eff


def kv_transfer_bytes(llm: LLM, prompt_tokens, ignore_gqa: bool = False):
    """KV-cache bytes of a prompt of `prompt_tokens` tokens, whole model (bytes)."""
    check_positive("prompt_tokens", prompt_tokens, allow_zero=True, unit="tokens")
    return prompt_tokens * kv_bytes_per_token(llm, ignore_gqa)


def visible_transfer_s(nbytes, bandwidth_bytes_per_s, setup_s, n_layers: int, prompt_s, mode: str):
    """Visible time of moving `nbytes` of KV cache (s): the one home of both formulas.

    Args:
        nbytes: bytes of KV cache (any shape).
        bandwidth_bytes_per_s: bytes/s of the transfer.
        setup_s: fixed cost per transfer (s).
        n_layers: layers of the model (layer-wise mode overlaps all but the last).
        prompt_s: the prompt iteration's time (s) the layer-wise transfer overlaps.
        mode: "serialized" or "layerwise" (static).
    """
    total = nbytes / bandwidth_bytes_per_s
    if mode == "serialized":
        return setup_s + total
    if mode != "layerwise":
        raise ValueError(f"mode must be 'serialized' or 'layerwise', got {mode!r}")
    L = n_layers
    excess = softplus(total * (L - 1) / L - prompt_s * (L - 1) / L, _EXCESS_TEMPERATURE_S)
    return setup_s + total / L + excess


def serialized_transfer_s(params: PhaseParams, src: Machine, dst: Machine, llm: LLM, prompt_tokens, *,
                          bandwidth_bytes_per_s=None, tp: int | None = None):
    """Visible time of a transfer that starts after the prompt ends (s)."""
    check_positive("prompt_tokens", prompt_tokens, unit="tokens")
    if bandwidth_bytes_per_s is not None:
        check_positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s, unit="bytes/s")
    bw = kv_transfer_bandwidth(params, src, dst, tp) if bandwidth_bytes_per_s is None else bandwidth_bytes_per_s
    return visible_transfer_s(kv_transfer_bytes(llm, prompt_tokens), bw, src.kv_setup_s, llm.n_layers, 0.0,
                              "serialized")


def layerwise_transfer_s(params: PhaseParams, src: Machine, dst: Machine, llm: LLM, prompt_tokens, prompt_s, *,
                         bandwidth_bytes_per_s=None, tp: int | None = None):
    """Visible time of a layer-by-layer transfer overlapped with the prompt (s).

    Args:
        prompt_s: the prompt iteration's time (s), the compute it overlaps.
    """
    check_positive("prompt_tokens", prompt_tokens, unit="tokens")
    check_positive("prompt_s", prompt_s, allow_zero=True, unit="s")
    if bandwidth_bytes_per_s is not None:
        check_positive("bandwidth_bytes_per_s", bandwidth_bytes_per_s, unit="bytes/s")
    bw = kv_transfer_bandwidth(params, src, dst, tp) if bandwidth_bytes_per_s is None else bandwidth_bytes_per_s
    return visible_transfer_s(kv_transfer_bytes(llm, prompt_tokens), bw, src.kv_setup_s, llm.n_layers, prompt_s,
                              "layerwise")
