"""Command-line arguments shared by `evaluate`, `optimize` and `simulate`: the design (a
preset, a design file or pool flags), the model (catalogue, spec file or a local Hugging
Face config.json, with precision overrides), the workload (a preset, or a trace file
replayed with its own arrivals unless --resample-poisson) and the provenance of each
pool's phase parameters, as the outputs print it. One grammar: a flag means the same in
every command that takes it (tests/test_cli_grammar.py).

Every check raises ValueError naming the flag; the CLIs wrap these calls in
`_cli.input_errors`, which turns them into exit status 2 with the message.
"""

from __future__ import annotations

import argparse
import math

from pathlib import Path

from splitwise_jax.cli import _cli
from splitwise_jax.cli._table import pool_lines  # noqa: F401 - re-exported: the command lines' pool lines
from splitwise_jax.specs import catalog
from splitwise_jax.cluster.designs import Design, get_design
# The preset names and their aliases: `workload.workload`'s own table (one home), so that
# "is this --workload a trace file?" is answered here exactly as `workload` answers it.
from splitwise_jax.cluster.workload import _PRESET_ALIASES as _PRESET_WORKLOADS
from splitwise_jax.specs.llm import LLM, canonical_dtype
from splitwise_jax.phases.provenance import Provenance

DEFAULT_MODEL = "bloom-176b"
_POOL_FORM = "MACHINE[,MACHINE...][:COUNT][@CAP][/TP]"


def add_design_arguments(ap: argparse.ArgumentParser, *, counts: bool) -> None:
    """--design-file, --prompt-pool, --token-pool, --colocated-pool, --chunked-prefill.

    Args:
        counts: the CLI needs pool counts (evaluate) rather than searching them (optimize).
    """
    what = "COUNT required" if counts else "COUNT optional: a count fixes the pool; several machines are searched"
    ap.add_argument("--design-file", metavar="FILE", help="TOML/JSON design file: pools, link, scheduler "
                                                           "(docs/designs.md)")
    ap.add_argument("--prompt-pool", metavar="SPEC", help=f"prompt pool {_POOL_FORM}, e.g. dgx-h100:27 ({what})")
    ap.add_argument("--token-pool", metavar="SPEC", help=f"token pool {_POOL_FORM}, e.g. dgx-h100:3@0.7")
    ap.add_argument("--colocated-pool", metavar="SPEC", help=f"one pool running both phases, {_POOL_FORM}, "
                                                              "e.g. dgx-h100:40")
    if counts:
        ap.add_argument("--chunked-prefill", type=_cli.positive_float, metavar="TOKENS",
                        help="chunked prefill on a colocated design with this prompt-token budget per iteration")
    else:
        ap.add_argument("--chunked-prefill", metavar="TOKENS[,TOKENS...]",
                        help="chunked prefill on a colocated design; several budgets are searched")


#: What --workload means in every command (evaluate, optimize, simulate).
WORKLOAD_HELP = ("coding or conversation (Poisson arrivals), or a trace CSV (SplitwiseSim, Azure or "
                 "arrival_s,prompt_tokens,output_tokens): its own arrival times are replayed (--rate compresses or "
                 "stretches them to that mean rate); --resample-poisson draws Poisson arrivals with its sizes instead")


def add_resample_argument(ap: argparse.ArgumentParser) -> None:
    """--resample-poisson: a trace given as --workload gives its sizes only (Poisson arrivals)."""
    ap.add_argument("--resample-poisson", action="store_true",
                    help="with a trace CSV as --workload: Poisson arrivals at --rate (default the trace's mean "
                         "rate) with sizes drawn from the trace, instead of replaying its own arrival times")


def trace_file(name) -> Path | None:
    """The trace file a --workload names, or None for a preset (coding, conversation).

    The rule is `workload.workload`'s: a preset name first, then an existing file.

    Raises:
        ValueError: neither a preset nor an existing file (naming --workload and what is
            accepted).
    """
    if str(name).lower() in _PRESET_WORKLOADS:
        return None
    p = Path(name)
    if not p.is_file():
        raise ValueError(f"--workload {str(name)!r} is neither a preset nor an existing trace file; accepted presets: "
                         f"{sorted(_PRESET_WORKLOADS)}, or a path to a trace CSV")
    return _cli.input_file("--workload", p)


def arrival_from_args(args) -> str | None:
    """`workload.workload`'s `arrival` for the arguments: None (a trace replays its own
    arrivals, a preset is Poisson) or "poisson" with --resample-poisson on a trace.

    Raises:
        ValueError: --resample-poisson with a preset (it has no arrivals of its own).
    """
    if not getattr(args, "resample_poisson", False):
        return None
    if trace_file(args.workload) is None:
        raise ValueError(f"--resample-poisson resamples a trace CSV given as --workload; {args.workload!r} is a "
                         "preset, whose arrivals are Poisson already")
    return "poisson"


def replay_trace(path, rate_per_s: float | None = None):
    """A trace file's requests at their own arrival times, rescaled to `rate_per_s` if
    given (`simulate.trace.replay`).

    Raises:
        ValueError: a malformed trace, or a rate for a trace without an arrival span.
    """
    from splitwise_jax.simulate import trace as trace_mod

    return trace_mod.replay(path, rate_per_s)


def workload_from_args(args, rate_per_s=None):
    """The `Workload` of --workload (with --resample-poisson) at `rate_per_s` (None: the
    preset's 70 req/s or the trace's own mean rate)."""
    from splitwise_jax.cluster.workload import workload as load_workload

    return load_workload(args.workload, rate_per_s=rate_per_s, arrival=arrival_from_args(args))


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    """--model, --specs, --hf-config, --weight-dtype, --kv-dtype."""
    ap.add_argument("--model", help=f"LLM name from the catalogue or a --specs file (default {DEFAULT_MODEL}, or "
                                    "the --hf-config model)")
    ap.add_argument("--specs", metavar="FILE", help="TOML/JSON spec file of extra GPUs, machines, LLMs (docs/specs.md)")
    ap.add_argument("--hf-config", metavar="PATH", help="a local Hugging Face config.json (or its folder) as the "
                                                        "model; named by --model if given")
    ap.add_argument("--weight-dtype", help="override the model's weight precision (fp16, bf16, fp8, ...)")
    ap.add_argument("--kv-dtype", help="override the model's KV-cache precision (fp16, bf16, fp8, ...)")
    add_params_argument(ap)


def add_params_argument(ap: argparse.ArgumentParser) -> None:
    """--params NAME|FILE: the phase-parameter stack (docs/serving.md)."""
    ap.add_argument("--params", default=None, metavar="NAME|FILE",
                    help="phase-parameter stack: paper-2023 (default: the fit to the 2023 profiles, what reproduces "
                         "the paper), vllm-2026 (the fit to public vLLM benchmarks on H100), or a params file "
                         "written by `python -m splitwise_jax.calibrate`")


def params_path_from_args(args):
    """The params file of --params (a stack name or a path); None for the default stack."""
    from splitwise_jax.phases.params import resolve_params

    if getattr(args, "params", None) is None:
        return None
    return resolve_params(args.params)


def model_from_args(args) -> LLM:
    """Load --specs and --hf-config, then the model with any precision overrides."""
    if args.specs is not None:
        catalog.load_specs(_cli.input_file("--specs", args.specs))
    if args.hf_config is not None:
        from splitwise_jax.specs.hf_config import load_hf_config  # file reading, only when asked

        try:
            llm = load_hf_config(args.hf_config, name=args.model)
        except ValueError as e:
            raise ValueError(f"--hf-config: {e}") from None
    else:
        name = args.model or DEFAULT_MODEL
        if name not in catalog.llm_names():
            raise ValueError(f"--model must be one of {catalog.llm_names()}, got {name!r}")
        llm = catalog.get_llm(name)
    changes = {}
    if args.weight_dtype is not None:
        changes["weight_dtype"] = canonical_dtype(args.weight_dtype, "--weight-dtype")
    if args.kv_dtype is not None:
        changes["kv_dtype"] = canonical_dtype(args.kv_dtype, "--kv-dtype")
    if changes:
        tag = ",".join(f"{k.split('_')[0]}={v}" for k, v in changes.items())
        llm = llm.replace(name=f"{llm.name}[{tag}]", **changes)
    return llm


def _pool_flags(args) -> list[tuple[str, str, str]]:
    return [(flag, getattr(args, attr), role) for flag, attr, role in (
        ("--prompt-pool", "prompt_pool", "prompt"), ("--token-pool", "token_pool", "token"),
        ("--colocated-pool", "colocated_pool", "colocated")) if getattr(args, attr) is not None]


def design_from_args(args, *, preset_sizes=None, chunked_prefill: float | None = None,
                     default_design: str = "splitwise-hh") -> Design:
    """The design the arguments describe: a --design-file, pool flags, or a preset.

    Args:
        args: parsed arguments (add_design_arguments' and --design).
        preset_sizes: (first pool, token pool) counts for a preset (evaluate), or None
            to leave them unset (optimize searches them).
        chunked_prefill: a prompt-token budget that makes a colocated design chunked.
        default_design: the preset when none of the three is given.
    """
    from splitwise_jax.io.design_file import load_design, parse_pool_flag

    flags = _pool_flags(args)
    sources = [s for s, on in (("--design", args.design is not None), ("--design-file", args.design_file is not None),
                               ("pool flags", bool(flags))) if on]
    if len(sources) > 1:
        raise ValueError(f"give one of --design NAME, --design-file FILE or pool flags (--prompt-pool/--token-pool or "
                         f"--colocated-pool), not {' and '.join(sources)}")
    if args.design_file is not None:
        design = load_design(_cli.input_file("--design-file", args.design_file))
    elif flags:
        roles = sorted(r for _, _, r in flags)
        if roles not in (["colocated"], ["prompt", "token"]):
            raise ValueError("pool flags: give --prompt-pool and --token-pool (Splitwise), or --colocated-pool alone")
        pools = tuple(parse_pool_flag(flag, text, role) for flag, text, role in flags)
        design = Design("custom-" + ("colocated" if roles == ["colocated"] else "split"), pools)
    else:
        design = get_design(args.design or default_design)
        if preset_sizes is not None:
            design = design.with_counts(*preset_sizes)
    budget = chunked_prefill
    if budget is not None:
        if design.strategy.token_pool:
            raise ValueError(f"--chunked-prefill applies to a colocated design, not {design.name!r} (Splitwise runs "
                             "whole prompts on its prompt pool)")
        design = design.replace(chunked_prefill_tokens=float(budget),
                                name=design.name.replace("baseline-", "chunked-"))
    for p in design.pools:
        for m in p.machines:
            if m not in catalog.machine_names():
                raise ValueError(f"the {p.role} pool's machine must be one of {catalog.machine_names()} (or a --specs "
                                 f"file's), got {m!r}")
    return design


def is_preset(args) -> bool:
    return args.design_file is None and not _pool_flags(args)


def check_counts(design: Design) -> None:
    """Every pool has a count and one machine type (evaluate), or ValueError."""
    for p in design.pools:
        if p.count is None:
            raise ValueError(f"the {p.role} pool of {design.name!r} has no count: give MACHINE:COUNT "
                             "(or count = N in the design file)")
        if len(p.machines) > 1:
            raise ValueError(f"the {p.role} pool of {design.name!r} lists {len(p.machines)} machines; evaluate takes "
                             "one per pool (lists are for optimize)")


def _nan_to_none(x: float):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def provenance_dict(prov: Provenance, capped: bool) -> dict:
    """A pool's `provenance` JSON object: label, kind, source GPU, expected MAPE (under a
    cap when the pool is capped), basis and notes; unknown errors are null."""
    prompt, token = prov.expected_mape_pct(capped)
    return {"label": prov.label, "kind": prov.kind, "calibrated": prov.kind == "calibrated",
            "source_gpu": prov.source_gpu, "expected_mape_pct": {"prompt": _nan_to_none(prompt),
                                                                 "token": _nan_to_none(token)},
            "capped": capped, "basis": prov.basis, "notes": list(prov.notes), "stack": prov.stack}


def pools_dict(cluster, params_path=None, phase_model: str = "calibrated") -> list[dict]:
    """One JSON object per pool: role, machine, GPU, count, cap, tp and `provenance`."""
    from splitwise_jax.cluster.designs import cluster_pools, pool_provenance

    provs = dict(pool_provenance(cluster, params_path))
    out = []
    for role, t, n in cluster_pools(cluster):
        cap = float(t.cap_frac)
        out.append({"role": role, "machine": t.machine.name, "gpu": t.machine.gpu.name, "count": float(n),
                    "cap_frac": cap, "tp": t.machine.gpus_per_machine, "phase_model": phase_model,
                    "provenance": provenance_dict(provs[role], cap < 1.0 - 1e-9)})
    return out


def preset_sizes(ap, a) -> tuple[float, float]:
    """Pool sizes of a named design from --machines / --prompt-machines / --token-machines
    (evaluate's and simulate's; argparse error on a wrong combination)."""
    from splitwise_jax.cluster.designs import PRESETS

    name = a.design or "splitwise-hh"
    strategy = PRESETS[name].strategy
    if not strategy.token_pool:
        if a.machines is None or a.prompt_machines is not None or a.token_machines is not None:
            ap.error(f"--design {name} is {strategy.label}: give --machines N (and not --prompt/--token-machines)")
        return a.machines, 0.0
    if a.prompt_machines is None or a.token_machines is None or a.machines is not None:
        ap.error(f"--design {name} needs --prompt-machines P and --token-machines T (not --machines)")
    return a.prompt_machines, a.token_machines


def sizes_from_args(ap, a) -> tuple[float, float] | None:
    """A named design's pool sizes (`preset_sizes`), or None for a design file or pool
    flags, where --machines / --prompt-machines / --token-machines are an argparse error
    (the counts are the pools')."""
    if is_preset(a):
        return preset_sizes(ap, a)
    if a.machines is not None or a.prompt_machines is not None or a.token_machines is not None:
        ap.error("--machines / --prompt-machines / --token-machines size a named --design; with --design-file or "
                 "pool flags the counts are the pools' (MACHINE:COUNT, count = N)")
    return None


def model_and_design(a, sizes):
    """The LLM and the checked design a cluster command's flags name (evaluate's and
    simulate's shared grammar): `--model`/`--hf-config`, the design flags with the
    preset's pool sizes, `--chunked-prefill` and `--transfer`."""
    llm = model_from_args(a)
    design = design_from_args(a, preset_sizes=sizes, chunked_prefill=a.chunked_prefill)
    check_counts(design)
    if a.transfer is not None:
        design = design.replace(transfer_mode=a.transfer)
    return llm, design
