"""Predict profile-style prompt and token times with the calibrated phase model.

    python -m splitwise_jax.predict [--params params.json] --queries queries.csv --out out.csv

The queries file has one row per configuration with the columns of SplitwiseSim's
``perf_model.csv`` that define it: ``model, hardware, tensor_parallel, prompt_size,
batch_size, token_size``. The output is the same rows (every input column kept, in
order) with ``prompt_time`` and ``token_time`` in milliseconds, meaning what they mean
in the profiles: the time of the prompt iteration over ``batch_size`` prompts of
``prompt_size`` tokens, and the mean decode-iteration time while those ``batch_size``
requests generate ``token_size`` tokens each. Existing ``prompt_time`` / ``token_time``
columns are overwritten.

``--interval 0.9`` adds ``prompt_time_lo, prompt_time_hi, token_time_lo, token_time_hi``
(ms): a central 90% prediction interval from the calibration's parameter uncertainty
and its residual scatter (docs/uncertainty.md; on held-out profile rows 87-93% of the
measurements fall inside).

Hardware names are the profiles' (``a100-80gb``, ``h100-80gb``, ``h100-80gb-pcap`` = H100
at a 70% power cap); models are the catalogue's. Bad arguments or queries print a
message naming the problem to stderr and exit with status 2 (argparse's error).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from splitwise_jax.cli import _cli
from splitwise_jax.specs.catalog import MACHINE_OF_HARDWARE, get_machine, llm_names

QUERY_COLUMNS: tuple[str, ...] = ("model", "hardware", "tensor_parallel", "prompt_size", "batch_size", "token_size")
_SIZE_COLUMNS = ("tensor_parallel", "prompt_size", "batch_size", "token_size")


def validate_queries(df: pd.DataFrame, *, source: str = "queries") -> pd.DataFrame:
    """Check a queries table; returns a copy with sizes as int64 and names as str.

    Raises:
        ValueError: a missing column, an unknown model or hardware, a size that is not a
            positive integer, or a tensor-parallel degree above the machine's GPU count.
            The message names the column, the first offending row and what is accepted.
    """
    missing = [c for c in QUERY_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{source} lacks column(s) {missing}; required: {list(QUERY_COLUMNS)}, "
                         f"found: {list(df.columns)}")
    if df.empty:
        raise ValueError(f"{source} has no rows")
    out = df.copy()

    def first(mask) -> str:
        i = int(np.flatnonzero(np.asarray(mask))[0])
        return f"data row {i} (file line {i + 2})"

    for col, accepted in (("model", llm_names()), ("hardware", sorted(MACHINE_OF_HARDWARE))):
        names = out[col].astype(str).str.strip()
        bad = ~names.isin(accepted) | out[col].isna()
        if bad.any():
            raise ValueError(f"{source}: unknown {col} {out[col][bad].iloc[0]!r} in {first(bad)}; "
                             f"accepted: {accepted}")
        out[col] = names
    for col in _SIZE_COLUMNS:
        v = pd.to_numeric(out[col], errors="coerce")
        bad = v.isna() | ~np.isfinite(v) | (v <= 0) | (v != np.round(v))
        if bad.any():
            raise ValueError(f"{source}: column {col!r} must hold positive integers; got "
                             f"{out[col][bad].iloc[0]!r} in {first(bad)}")
        out[col] = v.astype("int64")
    gpus = out["hardware"].map(lambda h: get_machine(MACHINE_OF_HARDWARE[h]).gpus_per_machine)
    bad = out["tensor_parallel"] > gpus
    if bad.any():
        raise ValueError(f"{source}: tensor_parallel {int(out['tensor_parallel'][bad].iloc[0])} exceeds the "
                         f"{int(gpus[bad].iloc[0])} GPUs of the machine in {first(bad)}")
    return out


def predict_queries(queries: pd.DataFrame, params_path: str | Path | None = None,
                    interval: float | None = None) -> pd.DataFrame:
    """The queries with prompt_time and token_time (ms) predicted.

    Args:
        queries: rows with `QUERY_COLUMNS` (validated here).
        params_path: a params file from `python -m splitwise_jax.calibrate` (default:
            the fit shipped in the package).
        interval: also give a central prediction interval at this level, in (0, 1)
            (columns {prompt,token}_time_{lo,hi}, ms).

    Returns:
        The rows, every input column kept, prompt_time and token_time set (ms).

    Raises:
        ValueError: bad queries, an unreadable params file, or an interval level
            outside (0, 1) or a params file without uncertainty.
    """
    from splitwise_jax.calibrate import Fitted, predict_frame
    from splitwise_jax.calibrate.intervals import predict_intervals

    q = validate_queries(queries)
    fitted = Fitted.load(params_path)
    pred = predict_frame(fitted, q) if interval is None else predict_intervals(fitted, q, interval)
    out = queries.copy()
    out["prompt_time"] = pred["prompt_time"].to_numpy()
    out["token_time"] = pred["token_time"].to_numpy()
    if interval is not None:
        for col in ("prompt_time_lo", "prompt_time_hi", "token_time_lo", "token_time_hi"):
            out[col] = pred[col].to_numpy()
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m splitwise_jax.predict",
        description="Predict prompt_time and token_time (ms) for profile-style configurations.")
    p.add_argument("--params", default=None,
                   help="params JSON written by `python -m splitwise_jax.calibrate` (default: the shipped fit)")
    p.add_argument("--queries", required=True,
                   help=f"CSV with columns {','.join(QUERY_COLUMNS)}")
    p.add_argument("--out", required=True, help="CSV to write (the queries plus prompt_time, token_time in ms)")
    p.add_argument("--interval", type=float, default=None, metavar="LEVEL",
                   help="also write a central prediction interval at this level, e.g. 0.9 (columns "
                        "prompt_time_lo/hi, token_time_lo/hi)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; bad arguments or inputs exit 2 with a message."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--benchmarks" or a.startswith("--benchmarks=") for a in argv):
        from splitwise_jax.cli.serving import predict_main  # a benchmark table, not profile queries
        return predict_main(argv)
    _cli.preamble()  # float64, loop emitters: before any array is built or JAX starts its backend
    ap = _parser()
    args = ap.parse_args(argv)
    with _cli.input_errors(ap):
        if args.interval is not None and not 0.0 < args.interval < 1.0:
            raise ValueError(f"--interval must be a probability in (0, 1), got {args.interval:g}")
        path = _cli.input_file("--queries", args.queries)
        out_path = _cli.output_file("--out", args.out)
        params = None if args.params is None else _cli.input_file("--params", args.params)
        try:
            queries = pd.read_csv(path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise ValueError(f"--queries {path} is not a readable CSV: {e}") from None
        try:
            out = predict_queries(queries, params, args.interval)
        except ValueError as e:
            which = f"--params {params}" if params is not None and "params file" in str(e) else f"--queries {path}"
            raise ValueError(f"{which}: {e}") from None
    out.to_csv(out_path, index=False)
    print(f"wrote {len(out)} predictions to {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
