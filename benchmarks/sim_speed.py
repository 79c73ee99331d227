"""The simulator's and a trace evaluation's speed where users feel it (issue 40, item 4).

Three figures, each in fresh processes timed from before the interpreter starts to
its exit (wall, and CPU = user + system of the process and its threads):

* ``setup``: `python -m splitwise_jax.simulate` on the paper's Fig. 12 point
  (Splitwise-HH 27 + 3, the reference's coding trace at 70 req/s, calibrated phases):
  the "timing set-up, metrics" seconds it prints (everything that is not the event
  loop), warm (persistent compilation cache filled by a first run), and the same inside
  one process on its second `simulate` call (``in-process``).
* ``reference``: `simulate` from process start on the reference SplitwiseSim's own runs
  (``../shared/validation``: its ``wall_s`` on the 2-core machine, the same trace file,
  the reference's phase timing ``--phase-model splitwise-sim-table``): each run twice,
  the first building its cluster's plan and tables (the compilation cache warm) and
  the second reading them back (a warm command line, docs/simulate.md); the ratio
  reference wall / ours per run, and its median, for both. ``--reference-runs N`` takes every
  k-th run of the 124 (both tables) so that N are run.
* ``evaluate``: `python -m splitwise_jax.evaluate` (its table; `--json` would add the
  parameter error bars, 80 more evaluations) on a 300 s replay of the Azure 2023 coding
  trace (all 8,819 requests, arrivals compressed linearly onto 300 s as the reference's
  replays were made) on Splitwise-HH 12 + 4, warm.

With ``--compare-with DIR`` (another checkout, e.g. ``git worktree add /tmp/old main``)
every run is made for both trees, alternating, each with its own cache folder; the
table gives both medians and their ratio, and whether the outputs are the same
(simulate: its JSON and its per-request CSV byte for byte; evaluate: its table text,
and its `--json --no-uncertainty` object to 1e-9 relative). Goals (issue 40): set-up <= 0.3 s warm; from process start
>= 20x the reference (median); evaluate <= 5 s warm. On a shared machine compare the
trees side by side, not with figures from another hour.

Usage:
    python benchmarks/sim_speed.py [--repeats 3] [--reference-runs 24] [--compare-with ../old]
    python benchmarks/sim_speed.py --only setup,evaluate
    SPLITWISE_SMOKE=1 python benchmarks/sim_speed.py   # one repeat, 4 reference runs
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMOKE = os.environ.get("SPLITWISE_SMOKE", "") not in ("", "0")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.optimize_speed import answer, same  # noqa: E402  (one comparison of answers)

FIG12 = ["--design", "splitwise-hh", "--prompt-machines", "27", "--token-machines", "3"]
_SETUP_LINE = re.compile(r"simulated in ([0-9.]+) s \(event loop\) \+ ([0-9.]+) s \(timing set-up, metrics\)")

# The second `simulate` of one process: its set-up and metrics (s), printed as JSON.
_IN_PROCESS = """
import json, sys
from splitwise_jax.cli import _cli
_cli.preamble(); _cli.enable_cache()
from splitwise_jax.cluster.designs import make_cluster
from splitwise_jax.simulate import simulate, trace
tr = trace.from_csv(sys.argv[1])
c = make_cluster("splitwise-hh", 27, 3)
simulate(c, tr)
r = simulate(make_cluster("splitwise-hh", 27, 3), tr)
print(json.dumps({"setup_s": r.setup_s + r.report_s, "loop_s": r.wall_s}))
"""


def _shared() -> Path:
    sys.path.insert(0, str(ROOT))
    from splitwise_jax._paths import shared_path
    return shared_path()


def run(args: list[str], cache: str, tree: Path) -> dict:
    """One fresh process `python args` in `tree` with its cache folder: wall, CPU, stdout."""
    env = dict(os.environ, SPLITWISE_JAX_CACHE=cache, PYTHONPATH=str(tree), SPLITWISE_SHARED=str(_shared()))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=tree)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(args[:3])} failed ({proc.returncode}) in {tree}:\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dict(wall_s=wall, cpu_s=cpu, stdout=proc.stdout)


def reference_runs(n: int) -> list[dict]:
    """n of the reference's runs (every k-th of both tables), with their trace files."""
    folder = _shared() / "validation"
    rows = []
    for name in ("splitwisesim_runs.csv", "boundary_runs.csv"):
        with open(folder / name) as f:
            rows += list(csv.DictReader(f))
    for r in rows:
        wl = r["workload"] if not r["rate"] else f"rr_{r['workload']}_{int(float(r['rate']))}_2min"
        r["trace"] = str(folder / "traces" / f"{wl}.csv")
        if r["design"].startswith("baseline"):
            r["args"] = ["--design", r["design"], "--machines", str(int(float(r["machines"])))]
        else:
            r["args"] = ["--design", r["design"], "--prompt-machines", str(int(float(r["prompt_machines"]))),
                         "--token-machines", str(int(float(r["token_machines"])))]
    step = max(1, len(rows) // max(n, 1))
    return rows[::step][:n]


def azure_code_300s(folder: Path) -> Path:
    """The Azure 2023 coding trace, arrivals compressed linearly onto [1, 301] s."""
    sys.path.insert(0, str(ROOT))
    from splitwise_jax._paths import azure_trace_csv
    from splitwise_jax.cluster.workload import load_trace
    df = load_trace(azure_trace_csv("coding"))
    t = df["arrival_s"].to_numpy(float)
    df = df.assign(arrival_s=1.0 + (t - t[0]) * 300.0 / (t[-1] - t[0]))
    path = folder / "azure_code_300s.csv"
    df[["arrival_s", "prompt_tokens", "output_tokens"]].to_csv(path, index=False)
    return path


def _med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1 if SMOKE else 3, help="warm runs of each figure (median)")
    ap.add_argument("--reference-runs", type=int, default=4 if SMOKE else 24,
                    help="reference runs to time (of 124; every k-th)")
    ap.add_argument("--only", default="setup,reference,evaluate", help="comma-separated figures to run")
    ap.add_argument("--compare-with", type=Path, default=None,
                    help="another checkout of the project, timed side by side (alternating)")
    args = ap.parse_args()
    if args.compare_with is not None and not (args.compare_with / "splitwise_jax").is_dir():
        ap.error(f"--compare-with {args.compare_with}: not a checkout of this project (no splitwise_jax/ in it)")
    only = set(args.only.split(","))
    trees = [ROOT] + ([args.compare_with.resolve()] if args.compare_with else [])
    tag = {t: ("this" if t == ROOT else "other") for t in trees}
    code70 = str(_shared() / "validation" / "traces" / "rr_code_70_2min.csv")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        caches = {t: str(tmp / f"cache{i}") for i, t in enumerate(trees)}

        def both(make_args, n, warm_up=True):
            """n rounds alternating the trees (after one warm-up run each): {tree: [runs]}."""
            got = {t: [] for t in trees}
            if warm_up:
                for t in trees:
                    run(make_args(t), caches[t], t)
            for _ in range(n):
                for t in trees:
                    got[t].append(run(make_args(t), caches[t], t))
            return got

        lines = []

        def report(name, values, unit="s", ok=None):
            line = f"{name:<46} " + "  ".join(f"{tag[t]}: {_med(values[t]):8.3f} {unit}" for t in trees)
            if len(trees) > 1:
                line += f"  ratio this/other {_med(values[trees[0]]) / _med(values[trees[1]]):.2f}"
            if ok is not None:
                line += f"  same output: {'yes' if ok else 'NO'}"
            lines.append(line)
            print(line, flush=True)

        if "setup" in only:
            outs = {t: tmp / f"requests_{i}.csv" for i, t in enumerate(trees)}
            sim = lambda t: ["-m", "splitwise_jax.simulate", *FIG12, "--workload", code70,  # noqa: E731
                             "--requests-out", str(outs[t])]
            got = both(sim, args.repeats)
            setup = {t: [float(_SETUP_LINE.search(r["stdout"]).group(2)) for r in got[t]] for t in trees}
            loop = {t: [float(_SETUP_LINE.search(r["stdout"]).group(1)) for r in got[t]] for t in trees}
            ok = None
            if len(trees) > 1:
                ok = outs[trees[0]].read_bytes() == outs[trees[1]].read_bytes()
                js = both(lambda t: ["-m", "splitwise_jax.simulate", *FIG12, "--workload", code70, "--json"], 1,
                          warm_up=False)
                ok = ok and js[trees[0]][0]["stdout"] == js[trees[1]][0]["stdout"]
            report("simulate Fig. 12: set-up + metrics, warm", setup, ok=ok)
            report("simulate Fig. 12: event loop", loop)
            report("simulate Fig. 12: from process start, wall", {t: [r["wall_s"] for r in got[t]] for t in trees})
            report("simulate Fig. 12: from process start, CPU", {t: [r["cpu_s"] for r in got[t]] for t in trees})
            inp = both(lambda t: ["-c", _IN_PROCESS, code70], args.repeats, warm_up=False)
            report("simulate Fig. 12: set-up + metrics, 2nd in process",
                   {t: [json.loads(r["stdout"])["setup_s"] for r in inp[t]] for t in trees})

        if "reference" in only:
            runs = reference_runs(args.reference_runs)
            ratios = {t: [] for t in trees}
            walls = {t: [] for t in trees}
            firsts = {t: [] for t in trees}
            for t in trees:  # fills each tree's compilation cache (the machine types and phase timing)
                run(["-m", "splitwise_jax.simulate", *runs[0]["args"], "--workload", runs[0]["trace"],
                     "--phase-model", "splitwise-sim-table", "--json"], caches[t], t)
            for r in runs:
                a = ["-m", "splitwise_jax.simulate", *r["args"], "--workload", r["trace"],
                     "--phase-model", "splitwise-sim-table", "--json"]
                for t in trees:
                    # the run's first process builds its cluster's plan and tables (kept on
                    # disk where the tree keeps them); the second is the warm run timed
                    firsts[t].append(run(a, caches[t], t)["wall_s"])
                    w = run(a, caches[t], t)["wall_s"]
                    walls[t].append(w)
                    ratios[t].append(float(r["wall_s"]) / w)
            ref = [float(r["wall_s"]) for r in runs]
            print(f"{len(runs)} reference runs, reference wall median {_med(ref):.1f} s "
                  f"({min(ref):.1f}-{max(ref):.1f} s)")
            report("simulate from process start, first run of each", firsts)
            report("simulate from process start, reference runs", walls)
            report("reference wall / ours (median of runs)", ratios, unit="x")
            report("reference wall / ours, first runs", {t: [float(r["wall_s"]) / w for r, w in zip(runs, firsts[t])]
                                                         for t in trees}, unit="x")
            for t in trees:
                print(f"  {tag[t]}: ratio {min(ratios[t]):.1f}-{max(ratios[t]):.1f}x, "
                      f"{sum(x >= 20 for x in ratios[t])} of {len(runs)} runs at >= 20x")

        if "evaluate" in only:
            trace = azure_code_300s(tmp)
            ev = lambda t: ["-m", "splitwise_jax.evaluate", "--design", "splitwise-hh", "--prompt-machines",  # noqa: E731
                            "12", "--token-machines", "4", "--workload", str(trace), "--horizon", "300"]
            got = both(ev, args.repeats)
            ok = None
            if len(trees) > 1:
                js = both(lambda t: ev(t) + ["--json", "--no-uncertainty"], 1, warm_up=False)
                a, b = (answer(json.loads(js[t][0]["stdout"])) for t in trees)
                ok = same(a, b) and got[trees[0]][-1]["stdout"] == got[trees[1]][-1]["stdout"]
            report("evaluate Azure code 300 s replay, warm, wall", {t: [r["wall_s"] for r in got[t]] for t in trees},
                   ok=ok)
            report("evaluate Azure code 300 s replay, warm, CPU", {t: [r["cpu_s"] for r in got[t]] for t in trees})
    if len(trees) > 1:
        print(f"this = {ROOT}; other = {trees[1]}")


if __name__ == "__main__":
    main()
