"""The serving-engine model against real servers, and the paper's question on today's stack.

Three parts (docs/serving.md has the tables):

1. Leave-one-model-out over the public benchmark rows (vLLM on H100 SXM; source:
   github.com/inference-sim/training, measured with kubernetes-sigs/inference-perf):
   fit on every model but one, predict the one left out; per model, metric and
   percentile, plus the overload verdicts and the served rate of overloaded stages.
2. The fluid model against the iteration-level simulation of the same engine under the
   shipped `vllm-2026` stack, on every public stage (stages shortened to 300 s, 60 s in
   smoke runs), P50s side by side.
3. The paper's provisioning on both stacks: the cheapest Baseline-H100 and Splitwise-HH
   clusters meeting every Table VI SLO (BLOOM-176B, coding and conversation at 70 req/s,
   Fig. 12 and Fig. 19's iso-throughput cost problem) under `paper-2023` and `vllm-2026`:
   does phase splitting still pay on today's software, and by how much?

Outputs (studies/out/serving_validation/): ``lomo_rows.csv``, ``lomo_summary.csv``,
``sim_vs_fluid.csv``, ``paper_on_stacks.csv``, ``summary.md``, ``lomo_pred_vs_measured.png``.

Usage:
    python studies/serving_validation.py [--out DIR] [--skip-paper]
    SPLITWISE_SMOKE=1 python studies/serving_validation.py
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pandas as pd

import _common as C

import splitwise_jax as sj

STUDY = "serving_validation"
CREDIT = "Measurements: github.com/inference-sim/training (vLLM on H100 SXM, kubernetes-sigs/inference-perf)."


def lomo(table, steps: int):
    from splitwise_jax.calibrate.benchmarks import START_PHASE
    from splitwise_jax.phases.params import STACKS, load_params

    base = load_params(None, STACKS["paper-2023"][0]).replace(**START_PHASE)
    res = sj.leave_one_model_out(table, steps=steps, start_phase=base)
    f = res["frame"]
    ok = _kept(f)
    rows = []
    for model, g in f.groupby("model"):
        k = ok[g.index]
        for m in ("ttft", "tpot", "e2e"):
            for q in ("p50", "p90", "p99"):
                e = (g[f"pred_{m}_{q}_s"] / g[f"{m}_{q}_s"] - 1)[k]
                rows.append({"held_out": model, "metric": m, "level": q, "stages": int(k.sum()),
                             "median_abs_err_pct": 100 * float(np.median(np.abs(e))),
                             "max_abs_err_pct": 100 * float(np.max(np.abs(e)))})
    return f, pd.DataFrame(rows), res


def _kept(f):
    from splitwise_jax.io.benchmarks import BenchmarkTable, kept_up

    return pd.Series(kept_up(BenchmarkTable(f, "")), index=f.index)


def sim_vs_fluid(table, stack, seconds: float):
    from splitwise_jax.io.benchmark_rows import llm_for, machine_for
    from splitwise_jax.io.benchmarks import validate_benchmarks

    f = table.frame.copy()
    f["duration_s"] = np.minimum(f["duration_s"], seconds)
    short = validate_benchmarks(f.reset_index(drop=True))
    pred = sj.predict_benchmarks(short, stack.params_for_gpu, stack.engine)
    rows = []
    for exp, g in short.frame.groupby("experiment", sort=False):
        g = g.sort_values("stage")
        r0 = g.iloc[0]
        sims = sj.simulate_engine([dict(r) for _, r in g.iterrows()], stack.params_for_gpu("h100-80gb"), stack.engine,
                                  machine_for(r0["gpu"], int(r0["tensor_parallel"])), llm_for(r0["model"]), seed=0)
        for (i, row), s in zip(g.iterrows(), sims):
            d = {"experiment": exp, "stage": int(row["stage"]), "rate_per_s": row["rate_per_s"],
                 "seconds": row["duration_s"], "fluid_overloaded": bool(pred.loc[i, "pred_overloaded"]),
                 "sim_failed": s["failed"], "sim_preemptions": s["preemptions"]}
            for m in ("ttft", "tpot", "e2e"):
                d[f"fluid_{m}_p50_s"] = pred.loc[i, f"pred_{m}_p50_s"]
                d[f"sim_{m}_p50_s"] = s.get(f"{m}_p50_s", np.nan)
                d[f"{m}_p50_sim_over_fluid_minus_1"] = d[f"sim_{m}_p50_s"] / d[f"fluid_{m}_p50_s"] - 1
            d["fluid_throughput"] = pred.loc[i, "pred_throughput_req_per_s"]
            d["sim_throughput"] = s["throughput_req_per_s"]
            rows.append(d)
    return pd.DataFrame(rows)


def paper_on_stacks(workloads, designs):
    from splitwise_jax.optimize import Problem, optimize
    from splitwise_jax.phases.params import resolve_params

    rows = []
    for stack in ("paper-2023", "vllm-2026"):
        path = resolve_params(stack)
        for wname in workloads:
            wl = C.study_workload(wname, 70.0)
            for design in designs:
                t0 = time.perf_counter()
                c = sj.make_cluster(design, 1.0, 0.0 if C.is_baseline(design) else 1.0, params_path=path)
                res = optimize(c, wl, Problem("cost", rate_per_s=70.0), C.solver_config())
                b = res.best
                ok = b is not None
                rows.append({"stack": stack, "workload": wname, "design": design, "feasible": ok,
                             "n_prompt": float(b.prompt_machines) if ok else np.nan,
                             "n_token": float(b.token_machines) if ok else np.nan,
                             "cost_per_hour": float(b.cost_per_hour) if ok else np.nan,
                             "seconds": round(time.perf_counter() - t0, 1)})
                print(f"  {stack} {wname} {design}: {rows[-1]}", flush=True)
    df = pd.DataFrame(rows)
    for (stack, wname), g in df.groupby(["stack", "workload"]):
        base = g[g.design == "baseline-h100"]["cost_per_hour"]
        if len(base):
            df.loc[g.index, "cost_vs_baseline_h100"] = g["cost_per_hour"] / float(base.iloc[0])
    return df


def _md(df, index: bool = True) -> str:
    """A markdown table (no tabulate dependency)."""
    df = df.reset_index() if index else df
    cols = [str(c) for c in df.columns]
    fmt = lambda v: f"{v:.3g}" if isinstance(v, (float, np.floating)) else str(v)  # noqa: E731
    return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                     + ["| " + " | ".join(fmt(v) for v in r) + " |" for r in df.itertuples(index=False)])


def plot(frame, path):
    plt = C.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    ok = _kept(frame)
    for ax, m in zip(axes, ("ttft", "tpot", "e2e")):
        for model, g in frame[ok].groupby("model"):
            for q, mk in zip(("p50", "p90", "p99"), ("o", "s", "^")):
                ax.scatter(g[f"{m}_{q}_s"], g[f"pred_{m}_{q}_s"], marker=mk, s=20,
                           label=f"{model.split('/')[-1]} {q}")
        lo = min(frame[ok][[f"{m}_p50_s", f"pred_{m}_p50_s"]].min()) * 0.7
        hi = max(frame[ok][[f"{m}_p99_s", f"pred_{m}_p99_s"]].max()) * 1.4
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.plot([lo, hi], [0.9 * lo, 0.9 * hi], "k:", lw=0.5)
        ax.plot([lo, hi], [1.1 * lo, 1.1 * hi], "k:", lw=0.5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{m.upper()}: held-out model")
        ax.set_xlabel("measured (s)")
        ax.set_ylabel("predicted (s)")
    axes[0].legend(fontsize=6)
    fig.suptitle("Leave-one-model-out, vLLM on H100 SXM (" + CREDIT + ")", fontsize=8)
    fig.tight_layout()
    return C.savefig(fig, path)


def main(argv=None) -> int:
    args = C.parse_args(STUDY, __doc__, argv, extra=lambda ap: ap.add_argument(
        "--skip-paper", action="store_true", help="skip part 3 (the optimiser runs)"))
    t0 = C.banner(STUDY)
    from splitwise_jax._paths import shared_path

    table = sj.read_benchmarks(shared_path("validation", "real_vllm_h100", "runs.csv"))
    stack = sj.load_stack("vllm-2026")
    paths = []
    frame, summary, res = lomo(table, steps=60 if C.SMOKE else 160)
    paths += [C.write_csv(frame, args.out / "lomo_rows.csv"), C.write_csv(summary, args.out / "lomo_summary.csv")]
    paths.append(plot(frame, args.out / "lomo_pred_vs_measured.png"))
    C.print_frame(summary, "leave-one-model-out, median |relative error| % over stages that kept up")
    print("overall:", res["summary"], res["verdicts"])
    sim = sim_vs_fluid(table, stack, 60.0 if C.SMOKE else 300.0)
    paths.append(C.write_csv(sim, args.out / "sim_vs_fluid.csv"))
    C.print_frame(sim, "simulation vs fluid model (P50s)")
    lines = [f"# serving_validation ({'smoke' if C.SMOKE else 'full'} run)", "", CREDIT, "",
             "## Leave-one-model-out (median |relative error| %, stages that kept up)", "",
             _md(summary.pivot_table(index=["held_out", "metric"], columns="level",
                                     values="median_abs_err_pct").round(1)), "", f"All held-out stages: {res['summary']}", "",
             f"Verdicts: {res['verdicts']}", "", "## Simulation vs fluid (P50, sim / fluid - 1)", "",
             _md(sim[["experiment", "stage", "rate_per_s", "ttft_p50_sim_over_fluid_minus_1",
                  "tpot_p50_sim_over_fluid_minus_1", "e2e_p50_sim_over_fluid_minus_1", "sim_failed",
                  "sim_preemptions", "fluid_throughput", "sim_throughput"]].round(3), index=False)]
    if not args.skip_paper:
        workloads = ("coding",) if C.SMOKE else ("coding", "conversation")
        paper = paper_on_stacks(workloads, ("baseline-h100", "splitwise-hh"))
        paths.append(C.write_csv(paper, args.out / "paper_on_stacks.csv"))
        C.print_frame(paper, "cheapest cluster meeting every SLO at 70 req/s, BLOOM-176B")
        lines += ["", "## The paper's provisioning on both stacks (70 req/s, BLOOM-176B, cost objective)", "",
                  _md(paper.round(3), index=False)]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    paths.append(args.out / "summary.md")
    C.done(STUDY, t0, paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
