"""Chunked prefill (Sarathi-Serve, vLLM's default since 2024) against Splitwise.

Today's alternative to splitting the phases is not the paper's baseline (whole prompts
that stall every decode on the machine) but chunked prefill: every iteration carries the
running decodes plus up to a token budget of prompt chunks (`splitwise_jax.cluster.chunked`).
This study

1. checks the fluid model of chunked prefill against the request-level simulator's
   chunked-prefill policy (`simulate.SimConfig(chunked_prefill_tokens=...)`, the same
   clusters and calibrated timing) on a set of configurations, with the paper's
   whole-prompt baseline checked on the same points for reference;
2. redraws the paper's Fig. 16 problem (latency percentiles against load, iso-power
   clusters of 40 DGX-H100) with chunked-prefill H100 clusters added, the token budget
   chosen by throughput at SLO over a grid (the budget is a differentiable knob: its
   gradient is reported too);
3. solves the Figs. 18/19 problems (iso-power and iso-cost throughput, iso-throughput
   cost and power) for Baseline-H100, Chunked-H100 (best budget), Splitwise-HH and
   Splitwise-HHcap;
4. says, per workload and problem, whether splitting still pays.

BLOOM-176B on DGX-H100 unless said; coding and conversation presets; Table VI SLOs.

Outputs (studies/out/chunked_prefill/): ``chunked_vs_simulator.csv`` (one row per
configuration and design: fluid and simulated percentiles, relative errors),
``chunked_vs_simulator_summary.csv``, ``chunked_budget.csv`` (throughput at SLO per token
budget), ``chunked_latency_vs_load.csv``, ``chunked_problems.csv`` (the Figs. 18/19
problems), ``chunked_verdict.csv``, ``chunked_vs_simulator.png``, ``chunked_coding.png``,
``chunked_conversation.png``.

Usage:
    python studies/chunked_prefill.py [--out DIR] [--skip-problems]
    SPLITWISE_SMOKE=1 python studies/chunked_prefill.py
"""

from __future__ import annotations

import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

import _common as C

from splitwise_jax.specs import paper
import splitwise_jax as sj
from splitwise_jax.cli.evaluate import metrics_to_dict
from splitwise_jax.optimize import Problem, optimize

STUDY = "chunked_prefill"
WORKLOADS = ("coding", "conversation")
BUDGETS = (512.0,) if C.SMOKE else (128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0)
SPLIT = ("splitwise-hh", "splitwise-hhcap")
ISO_MACHINES = 40  # the paper's iso-power / iso-cost reference: 40 DGX-H100
MAX_MACHINES = 200
# Simulator check: (workload, model, machine, machines, req/s, token budget). Loads from
# light to past saturation; 20 and 25 machines stress the prompt queue and KV memory.
SIM_CONFIGS = (
    [("coding", "bloom-176b", "dgx-h100", 40, 70.0, 512), ("conversation", "bloom-176b", "dgx-h100", 40, 70.0, 512)]
    if C.SMOKE else
    [("coding", "bloom-176b", "dgx-h100", 40, 70.0, 512), ("coding", "bloom-176b", "dgx-h100", 40, 70.0, 256),
     ("coding", "bloom-176b", "dgx-h100", 40, 70.0, 2048), ("coding", "bloom-176b", "dgx-h100", 30, 70.0, 1024),
     ("coding", "bloom-176b", "dgx-h100", 40, 100.0, 512), ("coding", "bloom-176b", "dgx-h100", 20, 70.0, 512),
     ("coding", "bloom-176b", "dgx-a100", 70, 70.0, 512),
     ("conversation", "bloom-176b", "dgx-h100", 40, 70.0, 512),
     ("conversation", "bloom-176b", "dgx-h100", 40, 70.0, 2048),
     ("conversation", "bloom-176b", "dgx-h100", 40, 110.0, 512),
     ("conversation", "bloom-176b", "dgx-h100", 25, 70.0, 512),
     ("coding", "llama2-70b", "dgx-h100", 8, 40.0, 512), ("conversation", "llama2-70b", "dgx-h100", 8, 40.0, 512)])
SIM_HORIZON_S = 30.0 if C.SMOKE else 120.0
PRESET = {"dgx-h100": ("baseline-h100", "chunked-h100"), "dgx-a100": ("baseline-a100", "chunked-a100")}


# --------------------------------------------------------------------------------------
# 1. The fluid model against the simulator

_FLUID = {}


def _fluid(cluster, wl, horizon_s):
    if "fn" not in _FLUID:
        _FLUID["fn"] = jax.jit(sj.evaluate)
    return metrics_to_dict(_FLUID["fn"](sj.uniform_names(cluster), wl, horizon_s))


def sim_check() -> pd.DataFrame:
    rows = []
    seen = set()
    for wl_name, model, machine, n, rate, budget in SIM_CONFIGS:
        wl = sj.load_workload(wl_name)
        tr = sj.poisson_trace(wl, rate, SIM_HORIZON_S, seed=0)
        for policy in ("chunked", "whole prompts"):
            key = (wl_name, model, machine, n, rate, budget if policy == "chunked" else None)
            if key in seen:  # whole prompts: one run per point, whatever the budget
                continue
            seen.add(key)
            base, chunked = PRESET[machine]
            if policy == "chunked":
                c = sj.make_cluster(chunked, n, model=model, chunked_prefill_tokens=budget)
                # The simulator runs a colocated cluster with the chunked-prefill policy.
                sim_cluster, cfg = c.replace(kind="baseline", scheduling=sj.Scheduling()), sj.SimConfig(
                    chunked_prefill_tokens=int(budget))
            else:
                c = sj.make_cluster(base, n, model=model)
                sim_cluster, cfg = c, sj.SimConfig()
            t0 = time.perf_counter()
            fm = _fluid(c, wl.with_rate(rate), SIM_HORIZON_S)
            t1 = time.perf_counter()
            sm = sj.simulate(sim_cluster, tr, cfg).metrics
            t2 = time.perf_counter()
            row = dict(workload=wl_name, model=model, machine=machine, machines=n, rate=rate,
                       token_budget=budget if policy == "chunked" else np.nan, policy=policy, requests=len(tr),
                       fluid_meets=fm["meets_slo"], sim_meets=sm["meets_slo"], fluid_status=fm["status"],
                       sim_status=sm["status"], fluid_kv_pressure=fm["utilisation"]["kv_memory_pressure"],
                       fluid_s=t1 - t0, sim_s=t2 - t1)
            for met in C.METRICS:
                for pc in C.PCTS:
                    f, s = fm[f"{met}_s"][pc], sm[f"{met}_s"][pc]
                    row[f"fluid_{met}_{pc}_s"], row[f"sim_{met}_{pc}_s"], row[f"err_{met}_{pc}"] = f, s, f / s - 1.0
            rows.append(row)
            print(f"{wl_name:>12} {model:<11} {n:3d} x {machine} {rate:5.0f} req/s  {policy:<13} "
                  f"C={budget if policy == 'chunked' else '-':<5}  TTFT P50/P99 err "
                  f"{row['err_ttft_p50']:+.0%}/{row['err_ttft_p99']:+.0%}  TBT {row['err_tbt_p50']:+.0%}/"
                  f"{row['err_tbt_p99']:+.0%}  E2E {row['err_e2e_p50']:+.0%}/{row['err_e2e_p99']:+.0%}  "
                  f"verdict {'agrees' if row['fluid_meets'] == row['sim_meets'] else 'DIFFERS'}  "
                  f"(sim {t2 - t1:.1f} s)", flush=True)
    return pd.DataFrame(rows)


def sim_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Median and largest |relative error| per metric and percentile, per policy; SLO
    verdict agreement. Rows "healthy" leave out the points the fluid model flags as
    prompt-overloaded or with KV memory over 75% reserved (see the notes)."""
    out = []
    for policy, g in df.groupby("policy"):
        for subset, h in (("all", g), ("healthy", g[(g["fluid_status"] == "ok") & (g["fluid_kv_pressure"] < 0.75)])):
            if not len(h):
                continue
            row = dict(policy=policy, points=subset, n=len(h),
                       verdict_agreement=float((h["fluid_meets"] == h["sim_meets"]).mean()))
            for met in C.METRICS:
                for pc in C.PCTS:
                    e = h[f"err_{met}_{pc}"].abs()
                    row[f"median_abs_err_{met}_{pc}"] = float(e.median())
                    row[f"max_abs_err_{met}_{pc}"] = float(e.max())
            out.append(row)
    return pd.DataFrame(out)


# --------------------------------------------------------------------------------------
# 2. Fig. 16's problem with chunked prefill


def chunked_cluster(budget: float, machine: str = "dgx-h100"):
    return sj.uniform_names(sj.make_cluster(PRESET[machine][1], 1.0, chunked_prefill_tokens=budget))


def with_budget(c, budget: float):
    return c.replace(scheduling=dataclasses.replace(c.scheduling, token_budget=budget))


def budget_gradient(c, wl, rate: float) -> float:
    """d(worst SLO margin)/d(log budget) at the rate: the budget as a differentiable knob."""
    def margin(log_b):
        m = sj.evaluate(with_budget(c, jnp.exp(log_b)), wl.with_rate(rate), C.HORIZON_S, resolution=C.RESOLUTION)
        return jnp.min(m.slo_margin)

    return float(jax.grad(margin)(jnp.log(c.scheduling.token_budget)))


def latency_vs_load(wl_name: str, wl, budget_rows: list) -> tuple[pd.DataFrame, list]:
    hi = 150.0 if wl_name == "coding" else 250.0
    rates = np.linspace(hi / 6, hi, 4) if C.SMOKE else np.linspace(hi / 20, hi, 20)
    c0 = chunked_cluster(BUDGETS[0])
    thr = {b: float(C.throughput_at_slo(with_budget(c0, b), wl, ISO_MACHINES, r_hi=2.0 * rates[-1])) for b in BUDGETS}
    best = max(BUDGETS, key=lambda b: (thr[b], -b))
    for b in BUDGETS:
        budget_rows.append(dict(workload=wl_name, token_budget=b, machines=ISO_MACHINES, throughput_at_slo=thr[b],
                                best=b == best))
    # The gradient compiles a derivative program: full runs only.
    grad = np.nan if C.SMOKE else budget_gradient(with_budget(c0, best).replace(n_prompt=float(ISO_MACHINES)), wl,
                                                  0.9 * thr[best])
    print(f"{wl_name:>12} chunked-h100 x {ISO_MACHINES}: throughput at SLO by budget "
          + ", ".join(f"{b:g}: {thr[b]:.1f}" for b in BUDGETS)
          + f"  -> best {best:g}; d(worst margin)/d(log budget) at 90% of it: {grad:+.3f}", flush=True)
    frames, summary = [], []
    designs = [("baseline-h100", C.cluster("baseline-h100"), ISO_MACHINES, 0.0),
               (f"chunked-h100 (C={best:g})", with_budget(c0, best), ISO_MACHINES, 0.0)]
    for d in SPLIT:
        n_p, n_t = C.iso_power_pools(d, wl_name)
        designs.append((d, C.cluster(d), n_p, n_t))
    for name, c, n_p, n_t in designs:
        df = C.sweep(c, wl, n_prompt=n_p, n_token=n_t, rate=rates)
        df.insert(0, "workload", wl_name)
        df.insert(0, "design", name)
        frames.append(df)
        t = thr[best] if name.startswith("chunked") else float(C.throughput_at_slo(c, wl, n_p, n_t,
                                                                                     r_hi=2.0 * rates[-1]))
        summary.append(dict(workload=wl_name, design=name, n_prompt=n_p, n_token=n_t, throughput_at_slo=t,
                            budget_gradient=grad if name.startswith("chunked") else np.nan))
        print(f"{wl_name:>12} {name:<22} {n_p:3g}P+{n_t:3g}T  throughput at SLO {t:7.1f} req/s", flush=True)
    return pd.concat(frames, ignore_index=True), summary


# --------------------------------------------------------------------------------------
# 3. Figs. 18/19's problems


def colocated_smallest(c, wl, rate: float, unit: float) -> tuple[float, float]:
    """Smallest colocated pool meeting every SLO at `rate` (machines, its cost or power)."""
    n = np.arange(1.0, MAX_MACHINES + 1.0)
    df = C.sweep(c, wl, n_prompt=n, n_token=0.0, rate=rate)
    ok = df["meets_slo"].to_numpy()
    if not ok.any():
        return np.nan, np.nan
    k = float(n[int(np.argmax(ok))])
    return k, k * unit


def problems(wl_name: str, wl, best_budget: float, summary: list) -> list:
    """The four Figs. 18/19 problems for the four designs (rows of chunked_problems.csv)."""
    rows = []
    thr = {s["design"]: s["throughput_at_slo"] for s in summary if s["workload"] == wl_name}
    target = thr["baseline-h100"]  # iso-throughput: what Baseline-H100's iso-power cluster sustains
    h100 = sj.make_cluster("baseline-h100", 1.0)
    unit_cost = float(h100.prompt.machine.cost_per_hour)
    unit_kw = float(h100.prompt.machine.provisioned_power_w) / 1e3
    chunk_name = f"chunked-h100 (C={best_budget:g})"
    for name, c in (("baseline-h100", C.cluster("baseline-h100")),
                    (chunk_name, with_budget(chunked_cluster(BUDGETS[0]), best_budget))):
        # Iso-power and iso-cost: 40 machines buy the budget (H100 at full power); more
        # machines never lower a colocated design's throughput at SLO.
        for prob in ("iso-power", "iso-cost"):
            rows.append(dict(workload=wl_name, problem=prob, design=name, n_prompt=ISO_MACHINES, n_token=0.0,
                             throughput_rps=thr[name], cost_per_hour=ISO_MACHINES * unit_cost,
                             provisioned_power_kw=ISO_MACHINES * unit_kw))
        n, cost = colocated_smallest(c, wl, target, unit_cost)
        for prob in ("iso-throughput-cost", "iso-throughput-power"):
            rows.append(dict(workload=wl_name, problem=prob, design=name, n_prompt=n, n_token=0.0,
                             throughput_rps=target, cost_per_hour=cost, provisioned_power_kw=n * unit_kw))
    for d in SPLIT:
        n_p, n_t = C.iso_power_pools(d, wl_name)
        up, ut = C.machine_cost(d)
        pp, pt = C.machine_power_kw(d)
        rows.append(dict(workload=wl_name, problem="iso-power", design=d, n_prompt=n_p, n_token=n_t,
                         throughput_rps=thr[d], cost_per_hour=n_p * up + n_t * ut,
                         provisioned_power_kw=n_p * pp + n_t * pt))
        for prob, problem in (("iso-cost", Problem("throughput", cost_budget_per_h=C.iso_cost_budget(),
                                                   max_machines=MAX_MACHINES)),
                              ("iso-throughput-cost", Problem("cost", rate_per_s=target, max_machines=MAX_MACHINES)),
                              ("iso-throughput-power", Problem("power", rate_per_s=target,
                                                               max_machines=MAX_MACHINES))):
            res = optimize(sj.make_cluster(d, 1.0, 1.0), wl, problem, C.solver_config())
            b = res.best
            if b is None:
                rows.append(dict(workload=wl_name, problem=prob, design=d, n_prompt=np.nan, n_token=np.nan,
                                 throughput_rps=np.nan, cost_per_hour=np.nan, provisioned_power_kw=np.nan))
                continue
            rate = float(C.throughput_at_slo(C.cluster(d), wl, b.prompt_machines, b.token_machines, r_hi=600.0)) \
                if prob == "iso-cost" else target
            rows.append(dict(workload=wl_name, problem=prob, design=d, n_prompt=b.prompt_machines,
                             n_token=b.token_machines, throughput_rps=rate, cost_per_hour=b.cost_per_hour,
                             provisioned_power_kw=b.provisioned_power_kw))
    for r in rows[-len(rows):]:
        print(f"{wl_name:>12} {r['problem']:>21} {r['design']:<22} {r['n_prompt']:4g}P+{r['n_token']:4g}T "
              f"{r['throughput_rps']:7.1f} req/s ${r['cost_per_hour']:7.0f}/h {r['provisioned_power_kw']:6.0f} kW",
              flush=True)
    return rows


def verdict(prob: pd.DataFrame) -> pd.DataFrame:
    """Per workload and problem: the best Splitwise design against the best colocated
    chunked design (ratio of the problem's objective; > 1 means splitting pays)."""
    out = []
    for (wl_name, p), g in prob.groupby(["workload", "problem"], sort=False):
        key = {"iso-power": "throughput_rps", "iso-cost": "throughput_rps", "iso-throughput-cost": "cost_per_hour",
               "iso-throughput-power": "provisioned_power_kw"}[p]
        higher = p in ("iso-power", "iso-cost")
        sw = g[g["design"].isin(SPLIT)].dropna(subset=[key])
        ch = g[g["design"].str.startswith("chunked")].dropna(subset=[key])
        bl = g[g["design"] == "baseline-h100"].dropna(subset=[key])
        if not len(sw) or not len(ch):
            continue
        s = sw.loc[sw[key].idxmax() if higher else sw[key].idxmin()]
        c = ch.iloc[0]
        ratio = (s[key] / c[key]) if higher else (c[key] / s[key])
        out.append(dict(workload=wl_name, problem=p, objective=key, best_splitwise=s["design"],
                        splitwise=float(s[key]), chunked=float(c[key]),
                        baseline_h100=float(bl[key].iloc[0]) if len(bl) else np.nan,
                        splitwise_advantage=float(ratio), splitting_pays=bool(ratio > 1.05)))
    df = pd.DataFrame(out)
    C.print_frame(df, "Where splitting still pays (advantage = Splitwise's objective over chunked prefill's, > 1.05: pays)")
    return df


# --------------------------------------------------------------------------------------
# Figures


def plot_sim(df: pd.DataFrame, args):
    plt = C.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for ax, met in zip(axes, C.METRICS):
        for policy, mk in (("chunked", "o"), ("whole prompts", "x")):
            g = df[df["policy"] == policy]
            for pc, col in zip(C.PCTS, ("tab:blue", "tab:orange", "tab:red")):
                ax.scatter(g[f"sim_{met}_{pc}_s"], g[f"fluid_{met}_{pc}_s"], marker=mk, color=col, s=22,
                           label=f"{policy} {pc.upper()}")
        lo = min(df[[f"sim_{met}_{p}_s" for p in C.PCTS]].min().min(), df[[f"fluid_{met}_{p}_s" for p in C.PCTS]].min().min())
        hi = max(df[[f"sim_{met}_{p}_s" for p in C.PCTS]].max().max(), df[[f"fluid_{met}_{p}_s" for p in C.PCTS]].max().max())
        ax.plot([lo, hi], [lo, hi], "k:", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"simulated {met.upper()} (s)")
        ax.set_ylabel(f"fluid model {met.upper()} (s)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Chunked prefill: fluid model vs request-level simulation (o), whole prompts for reference (x)")
    return C.savefig(fig, args.out / "chunked_vs_simulator.png")


def plot_load(data: pd.DataFrame, wl_name: str, args):
    plt = C.pyplot()
    fig, axes = plt.subplots(3, 3, figsize=(14, 10), sharex=True)
    colours = {"baseline-h100": "black", "splitwise-hh": "tab:green", "splitwise-hhcap": "tab:olive"}
    for i, met in enumerate(C.METRICS):
        for j, pc in enumerate(C.PCTS):
            ax = axes[i, j]
            for d, g in data.groupby("design", sort=False):
                ax.plot(g["rate"], g[f"slowdown_{met}_{pc}"], "-o", ms=3, color=colours.get(d, "tab:purple"), label=d)
            ax.axhline(paper.TABLE_VI_SLO[i][j], color="k", ls=":", lw=1)
            ax.set_yscale("log")
            ax.set_title(f"{met.upper()} {pc.upper()} slowdown", fontsize=9)
            if i == 2:
                ax.set_xlabel("req/s")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"{wl_name}: iso-power clusters (40 DGX-H100 of power), chunked prefill added")
    return C.savefig(fig, args.out / f"chunked_{wl_name}.png")


def main(argv=None) -> int:
    def extra(ap):
        ap.add_argument("--skip-problems", action="store_true", help="skip the Figs. 18/19 problems (optimiser runs)")

    args = C.parse_args(STUDY, __doc__, argv, extra)
    t0 = C.banner(STUDY)
    sim = sim_check()
    C.write_csv(sim, args.out / "chunked_vs_simulator.csv")  # written first: the rest takes long
    summ = sim_summary(sim)
    C.print_frame(summ[["policy", "points", "n", "verdict_agreement"] + [f"median_abs_err_{m}_{p}" for m in C.METRICS
                                                                         for p in C.PCTS]],
                  "Fluid model vs simulator: median |relative error| per percentile, SLO verdict agreement")
    paths = [C.write_csv(sim, args.out / "chunked_vs_simulator.csv"),
             C.write_csv(summ, args.out / "chunked_vs_simulator_summary.csv"), plot_sim(sim, args)]

    frames, summary, budget_rows, prob_rows = [], [], [], []
    for wl_name in WORKLOADS:
        wl = C.study_workload(wl_name)
        data, s = latency_vs_load(wl_name, wl, budget_rows)
        frames.append(data)
        summary += s
        paths.append(plot_load(data, wl_name, args))
        if not args.skip_problems and not C.SMOKE:
            best = next(r["token_budget"] for r in budget_rows if r["workload"] == wl_name and r["best"])
            prob_rows += problems(wl_name, wl, best, summary)
    paths += [C.write_csv(pd.DataFrame(budget_rows), args.out / "chunked_budget.csv"),
              C.write_csv(pd.concat(frames, ignore_index=True), args.out / "chunked_latency_vs_load.csv")]
    summ_load = pd.DataFrame(summary)
    C.print_frame(summ_load, "Throughput at SLO, iso-power clusters (Fig. 16's problem)")
    if prob_rows:
        prob = pd.DataFrame(prob_rows)
        paths += [C.write_csv(prob, args.out / "chunked_problems.csv"),
                  C.write_csv(verdict(prob), args.out / "chunked_verdict.csv")]
    else:
        # Smoke runs (and --skip-problems): the iso-power verdict from Fig. 16's problem only.
        rows = []
        for wl_name, g in summ_load.groupby("workload", sort=False):
            sw = g[g["design"].isin(SPLIT)]["throughput_at_slo"].max()
            ch = g[g["design"].str.startswith("chunked")]["throughput_at_slo"].iloc[0]
            rows.append(dict(workload=wl_name, problem="iso-power", objective="throughput_rps", splitwise=sw,
                             chunked=ch, splitwise_advantage=sw / ch if ch else np.nan,
                             splitting_pays=bool(ch and sw / ch > 1.05)))
        paths.append(C.write_csv(pd.DataFrame(rows), args.out / "chunked_verdict.csv"))
        C.print_frame(pd.DataFrame(rows), "Where splitting still pays (iso-power only)")
    C.done(STUDY, t0, paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
