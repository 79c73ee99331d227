"""Fixed-shape batches: pad rows to a block and cut the padding off again.

A compiled program has one input shape, so a host loop that feeds it N rows pads the
last block (with copies of the last row: valid inputs, whose outputs are cut off) and
keeps the first N outputs. `sweep.sweep` pads its rows this way to fill every device;
`map_blocks` is the host loop for a jitted function of fixed-size blocks
(`simulate.timing`, the studies' sweeps), `padded_blocks` the loop's blocks for a
caller with its own per-block work (`optimize.spec.evaluate_points`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import jax
import numpy as np


def pad_rows(a, total: int) -> np.ndarray:
    """`a` (N, ...) with copies of its last row appended up to `total` rows (N <= total)."""
    a = np.asarray(a)
    return np.concatenate([a, np.repeat(a[-1:], total - len(a), axis=0)]) if total > len(a) else a


def padded_blocks(arrays: Sequence, size: int) -> Iterator[tuple[int, int, list[np.ndarray]]]:
    """(start, rows, blocks) for consecutive blocks of `size` rows of `arrays` (equal
    leading axes N > 0): each block padded to `size` rows (`pad_rows`), `rows` of them
    real."""
    arrays = [np.asarray(a) for a in arrays]
    n = len(arrays[0])
    for start in range(0, n, size):
        part = [a[start:start + size] for a in arrays]
        yield start, len(part[0]), [pad_rows(p, size) for p in part]


def map_blocks(fn: Callable[..., Any], arrays: Sequence, size: int) -> Any:
    """``fn(*block)`` over `arrays` in padded blocks of `size` rows (one compiled shape),
    the outputs (a pytree of arrays with the block's leading axis) concatenated as numpy
    and cut to the N rows."""
    parts = [jax.tree_util.tree_map(np.asarray, fn(*block)) for _, _, block in padded_blocks(arrays, size)]
    n = len(np.asarray(arrays[0]))
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs)[:n], *parts)
