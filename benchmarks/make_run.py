"""Wall time of `make run` on a fresh clone, as a newcomer meets it: install and all.

Clones this checkout's committed HEAD (and, with `--compare-with REV`, that git revision
of it) into a temporary folder, then in each clone runs `make run` twice: cold (a fresh
venv and an empty compilation cache, `SPLITWISE_JAX_CACHE` in the temporary folder) and
warm (the same venv and cache again). The trees alternate, so a busy machine slows both
alike. Reports, per tree and run: wall and CPU seconds of the whole `make run` (the
install included in the cold run), the seconds `optimize` printed from its process start,
and its answer line; and whether the trees' answers agree. uv's package cache is the
user's own (a warm one: what the issue's figure assumes); `--empty-uv-cache` starts it
empty. Needs git, make and the package indexes. docs/speed.md §8 has the figures.

Goal (GitHub issue 40): `make run` on a fresh clone <= 60 s on the 2-core CPU machine.

Usage:
    python benchmarks/make_run.py [--compare-with c2cb5e7] [--empty-uv-cache]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FROM_START = re.compile(r"([0-9.]+) s from process start")
_ANSWER = re.compile(r"^\s*answer: (.*?)  ->", re.M)


def clone(tmp: Path, rev: str | None, name: str) -> Path:
    path = tmp / name
    subprocess.run(["git", "clone", "-q", str(ROOT), str(path)], check=True)
    if rev is not None:
        subprocess.run(["git", "checkout", "-q", rev], cwd=path, check=True)
    return path


def make_run(tree: Path, cache: Path, uv_cache: Path | None) -> dict:
    env = dict(os.environ, SPLITWISE_JAX_CACHE=str(cache))
    if uv_cache is not None:
        env["UV_CACHE_DIR"] = str(uv_cache)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(["make", "run"], cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"make run failed in {tree} ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    start = _FROM_START.search(proc.stdout)
    answer = _ANSWER.search(proc.stdout)
    return dict(wall=wall, cpu=(after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                optimize=float(start.group(1)) if start else float("nan"),
                answer=answer.group(1) if answer else "?")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare-with", default=None, metavar="REV", help="a git revision timed side by side")
    ap.add_argument("--empty-uv-cache", action="store_true", help="start uv from an empty cache of its own")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trees = {"HEAD": clone(tmp, None, "head")}
        if args.compare_with:
            trees[args.compare_with] = clone(tmp, args.compare_with, "other")
        uv_cache = tmp / "uv-cache" if args.empty_uv_cache else None
        rows = []
        for kind in ("cold", "warm"):
            for name, tree in trees.items():
                r = make_run(tree, tmp / f"xla-{tree.name}", uv_cache)
                rows.append((name, kind, r))
                print(f"{name:<12} {kind:<5} make run {r['wall']:6.1f} s wall {r['cpu']:6.1f} s CPU; optimize "
                      f"{r['optimize']:5.1f} s from process start; answer {r['answer']}", flush=True)
        if args.compare_with:
            answers = {r["answer"] for _, _, r in rows}
            print(f"same answer in every run: {'yes' if len(answers) == 1 else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
