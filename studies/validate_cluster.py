"""Validate the cluster model against the reference simulator's runs (GitHub issue 4).

For every run in the shared validation folder (SplitwiseSim on named cluster
configurations, ``splitwisesim_runs.csv``, and at the decision boundaries,
``boundary_runs.csv``, with replays of the real Azure arrivals; see its README for how they were made and
how the metrics are defined) we predict the same configuration twice, once with each
phase-timing mode:

* ``splitwise-sim-table``: the simulator's own interpolated profile table, so the
  difference is the queueing/batching model's error alone;
* ``calibrated``: our smooth phase model, so the difference adds the phase model's
  error (and its own KV-transfer bandwidth, set-up cost and grouped-query attention).

Reported: the relative error ``ours / reference - 1`` of each latency percentile
(TTFT/TBT/E2E x P50/P90/P99), the agreement of the SLO verdict (all nine slowdown
percentiles under the paper's Table VI limits), and how the error grows with load,
grouped by the arrival rate and by our predicted prompt-pool load rho.

All runs of one design kind (baseline or Splitwise) go through one jitted, vmapped
`evaluate`: the static machine/design names are made uniform and the two workloads are
padded to one class grid with zero-weight classes, so each (mode, kind) compiles once.

Outputs (in --out, default studies/out/): ``validation_runs.csv`` (one row per run and
mode), ``validation_summary.csv`` (median |relative error| and SLO agreement overall,
by rate and by rho), ``validation_summary.md`` (the same as markdown tables, also
printed) and ``validation_error_vs_load.png``.

Usage:
    python studies/validate_cluster.py [--validation-dir DIR] [--out DIR] [--modes M ...]
    SPLITWISE_SMOKE=1 python studies/validate_cluster.py     # a handful of runs (CI)
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import jax

# Reference percentiles span 10 ms to 100 s; float64 keeps the comparison about the model.
jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from splitwise_jax._paths import validation_dir  # noqa: E402
import splitwise_jax as sj  # noqa: E402
# The model function itself, not `sj.evaluate`: `_evaluate_many` vmaps it on purpose
# (one vectorised program per chunk of runs), which `sj.evaluate` would map row by row.
from splitwise_jax.cluster.cluster import evaluate  # noqa: E402
from splitwise_jax.cluster.metrics import KEYS  # noqa: E402

METRICS = ("ttft", "tbt", "e2e")
PCTS = KEYS  # ("p50", "p90", "p99")
ERR_COLS = tuple(f"{m}_{p}" for p in PCTS for m in METRICS)
MODES = ("splitwise-sim-table", "calibrated")
HORIZON_S = 120.0  # the reference traces are 120 s of Poisson arrivals
WORKLOADS = {"code": "coding", "conv": "conversation"}
# Predicted prompt-pool load bins: light, moderate, heavy, around saturation, overload.
RHO_EDGES = (0.0, 0.5, 0.8, 0.95, 1.05, np.inf)
CHUNK = 8  # runs per vmapped call; the last chunk is padded so every call has one shape
SMOKE = os.environ.get("SPLITWISE_SMOKE", "") not in ("", "0")
_REQUIRED = ("design", "prompt_machines", "token_machines", "machines", "workload", "rate", "meets_slo") + tuple(
    f"{m}_{p}_s" for m in METRICS for p in PCTS)


REFERENCE_FILES = ("splitwisesim_runs.csv", "boundary_runs.csv")


def load_runs(folder: str | os.PathLike | None = None) -> pd.DataFrame:
    """The reference runs of a validation folder: ``splitwisesim_runs.csv`` and, when
    present, ``boundary_runs.csv`` (runs at the decision boundaries, including replays of
    the real Azure arrivals, whose ``workload`` names a trace file in ``traces/``).

    Raises:
        FileNotFoundError: the folder has no ``splitwisesim_runs.csv``, or a replayed
            trace is missing.
        ValueError: a required column is missing or a design is unknown.
    """
    folder = Path(folder) if folder is not None else validation_dir()
    if not (folder / REFERENCE_FILES[0]).is_file():
        raise FileNotFoundError(f"{folder / REFERENCE_FILES[0]} not found (--validation-dir must hold it)")
    frames = []
    for name in REFERENCE_FILES:
        path = folder / name
        if not path.is_file():
            continue
        runs = pd.read_csv(path)
        missing = [c for c in _REQUIRED if c not in runs.columns]
        if missing:
            raise ValueError(f"{path}: missing columns {missing}")
        unknown = sorted(set(runs["design"]) - set(sj.DESIGNS))
        if unknown:
            raise ValueError(f"{path}: unknown designs {unknown}; known: {sorted(sj.DESIGNS)}")
        runs["source"] = name.removesuffix(".csv")
        runs["trace"] = ""
        replay = ~runs["workload"].isin(list(WORKLOADS))
        for i in runs.index[replay]:
            trace = folder / "traces" / f"{runs.at[i, 'workload']}.csv"
            if not trace.is_file():
                raise FileNotFoundError(f"{path}: workload {runs.at[i, 'workload']!r} is neither "
                                        f"{sorted(WORKLOADS)} nor a trace in {folder / 'traces'}")
            runs.at[i, "trace"] = str(trace)
        frames.append(runs)
    runs = pd.concat(frames, ignore_index=True)
    runs["meets_slo"] = runs["meets_slo"].astype(str).str.lower().isin(("true", "1"))
    return runs.reset_index(drop=True)


def smoke_subset(runs: pd.DataFrame) -> pd.DataFrame:
    """A handful of runs covering both design kinds, both workloads and light/heavy load."""
    picks = []
    for design in ("baseline-h100", "splitwise-hh"):
        for wl in ("code", "conv"):
            sub = runs[(runs["design"] == design) & (runs["workload"] == wl) & (runs["trace"] == "")]
            if len(sub):
                picks.append(sub.index[0])
    return runs.loc[picks].reset_index(drop=True)


def is_baseline(design: str) -> bool:
    return not sj.DESIGNS[design].strategy.token_pool


def cluster_of_run(row, phase_model: str):
    """The `Cluster` of one reference run in one phase-timing mode."""
    if is_baseline(row["design"]):
        return sj.make_cluster(row["design"], float(row["machines"]), phase_model=phase_model)
    return sj.make_cluster(row["design"], float(row["prompt_machines"]), float(row["token_machines"]),
                        phase_model=phase_model)


def pad_workload(wl: sj.Workload, n_prompt: int, n_output: int) -> sj.Workload:
    """The same workload on a larger class grid: extra classes repeat the largest size
    with zero weight, so every percentile is unchanged (checked in tests/test_cluster.py)."""
    k, m = wl.weights.shape
    p = jnp.concatenate([wl.prompt_tokens, jnp.full(n_prompt - k, wl.prompt_tokens[-1])])
    o = jnp.concatenate([wl.output_tokens, jnp.full(n_output - m, wl.output_tokens[-1])])
    w = jnp.pad(wl.weights, ((0, n_prompt - k), (0, n_output - m)))
    return dataclasses.replace(wl, prompt_tokens=p, output_tokens=o, weights=w, name="validation")


def _stack(trees):
    return jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x, float) for x in xs]), *trees)


def _row_of(res, j, seconds) -> dict:
    """One run's metrics from an evaluate result (index j of a vmapped one, or None)."""
    def at(a):
        a = np.asarray(a)
        return a if j is None else a[j]
    d = {f"{met}_{pc}_s": float(at(getattr(res, f"{met}_s"))[q]) for met in METRICS for q, pc in enumerate(PCTS)}
    d.update(meets_slo=bool(at(res.meets_slo)), rho_prompt=float(at(res.rho_prompt_pool)),
             rho_token=float(at(res.rho_token_pool)), memory_pressure=float(at(res.memory_pressure)),
             mixed_prompt_frac=float(at(res.mixed_prompt_frac)), mixed_decode_frac=float(at(res.mixed_decode_frac)),
             status=int(at(res.status)), seconds=seconds)
    # The worst of the nine log margins log(limit / slowdown) (> 0 meets) and where it is:
    # how close a run is to the other verdict (a false "meets" is one that crosses zero).
    margins = np.asarray(at(res.slo_margin))
    worst = int(np.argmin(margins))
    d.update(worst_margin=float(margins.flat[worst]),
             worst_metric=f"{METRICS[worst // 3]}_{PCTS[worst % 3]}")
    return d


_evaluate_one = jax.jit(evaluate)
# One jitted function: jit caches one compiled program per (timing mode, design kind).
_evaluate_many = jax.jit(jax.vmap(evaluate, in_axes=(0, 0, None)))


def predict(runs: pd.DataFrame, phase_model: str, *, chunk: int = CHUNK, progress=None) -> pd.DataFrame:
    """Our metrics for every run, in the order of ``runs``.

    Args:
        runs: reference runs (`load_runs`).
        phase_model: "splitwise-sim-table" or "calibrated".
        chunk: runs per vmapped call (the last call is padded by repetition).
        progress: optional tqdm bar, advanced by runs done.

    Returns:
        One row per run: ``{ttft,tbt,e2e}_{p50,p90,p99}_s``, ``meets_slo``,
        ``rho_prompt``, ``rho_token``, ``memory_pressure``, ``mixed_prompt_frac``,
        ``mixed_decode_frac``, ``status``, ``seconds`` (wall time of its chunk / chunk).
    """
    bases = {name: sj.load_workload(name, 1.0) for name in WORKLOADS.values()}
    k = max(w.weights.shape[0] for w in bases.values())
    m = max(w.weights.shape[1] for w in bases.values())
    bases = {name: pad_workload(w, k, m) for name, w in bases.items()}
    out = [None] * len(runs)
    replays = [i for i in range(len(runs)) if runs.iloc[i]["trace"]]
    for i in replays:
        # A replayed trace: its own size distribution and burstiness (arrival_cv2), over
        # its own horizon (first to last arrival).
        row = runs.iloc[i]
        arrivals = sj.load_trace(row["trace"])["arrival_s"].to_numpy()
        horizon = float(arrivals.max() - arrivals.min())
        t0 = time.perf_counter()
        res = jax.tree.map(np.asarray, _evaluate_one(sj.uniform_names(cluster_of_run(row, phase_model)),
                                                     sj.load_workload(row["trace"], arrival="trace"), horizon))
        out[i] = _row_of(res, None, time.perf_counter() - t0)
        if progress is not None:
            progress.update(1)
    for kind_is_baseline in (True, False):
        idx = [i for i, d in enumerate(runs["design"]) if is_baseline(d) == kind_is_baseline and i not in replays]
        for start in range(0, len(idx), chunk):
            part = idx[start:start + chunk]
            rows = [runs.iloc[i] for i in part]
            clusters = [sj.uniform_names(cluster_of_run(r, phase_model)) for r in rows]
            wls = [bases[WORKLOADS[r["workload"]]].with_rate(float(r["rate"])) for r in rows]
            fill = chunk - len(part)
            t0 = time.perf_counter()
            res = _evaluate_many(_stack(clusters + clusters[-1:] * fill), _stack(wls + wls[-1:] * fill), HORIZON_S)
            res = jax.tree.map(np.asarray, jax.block_until_ready(res))
            dt = (time.perf_counter() - t0) / len(part)
            for j, i in enumerate(part):
                out[i] = _row_of(res, j, dt)
            if progress is not None:
                progress.update(len(part))
    return pd.DataFrame(out)


def compare(runs: pd.DataFrame, ours: pd.DataFrame, phase_model: str) -> pd.DataFrame:
    """Per-run table: configuration, reference and predicted percentiles, relative errors."""
    df = pd.DataFrame({
        "mode": phase_model,
        "source": runs["source"],
        "design": runs["design"],
        "n_prompt": np.where(runs["design"].map(is_baseline), runs["machines"], runs["prompt_machines"]),
        "n_token": np.where(runs["design"].map(is_baseline), 0.0, runs["token_machines"]),
        "workload": runs["workload"],
        "rate": runs["rate"],
    })
    for c in ERR_COLS:
        df[f"ref_{c}_s"] = runs[f"{c}_s"].to_numpy()
        df[f"ours_{c}_s"] = ours[f"{c}_s"].to_numpy()
    for c in ERR_COLS:
        df[f"err_{c}"] = df[f"ours_{c}_s"] / df[f"ref_{c}_s"] - 1.0
    df["ref_meets_slo"] = runs["meets_slo"].to_numpy()
    df["ours_meets_slo"] = ours["meets_slo"].to_numpy()
    df["slo_agree"] = df["ref_meets_slo"] == df["ours_meets_slo"]
    df["verdict"] = np.select([df["slo_agree"], df["ours_meets_slo"]], ["agree", "false meets"], "false fails")
    for c in ("rho_prompt", "rho_token", "memory_pressure", "mixed_prompt_frac", "mixed_decode_frac", "status",
              "seconds", "worst_margin", "worst_metric"):
        df[c] = ours[c].to_numpy()
    # The reference's own worst margin, from its slowdown columns.
    limits = np.asarray(sj.PAPER_SLO, float)
    ref_m = np.stack([np.log(limits[i, q] / runs[f"{met}_slowdown_{pc}"].to_numpy(float))
                      for i, met in enumerate(METRICS) for q, pc in enumerate(PCTS)], axis=1)
    df["ref_worst_margin"] = ref_m.min(axis=1)
    df["ref_worst_metric"] = [f"{METRICS[j // 3]}_{PCTS[j % 3]}" for j in ref_m.argmin(axis=1)]
    df["rho_bin"] = pd.cut(df["rho_prompt"], RHO_EDGES, right=False,
                           labels=[_bin_label(a, b) for a, b in zip(RHO_EDGES[:-1], RHO_EDGES[1:])]).astype(str)
    return df


def _bin_label(a, b):
    return f">= {a:g}" if not np.isfinite(b) else f"{a:g}-{b:g}"


def summarise(per_run: pd.DataFrame) -> pd.DataFrame:
    """Median |relative error| per percentile and SLO agreement: overall, by rate, by rho."""
    rows = []
    for mode, dm in per_run.groupby("mode", sort=False):
        groups = [("all", "all", dm)]
        groups += [("source", src, g) for src, g in dm.groupby("source", sort=False)]
        groups += [("design", des, g) for des, g in dm.groupby("design")]
        groups += [("workload", w_, g) for w_, g in dm.groupby("workload")]
        groups += [("rate", f"{r:g}", g) for r, g in dm.groupby("rate")]
        order = [_bin_label(a, b) for a, b in zip(RHO_EDGES[:-1], RHO_EDGES[1:])]
        groups += [("rho_prompt", b, dm[dm["rho_bin"] == b]) for b in order if (dm["rho_bin"] == b).any()]
        for by, value, g in groups:
            d = {"mode": mode, "group_by": by, "group": value, "n_runs": len(g)}
            d.update({c: float(g[f"err_{c}"].abs().median()) for c in ERR_COLS})
            d["slo_agreement"] = float(g["slo_agree"].mean())
            d["false_meets"] = int((g["verdict"] == "false meets").sum())
            d["false_fails"] = int((g["verdict"] == "false fails").sum())
            rows.append(d)
    return pd.DataFrame(rows)


def markdown(summary: pd.DataFrame) -> str:
    """Two markdown tables: overall by percentile (modes as columns), and by load."""
    modes = list(dict.fromkeys(summary["mode"]))
    overall = summary[summary["group_by"] == "all"].set_index("mode")
    lines = ["## Median |relative error| vs SplitwiseSim (all runs)", "",
             "| metric | " + " | ".join(modes) + " |", "|---|" + "---:|" * len(modes)]
    for c in ERR_COLS:
        met, pc = c.split("_")
        lines.append(f"| {met.upper()} {pc.upper()} | " + " | ".join(f"{overall.loc[m, c]:.1%}" for m in modes) + " |")
    lines.append("| SLO verdict agreement | " + " | ".join(f"{overall.loc[m, 'slo_agreement']:.0%}" for m in modes)
                 + " |")
    lines.append("| false meets / false fails | " + " | ".join(
        f"{int(overall.loc[m, 'false_meets'])} / {int(overall.loc[m, 'false_fails'])}" for m in modes) + " |")
    lines.append("| runs | " + " | ".join(f"{int(overall.loc[m, 'n_runs'])}" for m in modes) + " |")
    lines += ["", "## Error growth with load (median |relative error|)", "",
              "| mode | by | group | runs | " + " | ".join(c.replace("_", " ").upper() for c in ERR_COLS)
              + " | SLO agree | false meets | false fails |", "|---|---|---|---:|" + "---:|" * (len(ERR_COLS) + 3)]
    for _, r in summary[summary["group_by"] != "all"].iterrows():
        lines.append(f"| {r['mode']} | {r['group_by']} | {r['group']} | {r['n_runs']} | "
                     + " | ".join(f"{r[c]:.0%}" for c in ERR_COLS)
                     + f" | {r['slo_agreement']:.0%} | {r['false_meets']} | {r['false_fails']} |")
    return "\n".join(lines) + "\n"


def plot(per_run: pd.DataFrame, path: Path) -> None:
    """|relative error| against predicted prompt-pool load, one panel per metric."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4), sharey=True)
    colours = {"splitwise-sim-table": "tab:blue", "calibrated": "tab:orange"}
    markers = {"p50": "o", "p90": "^", "p99": "s"}
    for ax, met in zip(axes, METRICS):
        for mode, dm in per_run.groupby("mode", sort=False):
            for pc in PCTS:
                err = dm[f"err_{met}_{pc}"].abs().clip(lower=1e-4)
                ax.scatter(dm["rho_prompt"], err, s=14, alpha=0.5, marker=markers[pc], color=colours.get(mode),
                           label=f"{mode} {pc.upper()}")
            mids, meds = [], []
            for b, g in dm.groupby("rho_bin"):
                if len(g):
                    mids.append(g["rho_prompt"].median())
                    meds.append(np.median(g[[f"err_{met}_{pc}" for pc in PCTS]].abs().to_numpy()))
            order = np.argsort(mids)
            ax.plot(np.asarray(mids)[order], np.asarray(meds)[order], "-", lw=2, color=colours.get(mode))
        ax.axvline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_yscale("log")
        ax.set_title(f"{met.upper()}: |ours / SplitwiseSim - 1|")
        ax.set_xlabel("predicted prompt-pool load rho")
    axes[0].set_ylabel("|relative error| (lines: median per rho bin)")
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--validation-dir", default=None,
                    help="folder holding splitwisesim_runs.csv (default: the shared validation folder)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"), help="output folder")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=sj.PHASE_MODELS, help="phase-timing modes")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")  # a script: choose the file backend here, not in a library
    from tqdm import tqdm

    runs = load_runs(args.validation_dir)
    if SMOKE:
        runs = smoke_subset(runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tables = []
    with tqdm(total=len(runs) * len(args.modes), desc="validation runs", unit="run") as bar:
        for mode in args.modes:
            t0 = time.perf_counter()
            tables.append(compare(runs, predict(runs, mode, progress=bar), mode))
            bar.write(f"{mode}: {len(runs)} runs in {time.perf_counter() - t0:.1f} s (compiles included)")
    per_run = pd.concat(tables, ignore_index=True)
    summary = summarise(per_run)
    md = markdown(summary)
    per_run.to_csv(out / "validation_runs.csv", index=False)
    summary.to_csv(out / "validation_summary.csv", index=False)
    (out / "validation_summary.md").write_text(md)
    plot(per_run, out / "validation_error_vs_load.png")
    print(md)
    print(f"wrote {out}/validation_runs.csv, validation_summary.csv, validation_summary.md, "
          "validation_error_vs_load.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
