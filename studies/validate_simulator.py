"""Validate the request-level simulator (GitHub issue 11).

Two modes:

``--mode reference`` (default): the simulator against every reference run of
SplitwiseSim in the shared validation folder (``splitwisesim_runs.csv``, 72 runs, and
``boundary_runs.csv``, 52 runs including the real-arrival replays), with the
reference's own phase timing (``make_cluster(..., phase_model="splitwise-sim-table")``)
and the very trace file each run used (``traces/rr_{code,conv}_{rate}_2min.csv``, or the
replay named in ``workload``). Reported: the relative error ``ours / reference - 1`` of
each latency percentile, its median absolute value per percentile, the SLO-verdict
agreement, and the wall-time ratio against the reference's ``wall_s``. For a few
boundary runs the per-request records of the reference (``boundary_per_request/``) are
compared request by request (same machines? same TTFT / E2E?), which is how policy
differences are found.

``--mode fluid-vs-sim``: the fluid model (`evaluate`) against the simulator with the
calibrated phase timing, over random configurations (all designs, both workloads, both
models, loads from 10 % to 120 % of a capacity estimate, Poisson and replayed real
arrivals): error by percentile and by load. The fluid model is being changed by the lead
(issue 11 notes), so only the smoke size is run here; ``--n-configs`` sets the size of a
full run.

Outputs in ``--out`` (default ``studies/out/validate_simulator/``): per-run CSV, summary
CSV and markdown (also printed), and for the reference mode the per-request comparison.

Usage:
    python studies/validate_simulator.py [--mode reference|fluid-vs-sim] [--jobs 2] [--out DIR]
    SPLITWISE_SMOKE=1 python studies/validate_simulator.py   # a few small runs (CI)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

SMOKE = os.environ.get("SPLITWISE_SMOKE", "") not in ("", "0")
METRICS = ("ttft", "tbt", "e2e")
PCTS = ("p50", "p90", "p99")  # metrics.KEYS (not imported: the package loads later, in the workers)
ERR_COLS = tuple(f"{m}_{p}" for p in PCTS for m in METRICS)
OUT_DEFAULT = Path(__file__).resolve().parent / "out" / "validate_simulator"
# Boundary runs compared request by request (a memory-bound HH grid point, an AA point,
# and the bursty code replay on a baseline).
PER_REQUEST_RUNS = ("splitwise-hh_P22T3_code60_bloom-176b", "splitwise-hh_P20T2_code60_bloom-176b",
                    "baseline-h100_N30_code60_bloom-176b", "splitwise-hh_P12T6_conv60_bloom-176b")


# ----------------------------------------------------------------------------- reference mode


def _markdown(df: pd.DataFrame, digits: int = 4) -> str:
    """A DataFrame as a markdown table (pandas' to_markdown needs the optional tabulate)."""
    def fmt(v):
        if isinstance(v, (float, np.floating)):
            return f"{v:.{digits}g}"
        return str(v)
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def load_reference_runs(folder: Path) -> pd.DataFrame:
    """Both reference tables, one row per run, with the trace file each used."""
    frames = []
    for name in ("splitwisesim_runs.csv", "boundary_runs.csv"):
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found")
        df = pd.read_csv(path)
        df["source"] = name.replace(".csv", "")
        frames.append(df)
    runs = pd.concat(frames, ignore_index=True)
    runs["meets_slo"] = runs["meets_slo"].astype(str).str.lower().isin(("true", "1"))
    traces = []
    for wl, rate in zip(runs["workload"], runs["rate"]):
        if isinstance(rate, float) and np.isnan(rate):
            traces.append(str(folder / "traces" / f"{wl}.csv"))
        else:
            traces.append(str(folder / "traces" / f"rr_{wl}_{int(rate)}_2min.csv"))
    runs["trace"] = traces
    missing = sorted({t for t in traces if not Path(t).is_file()})
    if missing:
        raise FileNotFoundError(f"trace files not found: {missing}")
    runs["run_name"] = [_run_name(r) for _, r in runs.iterrows()]
    return runs


def _run_name(r) -> str:
    if str(r["design"]).startswith("baseline"):
        size = f"N{int(r['machines'])}"
    else:
        size = f"P{int(r['prompt_machines'])}T{int(r['token_machines'])}"
    wl = r["workload"] if (isinstance(r["rate"], float) and np.isnan(r["rate"])) else f"{r['workload']}{int(r['rate'])}"
    return f"{r['design']}_{size}_{wl}_{r['model']}"


def _cluster(r, phase_model="splitwise-sim-table"):
    import splitwise_jax as sj
    if str(r["design"]).startswith("baseline"):
        return sj.make_cluster(r["design"], float(r["machines"]), model=r["model"], phase_model=phase_model)
    return sj.make_cluster(r["design"], float(r["prompt_machines"]), float(r["token_machines"]), model=r["model"],
                        phase_model=phase_model)


def _worker_init(warm: bool = True):
    """float64, and one small run per machine type so that one-time compilation (the
    alone times and the power model) is not charged to the first timed run."""
    import jax
    jax.config.update("jax_enable_x64", True)
    if not warm:
        return
    import splitwise_jax as sj
    tr = sj.RequestTrace.from_arrays([0.0, 0.5, 1.0], [100, 2000, 500], [5, 20, 3], name="warm-up")
    for design in ("baseline-a100", "splitwise-hh", "splitwise-hhcap"):
        sj.simulate(sj.make_cluster(design, 1, 1, phase_model="splitwise-sim-table"), tr)


def _simulate_reference_run(args):
    """Run one reference configuration; returns (index, metrics row, per-request frame or None)."""
    i, r, keep_requests = args
    import splitwise_jax as sj
    c0 = time.process_time()
    t0 = time.perf_counter()
    tr = sj.trace_from_csv(r["trace"])
    cluster = _cluster(r)
    t1 = time.perf_counter()
    res = sj.simulate(cluster, tr)
    t2 = time.perf_counter()
    c2 = time.process_time()
    m = res.metrics
    row = {f"ours_{met}_{pc}_s": m[f"{met}_s"][pc] for met in METRICS for pc in PCTS}
    row.update({f"ours_{met}_slowdown_{pc}": m["slowdown"][met][pc] for met in METRICS for pc in PCTS})
    row.update(ours_meets_slo=m["meets_slo"], status=m["status"], n_completed=int(res.requests["e2e_s"].notna().sum()),
               loop_s=res.wall_s, loop_cpu_s=res.cpu_s, setup_s=res.setup_s, report_s=res.report_s, load_s=t1 - t0,
               run_s=t2 - t0, run_cpu_s=c2 - c0)
    return i, row, (res.requests if keep_requests else None)


def compare_reference(runs: pd.DataFrame, ours: pd.DataFrame) -> pd.DataFrame:
    df = runs[["source", "run_name", "design", "prompt_machines", "token_machines", "machines", "workload", "rate",
               "n_completed", "wall_s"]].copy()
    df = df.rename(columns={"n_completed": "ref_n_completed", "wall_s": "ref_wall_s"})
    for c in ERR_COLS:
        df[f"ref_{c}_s"] = runs[f"{c}_s"].to_numpy()
        df[f"ours_{c}_s"] = ours[f"ours_{c}_s"].to_numpy()
        df[f"err_{c}"] = df[f"ours_{c}_s"] / df[f"ref_{c}_s"] - 1.0
    df["ref_meets_slo"] = runs["meets_slo"].to_numpy()
    df["ours_meets_slo"] = ours["ours_meets_slo"].to_numpy()
    df["slo_agree"] = df["ref_meets_slo"] == df["ours_meets_slo"]
    for c in ("status", "n_completed", "loop_s", "loop_cpu_s", "setup_s", "report_s", "run_s", "run_cpu_s"):
        df[c] = ours[c].to_numpy()
    df["speedup_loop"] = df["ref_wall_s"] / df["loop_s"]
    df["speedup_run"] = df["ref_wall_s"] / df["run_s"]
    df["speedup_run_cpu"] = df["ref_wall_s"] / df["run_cpu_s"]
    return df


def summarise_reference(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    groups = {"all": df}
    for src in sorted(df["source"].unique()):
        groups[src] = df[df["source"] == src]
    rows = []
    for name, g in groups.items():
        row = {"runs": name, "n": len(g)}
        for c in ERR_COLS:
            row[f"med_abs_err_{c}"] = float(np.median(np.abs(g[f"err_{c}"])))
        row["max_abs_err_p50"] = float(np.max(np.abs(g[[f"err_{m}_p50" for m in METRICS]].to_numpy())))
        row["slo_agreement"] = float(g["slo_agree"].mean())
        row["speedup_loop_median"] = float(g["speedup_loop"].median())
        row["speedup_loop_min"] = float(g["speedup_loop"].min())
        row["speedup_run_median"] = float(g["speedup_run"].median())
        row["speedup_run_min"] = float(g["speedup_run"].min())
        row["speedup_run_cpu_median"] = float(g["speedup_run_cpu"].median())
        row["speedup_run_cpu_min"] = float(g["speedup_run_cpu"].min())
        row["ref_wall_total_s"] = float(g["ref_wall_s"].sum())
        row["run_cpu_total_s"] = float(g["run_cpu_s"].sum())
        rows.append(row)
    summ = pd.DataFrame(rows)
    lines = ["| runs | n | " + " | ".join(f"{m.upper()} {p.upper()}" for p in PCTS for m in METRICS)
             + " | SLO agree | speed-up, wall: median / min | speed-up, CPU: median / min | total: reference / ours (CPU) |",
             "|---|---|" + "---|" * 9 + "---|---|---|---|"]
    for _, r in summ.iterrows():
        errs = " | ".join(f"{100 * r[f'med_abs_err_{c}']:.2f}%" for c in ERR_COLS)
        lines.append(f"| {r['runs']} | {r['n']} | {errs} | {100 * r['slo_agreement']:.1f}% | "
                     f"{r['speedup_run_median']:.0f}x / {r['speedup_run_min']:.1f}x | "
                     f"{r['speedup_run_cpu_median']:.0f}x / {r['speedup_run_cpu_min']:.1f}x | "
                     f"{r['ref_wall_total_s']:.0f} s / {r['run_cpu_total_s']:.0f} s |")
    return summ, "\n".join(lines)


def per_request_compare(name: str, ours: pd.DataFrame, folder: Path) -> dict:
    """Request-by-request comparison with the reference's record of one boundary run."""
    path = folder / "boundary_per_request" / f"{name}.csv.gz"
    ref = pd.read_csv(path)
    o = ours.set_index("request_id").loc[ref["request_id"]]
    out = {"run": name, "n": len(ref)}
    for col in ("ttft_s", "e2e_s", "tbt_s", "queue_s"):
        d = o[col].to_numpy() - ref[col].to_numpy()
        rel = np.abs(d) / np.maximum(np.abs(ref[col].to_numpy()), 1e-9)
        # the reference's files hold 6 significant digits: "exact" = equal to that rounding
        out[f"{col}_exact_frac"] = float(np.mean(np.abs(d) <= 1e-5 * np.abs(ref[col].to_numpy()) + 1e-9))
        out[f"{col}_within_1pct_frac"] = float(np.mean(rel < 0.01))
        out[f"{col}_median_abs_diff_s"] = float(np.median(np.abs(d)))
    times = ("prompt_start_s", "prompt_end_s", "kv_start_s", "kv_end_s", "token_start_s", "token_end_s")
    ok = np.ones(len(ref), dtype=bool)
    for col in times:
        a, b = ref[col].to_numpy(), o[col].to_numpy()
        ok &= (np.abs(a - b) <= 1e-5 * np.abs(a) + 1e-9) | (np.isnan(a) & np.isnan(b))
    out["phase_times_exact_frac"] = float(np.mean(ok))
    out["same_prompt_machine_frac"] = float(np.mean(o["prompt_machine"].to_numpy() == ref["prompt_machine"].to_numpy()))
    out["same_token_machine_frac"] = float(np.mean(o["token_machine"].to_numpy() == ref["token_machine"].to_numpy()))
    d = np.abs(o["ttft_s"].to_numpy() - ref["ttft_s"].to_numpy()) > 1e-5 * ref["ttft_s"].abs().to_numpy() + 1e-9
    out["first_ttft_diverging_request"] = int(ref["request_id"].to_numpy()[np.argmax(d)]) if d.any() else -1
    return out


def run_reference(args) -> int:
    from splitwise_jax._paths import validation_dir
    folder = Path(args.validation_dir) if args.validation_dir else validation_dir()
    runs = load_reference_runs(folder)
    if SMOKE:
        picks = [runs.index[(runs["run_name"] == "splitwise-hh_P27T3_code30_bloom-176b")][0],
                 runs.index[(runs["run_name"] == "baseline-h100_N40_code30_bloom-176b")][0],
                 runs.index[(runs["run_name"] == "splitwise-hh_P22T3_code60_bloom-176b")][0]]
        runs = runs.loc[picks].reset_index(drop=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keep = {n for n in runs["run_name"] if (folder / "boundary_per_request" / f"{n}.csv.gz").is_file()}
    # Long runs first so two workers finish together.
    order = list(runs.sort_values("wall_s", ascending=False).index)
    tasks = [(i, runs.loc[i].to_dict(), runs.loc[i, "run_name"] in keep) for i in order]
    results, requests = {}, {}
    from tqdm import tqdm
    t0 = time.perf_counter()
    with tqdm(total=len(tasks), desc="reference runs", unit="run") as bar:
        if args.jobs > 1:
            ctx = mp.get_context("spawn")
            with ctx.Pool(args.jobs, initializer=_worker_init) as pool:
                for i, row, req in pool.imap_unordered(_simulate_reference_run, tasks):
                    results[i] = row
                    bar.update(1)
                    if req is not None:
                        requests[runs.loc[i, "run_name"]] = req
        else:
            _worker_init()
            for task in tasks:
                i, row, req = _simulate_reference_run(task)
                results[i] = row
                if req is not None:
                    requests[runs.loc[i, "run_name"]] = req
                bar.update(1)
    total = time.perf_counter() - t0
    ours = pd.DataFrame([results[i] for i in range(len(runs))])
    df = compare_reference(runs, ours)
    df.to_csv(out / "reference_runs.csv", index=False)
    summ, table = summarise_reference(df)
    summ.to_csv(out / "reference_summary.csv", index=False)
    pr = [per_request_compare(name, req, folder) for name, req in requests.items()
          if (folder / "boundary_per_request" / f"{name}.csv.gz").is_file()]
    pr_df = pd.DataFrame(pr)
    if len(pr_df):
        pr_df.to_csv(out / "per_request_compare.csv", index=False)
        for name, req in requests.items():
            if name in PER_REQUEST_RUNS:
                req.to_csv(out / f"requests_{name}.csv.gz", index=False)
    worst = df.assign(worst=np.max(np.abs(df[[f"err_{c}" for c in ERR_COLS]].to_numpy()), axis=1)) \
        .sort_values("worst", ascending=False).head(10)
    md = [f"# Simulator vs SplitwiseSim ({'SMOKE ' if SMOKE else ''}{len(df)} runs)", "",
          "Median |relative error| per percentile, SLO-verdict agreement, and speed-up: the reference's "
          "`wall_s` over our time for the run (trace load + cluster + timing set-up + event loop + metrics and "
          "power, after the one-time JAX compilation of the process), as wall time and as this process's CPU "
          "time (the machine is shared; CPU time is what the run costs when it has a core to itself).", "",
          table, "",
          f"Total wall time of this study: {total:.0f} s with {args.jobs} process(es).", "",
          "## Worst runs (largest |relative error| of any percentile)", "",
          _markdown(worst[["run_name", "worst", "ref_meets_slo", "ours_meets_slo", "status"]]), ""]
    if len(pr_df):
        exact = pr_df[["ttft_s_exact_frac", "e2e_s_exact_frac"]].min(axis=1)
        md += ["## Request-by-request comparison (boundary_per_request)", "",
               f"{len(pr_df)} runs compared request by request. 'exact' = equal to the reference's 6 "
               "significant digits (relative 1e-5).", "",
               f"- runs with every request's TTFT and E2E within 1%: "
               f"{int(((pr_df['ttft_s_within_1pct_frac'] == 1) & (pr_df['e2e_s_within_1pct_frac'] == 1)).sum())}"
               f" of {len(pr_df)}",
               f"- runs with every request on the same prompt and token machines: "
               f"{int(((pr_df['same_prompt_machine_frac'] == 1) & (pr_df['same_token_machine_frac'] == 1)).sum())}"
               f" of {len(pr_df)}", f"- smallest fraction of exact TTFT/E2E in a run: {exact.min():.3f}",
               f"- smallest fraction of requests with all six phase times exact in a run: "
               f"{pr_df['phase_times_exact_frac'].min():.3f}", "",
               _markdown(pr_df), ""]
    (out / "reference_summary.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


# ----------------------------------------------------------------------------- fluid vs sim mode


def random_configs(n: int, seed: int = 0) -> pd.DataFrame:
    """Random configurations: design, pool sizes, workload, model, load, arrivals."""
    import splitwise_jax as sj
    rng = np.random.default_rng(seed)
    designs = sorted(sj.DESIGNS)
    rows = []
    for i in range(n):
        d = designs[rng.integers(len(designs))]
        baseline = not sj.DESIGNS[d].strategy.token_pool
        n_p = int(rng.integers(4, 41))
        n_t = 0 if baseline else int(rng.integers(2, 21))
        rows.append({"config": i, "design": d, "n_prompt": n_p, "n_token": n_t,
                     "workload": ["coding", "conversation"][rng.integers(2)],
                     "model": ["bloom-176b", "llama2-70b"][rng.integers(2)],
                     "load": float(rng.uniform(0.1, 1.2)),
                     "arrivals": "replay" if rng.random() < 0.25 else "poisson"})
    return pd.DataFrame(rows)


def capacity_rps(cluster, wl) -> float:
    """A capacity estimate (req/s): prompt machines / mean prompt time of one request alone
    on a prompt machine (the prompt pool's saturation rate; decodes also load baselines)."""
    from splitwise_jax.simulate import timing as st
    p = np.asarray(wl.prompt_tokens, dtype=np.float64)
    w = np.asarray(wl.prompt_weights, dtype=np.float64)
    t = st.exact_iteration_s(cluster.prompt, p, np.ones_like(p), p * p, np.zeros_like(p), np.zeros_like(p))
    return float(cluster.n_prompt) / float(np.dot(w, t))


_FLUID = {}


def _fluid(cluster, wl, horizon_s):
    """The fluid model, one compiled program per (design kind, model): static names made
    uniform and workloads padded to one 32 x 32 class grid (as validate_cluster does)."""
    import dataclasses

    import jax
    import jax.numpy as jnp

    import splitwise_jax as sj
    from splitwise_jax.cli.evaluate import metrics_to_dict

    k, m = wl.weights.shape
    n = 32
    if k < n or m < n:
        wl = dataclasses.replace(
            wl, prompt_tokens=jnp.concatenate([wl.prompt_tokens, jnp.full(n - k, wl.prompt_tokens[-1])]),
            output_tokens=jnp.concatenate([wl.output_tokens, jnp.full(n - m, wl.output_tokens[-1])]),
            weights=jnp.pad(wl.weights, ((0, n - k), (0, n - m))), name="padded")
    if "fn" not in _FLUID:
        _FLUID["fn"] = jax.jit(sj.evaluate)
    return metrics_to_dict(_FLUID["fn"](sj.uniform_names(cluster), wl, horizon_s))


def _replay_trace(cfg, rate, horizon_s, rep):
    """The real Azure arrivals, time-compressed to the rate, over the horizon; repetition
    `rep` starts `rep` / 3 of the way into the trace (wrapping around its end), so
    repetitions see different stretches of it (rep 0: from its start, as before)."""
    import splitwise_jax as sj
    from splitwise_jax._paths import azure_trace_csv
    full = sj.trace_from_csv(azure_trace_csv(cfg["workload"]))
    t = full.arrival_s - full.arrival_s[0]
    span = float(t[-1]) + float(np.median(np.diff(t)))
    n = len(t)
    start = (rep * n) // 3
    idx = np.arange(start, start + 2 * n) % n
    a = (t[idx] + span * (np.arange(start, start + 2 * n) // n) - t[start]) * (full.rate_per_s / rate)
    keep = a < horizon_s
    return a[keep], full.prompt_tokens[idx][keep], full.output_tokens[idx][keep]


def _config_inputs(cfg, horizon_s, seed, rep):
    """The cluster, the simulated trace and the fluid model's workload of one
    configuration and repetition."""
    import splitwise_jax as sj
    cluster = sj.make_cluster(cfg["design"], cfg["n_prompt"], cfg["n_token"] or 1.0, model=cfg["model"])
    wl = sj.load_workload(cfg["workload"])
    rate = cfg["load"] * capacity_rps(cluster, wl)
    if cfg["arrivals"] == "replay":
        a, p, o = _replay_trace(cfg, rate, horizon_s, rep)
        tr = sj.RequestTrace.from_arrays(a, p, o, name="replay")
        fluid_wl = sj.Workload.from_trace(pd.DataFrame({"arrival_s": a, "prompt_tokens": p, "output_tokens": o}),
                                       rate_per_s=rate, arrival="trace", independent=False)
    else:
        tr = sj.poisson_trace(wl, rate, horizon_s, seed + 1000 * rep)
        fluid_wl = wl.with_rate(rate)
    return cluster, tr, fluid_wl, rate


def _simulate_cached(args):
    """Simulate one (configuration, repetition), or read it from the cache: the
    simulator does not depend on the fluid model, so a study of a fluid-model change
    reruns only the fluid model. Keeps the per-request records when asked."""
    import json
    cfg, horizon_s, seed, rep, cache, keep = args
    key = f"c{int(cfg['config']):03d}_r{rep}_s{seed}_h{horizon_s:g}"
    path = Path(cache) / f"{key}.json" if cache else None
    if path is not None and path.is_file():
        return cfg["config"], rep, json.loads(path.read_text())
    import splitwise_jax as sj
    cluster, tr, _, rate = _config_inputs(cfg, horizon_s, seed, rep)
    t0 = time.perf_counter()
    res = sj.simulate(cluster, tr)
    out = dict(res.metrics, rate=rate, n_requests=len(tr), sim_s=time.perf_counter() - t0)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out))
        if keep:
            res.requests.to_csv(path.with_suffix(".requests.csv.gz"), index=False)
            res.machines.to_csv(path.with_suffix(".machines.csv.gz"), index=False)
    return cfg["config"], rep, out


def _fluid_row(cfg, horizon_s, seed, rep):
    cluster, _, fluid_wl, rate = _config_inputs(cfg, horizon_s, seed, rep)
    t0 = time.perf_counter()
    fm = _fluid(cluster, fluid_wl, horizon_s)
    return fm, rate, time.perf_counter() - t0


def _fluid_vs_sim_one(args):
    """One configuration, one repetition, simulated and predicted (no cache)."""
    cfg, horizon_s, seed = args
    _, _, sm = _simulate_cached((cfg, horizon_s, seed, 0, None, False))
    fm, rate, fluid_s = _fluid_row(cfg, horizon_s, seed, 0)
    return _compare_row(cfg, rate, [fm], [sm], fluid_s)


def _compare_row(cfg, rate, fms, sms, fluid_s):
    """Fluid against simulated percentiles, each the mean over the repetitions (the
    fluid model's differ only for replays, whose repetitions are other stretches of the
    trace). Verdicts: the simulated one is that of the repetitions' mean slowdowns
    (every request completed in each); `sim_meets_frac` the share of repetitions that
    meet."""
    import splitwise_jax as sj
    slo = np.asarray(sj.PAPER_SLO, float)
    mean = lambda ms, f: float(np.mean([f(m) for m in ms]))  # noqa: E731
    row = dict(cfg, rate=rate, reps=len(sms), n_requests=mean(sms, lambda m: m.get("n_requests", np.nan)),
               fluid_s=fluid_s, sim_s=mean(sms, lambda m: m.get("sim_s", np.nan)),
               fluid_meets=bool(np.mean([m["meets_slo"] for m in fms]) > 0.5),
               sim_meets_frac=mean(sms, lambda m: float(m["meets_slo"])),
               sim_status=sms[0]["status"], fluid_status=fms[0]["status"],
               # over the arrival window since 2026-12-04 (caches from before: the whole run)
               sim_rho_prompt=mean(sms, lambda m: m["utilisation"]["prompt_pool_rho"]),
               fluid_rho_prompt=mean(fms, lambda m: m["utilisation"]["prompt_pool_rho"]),
               sim_kv_pressure=mean(sms, lambda m: m["utilisation"]["kv_memory_pressure"]),
               fluid_kv_pressure=mean(fms, lambda m: m["utilisation"]["kv_memory_pressure"]),
               sim_moved=mean(sms, lambda m: m["mixed_pool"]["decodes_moved_frac"]),
               fluid_moved=mean(fms, lambda m: m["mixed_pool"]["decodes_moved_frac"]),
               sim_drafted=mean(sms, lambda m: m["mixed_pool"]["prompts_drafted_frac"]),
               fluid_drafted=mean(fms, lambda m: m["mixed_pool"]["prompts_drafted_frac"]))
    sim_sd = np.array([[mean(sms, lambda m, a=met, b=pc: m["slowdown"][a][b]) for pc in PCTS] for met in METRICS])
    complete = all(not str(m["status"]).startswith("incomplete") and "incomplete" not in str(m["status"]) for m in sms)
    row["sim_meets"] = bool(np.all(sim_sd < slo) and complete)
    for met in METRICS:
        for pc in PCTS:
            f = mean(fms, lambda m, a=met, b=pc: m[f"{a}_s"][b])
            s = mean(sms, lambda m, a=met, b=pc: m[f"{a}_s"][b])
            row[f"fluid_{met}_{pc}_s"] = f
            row[f"sim_{met}_{pc}_s"] = s
            row[f"err_{met}_{pc}"] = f / s - 1.0
            row[f"sim_cv_{met}_{pc}"] = (float(np.std([m[f"{met}_s"][pc] for m in sms]) / s) if len(sms) > 1
                                         else np.nan)
            # The slowdown percentiles the verdicts read (per request: latency / latency alone),
            # which can part from the times' percentiles when the tail holds the short requests.
            fs = mean(fms, lambda m, a=met, b=pc: m["slowdown"][a][b])
            row[f"fluid_sd_{met}_{pc}"] = fs
            row[f"sim_sd_{met}_{pc}"] = sim_sd[METRICS.index(met), PCTS.index(pc)]
            row[f"err_sd_{met}_{pc}"] = fs / row[f"sim_sd_{met}_{pc}"] - 1.0
    return row


LOAD_EDGES = (0.0, 0.5, 0.8, 0.95, 1.05, np.inf)


def summary_table(df: pd.DataFrame, prefix: str = "err_") -> str:
    """Median |fluid / simulated - 1| per percentile and the verdicts, by load band
    (`prefix` "err_sd_": of the slowdowns the verdicts read)."""
    df = df.copy()
    df["load_bin"] = pd.cut(df["load"], list(LOAD_EDGES), right=False).astype(str)
    lines = ["| load | n | " + " | ".join(f"{m.upper()} {p.upper()}" for p in PCTS for m in METRICS)
             + " | SLO agree | false meets / fails |", "|---|---|" + "---|" * 9 + "---|---|"]
    groups = [("all", df), ("0.8 and above", df[df["load"] >= 0.8])] + list(df.groupby("load_bin"))
    for name, g in groups:
        errs = " | ".join(f"{100 * np.median(np.abs(g[f'{prefix}{c}'])):.1f}%" for c in ERR_COLS)
        fm = int(np.sum(g["fluid_meets"] & ~g["sim_meets"]))
        ff = int(np.sum(~g["fluid_meets"] & g["sim_meets"]))
        lines.append(f"| {name} | {len(g)} | {errs} | {100 * np.mean(g['fluid_meets'] == g['sim_meets']):.1f}% | "
                     f"{fm} / {ff} |")
    return "\n".join(lines)


def run_fluid_vs_sim(args) -> int:
    n = 3 if SMOKE else args.n_configs
    horizon = 30.0 if SMOKE else 120.0
    configs = random_configs(n, args.seed)
    if args.min_load > 0:
        configs = configs[configs["load"] >= args.min_load]
    if args.arrivals != "all":
        configs = configs[configs["arrivals"] == args.arrivals]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = args.sim_cache
    from tqdm import tqdm
    cfgs = {int(r["config"]): r.to_dict() for _, r in configs.iterrows()}
    tasks = [(cfgs[c], horizon, args.seed + c, rep, cache, cfgs[c]["load"] >= args.keep_requests_above)
             for rep in range(args.seeds) for c in cfgs]
    t0 = time.perf_counter()
    sims = {}
    if args.jobs > 1:
        ctx = mp.get_context("spawn")
        with ctx.Pool(args.jobs, initializer=_worker_init, initargs=(False,)) as pool:
            for c, rep, sm in tqdm(pool.imap_unordered(_simulate_cached, tasks), total=len(tasks), desc="simulations"):
                sims[(c, rep)] = sm
    else:
        _worker_init(False)
        for task in tqdm(tasks, desc="simulations"):
            c, rep, sm = _simulate_cached(task)
            sims[(c, rep)] = sm
    t_sim = time.perf_counter() - t0
    _worker_init(False)
    rows = []
    for c, cfg in tqdm(cfgs.items(), desc="fluid model"):
        fms, fluid_s = [], 0.0
        # The fluid model's input differs between repetitions only for replays.
        for rep in range(args.seeds if cfg["arrivals"] == "replay" else 1):
            fm, rate, dt = _fluid_row(cfg, horizon, args.seed + c, rep)
            fms.append(fm)
            fluid_s += dt
        rows.append(_compare_row(cfg, rate, fms, [sims[(c, rep)] for rep in range(args.seeds)], fluid_s))
    total = time.perf_counter() - t0
    df = pd.DataFrame(rows).sort_values("config")
    df.to_csv(out / "fluid_vs_sim_runs.csv", index=False)
    table = summary_table(df)
    md = [f"# Fluid model vs simulator, calibrated timing ({'SMOKE ' if SMOKE else ''}{len(df)} configurations, "
          f"{args.seeds} repetition(s) each)", "",
          "Median |fluid / simulated - 1| per percentile, by offered load (fraction of the prompt pool's "
          "capacity estimate: prompt machines / mean prompt time alone; baselines also decode, so their "
          "real capacity is lower). Simulated percentiles are the means over the repetitions (Poisson: other "
          "seeds; replays: other stretches of the trace, each with its own fluid prediction); the simulated "
          "verdict is that of the mean slowdowns.", "", table, "",
          "The same for the slowdowns (latency / latency alone, per request) whose percentiles the SLO "
          "verdicts read:", "", summary_table(df, "err_sd_"), "",
          f"Wall time {total:.0f} s ({t_sim:.0f} s simulating, cached in {cache}) with {args.jobs} process(es), "
          f"horizon {horizon:g} s.", ""]
    (out / "fluid_vs_sim_summary.md").write_text("\n".join(md))
    print("\n".join(md))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("reference", "fluid-vs-sim"), default="reference")
    ap.add_argument("--validation-dir", help="the shared validation folder (default: ../shared/validation)")
    ap.add_argument("--out", default=str(OUT_DEFAULT), help="output folder")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    ap.add_argument("--n-configs", type=int, default=200, help="configurations of the fluid-vs-sim mode")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1,
                    help="fluid-vs-sim: repetitions per configuration (Poisson seeds / trace stretches), averaged")
    ap.add_argument("--sim-cache", default=None, help="fluid-vs-sim: folder caching each simulation (reused)")
    ap.add_argument("--keep-requests-above", type=float, default=np.inf,
                    help="fluid-vs-sim: keep per-request records (in the cache) of configurations at this load or above")
    ap.add_argument("--min-load", type=float, default=0.0, help="fluid-vs-sim: only configurations at this load or above")
    ap.add_argument("--arrivals", choices=("all", "poisson", "replay"), default="all",
                    help="fluid-vs-sim: only configurations with these arrivals (each replay compiles its own program)")
    a = ap.parse_args(argv)
    if a.jobs < 1:
        ap.error("--jobs must be >= 1")
    if a.mode == "reference":
        return run_reference(a)
    return run_fluid_vs_sim(a)


if __name__ == "__main__":
    sys.exit(main())
