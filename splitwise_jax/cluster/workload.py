"""Workloads: the joint distribution of request sizes and the arrival process.

A `Workload` is a compact, discrete stand-in for a request trace: K representative
prompt sizes x M representative output sizes with a joint probability table, plus a
renewal arrival process described by its rate and the squared coefficient of variation
of inter-arrival times (Kingman's c_a^2). The cluster model treats each (prompt, output)
cell as a request class and computes latency percentiles as percentiles of the mixture
over classes, so the support points are placed to reproduce the trace's size percentiles.

Built-in presets (`workload("coding")`, `workload("conversation")`) are derived from the
Azure 2023 LLM inference traces and ship as compact JSON in
``splitwise_jax/data/workloads`` (regenerate with ``calibration/build_workloads.py``).
User traces in SplitwiseSim or Azure CSV format are read with `load_trace`.

References:
    Patel et al., "Splitwise: Efficient Generative LLM Inference Using Phase
    Splitting", ISCA 2024: insight I (the coding and conversation traces).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

if TYPE_CHECKING:  # imported where used: pandas is 0.2 s of every command line's start
    import pandas as pd

from splitwise_jax._paths import PACKAGE_DATA
from splitwise_jax.cluster.trace_file import _AZURE_COLUMNS, _SPLITWISESIM_COLUMNS, _normalise_frame, load_trace  # noqa: F401

PRESET_RATE_PER_S = 70.0
"""Default arrival rate of the presets, req/s: the load of the paper's Fig. 12."""

DEFAULT_BINS = 32
"""Default number of support points per marginal (before merging tied bins)."""

_PRESET_DIR = PACKAGE_DATA / "workloads"
_PRESET_ALIASES = {
    "coding": "coding",
    "code": "coding",
    "conversation": "conversation",
    "conv": "conversation",
}
_ARRIVALS = ("poisson", "trace")

# Quantile levels placed at the centre (in probability) of their bin. The step quantile
# of the compact distribution at q is the mean of the bin holding q; when q sits at the
# bin's probability centre the first-order error (the slope of the quantile function
# times the offset) cancels, whereas a q on a bin edge would be biased by half a bin.
_CENTRED_QUANTILES = (0.5, 0.9, 0.99)
# Bin density in probability is proportional to 1 / (1 + a - p): flat in the body and
# rising like 1 / (1 - p) in the tail, capped at (1 + a) / a ~ 34x the body density so
# that the narrowest bins (~0.3% of requests) still hold ~25 of the 8,819 coding
# requests. a = 0.03 keeps the presets' P50/P90/P99 within ~1% of the traces at 32 bins.
_TAIL_OFFSET = 0.03
# Probability of the last bin's nominal centre; the last bin runs up to the maximum.
_TOP_CENTRE = 0.999
# A bin per centred quantile, one between consecutive ones and one at each end.
_MIN_BINS = 2 * len(_CENTRED_QUANTILES) + 1

def _as_float_array(x) -> jax.Array:
    return jnp.asarray(x, dtype=float)


# A trace's arrival curve is cut into windows of at least this many arrivals on average
# and at most _MAX_WINDOWS windows: 30 windows of 20 s for the 600 s Azure code replay,
# where the rate swings from 0 to 3x its mean between windows (counts' index of
# dispersion ~130 at 10 s) and arrivals still come in bursts inside a window.
_MAX_WINDOWS = 30
_MIN_ARRIVALS_PER_WINDOW = 50
# Time scales (s) at which each window's index of dispersion of counts is measured: one
# per half decade from 10 ms to 10 s, spanning the prompt service times a queue reads it
# at (`queueing.Burstiness`). A scale needs at least this many bins inside a window.
IDC_SCALES_S = np.geomspace(0.01, 10.0, 7)
_MIN_IDC_BINS = 4
# Each window is cut again into sub-bins of about this many arrivals on average (at
# most _MAX_SUB_BINS) for the fluid backlog that carries queues across a burst
# (`cluster._windowed_components`): the code replay's 20 s windows get 14 sub-bins of
# ~1.4 s, the scale at which its prompt queue fills and drains (a fluid over its own
# arrivals reproduces the reference's queue waits at 1-2 s bins and under-reads them
# by half at 10 s, docs/cluster.md §3c). Fewer arrivals per bin
# would let Poisson noise, which the in-window wait law already counts, build backlog.
_ARRIVALS_PER_SUB_BIN = 20
_MAX_SUB_BINS = 20


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ArrivalProfile:
    """A trace's own arrival curve: W windows of equal length.

    Attributes:
        rate_rel: (W,) each window's arrival rate over the trace's mean rate.
        cv2: (W,) squared coefficient of variation of inter-arrival times inside each
            window (1 for Poisson; reported, not used by the model: long quiet gaps
            inflate it as much as bursts do).
        window_s: length of a window (s).
        idc: (W, L) each window's index of dispersion of counts, Var N(tau) / E N(tau)
            over bins of length tau = idc_scale_s (1 for Poisson; the burstiness the
            queues read at their own service time, `queueing.Burstiness`).
        idc_scale_s: (L,) the scales tau (s); they shrink with the windows when a rate
            rescales the trace's time.
        sub_rel: (W, S) each window cut into S equal sub-bins: each sub-bin's arrival
            rate over its window's (mean 1 across a window with arrivals).
    """

    rate_rel: jax.Array
    cv2: jax.Array
    window_s: jax.Array
    idc: jax.Array
    idc_scale_s: jax.Array
    sub_rel: jax.Array

    @classmethod
    def from_arrivals(cls, arrival_s: np.ndarray, n_windows: int | None = None,
                      n_sub_bins: int | None = None) -> "ArrivalProfile":
        """Cuts the arrival times [first, last] into windows (see `_MAX_WINDOWS`) and
        each window into sub-bins (see `_ARRIVALS_PER_SUB_BIN`)."""
        t = np.sort(np.asarray(arrival_s, float))
        span = float(t[-1] - t[0])
        if n_windows is None:
            n_windows = int(np.clip(len(t) // _MIN_ARRIVALS_PER_WINDOW, 1, _MAX_WINDOWS))
        span = max(span, 1e-9)
        edges = t[0] + span * np.arange(n_windows + 1) / n_windows
        idx = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, n_windows - 1)
        counts = np.bincount(idx, minlength=n_windows).astype(float)
        cv2 = np.ones(n_windows)
        for w in range(n_windows):
            ia = np.diff(t[idx == w])
            if len(ia) >= 3 and ia.mean() > 0:
                cv2[w] = float(ia.var() / ia.mean() ** 2)
        rate_rel = counts / counts.mean()
        window_s = span / n_windows
        idc = np.ones((n_windows, len(IDC_SCALES_S)))
        for w in range(n_windows):
            for j, tau in enumerate(IDC_SCALES_S):
                bins = int(window_s // tau)
                if bins < _MIN_IDC_BINS or counts[w] < 2:
                    continue  # too coarse a scale for this window, or nothing in it: Poisson's 1
                n, _ = np.histogram(t[idx == w], bins=bins, range=(edges[w], edges[w] + bins * tau))
                idc[w, j] = float(n.var() / n.mean()) if n.mean() > 0 else 1.0
        if n_sub_bins is None:
            n_sub_bins = int(np.clip(counts.mean() // _ARRIVALS_PER_SUB_BIN, 1, _MAX_SUB_BINS))
        within = np.clip(((t - edges[idx]) / window_s * n_sub_bins).astype(int), 0, n_sub_bins - 1)
        sub = np.bincount(idx * n_sub_bins + within, minlength=n_windows * n_sub_bins)
        sub = sub.reshape(n_windows, n_sub_bins).astype(float)
        sub_rel = np.where(counts[:, None] > 0, sub * n_sub_bins / np.maximum(counts[:, None], 1.0), 1.0)
        return cls(rate_rel=_as_float_array(rate_rel), cv2=_as_float_array(cv2),
                   window_s=_as_float_array(window_s), idc=_as_float_array(idc),
                   idc_scale_s=_as_float_array(IDC_SCALES_S), sub_rel=_as_float_array(sub_rel))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Workload:
    """Request-size distribution and arrival process of an inference service.

    Build one with `Workload.from_samples`, `Workload.from_trace` or `workload`; they
    validate their inputs. The raw constructor does no checks, so that JAX can rebuild
    the pytree from traced leaves.

    Attributes:
        prompt_tokens: (K,) prompt sizes of the request classes, tokens, increasing.
        output_tokens: (M,) output sizes of the request classes, tokens (>= 1; the
            first is produced by the prompt phase), increasing.
        weights: (K, M) joint probability of the classes; sums to 1.
        rate_per_s: scalar mean arrival rate, requests/s.
        arrival_cv2: scalar squared coefficient of variation of inter-arrival times
            (1 for Poisson arrivals, 0 for deterministic ones).
        name: label, static.
        profile: the trace's own arrival curve (`ArrivalProfile`), or None for a
            stationary process; when present `evaluate` runs the model window by
            window over it and ignores its horizon argument.

    Example:
        >>> wl = workload("coding").with_rate(50.0)
        >>> float(wl.mean_prompt_tokens)  # doctest: +SKIP
        2047.8...
    """

    prompt_tokens: jax.Array
    output_tokens: jax.Array
    weights: jax.Array
    rate_per_s: jax.Array
    arrival_cv2: jax.Array
    name: str = dataclasses.field(metadata=dict(static=True))
    profile: ArrivalProfile | None = None

    @property
    def prompt_weights(self) -> jax.Array:
        """(K,) marginal probability of each prompt size."""
        return jnp.sum(self.weights, axis=1)

    @property
    def output_weights(self) -> jax.Array:
        """(M,) marginal probability of each output size."""
        return jnp.sum(self.weights, axis=0)

    @property
    def mean_prompt_tokens(self) -> jax.Array:
        """Mean prompt size, tokens."""
        return jnp.dot(self.prompt_weights, self.prompt_tokens)

    @property
    def mean_output_tokens(self) -> jax.Array:
        """Mean output size, tokens."""
        return jnp.dot(self.output_weights, self.output_tokens)

    def prompt_quantile(self, q) -> jax.Array:
        """Quantile of the prompt size: the smallest support point with CDF >= q.

        Args:
            q: quantile level(s) in (0, 1], any shape.

        Returns:
            Prompt size(s), tokens, shaped like ``q``. Piecewise constant in ``q`` and
            the weights (its gradient with respect to them is zero).
        """
        return _step_quantile(self.prompt_tokens, self.prompt_weights, q)

    def output_quantile(self, q) -> jax.Array:
        """Quantile of the output size; see `prompt_quantile`."""
        return _step_quantile(self.output_tokens, self.output_weights, q)

    def with_rate(self, rate_per_s) -> Workload:
        """The same workload at another arrival rate (req/s); may be traced."""
        return dataclasses.replace(self, rate_per_s=_as_float_array(rate_per_s))

    @classmethod
    def from_samples(
        cls,
        prompt_tokens,
        output_tokens,
        rate_per_s: float,
        arrival_cv2: float = 1.0,
        *,
        independent: bool = True,
        n_prompt_bins: int = DEFAULT_BINS,
        n_output_bins: int = DEFAULT_BINS,
        name: str = "samples",
    ) -> Workload:
        """Compact distribution of sampled requests, by quantile binning.

        Each marginal is cut into bins of consecutive ranks whose probability edges are
        denser in the upper tail and centred on the P50, P90 and P99; each support point
        is the mean of its bin, so the mean is preserved exactly and the step quantiles
        at P50/P90/P99 match the samples' to within a fraction of the local spacing of
        support points. Ties are split between bins by rank; bins left empty (few
        samples) are dropped and bins holding one repeated value are merged, so K and M
        can be smaller than requested.

        Args:
            prompt_tokens: (N,) prompt sizes, tokens, >= 1.
            output_tokens: (N,) output sizes, tokens, >= 1, paired with the prompts.
            rate_per_s: mean arrival rate, requests/s, > 0.
            arrival_cv2: squared coefficient of variation of inter-arrival times, >= 0.
            independent: if True the weights are the outer product of the marginals
                (prompt and output sizes independent, as in SplitwiseSim's validation
                traces); if False they are the samples' joint histogram over the bins.
            n_prompt_bins: number of prompt bins, >= 7.
            n_output_bins: number of output bins, >= 7.
            name: label.

        Returns:
            The `Workload`.

        Raises:
            ValueError: on empty, mismatched, non-finite or < 1 sizes, a non-positive
                rate, a negative cv2 or fewer than 7 bins.

        Example:
            >>> wl = Workload.from_samples([100, 2000, 300], [10, 5, 200], rate_per_s=1.0)
        """
        prompt = _check_sizes(prompt_tokens, "prompt_tokens")
        output = _check_sizes(output_tokens, "output_tokens")
        if prompt.shape != output.shape:
            raise ValueError(
                f"prompt_tokens and output_tokens must pair up, got {prompt.size} "
                f"prompts and {output.size} outputs"
            )
        _check_positive_finite(rate_per_s, "rate_per_s")
        if not (np.isfinite(arrival_cv2) and arrival_cv2 >= 0):
            raise ValueError(f"arrival_cv2 must be finite and >= 0, got {arrival_cv2!r}")
        prompt_support, prompt_bin = _quantile_bins(prompt, n_prompt_bins, "n_prompt_bins")
        output_support, output_bin = _quantile_bins(output, n_output_bins, "n_output_bins")
        joint = np.zeros((prompt_support.size, output_support.size))
        np.add.at(joint, (prompt_bin, output_bin), 1.0)
        joint /= prompt.size
        if independent:
            joint = np.outer(joint.sum(axis=1), joint.sum(axis=0))
        return cls(
            prompt_tokens=_as_float_array(prompt_support),
            output_tokens=_as_float_array(output_support),
            weights=_as_float_array(joint),
            rate_per_s=_as_float_array(rate_per_s),
            arrival_cv2=_as_float_array(arrival_cv2),
            name=name,
        )

    @classmethod
    def from_trace(
        cls,
        trace: str | os.PathLike | pd.DataFrame,
        rate_per_s: float | None = None,
        *,
        arrival: str = "poisson",
        independent: bool = True,
        n_prompt_bins: int = DEFAULT_BINS,
        n_output_bins: int = DEFAULT_BINS,
        name: str | None = None,
    ) -> Workload:
        """Compact workload of a request trace (see `load_trace` for the formats).

        Args:
            trace: path to a SplitwiseSim or Azure CSV trace, or a DataFrame with the
                columns of either format or `load_trace`'s normalised ones.
            rate_per_s: arrival rate, requests/s; None reads it from the trace as
                1 / mean inter-arrival time.
            arrival: "poisson" (stationary Poisson arrivals at the mean rate) or
                "trace" (the trace's own arrival curve, an `ArrivalProfile`, and its
                measured arrival_cv2; `workload(path)` defaults to this).
            independent: see `from_samples`.
            n_prompt_bins: see `from_samples`.
            n_output_bins: see `from_samples`.
            name: label; defaults to the file's stem, or "trace" for a DataFrame.

        Returns:
            The `Workload`.

        Raises:
            ValueError: on a malformed trace (see `load_trace`), an unknown ``arrival``,
                or too few arrivals to measure what was asked.
        """
        import pandas as pd  # imported here, not at the top (see the top's note)
        if arrival not in _ARRIVALS:
            raise ValueError(f"arrival must be one of {list(_ARRIVALS)}, got {arrival!r}")
        if isinstance(trace, pd.DataFrame):
            df = pd.DataFrame(_normalise_frame(trace, "the DataFrame"))
            name = "trace" if name is None else name
        else:
            df = load_trace(trace)
            name = Path(trace).stem if name is None else name
        arrival_cv2 = 1.0
        if rate_per_s is None or arrival == "trace":
            measured_rate, measured_cv2 = _arrival_stats(df["arrival_s"].to_numpy(), name)
            rate_per_s = measured_rate if rate_per_s is None else rate_per_s
            arrival_cv2 = measured_cv2 if arrival == "trace" else 1.0
        wl = cls.from_samples(
            df["prompt_tokens"].to_numpy(),
            df["output_tokens"].to_numpy(),
            rate_per_s=rate_per_s,
            arrival_cv2=arrival_cv2,
            independent=independent,
            n_prompt_bins=n_prompt_bins,
            n_output_bins=n_output_bins,
            name=name,
        )
        if arrival == "trace":
            profile = ArrivalProfile.from_arrivals(df["arrival_s"].to_numpy())
            # A given rate rescales time: the curve's shape is kept, its windows shrink.
            scale = measured_rate / rate_per_s
            wl = dataclasses.replace(wl, profile=dataclasses.replace(profile, window_s=profile.window_s * scale,
                                                                     idc_scale_s=profile.idc_scale_s * scale))
        return wl


def workload(
    name_or_path: str | os.PathLike,
    rate_per_s: float | None = None,
    independent: bool = True,
    *,
    arrival: str | None = None,
) -> Workload:
    """A built-in workload preset, or the workload of a trace file.

    The presets "coding" and "conversation" (aliases "code", "conv") are the Azure 2023
    LLM inference traces binned by `Workload.from_samples` with the default bins. They
    default to independent prompt and output sizes because SplitwiseSim's validation
    traces sample each column independently; ``independent=False`` uses the trace's
    joint histogram instead.

    Args:
        name_or_path: a preset name, or a path to a SplitwiseSim or Azure CSV trace.
        rate_per_s: arrival rate, requests/s. None gives `PRESET_RATE_PER_S` (70) for a
            preset and the trace's own rate for a file.
        independent: outer product of the marginals (True) or the joint (False).
        arrival: "poisson" (arrival_cv2 = 1) or "trace" (the trace's own arrival
            curve and measured cv2; about 173 for coding and 1.2 for conversation).
            None: "poisson" for a preset, "trace" for a trace file (its own arrivals
            count by default).

    Returns:
        The `Workload`.

    Raises:
        ValueError: for an unknown name that is not an existing file, or a malformed
            trace.

    Example:
        >>> wl = workload("conv", rate_per_s=30.0)
        >>> float(wl.output_quantile(0.5))  # doctest: +SKIP
        129.3...

    References:
        Splitwise, characterisation insight I and Fig. 12 (coding at 70 req/s).
    """
    key = str(name_or_path).lower()
    if isinstance(name_or_path, str) and key in _PRESET_ALIASES:
        arrival = "poisson" if arrival is None else arrival
        if arrival not in _ARRIVALS:
            raise ValueError(f"arrival must be one of {list(_ARRIVALS)}, got {arrival!r}")
        return _from_preset(
            _PRESET_ALIASES[key],
            PRESET_RATE_PER_S if rate_per_s is None else rate_per_s,
            independent,
            arrival,
        )
    if Path(name_or_path).is_file():
        return Workload.from_trace(
            name_or_path, rate_per_s, arrival="trace" if arrival is None else arrival, independent=independent
        )
    raise ValueError(
        f"workload {str(name_or_path)!r} is neither a preset nor an existing trace file; "
        f"accepted presets: {sorted(_PRESET_ALIASES)}, or a path to a SplitwiseSim "
        f"({','.join(_SPLITWISESIM_COLUMNS)}) or Azure ({','.join(_AZURE_COLUMNS)}) CSV"
    )


def sample_requests(workload: Workload, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Draws requests from the compact distribution (for tests and cross-checks).

    Args:
        workload: the `Workload`.
        n: number of requests.
        seed: numpy random seed.

    Returns:
        (prompt, output): two (n,) float arrays of sizes, tokens (support points, so
        not necessarily integers).
    """
    weights = np.asarray(workload.weights, dtype=np.float64).ravel()
    n_output = workload.output_tokens.shape[0]
    cell = np.random.default_rng(seed).choice(weights.size, size=n, p=weights / weights.sum())
    prompt = np.asarray(workload.prompt_tokens, dtype=np.float64)[cell // n_output]
    output = np.asarray(workload.output_tokens, dtype=np.float64)[cell % n_output]
    return prompt, output


def _step_quantile(support: jax.Array, weights: jax.Array, q) -> jax.Array:
    cdf = jnp.cumsum(weights)
    index = jnp.searchsorted(cdf, jnp.asarray(q, dtype=cdf.dtype), side="left")
    # The cumulative sum can end a rounding error below 1.
    return support[jnp.minimum(index, support.shape[0] - 1)]


def _probability_edges(n_bins: int) -> np.ndarray:
    """Probability edges (n_bins + 1,) from 0 to 1 of the quantile bins."""
    # Bin centres are spaced evenly in the warped coordinate u(p) = log((1+a)/(1+a-p)),
    # piecewise between knots at 0, the centred quantiles and _TOP_CENTRE, so each
    # centred quantile is a bin centre; edges are midpoints between centres in u.
    a = _TAIL_OFFSET
    knots = np.log((1 + a) / (1 + a - np.array([0.0, *_CENTRED_QUANTILES, _TOP_CENTRE])))
    lengths = np.diff(knots)
    # Hand out the intervals between centres so as to keep their spacing even. Two
    # between consecutive centred quantiles keep their bins apart, so that centring
    # one bin below cannot shift the next one's edge.
    intervals = np.array([1] + [2] * (len(_CENTRED_QUANTILES) - 1) + [1])
    for _ in range(n_bins - 1 - intervals.sum()):
        intervals[np.argmax(lengths / intervals)] += 1
    centres = np.concatenate(
        [
            np.linspace(lo, hi, m, endpoint=False)
            for lo, hi, m in zip(knots[:-1], knots[1:], intervals, strict=True)
        ]
        + [knots[-1:]]
    )
    edges_u = 0.5 * (centres[1:] + centres[:-1])
    edges = np.concatenate([[0.0], (1 + a) * (1 - np.exp(-edges_u)), [1.0]])
    # Uneven spacing on the two sides of a knot leaves its bin slightly lopsided in p;
    # pull the farther edge in so the quantile is the exact probability centre.
    for q in _CENTRED_QUANTILES:
        upper = np.searchsorted(edges, q)
        half = min(q - edges[upper - 1], edges[upper] - q)
        edges[upper - 1], edges[upper] = q - half, q + half
    return edges


def _quantile_bins(x: np.ndarray, n_bins: int, arg: str) -> tuple[np.ndarray, np.ndarray]:
    """Support points (bin means, increasing) and each sample's bin index."""
    if int(n_bins) != n_bins or n_bins < _MIN_BINS:
        raise ValueError(
            f"{arg} must be an integer >= {_MIN_BINS} (a bin centred on each of the "
            f"quantiles {_CENTRED_QUANTILES}, one between consecutive ones and one at "
            f"each end), got {n_bins!r}"
        )
    order = np.argsort(x, kind="stable")
    rank_edges = np.round(_probability_edges(int(n_bins)) * x.size).astype(int)
    rank_bin = np.searchsorted(rank_edges, np.arange(x.size), side="right") - 1
    _, rank_bin = np.unique(rank_bin, return_inverse=True)
    means = np.bincount(rank_bin, weights=x[order]) / np.bincount(rank_bin)
    # Consecutive bins holding a single repeated value have equal means: merge them.
    support, merged = np.unique(means, return_inverse=True)
    bin_index = np.empty(x.size, dtype=int)
    bin_index[order] = merged[rank_bin]
    return support, bin_index


def _check_sizes(values, arg: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"{arg} must be a non-empty 1-D array, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{arg} has NaN or infinite values")
    if np.any(x < 1):
        raise ValueError(f"{arg} must be >= 1 token, got minimum {x.min()!r}")
    return x


def _check_positive_finite(value, arg: str) -> None:
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{arg} must be finite and > 0, got {value!r}")


def _arrival_stats(arrival_s: np.ndarray, source: str) -> tuple[float, float]:
    """(rate req/s, cv2) of a trace's inter-arrival times."""
    gaps = np.diff(arrival_s)
    if gaps.size < 2 or gaps.mean() <= 0:
        raise ValueError(
            f"{source}: measuring the arrival rate and cv2 needs at least 3 requests "
            f"spread over a positive time, got {arrival_s.size}"
        )
    return 1.0 / gaps.mean(), gaps.var() / gaps.mean() ** 2


@functools.cache
def _preset_record(preset: str) -> dict:
    """The shipped JSON of a preset (written by calibration/build_workloads.py)."""
    with open(_PRESET_DIR / f"{preset}.json") as f:
        return json.load(f)


def _from_preset(preset: str, rate_per_s: float, independent: bool, arrival: str) -> Workload:
    _check_positive_finite(rate_per_s, "rate_per_s")
    record = _preset_record(preset)
    if independent:
        weights = np.outer(record["prompt_weights"], record["output_weights"])
    else:
        weights = np.asarray(record["joint_weights"], dtype=np.float64)
    return Workload(
        prompt_tokens=_as_float_array(record["prompt_tokens"]),
        output_tokens=_as_float_array(record["output_tokens"]),
        # Renormalise away the rounding of the stored weights.
        weights=_as_float_array(weights / weights.sum()),
        rate_per_s=_as_float_array(rate_per_s),
        arrival_cv2=_as_float_array(record["trace"]["arrival_cv2"] if arrival == "trace" else 1.0),
        name=preset,
    )


# Slack (in bins) at `coarsen`'s bin edges: float32 weights carry ~1e-7 relative
# rounding, summed over at most a few hundred classes and scaled by the bin count.
_EDGE_SLACK = 1e-5


_COARSEN_SCHEMES = ("equal-mass", "tail-dense")


def coarsen(wl: Workload, n_prompt_bins: int, n_output_bins: int, *, scheme: str = "equal-mass") -> Workload:
    """Merge adjacent classes into about n bins per marginal, preserving the means.

    Args:
        wl: the workload.
        n_prompt_bins, n_output_bins: bins per marginal (integers >= 1; >= 7 for
            "tail-dense").
        scheme: "equal-mass" (the default): each bin about 1/n of the marginal's
            probability, so the top bin merges the top 1/n of requests (at 16 bins,
            every class above the 94th percentile). "tail-dense": the probability edges
            the presets themselves are binned on (`Workload.from_samples`), narrow in
            the tail, a bin centred on each of P50, P90 and P99; each class joins the
            bin its probability centre falls in. On the Fig. 12 grid at 16 x 16 the
            largest difference of any percentile from the full classes fell from 775 %
            to 21 %, the per-cluster worst at the median cluster from 21 % to 3.6 %
            (docs/speed.md §12).

    For fast grid sweeps and the optimiser's gradient phase; percentile accuracy falls
    with the bin count (see benchmarks/grid_speed.py).
    """
    if scheme not in _COARSEN_SCHEMES:
        raise ValueError(f"scheme must be one of {list(_COARSEN_SCHEMES)}, got {scheme!r}")
    low = _MIN_BINS if scheme == "tail-dense" else 1
    for arg, n in (("n_prompt_bins", n_prompt_bins), ("n_output_bins", n_output_bins)):
        if not isinstance(n, int) or isinstance(n, bool) or n < low:
            raise ValueError(f"{arg} must be an integer >= {low}{' for the tail-dense scheme' if low > 1 else ''}, "
                             f"got {n!r}")
    w = np.asarray(wl.weights, dtype=float)

    def groups(marginal, n):
        if scheme == "tail-dense":
            # The bin holding each class's probability centre (the same slack at edges).
            cum = np.cumsum(marginal) - 0.5 * marginal
            edges = _probability_edges(n)
            g = np.clip(np.searchsorted(edges, cum + _EDGE_SLACK / n, side="right") - 1, 0, n - 1)
            _, g = np.unique(g, return_inverse=True)
            return g
        # A class whose mid-mass falls on a bin edge (the presets' median classes do,
        # exactly) joins the upper bin: the 1e-5 of a bin absorbs the rounding of weights
        # stored in float32, which otherwise flipped such a class to the lower bin
        # and changed the classes with JAX's precision (tests/test_workload.py).
        cum = np.cumsum(marginal) - 0.5 * marginal
        g = np.minimum(np.floor(cum * n + _EDGE_SLACK).astype(int), n - 1)
        _, g = np.unique(g, return_inverse=True)
        return g

    gp = groups(w.sum(axis=1), n_prompt_bins)
    go = groups(w.sum(axis=0), n_output_bins)
    P = np.zeros((gp.max() + 1, w.shape[0]))
    P[gp, np.arange(w.shape[0])] = 1.0
    O = np.zeros((go.max() + 1, w.shape[1]))
    O[go, np.arange(w.shape[1])] = 1.0
    new_w = P @ w @ O.T
    p = np.asarray(wl.prompt_tokens, float)
    o = np.asarray(wl.output_tokens, float)
    new_p = (P * w.sum(axis=1)) @ p / (P @ w.sum(axis=1))
    new_o = (O * w.sum(axis=0)) @ o / (O @ w.sum(axis=0))
    return dataclasses.replace(wl, prompt_tokens=jnp.asarray(new_p), output_tokens=jnp.asarray(new_o),
                               weights=jnp.asarray(new_w))
