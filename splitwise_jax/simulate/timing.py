"""Fast per-iteration timing for the simulator, from the very strategy objects `evaluate` uses.

A simulated run times 10^4-10^5 iterations one at a time, each as soon as the batch is
chosen; a JAX call per iteration costs tens to hundreds of microseconds. So each
machine type's strategy (`splitwise_jax.timing`) is evaluated once, vectorised, on the
batches the run can produce, and the event loop reads Python lists:

* `TableTiming` (any strategy whose time depends only on the batch's token counts, i.e.
  `SimTableTiming`): the strategy itself evaluated at every integer count, one call per
  branch (prompt-only at P tokens, token-only at B requests, mixed at P + B tokens).
  SplitwiseSim times batches of whole tokens, so the lookup is exact: the same function
  at the same arguments, bit for bit (tests/test_simulate.py checks random batches).
* `GridTiming` (any other strategy, i.e. `CalibratedTiming`, whose time also depends on
  prompt count, attention work and decode context): the strategy on grids, one vmapped
  call per grid, then interpolated:
    - prompt-only: every integer prompt-token count P for one prompt (S = P^2, n = 1),
      plus first-order terms in the number of prompts n and the attention work S from
      forward-mode derivatives at the same points;
    - decode-only: every integer batch size B, linear in the mean context C / B on a
      log-spaced grid;
    - mixed: trilinear on (P, B, C / B) with the same first-order terms in n and S.
  The error against the strategy is measured in tests/test_simulate.py on random
  batches (stated there); it is far below the profiles' 1-2 % repeat noise.

Decode blocks. SplitwiseSim runs a token-only batch as one block of k iterations timed
once at its start. With a context-dependent model each iteration is longer than the
last; `decode_block` returns the first iteration's time and the per-iteration increment
(the linear interpolant between the first and last iteration of the block), which the
engine sums exactly. For the table strategy the increment is zero: the reference's rule.

The strategy interface is reached through `iteration_s` / `power_w` below, the one place
that knows how a strategy is called.
"""

from __future__ import annotations

import bisect
import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np

from splitwise_jax.batch import Batch

__all__ = ["iteration_s", "power_w", "alone_s", "FastTiming", "TableTiming", "GridTiming", "fast_timing"]


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
        timing: a phase-timing strategy (`splitwise_jax.timing`).
        P: prompt tokens; n: prompts; S: sum of squared prompt lengths (tokens^2);
        B: decoding requests; C: sum of their context lengths (tokens).
    """
    return _call(timing.iteration_s, P, n, S, B, C)


def power_w(timing, P, n, S, B, C):
    """Per-GPU power (W) of a strategy for the same batches as `iteration_s`."""
    return _call(timing.power_w, P, n, S, B, C)


def alone_s(timing, prompt_tokens):
    """(TTFT, TBT) of each request alone on the strategy's machine (the slowdown reference)."""
    p = jnp.asarray(prompt_tokens, dtype=float)
    a, b = timing.alone_s(p, p * p)
    return np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)


def _is_table(timing) -> bool:
    # SimTableTiming: time depends on (prompt tokens, decode requests) only.
    return hasattr(timing, "table") and hasattr(timing, "power_model")


@jax.jit
def _grid_eval(timing, P, n, S, B, C):
    """Latency and its derivatives in n and S at grid points (one compiled call)."""
    def f(n_, S_):
        return iteration_s(timing, P, n_, S_, B, C)

    t = f(n, S)
    dn = jax.jvp(lambda x: f(x, S), (n,), (jnp.ones_like(n),))[1]
    dS = jax.jvp(lambda x: f(n, x), (S,), (jnp.ones_like(S),))[1]
    return t, dn, dS


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
    from splitwise_jax.designs import uniform_names
    return uniform_names(timing)


def _chunked(fn, timing, *arrays) -> tuple[np.ndarray, ...]:
    """Evaluate a jitted fn(timing, P, n, S, B, C) on flat float64 arrays, chunk by chunk."""
    flat = [np.ravel(np.asarray(a, dtype=np.float64)) for a in arrays]
    m = flat[0].size
    timing = _uniform(timing)
    outs = None
    for lo in range(0, max(m, 1), _CHUNK):
        part = []
        for a in flat:
            chunk = np.full(_CHUNK, a[lo] if m else 0.0)
            seg = a[lo:lo + _CHUNK]
            chunk[: seg.size] = seg
            part.append(jnp.asarray(chunk))
        res = fn(timing, *part)
        res = res if isinstance(res, tuple) else (res,)
        if outs is None:
            outs = [[] for _ in res]
        for acc, r in zip(outs, res):
            acc.append(np.asarray(r, dtype=np.float64))
    return tuple(np.concatenate(acc)[:m] for acc in outs)


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
        self._prompt: list[float] = []
        self._mixed: list[float] = []
        self._token: list[float] = []
        self._extend_tokens(max_tokens)
        self._extend_batch(max_batch)

    def _extend_tokens(self, hi: int) -> None:
        lo = len(self._prompt)
        if hi < lo:
            return
        x = np.arange(lo, hi + 1, dtype=np.float64)
        z, one = np.zeros_like(x), np.ones_like(x)
        # prompt-only: x tokens in one prompt; mixed: x - 1 prompt tokens and one decode.
        self._prompt += exact_iteration_s(self.timing, x, one, x * x, z, z).tolist()
        self._mixed += exact_iteration_s(self.timing, np.maximum(x - 1, 0), one, x * x, one, x).tolist()

    def _extend_batch(self, hi: int) -> None:
        lo = len(self._token)
        if hi < lo:
            return
        x = np.arange(lo, hi + 1, dtype=np.float64)
        z = np.zeros_like(x)
        self._token += exact_iteration_s(self.timing, z, z, z, x, x * 1000.0).tolist()

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


class GridTiming(FastTiming):
    """Interpolated tables of any strategy (CalibratedTiming); see the module docstring.

    Args:
        timing: the strategy.
        max_tokens: largest prompt tokens of one iteration to tabulate exactly.
        max_batch: largest decode batch to tabulate exactly.
        max_context: largest context of one request (prompt + output tokens).
    """

    # Grid sizes: chosen so the interpolation error on random batches stays < 0.3 %
    # (tests/test_simulate.py measures it); larger grids cost compile and setup time.
    CTX_POINTS = 48
    MIX_P_POINTS = 40
    MIX_B_POINTS = 20
    MIX_M_POINTS = 16

    def __init__(self, timing, max_tokens: int = 4096, max_batch: int = 512, max_context: int = 32768):
        self.timing = timing
        self.max_tokens = int(max_tokens)
        self.max_batch = int(max_batch)
        self.max_context = int(max(max_context, 64))
        self._build()

    def _build(self) -> None:
        Pmax, Bmax, Mmax = self.max_tokens, self.max_batch, self.max_context
        # prompt-only, every integer P
        x = np.arange(0, Pmax + 1, dtype=np.float64)
        one, z = np.ones_like(x), np.zeros_like(x)
        t, dn, dS = self._grid(x, one, x * x, z, z)
        self._p_t, self._p_dn, self._p_dS = t.tolist(), dn.tolist(), dS.tolist()
        # decode-only, every integer B x log grid of mean context
        m = np.geomspace(1.0, Mmax * 1.05, self.CTX_POINTS)
        b = np.arange(0, Bmax + 1, dtype=np.float64)
        bb, mm = np.meshgrid(b, m, indexing="ij")
        zz = np.zeros_like(bb)
        t = self._grid(zz, zz, zz, bb, bb * mm)[0].reshape(bb.shape)
        self._d_m = m.tolist()
        self._d_t = [row.tolist() for row in t]
        # mixed: trilinear over (P, B, m) with n = 1, S = P^2 and first-order terms
        gp = np.unique(np.concatenate([[1.0], np.round(np.geomspace(1, Pmax, self.MIX_P_POINTS))]))
        gb = np.unique(np.concatenate([[1.0], np.round(np.geomspace(1, Bmax, self.MIX_B_POINTS))]))
        gm = np.geomspace(1.0, Mmax * 1.05, self.MIX_M_POINTS)
        P3, B3, M3 = np.meshgrid(gp, gb, gm, indexing="ij")
        t, dn, dS = self._grid(P3, np.ones_like(P3), P3 * P3, B3, B3 * M3)
        shape = P3.shape
        self._x_p, self._x_b, self._x_m = gp.tolist(), gb.tolist(), gm.tolist()
        self._x_t = t.reshape(shape)
        self._x_dn = dn.reshape(shape)
        self._x_dS = dS.reshape(shape)

    def _grid(self, P, n, S, B, C):
        shape = np.shape(P)
        return tuple(o.reshape(shape) for o in _chunked(_grid_eval, self.timing, P, n, S, B, C))

    @staticmethod
    def _seg(grid: list, x: float) -> tuple[int, float]:
        """Index i and weight w so that x = (1 - w) grid[i] + w grid[i + 1] (extrapolating)."""
        i = bisect.bisect_right(grid, x) - 1
        i = 0 if i < 0 else (len(grid) - 2 if i > len(grid) - 2 else i)
        x0, x1 = grid[i], grid[i + 1]
        return i, (x - x0) / (x1 - x0)

    def _decode(self, B: int, C: float) -> float:
        if B > self.max_batch:
            self.max_batch = 2 * B
            self._build()
        row = self._d_t[B]
        i, w = self._seg(self._d_m, C / B)
        return row[i] + w * (row[i + 1] - row[i])

    def iteration(self, P, n, S, B, C):
        if B == 0:
            if P > self.max_tokens:
                self.max_tokens = 2 * P
                self._build()
            return self._p_t[P] + self._p_dn[P] * (n - 1) + self._p_dS[P] * (S - P * P)
        if P == 0:
            return self._decode(B, C)
        ip, wp = self._seg(self._x_p, P)
        ib, wb = self._seg(self._x_b, B)
        im, wm = self._seg(self._x_m, C / B)
        out = 0.0
        for arr, scale in ((self._x_t, 1.0), (self._x_dn, n - 1), (self._x_dS, S - P * P)):
            if scale == 0.0:
                continue
            c = arr[ip:ip + 2, ib:ib + 2, im:im + 2]
            c = c[0] * (1 - wp) + c[1] * wp
            c = c[0] * (1 - wb) + c[1] * wb
            out += scale * float(c[0] * (1 - wm) + c[1] * wm)
        return out

    def decode_block(self, B, C, k):
        t0 = self._decode(B, C)
        if k <= 1:
            return t0, 0.0
        t1 = self._decode(B, C + (k - 1) * B)
        return t0, (t1 - t0) / (k - 1)


def fast_timing(timing, *, max_tokens: int = 4096, max_batch: int = 512, max_context: int = 32768) -> FastTiming:
    """The fast timing of a strategy: exact lookup for the sim table, grids otherwise."""
    if _is_table(timing):
        return TableTiming(timing, max_tokens, max_batch)
    return GridTiming(timing, max_tokens, max_batch, max_context)


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
