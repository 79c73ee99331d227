"""Wall time of `make run`'s install step on a fresh clone: uv against plain pip.

Clones this checkout (its committed HEAD) into a temporary folder twice per round and
times `make .venv/.installed` (venv, the package without test extras, the commands'
bytecode) with `INSTALLER=uv` and `INSTALLER=pip`, alternating; uv starts from an empty
cache of its own (`UV_CACHE_DIR` in the temporary folder) unless `--warm-uv-cache`.
Needs git, make and the package indexes. docs/speed.md §6 has the figures.

Usage:
    python benchmarks/install_speed.py [--rounds 1] [--warm-uv-cache]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one(installer: str, tmp: Path, uv_cache: Path | None) -> float:
    clone = Path(tempfile.mkdtemp(dir=tmp, prefix=f"clone-{installer}-"))
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = dict(os.environ)
    if uv_cache is not None:
        env["UV_CACHE_DIR"] = str(uv_cache)
    t0 = time.perf_counter()
    subprocess.run(["make", f"INSTALLER={installer}", ".venv/.installed"], cwd=clone, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--warm-uv-cache", action="store_true", help="use uv's own cache (default: an empty one)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for r in range(args.rounds):
            uv_cache = None if args.warm_uv_cache else tmp / f"uv-cache-{r}"
            for installer in ("uv", "pip"):
                print(f"round {r + 1}: INSTALLER={installer}: {one(installer, tmp, uv_cache):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
