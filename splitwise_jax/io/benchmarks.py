"""Serving-benchmark tables: one row per measured load stage of an engine (file I/O).

The format is the columns of ``validation/real_vllm_h100/runs.csv`` (measured with
kubernetes-sigs/inference-perf against vLLM; source: github.com/inference-sim/training,
credit it wherever those numbers appear). A row says what ran (model, GPUs, engine
settings), what it was asked (workload shape, load stage) and, when measured, what came
out (latency percentiles, throughput). `read_benchmarks` is the one reader; it checks
every column it uses and raises ValueError naming the file, the row and the column.

Required columns (what a prediction needs):
    model                 Hugging Face id (catalogue ids resolve, `HF_MODEL_IDS`) or a
                          catalogue name; other models come from `--specs`/`--hf-config`.
    tensor_parallel       GPUs of the server = tensor-parallel degree (integer >= 1).
    max_num_batched_tokens  the chunked-prefill token budget per iteration.
    max_num_seqs          the most requests in a batch.
    output_len_target     tokens generated per request (ignore_eos: exact).
    rate_per_s            offered load of the stage (requests/s).
    duration_s            length of the stage (s).
Optional columns (defaults in brackets):
    experiment [row index], stage [0], stage_start_s [stages in file order],
    arrivals ["constant"; or "poisson"], max_model_len [4096],
    system_prompt_len [0], question_len [0], n_system_prompts [1],
    users_per_system_prompt [1], multi_turn [False], ignore_eos [True],
    prompt_tokens_mean [system_prompt_len + question_len] (the prompt as the server
    tokenised it; preferred when present), gpu_memory_utilization [0.9],
    enable_prefix_caching [True], gpu ["h100-sxm"].
Measured columns (used by the calibration and the error tables when present):
    completed, failed, throughput_req_per_s, {ttft,tpot,itl,e2e}_{mean,p50,p90,p99}_s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from splitwise_jax.cluster.metrics import KEYS

REQUIRED = ("model", "tensor_parallel", "max_num_batched_tokens", "max_num_seqs", "output_len_target",
            "rate_per_s", "duration_s")
OPTIONAL_DEFAULTS = {
    "stage": 0, "arrivals": "constant", "max_model_len": 4096, "system_prompt_len": 0, "question_len": 0,
    "n_system_prompts": 1, "users_per_system_prompt": 1, "multi_turn": False, "ignore_eos": True,
    "gpu_memory_utilization": 0.9, "enable_prefix_caching": True, "gpu": "h100-sxm",
}
METRICS = ("ttft", "tpot", "e2e")
LEVELS = KEYS  # "p50", "p90", "p99"
MEASURED = tuple(f"{m}_{q}_s" for m in METRICS for q in LEVELS)
ARRIVALS = ("constant", "poisson")

#: Hugging Face ids of catalogue models (case-insensitive match on the id).
HF_MODEL_IDS = {
    "meta-llama/llama-2-7b-hf": "llama2-7b",
    "meta-llama/llama-2-7b-chat-hf": "llama2-7b",
    "meta-llama/llama-2-13b-hf": "llama2-13b",
    "meta-llama/llama-2-13b-chat-hf": "llama2-13b",
    "meta-llama/llama-2-70b-hf": "llama2-70b",
    "meta-llama/llama-2-70b-chat-hf": "llama2-70b",
    "codellama/codellama-34b-hf": "codellama-34b",
    "codellama/codellama-34b-instruct-hf": "codellama-34b",
    "codellama/codellama-34b-python-hf": "codellama-34b",
    "mistralai/mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mistralai/mixtral-8x7b-instruct-v0.1": "mixtral-8x7b",
    "meta-llama/llama-3.1-8b": "llama3.1-8b",
    "meta-llama/llama-3.1-8b-instruct": "llama3.1-8b",
    "meta-llama/meta-llama-3.1-8b": "llama3.1-8b",
    "meta-llama/meta-llama-3.1-8b-instruct": "llama3.1-8b",
    "meta-llama/llama-3.1-70b": "llama3.1-70b",
    "meta-llama/llama-3.1-70b-instruct": "llama3.1-70b",
    "meta-llama/meta-llama-3.1-70b": "llama3.1-70b",
    "meta-llama/meta-llama-3.1-70b-instruct": "llama3.1-70b",
    "meta-llama/llama-3.1-405b": "llama3.1-405b",
    "meta-llama/llama-3.1-405b-instruct": "llama3.1-405b",
    "qwen/qwen2.5-72b": "qwen2.5-72b",
    "qwen/qwen2.5-72b-instruct": "qwen2.5-72b",
    "deepseek-ai/deepseek-v3": "deepseek-v3",
    "bigscience/bloom": "bloom-176b",
}

#: Server GPUs a row may name (`gpu` column) -> catalogue GPU. H100 SXM is the catalogue's
#: h100-80gb (989 dense TFLOP/s, 3.35 TB/s, NVLink 900 GB/s bidirectional, 700 W).
GPU_IDS = {"h100-sxm": "h100-80gb", "h100": "h100-80gb", "h100-80gb": "h100-80gb", "a100-80gb": "a100-80gb",
           "a100": "a100-80gb", "h200": "h200-141gb", "h200-141gb": "h200-141gb", "b200": "b200-180gb",
           "b200-180gb": "b200-180gb", "mi300x": "mi300x-192gb", "mi300x-192gb": "mi300x-192gb"}


def resolve_model_name(model: str) -> str | None:
    """The catalogue name of a Hugging Face id or catalogue name; None when unknown."""
    from splitwise_jax.specs.catalog import llm_names

    key = str(model).strip()
    if key in llm_names():
        return key
    return HF_MODEL_IDS.get(key.lower())


@dataclass(frozen=True)
class BenchmarkTable:
    """A read benchmark file: the validated frame plus where it came from."""

    frame: "object"  # pandas.DataFrame, one row per load stage, defaults filled
    source: str

    def __len__(self) -> int:
        return len(self.frame)

    def measured(self, column: str) -> np.ndarray:
        """A measured column as floats (NaN where absent)."""
        if column not in self.frame.columns:
            return np.full(len(self.frame), np.nan)
        return self.frame[column].to_numpy(dtype=float)


def _bool(v, where: str) -> bool:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no", "", "nan"):
        return False
    raise ValueError(f"{where} must be true or false, got {v!r}")


def read_benchmarks(path: str | Path) -> BenchmarkTable:
    """Read and validate a benchmark CSV (module docstring lists the columns).

    Raises:
        ValueError: a missing file, a missing required column, or a value out of range;
            the message names the file, the row (1-based, header excluded) and the column.
    """
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--benchmarks {p}: no such file")
    try:
        df = pd.read_csv(p)
    except Exception as e:  # pandas raises several types for malformed CSV
        raise ValueError(f"--benchmarks {p}: cannot be read as CSV ({e})") from None
    return validate_benchmarks(df, str(p))


def validate_benchmarks(df, source: str = "<frame>") -> BenchmarkTable:
    """Validate a frame of benchmark rows (the same checks as `read_benchmarks`)."""
    import pandas as pd

    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"--benchmarks {source}: missing required columns {missing}; required: {list(REQUIRED)}")
    if len(df) == 0:
        raise ValueError(f"--benchmarks {source}: no rows")
    df = df.copy().reset_index(drop=True)
    for c, v in OPTIONAL_DEFAULTS.items():
        if c not in df.columns:
            df[c] = v
        else:
            df[c] = df[c].where(pd.notna(df[c]), v)
    if "experiment" not in df.columns:
        df["experiment"] = [f"row{i + 1}" for i in range(len(df))]
    ints = {"tensor_parallel": 1, "max_num_batched_tokens": 1, "max_num_seqs": 1, "output_len_target": 1,
            "max_model_len": 1, "system_prompt_len": 0, "question_len": 0, "n_system_prompts": 1,
            "users_per_system_prompt": 1, "stage": 0}
    for i, row in df.iterrows():
        where = f"--benchmarks {source} row {i + 1}"
        for c, lo in ints.items():
            v = row[c]
            try:
                fv = float(v)
            except (TypeError, ValueError):
                raise ValueError(f"{where}: column {c!r} must be an integer >= {lo}, got {v!r}") from None
            if not math.isfinite(fv) or fv != int(fv) or fv < lo:
                raise ValueError(f"{where}: column {c!r} must be an integer >= {lo}, got {v!r}")
        for c in ("rate_per_s", "duration_s"):
            try:
                fv = float(row[c])
            except (TypeError, ValueError):
                fv = float("nan")
            if not (math.isfinite(fv) and fv > 0):
                raise ValueError(f"{where}: column {c!r} must be a finite number > 0, got {row[c]!r}")
        u = float(row["gpu_memory_utilization"])
        if not (0.05 <= u <= 1.0):
            raise ValueError(f"{where}: column 'gpu_memory_utilization' must lie in [0.05, 1], got {u!r}")
        if str(row["arrivals"]).strip().lower() not in ARRIVALS:
            raise ValueError(f"{where}: column 'arrivals' must be one of {list(ARRIVALS)}, got {row['arrivals']!r}")
        if str(row["gpu"]).strip().lower() not in GPU_IDS:
            raise ValueError(f"{where}: column 'gpu' must be one of {sorted(GPU_IDS)}, got {row['gpu']!r}")
        for c in ("multi_turn", "ignore_eos", "enable_prefix_caching"):
            _bool(row[c], f"{where}: column {c!r}")
        prompt = _prompt_tokens(row)
        if not (prompt >= 1):
            raise ValueError(f"{where}: the prompt is empty (give prompt_tokens_mean, or system_prompt_len + "
                             "question_len >= 1)")
        if prompt + float(row["output_len_target"]) > float(row["max_model_len"]):
            raise ValueError(f"{where}: prompt ({prompt:g}) + output_len_target ({row['output_len_target']}) "
                             f"exceeds max_model_len ({row['max_model_len']})")
    df["arrivals"] = df["arrivals"].map(lambda s: str(s).strip().lower())
    df["gpu"] = df["gpu"].map(lambda s: str(s).strip().lower())
    for c in ("multi_turn", "ignore_eos", "enable_prefix_caching"):
        df[c] = [_bool(v, c) for v in df[c]]
    if "stage_start_s" not in df.columns:
        df["stage_start_s"] = np.nan
    for c in MEASURED + ("throughput_req_per_s", "completed", "failed"):
        if c in df.columns:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return BenchmarkTable(df, source)


def _prompt_tokens(row) -> float:
    v = row.get("prompt_tokens_mean", float("nan")) if hasattr(row, "get") else float("nan")
    try:
        v = float(v)
    except (TypeError, ValueError):
        v = float("nan")
    if math.isfinite(v) and v > 0:
        return v
    return float(row["system_prompt_len"]) + float(row["question_len"])


def prompt_tokens(row) -> float:
    """The prompt length of a row (tokens): `prompt_tokens_mean` when given, else
    `system_prompt_len + question_len`."""
    return _prompt_tokens(row)


def kept_up(table: BenchmarkTable) -> np.ndarray:
    """Measured: whether each stage kept up with its load (no failed requests and a
    completed rate within 5% of the offered one); True where not measured.

    The 5%: a stage that keeps up completes rate x duration requests over duration plus
    one request's latency, a few per cent less per second for these stage lengths
    (10-20 s of E2E over 600-1200 s stages).
    """
    df = table.frame
    ok = np.ones(len(df), dtype=bool)
    if "failed" in df.columns:
        budget = 0.001 * (df["rate_per_s"] * df["duration_s"]).to_numpy(dtype=float)
        ok &= ~(df["failed"].fillna(0).to_numpy(dtype=float) > budget)
    if "throughput_req_per_s" in df.columns:
        thr = df["throughput_req_per_s"].to_numpy(dtype=float)
        ok &= ~(np.isfinite(thr) & (thr < 0.95 * df["rate_per_s"].to_numpy(dtype=float)))
    return ok
