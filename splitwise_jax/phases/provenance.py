"""Where a GPU's phase parameters come from, and how far to trust them.

The phase model is fitted to measured profiles of two GPUs (A100-80GB, H100-80GB; the
params file's per-GPU entries). Any other GPU runs on the parameters of the *nearest
calibrated GPU* applied to its own spec sheet: peak FLOP/s, HBM bandwidth, TDP, NVLink
enter the phase model directly, and the fixed costs scale with HBM bandwidth
(`phases` module docstring). That is the spec-ratio transfer the calibration's split (c)
measures: fit on the A100 alone, predict the H100 from its spec sheet.

Nearest: smallest Euclidean distance in (log dense fp16 FLOP/s, log HBM bandwidth), the
two spec-sheet figures the prompt and decode phases scale with. H200, B200 and MI300X
all transfer from the H100.

Expected error: the held-out MAPE of the shipped calibration, read from
`splitwise_jax/data/held_out_errors.json`, which `summarise_errors_csv` derives from
`calibration/errors.csv` (tests/test_phases.py checks they agree):

    calibrated GPU:  split (a), random 80:20 held out, that GPU's rows
    transferred GPU: split (c), spec transfer A100 -> H100 (prompt ~9.7%, token ~4.6%)
    under a power cap: the same splits' capped H100 rows (split (c): prompt ~21.5%),
    since the power-cap (DVFS) model transfers worse than the uncapped one.

A transfer to a GPU nearer than the A100 is to the H100 (the usual case) is probably
better than split (c) says; split (c) is the only measurement there is.

Example:
    >>> params, prov = params_for("h200-141gb")
    >>> prov.label, prov.expected_prompt_mape_pct > 0
    ('transferred-from:h100-80gb', True)
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from splitwise_jax._paths import PACKAGE_DATA
from splitwise_jax.specs.catalog import get_gpu, gpu_names
from splitwise_jax.specs.hardware import GPU
from splitwise_jax.specs.llm import LLM
from splitwise_jax.phases.params import PRIOR, PhaseParams, load_params

HELD_OUT_ERRORS_FILE = PACKAGE_DATA / "held_out_errors.json"
# errors.csv hardware names: the capped rows are the H100 at 70% of TDP
_CAPPED_HARDWARE = "h100-80gb-pcap"
KINDS = ("calibrated", "transferred", "shared", "prior")


class Provenance(NamedTuple):
    """Where one GPU's phase parameters come from and their expected error.

    Attributes:
        gpu: the GPU asked about.
        kind: "calibrated" (fitted to its own profiles), "transferred" (the nearest
            calibrated GPU's parameters on this GPU's spec sheet), "shared" (a params
            file without per-GPU fits: its shared values, error unknown) or "prior" (no
            fitted parameters ship; physical defaults, error unknown).
        source_gpu: the GPU whose parameters are used (= gpu when calibrated; None for
            shared and prior).
        expected_prompt_mape_pct, expected_token_mape_pct: expected mean absolute
            percentage error of prompt / decode iteration times (held-out, %), NaN if unknown.
        expected_prompt_mape_capped_pct, expected_token_mape_capped_pct: the same under
            a power cap below TDP.
        basis: which held-out measurement the expectations come from.
        notes: what else the numbers extrapolate beyond (fp8 compute, MoE, MLA): the
            profiles are of dense fp16 models.
    """

    gpu: str
    kind: str
    source_gpu: str | None
    expected_prompt_mape_pct: float
    expected_token_mape_pct: float
    expected_prompt_mape_capped_pct: float
    expected_token_mape_capped_pct: float
    basis: str
    notes: tuple[str, ...] = ()
    #: the parameter stack: a shipped stack's name (`params.STACKS`) or the file's path
    stack: str = "paper-2023"

    @property
    def label(self) -> str:
        """"calibrated", "transferred-from:<gpu>", "shared" or "prior": the flag to print with results."""
        return f"transferred-from:{self.source_gpu}" if self.kind == "transferred" else self.kind

    def expected_mape_pct(self, capped: bool = False) -> tuple[float, float]:
        """(prompt, token) expected MAPE in %, under a power cap or not."""
        if capped:
            return self.expected_prompt_mape_capped_pct, self.expected_token_mape_capped_pct
        return self.expected_prompt_mape_pct, self.expected_token_mape_pct


def summarise_errors_csv(path: str | Path) -> dict:
    """Held-out MAPE (%) per split and hardware from a calibration errors.csv.

    Error = |model / measured - 1| per held-out configuration (all seeds pooled), as in
    calibration/README.md. Returns ``{split: {hardware: {"prompt": %, "token": %, "n": rows}}}``.
    """
    import pandas as pd

    df = pd.read_csv(path)
    out: dict = {}
    for (split, hw), g in df.groupby(["split", "hardware"], sort=True):
        out.setdefault(split, {})[hw] = {
            "prompt": round(100.0 * float((g["model_prompt_time"] / g["prompt_time"] - 1.0).abs().mean()), 2),
            "token": round(100.0 * float((g["model_token_time"] / g["token_time"] - 1.0).abs().mean()), 2),
            "n": int(len(g)),
        }
    return out


@lru_cache(maxsize=1)
def held_out_errors() -> dict:
    """The shipped held-out MAPE table (`summarise_errors_csv` of calibration/errors.csv)."""
    return json.loads(HELD_OUT_ERRORS_FILE.read_text())["mape_pct"]


def _mape(split: str, hardware: str) -> tuple[float, float]:
    row = held_out_errors().get(split, {}).get(hardware)
    return (float(row["prompt"]), float(row["token"])) if row else (math.nan, math.nan)


def _gpu(gpu: GPU | str) -> GPU:
    return gpu if isinstance(gpu, GPU) else get_gpu(gpu)


def calibrated_gpus(path: str | Path | None = None) -> tuple[str, ...]:
    """Catalogue GPUs the params file carries fitted values of their own for."""
    shared = load_params(None, path)
    return tuple(g for g in gpu_names() if load_params(g, path) != shared)


def spec_distance(a: GPU, b: GPU) -> float:
    """Distance between two spec sheets: Euclidean in (log fp16 FLOP/s, log HBM bandwidth)."""
    return math.hypot(math.log(float(a.peak_flops_per_s) / float(b.peak_flops_per_s)),
                      math.log(float(a.hbm_bw_bytes_per_s) / float(b.hbm_bw_bytes_per_s)))


def nearest_calibrated_gpu(gpu: GPU | str, path: str | Path | None = None) -> str | None:
    """The calibrated GPU whose spec sheet is nearest (`spec_distance`); None if none is."""
    g = _gpu(gpu)
    cands = calibrated_gpus(path)
    if not cands:
        return None
    return min(cands, key=lambda c: (spec_distance(g, get_gpu(c)), c))


def _notes(llm: LLM | None) -> tuple[str, ...]:
    if llm is None:
        return ()
    notes = []
    if llm.fp8_compute:
        notes.append("fp8 weights and GEMMs: the efficiencies are fitted on fp16 profiles")
    if llm.moe is not None:
        notes.append("MoE: expert traffic and per-expert GEMM efficiency are not in the profiles")
    if llm.mla is not None:
        notes.append("MLA: latent KV cache and absorbed attention are not in the profiles")
    if llm.kv_dtype == "fp8":
        notes.append("fp8 KV cache: attention bandwidth efficiency is fitted on fp16 caches")
    return tuple(notes)


def provenance(gpu: GPU | str, llm: LLM | None = None, path: str | Path | None = None) -> Provenance:
    """Where `gpu`'s phase parameters come from, with the expected error (module docstring).

    Args:
        gpu: a GPU or its catalogue name.
        llm: optionally the model, to note what beyond the profiles it relies on.
        path: params file (default: the shipped fit).
    """
    g = _gpu(gpu)
    notes = _notes(llm)
    stack = _stack_label(path)
    serving = _serving_stack(path)
    if serving is not None:
        return _serving_provenance(g, serving, notes, stack)
    calibrated = calibrated_gpus(path)
    if not calibrated:
        nan = math.nan
        if load_params(None, path) == PRIOR:
            return Provenance(g.name, "prior", None, nan, nan, nan, nan, "no fitted parameters: physical prior",
                              notes, stack)
        return Provenance(g.name, "shared", None, nan, nan, nan, nan,
                          "the params file's shared values; it fits no GPU of its own", notes, stack)
    capped = _mape("random" if g.name in calibrated else "spec_transfer", _CAPPED_HARDWARE)
    if g.name in calibrated:
        own = _mape("random", g.name)
        return Provenance(g.name, "calibrated", g.name, *own, *capped,
                          f"split (a) held-out rows of {g.name}; capped: of {_CAPPED_HARDWARE}", notes, stack)
    src = nearest_calibrated_gpu(g, path)
    transfer = _mape("spec_transfer", "h100-80gb")
    return Provenance(g.name, "transferred", src, *transfer, *capped,
                      "split (c) spec transfer A100 -> H100 (uncapped rows; capped: h100-80gb-pcap)", notes, stack)


def _stack_label(path) -> str:
    from splitwise_jax.phases.params import FITTED_PARAMS_FILE, stack_name

    p = FITTED_PARAMS_FILE if path is None else Path(path)
    return stack_name(p) or str(p)


def _serving_stack(path):
    """The params file's content when it is a stack fitted to serving benchmarks, else None."""
    from splitwise_jax.phases.params import FITTED_PARAMS_FILE, read_params_file

    p = FITTED_PARAMS_FILE if path is None else Path(path)
    if not p.exists():
        return None
    content = read_params_file(p)
    return content if content.meta.get("kind") == "serving-benchmarks" else None


def _serving_provenance(g: GPU, content, notes, stack: str) -> Provenance:
    """A serving-benchmark stack: its GPU is calibrated, with the stack's own
    leave-one-model-out errors as the expectation (TTFT P50 for prompts, TPOT P50 for
    decode: the benchmark's percentiles, not iteration times); any other GPU runs on its
    values through its own spec sheet, and the only measurement of such a transfer is the
    2023 stack's split (c)."""
    fitted = str(content.meta.get("gpu", ""))
    exp = content.meta.get("expected_error_pct", {})
    nan = math.nan
    if g.name == fitted:
        return Provenance(g.name, "calibrated", g.name, float(exp.get("ttft p50", nan)),
                          float(exp.get("tpot p50", nan)), nan, nan,
                          f"stack {stack}: leave-one-model-out over its serving benchmarks (TTFT P50 and TPOT P50 "
                          "of a model never fitted)", notes, stack)
    transfer = _mape("spec_transfer", "h100-80gb")
    return Provenance(g.name, "transferred", fitted or None, *transfer, nan, nan,
                      f"stack {stack} on this GPU's spec sheet; expected error from the paper-2023 stack's split (c) "
                      "spec transfer A100 -> H100, the only measured transfer", notes, stack)


def params_for(gpu: GPU | str, llm: LLM | None = None, path: str | Path | None = None
               ) -> tuple[PhaseParams, Provenance]:
    """The phase parameters `gpu` runs on, and their `Provenance`.

    A calibrated GPU gets its own fit; any other the nearest calibrated GPU's, applied to
    its own spec sheet by the phase model; with no fit shipped, the prior.

    Example:
        >>> params, prov = params_for("b200-180gb")
        >>> prov.kind, prov.source_gpu
        ('transferred', 'h100-80gb')
    """
    prov = provenance(gpu, llm, path)
    if prov.source_gpu is None:
        return load_params(None, path), prov
    return load_params(prov.source_gpu, path), prov
