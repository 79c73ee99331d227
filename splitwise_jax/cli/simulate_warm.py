"""A warm `python -m splitwise_jax.simulate`: the same run without importing JAX.

A simulated run needs JAX only to read the cluster into numbers and tables (`plan`):
the designs, the phase models and their tables are JAX code. Once a command line has
done that for a cluster, the numbers and tables are kept on disk next to the
compilation cache, and a later command line naming the same cluster - whatever its
trace, rate, seed or outputs - reads them back and runs the event loop and the report
with NumPy alone (`api.run_plan`; pandas only to write the CSV outputs): about 0.7 s
less per process, JAX's and pandas' imports (docs/speed.md §10-11).

What names "the same cluster": the command line with its trace, output and progress
arguments and a named design's machine counts taken out (`_TRACE_AND_OUTPUT`,
`_COUNTS`, parsed here by a parser that knows only those and takes no abbreviations;
which count flags were given stays in the key), plus a digest of the package, the Python, NumPy,
JAX and jaxlib installations, and the environment variables that reach the model
(`SPLITWISE_*` but the cache folder's, `JAX_*`, `XLA_*`) and the working folder. A record is written only
when that small parser reads the trace and output arguments as the command's own parser
does, and only for a trace file (a preset workload's Poisson draws come from the
`Workload`, JAX arrays: those runs take the full path). A record answers for any
machine counts: they size only the plan's pools (`SimPlan.prompt.count`,
`.token.count`), the pools' JSON objects and the title and pool lines, which a warm run
writes anew (`_with_counts`); the tables, the config and everything else a run reads do
not depend on them, so the reference's 124 runs (57 clusters) need one record per
design and phase model. Every file the full run read
outside the Python installation, the package and the cache (a design or spec file,
the params, the shared profiles behind the sim table) is recorded with its size and
modification time, and a record whose files changed is not used. Anything that does
not match, or fails, falls back to the full run, which gives the same output (the
tests compare them byte for byte) and reports bad input as always.

Storage: ``<cache>/sim_plans/<key>.json`` (the plan, the config, what the output
prints besides the run) and ``<cache>/sim_plans/tables/<sha256>.npz`` (each table once,
shared by every record that uses it). `--no-cache` neither reads nor writes them.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import io
import json
import os
import sys
from pathlib import Path

import numpy as np

from splitwise_jax.cli import _cli

__all__ = ["run", "key_of", "save", "record_reads", "stop_recording", "LAST_MISS"]

#: why the last `run` did not answer (None when it did): for tests and debugging
LAST_MISS: str | None = None

_VERSION = 2  # 2: records answer for any machine counts
_FOLDER = "sim_plans"
# The arguments that do not name the cluster: the trace and the outputs. Everything
# else on the command line is the cluster's (design, counts, model, phases, link...).
# A named design's machine counts: not the cluster's kind, only its size (`_with_counts`).
_COUNTS = ("machines", "prompt_machines", "token_machines")
_TRACE_AND_OUTPUT = ("workload", "trace", "rate", "resample_poisson", "horizon", "seed", "json", "requests_out",
                     "machines_out", "histogram_out", "progress", "no_progress", "no_cache")


class _ParseError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # noqa: D102 - a miss, not an exit: the full parser reports it
        raise _ParseError(message)


def _parser() -> argparse.ArgumentParser:
    """The trace and output arguments of `simulate.__main__.build_parser`, the same
    names, types and defaults, and nothing else; no abbreviations."""
    ap = _Parser(add_help=False, allow_abbrev=False)
    ap.add_argument("--workload", default=None)
    ap.add_argument("--trace", default=None)
    ap.add_argument("--rate", type=_cli.positive_float)
    ap.add_argument("--resample-poisson", action="store_true")
    ap.add_argument("--horizon", type=_cli.positive_float, default=None)
    ap.add_argument("--seed", type=_cli.nonnegative_int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--requests-out")
    ap.add_argument("--machines-out")
    ap.add_argument("--histogram-out")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--machines", type=_cli.whole_machines)
    ap.add_argument("--prompt-machines", type=_cli.whole_machines)
    ap.add_argument("--token-machines", type=_cli.whole_machines)
    return ap


def split(argv: list[str]) -> tuple[argparse.Namespace, list[str]] | None:
    """(the trace and output arguments, the cluster's tokens in order), or None where
    the small parser cannot read them."""
    try:
        ns, rest = _parser().parse_known_args(list(argv))
    except (_ParseError, argparse.ArgumentError, ValueError, TypeError):
        return None
    return ns, rest


def agrees(ns: argparse.Namespace, full: argparse.Namespace) -> bool:
    """Whether the small parser read the trace, output and count arguments as the full
    one did."""
    return all(getattr(ns, k) == getattr(full, k, None) for k in _TRACE_AND_OUTPUT + _COUNTS)


def counts_of(ns: argparse.Namespace) -> dict:
    """The count flags given: {"prompt_machines": 27, ...}."""
    return {k: getattr(ns, k) for k in _COUNTS if getattr(ns, k) is not None}


def _pool_counts(counts: dict) -> tuple[int, int]:
    """(prompt pool, token pool) machines the count flags give: a colocated design's
    --machines is its one pool, the prompt slot's."""
    return counts.get("prompt_machines", counts.get("machines", 0)), counts.get("token_machines", 0)


def _by_role(counts: dict) -> dict:
    """Machines per pool role (the pools' JSON objects) the count flags give."""
    n_p, n_t = _pool_counts(counts)
    return {"prompt": n_p, "colocated": n_p, "token": n_t}


def _with_counts(record: dict, counts: dict) -> tuple[dict, list, str, list[str]]:
    """(plan, pools, title head, pool lines) of a record at other machine counts."""
    from splitwise_jax.cli._table import pool_lines, title_head

    n_p, n_t = _pool_counts(counts)
    plan = dict(record["plan"], prompt=dict(record["plan"]["prompt"], count=n_p),
                token=dict(record["plan"]["token"], count=n_t))
    by_role = _by_role(counts)
    pools = [dict(p, count=float(by_role[p["role"]])) for p in record["pools"]]
    name, describe, llm_name = record["title_parts"]
    return plan, pools, title_head(name, pools, describe, llm_name), pool_lines(pools)


def _counts_fit(plan, pools: list, counts: dict) -> bool:
    """Whether the count flags size the plan's pools and the pools' objects as
    `_with_counts` assumes (a record is written only where they do)."""
    n_p, n_t = _pool_counts(counts)
    if plan.prompt.count != n_p or plan.token.count != n_t:
        return False
    by_role = _by_role(counts)
    return all(p.get("role") in by_role and p.get("count") == float(by_role[p["role"]]) for p in pools)


def _folder() -> Path:
    return _cli.cache_root() / _FOLDER


def _installed(package: str) -> tuple:
    """(size, mtime) of an installed package's version file, without importing it."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package)
        st = os.stat(os.path.join(os.path.dirname(spec.origin), "version.py"))
        return st.st_size, st.st_mtime_ns
    except (ImportError, AttributeError, TypeError, OSError):
        return (None,)


def _key(rest: list[str], counts: dict) -> str:
    from splitwise_jax._paths import package_digest

    h = hashlib.sha256()
    env = sorted((k, v) for k, v in os.environ.items()
                 if k.startswith(("SPLITWISE_", "JAX_", "XLA_")) and k != "SPLITWISE_JAX_CACHE")
    # the working folder: relative paths on the command line, and where the shared data
    # is looked for (`_paths.shared_dir`)
    for part in (_VERSION, rest, sorted(counts), os.getcwd(), env, sys.version, np.__version__, _installed("jax"),
                 _installed("jaxlib"), package_digest()):
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


# ------------------------------------------------------------------ what a run read

_READS: dict[str, str] = {}  # path -> "file" / "dir"
_RECORDING = [False]


def _skip_prefixes() -> tuple[str, ...]:
    here = Path(__file__).resolve().parents[1]
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(here), str(_cli.cache_root()), "/proc", "/sys",
             "/dev"}
    return tuple(os.path.join(os.path.realpath(r), "") for r in roots if r)


def _hook(event: str, args) -> None:
    if not _RECORDING[0]:
        return
    if event == "open":
        path, mode, flags = args
        if mode is None:
            writing = isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR)
        else:
            writing = any(c in str(mode) for c in "wax+")
        kind = "file"
    elif event in ("os.listdir", "os.scandir"):
        path, writing, kind = args[0], False, "dir"
    else:
        return
    if writing or not isinstance(path, (str, os.PathLike)):
        return
    _READS.setdefault(os.path.realpath(os.fspath(path)), kind)


def record_reads() -> None:
    """Start noting the files and folders this process reads (an audit hook, installed
    once); `save` records them with the plan."""
    if not _RECORDING[0]:
        _READS.clear()
        _RECORDING[0] = True
        if not getattr(sys, "_splitwise_warm_hook", False):
            sys.addaudithook(_hook)
            sys._splitwise_warm_hook = True


def stop_recording() -> None:
    """Stop noting reads (the hook stays installed but does nothing)."""
    _RECORDING[0] = False


def _stat(path: str, kind: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns] if kind == "dir" else [st.st_size, st.st_mtime_ns]


def _reads(exclude: set[str]) -> list:
    _RECORDING[0] = False
    skip = _skip_prefixes()
    out = []
    for path, kind in sorted(_READS.items()):
        if path in exclude or path.startswith(skip):
            continue
        out.append([path, kind, _stat(path, kind)])
    return out


# ------------------------------------------------------------------ tables on disk


def _put(folder: Path, arrays: dict) -> str:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in sorted(arrays.items())})
    blob = buf.getvalue()
    name = hashlib.sha256(blob).hexdigest()[:40] + ".npz"
    path = folder / name
    if not path.exists():
        tmp = path.with_name(f"{name}.{os.getpid()}.tmp")
        tmp.write_bytes(blob)
        tmp.replace(path)  # atomic: a concurrent reader sees all of it or none
    return name


def _get(folder: Path, name: str) -> dict:
    with np.load(folder / name, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _table_record(folder: Path, t) -> dict:
    from splitwise_jax.simulate.plan import table_kind

    rec = {"kind": table_kind(t), "max_tokens": t.max_tokens, "max_batch": t.max_batch,
           "file": _put(folder, t.arrays())}
    if rec["kind"] == "grid":
        rec["max_context"] = t.max_context
    return rec


def _table(folder: Path, rec: dict):
    from splitwise_jax.simulate.tables import GridTable, TokenTable

    arrays = _get(folder, rec["file"])
    if rec["kind"] == "token":
        return TokenTable(rec["max_tokens"], rec["max_batch"], arrays=arrays)
    return GridTable(rec["max_tokens"], rec["max_batch"], rec["max_context"], arrays=arrays)


def key_of(argv: list[str]) -> str | None:
    """The record's key for a command line (None where the small parser cannot read it).
    Take it before the run changes the environment (`_cli.fast_compile` sets XLA_FLAGS)."""
    got = split(argv)
    return None if got is None else _key(got[1], counts_of(got[0]))


def save(key: str | None, argv: list[str], full: argparse.Namespace, *, plan, tables, config, design: dict, pools: list,
         title: tuple[str, str], pool_lines: list[str], trace_path, preset_names,
         title_parts: tuple[str, str, str]) -> None:
    """Keep a full run's plan and tables for later runs of the same cluster (see the
    module docstring); does nothing where the small parser disagrees with the full one,
    and never fails the run (a folder that cannot be written is skipped)."""
    got = split(argv)
    if key is None or got is None or not agrees(got[0], full) or tables.prompt_power is None:
        return
    counts = counts_of(got[0])
    if counts and not _counts_fit(plan, pools, counts):
        return
    try:
        folder = _folder()
        (folder / "tables").mkdir(parents=True, exist_ok=True)
        tf = folder / "tables"
        recs = {name: _table_record(tf, getattr(tables, name))
                for name in ("prompt", "token", "prompt_power", "token_power")}
        recs["alone"] = {"file": _put(tf, {"ttft": tables.alone_ttft_s, "tbt": tables.alone_tbt_s})}
        exclude = {os.path.realpath(os.fspath(trace_path))} if trace_path is not None else set()
        record = {"version": _VERSION, "plan": plan.to_dict(), "config": dataclasses.asdict(config),
                  "tables": recs, "design": design, "pools": pools, "title": list(title), "pool_lines": pool_lines,
                  "counts": counts, "title_parts": list(title_parts),
                  "preset_names": sorted(preset_names), "reads": _reads(exclude)}
        path = folder / f"{key}.json"
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(path)
    except OSError:
        pass


# ------------------------------------------------------------------ the warm run


def _miss(why: str) -> None:
    global LAST_MISS
    LAST_MISS = why


def _trace(ns: argparse.Namespace, preset_names):
    """The run's trace, as `simulate.__main__.make_trace` makes it, for a trace file;
    None for a preset or anything the full path should handle (or report)."""
    from splitwise_jax.simulate import trace as trace_mod

    if ns.trace is not None:  # the deprecated flag: the full path warns
        return None
    name = "coding" if ns.workload is None else ns.workload
    if str(name).lower() in preset_names or not Path(name).is_file():
        return None
    path = _cli.input_file("--workload", Path(name))
    if ns.resample_poisson:
        return trace_mod.resample_poisson(path, ns.rate, 120.0 if ns.horizon is None else ns.horizon, ns.seed)
    if ns.horizon is not None:  # an error the full path reports
        return None
    return trace_mod.replay(path, ns.rate)


def run(argv: list[str], progress_from: int):
    """A warm run of `python -m splitwise_jax.simulate argv`, or None (`LAST_MISS` says
    why) where the full path must run: (result, the JSON object, the output files,
    whether --json, the table's title, the pool lines). A progress bar shows from
    `progress_from` requests on, as in the full path."""
    _miss(None)
    got = split(argv)
    if got is None:
        return _miss("arguments")
    ns, rest = got
    if ns.no_cache:
        return _miss("--no-cache")
    folder = _folder()
    try:
        record = json.loads((folder / f"{_key(rest, counts_of(ns))}.json").read_text())
    except (OSError, ValueError):
        return _miss("no record")
    try:
        if record.get("version") != _VERSION:
            return _miss("version")
        for path, kind, stat in record["reads"]:
            if _stat(path, kind) != stat:
                return _miss(f"changed: {path}")
        tr = _trace(ns, set(record["preset_names"]))
        if tr is None:
            return _miss("not a trace file")
        outs = {flag: (_cli.output_file(flag, path) if path is not None else None) for flag, path in
                (("--requests-out", ns.requests_out), ("--machines-out", ns.machines_out),
                 ("--histogram-out", ns.histogram_out))}
        from splitwise_jax.simulate import engine
        from splitwise_jax.simulate.api import run_plan
        from splitwise_jax.simulate.plan import SimPlan, SimTables
        from splitwise_jax.simulate.policies import SimConfig
        from splitwise_jax.simulate.tables import TablesTooSmall

        config = SimConfig(**record["config"])
        tf = folder / "tables"
        recs = record["tables"]
        alone = _get(tf, recs["alone"]["file"])
        tables = SimTables(*(_table(tf, recs[k]) for k in ("prompt", "token", "prompt_power", "token_power")),
                           alone_ttft_s=alone["ttft"], alone_tbt_s=alone["tbt"])
        if not tables.covers(engine.table_extents(tr, config), int(tr.prompt_tokens.max())):
            return _miss("tables too small")
        show = (ns.progress or len(tr) >= progress_from) and not ns.no_progress
        counts = counts_of(ns)
        if set(counts) != set(record["counts"]):
            return _miss("count flags")
        head, tail = record["title"]
        plan, pools, lines = record["plan"], record["pools"], record["pool_lines"]
        if counts != record["counts"]:
            plan, pools, head, lines = _with_counts(record, counts)
        try:
            res = run_plan(SimPlan.from_dict(plan), tables, tr, config, progress=show)
        except TablesTooSmall:
            return _miss("tables too small")
    except Exception as e:  # noqa: BLE001 - any trouble: the full path runs, and reports bad input
        return _miss(f"{type(e).__name__}: {e}")
    d = dict(res.metrics)
    d["design"] = record["design"]
    d["pools"] = pools
    title = f"{head}{len(tr)} requests ({tr.name}){tail}"
    return res, d, outs, ns.json, title, lines
