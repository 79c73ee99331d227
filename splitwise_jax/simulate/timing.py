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

The lookups themselves are in `tables` (NumPy only); the classes here add the strategy
that fills and grows them. The strategy interface is reached through `iteration_s` /
`power_w` below, the one place that knows how a strategy is called.
"""

from __future__ import annotations

import inspect

import jax
import numpy as np

from splitwise_jax._batching import map_blocks
from splitwise_jax.simulate.tables import (FastTiming, GridTable, TokenTable, cumulative_s,  # noqa: F401
                                            iterations_done)
from splitwise_jax.specs.batch import Batch

__all__ = ["iteration_s", "power_w", "alone_s", "FastTiming", "TableTiming", "GridTiming", "fast_timing",
           "power_grid", "cumulative_s", "iterations_done"]


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
        t = alone_table(timing, int(top))
        i = p.astype(np.int64)
        return t[0][i], t[1][i]
    return _chunked(_alone_eval, timing, p)


def alone_table(timing, max_prompt: int) -> tuple[np.ndarray, np.ndarray]:
    """(TTFT, TBT) alone at every whole prompt size from 0 to at least `max_prompt` (a
    power of two, at least `_CHUNK` sizes; kept in the process and on disk)."""
    return _alone_table(timing, max(_CHUNK, 1 << int(max_prompt).bit_length()))


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


class TableTiming(TokenTable):
    """Exact lookup of a strategy whose time depends on token counts only
    (`SimTableTiming`): the strategy itself at every whole count (`tables.TokenTable`),
    grown on demand; tables kept on disk as "TableTiming"."""

    def __init__(self, timing, max_tokens: int = 4096, max_batch: int = 512):
        self.timing = timing
        super().__init__(max_tokens, max_batch)

    def _ev(self, P, n, S, B, C) -> np.ndarray:
        return exact_iteration_s(self.timing, P, n, S, B, C)

    def _load(self) -> dict[str, np.ndarray]:
        return _stored("TableTiming", self.timing, (self.max_tokens, self.max_batch), self._tables)


class GridTiming(GridTable):
    """Interpolated grids (`tables.GridTable`) of a strategy's iteration time
    (`quantity="iteration_s"`, the calibrated strategy's fast timing) or per-GPU power
    (`"power_w"`, `power_grid`); tables kept on disk as "GridTiming" / "GridPower"."""

    def __init__(self, timing, max_tokens: int = 4096, max_batch: int = 512, max_context: int = 32768,
                 quantity: str = "iteration_s"):
        if quantity not in _QUANTITIES:
            raise ValueError(f"quantity must be one of {sorted(_QUANTITIES)}, got {quantity!r}")
        self.timing = timing
        self.quantity = quantity
        super().__init__(max_tokens, max_batch, max_context)

    def _ev(self, P, n, S, B, C) -> np.ndarray:
        exact = exact_iteration_s if self.quantity == "iteration_s" else batch_power_w
        return exact(self.timing, P, n, S, B, C)

    def _load(self) -> dict[str, np.ndarray]:
        return _stored(_QUANTITIES[self.quantity], self.timing, self.sizes(), self._tables)


# What a grid tabulates, and the name its tables are kept under on disk.
_QUANTITIES = {"iteration_s": "GridTiming", "power_w": "GridPower"}


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


