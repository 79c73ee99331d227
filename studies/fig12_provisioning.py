"""Fig. 12: provisioning heat maps of the Splitwise designs (coding, 70 req/s, BLOOM-176B).

The paper searches the 2-D grid of (prompt machines, token machines) with its simulator
and reports that the cheapest Splitwise-HH cluster meeting every SLO of Table VI at
70 req/s of the coding trace is 27 prompt + 3 token machines. We evaluate the same grid
with the analytical model (one vmapped `evaluate`) and draw, per design:

* the worst SLO margin min log(limit / slowdown) over the nine Table VI percentiles
  (> 0 meets every SLO), with the feasible region's edge;
* the cluster cost ($/h) and provisioned power (kW) where the SLOs hold, with the
  cost-optimal and power-optimal configurations marked.

The optimal configurations are `splitwise_jax.optimize`'s (cost and power problems at
the same load: gradient on relaxed pool sizes, integer repair); the grid is the picture,
and the table also reports the cheapest grid point beside the optimiser's answer.

Outputs (studies/out/fig12_provisioning/): ``fig12_grid.csv`` (every grid point and its
metrics), ``fig12_optima.csv`` (cheapest and least-power feasible point per design),
``fig12_paper_vs_ours.csv``, ``fig12_heatmaps.png``.

Usage:
    python studies/fig12_provisioning.py [--out DIR] [--rate 70] [--workload coding]
    SPLITWISE_SMOKE=1 python studies/fig12_provisioning.py    # HH only, 5 x 4 grid
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

import _common as C

import splitwise_jax as sj
from splitwise_jax.specs import paper
from splitwise_jax.optimize import Problem

STUDY = "fig12_provisioning"
PAPER_HH = (paper.FIG12["prompt_machines"], paper.FIG12["token_machines"])  # Fig. 12: cheapest Splitwise-HH


def grids(design: str):
    """Prompt- and token-pool sizes searched (A100 prompt machines need about twice as many)."""
    if C.SMOKE:
        return np.array([20.0, 25, 30, 35, 40]), np.array([2.0, 5, 10, 20])
    top = 100.0 if sj.DESIGNS[design].prompt_machine == "dgx-a100" else 60.0
    return np.round(np.linspace(10.0, top, 26)), np.arange(1.0, 41.0, 1.0)


def main(argv=None) -> int:
    def extra(ap):
        ap.add_argument("--rate", type=float, default=70.0, help="arrival rate, req/s (paper: 70)")
        ap.add_argument("--workload", default="coding", choices=("coding", "conversation"))

    args = C.parse_args(STUDY, __doc__, argv, extra)
    t0 = C.banner(STUDY)
    designs = ("splitwise-hh",) if C.SMOKE else C.SPLITWISE
    wl = C.study_workload(args.workload, args.rate)
    frames, optima = [], []
    for d in designs:
        gp, gt = grids(d)
        P, T = np.meshgrid(gp, gt, indexing="ij")
        df = C.sweep(C.cluster(d), wl, n_prompt=P.ravel(), n_token=T.ravel())
        df.insert(0, "design", d)
        frames.append(df)
        feas = df[df["meets_slo"]]
        row = {"design": d, "feasible_points": int(len(feas)), "grid_points": int(len(df))}
        if len(feas):
            g = feas.sort_values(["cost_per_hour", "n_prompt"]).iloc[0]
            row.update(grid_cheapest_n_prompt=g["n_prompt"], grid_cheapest_n_token=g["n_token"],
                       grid_cheapest_cost_per_hour=g["cost_per_hour"])
        for objective in ("cost", "power"):
            res = C.solve(d, wl, Problem(objective, rate_per_s=args.rate))
            if res.best is not None:
                b = res.best
                row.update({f"{objective}_opt_n_prompt": float(b.prompt_machines),
                            f"{objective}_opt_n_token": float(b.token_machines),
                            f"{objective}_opt_cost_per_hour": b.cost_per_hour,
                            f"{objective}_opt_power_kw": b.provisioned_power_kw})
        optima.append(row)
        print(f"{d}: {len(feas)}/{len(df)} grid points meet every SLO", flush=True)
    grid = pd.concat(frames, ignore_index=True)
    opt = pd.DataFrame(optima)
    C.print_frame(opt, f"Cost- and power-optimal configurations (splitwise_jax.optimize), {args.workload} at "
                       f"{args.rate:g} req/s")

    hh = opt.set_index("design").loc["splitwise-hh"]
    up, _ = C.machine_cost("splitwise-hh")
    ours_p = hh.get("cost_opt_n_prompt", np.nan)
    ours_t = hh.get("cost_opt_n_token", np.nan)
    rows = [
        {"claim": "HH cheapest: prompt machines", "paper": PAPER_HH[0], "ours": ours_p},
        {"claim": "HH cheapest: token machines", "paper": PAPER_HH[1], "ours": ours_t},
        {"claim": "HH cheapest: total machines", "paper": sum(PAPER_HH), "ours": ours_p + ours_t},
        {"claim": "HH cheapest: cost", "paper": sum(PAPER_HH) * up, "ours": hh.get("cost_opt_cost_per_hour", np.nan),
         "unit": "$/h"},
        {"claim": "HH cheapest point of the plotted grid: machines P+T", "paper": sum(PAPER_HH),
         "ours": hh.get("grid_cheapest_n_prompt", np.nan) + hh.get("grid_cheapest_n_token", np.nan),
         "note": "the grid is coarser than the integers in full runs"},
    ]
    if args.workload != paper.FIG12["workload"] or args.rate != paper.FIG12["rate_per_s"]:
        rows = [dict(r, note="paper's point is coding at 70 req/s") for r in rows]
    table = C.paper_vs_ours(rows, "Fig. 12: cheapest Splitwise-HH meeting all SLOs (paper vs ours)")

    paths = [C.write_csv(grid, args.out / "fig12_grid.csv"), C.write_csv(opt, args.out / "fig12_optima.csv"),
             C.write_csv(table, args.out / "fig12_paper_vs_ours.csv")]
    paths.append(plot(grid, opt, designs, args))
    C.done(STUDY, t0, paths)
    return 0


def plot(grid, opt, designs, args):
    plt = C.pyplot()
    fig, axes = plt.subplots(len(designs), 3, figsize=(14, 3.6 * len(designs)), squeeze=False)
    for row, d in zip(axes, designs):
        df = grid[grid["design"] == d]
        gp, gt = grids(d)
        shape = (len(gp), len(gt))
        margin = df["min_margin"].to_numpy().reshape(shape)
        feas = df["meets_slo"].to_numpy().reshape(shape)
        panels = [("worst SLO margin log(limit/slowdown)", margin, "RdYlGn", dict(vmin=-1.0, vmax=1.0)),
                  ("cost $/h (SLOs met)", np.where(feas, df["cost_per_hour"].to_numpy().reshape(shape), np.nan),
                   "viridis", {}),
                  ("provisioned power kW (SLOs met)",
                   np.where(feas, df["provisioned_power_kw"].to_numpy().reshape(shape), np.nan), "magma", {})]
        o = opt.set_index("design").loc[d]
        for ax, (title, z, cmap, kw) in zip(row, panels):
            im = ax.pcolormesh(gt, gp, z, shading="nearest", cmap=cmap, **kw)
            fig.colorbar(im, ax=ax)
            if feas.any() and (~feas).any():
                ax.contour(gt, gp, margin, levels=[0.0], colors="k", linewidths=1.0)
            if np.isfinite(o.get("cost_opt_n_prompt", np.nan)):
                ax.plot(o["cost_opt_n_token"], o["cost_opt_n_prompt"], "w*", ms=14, mec="k", label="cheapest")
            if np.isfinite(o.get("power_opt_n_prompt", np.nan)):
                ax.plot(o["power_opt_n_token"], o["power_opt_n_prompt"], "cs", ms=7, mec="k", label="least power")
            if d == "splitwise-hh" and args.workload == "coding":
                ax.plot(*PAPER_HH[::-1], "rx", ms=10, mew=2, label="paper's cheapest (27P+3T)")
            ax.set_title(f"{d}: {title}", fontsize=9)
            ax.set_xlabel("token machines")
            ax.set_ylabel("prompt machines")
        row[0].legend(fontsize=7, loc="upper right")
    fig.suptitle(f"Fig. 12 (ours): {args.workload} at {args.rate:g} req/s, BLOOM-176B"
                 + (" [SMOKE]" if C.SMOKE else ""))
    return C.savefig(fig, args.out / "fig12_heatmaps.png")


if __name__ == "__main__":
    sys.exit(main())
