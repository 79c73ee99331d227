"""Profile-style queries: iteration times predicted by the calibrated phase model.

A query is one row with the columns of SplitwiseSim's ``perf_model.csv`` that define a
configuration (`QUERY_COLUMNS`: model, hardware, tensor_parallel, prompt_size,
batch_size, token_size); `predict_queries` gives its ``prompt_time`` and ``token_time``
in milliseconds, meaning what they mean in the profiles: the time of the prompt
iteration over ``batch_size`` prompts of ``prompt_size`` tokens, and the mean
decode-iteration time while those ``batch_size`` requests generate ``token_size`` tokens
each. The command line is `python -m splitwise_jax.predict` (`splitwise_jax.cli.predict`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from splitwise_jax.specs.catalog import MACHINE_OF_HARDWARE, get_machine, llm_names

__all__ = ["QUERY_COLUMNS", "validate_queries", "predict_queries"]

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
    from splitwise_jax.calibrate.fit import Fitted
    from splitwise_jax.calibrate.intervals import predict_intervals
    from splitwise_jax.calibrate.rows import predict_frame

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
