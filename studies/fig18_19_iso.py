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

With ``--method grid`` (the default in smoke mode, where the optimiser's compile alone
exceeds the smoke budget), or if the optimiser is missing or fails, the same problems are
solved by the studies' grid search (`_common.best_on_budget` along the budget line,
`_common.cheapest_meeting_slo` on a pool-size grid) and the ``method`` column says so.

Outputs (studies/out/fig18_19_iso/): ``fig18_19_designs.csv`` (one row per design and
problem; ``throughput_rps`` of the budget problems is re-measured by the studies'
bisection, ``throughput_at_slo_check`` for all), ``fig18_19_no_slo.csv``,
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

STUDY = "fig18_19_iso"
PROBLEMS = ("iso-power", "iso-cost", "iso-throughput-cost", "iso-throughput-power")
MAX_MACHINES = 200  # per pool: Baseline-A100 at Baseline-H100's throughput needs > 128


def solve(design: str, wl, wl_name: str, problem: str, target_rate: float | None, method: str):
    """One sizing problem: (n_prompt, n_token, rate, method) or None if infeasible."""
    opt = C.optimizer() if method == "optimize" else None
    if opt is not None and problem == "iso-power":
        # The same problem `iso_power_pools` solves (and caches) for Figs. 16, 17 and 20.
        n_p, n_t = C.iso_power_pools(design, wl_name, search=True)
        return n_p, n_t, np.nan, "optimize"
    if opt is not None:
        kw = dict(max_machines=MAX_MACHINES)
        prob = {"iso-power": lambda: opt.Problem("throughput", power_budget_kw=C.iso_power_budget_kw(), **kw),
                "iso-cost": lambda: opt.Problem("throughput", cost_budget_per_h=C.iso_cost_budget(), **kw),
                "iso-throughput-cost": lambda: opt.Problem("cost", rate_per_s=target_rate, **kw),
                "iso-throughput-power": lambda: opt.Problem("power", rate_per_s=target_rate, **kw)}[problem]()
        try:
            res = opt.optimize(C.make_cluster(design, 1.0, 0.0 if C.is_baseline(design) else 1.0), wl, prob,
                               C.solver_config())
        except Exception as err:  # noqa: BLE001 - report and fall back to the grid below
            print(f"note: optimize failed on {design} {problem} ({type(err).__name__}: {err}); grid search instead")
        else:
            if res.best is None:
                return None
            b = res.best
            return float(b.prompt_machines), float(b.token_machines), float(b.rate_per_s), "optimize"
    c = C.cluster(design)
    if problem in ("iso-power", "iso-cost"):
        per = "power" if problem == "iso-power" else "cost"
        budget = C.iso_power_budget_kw() if per == "power" else C.iso_cost_budget()
        best, _ = C.best_on_budget(design, wl, budget, per, c=c)
        return float(best["n_prompt"]), float(best["n_token"]), float(best["throughput_at_slo"]), "grid"
    objective = "cost_per_hour" if problem == "iso-throughput-cost" else "provisioned_power_kw"
    key = (design, target_rate)
    if key not in _GRIDS:  # both iso-throughput problems read the same grid
        hi, step = (MAX_MACHINES, 8.0) if C.is_baseline(design) else (MAX_MACHINES // 2, 6.0)
        if not C.SMOKE:
            step /= 4.0
        grid = np.arange(1.0, hi + 1.0, step)
        _GRIDS[key] = C.cheapest_meeting_slo(c, wl.with_rate(target_rate), design, grid, grid)[1]
    ok = _GRIDS[key][_GRIDS[key]["meets_slo"]]
    if ok.empty:
        return None
    best = ok.sort_values([objective, "n_prompt"]).iloc[0]
    return float(best["n_prompt"]), float(best["n_token"]), target_rate, "grid"


_GRIDS: dict = {}


def no_slo_per_dollar(design: str, wl) -> dict:
    """Highest capacity per $/h over the iso-cost budget's splits.

    Capacity: the highest rate the cluster keeps up with (serves >= `KEEP_UP` of it),
    with no latency limit: the paper's batch-job view.
    """
    line = C.budget_line(design, C.iso_cost_budget(), "cost")
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
        ap.add_argument("--method", default="auto", choices=("auto", "optimize", "grid"),
                        help="sizing: splitwise_jax.optimize or the studies' grid search (auto: grid in smoke "
                             "mode, where the optimiser's compile alone exceeds the smoke budget; optimize otherwise)")

    args = C.parse_args(STUDY, __doc__, argv, extra)
    t0 = C.banner(STUDY)
    method = ("grid" if C.SMOKE else "optimize") if args.method == "auto" else args.method
    print(f"sizing method: {method}")
    wl = C.study_workload(args.workload)
    up = {d: C.machine_cost(d) for d in C.ALL_DESIGNS}
    pw = {d: C.machine_power_kw(d) for d in C.ALL_DESIGNS}
    rows = []
    target = None
    for problem in PROBLEMS:
        for d in C.ALL_DESIGNS:
            t = time.perf_counter()
            sol = solve(d, wl, args.workload, problem, target, method)
            if sol is None:
                rows.append(dict(problem=problem, design=d, feasible=False))
                print(f"{problem:>22} {d:<16} infeasible", flush=True)
                continue
            n_p, n_t, rate, how = sol
            # Every answer is re-checked with the same evaluator: the throughput at SLO of
            # the chosen pools (bisection), and the SLO verdict at the iso-throughput target.
            check = float(C.throughput_at_slo(C.cluster(d), wl, n_p, n_t, r_hi=600.0))
            if problem.startswith("iso-throughput"):
                meets = bool(C.sweep(C.cluster(d), wl, n_prompt=n_p, n_token=n_t, rate=target)["meets_slo"].iloc[0])
            else:
                meets = True
            rows.append(dict(problem=problem, design=d, feasible=True, method=how, n_prompt=n_p, n_token=n_t,
                             machines=n_p + n_t, throughput_rps=check if problem in ("iso-power", "iso-cost") else rate,
                             solver_rate_rps=rate, throughput_at_slo_check=check, meets_slo_at_target=meets,
                             cost_per_hour=n_p * up[d][0] + n_t * up[d][1],
                             provisioned_power_kw=n_p * pw[d][0] + n_t * pw[d][1]))
            rate = rows[-1]["throughput_rps"]
            print(f"{problem:>22} {d:<16} {n_p:4g}P+{n_t:4g}T  {rate:7.2f} req/s  "
                  f"${rows[-1]['cost_per_hour']:7.0f}/h  {rows[-1]['provisioned_power_kw']:6.0f} kW  "
                  f"({how}, {time.perf_counter() - t:.1f} s)", flush=True)
        if problem == "iso-power":
            bh = [r for r in rows if r["design"] == "baseline-h100" and r.get("feasible")]
            target = bh[0]["throughput_rps"] if bh else 50.0
            print(f"iso-throughput target: Baseline-H100's iso-power throughput at SLO, {target:.2f} req/s")
    res = pd.DataFrame(rows)
    no_slo = pd.DataFrame([no_slo_per_dollar(d, wl) for d in C.ALL_DESIGNS])
    C.print_frame(res, f"Sizing problems, {args.workload}")
    C.print_frame(no_slo, "No SLO: best capacity per $/h over the iso-cost splits")

    table = C.paper_vs_ours(claims(res, no_slo), "Figs. 18-19: iso-power / iso-cost / iso-throughput (paper vs ours)")
    paths = [C.write_csv(res, args.out / "fig18_19_designs.csv"), C.write_csv(no_slo, args.out / "fig18_19_no_slo.csv"),
             C.write_csv(table, args.out / "fig18_19_paper_vs_ours.csv"), plot(res, args)]
    C.done(STUDY, t0, paths)
    return 0


def claims(res: pd.DataFrame, no_slo: pd.DataFrame) -> list[dict]:
    def get(problem, design, col):
        r = res[(res["problem"] == problem) & (res["design"] == design)]
        if r.empty or not bool(r["feasible"].iloc[0]):
            return np.nan
        return float(r[col].iloc[0])

    def ratio(problem, a, b, col):
        return get(problem, a, col) / get(problem, b, col)

    ns = no_slo.set_index("design")["rps_per_dollar_hour"]
    return [
        {"claim": "iso-power: AA / Baseline-A100 throughput", "paper": 2.15,
         "ours": ratio("iso-power", "splitwise-aa", "baseline-a100", "throughput_rps")},
        {"claim": "iso-power: AA / Baseline-A100 cost", "paper": 1.0,
         "ours": ratio("iso-power", "splitwise-aa", "baseline-a100", "cost_per_hour"), "note": "paper: same cost"},
        {"claim": "iso-power: HA / Baseline-H100 throughput", "paper": 1.18,
         "ours": ratio("iso-power", "splitwise-ha", "baseline-h100", "throughput_rps")},
        {"claim": "iso-power: HA / Baseline-H100 cost", "paper": 0.90,
         "ours": ratio("iso-power", "splitwise-ha", "baseline-h100", "cost_per_hour")},
        {"claim": "iso-cost: AA / Baseline-H100 throughput", "paper": 1.4,
         "ours": ratio("iso-cost", "splitwise-aa", "baseline-h100", "throughput_rps")},
        {"claim": "iso-cost: AA / Baseline-H100 power", "paper": 1.25,
         "ours": ratio("iso-cost", "splitwise-aa", "baseline-h100", "provisioned_power_kw")},
        {"claim": "iso-cost: AA / Baseline-H100 machines (floor space)", "paper": 2.0,
         "ours": ratio("iso-cost", "splitwise-aa", "baseline-h100", "machines")},
        {"claim": "iso-throughput: HHcap / Baseline-H100 power (power-opt.)", "paper": 0.75,
         "ours": ratio("iso-throughput-power", "splitwise-hhcap", "baseline-h100", "provisioned_power_kw")},
        {"claim": "iso-throughput: AA / Baseline-H100 cost (cost-opt.)", "paper": 0.75,
         "ours": ratio("iso-throughput-cost", "splitwise-aa", "baseline-h100", "cost_per_hour")},
        {"claim": "no SLO: AA / Baseline-A100 throughput per $", "paper": 1.0,
         "ours": float(ns["splitwise-aa"] / ns["baseline-a100"]), "note": "paper: 0.89 = 0.89 req/s/$"},
        {"claim": "no SLO: HH / Baseline-H100 throughput per $", "paper": 1.0,
         "ours": float(ns["splitwise-hh"] / ns["baseline-h100"]), "note": "paper: 0.75 = 0.75 req/s/$"},
    ]


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
