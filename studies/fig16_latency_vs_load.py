"""Fig. 16: latency percentiles against load for every design, coding and conversation.

Each design is its iso-power, throughput-optimised cluster (the paper's budget of 40
DGX-H100; sizing by `splitwise_jax.optimize`, see `_common.iso_power_pools`). We sweep
the arrival rate and draw the P50/P90/P99 slowdowns of TTFT, TBT and E2E against
Table VI's limits, and report each design's throughput at SLO (the highest rate meeting
all nine limits, by bisection).

Paper claims compared:
* coding: Splitwise-HH, -HHcap and -AA beat Baseline-H100;
* conversation: Splitwise-HHcap is the best design on every metric;
* Splitwise-HA's mixed pool carries high load (from ~90 req/s its H100 machines join it).

Outputs (studies/out/fig16_latency_vs_load/): ``fig16_latency_vs_load.csv`` (every
design x workload x rate), ``fig16_throughput_at_slo.csv``, ``fig16_paper_vs_ours.csv``,
``fig16_coding.png``, ``fig16_conversation.png``.

Usage:
    python studies/fig16_latency_vs_load.py [--out DIR]
    SPLITWISE_SMOKE=1 python studies/fig16_latency_vs_load.py
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

import _common as C

from splitwise_jax.specs import paper

STUDY = "fig16_latency_vs_load"
WORKLOADS = ("coding", "conversation")
HA_MIXED_RATE = paper.FIG16_HA_MIXED_RATE  # req/s: the paper's load where HA's mixed pool takes over
MIXED_ACTIVE = 0.05  # share of prompts drafted that counts as "mixed pool active" (cluster status bit)


def rates_for(wl_name: str) -> np.ndarray:
    hi = 150.0 if wl_name == "coding" else 250.0
    return np.linspace(hi / 6, hi, 4) if C.SMOKE else np.linspace(hi / 20, hi, 20)


def main(argv=None) -> int:
    args = C.parse_args(STUDY, __doc__, argv)
    t0 = C.banner(STUDY)
    frames, summary = [], []
    for wl_name in WORKLOADS:
        wl = C.study_workload(wl_name)
        rates = rates_for(wl_name)
        for d in C.ALL_DESIGNS:
            n_p, n_t = C.iso_power_pools(d, wl_name)
            c = C.cluster(d)
            df = C.sweep(c, wl, n_prompt=n_p, n_token=n_t, rate=rates)
            df.insert(0, "workload", wl_name)
            df.insert(0, "design", d)
            frames.append(df)
            thr = float(C.throughput_at_slo(c, wl, n_p, n_t, r_hi=2.0 * rates[-1]))
            summary.append(dict(design=d, workload=wl_name, n_prompt=n_p, n_token=n_t, throughput_at_slo=thr,
                                cost_per_hour=float(df["cost_per_hour"].iloc[0]),
                                provisioned_power_kw=float(df["provisioned_power_kw"].iloc[0])))
            print(f"{wl_name:>12} {d:<16} {n_p:3g}P+{n_t:3g}T  throughput at SLO {thr:7.1f} req/s", flush=True)
    data = pd.concat(frames, ignore_index=True)
    summ = pd.DataFrame(summary)
    ref = summ[summ["design"] == "baseline-h100"].set_index("workload")["throughput_at_slo"]
    summ["vs_baseline_h100"] = summ["throughput_at_slo"] / summ["workload"].map(ref)
    C.print_frame(summ, "Throughput at SLO of the iso-power clusters")

    rows = []
    for d in ("splitwise-hh", "splitwise-hhcap", "splitwise-aa"):
        r = float(summ[(summ["design"] == d) & (summ["workload"] == "coding")]["vs_baseline_h100"].iloc[0])
        rows.append({"claim": f"coding: {d} beats Baseline-H100 (throughput at SLO ratio)", "paper": "> 1",
                     "ours": r, "note": "yes" if r > 1 else "no"})
    conv = summ[summ["workload"] == "conversation"].sort_values("throughput_at_slo", ascending=False)
    rows.append({"claim": "conversation: best design by throughput at SLO", "paper": "splitwise-hhcap",
                 "ours": conv["design"].iloc[0]})
    wins, load = hhcap_wins(data, summ)
    rows.append({"claim": "conversation: latency percentiles (of 9) where HHcap is lowest", "paper": 9, "ours": wins,
                 "note": f"at {load:.0f} req/s (Baseline-H100's throughput at SLO)"})
    ha = data[(data["design"] == "splitwise-ha") & (data["workload"] == "coding")]
    frac90 = float(np.interp(HA_MIXED_RATE, ha["rate"], ha["mixed_prompt_frac"]))
    active = ha[ha["mixed_prompt_frac"] > MIXED_ACTIVE]["rate"]
    rows.append({"claim": "coding: HA prompts drafted to the mixed pool at 90 req/s", "paper": "high",
                 "ours": frac90, "note": "share of prompts"})
    rows.append({"claim": "coding: HA load where the mixed pool activates", "paper": HA_MIXED_RATE,
                 "ours": float(active.min()) if len(active) else np.nan, "unit": "req/s",
                 "note": f"first swept rate with > {MIXED_ACTIVE:.0%} of prompts drafted"})
    table = C.paper_vs_ours(rows, "Fig. 16: latency vs load (paper vs ours)")

    paths = [C.write_csv(data, args.out / "fig16_latency_vs_load.csv"),
             C.write_csv(summ, args.out / "fig16_throughput_at_slo.csv"),
             C.write_csv(table, args.out / "fig16_paper_vs_ours.csv")]
    for wl_name in WORKLOADS:
        paths.append(plot(data[data["workload"] == wl_name], summ[summ["workload"] == wl_name], wl_name, args))
    C.done(STUDY, t0, paths)
    return 0


def hhcap_wins(data: pd.DataFrame, summ: pd.DataFrame) -> tuple[int, float]:
    """On how many of the nine latency percentiles HHcap is the lowest of all designs,
    interpolated to the conversation load at which Baseline-H100 reaches its SLO."""
    conv = data[data["workload"] == "conversation"]
    s = summ[summ["workload"] == "conversation"].set_index("design")
    load = float(s.loc["baseline-h100", "throughput_at_slo"]) or float(conv["rate"].min())
    at = {d: {c: float(np.interp(load, g["rate"], g[c])) for c in C.LATENCY_COLS} for d, g in conv.groupby("design")}
    wins = sum(min(at, key=lambda d: at[d][c]) == "splitwise-hhcap" for c in C.LATENCY_COLS)
    return int(wins), load


def plot(data, summ, wl_name, args):
    plt = C.pyplot()

    fig, axes = plt.subplots(3, 3, figsize=(14, 10), sharex=True)
    for i, met in enumerate(C.METRICS):
        for j, pc in enumerate(C.PCTS):
            ax = axes[i, j]
            for d, g in data.groupby("design", sort=False):
                ax.plot(g["rate"], g[f"slowdown_{met}_{pc}"], "-o", ms=3, color=C.COLOURS[d], label=d)
            ax.axhline(paper.TABLE_VI_SLO[i][j], color="k", ls=":", lw=1, label="SLO (Table VI)")
            ax.set_yscale("log")
            ax.set_title(f"{met.upper()} {pc.upper()} slowdown", fontsize=10)
            if i == 2:
                ax.set_xlabel(f"{wl_name} load (req/s)")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"Fig. 16 (ours): {wl_name}, iso-power clusters (40 DGX-H100 of power)"
                 + (" [SMOKE]" if C.SMOKE else ""))
    return C.savefig(fig, args.out / f"fig16_{wl_name}.png")


if __name__ == "__main__":
    sys.exit(main())
