"""`python -m splitwise_jax.calibrate`: fit, write the parameters, print held-out errors.

Inputs are checked before the fit starts; bad input exits 2 with a message naming the
argument (`splitwise_jax._cli`). See docs/calibration.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from pathlib import Path

import pandas as pd

from splitwise_jax.cli import _cli
from splitwise_jax.calibrate.errors import coverage_markdown, error_table, markdown_tables, summary_table
from splitwise_jax.calibrate.fit import FitConfig, Fitted, fit, outlier_ids, power_outliers
from splitwise_jax.calibrate.intervals import coverage_table, unseen_gpu_sd
from splitwise_jax.calibrate.laplace import laplace
from splitwise_jax.calibrate.report import plot_predicted_vs_measured, report_text
from splitwise_jax.calibrate.splits import SPLITS, evaluate_split
from splitwise_jax.specs.catalog import MACHINE_OF_HARDWARE, llm_names
from splitwise_jax.phases.params import FITTED_PARAMS_FILE
from splitwise_jax.phases.profiles import flag_outliers, profile_medians

#: calibration/ of a checkout (the shipped fit's report goes there).
_REPO_CALIBRATION = Path(__file__).resolve().parents[2] / "calibration"
_SPLIT_ALIASES = {"a": "random", "b": "extrapolation", "c": "spec_transfer"}


def _parse_splits(text: str) -> list[str]:
    if text.strip().lower() in ("none", ""):
        return []
    out = []
    for s in text.split(","):
        s = _SPLIT_ALIASES.get(s.strip().lower(), s.strip().lower())
        if s not in SPLITS:
            raise ValueError(f"--splits: unknown split {s!r}; accepted: a, b, c, {', '.join(SPLITS)} or none")
        out.append(s)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m splitwise_jax.calibrate",
        description="Fit the phase model to SplitwiseSim's measured profiles, write the parameters, and print "
                    "held-out errors against SplitwiseSim's interpolation.")
    p.add_argument("--profiles", default=None,
                   help="profile CSV (perf_model.csv columns); default: the shared perf_model.csv")
    p.add_argument("--out", default=None,
                   help=f"params JSON to write (default: the shipped {FITTED_PARAMS_FILE.name} in the package)")
    p.add_argument("--splits", default="a,b,c",
                   help="held-out splits to run: a (random 80:20), b (extrapolation), c (spec transfer), "
                        "comma-separated, or 'none' (default: a,b,c)")
    p.add_argument("--seeds", type=_cli.positive_int, default=5, help="random splits to average over (default 5)")
    p.add_argument("--steps", type=_cli.positive_int, default=None,
                   help=f"Adam steps per fit (default {FitConfig.steps})")
    p.add_argument("--plot", default=None,
                   help="predicted-vs-measured PNG (default: next to --out, or calibration/ for the shipped fit)")
    p.add_argument("--report", default=None,
                   help="folder for README.md (error tables) and errors.csv (default: calibration/ when "
                        "writing the shipped fit from a checkout, else none)")
    p.add_argument("--quick", action="store_true", help="smoke run: 400 steps, 2 seeds")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; bad arguments or inputs exit 2 with a message."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--benchmarks" or a.startswith("--benchmarks=") for a in argv):
        from splitwise_jax.cli.serving import calibrate_main  # serving benchmarks, not iteration profiles
        return calibrate_main(argv)
    _cli.preamble()  # float64, loop emitters: before any array is built or JAX starts its backend
    from splitwise_jax.phases.profiles import load_profiles

    ap = build_parser()
    args = ap.parse_args(argv)
    default_out = args.out is None
    with _cli.input_errors(ap):
        splits = _parse_splits(args.splits)
        out = FITTED_PARAMS_FILE if default_out else _cli.output_file("--out", args.out, make_parents=True)
        report = (_cli.output_folder("--report", args.report) if args.report else
                  (_REPO_CALIBRATION if default_out and _REPO_CALIBRATION.is_dir() else None))
        plot = (_cli.output_file("--plot", args.plot, make_parents=True) if args.plot else
                (report / "pred_vs_measured.png" if report is not None
                 else out.with_name(out.stem + "_pred_vs_measured.png")))
        profiles = None if args.profiles is None else _cli.input_file("--profiles", args.profiles)
        try:
            rows = load_profiles(profiles)
        except FileNotFoundError as e:
            raise ValueError(f"{e}; pass --profiles PATH") from None
        except ValueError as e:
            raise ValueError(f"--profiles {profiles}: {e}" if profiles is not None else str(e)) from None
        for col, known in (("model", llm_names()), ("hardware", sorted(MACHINE_OF_HARDWARE))):
            unknown = sorted(set(rows[col]) - set(known))
            if unknown:
                raise ValueError(f"--profiles: unknown {col} {unknown}; the catalogue knows {known}")

    steps = args.steps or (400 if args.quick else FitConfig.steps)
    seeds = range(2 if args.quick and args.seeds == 5 else args.seeds)
    config = FitConfig(steps=steps)
    progress = not args.no_progress
    command = "python -m splitwise_jax.calibrate" + ("" if not argv else " " + shlex.join(argv))

    medians = profile_medians(rows)
    flags = flag_outliers(medians)
    power_bad = power_outliers(medians)
    print(f"profiles: {len(rows)} rows, {len(medians)} configurations")
    for _, r in flags.iterrows():
        print(f"outlier (not fitted): {r['model']} {r['hardware']} TP{r['tensor_parallel']} "
              f"{r['prompt_size']}x{r['batch_size']}: {r['reason']}")
    for _, r in power_bad.iterrows():
        print(f"average power not fitted: {r['model']} {r['hardware']} TP{r['tensor_parallel']} "
              f"{r['prompt_size']}x{r['batch_size']}: {r['reason']}")

    fitted, history = fit(medians, config=config, progress=progress, desc="full fit")
    uncertainty = laplace(fitted, medians, config=config)
    preds = []
    for split in splits:
        try:
            preds.append(evaluate_split(rows, medians, split, seeds=seeds, config=config, progress=progress))
        except ValueError as e:
            print(f"split {split} skipped: {e}")
    predictions = pd.concat(preds, ignore_index=True) if preds else None
    meta = dict(fitted.meta)
    meta.update({
        "generated_by": command,
        "profiles": str(args.profiles or "shared/data/splitwise_sim_profiles/perf_model.csv"),
        "loss_history_first_last": [history[0], history[-1]],
        "outliers_excluded": sorted(int(i) for i in outlier_ids(medians)),
        "average_power_excluded": sorted(int(i) for i in power_bad["config_id"]),
    })
    if predictions is not None:
        summ = summary_table(predictions)
        meta["held_out_mape_percent"] = {
            f"{r['split']}: {r['subset']}": {"prompt": round(float(r["model_prompt_mape"]), 2),
                                             "token": round(float(r["model_token_mape"]), 2)}
            for _, r in summ.iterrows() if r["subset"] in ("all", "TP 4 and 8")}
        meta["held_out_max_percent"] = {
            f"{r['split']}: {r['subset']}": {"prompt": round(float(r["model_prompt_max"]), 2),
                                             "token": round(float(r["model_token_max"]), 2)}
            for _, r in summ.iterrows() if r["subset"] == "all"}
    coverage = None
    if predictions is not None and "interval_level" in predictions:
        coverage = coverage_table(predictions)
        meta["held_out_interval_coverage"] = {f"{r['split']}: {r['phase']}": round(float(r["covered"]), 4)
                                              for _, r in coverage.iterrows()}
        uncertainty = dataclasses.replace(uncertainty, unseen_gpu_sd=unseen_gpu_sd(predictions))
    fitted = Fitted(fitted.shared, fitted.per_gpu, meta, uncertainty)
    out.parent.mkdir(parents=True, exist_ok=True)
    fitted.save(out)
    print(f"wrote parameters to {out} (full-fit loss {history[-1]:.4g}, {meta['fit_seconds']} s)")

    if predictions is not None:
        pd.set_option("display.width", 200)
        cols = ["n", "model_prompt_mape", "base_prompt_mape", "model_prompt_max", "base_prompt_max",
                "model_token_mape", "base_token_mape", "model_token_max", "base_token_max"]
        print("\nHeld-out error, % (model vs SplitwiseSim interpolation baseline):")
        print(summary_table(predictions).set_index(["split", "subset"])[cols].round(1).to_string())
        print()
        print(error_table(predictions).set_index(["split", "model", "hardware", "tensor_parallel"])[cols]
              .round(1).to_string())
        if coverage is not None:
            print("\nHeld-out coverage of the prediction intervals:")
            print(coverage.to_string(index=False))
    plot.parent.mkdir(parents=True, exist_ok=True)
    plot_predicted_vs_measured(fitted, medians, held_out=predictions).savefig(plot, dpi=120)
    print(f"wrote plot to {plot}")
    if report is not None and predictions is not None:
        report.mkdir(parents=True, exist_ok=True)
        (report / "README.md").write_text(report_text(fitted, markdown_tables(predictions), flags, power_bad, command,
                                                      None if coverage is None else coverage_markdown(coverage)))
        predictions.to_csv(report / "errors.csv", index=False, float_format="%.6g")
        print(f"wrote {report / 'README.md'} and {report / 'errors.csv'}")
    return 0
