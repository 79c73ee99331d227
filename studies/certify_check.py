"""Are certified answers safe to buy, and still the cheapest? (GitHub issue 39.)

`python -m splitwise_jax.optimize` certifies its answer by simulation on seeds 0..K-1
(`splitwise_jax.simulate.certify`). This study runs the command line itself on a set of
provisioning problems (every paper design, both workloads, both paper models, rates
30-110 req/s, cost and power objectives; a random sample of them unless ``--all``), and
judges each certified answer on seeds the certificate never used (``--fresh`` of them,
from 1000):

* **safe**: the certified answer meets every SLO on every fresh seed;
* **minimal**: each one-machine-cheaper neighbour (one prompt machine fewer, one token
  machine fewer; a baseline: one machine fewer) misses an SLO on at least one fresh seed.

Writes ``certify_check.csv`` (one row per problem: the model's answer, the certified
answer, whether it stepped, fresh-seed verdicts, the neighbours' fresh verdicts,
timings) and ``certify_check.md`` (the totals) into ``--out``.

Usage:
    python studies/certify_check.py [--problems 24] [--all] [--fresh 5] [--out DIR]
    python studies/certify_check.py --optimize-args "--window-confidence 0"   # the plain rule
    SPLITWISE_SMOKE=1 python studies/certify_check.py   # 2 problems, 2 fresh seeds
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import splitwise_jax as sj  # noqa: E402
from splitwise_jax.optimize import main as optimize_main  # noqa: E402

SMOKE = os.environ.get("SPLITWISE_SMOKE", "") not in ("", "0")
HORIZON_S = 120.0  # the optimiser's problem window (Problem.horizon_s)
FRESH_BASE = 1000  # fresh seeds: 1000, 1001, ... (certificates use 0..K-1)


def problems(n: int | None, sample_seed: int = 2026) -> list[dict]:
    """Every problem of the grid, or a random sample of n of them."""
    grid = [dict(design=d, workload=w, model=m, rate=r, objective=o)
            for d, w, m, r, o in itertools.product(sorted(sj.DESIGNS), ("coding", "conversation"),
                                                   ("bloom-176b", "llama2-70b"), (30, 50, 70, 90, 110),
                                                   ("cost", "power"))]
    if n is None or n >= len(grid):
        return grid
    rng = np.random.default_rng(sample_seed)
    return [grid[i] for i in sorted(rng.choice(len(grid), size=n, replace=False))]


def run_optimize(p: dict, extra: list[str] = ()) -> dict:
    argv = ["--design", p["design"], "--workload", p["workload"], "--model", p["model"], "--rate", str(p["rate"]),
            "--objective", p["objective"], "--json", "--quiet", *extra]
    buf = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        code = optimize_main(argv)
    if code != 0:
        raise RuntimeError(f"optimize {' '.join(argv)} exited {code}")
    out = json.loads(buf.getvalue())
    out["call_wall_s"] = time.perf_counter() - t0  # this call (compilations of earlier calls reused)
    return out


def fresh_verdicts(cluster, wl, rate, seeds) -> list[bool]:
    return [bool(sj.simulate(cluster, sj.poisson_trace(wl, rate, HORIZON_S, s), power=False).metrics["meets_slo"])
            for s in seeds]


def judge(p: dict, out: dict, fresh: list[int]) -> dict:
    cert = out["certificate"]
    a = cert["answer"]
    n_p, n_t = int(a["prompt_machines"]), int(a["token_machines"])
    splitwise = n_t > 0
    kw = dict(model=p["model"], prompt_cap_frac=a["prompt_cap_frac"])
    if splitwise:
        kw["token_cap_frac"] = a["token_cap_frac"]
    wl = sj.load_workload(p["workload"], float(p["rate"]))
    build = (lambda pp, tt: sj.make_cluster(p["design"], float(pp), float(tt), **kw)) if splitwise else \
        (lambda pp, tt: sj.make_cluster(p["design"], float(pp), **kw))
    safe = fresh_verdicts(build(n_p, n_t), wl, p["rate"], fresh)
    neighbours = [(n_p - 1, n_t)] + ([(n_p, n_t - 1)] if splitwise else [])
    neighbours = [(pp, tt) for pp, tt in neighbours if pp >= 1 and (tt >= 1 or not splitwise)]
    nb = {}
    for pp, tt in neighbours:
        verdicts = []
        for s in fresh:  # a neighbour is judged failed at its first failing fresh seed
            verdicts += fresh_verdicts(build(pp, tt), wl, p["rate"], [s])
            if not verdicts[-1]:
                break
        nb[f"{pp}+{tt}"] = all(verdicts) and len(verdicts) == len(fresh)
    return dict(**p, model_answer=f"{int(cert['searched']['prompt_machines'])}+"
                                  f"{int(cert['searched']['token_machines'])}",
                answer=f"{n_p}+{n_t}", certified=cert["certified"], stepped=cert["stepped"],
                cert_minimal=cert["minimal"], fresh_passes=int(sum(safe)), fresh_seeds=len(fresh),
                safe=all(safe), neighbours_passing=",".join(k for k, v in nb.items() if v),
                minimal=None if not nb else not any(nb.values()),
                descended=cert["descended"], cert_wall_s=cert["wall_s"], optimize_wall_s=out["call_wall_s"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=2 if SMOKE else 24, help="random sample size")
    ap.add_argument("--all", action="store_true", help="every problem of the grid (240)")
    ap.add_argument("--fresh", type=int, default=2 if SMOKE else 5, help="fresh seeds per answer")
    ap.add_argument("--out", default="studies/out/certify_check")
    ap.add_argument("--optimize-args", default="", help="more optimize flags, e.g. '--window-confidence 0'")
    a = ap.parse_args(argv)
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    fresh = list(range(FRESH_BASE, FRESH_BASE + a.fresh))
    rows = []
    todo = problems(None if a.all else a.problems)
    for i, p in enumerate(todo):
        t0 = time.perf_counter()
        out = run_optimize(p, a.optimize_args.split())
        if out.get("certificate") is None or not out["certificate"]["supported"]:
            rows.append(dict(**p, answer=None, certified=None))  # no feasible answer within --max-machines
            print(f"[{i + 1}/{len(todo)}] {p}: no answer to certify", flush=True)
            continue
        rows.append(judge(p, out, fresh))
        r = rows[-1]
        print(f"[{i + 1}/{len(todo)}] {p['design']} {p['workload']} {p['model']} {p['rate']} req/s {p['objective']}: "
              f"model {r['model_answer']} -> {'certified' if r['certified'] else 'NOT certified (none within reach passes)'} "
              f"{r['answer']} ({'moved' if r['stepped'] else 'as is'}); "
              f"fresh {r['fresh_passes']}/{r['fresh_seeds']}; minimal {r['minimal']} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(out_dir / "certify_check.csv", index=False)
    ok = df[df["certified"] == True]  # noqa: E712
    minimal = ok["minimal"].dropna()
    lines = [f"# Certified answers on fresh seeds{' [SMOKE numbers]' if SMOKE else ''}", "",
             f"{len(df)} problems; {int(df['answer'].isna().sum())} without a feasible answer in the searched pools; "
             f"{len(ok)} certified; {int(ok['stepped'].sum())} moved from the model's answer.",
             f"Safe (every one of {a.fresh} fresh seeds meets every SLO): {int(ok['safe'].sum())} of {len(ok)}.",
             f"Minimal (each one-machine-cheaper neighbour fails a fresh seed): {int(minimal.sum())} of "
             f"{len(minimal)} ({minimal.mean():.0%}).",
             f"Moved down (model conservative, a cheaper neighbour passed every certificate seed): "
             f"{int((ok['descended'] > 0).sum())} of {len(ok)}.",
             f"Certification time: median {ok['cert_wall_s'].median():.1f} s; the whole optimize call (search, "
             f"full-resolution check, certificate; first calls of a design compile): median "
             f"{ok['optimize_wall_s'].median():.1f} s."]
    (out_dir / "certify_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
