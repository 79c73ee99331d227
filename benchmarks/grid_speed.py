"""Speed of the paper's Fig. 12 design-space grid: prompt x token machines, one load.

Splitwise-HH serving the coding workload at 70 req/s (Splitwise §VI-B, Fig. 12), every
(prompt, token) machine count from 1 to 39: 1,521 clusters evaluated by one jitted
function (vmapped over token machines, `lax.map` over prompt machines in blocks so the
working set stays in cache). Reported per configuration (full-resolution workload and
`coarsen(wl, 16, 16)`, float32 and float64): compile time, run time once compiled
(best of a few repeats), and how far the coarse or float32 answers move from the
full-resolution float64 ones (median and max |relative difference| of TTFT, TBT and E2E
P50/P90/P99 over the configurations that are not overloaded).

Goal (GitHub issue 4): under a second per grid on 2 CPU cores once compiled.

Usage:
    python benchmarks/grid_speed.py [--n 39] [--rate 70] [--repeats 3] [--phase-model calibrated]
    SPLITWISE_SMOKE=1 python benchmarks/grid_speed.py     # 6 x 6 counts over 1..39 (CI)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from splitwise_jax.cluster import evaluate
from splitwise_jax.designs import PHASE_MODELS, make_cluster
from splitwise_jax.workload import coarsen, workload

SMOKE = os.environ.get("SPLITWISE_SMOKE", "") not in ("", "0")
MAX_MACHINES = 39  # Fig. 12's axes: 1..39 prompt and token machines
BLOCK = 13  # prompt-machine rows per lax.map step: 13 x 39 clusters per vmapped block


def grid_fn(cluster, wl, n_prompt, n_token):
    """Metrics on the (n_prompt, n_token) grid; leading axes (len(n_prompt), len(n_token))."""

    def row(n_p):
        return jax.vmap(lambda n_t: evaluate(cluster.replace(n_prompt=n_p, n_token=n_t), wl))(n_token)

    return jax.lax.map(row, n_prompt, batch_size=min(BLOCK, n_prompt.shape[0]))


def build(rate: float, phase_model: str):
    """The cluster and both workloads, built once in float64 so that every case
    evaluates the same numbers (only their precision differs)."""
    with jax.enable_x64(True):
        full = workload("coding", rate)
        cluster = make_cluster("splitwise-hh", 1.0, 1.0, phase_model=phase_model)
        to_np = (lambda t: jax.tree.map(np.asarray, t))
        return to_np(cluster), {False: to_np(full), True: to_np(coarsen(full, 16, 16))}


def run_case(cluster, wl, n: int, x64: bool, repeats: int):
    """Compile and run one configuration; returns timings and the metrics as numpy."""
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        cluster, wl = jax.tree.map(lambda a: jnp.asarray(a, dtype), (cluster, wl))
        # 1..39 for the paper's grid; a smaller n spreads n counts over the same range.
        counts = jnp.asarray(np.round(np.linspace(1, MAX_MACHINES, n)), dtype)
        t0 = time.perf_counter()
        compiled = jax.jit(grid_fn).lower(cluster, wl, counts, counts).compile()
        compile_s = time.perf_counter() - t0
        times, cpu = [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            out = jax.block_until_ready(compiled(cluster, wl, counts, counts))
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        out = jax.tree.map(lambda a: np.asarray(a, np.float64), out)
        classes = f"{wl.weights.shape[0]}x{wl.weights.shape[1]}"
    best = int(np.argmin(times))
    return dict(compile_s=compile_s, run_s=times[best], cpu_s=cpu[best], classes=classes, out=out)


def _rel_diff(out, ref):
    ok = (ref.status.astype(int) & 3) == 0  # neither pool overloaded in the reference
    diffs = []
    for name in ("ttft_s", "tbt_s", "e2e_s"):
        a, b = getattr(out, name)[ok], getattr(ref, name)[ok]
        diffs.append(np.abs(a / b - 1.0).ravel())
    d = np.concatenate(diffs)
    nan_frac = float(np.mean(~np.isfinite(np.concatenate([getattr(out, n).ravel() for n in ("ttft_s", "e2e_s")]))))
    return (float(np.median(d)) if d.size else float("nan")), (float(np.max(d)) if d.size else float("nan")), nan_frac


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=6 if SMOKE else MAX_MACHINES,
                    help=f"machine counts per pool, spread over 1..{MAX_MACHINES}")
    ap.add_argument("--rate", type=float, default=70.0, help="arrival rate, req/s")
    ap.add_argument("--repeats", type=int, default=1 if SMOKE else 3, help="timed runs after compiling")
    ap.add_argument("--phase-model", default="calibrated", choices=PHASE_MODELS)
    args = ap.parse_args(argv)
    if args.n < 1 or args.repeats < 1:
        ap.error("--n and --repeats must be >= 1")

    cases = [(x64, coarse) for x64 in (True, False) for coarse in (False, True)]
    cluster, workloads = build(args.rate, args.phase_model)
    results = {}
    for x64, coarse in cases:
        results[(x64, coarse)] = run_case(cluster, workloads[coarse], args.n, x64, args.repeats)
    ref = results[(True, False)]["out"]

    print(f"Fig. 12 grid: splitwise-hh, coding at {args.rate:g} req/s, {args.n} x {args.n} = {args.n ** 2} clusters "
          f"(1..{MAX_MACHINES} machines per pool), "
          f"{args.phase_model} phase model, {os.cpu_count()} CPUs, JAX {jax.__version__} ({jax.default_backend()})")
    print("differences: |relative| vs full-resolution float64, TTFT/TBT/E2E P50/P90/P99, "
          "configurations not overloaded")
    # cpu s: CPU time of the process over the run (all threads); on a loaded machine
    # wall time exceeds cpu s / cores.
    header = f"{'dtype':7} {'workload':16} {'compile s':>9} {'run s':>7} {'cpu s':>7} {'ms/cluster':>10} " \
             f"{'median diff':>11} " \
             f"{'max diff':>9} {'non-finite':>10}"
    print(header)
    print("-" * len(header))
    for x64, coarse in cases:
        r = results[(x64, coarse)]
        med, mx, nonfinite = _rel_diff(r["out"], ref)
        wl_name = ("coarse " if coarse else "full ") + r["classes"]
        print(f"{'float64' if x64 else 'float32':7} {wl_name:16} {r['compile_s']:9.1f} {r['run_s']:7.3f} "
              f"{r['cpu_s']:7.3f} "
              f"{1e3 * r['run_s'] / args.n ** 2:10.3f} {med:11.2e} {mx:9.2e} {nonfinite:10.1%}")
    best = min(r["run_s"] for r in results.values())
    if args.n == MAX_MACHINES:
        print(f"goal: under 1 s per grid once compiled; fastest case {best:.2f} s: "
              f"{'met' if best < 1.0 else 'NOT met'}")
    else:
        print(f"goal (under 1 s) applies to the full {MAX_MACHINES} x {MAX_MACHINES} grid, not this {args.n} x {args.n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
