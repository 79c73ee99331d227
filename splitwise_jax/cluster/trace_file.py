"""Request traces on disk: reading a trace CSV into normalised columns (NumPy and pandas,
no JAX, so that a warm `python -m splitwise_jax.simulate` reads its trace without it).

`load_trace` is re-exported by `cluster.workload`, whose `workload()` turns a trace into
the model's `Workload`; `simulate.trace.from_csv` turns it into the simulator's requests.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["load_trace"]

_SPLITWISESIM_COLUMNS = (
    "request_id",
    "request_type",
    "application_id",
    "arrival_timestamp",
    "batch_size",
    "prompt_size",
    "token_size",
)
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_NORMALISED_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
_FORMATS = {
    "SplitwiseSim": _SPLITWISESIM_COLUMNS,
    "Azure": _AZURE_COLUMNS,
    "normalised": _NORMALISED_COLUMNS,
}
# SplitwiseSim's RequestType.GENERATIVE_LLM, the only type it simulates.
_SPLITWISESIM_LLM_REQUEST = 2


def load_trace(path: str | os.PathLike) -> pd.DataFrame:
    """Reads a request trace and normalises its columns.

    Accepted formats, detected from the header (extra columns are ignored):

    - SplitwiseSim: ``request_id,request_type,application_id,arrival_timestamp,
      batch_size,prompt_size,token_size`` with arrival_timestamp in seconds,
      request_type 2 (generative LLM) and batch_size 1.
    - Azure LLM inference trace: ``TIMESTAMP,ContextTokens,GeneratedTokens`` with
      TIMESTAMP a datetime string; arrivals become seconds after the first request.
    - normalised: ``arrival_s,prompt_tokens,output_tokens`` (this function's output).

    Sizes must be finite and >= 1 token; arrivals must be non-decreasing (unsorted
    traces are rejected, not sorted, since they usually mean a corrupted file).

    Args:
        path: the CSV file.

    Returns:
        DataFrame with float columns ``arrival_s`` (s), ``prompt_tokens`` and
        ``output_tokens`` (tokens), one row per request in arrival order.

    Raises:
        ValueError: naming the file and the problem (empty file, no requests, unknown
            header, missing columns, NaN or non-numeric values, sizes < 1, unsupported
            request_type or batch_size, unsorted timestamps).
    """
    import pandas as pd  # imported here, not at the top (see the top's note)
    try:
        # A replay reproduces the file's timestamps to the last bit. The default float
        # parser of pandas before 3.1 can differ from them in the 16th digit (pandas 2.3
        # and 3.0: 356 of 2,000 values; CI, 2026-12-03), so those versions are asked for
        # round-trip parsing (0 of 2,000); pandas 3.1 parses exactly by default and
        # deprecates the argument.
        exact = {"float_precision": "round_trip"} if _version(pd.__version__) < (3, 1) else {}
        raw = pd.read_csv(path, **exact)
    except pd.errors.EmptyDataError:
        raise ValueError(f"trace {path} is empty; expected a CSV with a header") from None
    return _normalise(raw, f"trace {path}")


def _detect_format(columns, source: str) -> str:
    present = set(columns)
    for fmt, cols in _FORMATS.items():
        if present.issuperset(cols):
            return fmt
    accepted = "; ".join(f"{fmt}: {','.join(cols)}" for fmt, cols in _FORMATS.items())
    fmt, cols = max(_FORMATS.items(), key=lambda item: len(present & set(item[1])))
    if present & set(cols):
        missing = [c for c in cols if c not in present]
        raise ValueError(
            f"{source} looks like the {fmt} format but lacks columns {missing}; "
            f"accepted headers: {accepted}"
        )
    raise ValueError(
        f"{source} has header {list(columns)}, no accepted format; accepted headers: {accepted}"
    )


def _version(text: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '3.0.6' or '3.1.0rc1'."""
    major, minor = (re.match(r"\d+", part) for part in text.split(".")[:2])
    return int(major.group()), int(minor.group())


def _numeric_column(df: pd.DataFrame, column: str, source: str) -> np.ndarray:
    import pandas as pd  # imported here, not at the top (see the top's note)
    values = pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        raise ValueError(
            f"{source}: column {column} has {bad.sum()} missing, non-numeric or infinite "
            f"values (first at data row {np.argmax(bad)}, 0-based after the header)"
        )
    return values


def _normalise(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """Checks a trace in any accepted format; returns the normalised columns."""
    import pandas as pd  # imported here, not at the top (see the top's note)
    fmt = _detect_format(df.columns, source)
    if len(df) == 0:
        raise ValueError(f"{source} has a header but no requests")
    if fmt == "Azure":
        try:
            stamps = pd.to_datetime(df["TIMESTAMP"], format="ISO8601")
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"{source}: column TIMESTAMP must hold datetime strings such as "
                f"'2023-11-16 18:17:03.97996' ({err})"
            ) from None
        if stamps.isna().any():
            raise ValueError(f"{source}: column TIMESTAMP has {stamps.isna().sum()} missing values")
        arrival = (stamps - stamps.iloc[0]).dt.total_seconds().to_numpy()
        arrival_col, prompt_col, output_col = _AZURE_COLUMNS
    else:
        arrival_col, prompt_col, output_col = (
            ("arrival_timestamp", "prompt_size", "token_size")
            if fmt == "SplitwiseSim"
            else _NORMALISED_COLUMNS
        )
        arrival = _numeric_column(df, arrival_col, source)
    if fmt == "SplitwiseSim":
        for column, accepted in (("request_type", _SPLITWISESIM_LLM_REQUEST), ("batch_size", 1)):
            values = _numeric_column(df, column, source)
            if np.any(values != accepted):
                raise ValueError(
                    f"{source}: column {column} must be {accepted} on every row "
                    f"(the only value modelled), found {sorted(set(values) - {accepted})[:5]}"
                )
    backwards = np.flatnonzero(np.diff(arrival) < 0)
    if backwards.size:
        raise ValueError(
            f"{source}: column {arrival_col} is not sorted (data row {backwards[0] + 1} "
            f"arrives before row {backwards[0]}); sort the trace by arrival time"
        )
    sizes = {}
    for column in (prompt_col, output_col):
        values = _numeric_column(df, column, source)
        if np.any(values < 1):
            raise ValueError(
                f"{source}: column {column} must be >= 1 token, found {values.min():g} "
                f"at data row {np.argmax(values < 1)}"
            )
        sizes[column] = values
    return pd.DataFrame(
        {
            "arrival_s": arrival.astype(np.float64),
            "prompt_tokens": sizes[prompt_col],
            "output_tokens": sizes[output_col],
        }
    )
