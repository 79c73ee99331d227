"""Calibration parameters of the phase models, and where their values come from.

`PhaseParams` is a pytree of floats, the first argument of every phase-model function
so that `jax.grad(loss)(params, ...)` needs no argnums. Its defaults (`PRIOR`) are
physically plausible before any fit (see docs/model.md); the fitted values ship in
`splitwise_jax/data/fitted_params.json` (written by `python -m splitwise_jax.calibrate`)
and are the defaults everywhere through `default_params(gpu_name)`.

The file holds the shared physics parameters and, optionally, per-GPU overrides:
``{"shared": {field: value}, "per_gpu": {"h100-80gb": {field: value}}, "meta": {...}}``.
A GPU without an override uses the shared values, which is how a spec sheet carries
to a new GPU. `read_params_file` and `write_params_file` are the one reader and writer
of that format (the calibration and the predict command use them too).
"""

from __future__ import annotations

import dataclasses
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

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
        """Fields from a mapping (a params file's entry); unknown names and values that
        are not finite positive numbers raise ValueError naming them."""
        if not isinstance(d, dict):
            raise ValueError(f"PhaseParams fields must be an object of name: number, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown PhaseParams fields {sorted(unknown)}; accepted: {sorted(names)}")
        bad = {k: v for k, v in d.items()
               if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0)}
        if bad:
            raise ValueError(f"PhaseParams fields must be finite positive numbers, got {bad}")
        return dataclasses.replace(base or cls(), **{k: float(v) for k, v in d.items()})


PRIOR = PhaseParams()


class ParamsFile(NamedTuple):
    """A params file's content: shared values, per-GPU overrides (absolute values of
    the overridden fields only) and free-form metadata."""

    shared: PhaseParams
    per_gpu: dict[str, dict[str, float]]
    meta: dict


def read_params_file(path: str | Path) -> ParamsFile:
    """Read and validate a params file (the one reader of the format).

    Raises:
        ValueError: a missing or unreadable file, malformed JSON, a missing 'shared'
            object, unknown field names, values that are not finite positive numbers,
            or a malformed 'per_gpu' / 'meta' entry. The message names the file.
    """
    p = Path(path)
    try:
        stat = p.stat()
    except OSError:
        raise ValueError(f"params file {p} does not exist") from None
    return _read(str(p), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=8)
def _read(path: str, _mtime_ns: int, _size: int) -> ParamsFile:
    # Cached on (path, modification time, size): make_timing reads the shipped file for
    # every machine type, and a rewritten file is read afresh.
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"params file {p} cannot be read: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("shared"), dict):
        raise ValueError(f"params file {p} must be a JSON object with a 'shared' object of PhaseParams fields, "
                         'e.g. {"shared": {"mfu_max": 0.6}, "per_gpu": {}, "meta": {}}')
    unknown = set(data) - {"shared", "per_gpu", "meta"}
    if unknown:
        raise ValueError(f"params file {p}: unknown keys {sorted(unknown)}; accepted: shared, per_gpu, meta")
    try:
        shared = PhaseParams.from_dict(data["shared"])
    except ValueError as e:
        raise ValueError(f"params file {p}: 'shared': {e}") from None
    per_gpu = data.get("per_gpu") or {}
    if not isinstance(per_gpu, dict) or not all(isinstance(v, dict) for v in per_gpu.values()):
        raise ValueError(f"params file {p}: 'per_gpu' must map GPU names to objects of PhaseParams fields")
    for gpu, override in per_gpu.items():
        try:
            PhaseParams.from_dict(override, base=shared)
        except ValueError as e:
            raise ValueError(f"params file {p}: 'per_gpu' {gpu!r}: {e}") from None
    meta = data.get("meta") or {}
    if not isinstance(meta, dict):
        raise ValueError(f"params file {p}: 'meta' must be an object")
    return ParamsFile(shared, {k: {f: float(x) for f, x in v.items()} for k, v in per_gpu.items()}, dict(meta))


def write_params_file(path: str | Path, shared: PhaseParams, per_gpu: dict[str, dict] | None = None,
                      meta: dict | None = None) -> None:
    """Write a params file (the one writer of the format; `read_params_file` reads it)."""
    data = {"shared": shared.to_dict(), "per_gpu": per_gpu or {}, "meta": meta or {}}
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def params_for_gpu(content: ParamsFile, gpu_name: str | None) -> PhaseParams:
    """The parameters one GPU runs on: its overrides if any, else the shared values."""
    override = content.per_gpu.get(gpu_name) if gpu_name is not None else None
    return PhaseParams.from_dict(override, base=content.shared) if override else content.shared


def load_params(gpu_name: str | None = None, path: str | Path | None = None) -> PhaseParams:
    """Parameters for one GPU from a params file (default: the shipped fit).

    Falls back to the physical prior when no fitted file ships (a fresh checkout
    before the first calibration).
    """
    path = Path(path) if path is not None else FITTED_PARAMS_FILE
    if not path.exists() and path == FITTED_PARAMS_FILE:
        return PRIOR
    return params_for_gpu(read_params_file(path), gpu_name)


def default_params(gpu_name: str | None = None) -> PhaseParams:
    """The shipped calibrated parameters for a GPU (shared values for unknown GPUs)."""
    return load_params(gpu_name)
