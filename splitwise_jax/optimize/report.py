"""What `python -m splitwise_jax.optimize` prints and draws: tables, JSON objects and
figures of `optimize` / `grid_search` / `compare_designs` answers.

The figure functions build and return a `matplotlib.figure.Figure` without touching
pyplot or its backend (a notebook's backend stays as it is); the caller saves or shows it.
"""

from __future__ import annotations

import numpy as np

from splitwise_jax.specs import paper
from splitwise_jax.cluster.cluster import Cluster, ClusterMetrics
from splitwise_jax.cluster.metrics import metrics_lists
from splitwise_jax.optimize.compare import headline_ratios, metric_of
from splitwise_jax.optimize.integer import evaluate_plane, same_answer
from splitwise_jax.optimize.problem import (CONSTRAINT_NAMES, SLO_NAMES, Candidate, GridResult, OptimizeResult,
                                            Problem, SolverConfig)
from splitwise_jax.cluster.workload import Workload

_UNIT = {"cost": "$/h", "power": "kW provisioned", "throughput": "req/s"}


def _label(design: str) -> str:
    head, _, tail = design.partition("-")
    return f"{head.capitalize()}-{tail.upper() if head == 'splitwise' else tail.upper()}".replace("HHCAP", "HHcap")


def _pools_text(c: Candidate, splitwise: bool) -> str:
    return f"{c.prompt_machines} prompt + {c.token_machines} token" if splitwise else f"{c.prompt_machines} machines"


def _metrics_dict(m: ClusterMetrics | None) -> dict | None:
    if m is None:
        return None
    return metrics_lists(m)


def _candidate_dict(c: Candidate | None, splitwise: bool) -> dict | None:
    if c is None:
        return None
    d = {}
    if splitwise:
        d.update(prompt_machines=c.prompt_machines, token_machines=c.token_machines,
                 prompt_cap_frac=c.prompt_cap_frac, token_cap_frac=c.token_cap_frac)
    else:
        d.update(machines=c.prompt_machines, cap_frac=c.prompt_cap_frac)
    d.update(feasible=c.feasible, rate_per_s=c.rate_per_s, objective_value=c.objective, cost_per_hour=c.cost_per_hour,
             provisioned_power_kw=c.provisioned_power_kw,
             slo_margins={n: float(c.constraints[i]) for i, n in enumerate(SLO_NAMES)},
             slo_headroom={n: float(np.expm1(c.constraints[i])) for i, n in enumerate(SLO_NAMES)},
             constraints={n: float(c.constraints[i]) for i, n in enumerate(CONSTRAINT_NAMES)})
    if c.metrics is not None:
        d.update(power_kw=float(c.metrics.power_kw), throughput_rps=float(c.metrics.throughput_rps),
                 memory_pressure=float(c.metrics.memory_pressure), rho_prompt_pool=float(c.metrics.rho_prompt_pool),
                 rho_token_pool=float(c.metrics.rho_token_pool))
    return d


def _result_dict(res: OptimizeResult, splitwise: bool, full: Candidate | None, grid: GridResult | None,
                 opt_wall_s: float, searched: Candidate | None = None) -> dict:
    """The JSON of an answer. `searched`: the search's own answer on its classes, before
    any step-up (full resolution, certificate), which is what the grid verifies."""
    d = dict(design=res.design, objective=res.objective, feasible=res.feasible)
    d.update(_candidate_dict(res.best, splitwise) or ({"prompt_machines": None, "token_machines": None}
                                                       if splitwise else {"machines": None}))
    d.update(metrics=_metrics_dict(res.metrics), binding=res.binding, multipliers=res.multipliers,
             continuous=res.continuous, evaluations=res.evaluations, timings_s=dict(res.timings_s, total=opt_wall_s),
             bounds=dict(prompt=res.bounds[0], token=res.bounds[1]))
    if full is not None:
        d["full_resolution"] = dict(_candidate_dict(full, splitwise), metrics=_metrics_dict(full.metrics))
    if grid is not None:
        d["verification"] = dict(grid_best=_candidate_dict(grid.best, splitwise),
                                 matches=same_answer(res.best if searched is None else searched, grid.best,
                                                     res.objective), grid_s=grid.wall_s,
                                 optimizer_s=opt_wall_s, cells_in_box=grid.cells_in_box,
                                 cells_evaluated=grid.cells_evaluated, evaluations=grid.evaluations)
    return d


def _print_result(res: OptimizeResult, cluster: Cluster, title: str, full: Candidate | None, grid: GridResult | None,
                  opt_wall_s: float, bins_text: str, fig12: bool, certified: bool | None = None,
                  searched: Candidate | None = None):
    """The text of an answer; `searched` as in `_result_dict`."""
    splitwise = cluster.strategy.token_pool
    print(title)
    b = res.best
    if b is None:
        c = res.continuous
        print("  no feasible integer configuration found near the continuous optimum "
              f"({c['prompt_machines']:.2f} prompt, {c['token_machines']:.2f} token, {c['rate_per_s']:.2f} req/s)")
        if c["violated"]:
            print("  still violated there: " + ", ".join(f"{n} ({np.expm1(v):+.1%})" for n, v in c["violated"].items()))
        print(f"  pools searched up to {res.bounds[0]} (prompt) and {res.bounds[1]} (token): raise --max-machines "
              "or the budget, or relax --slo")
    else:
        caps = (f"caps {b.prompt_cap_frac:.0%} / {b.token_cap_frac:.0%} of TDP" if splitwise
                else f"cap {b.prompt_cap_frac:.0%} of TDP")
        verdict = f"feasible: {'yes' if b.feasible else 'NO'}"
        if certified is not None:
            verdict = (f"model: {'meets every constraint' if b.feasible else 'misses a constraint'}; "
                       f"simulation: {'certified' if certified else 'NOT certified'} (below)")
        print(f"  answer: {_pools_text(b, splitwise)} machines, {caps}  ->  {verdict}")
        m = b.metrics
        print(f"  load {b.rate_per_s:.2f} req/s   cost ${b.cost_per_hour:,.2f}/h   provisioned {b.provisioned_power_kw:.1f} kW"
              f"   drawn {float(m.power_kw):.1f} kW")
        c = res.continuous
        cont = (f"{c['prompt_machines']:.2f} prompt + {c['token_machines']:.2f} token" if splitwise
                else f"{c['prompt_machines']:.2f} machines")
        extra = f", caps {c['prompt_cap_frac']:.2f}/{c['token_cap_frac']:.2f}" if cluster and res.problem.free_caps != "none" else ""
        rate = f", {c['rate_per_s']:.2f} req/s" if res.objective == "throughput" else ""
        print(f"  continuous optimum: {cont}{extra}{rate}")
        for probe, names in res.binding.items():
            print(f"  binding: {probe:<18} breaks {', '.join(names) if names else 'nothing (ties or bound)'}")
        print(f"  {'SLO':<9} {'limit':>6} {'slowdown':>9} {'headroom':>9}")
        slo = np.asarray(res.problem.slo).reshape(-1)
        sd = np.concatenate([np.ravel(m.slowdown_ttft), np.ravel(m.slowdown_tbt), np.ravel(m.slowdown_e2e)])
        for i, n in enumerate(SLO_NAMES):
            print(f"  {n:<9} {slo[i]:>6.2f} {sd[i]:>9.3f} {np.expm1(b.constraints[i]):>+9.1%}")
        print(f"  KV memory pressure {float(m.memory_pressure):.2f}   prompt-pool load {float(m.rho_prompt_pool):.2f}"
              + (f"   token-pool prompt load {float(m.rho_token_pool):.3f}" if splitwise else ""))
    if full is not None:
        worst = float(np.min(np.expm1(full.constraints[:9])))
        print(f"  full-resolution check (all workload classes): {'meets every constraint' if full.feasible else 'FAILS'}"
              f" (smallest SLO headroom {worst:+.1%})")
    if fig12:
        print(f"  paper (Fig. 12, SplitwiseSim grid search): {paper.FIG12['prompt_machines']} prompt + "
              f"{paper.FIG12['token_machines']} token machines")
    if grid is not None:
        ref = res.best if searched is None else searched
        same = same_answer(ref, grid.best, res.objective)
        gb = grid.best
        what = "nothing feasible" if gb is None else f"{_pools_text(gb, splitwise)} ({gb.objective:,.4g} {_UNIT[res.objective]})"
        whose = "" if ref is res.best or ref is None else f" the search's {_pools_text(ref, splitwise)} (before the step-up below)"
        print(f"  grid (exhaustive over {grid.cells_in_box:,} cells, {grid.cells_evaluated:,} evaluated after exact "
              f"pruning): {what} -> {'matches' if same else ('DIFFERS from' if whose else 'DIFFERS')}{whose}; "
              f"grid {grid.wall_s:.1f} s vs "
              f"optimizer {opt_wall_s:.1f} s")
    t = res.timings_s
    print(f"  timings: start {t['start']:.2f} s, gradient {t['gradient']:.2f} s, repair {t['repair']:.2f} s "
          f"({res.evaluations} evaluations on {bins_text}; first calls include compilation)")


def _print_compare(results: dict, clusters: dict, problem: Problem, ref: str, title: str):
    print(title)
    r0 = results.get(ref)
    ok0 = r0 is not None and r0.feasible
    hdr = (f"  {'design':<16} {'machines (P+T)':>15} {'caps':>9} {'req/s':>8} {'$/h':>9} {'kW prov':>8} "
           f"{'thr/ref':>8} {'cost/ref':>9} {'power/ref':>10}")
    print(hdr)
    for d, r in results.items():
        sw = clusters[d].strategy.token_pool
        if not r.feasible:
            why = ", ".join(f"{n} {np.expm1(v):+.0%}" for n, v in r.continuous["violated"].items())
            print(f"  {d:<16} {'infeasible':>15}  (up to {r.bounds[0]} machines per pool; at the continuous optimum: "
                  f"{why or 'no single constraint'})")
            continue
        b = r.best
        pools = f"{b.prompt_machines}+{b.token_machines}" if sw else f"{b.prompt_machines}"
        caps = f"{b.prompt_cap_frac:.2f}/{b.token_cap_frac:.2f}" if sw else f"{b.prompt_cap_frac:.2f}"
        norm = ["-"] * 3
        if ok0:
            norm = [f"{metric_of(r, k) / metric_of(r0, k):.2f}x" for k in ("throughput", "cost", "power")]
        print(f"  {d:<16} {pools:>15} {caps:>9} {b.rate_per_s:>8.1f} {b.cost_per_hour:>9,.0f} "
              f"{b.provisioned_power_kw:>8.1f} {norm[0]:>8} {norm[1]:>9} {norm[2]:>10}")
    heads = headline_ratios(results, problem)
    if heads:
        print("  paper's headline ratios for this problem (paper vs ours):")
        for h in heads:
            ours = "n/a" if h["ours"] is None else f"{h['ours']:.2f}x"
            print(f"    {h['text']:<72} paper {h['paper']:.2f}x   ours {ours}")



def plot_plane(res: OptimizeResult, cluster: Cluster, workload: Workload, problem: Problem, config: SolverConfig,
               grid: GridResult | None = None, progress: bool = False):
    """The objective over the (prompt, token) plane around the answer (the paper's
    Fig. 12 view); a baseline gets the objective against its machine count.

    Returns:
        A `matplotlib.figure.Figure` (not attached to pyplot).

    Raises:
        ValueError: the result has no feasible answer to centre the plane on.
    """
    from matplotlib.figure import Figure

    b = res.best
    if b is None:
        raise ValueError("--plot needs a feasible answer to centre the plane on")
    splitwise = cluster.strategy.token_pool
    hi_p, hi_t = res.bounds
    p_max = min(hi_p, max(2 * b.prompt_machines, b.prompt_machines + 8))
    t_max = min(hi_t, max(2 * b.token_machines, b.token_machines + 8)) if splitwise else 0
    ps, ts, feas, obj = evaluate_plane(cluster, workload, problem, b, p_max, t_max, config, progress=progress)
    fig = Figure(figsize=(7, 5))
    ax = fig.subplots()
    what = "provisioned power (kW)" if problem.objective == "power" else "cost ($/h)"
    if splitwise:
        z = np.where(feas, obj, np.nan).T
        ax.imshow(np.where(feas, np.nan, 1.0).T, origin="lower", cmap="Greys", vmin=0, vmax=3, aspect="auto",
                  extent=(0.5, p_max + 0.5, 0.5, t_max + 0.5))
        im = ax.imshow(z, origin="lower", cmap="viridis", aspect="auto", extent=(0.5, p_max + 0.5, 0.5, t_max + 0.5))
        fig.colorbar(im, ax=ax, label=f"{what}, where every constraint holds")
        ax.plot(b.prompt_machines, b.token_machines, marker="*", ms=16, color="red", ls="", label="gradient answer")
        if grid is not None and grid.best is not None:
            ax.plot(grid.best.prompt_machines, grid.best.token_machines, marker="o", ms=12, mfc="none", mec="white",
                    ls="", label="grid optimum")
        ax.set_xlabel("prompt machines")
        ax.set_ylabel("token machines")
    else:
        z = np.where(feas[:, 0], obj[:, 0], np.nan)
        ax.plot(ps, obj[:, 0], color="0.7", label="infeasible")
        ax.plot(ps, z, "o-", label="feasible")
        ax.plot(b.prompt_machines, b.objective if problem.objective != "throughput" else b.cost_per_hour, "r*", ms=16,
                label="gradient answer")
        ax.set_xlabel("machines")
        ax.set_ylabel(what)
    ax.set_title(f"{_label(res.design)}: {problem.objective}-optimal at {b.rate_per_s:.1f} req/s "
                 f"(grey: an SLO, memory or stability limit fails)", fontsize=9)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


def plot_compare(results: dict, ref: str):
    """Throughput, cost and power of each feasible design, normalised to `ref`
    (the Figs. 18-19 view). Returns a `matplotlib.figure.Figure`."""
    from matplotlib.figure import Figure

    r0 = results.get(ref)
    if r0 is None or not r0.feasible:
        raise ValueError(f"--plot with --compare-designs needs a feasible reference {ref!r}")
    names = [d for d, r in results.items() if r.feasible]
    keys = ("throughput", "cost", "power")
    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    w = 0.8 / len(keys)
    for j, k in enumerate(keys):
        vals = [metric_of(results[d], k) / metric_of(r0, k) for d in names]
        ax.bar(np.arange(len(names)) + (j - 1) * w, vals, w, label=k)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(names)), [_label(d) for d in names], fontsize=8)
    ax.set_ylabel(f"normalised to {_label(ref)}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
