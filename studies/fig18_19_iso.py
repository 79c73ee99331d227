"""Figs. 18 and 19: iso-power, iso-cost and iso-throughput cluster designs (BLOOM-176B).

For every design we solve, with `splitwise_jax.optimize` (gradient on relaxed pool sizes,
then an integer repair; see its docstring), four sizing problems on the coding trace:

* iso-power, throughput-optimised (Fig. 18): the highest rate meeting every SLO within
  the provisioned power of 40 DGX-H100;
* iso-cost, throughput-optimised (Fig. 18): the same within the cost of 40 DGX-H100;
* iso-throughput, cost-optimised and power-optimised (Fig. 19): the cheapest and the
  least power-hungry cluster meeting every SLO at the rate Baseline-H100's iso-power
  cluster sustains.

Plus the no-SLO (batch job) view: the highest throughput per $/h any split of the iso-cost
budget reaches when latency does not matter (capacity at overload).

Smoke runs solve the same problems with the same optimiser (at the studies' smoke
resolution); an optimiser failure fails the study. The no-SLO view is not an optimiser
problem: the optimiser keeps KV memory within capacity, whereas without SLOs a cluster
may overflow decodes into the mixed pool, so it is a capacity search (the package's
`search_boundary`) over the integer splits that spend the iso-cost budget.

Outputs (studies/out/fig18_19_iso/): ``fig18_19_designs.csv`` (one row per design and
problem; ``throughput_rps`` of the budget problems is re-measured by the studies'
search, ``throughput_at_slo_check`` for all), ``fig18_19_no_slo.csv``,
``fig18_19_paper_vs_ours.csv``, ``fig18_19_iso.png``.

Usage:
    python studies/fig18_19_iso.py [--out DIR] [--workload coding]
    SPLITWISE_SMOKE=1 python studies/fig18_19_iso.py
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pandas as pd

import _common as C

from splitwise_jax.specs import paper
from splitwise_jax.optimize import Problem

STUDY = "fig18_19_iso"
PROBLEMS = ("iso-power", "iso-cost", "iso-throughput-cost", "iso-throughput-power")
MAX_MACHINES = 200  # per pool: Baseline-A100 at Baseline-H100's throughput needs > 128
# Smoke runs solve every problem but iso-power (a stored split, below) for one design of
# each kind (the same optimiser, two compiled programs per kind): CI runs the code path
# that produces the published numbers; claims about the other designs read "-" there.
SMOKE_DESIGNS = ("baseline-h100", "splitwise-hh")


def solve(design: str, wl, wl_name: str, problem: str, target_rate: float | None):
    """One sizing problem by `splitwise_jax.optimize`: (n_prompt, n_token, rate), or None
    if the optimiser finds no feasible cluster."""
    if problem == "iso-power":
        # The same problem `iso_power_pools` solves (and caches) for Figs. 16, 17 and 20.
        # Smoke runs take its stored split (`_common._SMOKE_ISO_POWER`): the iso-cost
        # problem below runs the same optimiser on a throughput problem under a budget
        # (and tests/test_optimize.py the power budget), so CI still runs that code, and
        # the smoke run is ~20 s shorter.
        n_p, n_t = C.iso_power_pools(design, wl_name, search=not C.SMOKE)
        return n_p, n_t, np.nan
    kw = dict(max_machines=MAX_MACHINES)
    prob = {"iso-cost": lambda: Problem("throughput", cost_budget_per_h=C.iso_cost_budget(), **kw),
            "iso-throughput-cost": lambda: Problem("cost", rate_per_s=target_rate, **kw),
            "iso-throughput-power": lambda: Problem("power", rate_per_s=target_rate, **kw)}[problem]()
    res = C.solve(design, wl, prob)
    if res.best is None:
        return None
    b = res.best
    return float(b.prompt_machines), float(b.token_machines), float(b.rate_per_s)


def iso_cost_splits(design: str) -> np.ndarray:
    """Integer (n_prompt, n_token) splits that spend as much of the iso-cost budget as
    they can: for every prompt-pool size, the most token machines that still fit; a
    baseline gets its largest machine count. The x axis of the no-SLO view."""
    budget = C.iso_cost_budget()
    unit_p, unit_t = C.machine_cost(design)
    if C.is_baseline(design):
        return np.array([[np.floor(budget / unit_p + 1e-9), 0.0]])
    n_p = np.arange(1.0, np.floor(budget / unit_p + 1e-9))
    n_t = np.floor((budget - n_p * unit_p) / unit_t + 1e-9)
    return np.stack([n_p, n_t], axis=1)[n_t >= 1]


def no_slo_per_dollar(design: str, wl) -> dict:
    """Highest capacity per $/h over the iso-cost budget's splits.

    Capacity: the highest rate the cluster keeps up with (serves >= `KEEP_UP` of it),
    with no latency limit: the paper's batch-job view.
    """
    line = iso_cost_splits(design)
    if len(line) > 12:
        line = line[:: max(1, len(line) // (6 if C.SMOKE else 24))]
    cap = C.throughput_at_slo(C.cluster(design), wl, line[:, 0], line[:, 1], r_hi=2000.0, criterion="capacity")
    up, ut = C.machine_cost(design)
    cost = line[:, 0] * up + line[:, 1] * ut
    per = cap / cost
    i = int(np.argmax(per))
    return dict(design=design, n_prompt=line[i, 0], n_token=line[i, 1], capacity_rps=float(cap[i]),
                cost_per_hour=float(cost[i]), rps_per_dollar_hour=float(per[i]))


def main(argv=None) -> int:
    def extra(ap):
        ap.add_argument("--workload", default="coding", choices=("coding", "conversation"))

    args = C.parse_args(STUDY, __doc__, argv, extra)
    t0 = C.banner(STUDY)
    designs = SMOKE_DESIGNS if C.SMOKE else C.ALL_DESIGNS
    wl = C.study_workload(args.workload)
    up = {d: C.machine_cost(d) for d in C.ALL_DESIGNS}
    pw = {d: C.machine_power_kw(d) for d in C.ALL_DESIGNS}
    rows = []
    target = None
    for problem in PROBLEMS:
        for d in designs:
            t = time.perf_counter()
            sol = solve(d, wl, args.workload, problem, target)
            if sol is None:
                rows.append(dict(problem=problem, design=d, feasible=False))
                print(f"{problem:>22} {d:<16} infeasible", flush=True)
                continue
            n_p, n_t, rate = sol
            # Every answer is re-checked with the same evaluator: the throughput at SLO of
            # the chosen pools (bisection), and the SLO verdict at the iso-throughput target.
            check = float(C.throughput_at_slo(C.cluster(d), wl, n_p, n_t, r_hi=600.0))
            if problem.startswith("iso-throughput"):
                meets = bool(C.sweep(C.cluster(d), wl, n_prompt=n_p, n_token=n_t, rate=target)["meets_slo"].iloc[0])
            else:
                meets = True
            rows.append(dict(problem=problem, design=d, feasible=True, n_prompt=n_p, n_token=n_t,
                             machines=n_p + n_t, throughput_rps=check if problem in ("iso-power", "iso-cost") else rate,
                             solver_rate_rps=rate, throughput_at_slo_check=check, meets_slo_at_target=meets,
                             cost_per_hour=n_p * up[d][0] + n_t * up[d][1],
                             provisioned_power_kw=n_p * pw[d][0] + n_t * pw[d][1]))
            rate = rows[-1]["throughput_rps"]
            print(f"{problem:>22} {d:<16} {n_p:4g}P+{n_t:4g}T  {rate:7.2f} req/s  "
                  f"${rows[-1]['cost_per_hour']:7.0f}/h  {rows[-1]['provisioned_power_kw']:6.0f} kW  "
                  f"({time.perf_counter() - t:.1f} s)", flush=True)
        if problem == "iso-power":
            bh = [r for r in rows if r["design"] == "baseline-h100" and r.get("feasible")]
            target = bh[0]["throughput_rps"] if bh else 50.0
            print(f"iso-throughput target: Baseline-H100's iso-power throughput at SLO, {target:.2f} req/s")
    res = pd.DataFrame(rows)
    no_slo = pd.DataFrame([no_slo_per_dollar(d, wl) for d in designs])
    C.print_frame(res, f"Sizing problems, {args.workload}")
    C.print_frame(no_slo, "No SLO: best capacity per $/h over the iso-cost splits")

    table = C.paper_vs_ours(claims(res, no_slo), "Figs. 18-19: iso-power / iso-cost / iso-throughput (paper vs ours)")
    paths = [C.write_csv(res, args.out / "fig18_19_designs.csv"), C.write_csv(no_slo, args.out / "fig18_19_no_slo.csv"),
             C.write_csv(table, args.out / "fig18_19_paper_vs_ours.csv"), plot(res, args)]
    C.done(STUDY, t0, paths)
    return 0


#: Our problem names for the paper's (`paper.HEADLINES`) and our columns for its metrics.
_PROBLEM_OF = {"iso-power": "iso-power", "iso-cost": "iso-cost", "cost": "iso-throughput-cost",
               "power": "iso-throughput-power"}
_COLUMN_OF = {"throughput": "throughput_rps", "cost": "cost_per_hour", "power": "provisioned_power_kw",
              "machines": "machines"}


def claims(res: pd.DataFrame, no_slo: pd.DataFrame) -> list[dict]:
    """Paper vs ours for every headline of Figs. 18-19 (`paper.HEADLINES`) and the no-SLO view."""
    def get(problem, design, col):
        r = res[(res["problem"] == problem) & (res["design"] == design)]
        if r.empty or not bool(r["feasible"].iloc[0]):
            return np.nan
        return float(r[col].iloc[0])

    def short(d):
        return d.replace("splitwise-", "").upper().replace("BASELINE-", "Baseline-").replace("HHCAP", "HHcap")

    out = []
    for h in paper.HEADLINES:
        problem, col = _PROBLEM_OF[h["problem"]], _COLUMN_OF[h["metric"]]
        ours = get(problem, h["design"], col) / get(problem, h["reference"], col)
        out.append({"claim": f"{problem}: {short(h['design'])} / {short(h['reference'])} {h['metric']}",
                    "paper": h["paper"], "ours": ours, "note": h["text"]})
    ns = no_slo.set_index("design")["rps_per_dollar_hour"]
    for (d, ref), ratio in paper.NO_SLO_PER_DOLLAR.items():
        out.append({"claim": f"no SLO: {short(d)} / {short(ref)} throughput per $", "paper": ratio,
                    "ours": float(ns.get(d, np.nan) / ns.get(ref, np.nan)),
                    "note": f"paper: {paper.NO_SLO_RPS_PER_DOLLAR[ref]:g} req/s/$ each"})
    return out


def plot(res: pd.DataFrame, args):
    plt = C.pyplot()
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
    panels = [("iso-power", "throughput_rps", "req/s at SLO"), ("iso-cost", "throughput_rps", "req/s at SLO"),
              ("iso-throughput-cost", "cost_per_hour", "$/h"), ("iso-throughput-power", "provisioned_power_kw", "kW")]
    for ax, (problem, col, unit) in zip(axes, panels):
        sub = res[(res["problem"] == problem)].set_index("design").reindex(C.ALL_DESIGNS)
        vals = sub[col].astype(float).to_numpy()
        bars = ax.bar(range(len(vals)), np.nan_to_num(vals), color=[C.COLOURS[d] for d in C.ALL_DESIGNS])
        for b, (_, r) in zip(bars, sub.iterrows()):
            if r.get("feasible") is True or r.get("feasible") == 1.0:
                ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{r['n_prompt']:g}P\n{r['n_token']:g}T",
                        ha="center", va="bottom", fontsize=6)
        labels = [d.replace("splitwise-", "SW-").replace("baseline-", "B-") for d in C.ALL_DESIGNS]
        ax.set_xticks(range(len(vals)), labels, rotation=30, fontsize=8)
        ax.set(title=f"{problem}: {col}", ylabel=unit)
    fig.suptitle(f"Figs. 18-19 (ours): {args.workload}, BLOOM-176B" + (" [SMOKE]" if C.SMOKE else ""))
    return C.savefig(fig, args.out / "fig18_19_iso.png")


if __name__ == "__main__":
    sys.exit(main())
