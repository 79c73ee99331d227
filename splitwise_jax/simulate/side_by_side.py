"""The model's and the simulation's percentiles side by side (`evaluate --simulate K`).

One cluster, one workload: the fluid model's TTFT/TBT/E2E percentiles beside the
request-level simulation's on K seeds (Poisson arrivals of a preset workload, one trace
per seed), with the seeds' spread (min, max) and the model's relative error against the
seeds' mean. A trace workload is replayed once with its own arrivals (a replay is
deterministic, so seeds do not apply).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from splitwise_jax.simulate.api import simulate

__all__ = ["simulate_runs", "side_by_side", "side_by_side_dict", "side_by_side_text"]

_ROWS = [(f"{met}_s", met.upper(), p) for met in ("ttft", "tbt", "e2e") for p in ("p50", "p90", "p99")]


def simulate_runs(cluster, traces, *, slo=None, progress: bool = False) -> list[dict]:
    """Simulate one cluster on each trace; the runs' metrics dicts (`simulate`'s). A
    chunked-prefill cluster runs with the simulator's chunked prefill (`policies.simulated`)."""
    from splitwise_jax.simulate.policies import simulated

    cluster, config = simulated(cluster)
    out = []
    it = traces
    if progress and len(traces) > 1:
        from tqdm import tqdm
        it = tqdm(traces, desc="simulate seeds", unit="run", leave=False)
    for tr in it:
        out.append(simulate(cluster, tr, config, slo=slo, power=False).metrics)
    return out


def side_by_side(model: dict, runs: list[dict]) -> pd.DataFrame:
    """One row per percentile: model, the runs' mean / min / max, and the model's
    relative error against the mean ((model - mean) / mean).

    Args:
        model: `evaluate`'s JSON object (`cli.evaluate.metrics_to_dict`).
        runs: the simulated runs' metrics (`simulate_runs`).
    """
    rows = []
    for key, met, p in _ROWS:
        sims = np.array([r[key][p] for r in runs], float)
        mean = float(np.mean(sims))
        rows.append(dict(metric=met, percentile=p.upper(), model_s=float(model[key][p]), sim_mean_s=mean,
                         sim_min_s=float(np.min(sims)), sim_max_s=float(np.max(sims)),
                         model_vs_sim=(float(model[key][p]) - mean) / mean if mean > 0 else float("nan")))
    return pd.DataFrame(rows)


def side_by_side_dict(model: dict, runs: list[dict], seeds) -> dict:
    """The JSON object: the table, and each run's SLO verdict, worst SLO and status."""
    table = side_by_side(model, runs)
    return {"seeds": None if seeds is None else list(seeds),
            "table": table.to_dict(orient="records"),
            "runs": [{"meets_slo": bool(r["meets_slo"]), "throughput_rps": r["throughput_rps"],
                      "status": r["status"],
                      "worst_slo_margin_log": float(min(v for d in r["slo_margin_log"].values() for v in d.values()))}
                     for r in runs],
            "model_meets_slo": bool(model["meets_slo"]),
            "sim_meets_slo_all_seeds": all(bool(r["meets_slo"]) for r in runs)}


def side_by_side_text(model: dict, runs: list[dict], seeds) -> str:
    """The table as `evaluate` prints it."""
    t = side_by_side(model, runs)
    what = (f"{len(runs)} seed{'s' if len(runs) > 1 else ''} {list(seeds)}" if seeds is not None
            else "the trace replayed with its own arrivals")
    lines = [f"model vs request-level simulation ({what}; SplitwiseSim's policies, the same phase models):",
             f"{'metric':<14}{'model':>10}{'sim mean':>10}{'sim min':>10}{'sim max':>10}{'model/sim':>11}"]
    for r in t.itertuples():
        lines.append(f"{r.metric + ' ' + r.percentile + ' (s)':<14}{r.model_s:>10.4f}{r.sim_mean_s:>10.4f}"
                     f"{r.sim_min_s:>10.4f}{r.sim_max_s:>10.4f}{r.model_vs_sim:>+11.1%}")
    verdicts = ", ".join("meets" if r["meets_slo"] else "misses" for r in runs)
    lines.append(f"SLOs: model {'meets' if model['meets_slo'] else 'misses'}; simulation {verdicts}")
    return "\n".join(lines)
