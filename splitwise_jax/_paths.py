"""Where the project finds the shared reference data (read by path, never copied).

The shared folder holds the measured profiles, the Azure traces and the reference
simulator's runs. It defaults to ``../shared`` next to the repository (or next to the
current directory) and can be overridden with the ``SPLITWISE_SHARED`` environment
variable. Everything the package needs at run time that it derived itself (fitted
parameters, compact workload distributions) ships in ``splitwise_jax/data``.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

PACKAGE_DATA = Path(__file__).resolve().parent / "data"
_REPO_ROOT = Path(__file__).resolve().parent.parent


def shared_dir() -> Path | None:
    """The shared folder, or None when it cannot be found."""
    env = os.environ.get("SPLITWISE_SHARED")
    candidates = [Path(env)] if env else []
    candidates += [_REPO_ROOT.parent / "shared", Path.cwd().parent / "shared", Path.cwd() / "shared"]
    for c in candidates:
        if c.is_dir():
            return c.resolve()
    return None


def shared_path(*parts: str) -> Path:
    """A path inside the shared folder; raises FileNotFoundError naming the override."""
    base = shared_dir()
    if base is None:
        raise FileNotFoundError(
            "the shared data folder was not found (looked for ../shared); set "
            "SPLITWISE_SHARED=/path/to/shared or pass the file path explicitly"
        )
    p = base.joinpath(*parts)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist in the shared folder {base}")
    return p


def profiles_csv() -> Path:
    return shared_path("data", "splitwise_sim_profiles", "perf_model.csv")


def azure_trace_csv(name: str) -> Path:
    files = {"coding": "AzureLLMInferenceTrace_code.csv", "conversation": "AzureLLMInferenceTrace_conv.csv"}
    if name not in files:
        raise ValueError(f"azure trace name must be one of {sorted(files)}, got {name!r}")
    return shared_path("data", "azure_llm_2023", files[name])


def validation_dir() -> Path:
    return shared_path("validation")


@functools.lru_cache(maxsize=1)
def package_digest() -> str:
    """sha256 over every file of the installed package (path and bytes): part of the key
    of everything kept on disk that the code computed (`_exported`, `_array_cache`,
    `cli.simulate_warm`). No JAX here, so a warm simulation can key its records without it."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()

