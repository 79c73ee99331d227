"""Calibration parameters of the phase models, and where their values come from.

`PhaseParams` is a pytree of floats, the first argument of every phase-model function
so that `jax.grad(loss)(params, ...)` needs no argnums. Its defaults (`PRIOR`) are
physically plausible before any fit (see docs/model.md); the fitted values ship in
`splitwise_jax/data/fitted_params.json` (written by `python -m splitwise_jax.calibrate`)
and are the defaults everywhere through `default_params(gpu_name)`.

The file holds the shared physics parameters and, optionally, per-GPU overrides:
``{"shared": {field: value}, "per_gpu": {"h100-80gb": {field: value}}, "meta": {...}}``.
A GPU without an override uses the shared values, which is how a spec sheet carries
to a new GPU.
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path

import jax

from splitwise_jax._paths import PACKAGE_DATA

FITTED_PARAMS_FILE = PACKAGE_DATA / "fitted_params.json"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PhaseParams:
    """Calibration parameters (all positive floats).

    Compute:
        mfu_max: peak fraction of tensor-core FLOP/s reached by large GEMMs.
        n_half_tokens: batch tokens at which GEMM efficiency is half of mfu_max
            (tile/wave under-utilisation of small batches).
        knee_tokens, knee_exp: efficiency roll-off past this many batch tokens
            (Splitwise insight IV). The calibration moves it out of range and freezes
            it: the all-reduce step below carries the profiles' fall past ~2048 tokens.
        attn_eff: efficiency of attention (score, softmax, weighted sum) relative to
            the GEMMs, in (0, 1].
    Memory:
        bw_eff: achieved fraction of HBM bandwidth when streaming weights.
        kv_bw_eff: achieved fraction of HBM bandwidth in attention over the KV cache.
        roofline_p: exponent of the p-norm that joins compute and memory time.
    Fixed (latency-bound) costs, which overlap the GPU's streaming work:
        t_iter_s: per-iteration cost (scheduler, sampling, sync), seconds.
        t_layer_s: per-layer per-iteration cost (kernel launches, small kernels), seconds.
        t_prompt_seq_s, t_decode_seq_s: per-sequence cost per iteration, seconds.
        t_ctx_token_s: per decode-context token per iteration (masks, positions,
            cache bookkeeping), seconds.
        overlap_p: exponent (>= 1) of the p-norm joining streaming time and fixed
            time: 1 = serial (sum), large = fully overlapped (max).
        fixed_bw_exponent: the fixed costs above are for a GPU with 2,039 GB/s of HBM
            bandwidth (A100-80GB) and scale as (2,039 GB/s / bw)^fixed_bw_exponent
            on others (latency-bound work tracks the memory system's generation).
    Tensor parallel:
        allreduce_latency_s: latency of one step of a ring all-reduce (2 (tp-1) steps
            per all-reduce), seconds.
        link_eff: achieved fraction of NVLink bandwidth in all-reduce.
        comm_knee_tokens, comm_knee_exp, comm_knee_slowdown: the all-reduce bandwidth
            time grows by up to (1 + comm_knee_slowdown) past comm_knee_tokens batch
            tokens (a Hill step of steepness comm_knee_exp).
    Power (fractions of TDP - idle) and DVFS:
        p_compute_frac: power above idle at full compute utilisation.
        p_memory_frac: power above idle at full memory-bandwidth utilisation.
        p_comm_frac: power above idle while all-reduce transfers run.
        dvfs_exponent: power above idle scales as clock**dvfs_exponent (> 1).
        mem_clock_sensitivity: how much memory-bound time stretches with the clock
            (0 = not at all; paper insight VII says decode barely slows).
    KV transfer:
        kv_link_eff: achieved fraction of InfiniBand bandwidth for KV-cache transfer.
    """

    mfu_max: float = 0.6
    n_half_tokens: float = 96.0
    knee_tokens: float = 4096.0
    knee_exp: float = 1.0
    attn_eff: float = 0.5
    bw_eff: float = 0.8
    kv_bw_eff: float = 0.5
    roofline_p: float = 4.0
    t_iter_s: float = 2e-3
    t_layer_s: float = 1.5e-4
    t_prompt_seq_s: float = 1e-3
    t_decode_seq_s: float = 3e-4
    t_ctx_token_s: float = 2e-7
    overlap_p: float = 2.0
    fixed_bw_exponent: float = 1.0
    allreduce_latency_s: float = 3e-6
    link_eff: float = 0.7
    comm_knee_tokens: float = 3000.0
    comm_knee_exp: float = 4.0
    comm_knee_slowdown: float = 0.5
    p_compute_frac: float = 0.95
    p_memory_frac: float = 0.55
    p_comm_frac: float = 0.3
    dvfs_exponent: float = 1.6
    mem_clock_sensitivity: float = 0.15
    kv_link_eff: float = 0.9

    def replace(self, **changes) -> "PhaseParams":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict, *, base: "PhaseParams | None" = None) -> "PhaseParams":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown PhaseParams fields {sorted(unknown)}; accepted: {sorted(names)}")
        bad = {k: v for k, v in d.items() if not isinstance(v, (int, float)) or not v > 0}
        if bad:
            raise ValueError(f"PhaseParams fields must be positive numbers, got {bad}")
        return dataclasses.replace(base or cls(), **{k: float(v) for k, v in d.items()})


PRIOR = PhaseParams()


@lru_cache(maxsize=8)
def _read(path: str) -> dict:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"params file {p} cannot be read: {e}") from None
    if not isinstance(data, dict) or "shared" not in data:
        raise ValueError(f"params file {p} must be a JSON object with a 'shared' entry")
    return data


def load_params(gpu_name: str | None = None, path: str | Path | None = None) -> PhaseParams:
    """Parameters for one GPU from a params file (default: the shipped fit).

    Falls back to the physical prior when no fitted file ships (a fresh checkout
    before the first calibration).
    """
    path = Path(path) if path is not None else FITTED_PARAMS_FILE
    if not path.exists():
        if path == FITTED_PARAMS_FILE:
            return PRIOR
        raise ValueError(f"params file {path} does not exist")
    data = _read(str(path))
    params = PhaseParams.from_dict(data["shared"])
    if gpu_name is not None:
        override = data.get("per_gpu", {}).get(gpu_name)
        if override:
            params = PhaseParams.from_dict(override, base=params)
    return params


def default_params(gpu_name: str | None = None) -> PhaseParams:
    """The shipped calibrated parameters for a GPU (shared values for unknown GPUs)."""
    return load_params(gpu_name)


def save_params(path: str | Path, shared: PhaseParams, per_gpu: dict[str, dict] | None = None,
                meta: dict | None = None) -> None:
    data = {"shared": shared.to_dict(), "per_gpu": per_gpu or {}, "meta": meta or {}}
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    _read.cache_clear()
