"""`python -m splitwise_jax.predict`: profile-style prompt and token times from the calibrated phase model.

    python -m splitwise_jax.predict [--params params.json] --queries queries.csv --out out.csv

The queries file has one row per configuration with the columns of SplitwiseSim's
``perf_model.csv`` that define it: ``model, hardware, tensor_parallel, prompt_size,
batch_size, token_size``. The output is the same rows (every input column kept, in
order) with ``prompt_time`` and ``token_time`` in milliseconds, meaning what they mean
in the profiles (`splitwise_jax.calibrate.queries`). Existing ``prompt_time`` /
``token_time`` columns are overwritten.

``--interval 0.9`` adds ``prompt_time_lo, prompt_time_hi, token_time_lo, token_time_hi``
(ms): a central 90% prediction interval from the calibration's parameter uncertainty
and its residual scatter (docs/uncertainty.md; on held-out profile rows 87-93% of the
measurements fall inside).

``--benchmarks FILE`` predicts a serving-benchmark table instead (`cli.serving`).

Hardware names are the profiles' (``a100-80gb``, ``h100-80gb``, ``h100-80gb-pcap`` = H100
at a 70% power cap); models are the catalogue's. Bad arguments or queries print a
message naming the problem to stderr and exit with status 2 (argparse's error).

The entry module `splitwise_jax.predict` (``python -m splitwise_jax.predict``) only
calls `main` here.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from splitwise_jax.cli import _cli, _design_args
from splitwise_jax.calibrate.queries import QUERY_COLUMNS, predict_queries


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m splitwise_jax.predict",
        description="Predict prompt_time and token_time (ms) for profile-style configurations.")
    _design_args.add_params_argument(p)
    p.add_argument("--queries", required=True,
                   help=f"CSV with columns {','.join(QUERY_COLUMNS)}")
    p.add_argument("--out", required=True, help="CSV to write (the queries plus prompt_time, token_time in ms)")
    p.add_argument("--interval", type=float, default=None, metavar="LEVEL",
                   help="also write a central prediction interval at this level, e.g. 0.9 (columns "
                        "prompt_time_lo/hi, token_time_lo/hi)")
    return p


def _params_file(name_or_path):
    """--params as every command reads it: a stack name (`phases.params.STACKS`) or a
    params file (checked as an input file); None for the default stack."""
    from splitwise_jax.phases.params import STACKS, resolve_params

    if name_or_path is None:
        return None
    if name_or_path in STACKS:
        return resolve_params(name_or_path)
    return _cli.input_file("--params", name_or_path)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; bad arguments or inputs exit 2 with a message."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--benchmarks" or a.startswith("--benchmarks=") for a in argv):
        from splitwise_jax.cli.serving import predict_main  # a benchmark table, not profile queries
        return predict_main(argv)
    _cli.preamble()  # float64, loop emitters: before any array is built or JAX starts its backend
    ap = build_parser()
    args = ap.parse_args(argv)
    with _cli.input_errors(ap):
        if args.interval is not None and not 0.0 < args.interval < 1.0:
            raise ValueError(f"--interval must be a probability in (0, 1), got {args.interval:g}")
        path = _cli.input_file("--queries", args.queries)
        out_path = _cli.output_file("--out", args.out)
        params = _params_file(args.params)
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
    _cli.run(main)
