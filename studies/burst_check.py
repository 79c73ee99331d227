"""The fluid model against our request-level simulator on a synthetic bursty trace.

Checks the in-window burst law (docs/cluster.md §3b) where the truth is known: 4,000
coding requests at 40 req/s (sizes drawn from the coding preset coarsened to 8 x 8
classes, numpy seed 0) arriving either as Poisson or as Poisson batches of geometric
size with mean 10, replayed on Baseline-H100 and Splitwise-HH at about 0.4 and 0.8
prompt load, calibrated timing. The fluid model reads the trace window by window
(`Workload.from_trace(..., arrival="trace")`); the simulator
(`splitwise_jax.simulate.simulate`) runs every request of it.

Writes ``burst_check.csv`` (fluid and simulated P50/P90/P99 of TTFT and TBT, and
fluid / simulated - 1) into ``--out``. About 3 minutes on 2 cores.

Usage:
    python studies/burst_check.py --out studies/out/burst_check
"""

from __future__ import annotations

import argparse
from pathlib import Path

import jax
import numpy as np
import pandas as pd

jax.config.update("jax_enable_x64", True)

import splitwise_jax as sj  # noqa: E402
from splitwise_jax.cluster.metrics import KEYS  # noqa: E402

RATE = 40.0
N_REQUESTS = 4_000
MEAN_BATCH = 10.0
CLUSTERS = (("baseline-h100", 32.0, 0.0), ("baseline-h100", 16.0, 0.0),
            ("splitwise-hh", 28.0, 6.0), ("splitwise-hh", 14.0, 4.0))
PCTS = KEYS  # ("p50", "p90", "p99")


def traces(seed: int = 0):
    """(prompt tokens, output tokens, {name: arrival times})."""
    rng = np.random.default_rng(seed)
    base = sj.coarsen(sj.load_workload("coding", 1.0), 8, 8)
    sizes = rng.geometric(1.0 / MEAN_BATCH, N_REQUESTS)
    bursty = np.repeat(np.cumsum(rng.exponential(MEAN_BATCH / RATE, N_REQUESTS)), sizes)[:N_REQUESTS]
    poisson = np.cumsum(rng.exponential(1.0 / RATE, N_REQUESTS))
    w = np.asarray(base.weights).ravel()
    k = rng.choice(w.size, size=N_REQUESTS, p=w / w.sum())
    i, j = np.unravel_index(k, base.weights.shape)
    p = np.asarray(base.prompt_tokens)[i].round()
    o = np.asarray(base.output_tokens)[j].round()
    return p, o, {"poisson": poisson, "bursty": bursty}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="studies/out/burst_check", help="output folder")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    p, o, arrivals = traces()
    rows = []
    for design, n_p, n_t in CLUSTERS:
        cluster = sj.make_cluster(design, n_p, n_t) if n_t else sj.make_cluster(design, n_p)
        for name, t in arrivals.items():
            df = pd.DataFrame({"arrival_s": t, "prompt_tokens": p, "output_tokens": o})
            wl = sj.Workload.from_trace(df, rate_per_s=RATE, arrival="trace", n_prompt_bins=8, n_output_bins=8)
            fluid = sj.evaluate(cluster, wl, 120.0)
            sim = sj.simulate(cluster, sj.RequestTrace.from_arrays(t - t[0], p, o, name=name)).metrics
            row = {"design": design, "n_prompt": n_p, "n_token": n_t, "arrivals": name,
                   "rho_prompt": float(fluid.rho_prompt_pool)}
            for met in ("ttft", "tbt"):
                for i, pc in enumerate(PCTS):
                    f, s = float(getattr(fluid, f"{met}_s")[i]), float(sim[f"{met}_s"][pc])
                    row.update({f"fluid_{met}_{pc}_s": f, f"sim_{met}_{pc}_s": s, f"err_{met}_{pc}": f / s - 1.0})
            rows.append(row)
            print(f"{design} {n_p:g}+{n_t:g} {name}: TTFT err "
                  + " / ".join(f"{row[f'err_ttft_{pc}']:+.0%}" for pc in PCTS) + ", TBT err "
                  + " / ".join(f"{row[f'err_tbt_{pc}']:+.0%}" for pc in PCTS), flush=True)
    pd.DataFrame(rows).to_csv(out / "burst_check.csv", index=False)
    print(f"wrote {out / 'burst_check.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
