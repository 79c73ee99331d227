"""Size and build cost of the compiled programs a cold or warm run pays for.

A warm `optimize` run spends most of its time tracing and loading programs, a cold one
compiling them (docs/speed.md §4), so the size of the cluster model's programs is what
to measure. For the Fig. 12 optimiser's objective (Splitwise-HH, coding at 70 req/s,
16x16 classes: the sum of the constraint margins plus the objective, as the augmented
Lagrangian reads them), forward and `value_and_grad`:

* StableHLO lines of the lowered program;
* Python function calls while tracing it (deterministic: the tracing cost without the
  shared machine's noise) and the seconds tracing, lowering and compiling took;
* one compiled call's run time (best of 10), and the value, so two checkouts can be
  compared for equal answers.

Usage:
    python benchmarks/program_size.py [--json PATH]
    python benchmarks/program_size.py --compare-with /path/to/other/checkout
      (runs this script under that checkout's package too, side by side)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path


def measure(design: str = "splitwise-hh") -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    from splitwise_jax.cluster.cluster import Resolution
    from splitwise_jax.cluster.designs import make_cluster
    from splitwise_jax.optimize import spec as S
    from splitwise_jax.optimize.problem import Problem
    from splitwise_jax.cluster.workload import coarsen, workload

    spec, _ = S.make_spec(make_cluster(design, 1, 1), coarsen(workload("coding", 70.0), 16, 16), Problem())
    res = Resolution()
    phys = jnp.array([26.0, 6.0, 1.0, 1.0, 70.0])

    def objective(p):
        _, g, f = S.assess(spec, p, res)
        return jnp.sum(g) + f

    jax.jit(jnp.sin).trace(1.0)  # JAX's own first-use costs, outside the measurement
    out = {"package": str(Path(S.__file__).resolve().parents[2])}
    for name, fn in (("forward", objective), ("gradient", jax.value_and_grad(objective))):
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        traced = jax.jit(fn).trace(phys)
        prof.disable()
        t1 = time.perf_counter()
        lowered = traced.lower()
        t2 = time.perf_counter()
        lines = len(lowered.as_text().splitlines())
        compiled = lowered.compile()
        t3 = time.perf_counter()
        value = compiled(phys)
        jax.block_until_ready(value)
        runs = []
        for _ in range(10):
            t = time.perf_counter()
            jax.block_until_ready(compiled(phys))
            runs.append(time.perf_counter() - t)
        first = value[0] if name == "gradient" else value
        out[name] = dict(stablehlo_lines=lines, trace_python_calls=pstats.Stats(prof, stream=io.StringIO()).total_calls,
                         trace_s=round(t1 - t0, 2), lower_s=round(t2 - t1, 2), compile_s=round(t3 - t2, 2),
                         run_ms=round(1e3 * min(runs), 2), value=float(np.asarray(first)))
        if name == "gradient":
            out[name]["grad"] = [float(x) for x in np.asarray(value[1])]
    return out


def _table(rows: dict) -> str:
    keys = ("stablehlo_lines", "trace_python_calls", "trace_s", "lower_s", "compile_s", "run_ms", "value")
    lines = [f"{'checkout':40s} {'program':9s} " + " ".join(f"{k:>18s}" for k in keys)]
    for label, r in rows.items():
        for prog in ("forward", "gradient"):
            lines.append(f"{label[-40:]:40s} {prog:9s} " + " ".join(f"{r[prog][k]:>18}" for k in keys))
    return "\n".join(lines)


def compare_parser(doc: str) -> argparse.ArgumentParser:
    """The options of a benchmark that runs itself under one or two checkouts: the
    other checkout, where to write the figures, and the hidden child mode."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--compare-with", help="another checkout of this repository (e.g. a git worktree)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return ap


def child_results(script: str, compare_with: str | None, rounds: int = 1) -> dict[str, list[dict]]:
    """`script --child` under this checkout's package and, with `compare_with`, that
    one's (PYTHONPATH), alternating for `rounds` rounds, each run a fresh process (imports
    and caches do not mix); per checkout, the JSON of each run's last line of output."""
    checkouts = [str(Path(script).resolve().parents[1])]
    if compare_with:
        checkouts.append(str(Path(compare_with).resolve()))
    rows = {path: [] for path in checkouts}
    for _ in range(rounds):
        for path in checkouts:
            env = dict(os.environ, PYTHONPATH=path)
            proc = subprocess.run([sys.executable, str(Path(script).resolve()), "--child"], env=env, cwd=path,
                                  capture_output=True, text=True, check=True)
            rows[path].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return rows


def main(argv=None) -> int:
    args = compare_parser(__doc__).parse_args(argv)
    if args.child:
        print(json.dumps(measure()))
        return 0
    rows = {path: runs[0] for path, runs in child_results(__file__, args.compare_with).items()}
    print(_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
