"""Fig. 20: robustness of a cluster sized for one workload (or model) running another.

Each design's iso-power, throughput-optimised cluster (40 DGX-H100 of power) is sized
for one workload and then run on another; we report its throughput at SLO (highest rate
meeting all nine Table VI limits, bisection) against a cluster sized for the workload it
actually runs.

(a) Sized for coding, running conversation (BLOOM-176B). Paper: Splitwise-AA and -HH
    lose nothing (their mixed pool absorbs the change); -HA and -HHcap lose 7%.
(b) Sized for BLOOM-176B (coding), running Llama2-70B (coding). Paper: every Splitwise
    design still beats the baselines.

Outputs (studies/out/fig20_robustness/): ``fig20_robustness.csv``,
``fig20_paper_vs_ours.csv``, ``fig20_robustness.png``.

Usage:
    python studies/fig20_robustness.py [--out DIR]
    SPLITWISE_SMOKE=1 python studies/fig20_robustness.py
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

import _common as C

from splitwise_jax.specs import paper

STUDY = "fig20_robustness"
PAPER_LOSS = paper.FIG20_LOSS


def main(argv=None) -> int:
    args = C.parse_args(STUDY, __doc__, argv)
    t0 = C.banner(STUDY)
    conv = C.study_workload("conversation")
    code = C.study_workload("coding")
    rows = []
    for d in C.ALL_DESIGNS:
        sized_code = C.iso_power_pools(d, "coding")
        sized_conv = C.iso_power_pools(d, "conversation")
        c = C.cluster(d)
        pools = np.array([sized_code, sized_conv])
        thr = C.throughput_at_slo(c, conv, pools[:, 0], pools[:, 1], r_hi=600.0)
        rows.append(dict(experiment="coding-sized on conversation", design=d, model="bloom-176b",
                         n_prompt=sized_code[0], n_token=sized_code[1], throughput_at_slo=float(thr[0]),
                         reference_n_prompt=sized_conv[0], reference_n_token=sized_conv[1],
                         reference_throughput_at_slo=float(thr[1])))
        llama = C.cluster(d, model="llama2-70b")
        t_llama = float(C.throughput_at_slo(llama, code, *sized_code, r_hi=5000.0))
        rows.append(dict(experiment="bloom-sized on llama2-70b", design=d, model="llama2-70b",
                         n_prompt=sized_code[0], n_token=sized_code[1], throughput_at_slo=t_llama))
        print(f"{d:<16} coding-sized {sized_code[0]:g}P+{sized_code[1]:g}T on conversation {thr[0]:7.1f} req/s "
              f"(conversation-sized {sized_conv[0]:g}P+{sized_conv[1]:g}T: {thr[1]:7.1f}); "
              f"on Llama2-70B {t_llama:7.1f}", flush=True)
    res = pd.DataFrame(rows)
    with np.errstate(divide="ignore", invalid="ignore"):
        res["loss_vs_reference"] = 1.0 - res["throughput_at_slo"] / res["reference_throughput_at_slo"]
    C.print_frame(res, "Cross-workload and cross-model throughput at SLO")

    a = res[res["experiment"] == "coding-sized on conversation"].set_index("design")
    b = res[res["experiment"] == "bloom-sized on llama2-70b"].set_index("design")
    best_base = float(b.loc[list(C.BASELINES), "throughput_at_slo"].max())
    table_rows = [{"claim": f"coding-sized on conversation: {d} throughput loss", "paper": PAPER_LOSS[d],
                   "ours": float(a.loc[d, "loss_vs_reference"]),
                   "note": "vs the conversation-sized cluster; negative = gain"} for d in C.SPLITWISE]
    table_rows += [{"claim": f"BLOOM-sized on Llama2-70B: {d} / best baseline throughput", "paper": "> 1",
                    "ours": float(b.loc[d, "throughput_at_slo"]) / best_base if best_base > 0 else np.nan,
                    "note": "beats" if float(b.loc[d, "throughput_at_slo"]) > best_base else "does not beat"}
                   for d in C.SPLITWISE]
    table = C.paper_vs_ours(table_rows, "Fig. 20: robustness (paper vs ours)")
    paths = [C.write_csv(res, args.out / "fig20_robustness.csv"),
             C.write_csv(table, args.out / "fig20_paper_vs_ours.csv"), plot(res, args)]
    C.done(STUDY, t0, paths)
    return 0


def plot(res, args):
    plt = C.pyplot()
    fig, ax = plt.subplots(1, 2, figsize=(13, 4.2))
    x = np.arange(len(C.ALL_DESIGNS))
    labels = [d.replace("splitwise-", "SW-").replace("baseline-", "B-") for d in C.ALL_DESIGNS]
    a = res[res["experiment"] == "coding-sized on conversation"].set_index("design").reindex(C.ALL_DESIGNS)
    ax[0].bar(x - 0.2, a["reference_throughput_at_slo"], 0.4, label="sized for conversation", color="tab:gray")
    ax[0].bar(x + 0.2, a["throughput_at_slo"], 0.4, label="sized for coding", color="tab:blue")
    ax[0].set_xticks(x, labels, rotation=30)
    ax[0].set(ylabel="conversation throughput at SLO (req/s)", title="(a) coding-sized cluster on conversation")
    ax[0].legend(fontsize=8)
    b = res[res["experiment"] == "bloom-sized on llama2-70b"].set_index("design").reindex(C.ALL_DESIGNS)
    ax[1].bar(x, b["throughput_at_slo"], color=[C.COLOURS[d] for d in C.ALL_DESIGNS])
    ax[1].set_xticks(x, labels, rotation=30)
    ax[1].set(ylabel="Llama2-70B coding throughput at SLO (req/s)", title="(b) BLOOM-sized cluster on Llama2-70B")
    fig.suptitle("Fig. 20 (ours): iso-power clusters off their design point" + (" [SMOKE]" if C.SMOKE else ""))
    return C.savefig(fig, args.out / "fig20_robustness.png")


if __name__ == "__main__":
    sys.exit(main())
