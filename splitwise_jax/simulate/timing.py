"""Fast per-iteration timing for the simulator, from the very strategy objects `evaluate` uses.

A simulated run times 10^4-10^5 iterations one at a time, each as soon as the batch is
chosen; a JAX call per iteration costs tens to hundreds of microseconds. So each
machine type's strategy (`splitwise_jax.phases.timing`) is evaluated once, vectorised, on the
batches the run can produce, and the event loop reads Python lists:

* `TableTiming` (any strategy whose time depends only on the batch's token counts, i.e.
  `SimTableTiming`): the strategy itself evaluated at every integer count, one call per
  branch (prompt-only at P tokens, token-only at B requests, mixed at P + B tokens).
  SplitwiseSim times batches of whole tokens, so the lookup is exact: the same function
  at the same arguments, bit for bit (tests/test_simulate.py checks random batches).
* `GridTiming` (any other strategy, i.e. `CalibratedTiming`, whose time also depends on
  prompt count, attention work and decode context): the strategy on grids (one
  compiled call, chunked), then interpolated: exact at one prompt of any whole size and
  at any whole decode batch, with smooth corrections for several prompts and for decodes
  added to prompts (see the class). The error against the strategy is measured in
  tests/test_simulate.py on random batches (stated there); it is far below the
  profiles' 1-2 % repeat noise.

Decode blocks. SplitwiseSim runs a token-only batch as one block of k iterations timed
once at its start. With a context-dependent model each iteration is longer than the
last; `decode_block` returns the first iteration's time and the per-iteration increment
(the linear interpolant between the first and last iteration of the block), which the
engine sums exactly. For the table strategy the increment is zero: the reference's rule.

Tables are built once per process per strategy and size (`fast_timing`), and, when a
command line has turned the persistent compilation cache on, kept on disk next to it
(`splitwise_jax._array_cache`): a warm `python -m splitwise_jax.simulate` reads the very
arrays back instead of tracing, loading and running the strategy's program (~0.4-0.7 s
of a 2-core machine for the calibrated strategy). The slowdown reference (`alone_s`) is
a table of every whole prompt size, kept the same way. Power is read from a grid of
the strategy's power (`power_grid`, `GridTiming.many`), kept the same way, so a run's
blocks need no program either.

The strategy interface is reached through `iteration_s` / `power_w` below, the one place
that knows how a strategy is called.
"""

from __future__ import annotations

import bisect
import inspect
import math

import jax
import numpy as np

from splitwise_jax._batching import map_blocks
from splitwise_jax.specs.batch import Batch

__all__ = ["iteration_s", "power_w", "alone_s", "FastTiming", "TableTiming", "GridTiming", "fast_timing",
           "power_grid"]


# --------------------------------------------------------------------------------------
# The adapter: how a timing strategy is called (one place).


def _takes_batch(method) -> bool:
    params = [p for p in inspect.signature(method).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(params) == 1


def _call(method, P, n, S, B, C):
    if _takes_batch(method):
        return method(Batch(prompt_tokens=P, prompt_seqs=n, prompt_sq_tokens=S, decode_seqs=B, decode_ctx_tokens=C))
    return method(P, S, n, B, C)  # the pre-`Batch` positional order


def iteration_s(timing, P, n, S, B, C):
    """Iteration time (s) of a strategy for batches given field by field (arrays broadcast).

    Args:
        timing: a phase-timing strategy (`splitwise_jax.phases.timing`).
        P: prompt tokens; n: prompts; S: sum of squared prompt lengths (tokens^2);
        B: decoding requests; C: sum of their context lengths (tokens).
    """
    return _call(timing.iteration_s, P, n, S, B, C)


def power_w(timing, P, n, S, B, C):
    """Per-GPU power (W) of a strategy for the same batches as `iteration_s`."""
    return _call(timing.power_w, P, n, S, B, C)


def alone_s(timing, prompt_tokens):
    """(TTFT, TBT) of each request alone on the strategy's machine (the slowdown reference)."""
    p = np.asarray(prompt_tokens, dtype=np.float64)
    if p.size == 0:
        return np.zeros(0), np.zeros(0)
    top = float(p.max())
    if p.min() >= 0 and top <= _ALONE_TABLE_MAX and np.array_equal(p, np.round(p)):
        # Whole prompt sizes (every trace's): read a table of every size up to a power
        # of two, the same values (the strategy is elementwise in the prompt size), kept
        # per strategy in the process and on disk, so that another trace of the same
        # machine type needs no program at all.
        n = max(_CHUNK, 1 << int(top).bit_length())
        t = _alone_table(timing, n)
        i = p.astype(np.int64)
        return t[0][i], t[1][i]
    return _chunked(_alone_eval, timing, p)


# Whole prompt sizes up to this are read from a table (`alone_s`); larger ones evaluated.
_ALONE_TABLE_MAX = 1 << 20
_ALONE: dict = {}


def _alone_table(timing, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT, TBT) alone at every whole prompt size 0 .. n - 1."""
    key = (_fingerprint(timing), n)
    if key not in _ALONE:
        def build():
            ttft, tbt = _chunked(_alone_eval, timing, np.arange(n, dtype=np.float64))
            return {"ttft": ttft, "tbt": tbt}

        t = _stored("alone", timing, n, build)
        if len(_ALONE) >= _CACHE_SIZE:
            _ALONE.pop(next(iter(_ALONE)))
        _ALONE[key] = (t["ttft"], t["tbt"])
    return _ALONE[key]


# Plain `jax.jit`, not `_exported.cached_jit`: tried 2026-12-03, a warm run then skips
# tracing these small programs but lowering an exported call initialises JAX's LAPACK
# (imports scipy.linalg, 0.25-1.9 s), which a simulation does not otherwise pay: the
# set-up was no faster (docs/speed.md §6).
@jax.jit
def _alone_eval(timing, p):
    return timing.alone_s(p, p * p)


def _is_table(timing) -> bool:
    # SimTableTiming: time depends on (prompt tokens, decode requests) only.
    return hasattr(timing, "table") and hasattr(timing, "power_model")


@jax.jit
def _eval(timing, P, n, S, B, C):
    return iteration_s(timing, P, n, S, B, C)


@jax.jit
def _power_eval(timing, P, n, S, B, C):
    return power_w(timing, P, n, S, B, C)


# Batches of points are evaluated in chunks of one fixed length, so each strategy type
# compiles once per process whatever the run's size.
_CHUNK = 4096


def _uniform(timing):
    # Static names (machine, GPU, model) are part of the pytree structure: each distinct
    # name would compile anew. The numbers are what matter here.
    from splitwise_jax.cluster.designs import uniform_names
    return uniform_names(timing)


def _chunked(fn, timing, *arrays) -> tuple[np.ndarray, ...]:
    """Evaluate a jitted fn(timing, P, n, S, B, C) on flat float64 arrays (N > 0
    points; the callers return empty answers for none) in blocks of `_CHUNK` points,
    the last padded (`_batching.map_blocks`: one compiled shape). The strategies' times
    are elementwise in the points, so the padding's values never reach a real point's."""
    flat = [np.ravel(np.asarray(a, dtype=np.float64)) for a in arrays]
    timing = _uniform(timing)
    out = map_blocks(lambda *part: fn(timing, *part), flat, _CHUNK)
    out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
    return tuple(np.asarray(r, dtype=np.float64) for r in out)


def batch_power_w(timing, P, n, S, B, C) -> np.ndarray:
    """Per-GPU power (W) of many iterations (chunked compiled calls)."""
    if np.size(P) == 0:
        return np.zeros(0)
    return _chunked(_power_eval, timing, P, n, S, B, C)[0]


def exact_iteration_s(timing, P, n, S, B, C) -> np.ndarray:
    """The strategy's own iteration time (s) at many batches (chunked compiled calls)."""
    if np.size(P) == 0:
        return np.zeros(0)
    return _chunked(_eval, timing, P, n, S, B, C)[0]


def _stored(name: str, timing, sizes, build) -> dict[str, np.ndarray]:
    """`build()`, tables of a strategy at these sizes; when a CLI has turned the
    compilation cache on, read from disk if an earlier run built the same ones (the
    same arrays: `_array_cache`), so a warm run needs no program for them."""
    from splitwise_jax import _array_cache
    leaves, treedef = jax.tree_util.tree_flatten(timing)
    leaves = [np.asarray(x) for x in leaves]
    parts = (str(treedef), *((x.shape, str(x.dtype), x.tobytes()) for x in leaves), sizes)
    return _array_cache.cached_arrays(name, parts, build)


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


class TableTiming(FastTiming):
    """Exact lookup of a strategy whose time depends on token counts only (SimTableTiming)."""

    uses_context = False

    def __init__(self, timing, max_tokens: int = 4096, max_batch: int = 512):
        self.timing = timing
        self.max_tokens = int(max_tokens)
        self.max_batch = int(max_batch)
        t = _stored("TableTiming", self.timing, (self.max_tokens, self.max_batch), self._tables)
        self._prompt: list[float] = t["prompt"].tolist()
        self._mixed: list[float] = t["mixed"].tolist()
        self._token: list[float] = t["token"].tolist()

    def _tables(self) -> dict[str, np.ndarray]:
        return {**self._token_rows(0, self.max_tokens), "token": self._batch_rows(0, self.max_batch)}

    def _token_rows(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        x = np.arange(lo, hi + 1, dtype=np.float64)
        z, one = np.zeros_like(x), np.ones_like(x)
        # prompt-only: x tokens in one prompt; mixed: x - 1 prompt tokens and one decode.
        return {"prompt": exact_iteration_s(self.timing, x, one, x * x, z, z),
                "mixed": exact_iteration_s(self.timing, np.maximum(x - 1, 0), one, x * x, one, x)}

    def _batch_rows(self, lo: int, hi: int) -> np.ndarray:
        x = np.arange(lo, hi + 1, dtype=np.float64)
        z = np.zeros_like(x)
        return exact_iteration_s(self.timing, z, z, z, x, x * 1000.0)

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


def _log_grid(lo: float, hi: float, n: int) -> np.ndarray:
    return np.unique(np.concatenate([[0.0], np.geomspace(lo, max(hi, lo * 2), n)]))


def _lattice(hi: float, per_doubling: float) -> np.ndarray:
    """Knots 2^(k / per_doubling), k = 0, 1, ..., from 1 to the first at or above `hi`:
    the same knots for every extent (a larger table's knots include a smaller one's)."""
    k = np.arange(0, math.ceil(math.log2(max(hi, 2.0)) * per_doubling - 1e-9) + 1)
    return 2.0 ** (k / per_doubling)


class GridTiming(FastTiming):
    """Interpolated tables of any strategy (CalibratedTiming); see the module docstring.

    The time of an iteration with P prompt tokens in n prompts (attention work S) and B
    decodes (context sum C = B m) is read as

        F1[P] + dPrompt(P, n, S / P^2) + dDecode(P, B, m)

    with F1 the strategy at one prompt of every integer size P (exact for the common
    single-prompt batch), dPrompt the change from splitting P into n prompts (trilinear
    on P x n x S/P^2; n exact up to `N_PROMPTS`, linear beyond) and dDecode the change
    from adding the decodes (4-linear on P x n x B x m, at n equal prompts). Decode-only batches are exact in B
    and linear in m. Both differences are smooth where F1 has its sharp features (GEMM
    efficiency, the all-reduce knee), so coarse grids suffice.

    Args:
        timing: the strategy.
        max_tokens: largest prompt tokens of one iteration to tabulate exactly.
        max_batch: largest decode batch to tabulate exactly.
        max_context: largest context of one request (prompt + output tokens).
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

    def __init__(self, timing, max_tokens: int = 4096, max_batch: int = 512, max_context: int = 32768,
                 quantity: str = "iteration_s"):
        if quantity not in _QUANTITIES:
            raise ValueError(f"quantity must be one of {sorted(_QUANTITIES)}, got {quantity!r}")
        self.timing = timing
        self.quantity = quantity
        self.max_tokens = int(max_tokens)
        self.max_batch = int(max_batch)
        self.max_context = int(max(max_context, 64))
        self._build()

    def _build(self) -> None:
        sizes = ("lattice", self.max_tokens, self.max_batch, self.max_context, self.CTX_PER_DOUBLING,
                 self.P_PER_DOUBLING, self.N_PROMPTS, self.U_POINTS, self.B_PER_DOUBLING, self.M_PER_DOUBLING,
                 self.MIX_PROMPTS)
        t = _stored(_QUANTITIES[self.quantity], self.timing, sizes, self._tables)
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
        exact = exact_iteration_s if self.quantity == "iteration_s" else batch_power_w
        return exact(self.timing, P, n, S, B, C).reshape(shape)

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


# What a grid tabulates, and the name its tables are kept under on disk.
_QUANTITIES = {"iteration_s": "GridTiming", "power_w": "GridPower"}


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


# Built tables by strategy fingerprint: a sweep (the validation study, optimize
# --simulate-top) times the same machine types again and again.
_CACHE: dict = {}
_CACHE_SIZE = 16


def _fingerprint(timing) -> tuple:
    leaves, treedef = jax.tree_util.tree_flatten(timing)
    return (str(treedef), tuple(np.asarray(x).tobytes() for x in leaves))


def fast_timing(timing, *, max_tokens: int = 4096, max_batch: int = 512, max_context: int = 32768) -> FastTiming:
    """The fast timing of a strategy: exact lookup for the sim table, grids otherwise.

    Tables are kept per strategy (its pytree structure and values) and reused when a
    later call needs no larger one; their extents are rounded up to powers of two. A
    table's values do not depend on its extent (the grids' knots lie on fixed lattices),
    so the answer does not depend on which table serves it.
    """
    if _is_table(timing):
        return _cached(("time",), timing, max_tokens, max_batch, max_context,
                       lambda t, b, c: TableTiming(timing, t, b))
    return _cached(("time",), timing, max_tokens, max_batch, max_context,
                   lambda t, b, c: GridTiming(timing, t, b, c))


def power_grid(timing, *, max_tokens: int = 4096, max_batch: int = 512, max_context: int = 32768) -> GridTiming:
    """Per-GPU power (W) of a strategy's iterations on the grids of `GridTiming`
    (`.many` reads many batches at once): the calibrated model's power, which is also
    the sim table's (`SimTableTiming.power_model`). Kept as `fast_timing`'s tables are.

    Until 2026-12-05 each run's blocks were evaluated by a compiled call of the strategy
    (exact, but a program per run: ~0.1-0.25 s of a warm `simulate`, and JAX in every
    process); the grid's error against it is measured in tests/test_simulate.py (median
    under 5e-4, worst under 1 % on random batches).
    """
    source = timing.power_model if _is_table(timing) else timing
    return _cached(("power",), source, max_tokens, max_batch, max_context,
                   lambda t, b, c: GridTiming(source, t, b, c, quantity="power_w"))


def _cached(kind: tuple, timing, max_tokens, max_batch, max_context, make):
    """The table `make(max_tokens, max_batch, max_context)` of a strategy, reused while a
    kept one is at least as large. Extents are rounded up to powers of two: a grid's
    values do not depend on its extent (`_lattice`), so traces of similar sizes share
    one table, in the process and on disk."""
    max_tokens, max_batch, max_context = (1 << (max(int(x), 2) - 1).bit_length()
                                          for x in (max_tokens, max_batch, max_context))
    key = kind + _fingerprint(timing)
    old = _CACHE.get(key)
    if old is not None and old.max_tokens >= max_tokens and old.max_batch >= max_batch and \
            getattr(old, "max_context", max_context) >= max_context:
        return old
    new = make(max_tokens, max_batch, max_context)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = new
    return new


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
