"""Exported programs cached on disk, so that a warm CLI run does not trace them again.

JAX's persistent compilation cache skips XLA's compilation on a second run, but not
the tracing and lowering that build the program in the first place: for the Fig. 12
`optimize`, Python builds the optimiser's gradient program in ~7 s and two evaluation
programs in ~3 s each, every run (docs/speed.md §4). `jax.export` serialises a lowered
program (StableHLO, with its input and output structure); `cached_jit` keeps one per
function, static arguments and input shapes next to the compilation cache, and a later
run deserialises it and calls it (its compilation then hits the persistent cache).

The key is everything the program can depend on: the function's name, the static
arguments' values, the inputs' tree structure (with its static metadata: design kind,
names, tensor-parallel degree) and their shapes and dtypes, the x64 flag, the backend,
the JAX version, and a digest of every file of this package (code and shipped data).
The inputs' *values* are not in it: they are the program's arguments. Active only when
a CLI has turned the compilation cache on (`_cli.enable_cache`); library calls (and a
cache folder that cannot be written) use plain `jax.jit`, and so does any call whose
export or load fails.

Each program is compiled ahead of time for its inputs (`jax.jit(exported.call)`,
lowered and compiled once per key, every input committed to JAX's default device) and
remembered. `f.prefetch(*args)` does that in a background thread for inputs shaped like
`args`, so a program the run will need later loads (0.7-1.7 s from the persistent cache)
or compiles (5-20 s) while the run does other work; a call waits for a prefetch of its
own program in flight.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import inspect
import os
import pickle
import threading
from pathlib import Path

import jax
import jax.numpy as jnp

from splitwise_jax._paths import package_digest  # noqa: F401  (part of the keys here and re-exported)

_FOLDER = "exported"
_lock = threading.Lock()
_executables: dict[str, tuple] = {}
_pending: dict[str, threading.Event] = {}


def cache_folder(name: str) -> Path | None:
    """The folder `name` inside JAX's compilation cache folder, created; None where
    there is no cache folder or it cannot be written."""
    base = jax.config.jax_compilation_cache_dir
    if not base:
        return None
    path = Path(base) / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return path


def _folder() -> Path | None:
    return cache_folder(_FOLDER)


def _key(name: str, static: dict, treedef, leaves) -> str:
    h = hashlib.sha256()
    for part in (name, repr(sorted(static.items())), str(treedef),
                 repr([(x.shape, str(x.dtype), bool(getattr(x, "weak_type", False))) for x in leaves]),
                 str(jax.config.jax_enable_x64), jax.default_backend(), jax.__version__, package_digest()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def cached_jit(fn=None, *, static_argnames: tuple[str, ...] = ()):
    """`jax.jit(fn, static_argnames=...)`, whose lowered program is exported to and
    loaded from disk when the persistent compilation cache is on (module docstring).
    Same call signature and results as the jitted function."""
    if fn is None:
        return functools.partial(cached_jit, static_argnames=static_argnames)
    jitted = jax.jit(fn, static_argnames=static_argnames)
    sig = inspect.signature(fn)
    name = f"{fn.__module__}.{fn.__qualname__}"
    keys: set[str] = set()

    def prepare(args, kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        static = {k: v for k, v in bound.arguments.items() if k in static_argnames}
        dynamic = {k: v for k, v in bound.arguments.items() if k not in static_argnames}
        leaves, treedef = jax.tree_util.tree_flatten(dynamic)
        leaves = _committed(leaves)
        return static, treedef, leaves, _key(name, static, treedef, leaves)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        folder = _folder()
        if folder is None:
            return jitted(*args, **kwargs)
        static, treedef, leaves, key = prepare(args, kwargs)
        try:
            compiled, out_tree = _executable(folder, key, name, fn, static, treedef, leaves)
        except Exception:  # noqa: BLE001 - never worse than jit: it traces, and raises what it raises
            return jitted(*args, **kwargs)
        keys.add(key)
        return jax.tree_util.tree_unflatten(out_tree, compiled(*leaves))

    def prefetch(*args, **kwargs):
        """Build or load the program for inputs shaped like these (their values do not
        matter) in a background thread, so that a later call finds it compiled. Loading
        an executable from the persistent cache takes 0.7-1.7 s (XLA rebuilds it from
        its proto) and compiling one 5-20 s, with the GIL released: the optimiser loads
        or compiles its gradient program while its start-point search runs. Nothing
        happens without a cache folder (library use), and a failure is left to the
        call, which then builds the program itself."""
        folder = _folder()
        if folder is None:
            return
        try:
            static, treedef, leaves, key = prepare(args, kwargs)
        except Exception:  # noqa: BLE001 - the call will raise it where it belongs
            return
        with _lock:
            if key in _executables or key in _pending:
                return
            _pending[key] = threading.Event()

        def work():
            try:
                _executable(folder, key, name, fn, static, treedef, leaves, prefetching=True)
            except Exception:  # noqa: BLE001 - see above
                pass
            finally:
                with _lock:
                    _pending.pop(key).set()

        _wait_at_exit()
        threading.Thread(target=work, name=f"prefetch {name}", daemon=True).start()

    call.jitted = jitted
    call.prefetch = prefetch
    # programs built or loaded so far, as `jax.jit`'s own _cache_size() counts them
    call._cache_size = lambda: jitted._cache_size() + len(keys)
    return call


@functools.lru_cache(maxsize=1)
def _wait_at_exit() -> None:
    """Registered once, at the first prefetch: at interpreter exit, wait for the
    prefetches still building (a run that ends before calling a program it prefetched,
    e.g. an infeasible problem whose answer is never checked), so that no compilation
    is cut off while JAX shuts its backend down (JAX's own exit handlers, registered
    earlier, run after this one)."""
    def wait():
        with _lock:
            pending = list(_pending.values())
        for event in pending:
            event.wait()

    atexit.register(wait)


def _committed(leaves: list) -> list:
    """Every input committed to a device: the uncommitted ones (fresh from Python or
    NumPy) to JAX's default device, the committed ones where they are.

    `Exported.call` compiles its wrapper once per input placement, and an uncommitted
    input is a different placement from a committed one on the same device. The
    optimiser's first round gets fresh arrays and every later round the previous
    round's outputs (committed), so the same gradient program was compiled twice (two
    2.4 MB executables in the cache: ~19 s more of a cold Fig. 12 `optimize`, ~1.7 s
    more loading in a warm one)."""
    # Python scalars as `jnp.asarray` types them (weakly); NumPy values and JAX arrays
    # go to the device in one `device_put`, not one dispatched `jnp.asarray` each (~150
    # leaves per call of the optimiser's programs; same types and weak types).
    leaves = [jnp.asarray(x) if isinstance(x, (bool, int, float, complex)) else x for x in leaves]
    fresh = [i for i, x in enumerate(leaves) if not (isinstance(x, jax.Array) and x.committed)]
    if fresh:
        moved = jax.device_put([leaves[i] for i in fresh], jax.devices()[0])
        leaves = list(leaves)
        for i, x in zip(fresh, moved):
            leaves[i] = x
    return leaves


def _executable(folder: Path, key: str, name: str, fn, static: dict, treedef, leaves, prefetching=False):
    """The compiled program for `key` (`jax.jit(exported.call)`, compiled ahead of time
    for these inputs' shapes and placement) and its output structure: remembered, or
    waited for while a prefetch builds it, or built now."""
    with _lock:
        pending = None if prefetching else _pending.get(key)
    if pending is not None:
        pending.wait()  # a prefetch is building it; if it failed, it is built here
    with _lock:
        if key in _executables:
            return _executables[key]
    exp, out_tree = _program(folder, key, name, fn, static, treedef, leaves)
    compiled = jax.jit(exp.call).lower(*leaves).compile()
    with _lock:
        _executables[key] = (compiled, out_tree)
    return compiled, out_tree


def _program(folder: Path, key: str, name: str, fn, static: dict, treedef, leaves):
    """The exported program for `key` and its output structure: read from the folder,
    or traced, exported and written there."""
    path = folder / f"{name.rsplit('.', 1)[-1]}-{key}.jaxexport"
    if path.exists():
        blob, out_tree = pickle.loads(path.read_bytes())
        loaded = (jax.export.deserialize(blob), out_tree)
    else:
        out_trees = []

        def flat(*xs):
            out = fn(**jax.tree_util.tree_unflatten(treedef, list(xs)), **static)
            out_leaves, out_tree = jax.tree_util.tree_flatten(out)
            out_trees.append(out_tree)
            return out_leaves

        exp = jax.export.export(jax.jit(flat))(*leaves)
        loaded = (exp, out_trees[-1])
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_bytes(pickle.dumps((exp.serialize(), out_trees[-1])))
        tmp.replace(path)  # atomic: a concurrent reader sees all of it or none
    return loaded
