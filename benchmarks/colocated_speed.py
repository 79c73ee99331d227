"""Build and run cost of a colocated (baseline) pool's programs.

Colocated pools batch queued prompts (docs/cluster.md §2, `pool._batched_rates`), which
puts more rows through the phase model in their Newton loop. This measures what that
costs, on Baseline-H100 x 40, coding at 70 req/s (28 x 32 classes, float64, XLA's
defaults, no persistent cache):

* `evaluate`'s E2E percentiles: lower and compile (s), one call (ms, best of 20);
* the gradient of log TTFT P90 in the arrival rate: the same (best of 10);
* the values, so two checkouts can be compared for their answers.

Usage:
    python benchmarks/colocated_speed.py [--rounds 2] [--json PATH]
    python benchmarks/colocated_speed.py --compare-with /path/to/other/checkout
      (runs both checkouts alternately, each round in fresh processes)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def measure() -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    import splitwise_jax as sj

    cluster = sj.make_cluster("baseline-h100", 40)
    wl = sj.load_workload("coding", 70.0)
    jax.jit(jnp.sin).lower(1.0).compile()  # JAX's own first-use costs, outside the measurement
    out = {"package": str(Path(sj.__file__).resolve().parents[1])}

    def timed(fn, arg, repeats):
        t0 = time.perf_counter()
        compiled = jax.jit(fn).lower(arg).compile()
        build = time.perf_counter() - t0
        value = jax.block_until_ready(compiled(arg))
        runs = []
        for _ in range(repeats):
            t = time.perf_counter()
            jax.block_until_ready(compiled(arg))
            runs.append(time.perf_counter() - t)
        return dict(build_s=round(build, 2), run_ms=round(1e3 * min(runs), 2),
                    value=[float(x) for x in np.atleast_1d(np.asarray(value))])

    out["evaluate"] = timed(lambda w: sj.evaluate(cluster, w).e2e_s, wl, 20)
    out["gradient"] = timed(jax.grad(lambda r: jnp.log(sj.evaluate(cluster, wl.with_rate(r)).ttft_s[1])), 70.0, 10)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--child" in argv:  # measured under the checkout on PYTHONPATH: import nothing from this one's root
        print(json.dumps(measure()))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.program_size import child_results, compare_parser  # one way to compare checkouts

    ap = compare_parser(__doc__)
    ap.add_argument("--rounds", type=int, default=2, help="fresh processes per checkout, alternating")
    args = ap.parse_args(argv)
    rows = child_results(__file__, args.compare_with, args.rounds)
    print(f"{'checkout':40s} {'program':9s} {'build s':>16s} {'run ms':>16s}  value")
    for path, runs in rows.items():
        for prog in ("evaluate", "gradient"):
            b = [r[prog]["build_s"] for r in runs]
            t = [r[prog]["run_ms"] for r in runs]
            build, run = f"{min(b):.2f}-{max(b):.2f}", f"{min(t):.2f}-{max(t):.2f}"
            print(f"{path[-40:]:40s} {prog:9s} {build:>16s} {run:>16s}  {runs[0][prog]['value']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
