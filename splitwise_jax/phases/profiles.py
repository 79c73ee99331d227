"""The measured inference profiles of SplitwiseSim (``perf_model.csv``): load, check, summarise.

This is I/O at the outer edge of the package: everything downstream (the simulator's own
phase table in :mod:`splitwise_jax.phases.sim_table`, calibration) works on the validated
``pandas.DataFrame`` returned here, never on the raw file.

What the file holds (see ``shared/data/README.md``): one row per measured run, five
repeats per configuration ``(model, hardware, tensor_parallel, prompt_size, batch_size,
token_size)``; times in milliseconds; power as a fraction of TDP, measured on A100 only
(0 elsewhere, which means "not measured", not "no power").

Things worth knowing about the file that this module surfaces rather than hides:

- 1,260 rows but only 228 distinct configurations: the block ``prompt_size=512,
  batch_size=1, token_size=128`` appears three times, verbatim, in every
  (model, hardware, TP) series (12 configurations x 15 rows). The rows are kept (the
  reference simulator reads them all, and its medians depend on it); ``profile_medians``
  reports ``n_rows`` (15) and ``n_repeats`` (5 distinct runs) separately.
- ``h100-80gb-pcap`` rows are ``h100-80gb`` rows with ``prompt_time`` x 1.3 exactly and
  ``token_time`` / ``e2e_time`` unchanged: a derived power-cap model, not a measurement.
- ``llama2-70b`` TP2 at ``batch_size=64, prompt_size=512`` has a prompt time ~15x
  below its neighbours on all three hardware kinds; see :func:`flag_outliers`.

References:
    P. Patel et al., "Splitwise: Efficient generative LLM inference using phase
    splitting", ISCA 2024, Sec. III (characterisation) and Sec. V-A (the simulator).
"""

from __future__ import annotations

import math
from os import PathLike
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where used: pandas is 0.2 s of every command line's start
    import pandas as pd

from splitwise_jax._paths import profiles_csv

__all__ = [
    "CONFIG_KEYS",
    "SERIES_KEYS",
    "REQUIRED_COLUMNS",
    "load_profiles",
    "validate_profiles",
    "profile_medians",
    "flag_outliers",
]

#: One (model, hardware, parallelism) curve: the unit the simulator interpolates over.
SERIES_KEYS: tuple[str, ...] = ("model", "hardware", "tensor_parallel")
#: One measured configuration; its rows are repeats of the same run.
CONFIG_KEYS: tuple[str, ...] = SERIES_KEYS + ("prompt_size", "batch_size", "token_size")

_TEXT_COLUMNS = ("model", "hardware")
_SIZE_COLUMNS = ("prompt_size", "batch_size", "token_size", "tensor_parallel")
_TIME_COLUMNS = ("prompt_time", "token_time", "e2e_time")  # ms, must be > 0
_POWER_COLUMNS = ("peak_power", "average_power")  # fraction of TDP, 0 = not measured
REQUIRED_COLUMNS: tuple[str, ...] = (
    _TEXT_COLUMNS + _SIZE_COLUMNS + _POWER_COLUMNS + _TIME_COLUMNS
)
_MEASURED_COLUMNS = ("prompt_time", "token_time", "e2e_time", "peak_power", "average_power")


def _where(source: str | None) -> str:
    return f" in {source}" if source else ""


def _first_rows(mask: pd.Series, limit: int = 3) -> str:
    """'3 rows (first: data row 7, file line 9)' for an error message."""
    bad = np.flatnonzero(mask.to_numpy())
    first = int(bad[0])
    # +2: the header is line 1 and data rows are 0-based here.
    return f"{bad.size} row(s) (first: data row {first}, file line {first + 2})"


def validate_profiles(df: pd.DataFrame, *, source: str | None = None) -> pd.DataFrame:
    """Check a raw profile table and add the derived columns; returns a new DataFrame.

    Args:
        df: rows as in ``perf_model.csv`` (columns ``REQUIRED_COLUMNS``, any order;
            extra columns are kept).
        source: where the rows came from, used in error messages only.

    Returns:
        A copy with the required columns typed (sizes ``int64``, measurements
        ``float64``, names ``str``) and these columns added:

        - ``power_measured`` (bool): both power columns > 0. A 0 in the file means
          "not measured" (H100 rows, some large A100 batches).
        - ``peak_power_frac``, ``average_power_frac`` (float): the power columns with the
          unmeasured zeros replaced by NaN, so a mean or median never averages them in.
        - ``prompt_time_s``, ``token_time_s``, ``e2e_time_s`` (float): the times in s.
        - ``batch_tokens`` (int): ``prompt_size * batch_size``, the simulator's x axis.
        - ``config_id`` (int): 0..n-1 numbering the distinct ``CONFIG_KEYS`` tuples in
          sorted order; rows sharing it are repeats of one configuration.

    Raises:
        ValueError: a required column is missing; a numeric column holds non-numbers;
            any required value is NaN/empty; a size is not a positive integer; a time is
            not positive; a power is negative. The message names the column and the
            number of offending rows with the first one.
    """
    import pandas as pd  # imported here, not at the top (see the top's note)
    where = _where(source)
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(
            f"profile table{where} lacks required column(s) {missing}; "
            f"required: {list(REQUIRED_COLUMNS)}, found: {list(df.columns)}"
        )
    out = df.copy().reset_index(drop=True)

    for col in REQUIRED_COLUMNS:
        isna = out[col].isna()
        if col in _TEXT_COLUMNS:
            isna |= out[col].astype(str).str.strip().eq("")
        if isna.any():
            raise ValueError(f"column {col!r}{where} has missing (NaN/empty) values in {_first_rows(isna)}")

    for col in _SIZE_COLUMNS + _POWER_COLUMNS + _TIME_COLUMNS:
        if not pd.api.types.is_numeric_dtype(out[col]) or pd.api.types.is_bool_dtype(out[col]):
            coerced = pd.to_numeric(out[col], errors="coerce")
            bad = coerced.isna()
            if bad.any():
                first = out[col].to_numpy()[np.flatnonzero(bad.to_numpy())[0]]
                raise ValueError(
                    f"column {col!r}{where} must be numeric; non-numeric value {first!r} "
                    f"in {_first_rows(bad)}"
                )
            out[col] = coerced
        out[col] = out[col].astype("float64")
        # Parsed numbers can still be non-finite ("inf" is valid float text).
        nonfinite = ~np.isfinite(out[col])
        if nonfinite.any():
            raise ValueError(f"column {col!r}{where} has non-finite values in {_first_rows(nonfinite)}")

    for col in _SIZE_COLUMNS:
        bad = (out[col] <= 0) | (out[col] != np.round(out[col]))
        if bad.any():
            raise ValueError(f"column {col!r}{where} must hold positive integers; violated in {_first_rows(bad)}")
        out[col] = out[col].astype("int64")
    for col in _TIME_COLUMNS:
        bad = out[col] <= 0
        if bad.any():
            raise ValueError(f"column {col!r}{where} must be a positive time (ms); violated in {_first_rows(bad)}")
    for col in _POWER_COLUMNS:
        bad = out[col] < 0
        if bad.any():
            raise ValueError(
                f"column {col!r}{where} must be >= 0 (fraction of TDP, 0 = not measured); "
                f"violated in {_first_rows(bad)}"
            )
    for col in _TEXT_COLUMNS:
        out[col] = out[col].astype(str)

    out["power_measured"] = (out["peak_power"] > 0) & (out["average_power"] > 0)
    for col in _POWER_COLUMNS:
        out[f"{col}_frac"] = out[col].where(out["power_measured"], np.nan)
    for col in _TIME_COLUMNS:
        out[f"{col}_s"] = out[col] / 1000.0
    out["batch_tokens"] = out["prompt_size"] * out["batch_size"]
    out["config_id"] = out.groupby(list(CONFIG_KEYS), sort=True).ngroup().astype("int64")
    return out


def load_profiles(path: str | PathLike[str] | None = None) -> pd.DataFrame:
    """Read and validate ``perf_model.csv``.

    Args:
        path: the CSV file; default ``shared/data/splitwise_sim_profiles/perf_model.csv``
            (found by :func:`splitwise_jax._paths.profiles_csv`).

    Returns:
        One row per measured run (all 1,260 rows of the shipped file, duplicates kept),
        with the derived columns listed in :func:`validate_profiles`.

    Raises:
        ValueError: the file is malformed (see :func:`validate_profiles`).
        FileNotFoundError: no path given and the shared folder is absent.

    Example:
        >>> df = load_profiles()
        >>> df.groupby("config_id").ngroups
        228
    """
    import pandas as pd  # imported here, not at the top (see the top's note)
    path = profiles_csv() if path is None else path
    raw = pd.read_csv(path)
    return validate_profiles(raw, source=str(path))


def _spread(x: pd.Series) -> float:
    return float(x.max() / x.min() - 1.0)


def profile_medians(df: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration: medians of the repeats, repeat counts and spread.

    Args:
        df: as returned by :func:`load_profiles` (a raw table is validated first).

    Returns:
        DataFrame sorted by ``config_id`` with ``CONFIG_KEYS``, ``config_id``,
        ``batch_tokens``; the medians of ``prompt_time``, ``token_time``, ``e2e_time``
        (ms), ``prompt_time_s``, ``token_time_s``, ``peak_power_frac``,
        ``average_power_frac`` (NaN where power was not measured); ``n_rows`` (rows in
        the file, 15 for the triplicated block), ``n_repeats`` (distinct runs, i.e. rows
        after dropping verbatim duplicates); and ``{prompt,token,e2e}_time_spread`` =
        max/min - 1 over the repeats (0.01 = the slowest run was 1% slower than the
        fastest).

    Example:
        >>> med = profile_medians(load_profiles())
        >>> int(med["n_repeats"].min()), int(med["n_repeats"].max())
        (5, 5)
    """
    if "config_id" not in df.columns:
        df = validate_profiles(df)
    keys = list(CONFIG_KEYS)
    grouped = df.groupby(keys + ["config_id", "batch_tokens"], sort=True)
    med_cols = [
        "prompt_time", "token_time", "e2e_time", "prompt_time_s", "token_time_s",
        "peak_power_frac", "average_power_frac",
    ]
    out = grouped[med_cols].median()
    out["n_rows"] = grouped.size()
    out["n_repeats"] = df.drop_duplicates(subset=keys + list(_MEASURED_COLUMNS)).groupby(
        keys + ["config_id", "batch_tokens"], sort=True
    ).size()
    for col in _TIME_COLUMNS:
        out[f"{col}_spread"] = grouped[col].agg(_spread)
    out = out.reset_index().sort_values("config_id", ignore_index=True)
    out["n_repeats"] = out["n_repeats"].astype("int64")
    return out


# Outlier rule (flag_outliers). Within one (model, hardware, TP) series, the per-token
# prompt time and the token time change smoothly with batch tokens: over the whole file,
# two adjacent batch-token levels differ by at most 2.3x in prompt time per token (128 vs
# 256 tokens, where fixed overhead is amortised) and 1.5x in token time. The known
# artefact (llama2-70b TP2, batch 64 x prompt 512 = 32,768 tokens, all three hardware
# kinds) sits 13-17x below its neighbours: a prompt that cannot have run at that
# throughput, probably an out-of-memory or truncated run. A factor of 5 lies near the
# geometric middle of 2.3 and 13, so neither noise nor a milder artefact decides it.
# A configuration is flagged only if it is more than DEFAULT_OUTLIER_FACTOR away, in the
# same direction, from EVERY neighbouring level: one on each side, or the two nearest on
# its only side at the ends of the grid. Requiring all neighbours keeps one bad point
# from condemning its good neighbour (the 16,384-token level next to the artefact is not
# flagged, because its other neighbour agrees with it).
DEFAULT_OUTLIER_FACTOR = 5.0

_OUTLIER_METRICS = {
    "prompt_time_per_token_ms": "prompt time per token",
    "token_time": "token time",
}


def _neighbour_levels(i: int, n: int) -> list[int]:
    if i > 0 and i < n - 1:
        return [i - 1, i + 1]
    if i == 0:
        return [k for k in (1, 2) if k < n]
    return [k for k in (n - 2, n - 3) if k >= 0]


def flag_outliers(medians: pd.DataFrame, *, factor: float = DEFAULT_OUTLIER_FACTOR) -> pd.DataFrame:
    """Configurations whose prompt time per token or token time breaks from the curve.

    Rule (details and the choice of threshold in the comment above
    ``DEFAULT_OUTLIER_FACTOR``): within each (model, hardware, TP) series, take the
    median of each metric over the configurations at each batch-token level; flag a
    configuration whose value differs by more than ``factor`` from every neighbouring
    level's median, all in the same direction.

    Args:
        medians: as returned by :func:`profile_medians`.
        factor: the ratio (> 1) beyond which a value counts as far from a neighbour.

    Returns:
        One row per (configuration, metric) flagged, with ``CONFIG_KEYS``,
        ``config_id``, ``batch_tokens``, ``metric``, ``value`` (ms), ``neighbour_tokens``
        (tuple), ``neighbour_values`` (tuple, ms), ``ratio`` (value over the geometric
        mean of the neighbour values) and a readable ``reason``. Empty (same columns)
        when nothing is flagged.

    Example:
        >>> flags = flag_outliers(profile_medians(load_profiles()))
        >>> sorted(set(flags["batch_size"].tolist()))
        [64]
    """
    import pandas as pd  # imported here, not at the top (see the top's note)
    if not factor > 1.0:
        raise ValueError(f"factor must be > 1, got {factor!r}")
    med = medians.copy()
    med["prompt_time_per_token_ms"] = med["prompt_time"] / med["batch_tokens"]
    log_k = math.log(factor)
    rows = []
    for _, series in med.groupby(list(SERIES_KEYS), sort=True):
        for metric, label in _OUTLIER_METRICS.items():
            levels = series.groupby("batch_tokens")[metric].median().sort_index()
            xs, ys = levels.index.to_numpy(), levels.to_numpy()
            for _, cfg in series.iterrows():
                i = int(np.searchsorted(xs, cfg["batch_tokens"]))
                nbrs = _neighbour_levels(i, xs.size)
                if not nbrs:
                    continue
                logs = np.log(cfg[metric] / ys[nbrs])
                if not (np.all(np.abs(logs) > log_k) and (np.all(logs > 0) or np.all(logs < 0))):
                    continue
                ratio = float(np.exp(logs.mean()))
                direction = "below" if ratio < 1 else "above"
                times = 1 / ratio if ratio < 1 else ratio
                rows.append(
                    {
                        **{k: cfg[k] for k in CONFIG_KEYS},
                        "config_id": int(cfg["config_id"]),
                        "batch_tokens": int(cfg["batch_tokens"]),
                        "metric": metric,
                        "value": float(cfg[metric]),
                        "neighbour_tokens": tuple(int(xs[k]) for k in nbrs),
                        "neighbour_values": tuple(float(ys[k]) for k in nbrs),
                        "ratio": ratio,
                        "reason": (
                            f"{label} {cfg[metric]:.4g} ms is {times:.1f}x {direction} its neighbours "
                            f"at batch tokens {', '.join(str(int(xs[k])) for k in nbrs)} "
                            f"({', '.join(f'{ys[k]:.4g}' for k in nbrs)} ms; threshold {factor:g}x)"
                        ),
                    }
                )
    columns = list(CONFIG_KEYS) + [
        "config_id", "batch_tokens", "metric", "value", "neighbour_tokens",
        "neighbour_values", "ratio", "reason",
    ]
    return pd.DataFrame(rows, columns=columns)
