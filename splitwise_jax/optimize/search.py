"""The boundary of a monotone predicate, found for many problems at once.

"The highest arrival rate at which a cluster meets every SLO" is such a boundary (the
predicate "meets the SLOs at rate r" holds below it and fails above: more load never
shortens a queue), and so are "the fewest machines that meet the SLOs" and "the lowest
link bandwidth that keeps up". This module is the one home of that search: the
optimiser's throughput problems (`integer._max_rates`) and the studies'
`throughput_at_slo` and break-even searches call `search_boundary` with their own
predicate.

The search runs in log space (rates span 0.05-5,000 req/s) and is vectorised: each step
asks the predicate about `points` values per unresolved problem in one call, so a
caller that evaluates a batch of clusters at once (one compiled program) pays one
dispatch per step for all problems. With `points = 1` it is bisection; with k points
the bracket shrinks by k + 1 per step.

References:
    Patel et al., Splitwise, ISCA 2024, §VI-A: the paper's own sizing searches for the
    highest load that meets the SLOs with the simulator.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

#: Default widening step of an open-ended search (log units): x4 per step.
WIDEN = math.log(4.0)


class Boundary(NamedTuple):
    """Result of `search_boundary` (arrays of shape (n,)).

    Attributes:
        value: the boundary in linear units, on the passing side of the final bracket:
            the largest passing value (``increasing=False``) or the smallest
            (``increasing=True``). Where the predicate fails at both ends it is 0
            (decreasing) or inf (increasing); where it holds at both ends it is the
            end itself (`hi` or `lo`, after any widening).
        ok_lo, ok_hi: the predicate at the (final) ends of the search.
        evaluations: predicate values computed, all problems together.
    """

    value: np.ndarray
    ok_lo: np.ndarray
    ok_hi: np.ndarray
    evaluations: int


def search_boundary(ok_fn: Callable[[np.ndarray, np.ndarray], np.ndarray], lo, hi, *, increasing: bool = False,
                    rel_tol: float = 5e-4, points: int = 1, ok_lo: np.ndarray | None = None,
                    ceiling: float | None = None, widen: float = WIDEN) -> Boundary:
    """Vectorised k-ary search for where a monotone predicate changes, in log space.

    Args:
        ok_fn: ``ok_fn(rows, log_x) -> bool array`` with `rows` (m,) indices of the
            problems asked about and `log_x` (m, k) log-values; returns (m, k). For each
            problem it is monotone: True below the boundary and False above
            (``increasing=False``, e.g. "meets the SLOs at this rate"), or the reverse
            (``increasing=True``, e.g. "meets the SLOs with this many machines").
        lo, hi: (n,) log-bounds of the search.
        increasing: which way the predicate runs (above).
        rel_tol: width of the final bracket in log units (5e-4: 0.05%).
        points: values asked per problem and step (1: bisection).
        ok_lo: the predicate at `lo` if the caller already has it (skips that call).
        ceiling: for ``increasing=False`` only: while a problem still passes at `hi`,
            move its bracket up by `widen` (log units), up to `ceiling` (log).
        widen: the step of that widening.

    Returns:
        `Boundary`. Problems failing at `lo` (decreasing) or passing there (increasing)
        are settled by the first call and never asked about again.

    Example:
        >>> b = search_boundary(lambda rows, lx: np.exp(lx) <= 7.0, np.log([1.0]), np.log([100.0]))
        >>> abs(b.value[0] - 7.0) < 7.0 * 1e-3
        True
    """
    lo = np.array(lo, dtype=float, copy=True).reshape(-1)
    hi = np.array(hi, dtype=float, copy=True).reshape(-1)
    if lo.shape != hi.shape:
        raise ValueError(f"lo and hi must have one shape, got {lo.shape} and {hi.shape}")
    if points < 1:
        raise ValueError(f"points must be >= 1, got {points}")
    if ceiling is not None and increasing:
        raise ValueError("ceiling widens decreasing searches only")
    n = lo.size
    everyone = np.arange(n)
    evaluations = 0
    if ok_lo is None:
        ends = np.asarray(ok_fn(everyone, np.stack([lo, hi], axis=1)), bool)
        ok_lo, ok_hi = ends[:, 0].copy(), ends[:, 1].copy()
        evaluations += 2 * n
    else:
        ok_lo = np.asarray(ok_lo, bool).reshape(-1).copy()
        ok_hi = np.zeros(n, bool) if not increasing else np.ones(n, bool)
        ask = np.flatnonzero(ok_lo if not increasing else ~ok_lo)
        if len(ask):
            ok_hi[ask] = np.asarray(ok_fn(ask, hi[ask, None]), bool)[:, 0]
            evaluations += len(ask)
    if ceiling is not None:  # open-ended: move up while the top still passes
        ceiling = float(ceiling)
        grow = np.flatnonzero(ok_lo & ok_hi & (hi < ceiling))
        while len(grow):
            lo[grow] = hi[grow]
            hi[grow] = np.minimum(hi[grow] + widen, ceiling)
            ok = np.asarray(ok_fn(grow, hi[grow, None]), bool)[:, 0]
            evaluations += len(grow)
            ok_hi[grow] = ok
            grow = grow[ok & (hi[grow] < ceiling)]
    # Problems with the boundary inside their bracket.
    active = np.flatnonzero(ok_lo & ~ok_hi) if not increasing else np.flatnonzero(~ok_lo & ok_hi)
    frac = np.arange(1, points + 1) / (points + 1)
    while len(active) and np.max(hi[active] - lo[active]) > rel_tol:
        a, b = lo[active], hi[active]
        x = a[:, None] + (b - a)[:, None] * frac[None, :]
        ok = np.asarray(ok_fn(active, x), bool)
        evaluations += ok.size
        m = np.arange(len(active))
        if increasing:  # False below the boundary: the first True value bounds it above
            hit = ok.any(axis=1)
            first = np.argmax(ok, axis=1)
            new_hi = np.where(hit, x[m, first], b)
            new_lo = np.where(hit, np.where(first > 0, x[m, first - 1], a), x[:, -1])
        else:  # True below the boundary: the first False value bounds it above
            miss = (~ok).any(axis=1)
            first = np.argmax(~ok, axis=1)
            new_lo = np.where(miss, np.where(first > 0, x[m, first - 1], a), x[:, -1])
            new_hi = np.where(miss, x[m, first], b)
        lo[active], hi[active] = new_lo, new_hi
    if increasing:
        value = np.where(~ok_hi, np.inf, np.where(ok_lo, np.exp(lo), np.exp(hi)))
    else:
        value = np.where(~ok_lo, 0.0, np.where(ok_hi, np.exp(hi), np.exp(lo)))
    return Boundary(value, ok_lo, ok_hi, evaluations)
