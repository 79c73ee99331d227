"""The fluid model on real arrivals it was never compared with (GitHub issue 10).

The reference runs hold four replays of the Azure 2023 traces (code compressed to 600 s,
conversation to 1,200 s, on two clusters each). To check the trace path of the fluid
model (docs/cluster.md §3b-3c) beyond them, this script makes new replays and runs each
on several clusters twice: through `evaluate` (the fluid model, reading the trace's own
arrival profile) and through our request-level simulator (`splitwise_jax.simulate`),
which reproduces the reference's four replays request by request (its TTFT P50 on the
Baseline-H100 12 code replay equals SplitwiseSim's to 6 digits, docs/simulate.md). Both
use the reference's phase timing (``splitwise-sim-table``), BLOOM-176B, so the difference
is the queueing model's.

Replays (none is in ``../shared/validation``): the whole code trace compressed to 450 s
and 900 s; its first and second halves, each compressed to 300 s (their own burst
patterns); the conversation trace compressed to 800 s. Clusters: Baseline-H100 and
Splitwise-HH at three sizes each around those of the reference's own boundary runs
(per machine and per request rate), and one Splitwise-HA.

Writes ``replay_check.csv`` (fluid and simulated P50/P90/P99 of TTFT, TBT and E2E, the
relative errors, both SLO verdicts) and ``replay_check.md`` (median |error| by trace and
by design) into ``--out``. About 15 minutes on 2 cores, most of it the simulator;
``--reuse-sim CSV`` reads the simulated percentiles from an earlier run's
``replay_check.csv`` instead (a model change does not change them; ~8 minutes).

Usage:
    python studies/replay_check.py [--out studies/out/replay_check]
    SPLITWISE_SMOKE=1 python studies/replay_check.py   # one replay, two clusters
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from splitwise_jax._paths import azure_trace_csv  # noqa: E402
import splitwise_jax as sj  # noqa: E402
from splitwise_jax.cluster.metrics import KEYS  # noqa: E402

SMOKE = os.environ.get("SPLITWISE_SMOKE", "") not in ("", "0")
METRICS = ("ttft", "tbt", "e2e")
PCTS = KEYS  # ("p50", "p90", "p99")
PHASE_MODEL = "splitwise-sim-table"


def replays() -> dict[str, pd.DataFrame]:
    """name -> normalised trace (arrival_s, prompt_tokens, output_tokens)."""
    code = sj.load_trace(azure_trace_csv("coding"))
    conv = sj.load_trace(azure_trace_csv("conversation"))
    half = len(code) // 2
    out = {"code_450s": _compress(code, 450.0), "code_900s": _compress(code, 900.0),
           "code_first_half_300s": _compress(code.iloc[:half], 300.0),
           "code_second_half_300s": _compress(code.iloc[half:], 300.0),
           "conv_800s": _compress(conv, 800.0)}
    return {"code_first_half_300s": out["code_first_half_300s"]} if SMOKE else out


def _compress(df: pd.DataFrame, horizon_s: float) -> pd.DataFrame:
    """The trace's arrivals scaled linearly onto [1, 1 + horizon_s] (as the reference's
    replays were made), sizes kept."""
    t = df["arrival_s"].to_numpy(float)
    t = 1.0 + (t - t[0]) * horizon_s / (t[-1] - t[0])
    return pd.DataFrame({"arrival_s": t, "prompt_tokens": df["prompt_tokens"].to_numpy(),
                         "output_tokens": df["output_tokens"].to_numpy()}).reset_index(drop=True)


def clusters(rate: float, code: bool):
    """(design, prompt machines, token machines) at mean prompt loads ~0.3-0.8, sized as
    the reference's own boundary runs are: per Baseline-H100 machine ~2 coding req/s
    (48 machines at 60 req/s meet the SLOs) or ~2.4 conversation req/s (25 at 60); per
    Splitwise-HH prompt machine ~2.7 / ~3.8 req/s with a token pool of 0.15 / 0.55 of
    the prompt pool (22+3 coding, 16+9 conversation at 60 req/s). Duplicates (small
    traces round to the same sizes) are run once."""
    per_base, per_prompt, token_ratio = (2.0, 2.7, 0.2) if code else (2.4, 3.8, 0.55)
    out = []
    for scale in ((0.8, 1.5) if SMOKE else (0.6, 1.0, 1.5)):
        out.append(("baseline-h100", max(2.0, round(rate / per_base / scale)), 0.0))
    for scale in ((1.0,) if SMOKE else (0.7, 1.0, 1.3)):
        n_p = max(2.0, round(rate / per_prompt / scale))
        out.append(("splitwise-hh", n_p, max(2.0, round(n_p * token_ratio))))
    if not SMOKE:
        n_p = max(2.0, round(rate / per_prompt))
        out.append(("splitwise-ha", n_p, max(2.0, round(n_p * token_ratio * 1.5))))
    return list(dict.fromkeys(out))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "out" / "replay_check"),
                    help="output folder")
    ap.add_argument("--reuse-sim", default=None, metavar="CSV",
                    help="an earlier replay_check.csv whose simulated percentiles to reuse")
    args = ap.parse_args(argv)
    reuse = None
    if args.reuse_sim:
        reuse = pd.read_csv(args.reuse_sim).set_index(["trace", "design", "n_prompt", "n_token"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, df in replays().items():
        wl = sj.Workload.from_trace(df, arrival="trace", name=name)
        tr = sj.RequestTrace.from_arrays(df["arrival_s"].to_numpy(), df["prompt_tokens"].to_numpy(),
                                      df["output_tokens"].to_numpy(), name=name)
        rate = float(wl.rate_per_s)
        for design, n_p, n_t in clusters(rate, name.startswith("code")):
            sizes = (n_p, n_t) if n_t else (n_p,)
            cluster = sj.make_cluster(design, *sizes, phase_model=PHASE_MODEL)
            fluid = jax.tree.map(np.asarray, sj.evaluate(cluster, wl))
            key = (name, design, n_p, n_t)
            if reuse is not None and key in reuse.index:
                old = reuse.loc[key]
                sim_ok = bool(old["sim_meets_slo"])
                sim_pct = {met: {pc: float(old[f"sim_{met}_{pc}_s"]) for pc in PCTS} for met in METRICS}
            else:
                sim = sj.simulate(cluster, tr, power=False)
                sim_ok = bool(sim.metrics["meets_slo"])
                sim_pct = {met: {pc: float(sim.metrics[f"{met}_s"][pc]) for pc in PCTS} for met in METRICS}
            row = {"trace": name, "rate": rate, "design": design, "n_prompt": n_p, "n_token": n_t,
                   "rho_prompt": float(fluid.rho_prompt_pool), "fluid_meets_slo": bool(fluid.meets_slo),
                   "sim_meets_slo": sim_ok}
            for met in METRICS:
                for i, pc in enumerate(PCTS):
                    f, s = float(getattr(fluid, f"{met}_s")[i]), sim_pct[met][pc]
                    row.update({f"fluid_{met}_{pc}_s": f, f"sim_{met}_{pc}_s": s, f"err_{met}_{pc}": f / s - 1.0})
            rows.append(row)
            print(f"{name} {design} {n_p:g}+{n_t:g} (rho {row['rho_prompt']:.2f}): "
                  + ", ".join(f"{met.upper()} " + " / ".join(f"{row[f'err_{met}_{pc}']:+.0%}" for pc in PCTS)
                              for met in METRICS)
                  + f"; verdict {'agree' if row['fluid_meets_slo'] == row['sim_meets_slo'] else 'DISAGREE'}",
                  flush=True)
        # The fluid model runs op by op here, and each op's program stays loaded: one
        # process reached Linux's memory-map limit (LLVM "Cannot allocate memory") after
        # 33 of the 35 runs. Release them after each replay (docs/speed.md §4).
        jax.clear_caches()
    per_run = pd.DataFrame(rows)
    per_run.to_csv(out / "replay_check.csv", index=False)
    md = _summary(per_run)
    (out / "replay_check.md").write_text(md)
    print(md)
    print(f"wrote {out / 'replay_check.csv'} and replay_check.md" + (" (smoke)" if SMOKE else ""))
    return 0


def _summary(per_run: pd.DataFrame) -> str:
    cols = [f"err_{m}_{p}" for p in PCTS for m in METRICS]
    lines = ["| group | runs | " + " | ".join(c[4:].replace("_", " ").upper() for c in cols)
             + " | verdicts agree |", "|---|---:|" + "---:|" * (len(cols) + 1)]
    groups = [("all", per_run)] + [(f"trace {k}", g) for k, g in per_run.groupby("trace")] \
        + [(f"design {k}", g) for k, g in per_run.groupby("design")]
    for label, g in groups:
        med = g[cols].abs().median()
        agree = (g["fluid_meets_slo"] == g["sim_meets_slo"]).mean()
        lines.append(f"| {label} | {len(g)} | " + " | ".join(f"{v:.0%}" for v in med) + f" | {agree:.0%} |")
    return "Median |fluid / simulated - 1| (sim-table timing)\n\n" + "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
