"""`_batching`: fixed-shape blocks padded with the last row, the padding cut off."""

from __future__ import annotations

import numpy as np
import pytest

from splitwise_jax._batching import map_blocks, pad_rows, padded_blocks


def test_pad_rows_repeats_the_last_row():
    a = np.arange(6.0).reshape(3, 2)
    assert pad_rows(a, 5).tolist() == [[0, 1], [2, 3], [4, 5], [4, 5], [4, 5]]
    assert pad_rows(a, 3) is a


@pytest.mark.parametrize("n", [1, 7, 8, 9, 20])
def test_blocks_have_one_shape_and_map_blocks_cuts_the_padding(n):
    x, y = np.arange(float(n)), np.arange(float(n)) * 10.0
    blocks = list(padded_blocks([x, y], 8))
    assert all(b.shape == (8,) for _, _, bs in blocks for b in bs)
    assert sum(k for _, k, _ in blocks) == n and [s for s, _, _ in blocks] == list(range(0, n, 8))
    calls = []

    def fn(a, b):
        calls.append(a.shape)
        return {"sum": a + b, "pair": (a, b)}

    out = map_blocks(fn, [x, y], 8)
    assert set(calls) == {(8,)} and len(calls) == -(-n // 8)
    np.testing.assert_array_equal(out["sum"], x + y)
    np.testing.assert_array_equal(out["pair"][1], y)
