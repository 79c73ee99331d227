"""Built-in catalogue of GPUs, machines and LLMs, and user spec files (TOML or JSON).

Marketing units (TFLOP/s, GB/s, Gbps, GiB, kW, ms) appear only here, at the edge; the
dataclasses hold SI units.

Sources of the built-in figures:
    * A100-80GB SXM: 312 TFLOP/s dense fp16, 2,039 GB/s HBM2e, 80 GiB, 400 W TDP
      (NVIDIA A100 datasheet; Splitwise Table I).
    * H100-80GB SXM: 989 TFLOP/s dense fp16, 3,352 GB/s HBM3, 80 GiB, 700 W TDP
      (NVIDIA H100 datasheet; Splitwise Table I). Note: Splitwise Table I quotes a
      3.43x TFLOP/s ratio; dense fp16 tensor throughput gives 3.17x.
    * Idle power (about 15% of TDP) and minimum power caps (100 W, 200 W) are the
      boards' nvidia-smi limits; they are assumptions the calibration refines only
      through the power-cap rows.
    * DGX-A100 / DGX-H100: 8 GPUs, NVLink 300 / 450 GB/s per GPU per direction,
      InfiniBand 200 / 400 Gbps per GPU (Table I); cost $2.21 / $4.76 per GPU-hour
      (SplitwiseSim's accounting, i.e. $17.68 / $38.08 per machine-hour).
    * Provisioned power: DGX-H100 10.2 kW (nameplate); DGX-A100 scaled by
      SplitwiseSim's power units 24.8 / 44, i.e. 5.75 kW, so the paper's iso-power
      accounting (40 DGX-H100 ~ 70 DGX-A100) holds.
    * KV-transfer set-up cost 7.5 ms (A100) / 4.5 ms (H100): chosen so the layer-wise
      transfer's visible overhead for BLOOM-176B matches Splitwise Fig. 14 (~8 / ~5 ms).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from splitwise_jax._validate import check_choice
from splitwise_jax.hardware import GPU, Machine
from splitwise_jax.llm import LLM

GIB = 2.0**30

_GPUS: dict[str, GPU] = {}
_MACHINES: dict[str, Machine] = {}
_LLMS: dict[str, LLM] = {}


def _gpu_from_units(name, peak_tflops, hbm_gib, hbm_bw_gb_per_s, tdp_w, idle_w, min_cap_w) -> GPU:
    return GPU(
        name=name,
        peak_flops_per_s=float(peak_tflops) * 1e12,
        hbm_bytes=float(hbm_gib) * GIB,
        hbm_bw_bytes_per_s=float(hbm_bw_gb_per_s) * 1e9,
        tdp_w=float(tdp_w),
        idle_w=float(idle_w),
        min_cap_w=float(min_cap_w),
    )


def _machine_from_units(
    name, gpu, gpus, nvlink_gb_per_s, ib_gbps, cost_per_hour, provisioned_power_kw, host_power_w, kv_setup_ms
) -> Machine:
    return Machine(
        name=name,
        gpu=gpu if isinstance(gpu, GPU) else get_gpu(gpu),
        gpus_per_machine=int(gpus),
        nvlink_bytes_per_s=float(nvlink_gb_per_s) * 1e9,
        ib_bytes_per_s=float(ib_gbps) * 1e9 / 8.0,
        cost_per_hour=float(cost_per_hour),
        provisioned_power_w=float(provisioned_power_kw) * 1e3,
        host_power_w=float(host_power_w),
        kv_setup_s=float(kv_setup_ms) * 1e-3,
    )


def register_gpu(gpu: GPU) -> GPU:
    _GPUS[gpu.name] = gpu
    return gpu


def register_machine(machine: Machine) -> Machine:
    _MACHINES[machine.name] = machine
    return machine


def register_llm(llm: LLM) -> LLM:
    _LLMS[llm.name] = llm
    return llm


def get_gpu(name: str) -> GPU:
    check_choice("gpu", name, sorted(_GPUS))
    return _GPUS[name]


def get_machine(name: str) -> Machine:
    check_choice("machine", name, sorted(_MACHINES))
    return _MACHINES[name]


def get_llm(name: str) -> LLM:
    check_choice("model", name, sorted(_LLMS))
    return _LLMS[name]


def gpu_names() -> list[str]:
    return sorted(_GPUS)


def machine_names() -> list[str]:
    return sorted(_MACHINES)


def llm_names() -> list[str]:
    return sorted(_LLMS)


# ---- built-ins -------------------------------------------------------------------
register_gpu(_gpu_from_units("a100-80gb", 312, 80, 2039, 400, 60, 100))
register_gpu(_gpu_from_units("h100-80gb", 989, 80, 3352, 700, 100, 200))
register_machine(_machine_from_units("dgx-a100", "a100-80gb", 8, 300, 200, 8 * 2.21, 10.2 * 24.8 / 44, 1500, 7.5))
register_machine(_machine_from_units("dgx-h100", "h100-80gb", 8, 450, 400, 8 * 4.76, 10.2, 2000, 4.5))
register_llm(LLM(name="bloom-176b", n_params=176.2e9, bytes_per_param=2.0, n_layers=70, d_model=14336,
                 n_heads=112, n_kv_heads=112, d_ff=4 * 14336))
register_llm(LLM(name="llama2-70b", n_params=68.98e9, bytes_per_param=2.0, n_layers=80, d_model=8192,
                 n_heads=64, n_kv_heads=8, d_ff=28672))

# The profiles name hardware per GPU; a machine of that GPU is what runs it.
MACHINE_OF_HARDWARE = {"a100-80gb": "dgx-a100", "h100-80gb": "dgx-h100", "h100-80gb-pcap": "dgx-h100"}
CAP_OF_HARDWARE = {"a100-80gb": 1.0, "h100-80gb": 1.0, "h100-80gb-pcap": 0.7}


# ---- user spec files ---------------------------------------------------------------
_FIELDS = {
    "gpu": ["name", "peak_tflops", "hbm_gib", "hbm_bw_gb_per_s", "tdp_w", "idle_w", "min_cap_w"],
    "machine": ["name", "gpu", "gpus", "nvlink_gb_per_s", "ib_gbps", "cost_per_hour",
                "provisioned_power_kw", "host_power_w", "kv_setup_ms"],
    "llm": ["name", "n_params", "bytes_per_param", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff"],
}
_INT_FIELDS = {"gpus", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff"}


def _check_entry(path, kind, i, entry) -> dict:
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: {kind}[{i}] must be a table/object with fields {_FIELDS[kind]}")
    missing = [f for f in _FIELDS[kind] if f not in entry]
    extra = [f for f in entry if f not in _FIELDS[kind]]
    if missing or extra:
        raise ValueError(
            f"{path}: {kind}[{i}] ({entry.get('name', '?')}): missing fields {missing}, unknown fields {extra}; "
            f"accepted fields: {_FIELDS[kind]}"
        )
    out = {}
    for k, v in entry.items():
        if k in ("name", "gpu"):
            if not isinstance(v, str) or not v:
                raise ValueError(f"{path}: {kind}[{i}].{k} must be a non-empty string, got {v!r}")
            out[k] = v
        elif k in _INT_FIELDS:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{path}: {kind}[{i}].{k} must be an integer >= 1, got {v!r}")
            out[k] = v
        else:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v == v) or v < 0:
                raise ValueError(f"{path}: {kind}[{i}].{k} must be a non-negative number, got {v!r}")
            out[k] = float(v)
    return out


def load_specs(path: str | Path) -> dict[str, list[str]]:
    """Read GPUs, machines and LLMs from a TOML or JSON file and register them.

    The file has arrays `gpu`, `machine` and `llm` (any may be absent), with fields
    named in marketing units, e.g. ``[[gpu]] name = "b200" peak_tflops = 2250 ...``.
    See docs/specs.md for the full schema. Machines may name a GPU defined in the
    same file or in the catalogue.

    Returns:
        the names registered, by kind.

    Raises:
        ValueError: unreadable file, unknown section, missing or malformed fields.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"spec file {path} does not exist")
    text = path.read_text()
    try:
        if path.suffix.lower() == ".toml":
            data = tomllib.loads(text)
        elif path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            raise ValueError(f"spec file {path} must end in .toml or .json")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"spec file {path} is malformed: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"spec file {path} must hold a table/object with keys gpu, machine, llm")
    unknown = set(data) - set(_FIELDS)
    if unknown:
        raise ValueError(f"spec file {path}: unknown sections {sorted(unknown)}; accepted: {sorted(_FIELDS)}")
    names: dict[str, list[str]] = {"gpu": [], "machine": [], "llm": []}
    for kind in ("gpu", "machine", "llm"):  # order matters: machines refer to GPUs
        entries = data.get(kind, [])
        if not isinstance(entries, list):
            raise ValueError(f"spec file {path}: {kind} must be an array of tables")
        for i, raw in enumerate(entries):
            e = _check_entry(path, kind, i, raw)
            try:
                if kind == "gpu":
                    register_gpu(_gpu_from_units(**e))
                elif kind == "machine":
                    register_machine(_machine_from_units(**e))
                else:
                    register_llm(LLM(**e))
            except ValueError as err:
                raise ValueError(f"spec file {path}: {kind}[{i}]: {err}") from None
            names[kind].append(e["name"])
    return names
