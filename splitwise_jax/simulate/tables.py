"""The simulator's timing tables as plain lookups: NumPy and Python only, no JAX.

A simulated run times 10^4-10^5 iterations one at a time; these classes answer from
tables of a phase-timing strategy evaluated once, vectorised (`timing` builds them
from the strategy, with JAX; see its docstring for what each table holds and how
exact it is). Kept apart from `timing` so that a run whose tables are already on disk
(a warm `python -m splitwise_jax.simulate`, `cli.simulate_warm`) imports no JAX at all:
`TokenTable` (exact lookup of the sim table) and `GridTable` (interpolated grids of
any strategy's time or power) take their arrays, and raise `TablesTooSmall` if a batch
needs rows they were not given; the strategy-backed subclasses in `timing` grow them
instead.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

__all__ = ["FastTiming", "TokenTable", "GridTable", "TablesTooSmall", "cumulative_s", "iterations_done"]


class TablesTooSmall(LookupError):
    """A stored table lacks rows a batch needs, and has no strategy to compute them."""


class FastTiming:
    """Iteration times of one machine type as plain Python floats (see module docstring)."""

    #: whether decode context (C) changes the time; the engine skips summing it if not
    uses_context = True

    def iteration(self, P: int, n: int, S: float, B: int, C: float) -> float:
        """One iteration with P prompt tokens over n prompts (attention work S) and B decodes
        (context sum C)."""
        raise NotImplementedError

    def decode_block(self, B: int, C: float, k: int) -> tuple[float, float]:
        """(first iteration's time, increment per iteration) of k decode-only iterations
        of B requests whose contexts sum to C at the first one."""
        raise NotImplementedError


class TokenTable(FastTiming):
    """Exact lookup of a strategy whose time depends on token counts only (the sim
    table's): times at every whole token count (prompt-only at P tokens, mixed at P + B)
    and every whole decode batch. `arrays` gives the tables; without them (or when a
    batch needs more rows) they come from `_ev`, which only a subclass with the strategy
    has (`timing.TableTiming`): here it raises `TablesTooSmall`."""

    uses_context = False

    def __init__(self, max_tokens: int = 4096, max_batch: int = 512, arrays: dict | None = None):
        self.max_tokens = int(max_tokens)
        self.max_batch = int(max_batch)
        t = self._load() if arrays is None else arrays
        self._prompt: list[float] = t["prompt"].tolist()
        self._mixed: list[float] = t["mixed"].tolist()
        self._token: list[float] = t["token"].tolist()

    def _ev(self, P, n, S, B, C) -> np.ndarray:
        """The strategy's times at these batches (a subclass with the strategy has them)."""
        raise TablesTooSmall("a stored token table cannot grow without its strategy")

    def _load(self) -> dict[str, np.ndarray]:
        return self._tables()

    def _tables(self) -> dict[str, np.ndarray]:
        return {**self._token_rows(0, self.max_tokens), "token": self._batch_rows(0, self.max_batch)}

    def arrays(self) -> dict[str, np.ndarray]:
        """The tables as they stand (grown rows included), to store or rebuild from."""
        return {"prompt": np.asarray(self._prompt), "mixed": np.asarray(self._mixed),
                "token": np.asarray(self._token)}

    def _token_rows(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        x = np.arange(lo, hi + 1, dtype=np.float64)
        z, one = np.zeros_like(x), np.ones_like(x)
        # prompt-only: x tokens in one prompt; mixed: x - 1 prompt tokens and one decode.
        return {"prompt": self._ev(x, one, x * x, z, z),
                "mixed": self._ev(np.maximum(x - 1, 0), one, x * x, one, x)}

    def _batch_rows(self, lo: int, hi: int) -> np.ndarray:
        x = np.arange(lo, hi + 1, dtype=np.float64)
        z = np.zeros_like(x)
        return self._ev(z, z, z, x, x * 1000.0)

    def _extend_tokens(self, hi: int) -> None:
        lo = len(self._prompt)
        if hi < lo:
            return
        rows = self._token_rows(lo, hi)
        self._prompt += rows["prompt"].tolist()
        self._mixed += rows["mixed"].tolist()

    def _extend_batch(self, hi: int) -> None:
        lo = len(self._token)
        if hi < lo:
            return
        self._token += self._batch_rows(lo, hi).tolist()

    def iteration(self, P, n, S, B, C):
        if B == 0:
            if P >= len(self._prompt):
                self._extend_tokens(2 * P)
            return self._prompt[P]
        if P == 0:
            if B >= len(self._token):
                self._extend_batch(2 * B)
            return self._token[B]
        x = P + B
        if x >= len(self._mixed):
            self._extend_tokens(2 * x)
        return self._mixed[x]

    def decode_block(self, B, C, k):
        if B >= len(self._token):
            self._extend_batch(2 * B)
        return self._token[B], 0.0


def _lattice(hi: float, per_doubling: float) -> np.ndarray:
    """Knots 2^(k / per_doubling), k = 0, 1, ..., from 1 to the first at or above `hi`:
    the same knots for every extent (a larger table's knots include a smaller one's)."""
    k = np.arange(0, math.ceil(math.log2(max(hi, 2.0)) * per_doubling - 1e-9) + 1)
    return 2.0 ** (k / per_doubling)


class GridTable(FastTiming):
    """Interpolated tables of any strategy (the calibrated one's times, or any
    strategy's power); see the module docstring.

    The time of an iteration with P prompt tokens in n prompts (attention work S) and B
    decodes (context sum C = B m) is read as

        F1[P] + dPrompt(P, n, S / P^2) + dDecode(P, B, m)

    with F1 the strategy at one prompt of every integer size P (exact for the common
    single-prompt batch), dPrompt the change from splitting P into n prompts (trilinear
    on P x n x S/P^2; n exact up to `N_PROMPTS`, linear beyond) and dDecode the change
    from adding the decodes (4-linear on P x n x B x m, at n equal prompts). Decode-only batches are exact in B
    and linear in m. Both differences are smooth where F1 has its sharp features (GEMM
    efficiency, the all-reduce knee), so coarse grids suffice.

    `arrays` gives the tables; without them (or when a batch needs a larger extent) they
    come from `_ev`, which only a subclass with the strategy has (`timing.GridTiming`):
    here it raises `TablesTooSmall`.

    Args:
        max_tokens: largest prompt tokens of one iteration to tabulate exactly.
        max_batch: largest decode batch to tabulate exactly.
        max_context: largest context of one request (prompt + output tokens).
        arrays: the tables (`arrays()` of a grid of the same extents).
    """

    # Grid densities, in knots per doubling: chosen so the interpolation error on random
    # batches stays under ~1 % at worst and ~0.05 % typically (tests/test_simulate.py
    # measures it); denser grids cost setup time. The knots lie on fixed lattices
    # (`_lattice`), so a larger table holds every knot of a smaller one and reads the
    # same value anywhere inside it: a run's timing does not depend on which runs came
    # before it in the process (a table is reused, or grows, when a later trace needs a
    # larger one; with knots spread over each table's own extent it did, and near
    # saturation a 1e-9 difference in an iteration time reordered events and moved
    # percentiles by up to 47 %, 2026-12-04).
    CTX_PER_DOUBLING = 3
    P_PER_DOUBLING = 4
    N_PROMPTS = 16
    U_POINTS = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
    B_PER_DOUBLING = 3
    M_PER_DOUBLING = 4 / 3
    MIX_PROMPTS = (1, 2, 4, 8, 16)

    def __init__(self, max_tokens: int = 4096, max_batch: int = 512, max_context: int = 32768,
                 arrays: dict | None = None):
        self.max_tokens = int(max_tokens)
        self.max_batch = int(max_batch)
        self.max_context = int(max(max_context, 64))
        self._set(self._load() if arrays is None else arrays)

    def sizes(self) -> tuple:
        """What the tables' values depend on besides the strategy (their key on disk)."""
        return ("lattice", self.max_tokens, self.max_batch, self.max_context, self.CTX_PER_DOUBLING,
                self.P_PER_DOUBLING, self.N_PROMPTS, self.U_POINTS, self.B_PER_DOUBLING, self.M_PER_DOUBLING,
                self.MIX_PROMPTS)

    def _ev(self, P, n, S, B, C) -> np.ndarray:
        """The strategy at these batches (a subclass with the strategy has it)."""
        raise TablesTooSmall("a stored grid cannot grow without its strategy")

    def _load(self) -> dict[str, np.ndarray]:
        return self._tables()

    def _build(self) -> None:
        self._set(self._load())

    def arrays(self) -> dict[str, np.ndarray]:
        """The tables, to store or rebuild from (`GridTable(..., arrays=...)`)."""
        return dict(self._arrays)

    def _set(self, t: dict) -> None:
        # the event loop reads Python lists (faster per element than NumPy indexing)
        self._p_t = t["p_t"].tolist()
        self._d_m = t["d_m"].tolist()
        self._d_t = t["d_t"].tolist()
        self._arrays = t  # the same tables as arrays, for `many`
        self._s_p, self._s_n, self._s_u = t["s_p"].tolist(), t["s_n"].tolist(), t["s_u"].tolist()
        self._s_d = t["s_d"]
        self._x_k, self._x_b, self._x_m = t["x_k"].tolist(), t["x_b"].tolist(), t["x_m"].tolist()
        self._x_d = t["x_d"]

    def _tables(self) -> dict[str, np.ndarray]:
        Pmax, Bmax, Mmax = self.max_tokens, self.max_batch, self.max_context
        ev = self._eval
        t = {}
        # one prompt of every integer size
        x = np.arange(0, Pmax + 1, dtype=np.float64)
        z = np.zeros_like(x)
        t["p_t"] = ev(x, (x > 0) * 1.0, x * x, z, z)
        # decode-only: every integer B x log grid of mean context
        m = _lattice(Mmax * 1.05, self.CTX_PER_DOUBLING)
        b = np.arange(0, Bmax + 1, dtype=np.float64)
        bb, mm = np.meshgrid(b, m, indexing="ij")
        zz = np.zeros_like(bb)
        t["d_m"] = m
        t["d_t"] = ev(zz, zz, zz, bb, bb * mm)
        # splitting P into n prompts with S = u P^2
        gp = np.unique(np.round(_lattice(Pmax, self.P_PER_DOUBLING)))
        gn = np.arange(1, self.N_PROMPTS + 1, dtype=np.float64)
        gu = np.asarray(self.U_POINTS, dtype=np.float64)
        P3, N3, U3 = np.meshgrid(gp, gn, gu, indexing="ij")
        base = ev(P3, np.ones_like(P3), P3 * P3, 0 * P3, 0 * P3)
        t["s_p"], t["s_n"], t["s_u"] = gp, gn, gu
        t["s_d"] = ev(P3, N3, U3 * P3 * P3, 0 * P3, 0 * P3) - base
        # adding B decodes of mean context m to n equal prompts of P tokens in all
        gb = np.unique(np.round(_lattice(Bmax, self.B_PER_DOUBLING)))
        gm = _lattice(Mmax * 1.05, self.M_PER_DOUBLING)
        gk = np.asarray(self.MIX_PROMPTS, dtype=np.float64)
        P4, K4, B4, M4 = np.meshgrid(gp, gk, gb, gm, indexing="ij")
        S4 = P4 * P4 / K4
        t["x_k"], t["x_b"], t["x_m"] = gk, gb, gm
        # the prompts alone depend on (P, k) only: evaluated once per pair, not once per
        # (B, m) as well (115,200 of the set-up's ~276,000 strategy evaluations)
        P2, K2 = np.meshgrid(gp, gk, indexing="ij")
        alone = ev(P2, K2, P2 * P2 / K2, 0 * P2, 0 * P2)
        t["x_d"] = ev(P4, K4, S4, B4, B4 * M4) - alone[:, :, None, None]
        return t

    def _eval(self, P, n, S, B, C):
        shape = np.shape(P)
        return np.asarray(self._ev(P, n, S, B, C)).reshape(shape)

    @staticmethod
    def _seg(grid: list, x: float) -> tuple[int, float]:
        """Index i and weight w so that x = (1 - w) grid[i] + w grid[i + 1] (extrapolating)."""
        i = bisect.bisect_right(grid, x) - 1
        i = 0 if i < 0 else (len(grid) - 2 if i > len(grid) - 2 else i)
        x0, x1 = grid[i], grid[i + 1]
        return i, (x - x0) / (x1 - x0)

    @staticmethod
    def _tri(arr: np.ndarray, i: int, wi: float, j: int, wj: float, k: int, wk: float) -> float:
        c = arr[i:i + 2, j:j + 2, k:k + 2]
        c = c[0] * (1 - wi) + c[1] * wi
        c = c[0] * (1 - wj) + c[1] * wj
        return float(c[0] * (1 - wk) + c[1] * wk)

    def _decode(self, B: int, C: float) -> float:
        if B > self.max_batch:
            self.max_batch = 2 * B
            self._build()
        row = self._d_t[B]
        i, w = self._seg(self._d_m, C / B)
        return row[i] + w * (row[i + 1] - row[i])

    def iteration(self, P, n, S, B, C):
        if P == 0:
            return self._decode(B, C)
        if P > self.max_tokens:
            self.max_tokens = 2 * P
            self._build()
        t = self._p_t[P]
        if n != 1 or (S != P * P):
            ip, wp = self._seg(self._s_p, P)
            i_n, wn = self._seg(self._s_n, n)
            iu, wu = self._seg(self._s_u, S / (P * P))
            t += self._tri(self._s_d, ip, wp, i_n, wn, iu, wu)
        if B:
            ip, wp = self._seg(self._s_p, P)
            ik, wk = self._seg(self._x_k, n)
            ib, wb = self._seg(self._x_b, B)
            im, wm = self._seg(self._x_m, C / B)
            c = self._x_d[ip:ip + 2, ik:ik + 2, ib:ib + 2, im:im + 2]
            c = c[0] * (1 - wp) + c[1] * wp
            c = c[0] * (1 - wk) + c[1] * wk
            c = c[0] * (1 - wb) + c[1] * wb
            t += float(c[0] * (1 - wm) + c[1] * wm)
        return t

    def many(self, P, n, S, B, C) -> np.ndarray:
        """`iteration` at many batches at once (NumPy arrays of whole P, n, B), the same
        interpolation vectorised; used for the blocks' power (`report.block_power_w`)."""
        P, n, B = (np.asarray(x, dtype=np.int64) for x in (P, n, B))
        S, C = (np.asarray(x, dtype=np.float64) for x in (S, C))
        if P.size == 0:
            return np.zeros(0)
        if int(P.max()) > self.max_tokens or int(B.max()) > self.max_batch:
            self.max_tokens = max(self.max_tokens, 2 * int(P.max()))
            self.max_batch = max(self.max_batch, 2 * int(B.max()))
            self._build()
        m = C / np.maximum(B, 1)
        # decode-only: exact in B, linear in the mean context
        i, w = _segs(self._d_m, m)
        d_t = self._arrays["d_t"]
        out = np.where(P == 0, d_t[B, i] + w * (d_t[B, i + 1] - d_t[B, i]), 0.0)
        has_p = P > 0
        Pf = P.astype(np.float64)
        out = out + np.where(has_p, self._arrays["p_t"][np.where(has_p, P, 0)], 0.0)
        split = has_p & ((n != 1) | (S != Pf * Pf))
        ip, wp = _segs(self._s_p, Pf)
        i_n, wn = _segs(self._s_n, n.astype(np.float64))
        iu, wu = _segs(self._s_u, np.where(split, S / np.maximum(Pf * Pf, 1.0), 1.0))
        out = out + np.where(split, _multilinear(self._s_d, (ip, i_n, iu), (wp, wn, wu)), 0.0)
        mixed = has_p & (B > 0)
        ik, wk = _segs(self._x_k, n.astype(np.float64))
        ib, wb = _segs(self._x_b, B.astype(np.float64))
        im, wm = _segs(self._x_m, m)
        return out + np.where(mixed, _multilinear(self._x_d, (ip, ik, ib, im), (wp, wk, wb, wm)), 0.0)

    def decode_block(self, B, C, k):
        t0 = self._decode(B, C)
        if k <= 1:
            return t0, 0.0
        t1 = self._decode(B, C + (k - 1) * B)
        return t0, (t1 - t0) / (k - 1)


def _segs(grid, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`GridTiming._seg` at many points: indices i and weights w (extrapolating)."""
    g = np.asarray(grid, dtype=np.float64)
    i = np.clip(np.searchsorted(g, x, side="right") - 1, 0, g.size - 2)
    return i, (x - g[i]) / (g[i + 1] - g[i])


def _multilinear(arr: np.ndarray, idx: tuple, wts: tuple) -> np.ndarray:
    """Multilinear interpolation of `arr` at many points (cell indices `idx`, weights
    `wts`, one array per axis), reducing the axes in order as `GridTiming.iteration`
    does, so the two agree to the last bit."""
    c = np.empty((idx[0].size,) + (2,) * len(idx))
    for bits in np.ndindex(*(2,) * len(idx)):
        c[(slice(None),) + bits] = arr[tuple(i + b for i, b in zip(idx, bits))]
    for w in wts:
        w = w.reshape((-1,) + (1,) * (c.ndim - 2))
        c = c[:, 0] * (1 - w) + c[:, 1] * w
    return c


def cumulative_s(t0: float, dt: float, j: int) -> float:
    """Time of the first j iterations of a block whose i-th (0-based) takes t0 + i dt."""
    return j * t0 + dt * j * (j - 1) * 0.5


def iterations_done(t0: float, dt: float, elapsed: float) -> int:
    """Largest j with cumulative_s(t0, dt, j) <= elapsed (whole iterations finished)."""
    if dt == 0.0:
        return int(elapsed // t0)
    # j t0 + dt j (j-1) / 2 = e  ->  (dt/2) j^2 + (t0 - dt/2) j - e = 0
    a, b = 0.5 * dt, t0 - 0.5 * dt
    disc = b * b + 4 * a * elapsed
    j = int((-b + math.sqrt(max(disc, 0.0))) / (2 * a)) if a != 0 else int(elapsed // t0)
    j = max(j, 0)
    while j > 0 and cumulative_s(t0, dt, j) > elapsed:
        j -= 1
    while cumulative_s(t0, dt, j + 1) <= elapsed:
        j += 1
    return j
