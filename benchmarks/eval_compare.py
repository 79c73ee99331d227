"""One compiled `evaluate` on four designs, timed and printed with every percentile, so
two checkouts can be compared side by side (speed and answers).

Cases: Splitwise-HH 30+5 and Splitwise-HHcap 28+5 on coding (70 and 80 req/s),
Splitwise-HA 20+8 on conversation (60 req/s), Baseline-H100 50 on coding (60 req/s);
full-resolution workloads, float64. For each: compile time, best of 5 compiled calls,
and the 18 percentiles (TTFT, TBT, E2E as times and slowdowns, P50/P90/P99).

Usage:
    python benchmarks/eval_compare.py OUT.json                 # this checkout
    (cd /tmp/prev && PYTHONPATH=/tmp/prev python /path/to/eval_compare.py prev.json)
    RES='{"grid_points":400,"refine_iters":40}' python benchmarks/eval_compare.py converged.json
The last form solves the percentiles to convergence (a reference for the answers);
RES takes any `cluster.Resolution` fields as JSON.
"""

import json
import os
import sys
import time

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

from splitwise_jax.cluster.cluster import Resolution, evaluate  # noqa: E402
from splitwise_jax.cluster.designs import make_cluster  # noqa: E402
from splitwise_jax.cluster.workload import workload  # noqa: E402

RES = Resolution(**json.loads(os.environ.get("RES", "{}")))
CASES = [("coding", 70.0, "splitwise-hh", 30.0, 5.0), ("conversation", 60.0, "splitwise-ha", 20.0, 8.0),
         ("coding", 60.0, "baseline-h100", 50.0, 0.0), ("coding", 80.0, "splitwise-hhcap", 28.0, 5.0)]


def main(path: str) -> None:
    out = {}
    for wname, rate, design, n_p, n_t in CASES:
        wl = workload(wname, rate)
        cl = make_cluster(design, n_p, n_t)
        f = jax.jit(lambda a, b: evaluate(cl.replace(n_prompt=a, n_token=b), wl, resolution=RES))  # noqa: B023
        t0 = time.perf_counter()
        r = jax.block_until_ready(f(n_p, n_t))
        first = time.perf_counter() - t0
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            jax.block_until_ready(f(n_p, n_t))
            times.append(time.perf_counter() - t0)
        vals = np.concatenate([np.ravel(np.asarray(getattr(r, k))) for k in
                               ("ttft_s", "tbt_s", "e2e_s", "slowdown_ttft", "slowdown_tbt", "slowdown_e2e")])
        out[f"{design} {wname}"] = dict(compile=first - min(times), best=min(times), vals=vals.tolist())
        print(f"{design:16} {wname:12} compile {first - min(times):5.1f} s  best {min(times) * 1e3:7.1f} ms", flush=True)
    with open(path, "w") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
