"""Built-in catalogue of GPUs, machines and LLMs, and user spec files (TOML or JSON).

Marketing units (TFLOP/s, GB/s, Gbps, GiB, kW, ms) appear only here, at the edge; the
dataclasses hold SI units. docs/specs.md tabulates every figure with its source (link
text and date read) and says which are assumptions; the short version:

    * A100-80GB SXM: 312 TFLOP/s dense fp16, 2,039 GB/s HBM2e, 80 GiB, 400 W TDP
      (NVIDIA A100 datasheet; Splitwise Table I). No fp8 tensor cores: fp8 weights
      run at the fp16 rate.
    * H100-80GB SXM: 989 TFLOP/s dense fp16 (1,979 fp8), 3,352 GB/s HBM3, 80 GiB, 700 W
      TDP (NVIDIA H100 datasheet; Splitwise Table I). Note: Splitwise Table I quotes a
      3.43x TFLOP/s ratio; dense fp16 tensor throughput gives 3.17x.
    * H200 SXM: the H100's compute (989 / 1,979 TFLOP/s dense bf16 / fp8) with 141 GB
      HBM3e at 4.8 TB/s, 700 W (NVIDIA H200 datasheet).
    * B200 (HGX/DGX, 1,000 W): 2,250 / 4,500 TFLOP/s dense bf16 / fp8, 8 TB/s HBM3e,
      180 GB (the DGX B200's 1,440 GB / 8; 192 GB is also quoted for B200 boards).
    * MI300X: 1,307.4 / 2,614.9 TFLOP/s dense fp16 / fp8, 192 GB HBM3 at 5.3 TB/s, 750 W
      (AMD Instinct MI300X data sheet).
    * Idle power (about 15% of TDP) and minimum power caps (100 W, 200 W) are the
      boards' nvidia-smi limits for A100 / H100; for H200 the H100's, for B200 and MI300X
      assumed at the same fractions (15% idle, ~30% floor).
    * DGX-A100 / DGX-H100: 8 GPUs, NVLink 300 / 450 GB/s per GPU per direction,
      InfiniBand 200 / 400 Gbps per GPU (Table I); cost $2.21 / $4.76 per GPU-hour
      (SplitwiseSim's accounting, i.e. $17.68 / $38.08 per machine-hour).
    * DGX-H200: NVLink 4 (450 GB/s per direction), 8 x 400 Gbps ConnectX-7, 10.2 kW max.
      DGX-B200: NVLink 5 (900 GB/s per direction), 8 x 400 Gbps ConnectX-7, 14.3 kW max.
      8 x MI300X platform (`mi300x-x8`): 7 Infinity Fabric links of 64 GB/s per direction
      per GPU (448 GB/s), 400 Gbps RoCE/InfiniBand per GPU; provisioned power assumed
      at the DGX-H100's nameplate-to-GPU-TDP ratio (10.2 / 5.6) x 8 x 750 W = 10.9 kW.
    * Cost per GPU-hour of the new machines (`COST_PER_GPU_HOUR`): the H100's $4.76
      scaled by 2026 cloud price ratios (assumptions, docs/specs.md).
    * Provisioned power: DGX-H100 10.2 kW (nameplate); DGX-A100 scaled by
      SplitwiseSim's power units 24.8 / 44, i.e. 5.75 kW, so the paper's iso-power
      accounting (40 DGX-H100 ~ 70 DGX-A100) holds.
    * KV-transfer set-up cost 7.5 ms (A100) / 4.5 ms (H100): chosen so the layer-wise
      transfer's visible overhead for BLOOM-176B matches Splitwise Fig. 14 (~8 / ~5 ms);
      the H100's 4.5 ms is assumed for the newer machines (same software stack).
"""

from __future__ import annotations

from pathlib import Path

from splitwise_jax._tables import read_table_file
from splitwise_jax._validate import check_choice
from splitwise_jax.specs.hardware import GPU, Machine
from splitwise_jax.specs.llm import DTYPE_BYTES, LLM, MLA, MoE, canonical_dtype, dtype_from_bytes, param_count

GIB = 2.0**30

_GPUS: dict[str, GPU] = {}
_MACHINES: dict[str, Machine] = {}
_LLMS: dict[str, LLM] = {}


# $/GPU-hour. A100 / H100: SplitwiseSim's accounting (the paper's). The others scale the
# H100's $4.76 by cloud on-demand price ratios read 2026-11-30 (assumptions; docs/specs.md):
# H200 1.35x H100 (hyperscaler midpoints $5.75 / $4.25), B200 1.67x H200 (one provider's
# $3.75 / $2.25 list), MI300X 0.79x H100 (neocloud $1.78 vs H100 long-tail $2.25).
COST_PER_GPU_HOUR: dict[str, float] = {
    "a100-80gb": 2.21,
    "h100-80gb": 4.76,
    "h200-141gb": 4.76 * 1.35,
    "b200-180gb": 4.76 * 1.35 * 1.67,
    "mi300x-192gb": 4.76 * 0.79,
}


def _gpu_from_units(name, peak_tflops, hbm_gib, hbm_bw_gb_per_s, tdp_w, idle_w, min_cap_w,
                    peak_fp8_tflops=None) -> GPU:
    return GPU(
        name=name,
        peak_flops_per_s=float(peak_tflops) * 1e12,
        hbm_bytes=float(hbm_gib) * GIB,
        hbm_bw_bytes_per_s=float(hbm_bw_gb_per_s) * 1e9,
        tdp_w=float(tdp_w),
        idle_w=float(idle_w),
        min_cap_w=float(min_cap_w),
        peak_fp8_flops_per_s=None if peak_fp8_tflops is None else float(peak_fp8_tflops) * 1e12,
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
# GPUs: name, dense fp16/bf16 TFLOP/s, HBM (datasheet GB, entered as GiB like the
# paper's 80 GB parts), HBM GB/s, TDP W, idle W, min cap W, dense fp8 TFLOP/s.
# Sources and assumptions: module docstring and docs/specs.md.
register_gpu(_gpu_from_units("a100-80gb", 312, 80, 2039, 400, 60, 100, peak_fp8_tflops=312))  # no fp8 cores
register_gpu(_gpu_from_units("h100-80gb", 989, 80, 3352, 700, 100, 200, peak_fp8_tflops=1979))
register_gpu(_gpu_from_units("h200-141gb", 989, 141, 4800, 700, 100, 200, peak_fp8_tflops=1979))
register_gpu(_gpu_from_units("b200-180gb", 2250, 180, 8000, 1000, 150, 300, peak_fp8_tflops=4500))
register_gpu(_gpu_from_units("mi300x-192gb", 1307.4, 192, 5300, 750, 110, 225, peak_fp8_tflops=2614.9))
# Machines: name, GPU, GPUs, GPU-to-GPU GB/s per direction, network Gbit/s per GPU,
# $/machine-hour, provisioned kW, host W, KV-transfer set-up ms.
register_machine(_machine_from_units("dgx-a100", "a100-80gb", 8, 300, 200, 8 * 2.21, 10.2 * 24.8 / 44, 1500, 7.5))
register_machine(_machine_from_units("dgx-h100", "h100-80gb", 8, 450, 400, 8 * 4.76, 10.2, 2000, 4.5))
register_machine(_machine_from_units("dgx-h200", "h200-141gb", 8, 450, 400, 8 * COST_PER_GPU_HOUR["h200-141gb"],
                                     10.2, 2000, 4.5))
register_machine(_machine_from_units("dgx-b200", "b200-180gb", 8, 900, 400, 8 * COST_PER_GPU_HOUR["b200-180gb"],
                                     14.3, 2500, 4.5))
register_machine(_machine_from_units("mi300x-x8", "mi300x-192gb", 8, 448, 400,
                                     8 * COST_PER_GPU_HOUR["mi300x-192gb"], 8 * 0.75 * 10.2 / 5.6, 2000, 4.5))

# The paper's models: parameter counts as published (fp16, as profiled).
register_llm(LLM(name="bloom-176b", n_params=176.2e9, weight_dtype="fp16", kv_dtype="fp16", n_layers=70,
                 d_model=14336, n_heads=112, n_kv_heads=112, d_ff=4 * 14336))
register_llm(LLM(name="llama2-70b", n_params=68.98e9, weight_dtype="fp16", kv_dtype="fp16", n_layers=80,
                 d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672))


def _llm_from_architecture(name, *, vocab_size, tied_embeddings=False, qkv_bias=False, router_bias=False,
                           weight_dtype="bf16", kv_dtype="bf16", **arch) -> LLM:
    """An LLM whose parameter count follows from its architecture (`llm.param_count`)."""
    n = param_count(vocab_size=vocab_size, tied_embeddings=tied_embeddings, qkv_bias=qkv_bias,
                    router_bias=router_bias, **arch)
    return LLM(name=name, n_params=float(n), weight_dtype=weight_dtype, kv_dtype=kv_dtype, **arch)


# Models since the paper, at the precision of their release checkpoints (bf16; DeepSeek-V3
# ships fp8 weights). Hyper-parameters from each model's published config.json / paper
# (llm.py docstring); tests/fixtures/hf_configs holds the same facts as config.json files
# and tests/test_hf_config.py checks the two transcriptions agree.
# The Llama-2 family and Code Llama 34B, as published (config.json of each checkpoint;
# Llama-2 ships fp16, Code Llama bf16): the models of the public serving benchmarks
# (cluster/engine.py, io/benchmarks.py). Llama-2-70B is the paper's entry above.
register_llm(_llm_from_architecture("llama2-7b", vocab_size=32000, weight_dtype="fp16", kv_dtype="fp16",
                                    n_layers=32, d_model=4096, n_heads=32, n_kv_heads=32, d_ff=11008))
register_llm(_llm_from_architecture("llama2-13b", vocab_size=32000, weight_dtype="fp16", kv_dtype="fp16",
                                    n_layers=40, d_model=5120, n_heads=40, n_kv_heads=40, d_ff=13824))
register_llm(_llm_from_architecture("codellama-34b", vocab_size=32000, n_layers=48, d_model=8192, n_heads=64,
                                    n_kv_heads=8, d_ff=22016))
register_llm(_llm_from_architecture("llama3.1-8b", vocab_size=128256, n_layers=32, d_model=4096, n_heads=32,
                                    n_kv_heads=8, d_ff=14336))
register_llm(_llm_from_architecture("llama3.1-70b", vocab_size=128256, n_layers=80, d_model=8192, n_heads=64,
                                    n_kv_heads=8, d_ff=28672))
register_llm(_llm_from_architecture("llama3.1-405b", vocab_size=128256, n_layers=126, d_model=16384,
                                    n_heads=128, n_kv_heads=8, d_ff=53248))
register_llm(_llm_from_architecture("mixtral-8x7b", vocab_size=32000, n_layers=32, d_model=4096, n_heads=32,
                                    n_kv_heads=8, d_ff=14336,
                                    moe=MoE(n_experts=8, experts_per_token=2, d_ff_expert=14336, n_moe_layers=32)))
register_llm(_llm_from_architecture("qwen2.5-72b", vocab_size=152064, qkv_bias=True, n_layers=80, d_model=8192,
                                    n_heads=64, n_kv_heads=8, d_ff=29568))
register_llm(_llm_from_architecture(
    "deepseek-v3", vocab_size=129280, router_bias=True, weight_dtype="fp8", kv_dtype="bf16",
    n_layers=61, d_model=7168, n_heads=128, n_kv_heads=128, d_ff=18432,
    moe=MoE(n_experts=256, experts_per_token=8, d_ff_expert=2048, n_moe_layers=61 - 3, d_ff_shared=2048),
    mla=MLA(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536)))

# The profiles name hardware per GPU; a machine of that GPU is what runs it.
MACHINE_OF_HARDWARE = {"a100-80gb": "dgx-a100", "h100-80gb": "dgx-h100", "h100-80gb-pcap": "dgx-h100"}
CAP_OF_HARDWARE = {"a100-80gb": 1.0, "h100-80gb": 1.0, "h100-80gb-pcap": 0.7}


# ---- user spec files ---------------------------------------------------------------
# Required and optional fields of each kind (docs/specs.md has units and meanings).
_FIELDS = {
    "gpu": ["name", "peak_tflops", "hbm_gib", "hbm_bw_gb_per_s", "tdp_w", "idle_w", "min_cap_w"],
    "machine": ["name", "gpu", "gpus", "nvlink_gb_per_s", "ib_gbps", "cost_per_hour",
                "provisioned_power_kw", "host_power_w", "kv_setup_ms"],
    "llm": ["name", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff"],
}
_OPTIONAL = {
    "gpu": ["peak_fp8_tflops"],
    "machine": [],
    # n_params or vocab_size (then counted from the architecture); weight_dtype or the
    # legacy bytes_per_param (which then also sets the KV precision, as it used to)
    "llm": ["n_params", "vocab_size", "tied_embeddings", "qkv_bias", "weight_dtype", "bytes_per_param",
            "kv_dtype", "head_dim", "moe", "mla"],
}
# An llm entry that points at a Hugging Face config.json takes only these.
_HF_FIELDS = ["name", "hf_config", "weight_dtype", "kv_dtype"]
_SUB_FIELDS = {
    "moe": (["n_experts", "experts_per_token", "d_ff_expert"], ["n_moe_layers", "d_ff_shared"]),
    "mla": (["kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"], ["q_lora_rank"]),
}
_INT_FIELDS = {"gpus", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "head_dim",
               "n_experts", "experts_per_token", "d_ff_expert", "n_moe_layers", "kv_lora_rank",
               "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"}
_INT0_FIELDS = {"d_ff_shared", "q_lora_rank"}  # integers that may be 0
_STR_FIELDS = {"name", "gpu", "hf_config", "weight_dtype", "kv_dtype"}
_BOOL_FIELDS = {"tied_embeddings", "qkv_bias"}


def _check_fields(where: str, entry: dict, required: list[str], optional: list[str]) -> None:
    missing = [f for f in required if f not in entry]
    extra = [f for f in entry if f not in required and f not in optional]
    if missing or extra:
        label = f" ({entry['name']})" if "name" in entry else ""
        raise ValueError(f"{where}{label}: missing fields {missing}, unknown fields {extra}; "
                         f"accepted fields: {required}" + (f", optional: {optional}" if optional else ""))


def _check_value(where: str, k: str, v):
    if k in _STR_FIELDS:
        if not isinstance(v, str) or not v:
            raise ValueError(f"{where}.{k} must be a non-empty string, got {v!r}")
        return v
    if k in _BOOL_FIELDS:
        if not isinstance(v, bool):
            raise ValueError(f"{where}.{k} must be true or false, got {v!r}")
        return v
    if k in _INT_FIELDS or k in _INT0_FIELDS:
        lo = 0 if k in _INT0_FIELDS else 1
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{where}.{k} must be an integer >= {lo}, got {v!r}")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v == v) or v < 0 or v == float("inf"):
        raise ValueError(f"{where}.{k} must be a non-negative number, got {v!r}")
    return float(v)


def _check_entry(path, kind, i, entry) -> dict:
    where = f"{path}: {kind}[{i}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a table/object with fields {_FIELDS[kind]}")
    if kind == "llm" and "hf_config" in entry:
        _check_fields(where, entry, ["name", "hf_config"], _HF_FIELDS[2:])
    else:
        _check_fields(where, entry, _FIELDS[kind], _OPTIONAL[kind])
    out = {}
    for k, v in entry.items():
        if k in _SUB_FIELDS:
            sub_where = f"{where}.{k}"
            if not isinstance(v, dict):
                raise ValueError(f"{sub_where} must be a table/object with fields {_SUB_FIELDS[k][0]}")
            _check_fields(sub_where, v, *_SUB_FIELDS[k])
            out[k] = {sk: _check_value(sub_where, sk, sv) for sk, sv in v.items()}
        else:
            out[k] = _check_value(where, k, v)
    return out


def _llm_from_entry(path: Path, e: dict) -> LLM:
    """An LLM from a checked spec-file entry (see docs/specs.md)."""
    if "hf_config" in e:
        from splitwise_jax.specs.hf_config import load_hf_config  # I/O at the edge, only when asked

        cfg = Path(e["hf_config"]).expanduser()
        cfg = cfg if cfg.is_absolute() else path.parent / cfg
        return load_hf_config(cfg, name=e["name"], weight_dtype=e.get("weight_dtype"), kv_dtype=e.get("kv_dtype"))
    if ("n_params" in e) == ("vocab_size" in e):
        raise ValueError("give exactly one of n_params (the count) or vocab_size (count it from the architecture)")
    if "weight_dtype" in e and "bytes_per_param" in e:
        raise ValueError("give weight_dtype or the legacy bytes_per_param, not both")
    if "bytes_per_param" in e:
        weights = dtype_from_bytes(e["bytes_per_param"])
        kv = weights  # the legacy field sized weights and KV cache alike
    else:
        weights = canonical_dtype(e.get("weight_dtype", "fp16"), "weight_dtype")
        kv = weights if weights != "fp8" else "bf16"  # an fp8 checkpoint's activations are bf16
    kv = canonical_dtype(e["kv_dtype"], "kv_dtype") if "kv_dtype" in e else kv
    moe = MoE(**{"n_moe_layers": e["n_layers"], **e["moe"]}) if "moe" in e else None
    mla = MLA(**e["mla"]) if "mla" in e else None
    arch = dict(n_layers=e["n_layers"], d_model=e["d_model"], n_heads=e["n_heads"], n_kv_heads=e["n_kv_heads"],
                d_ff=e["d_ff"], head_dim=e.get("head_dim"), moe=moe, mla=mla)
    if "vocab_size" in e:
        n = float(param_count(vocab_size=e["vocab_size"], tied_embeddings=e.get("tied_embeddings", False),
                              qkv_bias=e.get("qkv_bias", False), **arch))
    else:
        if "tied_embeddings" in e or "qkv_bias" in e:
            raise ValueError("tied_embeddings and qkv_bias only count parameters: give them with vocab_size")
        n = e["n_params"]
    return LLM(name=e["name"], n_params=n, weight_dtype=weights, kv_dtype=kv, **arch)


def load_specs(path: str | Path) -> dict[str, list[str]]:
    """Read GPUs, machines and LLMs from a TOML or JSON file and register them.

    The file has arrays `gpu`, `machine` and `llm` (any may be absent), with fields
    named in marketing units, e.g. ``[[gpu]] name = "b200" peak_tflops = 2250 ...``.
    An `llm` entry may instead point at a local Hugging Face config.json,
    ``hf_config = "path"`` (relative to the spec file). See docs/specs.md for the full
    schema. Machines may name a GPU defined in the same file or in the catalogue.

    Returns:
        the names registered, by kind.

    Raises:
        ValueError: unreadable file, unknown section, missing or malformed fields; the
            message names the file, the entry and the field.
    """
    path = Path(path)
    data = read_table_file(path, "spec file")
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
                    register_llm(_llm_from_entry(path, e))
            except ValueError as err:
                raise ValueError(f"spec file {path}: {kind}[{i}] ({e['name']}): {err}") from None
            names[kind].append(e["name"])
    return names
