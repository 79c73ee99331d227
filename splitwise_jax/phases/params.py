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

An optional fourth key, ``"uncertainty"``, holds the fit's parameter uncertainty
(`ParamUncertainty`: a Laplace covariance in the fit's unconstrained space and the
residual scatter of the fit; docs/uncertainty.md). Files without it read as before.
"""

from __future__ import annotations

import dataclasses
import json
import math
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np

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


FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(PhaseParams))
#: Phases whose residual scatter a `ParamUncertainty` records.
RESIDUAL_PHASES = ("prompt", "token")


@dataclasses.dataclass(frozen=True)
class ParamUncertainty:
    """Uncertainty of a calibration (host-side data, not a pytree).

    The fit's free components live in its unconstrained space (`param_space.BOUNDS`:
    log of positive fields, logit of bounded ones): ``"shared:<field>"`` for a shared
    value and ``"<gpu>:<field>"`` for a GPU's deviation from it, so a GPU with a
    deviation runs on raw value shared + deviation, any other GPU on shared alone.
    Fields the fit froze have no component (zero variance).

    Attributes:
        names: the free components, length p.
        mean: their values at the fit, shape (p,).
        covariance: their Laplace covariance, shape (p, p), symmetric positive definite.
        residual_sd: the fit's residual scatter as a log-normal s.d.: phase ("prompt",
            "token") -> profile hardware name (e.g. "h100-80gb-pcap") -> s.d. of
            log(measured / predicted) not explained by the parameters.
        unseen_gpu_sd: phase -> the same for a GPU without profiles (measured on the
            spec-transfer split when the calibration ran it; else absent).
        meta: how it was computed (method, counts, scales).
    """

    names: tuple[str, ...]
    mean: np.ndarray
    covariance: np.ndarray
    residual_sd: dict
    unseen_gpu_sd: dict = dataclasses.field(default_factory=dict)
    meta: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        names = tuple(str(n) for n in self.names)
        mean = np.asarray(self.mean, dtype=float)
        cov = np.asarray(self.covariance, dtype=float)
        p = len(names)
        if mean.shape != (p,) or cov.shape != (p, p):
            raise ValueError(f"uncertainty: {p} names need mean ({p},) and covariance ({p}, {p}), got "
                             f"{mean.shape} and {cov.shape}")
        bad = [n for n in names if n.count(":") != 1 or n.split(":")[1] not in FIELD_NAMES]
        if bad or len(set(names)) != p:
            raise ValueError(f"uncertainty: names must be unique '<shared|gpu>:<PhaseParams field>', got {bad or names}")
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(cov)) and np.allclose(cov, cov.T, atol=1e-12)
                and np.all(np.diag(cov) >= 0)):
            raise ValueError("uncertainty: mean and covariance must be finite, the covariance symmetric with a "
                             "non-negative diagonal")
        for label, table in (("residual_sd", self.residual_sd), ("unseen_gpu_sd", self.unseen_gpu_sd)):
            if not isinstance(table, dict) or not set(table) <= set(RESIDUAL_PHASES):
                raise ValueError(f"uncertainty: {label} must map phases {list(RESIDUAL_PHASES)} to values")
        for phase, per_hw in self.residual_sd.items():
            if not isinstance(per_hw, dict) or not all(_finite_nonneg(v) for v in per_hw.values()):
                raise ValueError(f"uncertainty: residual_sd[{phase!r}] must map hardware names to s.d. >= 0")
        if not all(_finite_nonneg(v) for v in self.unseen_gpu_sd.values()):
            raise ValueError("uncertainty: unseen_gpu_sd values must be s.d. >= 0")
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "covariance", 0.5 * (cov + cov.T))

    def raw_covariance(self, gpus) -> np.ndarray:
        """Joint covariance of the raw (unconstrained) parameters of several GPUs.

        Args:
            gpus: GPU names (e.g. ``("h100-80gb", "a100-80gb")``); a GPU the fit had no
                profiles of runs on the shared values.

        Returns:
            (len(gpus) * n_fields, len(gpus) * n_fields), blocks in the order of
            `gpus`, fields in `PhaseParams` order; zero rows for frozen fields.
        """
        index = {n: i for i, n in enumerate(self.names)}
        n_f = len(FIELD_NAMES)
        a = np.zeros((len(gpus) * n_f, len(self.names)))
        for k, gpu in enumerate(gpus):
            for j, f in enumerate(FIELD_NAMES):
                for key in (f"shared:{f}", f"{gpu}:{f}"):
                    if key in index:
                        a[k * n_f + j, index[key]] = 1.0
        return a @ self.covariance @ a.T

    def phase_sd(self, phase: str, hardware: str | None) -> float:
        """Residual scatter of one phase on one profile hardware (an unseen GPU: the
        spec-transfer scatter if measured, else the largest scatter of a profiled one)."""
        table = self.residual_sd.get(phase, {})
        if hardware in table:
            return float(table[hardware])
        if phase in self.unseen_gpu_sd:
            return float(self.unseen_gpu_sd[phase])
        return max((float(v) for v in table.values()), default=0.0)

    def to_dict(self) -> dict:
        return {"names": list(self.names), "mean": self.mean.tolist(), "covariance": self.covariance.tolist(),
                "residual_sd": self.residual_sd, "unseen_gpu_sd": self.unseen_gpu_sd, "meta": self.meta}

    @classmethod
    def from_dict(cls, d: dict) -> "ParamUncertainty":
        if not isinstance(d, dict):
            raise ValueError(f"uncertainty must be an object, got {type(d).__name__}")
        missing = [k for k in ("names", "mean", "covariance", "residual_sd") if k not in d]
        unknown = set(d) - {"names", "mean", "covariance", "residual_sd", "unseen_gpu_sd", "meta"}
        if missing or unknown:
            raise ValueError(f"uncertainty: missing keys {missing}, unknown keys {sorted(unknown)}; accepted: names, "
                             "mean, covariance, residual_sd, unseen_gpu_sd, meta")
        try:
            return cls(tuple(d["names"]), np.asarray(d["mean"], dtype=float), np.asarray(d["covariance"], dtype=float),
                       dict(d["residual_sd"]), dict(d.get("unseen_gpu_sd") or {}), dict(d.get("meta") or {}))
        except (TypeError, ValueError) as e:
            raise ValueError(str(e) if str(e).startswith("uncertainty") else f"uncertainty: {e}") from None


def _finite_nonneg(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


class ParamsFile(NamedTuple):
    """A params file's content: shared values, per-GPU overrides (absolute values of
    the overridden fields only), free-form metadata and, when the calibration computed
    it, the parameter uncertainty."""

    shared: PhaseParams
    per_gpu: dict[str, dict[str, float]]
    meta: dict
    uncertainty: ParamUncertainty | None = None
    #: serving-engine parameters (`splitwise_jax.cluster.engine.EngineParams` fields) of a
    #: stack fitted to serving benchmarks; empty for a stack fitted to iteration profiles.
    engine: dict = {}


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
    unknown = set(data) - {"shared", "per_gpu", "meta", "uncertainty", "engine"}
    if unknown:
        raise ValueError(f"params file {p}: unknown keys {sorted(unknown)}; accepted: shared, per_gpu, meta, "
                         "uncertainty, engine")
    engine = data.get("engine") or {}
    if not isinstance(engine, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               and math.isfinite(v) and v >= 0 for v in engine.values()):
        raise ValueError(f"params file {p}: 'engine' must map engine-parameter names to finite numbers >= 0")
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
    uncertainty = None
    if data.get("uncertainty") is not None:
        try:
            uncertainty = ParamUncertainty.from_dict(data["uncertainty"])
        except ValueError as e:
            raise ValueError(f"params file {p}: {e}") from None
    return ParamsFile(shared, {k: {f: float(x) for f, x in v.items()} for k, v in per_gpu.items()}, dict(meta),
                      uncertainty, {k: float(v) for k, v in engine.items()})


def write_params_file(path: str | Path, shared: PhaseParams, per_gpu: dict[str, dict] | None = None,
                      meta: dict | None = None, uncertainty: ParamUncertainty | None = None,
                      engine: dict | None = None) -> None:
    """Write a params file (the one writer of the format; `read_params_file` reads it)."""
    data = {"shared": shared.to_dict(), "per_gpu": per_gpu or {}, "meta": meta or {}}
    if engine:
        data["engine"] = {k: float(v) for k, v in engine.items()}
    if uncertainty is not None:
        data["uncertainty"] = uncertainty.to_dict()
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def params_for_gpu(content: ParamsFile, gpu_name: str | None) -> PhaseParams:
    """The parameters one GPU runs on: its overrides if any, else the shared values."""
    override = content.per_gpu.get(gpu_name) if gpu_name is not None else None
    return PhaseParams.from_dict(override, base=content.shared) if override else content.shared


#: Named parameter stacks that ship with the package: name -> (file, what it is).
STACKS = {
    "paper-2023": (FITTED_PARAMS_FILE, "fit to the 2023 iteration profiles of SplitwiseSim (A100/H100, "
                                       "BLOOM-176B and Llama2-70B): what reproduces the paper"),
    "vllm-2026": (PACKAGE_DATA / "stacks" / "vllm-2026.json",
                  "fit through the serving-engine model to public vLLM benchmarks on H100 SXM (2026; "
                  "inference-sim/training, measured with inference-perf)"),
}
DEFAULT_STACK = "paper-2023"


def resolve_params(name_or_path: str | Path | None) -> Path:
    """The file of a named stack (`STACKS`) or a params file's path; None -> the default stack.

    Raises:
        ValueError: neither a stack name nor an existing file; the message lists the names.
    """
    if name_or_path is None:
        return STACKS[DEFAULT_STACK][0]
    key = str(name_or_path)
    if key in STACKS:
        return STACKS[key][0]
    p = Path(key)
    if not p.is_file():
        raise ValueError(f"--params {key!r} is neither a stack name ({', '.join(sorted(STACKS))}) nor an existing "
                         "params file")
    return p


def stack_name(path: str | Path) -> str | None:
    """The stack name of a params file path, or None for a user's file."""
    rp = Path(path).resolve()
    for name, (f, _) in STACKS.items():
        if Path(f).resolve() == rp:
            return name
    return None


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


def load_uncertainty(path: str | Path | None = None) -> ParamUncertainty | None:
    """The parameter uncertainty stored with a params file (default: the shipped fit);
    None when the file has none (an older file, or the prior)."""
    path = Path(path) if path is not None else FITTED_PARAMS_FILE
    if not path.exists() and path == FITTED_PARAMS_FILE:
        return None
    return read_params_file(path).uncertainty
