"""Discrete choices around the gradient search: the machine type of each pool (from a
list per pool) and the token budget of a chunked-prefill design. Every combination is
one `optimize` problem (counts and caps by gradient, as for any design); the answer is
the combination whose optimum is best by the problem's objective.

Combinations of one design kind and model share one compiled program (`uniform_names`
strips the machine names; the specs' numbers are traced leaves), so each extra
combination costs its solve, not a compilation.
"""

from __future__ import annotations

import itertools

import numpy as np

from splitwise_jax.cluster.designs import Design
from splitwise_jax.optimize.problem import OptimizeResult


def variants(design: Design, budgets: tuple[float, ...] | None = None) -> dict[str, Design]:
    """Every combination of one machine type per pool (and token budget), by label.

    Args:
        design: pools whose `search_machines` list the candidates (else their machine).
        budgets: chunked-prefill token budgets to try (a colocated design), or None
            for the design's own.

    Returns:
        {label: Design} with one machine per pool and no counts; the label names the
        choices ("prompt=dgx-h200,token=dgx-b200", "colocated=dgx-h100,C=512"), or is
        the design's name when there is nothing to choose.
    """
    if budgets is not None and design.strategy.token_pool:
        raise ValueError(f"chunked-prefill budgets apply to a colocated design, not {design.name!r}")
    choices = [p.machines for p in design.pools]
    out = {}
    for combo in itertools.product(*choices):
        for b in budgets or (design.chunked_prefill_tokens,):
            pools = tuple(p.replace(machine=m, search_machines=(), count=None) for p, m in zip(design.pools, combo))
            parts = [f"{p.role}={m}" for p, m in zip(design.pools, combo)]
            if budgets is not None:
                parts.append(f"C={b:g}")
            several = len(list(itertools.product(*choices))) * len(budgets or (None,)) > 1
            label = ",".join(parts) if several else design.name
            out[label] = design.replace(pools=pools, chunked_prefill_tokens=b, name=label)
    return out


def best_variant(results: dict[str, OptimizeResult], objective: str) -> str | None:
    """The label of the best feasible answer (least cost or power, most throughput);
    None when no combination has one."""
    ok = {k: r for k, r in results.items() if r.feasible and r.best is not None}
    if not ok:
        return None
    sign = -1.0 if objective == "throughput" else 1.0
    return min(ok, key=lambda k: (sign * ok[k].best.objective, k))


def variants_table(results: dict[str, OptimizeResult], splitwise: dict[str, bool], best: str | None,
                   title: str) -> str:
    """One line per combination: its answer, or why none was found, and its objective
    against the best combination's."""
    lines = [title, f"  {'choice':<40} {'machines':>9} {'caps':>9} {'req/s':>8} {'$/h':>9} {'kW prov':>8} {'vs best':>8}"]
    ref = results[best].best.objective if best is not None else None
    for k, r in results.items():
        b = r.best
        if not r.feasible or b is None:
            why = ", ".join(f"{n} {np.expm1(v):+.0%}" for n, v in r.continuous["violated"].items())
            lines.append(f"  {k:<40} infeasible up to {r.bounds[0]} machines per pool ({why or 'no single constraint'})")
            continue
        pools = f"{b.prompt_machines}+{b.token_machines}" if splitwise[k] else f"{b.prompt_machines}"
        caps = f"{b.prompt_cap_frac:.2f}/{b.token_cap_frac:.2f}" if splitwise[k] else f"{b.prompt_cap_frac:.2f}"
        mark = "  <- best" if k == best else ""
        lines.append(f"  {k:<40} {pools:>9} {caps:>9} {b.rate_per_s:>8.1f} {b.cost_per_hour:>9,.0f} "
                     f"{b.provisioned_power_kw:>8.1f} {b.objective / ref:>7.2f}x{mark}")
    return "\n".join(lines)
