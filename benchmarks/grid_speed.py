"""Speed of the paper's Fig. 12 design-space grid: prompt x token machines, one load.

Splitwise-HH serving the coding workload at 70 req/s (Splitwise §VI-B, Fig. 12), every
(prompt, token) machine count from 1 to 39: 1,521 clusters at full resolution (28 x 32
request classes), evaluated by `splitwise_jax.sweep.sweep` over every local device (one
per core on CPU: `use_cpu_cores`) and, for comparison, on one device. Reported per case:
compile time, run time once compiled (best of `--repeats`), CPU time of that run.

Answers: every percentile (TTFT, TBT, E2E as times and slowdowns, P50/P90/P99) of every
configuration against a reference, as the largest and the 99.9th percentile of
|relative difference| over all 1,521 x 18 values (and over those not overloaded):
* `converged`: the same model with the percentile search run to convergence (32 grid
  points, 8 Newton steps), which is what every faster setting must reproduce;
* `--compare-with DIR`: the same grid computed by another checkout of this repository
  (e.g. the previous commit: ``git worktree add /tmp/prev HEAD~1``), in a subprocess
  with that checkout first on the path: the previous solver, kept out of the package.

The sweep resolution (`SWEEP_RESOLUTION`, float32 inputs; issue 40 item 3) is also
compared with full resolution in float64 (goal: median 1 %, worst 3 % of every
percentile).

Also the natural idiom, `jax.jit(jax.vmap(sj.evaluate))` on one device (goal, issue
40: within 1.5x of `sweep` on one device), and the model function vmapped as it was
before `sj.evaluate` had its batching rule (`cluster.evaluate`: slow, select `--cases`).

Goal (GitHub issue 12): 1 s per grid once compiled (stretch 0.1 s), same answers as the
previous solver within 0.5%.

Usage:
    python benchmarks/grid_speed.py [--n 39] [--repeats 3] [--compare-with /tmp/prev] [--json PATH]
        [--cases "1 device,vmap"]   # only the cases whose names contain one of these
    SPLITWISE_SMOKE=1 python benchmarks/grid_speed.py     # 6 x 6 counts, one repeat (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from splitwise_jax.sweep import use_cpu_cores

# One device per core: must run before JAX starts its backend.
N_DEVICES = use_cpu_cores()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)

import splitwise_jax as sj  # noqa: E402
from splitwise_jax.cluster.cluster import SWEEP_RESOLUTION, Resolution, evaluate  # noqa: E402
from splitwise_jax.cluster.designs import make_cluster  # noqa: E402
from splitwise_jax.sweep import sweep  # noqa: E402
from splitwise_jax.cluster.workload import workload  # noqa: E402

SMOKE = os.environ.get("SPLITWISE_SMOKE", "") not in ("", "0")
MAX_MACHINES = 39  # Fig. 12's axes: 1..39 prompt and token machines
METRICS = ("ttft_s", "tbt_s", "e2e_s", "slowdown_ttft", "slowdown_tbt", "slowdown_e2e")
CONVERGED = Resolution(grid_points=32, refine_iters=8, search_dtype=None)  # float64 throughout
# A worker run in a subprocess against another checkout: it uses only what every
# version of the package has (evaluate, make_cluster, workload).
_WORKER = """
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from splitwise_jax.cluster.cluster import evaluate
from splitwise_jax.cluster.designs import make_cluster
from splitwise_jax.cluster.workload import workload
rate, counts, out = float(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
cluster, wl = make_cluster("splitwise-hh", 1.0, 1.0), workload("coding", rate)
rows = jnp.asarray([[p, t] for p in counts for t in counts], float)
f = jax.jit(lambda r: jax.lax.map(lambda x: evaluate(cluster.replace(n_prompt=x[0], n_token=x[1]), wl), r,
                                  batch_size=13))
t0 = time.perf_counter(); m = jax.block_until_ready(f(rows)); first = time.perf_counter() - t0
t0 = time.perf_counter(); c0 = time.process_time(); m = jax.block_until_ready(f(rows))
run, cpu = time.perf_counter() - t0, time.process_time() - c0
names = ("ttft_s", "tbt_s", "e2e_s", "slowdown_ttft", "slowdown_tbt", "slowdown_e2e")
np.savez(out, q=np.stack([np.asarray(getattr(m, k)) for k in names], 1), status=np.asarray(m.status),
         compile_s=first - run, run_s=run, cpu_s=cpu)
"""


def _percentiles(m) -> np.ndarray:
    """(N, 6, 3) every percentile triple of every configuration."""
    return np.stack([np.asarray(getattr(m, k), np.float64) for k in METRICS], axis=1)


def _row_fn(resolution: Resolution):
    def fn(row, cluster, wl):
        m = evaluate(cluster.replace(n_prompt=row[0], n_token=row[1]), wl, resolution=resolution)
        return {"q": jnp.stack([getattr(m, k) for k in METRICS]), "status": m.status}
    return fn


_FNS: dict = {}


def run_case(cluster, wl, rows, resolution, devices, batch_size, repeats, x64=True):
    """Compile and time one sweep; returns timings and the percentiles (N, 6, 3)."""
    key = (resolution, x64)
    fn = _FNS.setdefault(key, _row_fn(resolution))  # one function object per case: its program is cached
    with jax.enable_x64(x64):
        dtype = jnp.float64 if x64 else jnp.float32
        cl, w, r = jax.tree.map(lambda a: np.asarray(a, dtype), (cluster, wl, rows))
        t0 = time.perf_counter()
        sweep(fn, r, (cl, w), batch_size=batch_size, devices=devices)
        first = time.perf_counter() - t0
        times, cpus = [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            out = sweep(fn, r, (cl, w), batch_size=batch_size, devices=devices)
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
    best = int(np.argmin(times))
    return dict(compile_s=first - times[best], run_s=times[best], cpu_s=cpus[best],
                q=out["q"].astype(np.float64), status=out["status"])


def run_vmap_case(cluster, wl, rows, repeats, model=sj.evaluate):
    """The natural idiom: `jax.jit(jax.vmap(sj.evaluate))` over the rows on the default
    device (sj.evaluate's batching rule maps them one at a time on CPU); with
    `model=cluster.evaluate`, the model function vectorised (sj.evaluate before its rule)."""
    def fn(row, c, w):
        m = model(c.replace(n_prompt=row[0], n_token=row[1]), w)
        return {"q": jnp.stack([getattr(m, k) for k in METRICS]), "status": m.status}

    f = jax.jit(jax.vmap(fn, in_axes=(0, None, None)))
    r = jnp.asarray(rows, jnp.float64)
    t0 = time.perf_counter()
    jax.block_until_ready(f(r, cluster, wl))
    first = time.perf_counter() - t0
    times, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = jax.block_until_ready(f(r, cluster, wl))
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    best = int(np.argmin(times))
    return dict(compile_s=first - times[best], run_s=times[best], cpu_s=cpus[best],
                q=np.asarray(out["q"], np.float64), status=np.asarray(out["status"]))


def compare(q, ref, status=None) -> dict:
    d = np.abs(q / ref - 1.0)
    out = dict(max=float(np.max(d)), p999=float(np.quantile(d, 0.999)), over_half_pct=int(np.sum(d > 5e-3)),
               values=int(d.size), nonfinite=int(np.sum(~np.isfinite(q))))
    if status is not None:
        ok = (np.asarray(status).astype(int) & 3) == 0
        out["max_not_overloaded"] = float(np.max(d[ok])) if ok.any() else float("nan")
    return out


def previous(compare_with: str, rate: float, counts) -> dict:
    """The grid from another checkout (its own solver), in a subprocess."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "prev.npz")
        env = dict(os.environ, PYTHONPATH=os.path.abspath(compare_with))
        env.pop("XLA_FLAGS", None)
        proc = subprocess.run([sys.executable, "-c", _WORKER, str(rate), json.dumps([float(c) for c in counts]), path],
                              capture_output=True, text=True, env=env, cwd=tmp)
        if proc.returncode:
            raise SystemExit(f"--compare-with {compare_with}: the worker failed:\n{proc.stderr[-3000:]}")
        z = np.load(path)
        return dict(q=z["q"], status=z["status"], compile_s=float(z["compile_s"]), run_s=float(z["run_s"]),
                    cpu_s=float(z["cpu_s"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=6 if SMOKE else MAX_MACHINES,
                    help=f"machine counts per pool, spread over 1..{MAX_MACHINES}")
    ap.add_argument("--rate", type=float, default=70.0, help="arrival rate, req/s")
    ap.add_argument("--repeats", type=int, default=1 if SMOKE else 3, help="timed runs after compiling")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="configurations per lax.map block per device (default: sweep's, 1 on CPU)")
    ap.add_argument("--compare-with", metavar="DIR", help="another checkout (e.g. the previous commit's worktree)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures here")
    ap.add_argument("--cases", help="comma-separated substrings: run only the cases whose names contain one "
                                    "(the converged reference always runs)")
    args = ap.parse_args(argv)
    if args.n < 1 or args.repeats < 1:
        ap.error("--n and --repeats must be >= 1")

    counts = np.round(np.linspace(1, MAX_MACHINES, args.n))
    rows = np.stack(np.meshgrid(counts, counts, indexing="ij"), axis=-1).reshape(-1, 2)
    cluster = jax.tree.map(np.asarray, make_cluster("splitwise-hh", 1.0, 1.0))
    wl = jax.tree.map(np.asarray, workload("coding", args.rate))
    devices = jax.devices()
    cases = {
        f"float64, {len(devices)} devices": (Resolution(), devices, True),
        "float64, 1 device": (Resolution(), devices[:1], True),
        f"float64, float64 search, {len(devices)} devices": (Resolution(search_dtype=None), devices, True),
        f"float32, {len(devices)} devices": (Resolution(), devices, False),
        f"sweep resolution, float32, {len(devices)} devices": (SWEEP_RESOLUTION, devices, False),
        "jit(vmap(sj.evaluate)), 1 device": sj.evaluate,
        "jit(vmap(cluster.evaluate)), 1 device": evaluate,
        "converged (reference)": (CONVERGED, devices, True),
    }
    if args.cases:
        keep = [c.strip() for c in args.cases.split(",")]
        cases = {k: v for k, v in cases.items() if "reference" in k or any(c in k for c in keep)}
    else:  # the vectorised model function (~35 s a grid) only when asked for
        cases = {k: v for k, v in cases.items() if "cluster.evaluate" not in k}
    results = {name: (run_vmap_case(cluster, wl, rows, args.repeats, case) if callable(case) else
                      run_case(cluster, wl, rows, case[0], case[1], args.batch_size, args.repeats, case[2]))
               for name, case in cases.items()}
    ref = results["converged (reference)"]
    prev = previous(args.compare_with, args.rate, counts) if args.compare_with else None

    n_cfg = len(rows)
    print(f"Fig. 12 grid: splitwise-hh, coding at {args.rate:g} req/s, {args.n} x {args.n} = {n_cfg} clusters, "
          f"{wl.weights.shape[0]}x{wl.weights.shape[1]} classes, {os.cpu_count()} CPUs, {N_DEVICES} devices, "
          f"JAX {jax.__version__} ({jax.default_backend()})")
    print("differences: |relative| over all 18 percentiles of every configuration (max / 99.9th pct / count > 0.5%)")
    header = (f"{'case':38} {'compile s':>9} {'run s':>7} {'cpu s':>7} {'cfg/s':>7}  {'vs converged':>28}"
              + (f"  {'vs --compare-with':>28}" if prev else ""))
    print(header)
    print("-" * len(header))
    rows_out = {}
    for name, r in list(results.items()) + ([("previous commit (--compare-with)", prev)] if prev else []):
        c = compare(r["q"], ref["q"])
        line = (f"{name:38} {r['compile_s']:9.1f} {r['run_s']:7.3f} {r['cpu_s']:7.3f} {n_cfg / r['run_s']:7.0f}  "
                f"{c['max']:9.2e} {c['p999']:9.2e} {c['over_half_pct']:8d}")
        entry = dict(compile_s=r["compile_s"], run_s=r["run_s"], cpu_s=r["cpu_s"], vs_converged=c)
        if prev:
            cp = compare(r["q"], prev["q"], prev["status"])
            line += f"  {cp['max']:9.2e} {cp['p999']:9.2e} {cp['over_half_pct']:8d}"
            entry["vs_compare_with"] = cp
        print(line)
        rows_out[name] = entry
    full = results.get(f"float64, {len(devices)} devices")
    for name, r in results.items():
        if name.startswith("sweep resolution") and full is not None:
            d = np.abs(r["q"] / full["q"] - 1.0)
            entry = dict(median=float(np.median(d)), max=float(np.max(d)), p99=float(np.quantile(d, 0.99)))
            rows_out[name]["vs_full_resolution"] = entry
            verdict = "met" if entry["median"] <= 0.01 and entry["max"] <= 0.03 else "NOT met"
            print(f"{name} against full resolution (float64): median {entry['median']:.2e}, 99th pct "
                  f"{entry['p99']:.2e}, largest {entry['max']:.2e} (goal, issue 40: median 1 %, worst 3 %: {verdict}); "
                  f"{full['run_s'] / r['run_s']:.2f}x faster")
    best = min(r["run_s"] for name, r in results.items() if "reference" not in name)
    if args.n == MAX_MACHINES:
        print(f"goal: under 1 s per grid once compiled; fastest case {best:.2f} s: {'met' if best < 1.0 else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(n=args.n, rate=args.rate, devices=N_DEVICES, cases=rows_out), fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
