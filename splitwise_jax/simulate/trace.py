"""Request traces for the simulator: a user's CSV, or Poisson arrivals from a workload.

A trace is one row per request: its arrival time and its prompt and output sizes in
whole tokens. `from_csv` reads the formats `splitwise_jax.cluster.workload.load_trace` reads
(SplitwiseSim's, the Azure trace's, or the normalised one) and keeps their own arrival
times. `poisson` samples a trace the way SplitwiseSim's generator does (exponential
inter-arrival times, sizes drawn independently of one another), from a `Workload`'s
size distribution.
"""

from __future__ import annotations

import dataclasses
import os
import sys

from typing import TYPE_CHECKING

import numpy as np

from splitwise_jax.cluster.trace_file import read_trace_columns

if TYPE_CHECKING:
    from splitwise_jax.cluster.workload import Workload

__all__ = ["RequestTrace", "from_csv", "poisson", "replay", "resample_poisson"]


@dataclasses.dataclass(frozen=True, eq=False)
class RequestTrace:
    """Requests in arrival order.

    Attributes:
        arrival_s: (N,) arrival times, seconds, non-decreasing.
        prompt_tokens: (N,) prompt sizes, whole tokens >= 1.
        output_tokens: (N,) output sizes, whole tokens >= 1 (the first comes from the
            prompt phase).
        request_id: (N,) identifiers (the trace's row number unless given).
        name: label.
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    request_id: np.ndarray
    name: str = "trace"

    def __post_init__(self):
        a = np.asarray(self.arrival_s, dtype=np.float64)
        p = np.asarray(self.prompt_tokens)
        o = np.asarray(self.output_tokens)
        if not (a.ndim == p.ndim == o.ndim == 1 and a.size == p.size == o.size):
            raise ValueError(f"trace {self.name}: arrival_s, prompt_tokens and output_tokens must be 1-D of one "
                             f"length, got shapes {a.shape}, {p.shape}, {o.shape}")
        if a.size == 0:
            raise ValueError(f"trace {self.name}: no requests")
        if not np.all(np.isfinite(a)) or np.any(a < 0):
            raise ValueError(f"trace {self.name}: arrival times must be finite and >= 0")
        if np.any(np.diff(a) < 0):
            raise ValueError(f"trace {self.name}: arrival times must be non-decreasing")
        for label, x in (("prompt_tokens", p), ("output_tokens", o)):
            if not np.all(np.isfinite(x)) or np.any(x < 1) or np.any(x != np.round(x)):
                raise ValueError(f"trace {self.name}: {label} must be whole numbers >= 1")
        object.__setattr__(self, "arrival_s", a)
        object.__setattr__(self, "prompt_tokens", p.astype(np.int64))
        object.__setattr__(self, "output_tokens", o.astype(np.int64))
        object.__setattr__(self, "request_id", np.asarray(self.request_id))

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    @classmethod
    def from_arrays(cls, arrival_s, prompt_tokens, output_tokens, name: str = "trace") -> "RequestTrace":
        a = np.asarray(arrival_s, dtype=np.float64)
        return cls(a, np.asarray(prompt_tokens), np.asarray(output_tokens), np.arange(a.size), name)

    @property
    def rate_per_s(self) -> float:
        """Mean arrival rate, requests/s (N - 1 gaps over the span; N / span for one gap)."""
        span = float(self.arrival_s[-1] - self.arrival_s[0])
        return (len(self) - 1) / span if span > 0 else float("inf")


def from_csv(path: str | os.PathLike) -> RequestTrace:
    """Reads a trace file with its own arrival times (formats of `workload.load_trace`).

    Sizes are rounded to whole tokens (SplitwiseSim's traces hold integers already).

    Raises:
        ValueError: a malformed file (the message names the file and the problem).
    """
    try:
        cols = read_trace_columns(path)
    except ValueError as e:
        pandas = sys.modules.get("pandas")  # its parser's errors: a file that is not a CSV
        if pandas is not None and isinstance(e, pandas.errors.ParserError):
            raise ValueError(f"trace {path}: not a CSV trace ({str(e).strip()})") from None
        raise
    name = os.path.splitext(os.path.basename(str(path)))[0]
    return RequestTrace(
        arrival_s=cols["arrival_s"],
        prompt_tokens=np.maximum(np.round(cols["prompt_tokens"]), 1),
        output_tokens=np.maximum(np.round(cols["output_tokens"]), 1),
        request_id=np.arange(cols["arrival_s"].size),
        name=name,
    )


def poisson(workload: Workload, rate_per_s: float, horizon_s: float, seed: int = 0) -> RequestTrace:
    """Poisson arrivals over [0, horizon_s) with sizes sampled from a workload.

    Inter-arrival times are exponential with mean 1 / rate (SplitwiseSim's generator
    does the same, cumulated from t = 0). Prompt and output sizes are drawn
    independently from the workload's two marginals (as SplitwiseSim draws each column
    of the Azure trace on its own); a marginal's support points are bin means, so each
    draw is rounded stochastically to a whole token (floor(x + U), U uniform on [0, 1)),
    which keeps its mean.

    Args:
        workload: the size distribution (its own rate is ignored).
        rate_per_s: arrival rate, requests/s, > 0.
        horizon_s: length of the arrival window, s, > 0.
        seed: numpy seed; one seed gives one trace.

    Returns:
        The trace (possibly empty windows are refused: at least one request).
    """
    for label, v in (("rate_per_s", rate_per_s), ("horizon_s", horizon_s)):
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{label} must be a positive finite number, got {v!r}")
    rng = np.random.default_rng(seed)
    expected = rate_per_s * horizon_s
    n_draw = int(expected + 10 * np.sqrt(expected) + 10)
    gaps = rng.exponential(1.0 / rate_per_s, size=n_draw)
    arrival = np.cumsum(gaps)
    while arrival[-1] < horizon_s:  # astronomically rare: draw more
        arrival = np.concatenate([arrival, arrival[-1] + np.cumsum(rng.exponential(1.0 / rate_per_s, size=n_draw))])
    arrival = arrival[arrival < horizon_s]
    if arrival.size == 0:
        raise ValueError(f"no request arrives within horizon_s={horizon_s} at rate {rate_per_s} req/s (seed {seed}); "
                         "lengthen the horizon or raise the rate")
    n = arrival.size

    def draw(support, weights):
        support = np.asarray(support, dtype=np.float64)
        w = np.asarray(weights, dtype=np.float64)
        x = support[rng.choice(support.size, size=n, p=w / w.sum())]
        return np.maximum(np.floor(x + rng.random(n)), 1.0)

    prompt = draw(workload.prompt_tokens, workload.prompt_weights)
    output = draw(workload.output_tokens, workload.output_weights)
    return RequestTrace(arrival, prompt, output, np.arange(n), name=f"{workload.name}-poisson-{rate_per_s:g}rps")


def replay(path: str | os.PathLike, rate_per_s: float | None = None) -> RequestTrace:
    """A trace file's requests at their own arrival times (`from_csv`); with a rate, the
    times compressed or stretched about the first arrival to that mean rate, the curve's
    shape kept (as `workload.from_trace` rescales a trace's arrival profile for the
    fluid model).

    Raises:
        ValueError: a malformed trace, or a rate for a trace without an arrival span.
    """
    import math

    tr = from_csv(path)
    if rate_per_s is None:
        return tr
    if len(tr) < 2 or not tr.rate_per_s < math.inf:
        raise ValueError(f"--rate: trace {path} has no arrival span to rescale; drop --rate")
    t0 = tr.arrival_s[0]
    scaled = t0 + (tr.arrival_s - t0) * (tr.rate_per_s / rate_per_s)
    return RequestTrace(scaled, tr.prompt_tokens, tr.output_tokens, tr.request_id, name=f"{tr.name}-at-{rate_per_s:g}rps")


def resample_poisson(path: str | os.PathLike, rate_per_s: float | None = None, horizon_s: float = 120.0,
                     seed: int = 0) -> RequestTrace:
    """Poisson arrivals at `rate_per_s` (default: the trace's mean rate) over
    `horizon_s`, each size column sampled from the trace on its own (SplitwiseSim's
    generator: exponential gaps, sizes drawn with replacement).

    Raises:
        ValueError: a malformed trace, a trace without a rate and none given, or no
            arrival within the horizon (naming the command line's flags).
    """
    import math

    cols = read_trace_columns(path)
    if rate_per_s is None:
        gaps = np.diff(cols["arrival_s"])
        if gaps.size < 1 or gaps.mean() <= 0:
            raise ValueError(f"--workload {path}: cannot read a rate from its arrival times; give --rate")
        rate_per_s = 1.0 / float(gaps.mean())
    rng = np.random.default_rng(seed)
    expected = rate_per_s * horizon_s
    gaps = rng.exponential(1.0 / rate_per_s, size=int(expected + 10 * math.sqrt(expected) + 10))
    arrival = np.cumsum(gaps)
    arrival = arrival[arrival < horizon_s]
    if arrival.size == 0:
        raise ValueError(f"--horizon: no request arrives within {horizon_s:g} s at --rate {rate_per_s:g}")
    p = rng.choice(np.round(cols["prompt_tokens"]), size=arrival.size)
    o = rng.choice(np.round(cols["output_tokens"]), size=arrival.size)
    return RequestTrace.from_arrays(arrival, np.maximum(p, 1), np.maximum(o, 1),
                                    name=f"{os.path.splitext(os.path.basename(str(path)))[0]}-poisson-{rate_per_s:g}rps")

