"""Command lines of the serving model (the serving engine of cluster/engine.py; docs/serving.md):

    python -m splitwise_jax.calibrate --benchmarks FILE.csv --out PARAMS.json
    python -m splitwise_jax.predict   --benchmarks FILE.csv --params NAME|FILE --out PRED.csv

`calibrate --benchmarks` fits the phase and engine parameters through the engine model
to every row of a benchmark table (`calibrate.benchmarks`) and writes a params stack;
`predict --benchmarks` writes the table's rows with the predicted columns
(`io.benchmark_rows.predict_frame`) and, where the file holds measurements, prints the
errors. Bad input exits 2 with one message naming the argument.

Credit: the shipped stack `vllm-2026` is fitted to measurements from
github.com/inference-sim/training (vLLM on H100 SXM, collected with
kubernetes-sigs/inference-perf).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import numpy as np

from splitwise_jax.cli import _cli

CREDIT = ("measurements: github.com/inference-sim/training (vLLM on H100 SXM, kubernetes-sigs/inference-perf); "
          "credit that source wherever these numbers appear")


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--specs", default=None, help="TOML/JSON spec file whose models rows may name (docs/specs.md)")
    p.add_argument("--hf-config", action="append", default=[], metavar="DIR",
                   help="a model folder (or config.json) for rows whose model is not in the catalogue; matched "
                        "to a row when its folder name equals the last part of the row's model id "
                        "(case-insensitive); repeatable")


def _extra_llms(args, table) -> dict:
    from splitwise_jax.specs.catalog import get_llm, load_specs
    from splitwise_jax.specs.hf_config import load_hf_config
    from splitwise_jax.io.benchmarks import resolve_model_name

    extra: dict = {}
    if args.specs:
        names = load_specs(_cli.input_file("--specs", args.specs)).get("llms", [])
        for m in set(table.frame["model"]):
            if str(m) in names:
                extra[str(m)] = get_llm(str(m))
    for d in args.hf_config:
        path = _cli.input_file("--hf-config", d) if Path(d).is_file() else Path(d)
        if not path.exists():
            raise ValueError(f"--hf-config {d}: no such folder or file")
        folder = path.parent if path.is_file() else path
        llm = load_hf_config(path, name=folder.name.lower())
        matched = [m for m in set(table.frame["model"]) if str(m).split("/")[-1].lower() == folder.name.lower()]
        if not matched:
            raise ValueError(f"--hf-config {d}: no row's model ends in {folder.name!r} (models: "
                             f"{sorted(set(table.frame['model']))})")
        for m in matched:
            extra[str(m)] = llm
    unknown = sorted({str(m) for m in table.frame["model"] if str(m) not in extra and resolve_model_name(m) is None})
    if unknown:
        from splitwise_jax.specs.catalog import llm_names
        raise ValueError(f"--benchmarks: models {unknown} are not in the catalogue ({', '.join(llm_names())}; "
                         "their Hugging Face ids resolve); give --hf-config DIR or --specs FILE")
    return extra


# ---- calibrate --benchmarks -----------------------------------------------------------

def calibrate_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m splitwise_jax.calibrate --benchmarks",
        description="Fit phase and engine parameters by gradient through the serving-engine model to a table of "
                    "serving benchmarks (load stage -> measured percentiles), and write a params stack.")
    p.add_argument("--benchmarks", required=True, help="benchmark CSV (columns: splitwise_jax.io.benchmarks)")
    p.add_argument("--out", required=True, help="params stack JSON to write (use it with --params FILE)")
    p.add_argument("--steps", type=_cli.positive_int, default=160, help="Adam steps (default 160)")
    p.add_argument("--leave-one-model-out", action="store_true",
                   help="also fit without each model in turn and record the error on it as the stack's expected "
                        "error (one more fit per model)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _model_args(p)
    return p


def calibrate_main(argv: list[str]) -> int:
    """`python -m splitwise_jax.calibrate --benchmarks ...`; bad input exits 2."""
    _cli.preamble()  # float64, loop emitters: before any array is built or JAX starts its backend
    from splitwise_jax.phases.params import STACKS, load_params, read_params_file, write_params_file
    from splitwise_jax.io.benchmarks import GPU_IDS, read_benchmarks
    from splitwise_jax.calibrate.benchmarks import (ENGINE_FIELDS, PHASE_FIELDS, START_PHASE, error_summary,
                                                    fit_benchmarks, leave_one_model_out, verdicts)
    from splitwise_jax.io.benchmark_rows import predict_frame

    ap = calibrate_parser()
    args = ap.parse_args(argv)
    with _cli.input_errors(ap):
        path = _cli.input_file("--benchmarks", args.benchmarks)
        out = _cli.output_file("--out", args.out, make_parents=True)
        table = read_benchmarks(path)
        extra = _extra_llms(args, table)
        gpus = sorted({GPU_IDS[g] for g in table.frame["gpu"]})
        if len(gpus) != 1:
            raise ValueError(f"--benchmarks {path}: rows of one GPU per fit, got {gpus}; split the file by 'gpu'")
    # the fields the rows cannot see (power, DVFS, KV links, knees) come from the 2023 stack
    base = load_params(None, STACKS["paper-2023"][0]).replace(**START_PHASE)
    fit = fit_benchmarks(table, steps=args.steps, start_phase=base, extra_llms=extra, progress=not args.no_progress)
    frame = predict_frame(table, lambda g: fit.phase, fit.engine, extra)
    summary = error_summary(frame)
    meta = {
        "generated_by": "python -m splitwise_jax.calibrate " + shlex.join(sys.argv[1:] if argv is None else argv),
        "kind": "serving-benchmarks",
        "benchmarks": str(args.benchmarks), "rows": len(table), "gpu": gpus[0],
        "models": sorted({str(m) for m in table.frame["model"]}),
        "fitted_phase_fields": list(PHASE_FIELDS), "fitted_engine_fields": list(ENGINE_FIELDS),
        "loss_first_last": [fit.loss_first, fit.loss_last], "steps": fit.steps, "fit_seconds": round(fit.seconds, 1),
        "at_bounds": fit.at_bounds, "credit": CREDIT,
        "training_error_pct": {r["metric"]: round(float(r["median_abs_err_pct"]), 1) for _, r in summary.iterrows()},
        "training_verdicts": verdicts(frame),
    }
    if args.leave_one_model_out:
        meta["expected_error_pct"] = leave_one_model_out(table, steps=args.steps, start_phase=base, extra=extra,
                                                         progress=not args.no_progress)["summary"]
        meta["expected_error_from"] = "leave-one-model-out over the fitted rows (median |relative error|, %)"
    # the cluster model (evaluate, optimize) runs the phase model's ring all-reduce of
    # 2 (tp - 1) steps; its step latency is set so that a call on an 8-GPU machine (the
    # designs' one instance per machine) takes the fitted per-call latency
    shared = fit.phase.replace(allreduce_latency_s=fit.engine.allreduce_call_s / 14.0)
    meta["allreduce_latency_s_is"] = "allreduce_call_s / 14: one call of the fitted latency at TP 8"
    write_params_file(out, shared, {}, meta, engine=fit.engine.to_dict())
    read_params_file(out)  # the one reader accepts what was written
    print(f"fitted {len(table)} stages of {', '.join(meta['models'])} on {gpus[0]} in {fit.seconds:.1f} s "
          f"(loss {fit.loss_first:.3g} -> {fit.loss_last:.3g}){'; at bounds: ' + ', '.join(fit.at_bounds) if fit.at_bounds else ''}")
    print("training error, median |relative error| over stages that kept up (%):")
    print(summary.round(1).to_string(index=False))
    print("overload verdicts:", verdicts(frame))
    if "expected_error_pct" in meta:
        print("expected error on a model never fitted (leave-one-model-out, %):", meta["expected_error_pct"])
    print(f"wrote {out}")
    return 0


# ---- predict --benchmarks ---------------------------------------------------------------

def predict_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m splitwise_jax.predict --benchmarks",
        description="Predict a benchmark table: each row's TTFT/TPOT/E2E percentiles, served rate and whether the "
                    "engine keeps up, from a params stack.")
    p.add_argument("--benchmarks", required=True, help="benchmark CSV (columns: splitwise_jax.io.benchmarks)")
    p.add_argument("--params", default="vllm-2026",
                   help="a stack name (vllm-2026, paper-2023) or a params file (default vllm-2026)")
    p.add_argument("--out", required=True, help="CSV to write: the rows plus pred_* columns")
    _model_args(p)
    return p


def predict_main(argv: list[str]) -> int:
    """`python -m splitwise_jax.predict --benchmarks ...`; bad input exits 2."""
    _cli.preamble()  # float64, loop emitters: before any array is built or JAX starts its backend
    from splitwise_jax.phases.params import params_for_gpu, read_params_file, resolve_params, stack_name
    from splitwise_jax.io.benchmarks import read_benchmarks
    from splitwise_jax.cluster.engine import EngineParams
    from splitwise_jax.calibrate.benchmarks import error_summary, verdicts
    from splitwise_jax.io.benchmark_rows import predict_frame

    ap = predict_parser()
    args = ap.parse_args(argv)
    with _cli.input_errors(ap):
        path = _cli.input_file("--benchmarks", args.benchmarks)
        out = _cli.output_file("--out", args.out)
        params_path = resolve_params(args.params)
        content = read_params_file(params_path)
        engine = EngineParams.from_dict(content.engine)
        table = read_benchmarks(path)
        extra = _extra_llms(args, table)
    name = stack_name(params_path) or str(params_path)
    if not content.engine:
        print(f"note: {name} holds no engine parameters (a stack fitted to iteration profiles); the engine's "
              "defaults stand in for them", file=sys.stderr)
    frame = predict_frame(table, lambda g: params_for_gpu(content, g), engine, extra)
    frame["params_stack"] = name
    frame.to_csv(out, index=False, float_format="%.6g")
    expected = content.meta.get("expected_error_pct")
    print(f"params: {name}" + (f"; expected error on an unmeasured model (median |rel. err.|, %): {expected}"
                               if expected else ""))
    shown = ["experiment", "stage", "rate_per_s", "pred_ttft_p50_s", "pred_tpot_p50_s", "pred_e2e_p50_s",
             "pred_throughput_req_per_s", "pred_overloaded"]
    print(frame[[c for c in shown if c in frame.columns]].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    summary = error_summary(frame)
    if len(summary):
        print("\nagainst the file's measurements, median |relative error| over stages that kept up (%):")
        print(summary.round(1).to_string(index=False))
        print("overload verdicts:", verdicts(frame))
    print(f"wrote {len(frame)} rows to {out}")
    return 0
