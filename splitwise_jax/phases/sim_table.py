"""SplitwiseSim's own phase timing (its ``db`` performance model) as a JAX function.

The reference simulator does not model phases: it looks them up. For each
(model, hardware, tensor_parallel) it takes the profile rows of ``perf_model.csv``,
groups them by ``batch_tokens = prompt_size * batch_size``, takes the median of each
group, and linearly interpolates (and extrapolates) the medians in batch tokens, once
for the prompt time and once for the token time. An iteration is then timed as

- prompt-only batch:  prompt curve at the sum of its prompt sizes;
- token-only batch:   token curve at its number of tokens (one per request, i.e. the
  batch size);
- mixed batch:        1.1 x the prompt curve at (sum of prompt sizes + one per token
  request).

What was read to pin this down: ``performance_model.py`` of github
Mutinifni/splitwise-sim (``DatabasePerformanceModel.init_predictor`` and
``get_iteration_duration``). Details that matter for reproducing it:

1. Median over which rows: every row of the (model, hardware, TP) series with that
   batch-token count, whatever its ``prompt_size``/``batch_size`` split and whatever its
   ``token_size`` (the 128-token-output rows and the 256..8192 ones are pooled), with the
   file's triplicated ``512 x 1 x 128`` block counted three times. So the knot at 2,048
   tokens for bloom-176b / a100 / TP8 is the median of the five ``2048 x 1`` and five
   ``512 x 4`` rows (536.06 ms), not of ``2048 x 1`` alone (540.41 ms).
2. Interpolator: ``scipy.interpolate.interp1d(x, y, fill_value="extrapolate")``, i.e.
   linear, and beyond either end the first or last segment's line continued.
3. The token curve's knots are at prompt_size x batch_size (128 .. 32,768) but it is
   evaluated at the batch size (1 .. 512 requests): token-only batches under 128
   requests are extrapolated below the first knot.
4. Mixed batches: the factor 1.1 multiplies the *time* (``iteration_time *= 1.1``
   after evaluating the prompt curve at the batch's tokens); the tokens are not scaled.
   ``mixed_time_s`` follows the simulator, not the reading "curve at 1.1 x tokens".
5. The simulator asserts ``iteration_time > 0``; it has no clipping. Here results pass
   through a smooth, strictly positive floor (see ``_smooth_positive``, temperature
   ``POSITIVE_TEMPERATURE_S`` = 1 ms) that equals the linear value to machine
   precision wherever it is above ~40 ms (every knot in the file is above 28 ms, where
   the change is < 1e-15 s) and only bends near or below zero, i.e. where the simulator
   would have crashed (e.g. the llama2-70b TP2 prompt curve beyond ~35k tokens, whose
   last knot is a measurement artefact).

The knots are traced pytree leaves, so ``jax.grad`` with respect to the table itself
works (calibrating a table, sensitivity of a cluster metric to one measured point).

References:
    P. Patel et al., "Splitwise", ISCA 2024, Sec. V-A (simulator, "performance model
    ... interpolates between profiled points"); SplitwiseSim ``performance_model.py``.
"""

from __future__ import annotations

import dataclasses
from os import PathLike
from types import ModuleType
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:  # imported where used: pandas is 0.2 s of every command line's start
    import pandas as pd

from .profiles import SERIES_KEYS, load_profiles, validate_profiles

__all__ = [
    "MIXED_BATCH_FACTOR",
    "POSITIVE_TEMPERATURE_S",
    "SimTable",
    "prompt_time_s",
    "token_time_s",
    "mixed_time_s",
    "iteration_time_s",
    "interp_baseline_predict",
]

#: SplitwiseSim multiplies the prompt-curve time of a mixed prompt+token batch by this.
MIXED_BATCH_FACTOR = 1.1
#: Temperature of the smooth positive floor, in seconds (see ``_smooth_positive``).
POSITIVE_TEMPERATURE_S = 1e-3


@dataclasses.dataclass(frozen=True, eq=False)
class SimTable:
    """The simulator's two piecewise-linear curves for one (model, hardware, TP).

    Attributes:
        prompt_x: batch tokens at the prompt-curve knots, strictly increasing, shape (n,).
        prompt_s: median prompt (iteration) time at each knot, seconds, shape (n,).
        token_x: batch tokens at the token-curve knots, strictly increasing, shape (m,).
        token_s: median token (iteration) time at each knot, seconds, shape (m,).

    All four are pytree leaves (traced, differentiable). Tables with equal knot counts
    stack with ``jax.tree.map(lambda *a: jnp.stack(a), t1, t2)`` for ``jax.vmap``.
    Build one with :meth:`from_profiles`; constructing directly is fine for tests and
    calibration, but the x arrays must be strictly increasing with n, m >= 2 (not
    checked here, so that JAX can rebuild the class from tracers).
    """

    prompt_x: jax.Array
    prompt_s: jax.Array
    token_x: jax.Array
    token_s: jax.Array

    @classmethod
    def from_profiles(
        cls,
        df_or_path: pd.DataFrame | str | PathLike[str] | None,
        model: str,
        hardware: str,
        tensor_parallel: int = 8,
    ) -> "SimTable":
        """The simulator's table for one (model, hardware, TP) from the profile rows.

        Args:
            df_or_path: the profile rows (as from :func:`~splitwise_jax.phases.profiles.load_profiles`,
                or a raw table, which is validated), or a CSV path, or None for the
                shared ``perf_model.csv``.
            model: e.g. ``"bloom-176b"``, ``"llama2-70b"``.
            hardware: e.g. ``"a100-80gb"``, ``"h100-80gb"``, ``"h100-80gb-pcap"``.
            tensor_parallel: GPUs per instance (SplitwiseSim's runs use 8).

        Returns:
            The table with knots at every distinct batch-token count of that series.

        Raises:
            ValueError: unknown model, hardware or TP for that pair (the message lists
                the values the file holds), or fewer than two distinct batch-token counts.

        Example:
            >>> t = SimTable.from_profiles(None, "bloom-176b", "a100-80gb")
            >>> float(prompt_time_s(t, 2048.0))  # doctest: +ELLIPSIS
            0.536...
        """
        import pandas as pd  # imported here, not at the top (see the top's note)
        if isinstance(df_or_path, pd.DataFrame):
            df = df_or_path if "batch_tokens" in df_or_path.columns else validate_profiles(df_or_path)
        else:
            df = load_profiles(df_or_path)
        x, prompt_ms, token_ms = _knots_ms(df, model, hardware, tensor_parallel)
        return cls(
            prompt_x=jnp.asarray(x),
            prompt_s=jnp.asarray(prompt_ms / 1000.0),
            token_x=jnp.asarray(x),
            token_s=jnp.asarray(token_ms / 1000.0),
        )


jax.tree_util.register_dataclass(
    SimTable, data_fields=["prompt_x", "prompt_s", "token_x", "token_s"], meta_fields=[]
)


def _select_series(df: pd.DataFrame, model: str, hardware: str, tensor_parallel: int) -> pd.DataFrame:
    """Rows of one series; ValueError naming the accepted values when there are none."""
    models = sorted(df["model"].unique())
    if model not in models:
        raise ValueError(f"unknown model {model!r}; the profiles hold {models}")
    by_model = df[df["model"] == model]
    hardwares = sorted(by_model["hardware"].unique())
    if hardware not in hardwares:
        raise ValueError(f"unknown hardware {hardware!r} for model {model!r}; the profiles hold {hardwares}")
    pair = by_model[by_model["hardware"] == hardware]
    tps = sorted(int(t) for t in pair["tensor_parallel"].unique())
    if tensor_parallel not in tps:
        raise ValueError(
            f"tensor_parallel={tensor_parallel!r} not profiled for {model!r} on {hardware!r}; "
            f"the profiles hold {tps}"
        )
    return pair[pair["tensor_parallel"] == tensor_parallel]


def _knots_ms(
    df: pd.DataFrame, model: str, hardware: str, tensor_parallel: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(batch tokens, median prompt ms, median token ms) as SplitwiseSim builds them.

    All rows of the series count, duplicates and every token_size included, because
    that is what the simulator's ``groupby("batch_tokens").median()`` sees.
    """
    rows = _select_series(df, model, hardware, tensor_parallel)
    batch_tokens = rows["batch_tokens"] if "batch_tokens" in rows else rows["prompt_size"] * rows["batch_size"]
    med = rows.assign(batch_tokens=batch_tokens).groupby("batch_tokens", sort=True)[
        ["prompt_time", "token_time"]
    ].median()
    if len(med) < 2:
        raise ValueError(
            f"{model!r} / {hardware!r} / TP{tensor_parallel} has {len(med)} distinct batch-token "
            "count(s); interpolation needs at least 2"
        )
    return (
        med.index.to_numpy(dtype=np.float64),
        med["prompt_time"].to_numpy(dtype=np.float64),
        med["token_time"].to_numpy(dtype=np.float64),
    )


def _interp_extrap(x, xp, fp, xnp: ModuleType = jnp):
    """Piecewise-linear interpolation through (xp, fp), continued linearly past both ends.

    ``xnp`` is ``jax.numpy`` (traced, differentiable) or ``numpy`` (the baseline), so
    both use literally the same rule. The segment is the one whose left knot is the
    last knot <= x, clipped to the first and last segment for extrapolation; at an
    interior knot the derivative in x is therefore the right-hand slope, at the last
    knot the left-hand one: finite everywhere. The ``(1 - t) * f0 + t * f1`` form
    returns the knot values exactly at t = 0 and t = 1.
    """
    n = xp.shape[-1]
    idx = xnp.clip(xnp.searchsorted(xp, x, side="right") - 1, 0, n - 2)
    x0, x1 = xp[idx], xp[idx + 1]
    f0, f1 = fp[idx], fp[idx + 1]
    t = (x - x0) / (x1 - x0)
    return (1 - t) * f0 + t * f1


def _smooth_positive(y, temperature, xnp: ModuleType = jnp):
    """A smooth, strictly positive stand-in for ``max(y, 0)`` with temperature ``T``.

    Above zero: ``y + T * softplus(-y / T)`` (= ``T * softplus(y / T)``), exact to machine
    precision for y > ~40 T, so the linear curve is untouched where it is meaningful.
    At and below zero: ``a / (1 - b * y)`` with ``a = T ln 2`` and ``b = 1 / (2 a)``, which
    matches the softplus branch's value and slope at 0 (C1) and decays like
    ``2 a**2 / |y|``: strictly positive for any finite y (softplus itself underflows to 0
    once y < ~-745 T, and a zero time would turn throughputs into inf), with a nonzero
    gradient so an optimiser pushed into the extrapolated region still sees a slope.
    Trade: off by at most ``T ln 2`` at y = 0, and the curvature jumps at 0.
    Each branch is evaluated on a masked input (jax-md ``safe_mask`` style): the
    reciprocal would divide by zero at y = 1 / b > 0, and the untaken branch's gradient
    would otherwise still flow.
    """
    a = temperature * np.log(2.0)
    b = 1.0 / (2.0 * a)
    above = y > 0
    y_pos = xnp.where(above, y, 1.0)
    y_neg = xnp.where(above, 0.0, y)
    pos = y_pos + temperature * xnp.logaddexp(0.0, -y_pos / temperature)
    neg = a / (1.0 - b * y_neg)
    return xnp.where(above, pos, neg)


def _as_float(table_array: jax.Array, x) -> jax.Array:
    return jnp.asarray(x, dtype=jnp.result_type(table_array))


def prompt_time_s(
    table: SimTable, batch_tokens, *, temperature_s: float = POSITIVE_TEMPERATURE_S
) -> jax.Array:
    """Time of a prompt-only iteration: the prompt curve at its total prompt tokens.

    Args:
        table: the simulator's curves for one (model, hardware, TP).
        batch_tokens: sum of the prompt sizes in the batch (tokens); any shape.
        temperature_s: temperature of the smooth positive floor (s).

    Returns:
        Seconds, shape of ``batch_tokens``.

    Example:
        >>> t = SimTable(*(jnp.array(v) for v in ([1.0, 2.0], [1.0, 3.0], [1.0, 2.0], [1.0, 1.0])))
        >>> prompt_time_s(t, jnp.array([1.5, 3.0])).tolist()
        [2.0, 5.0]
    """
    x = _as_float(table.prompt_s, batch_tokens)
    return _smooth_positive(_interp_extrap(x, table.prompt_x, table.prompt_s), temperature_s)


def token_time_s(
    table: SimTable, batch_size, *, temperature_s: float = POSITIVE_TEMPERATURE_S
) -> jax.Array:
    """Time of a token-only iteration: the token curve at its number of tokens.

    Each request in a token phase contributes one token, so the argument is the batch
    size. As in SplitwiseSim, the curve's x axis is the profiled batch tokens
    (prompt_size x batch_size >= 128), so batches under 128 requests are extrapolated
    below the first knot.

    Args:
        table: the simulator's curves for one (model, hardware, TP).
        batch_size: requests decoding in this iteration; any shape.
        temperature_s: temperature of the smooth positive floor (s).

    Returns:
        Seconds per iteration (one output token per request), shape of ``batch_size``.
    """
    x = _as_float(table.token_s, batch_size)
    return _smooth_positive(_interp_extrap(x, table.token_x, table.token_s), temperature_s)


def mixed_time_s(
    table: SimTable, prompt_tokens, decode_tokens, *, temperature_s: float = POSITIVE_TEMPERATURE_S
) -> jax.Array:
    """Time of a mixed iteration: 1.1 x the prompt curve at its total tokens.

    SplitwiseSim counts each prompt task's prompt size plus one token per decoding
    request, evaluates the prompt curve there and multiplies the *time* by 1.1
    (``MIXED_BATCH_FACTOR``); the token count is not scaled.

    Args:
        table: the simulator's curves for one (model, hardware, TP).
        prompt_tokens: sum of the prompt sizes of the prompt tasks in the batch.
        decode_tokens: number of decoding requests in the batch (one token each).
        temperature_s: temperature of the smooth positive floor (s).

    Returns:
        Seconds, the broadcast shape of the two counts.
    """
    total = _as_float(table.prompt_s, prompt_tokens) + _as_float(table.prompt_s, decode_tokens)
    return MIXED_BATCH_FACTOR * prompt_time_s(table, total, temperature_s=temperature_s)


def iteration_time_s(
    table: SimTable, prompt_tokens, decode_tokens, *, temperature_s: float = POSITIVE_TEMPERATURE_S
) -> jax.Array:
    """Any iteration, dispatched as SplitwiseSim does on what the batch holds.

    Prompt-only when ``decode_tokens == 0``, token-only when ``prompt_tokens == 0``,
    mixed otherwise. The switch is a discontinuity of the simulator (a batch gaining its
    first decoding request jumps from the prompt curve to 1.1 x it); gradients with
    respect to the counts are those of the branch taken. All three branches are finite
    everywhere, so the plain ``where`` is safe for gradients.

    Args:
        table: the simulator's curves for one (model, hardware, TP).
        prompt_tokens: sum of the prompt sizes of the prompt tasks in the batch.
        decode_tokens: number of decoding requests in the batch.
        temperature_s: temperature of the smooth positive floor (s).

    Returns:
        Seconds, the broadcast shape of the two counts.
    """
    p = _as_float(table.prompt_s, prompt_tokens)
    d = _as_float(table.prompt_s, decode_tokens)
    kw = dict(temperature_s=temperature_s)
    return jnp.where(
        d == 0,
        prompt_time_s(table, p, **kw),
        jnp.where(p == 0, token_time_s(table, d, **kw), mixed_time_s(table, p, d, **kw)),
    )


def interp_baseline_predict(train_df: pd.DataFrame, query_df: pd.DataFrame) -> pd.DataFrame:
    """Baseline for calibration tables: SplitwiseSim's interpolation fitted on train rows.

    For each (model, hardware, TP) of the query, the knots are the medians of the
    training rows grouped by batch tokens (exactly as :meth:`SimTable.from_profiles`
    builds them, so with all training rows this is the simulator's own table); each
    query row is predicted at its ``prompt_size * batch_size`` with the same
    interpolation, extrapolation and positive floor as the JAX functions, in numpy.
    Both curves are evaluated at the query's batch tokens, as the profile rows are
    indexed (not at the batch size, which is how the simulator *uses* the token curve).

    Args:
        train_df: profile rows (``model``, ``hardware``, ``tensor_parallel``,
            ``prompt_size``, ``batch_size``, ``prompt_time``, ``token_time`` in ms).
        query_df: rows to predict (same key columns; times not needed).

    Returns:
        DataFrame indexed like ``query_df`` with ``prompt_time`` and ``token_time``
        predictions in ms.

    Raises:
        ValueError: a required column is missing, or a query series has fewer than two
            distinct batch-token counts in the training rows (the message names it).
    """
    import pandas as pd  # imported here, not at the top (see the top's note)
    keys = list(SERIES_KEYS)
    need_train = keys + ["prompt_size", "batch_size", "prompt_time", "token_time"]
    need_query = keys + ["prompt_size", "batch_size"]
    for name, frame, need in (("train_df", train_df, need_train), ("query_df", query_df, need_query)):
        missing = [c for c in need if c not in frame.columns]
        if missing:
            raise ValueError(f"{name} lacks column(s) {missing}; needs {need}")
    train = train_df.assign(batch_tokens=train_df["prompt_size"] * train_df["batch_size"])
    out = pd.DataFrame(index=query_df.index, columns=["prompt_time", "token_time"], dtype=np.float64)
    temperature_ms = POSITIVE_TEMPERATURE_S * 1000.0
    for (model, hardware, tp), q in query_df.groupby(keys, sort=False):
        try:
            xp, prompt_ms, token_ms = _knots_ms(train, model, hardware, int(tp))
        except ValueError as err:
            raise ValueError(f"interp baseline cannot predict query rows: {err}") from None
        x = (q["prompt_size"] * q["batch_size"]).to_numpy(dtype=np.float64)
        for col, fp in (("prompt_time", prompt_ms), ("token_time", token_ms)):
            y = _interp_extrap(x, xp, fp, xnp=np)
            out.loc[q.index, col] = _smooth_positive(y, temperature_ms, xnp=np)
    return out
