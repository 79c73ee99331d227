"""Request traces on disk: reading a trace CSV into normalised columns (NumPy and pandas,
no JAX, so that a warm `python -m splitwise_jax.simulate` reads its trace without it).

`load_trace` is re-exported by `cluster.workload`, whose `workload()` turns a trace into
the model's `Workload`; `simulate.trace.from_csv` turns it into the simulator's requests.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["load_trace", "read_trace_columns"]

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
    return pd.DataFrame(read_trace_columns(path))


def read_trace_columns(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """`load_trace`'s columns as NumPy arrays (float64): the same checks, values and
    errors, without pandas for a plain numeric file (`_numeric_table`)."""
    source = f"trace {path}"
    table = _numeric_table(path)
    if table is not None:
        names, values = table
        index = {name: i for i, name in enumerate(names)}
        fmt = _detect_format(names, source)
        if fmt != "Azure":  # Azure's timestamps are text: pandas reads them
            return _normalise(fmt, len(values), lambda column: values[:, index[column]], None, source)
    return _read_with_pandas(path, source)


def _numeric_table(path) -> tuple[list[str], np.ndarray] | None:
    """(header names, (rows, columns) float64 values) of a CSV whose every field is a
    plain finite number, read with NumPy; None for anything else (quoted or repeated
    header names, a byte-order mark, text, empty or non-finite fields, ragged rows),
    which pandas then reads and, where it is bad input, reports.

    NumPy's text reader parses each field with CPython's correctly rounded
    string-to-double conversion, as pandas' round-trip parser does: the values are the
    same to the last bit (tests/test_trace_file.py compares them on every shared trace
    and on 200,000 random doubles); without pandas' import (~0.2 s), a warm
    `python -m splitwise_jax.simulate` is that much quicker (docs/speed.md §11).
    """
    try:
        with open(path, encoding="utf-8", newline="") as f:
            header = f.readline().rstrip("\r\n")
            names = header.split(",")
            if (not header or len(set(names)) != len(names)
                    or any(not _PLAIN_NAME.fullmatch(name) for name in names)):
                return None
            with warnings.catch_warnings():  # "input contained no data": pandas reports it
                warnings.simplefilter("ignore")
                values = np.loadtxt(f, delimiter=",", dtype=np.float64, comments=None, ndmin=2, quotechar=None)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if values.shape[0] == 0 or values.shape[1] != len(names) or not np.all(np.isfinite(values)):
        return None
    return names, values


_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _read_with_pandas(path, source: str) -> dict[str, np.ndarray]:
    import pandas as pd  # imported here, not at the top (see the top's note)
    try:
        # A replay reproduces the file's timestamps to the last bit. The default float
        # parser of pandas before 3.1 can differ from them in the 16th digit (pandas 2.3
        # and 3.0: 356 of 2,000 values; CI, 2026-12-03), so those versions are asked for
        # round-trip parsing (0 of 2,000); pandas 3.1 parses exactly by default and
        # deprecates the argument.
        exact = {"float_precision": "round_trip"} if _version(pd.__version__) < (3, 1) else {}
        df = pd.read_csv(path, **exact)
    except pd.errors.EmptyDataError:
        raise ValueError(f"trace {path} is empty; expected a CSV with a header") from None
    return _normalise_frame(df, source)


def _normalise_frame(df: pd.DataFrame, source: str) -> dict[str, np.ndarray]:
    """Checks a trace read by pandas (any accepted format); returns the normalised columns."""
    import pandas as pd  # imported here, not at the top (see the top's note)
    fmt = _detect_format(df.columns, source)

    def column(name):
        return pd.to_numeric(df[name], errors="coerce").to_numpy(dtype=np.float64)

    def stamps():
        try:
            got = pd.to_datetime(df["TIMESTAMP"], format="ISO8601")
        except (ValueError, TypeError) as err:
            raise ValueError(
                f"{source}: column TIMESTAMP must hold datetime strings such as "
                f"'2023-11-16 18:17:03.97996' ({err})"
            ) from None
        if got.isna().any():
            raise ValueError(f"{source}: column TIMESTAMP has {got.isna().sum()} missing values")
        return (got - got.iloc[0]).dt.total_seconds().to_numpy()

    return _normalise(fmt, len(df), column, stamps, source)


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


def _numeric_column(column_of, column: str, source: str) -> np.ndarray:
    values = column_of(column)
    bad = ~np.isfinite(values)
    if bad.any():
        raise ValueError(
            f"{source}: column {column} has {bad.sum()} missing, non-numeric or infinite "
            f"values (first at data row {np.argmax(bad)}, 0-based after the header)"
        )
    return values


def _normalise(fmt: str, n_rows: int, column_of, azure_arrivals, source: str) -> dict[str, np.ndarray]:
    """Checks a trace in any accepted format (`fmt`, its columns read by `column_of`
    as float64, NaN where not a number; an Azure trace's arrivals by `azure_arrivals`);
    returns the normalised columns."""
    if n_rows == 0:
        raise ValueError(f"{source} has a header but no requests")
    if fmt == "Azure":
        arrival = azure_arrivals()
        arrival_col, prompt_col, output_col = _AZURE_COLUMNS
    else:
        arrival_col, prompt_col, output_col = (
            ("arrival_timestamp", "prompt_size", "token_size")
            if fmt == "SplitwiseSim"
            else _NORMALISED_COLUMNS
        )
        arrival = _numeric_column(column_of, arrival_col, source)
    if fmt == "SplitwiseSim":
        for column, accepted in (("request_type", _SPLITWISESIM_LLM_REQUEST), ("batch_size", 1)):
            values = _numeric_column(column_of, column, source)
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
        values = _numeric_column(column_of, column, source)
        if np.any(values < 1):
            raise ValueError(
                f"{source}: column {column} must be >= 1 token, found {values.min():g} "
                f"at data row {np.argmax(values < 1)}"
            )
        sizes[column] = values
    return {
        "arrival_s": np.array(arrival, dtype=np.float64),
        "prompt_tokens": np.array(sizes[prompt_col], dtype=np.float64),
        "output_tokens": np.array(sizes[output_col], dtype=np.float64),
    }
