"""Every design on the same problem (the paper's Figs. 18-19 comparison), and the
paper's headline ratios read off the answers (`paper.HEADLINES`).

References:
    Patel et al., Splitwise, ISCA 2024, §VI-C (Figs. 18-19).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from splitwise_jax.specs import paper
from splitwise_jax.cluster.cluster import Cluster
from splitwise_jax.optimize.gradient import optimize, prefetch
from splitwise_jax.optimize.problem import OptimizeResult, Problem, SolverConfig
from splitwise_jax.cluster.workload import Workload


def problem_kind(problem: Problem) -> str:
    """"cost", "power", "iso-power", "iso-cost" or "iso-power+cost" (which headlines apply)."""
    if problem.objective != "throughput":
        return problem.objective
    kinds = [k for k, b in (("power", problem.power_budget_kw), ("cost", problem.cost_budget_per_h)) if b is not None]
    return "iso-" + "+".join(kinds)


def metric_of(res: OptimizeResult, metric: str) -> float:
    """A headline metric of an answer: "throughput" (req/s), "cost" ($/h), "power"
    (provisioned kW) or "machines" (both pools: floor space)."""
    b = res.best
    return {"throughput": b.rate_per_s, "cost": b.cost_per_hour, "power": b.provisioned_power_kw,
            "machines": float(b.prompt_machines + b.token_machines)}[metric]


def headline_ratios(results: dict[str, OptimizeResult], problem: Problem) -> list[dict]:
    """Our value of each of the paper's headline ratios that this problem reproduces.

    Returns:
        One dict per `paper.HEADLINES` entry of this problem's kind, with "ours" added
        (None when either design has no feasible answer or was not solved).
    """
    out = []
    for h in paper.HEADLINES:
        if h["problem"] != problem_kind(problem):
            continue
        a, b = results.get(h["design"]), results.get(h["reference"])
        ours = None
        if a is not None and b is not None and a.feasible and b.feasible:
            ours = metric_of(a, h["metric"]) / metric_of(b, h["metric"])
        out.append({**h, "ours": ours})
    return out


def compare_designs(make: Callable[[str], Cluster], designs, workload: Workload, problem: Problem,
                    config: SolverConfig = SolverConfig(), *, progress: bool = False) -> dict[str, OptimizeResult]:
    """Optimise each design on the same problem (the paper's Figs. 18-19 comparison).

    Args:
        make: design name -> Cluster (e.g. `lambda d: make_cluster(d, 1, 1)`).
        designs: design names.
        workload, problem, config: as for `optimize`. A baseline has no token pool, so
            free token caps apply to Splitwise designs only.
    """
    def problem_for(cluster):
        if not cluster.strategy.token_pool and problem.free_caps in ("token", "both"):
            return dataclasses.replace(problem, free_caps="prompt" if problem.free_caps == "both" else "none")
        return problem

    designs = list(designs)
    clusters = {d: make(d) for d in designs}
    for d in designs[1:]:  # the others' programs load (or compile) while the first is solved
        prefetch(clusters[d], workload, problem_for(clusters[d]), config)
    return {d: optimize(clusters[d], workload, problem_for(clusters[d]), config, progress=progress) for d in designs}
