"""Check the optimiser's best integer candidates by simulation (`optimize --simulate-top K`).

The optimiser ranks integer configurations with the fluid model. Before a user buys the
answer, this module simulates the K best candidates of that ranking (and the cheaper
neighbours the model calls infeasible) request by request, at the problem's load, and
says where simulation and model disagree: on feasibility (all nine SLOs) or on which
candidate is best.

The candidates come from the integer box the optimiser's repair searches around its
answer (`optimize.integer`), scored by the same fluid evaluation; throughput problems
(whose candidates each have their own largest rate) are simulated at that rate.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from splitwise_jax.simulate.api import simulate
from splitwise_jax.simulate.trace import poisson

_SLO_NAMES = [f"{met} {p}" for met in ("TTFT", "TBT", "E2E") for p in ("P50", "P90", "P99")]

__all__ = ["check_optimum", "ranked_candidates", "simulate_candidates", "format_check"]


def _with_caps(timing, cap_frac: float):
    if hasattr(timing, "params") and abs(float(np.asarray(timing.cap_frac)) - cap_frac) > 1e-12:
        return dataclasses.replace(timing, cap_frac=cap_frac)
    return timing


def cluster_of(cluster, cand):
    """The cluster of one candidate (pool sizes and, for calibrated timing, caps)."""
    return cluster.replace(n_prompt=float(cand.prompt_machines), n_token=float(cand.token_machines),
                           prompt=_with_caps(cluster.prompt, cand.prompt_cap_frac),
                           token=_with_caps(cluster.token, cand.token_cap_frac))


def ranked_candidates(cluster, workload, problem, config, best, k: int, radius: int | None = None):
    """The optimiser's integer candidates around its answer, best first by its own rank.

    Returns (top, cheaper): the k best by the optimiser's ranking (feasible by the model
    first, then by objective), and up to k model-infeasible cells that would beat the
    answer's objective (where a too-pessimistic model hides a better answer).
    """
    from splitwise_jax.optimize import integer
    from splitwise_jax.optimize.spec import make_spec

    spec, info = make_spec(cluster, workload, problem)
    if radius is not None:
        config = dataclasses.replace(config, radius=radius)
    center = (best.prompt_machines, best.token_machines, best.prompt_cap_frac, best.token_cap_frac)
    cells = integer._neighbourhood(info, spec, problem, center, config)
    rate = best.rate_per_s
    cands, _ = integer.score_cells(cluster, spec, info, problem, cells, config, rate_lo=0.25 * rate,
                                   rate_hi=1.5 * rate)
    order = sorted(cands, key=lambda c: integer._rank_key(c, problem.objective))
    top = order[:k]
    better = [c for c in order if not c.feasible and ((c.objective > best.objective)
                                                      if problem.objective == "throughput"
                                                      else (c.objective < best.objective))]
    better.sort(key=lambda c: -c.objective if problem.objective == "throughput" else c.objective)
    return top, better[:k]


def simulate_candidates(cluster, workload, cands, *, rate_per_s: float | None, horizon_s: float = 120.0,
                        seed: int = 0, slo=None, progress: bool = False) -> pd.DataFrame:
    """Simulate each candidate on one Poisson trace of the workload.

    Args:
        cluster: the design (pool sizes and caps are taken from each candidate).
        workload: the workload at full resolution (its size distribution is sampled).
        cands: optimiser `Candidate`s.
        rate_per_s: load of a cost/power problem; None simulates each candidate at its
            own rate (throughput problems).
        horizon_s: arrival window, s.
        seed: trace seed (one trace per rate, shared by the candidates).

    Returns:
        One row per candidate: sizes, caps, objective, the model's verdict and worst SLO
        margin, the simulation's verdict, worst margin and percentiles.
    """
    rows = []
    traces = {}
    it = cands
    if progress:
        from tqdm import tqdm
        it = tqdm(cands, desc="simulate candidates", unit="cand", leave=False)
    for c in it:
        rate = c.rate_per_s if rate_per_s is None else rate_per_s
        key = round(rate, 9)
        if key not in traces:
            traces[key] = poisson(workload, rate, horizon_s, seed)
        res = simulate(cluster_of(cluster, c), traces[key], slo=slo)
        m = res.metrics
        margins = np.array([[m["slo_margin_log"][met][p] for p in ("p50", "p90", "p99")]
                            for met in ("ttft", "tbt", "e2e")])
        rows.append(dict(prompt_machines=c.prompt_machines, token_machines=c.token_machines,
                         prompt_cap_frac=c.prompt_cap_frac, token_cap_frac=c.token_cap_frac, rate_per_s=rate,
                         objective=c.objective, model_feasible=bool(c.feasible),
                         model_worst_margin=float(np.min(c.constraints[:9])),
                         sim_feasible=bool(m["meets_slo"]), sim_worst_margin=float(np.min(margins)),
                         sim_worst_slo=_SLO_NAMES[int(np.argmin(margins))],
                         sim_status=m["status"], n_requests=len(traces[key]),
                         **{f"sim_{met}_{p}_s": m[f"{met}_s"][p] for met in ("ttft", "tbt", "e2e")
                            for p in ("p50", "p90", "p99")}))
    return pd.DataFrame(rows)


def format_check(top: pd.DataFrame, cheaper: pd.DataFrame, objective: str) -> tuple[str, dict]:
    """A table and a summary of where simulation and model disagree."""
    lines = ["Simulated check of the optimiser's candidates (model = fluid model, sim = request-level simulation; "
             "margin = smallest log(limit / slowdown) of the nine SLOs, < 0 fails):",
             f"{'rank':>4} {'prompt':>6} {'token':>6} {'caps':>11} {'objective':>11} {'rate':>8}  "
             f"{'model':>6} {'margin':>7}  {'sim':>6} {'margin':>7} {'(worst SLO)':<12} status"]

    def add(df, label):
        for i, r in enumerate(df.itertuples(index=False)):
            lines.append(f"{label if label else i + 1:>4} {r.prompt_machines:>6} {r.token_machines:>6} "
                         f"{r.prompt_cap_frac:>5.2f}/{r.token_cap_frac:<5.2f} {r.objective:>11.4g} {r.rate_per_s:>8.3g}  "
                         f"{'ok' if r.model_feasible else 'FAIL':>6} {r.model_worst_margin:>7.3f}  "
                         f"{'ok' if r.sim_feasible else 'FAIL':>6} {r.sim_worst_margin:>7.3f} {r.sim_worst_slo:<12} "
                         f"{r.sim_status}")

    add(top, None)
    if len(cheaper):
        lines.append("  cheaper neighbours the model rejects:" if objective != "throughput"
                     else "  faster neighbours the model rejects:")
        add(cheaper, "*")
    both = pd.concat([top, cheaper], ignore_index=True)
    disagree = both[both["model_feasible"] != both["sim_feasible"]]
    sim_ok = both[both["sim_feasible"]]
    if objective == "throughput":
        sim_best = sim_ok.sort_values("objective", ascending=False).head(1)
    else:
        sim_best = sim_ok.sort_values("objective").head(1)
    model_best = top.head(1)
    same_best = (len(sim_best) == 1 and len(model_best) == 1
                 and (sim_best.iloc[0][["prompt_machines", "token_machines", "prompt_cap_frac", "token_cap_frac"]]
                      == model_best.iloc[0][["prompt_machines", "token_machines", "prompt_cap_frac",
                                             "token_cap_frac"]]).all())
    summary = {"candidates": len(both), "feasibility_disagreements": len(disagree),
               "model_feasible_sim_infeasible": int(((both["model_feasible"]) & (~both["sim_feasible"])).sum()),
               "model_infeasible_sim_feasible": int(((~both["model_feasible"]) & (both["sim_feasible"])).sum()),
               "same_best": bool(same_best),
               "sim_best": (None if sim_best.empty else
                            {k: (float(v) if isinstance(v, (float, np.floating)) else int(v))
                             for k, v in sim_best.iloc[0][["prompt_machines", "token_machines", "prompt_cap_frac",
                                                           "token_cap_frac", "objective"]].items()})}
    lines.append(f"  disagreements on feasibility: {summary['feasibility_disagreements']} of {len(both)} "
                 f"(model ok / sim fails: {summary['model_feasible_sim_infeasible']}; model fails / sim ok: "
                 f"{summary['model_infeasible_sim_feasible']}); best by simulation "
                 + ("= the optimiser's answer" if same_best else
                    ("none feasible" if sim_best.empty else
                     f"= {int(sim_best.iloc[0]['prompt_machines'])}+{int(sim_best.iloc[0]['token_machines'])}"
                     f" (objective {float(sim_best.iloc[0]['objective']):.4g})")))
    return "\n".join(lines), summary


def check_optimum(cluster, workload_searched, workload_full, problem, config, best, k: int, *, seed: int = 0,
                  progress: bool = False) -> tuple[str, dict]:
    """`optimize --simulate-top K`: rank, simulate, compare (text table, JSON-ready dict).

    Args:
        cluster: the design optimised.
        workload_searched: the workload the optimiser ranked with (possibly coarsened).
        workload_full: the workload at full resolution (sampled for the simulations; its
            rate is the load of cost/power problems).
        problem, config: the optimiser's problem and solver settings.
        best: the optimiser's answer.
        k: candidates to simulate (plus up to k cheaper cells the model rejects).
        seed: trace seed.
    """
    top, cheaper = ranked_candidates(cluster, workload_searched, problem, config, best, k)
    rate = None if problem.objective == "throughput" else float(
        problem.rate_per_s if problem.rate_per_s is not None else np.asarray(workload_full.rate_per_s))
    kw = dict(rate_per_s=rate, horizon_s=problem.horizon_s, seed=seed, slo=problem.slo, progress=progress)
    t = simulate_candidates(cluster, workload_full, top, **kw)
    c = simulate_candidates(cluster, workload_full, cheaper, **kw) if cheaper else t.iloc[0:0]
    text, summary = format_check(t, c, problem.objective)
    summary["top"] = t.to_dict(orient="records")
    summary["rejected_better"] = c.to_dict(orient="records")
    summary["seed"] = seed
    return text, summary
