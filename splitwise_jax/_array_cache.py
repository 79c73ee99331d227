"""Arrays a compiled program computed, kept on disk next to the compilation cache.

The simulator reads its iteration times from tables of the phase model evaluated at
~10^5 batches (`simulate.timing`). Building them in a fresh process traces and loads
a program per strategy and runs it (0.4-0.7 s of a warm `simulate` on the 2-core
machine, docs/speed.md), while the persistent compilation cache only saves the
compilation. The tables are a pure function of the strategy's values and structure,
the table sizes and the code, so a CLI run keeps them here (one `.npz` per key) and a
later run with the same key reads them back: the very arrays, bit for bit.

The key is everything the values can depend on: the caller's name and key parts (the
strategy's tree structure and leaf bytes, the sizes), the x64 flag, the backend, the
JAX version, `XLA_FLAGS` (code generation can move the last bits of a transcendental),
and a digest of every file of this package. Active only when a CLI has turned the
compilation cache on (`_cli.enable_cache`), like `_exported`; library calls build the
arrays every time (the simulator keeps them in memory for the process). A file that
cannot be read or written is rebuilt or skipped, never an error.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from splitwise_jax._exported import cache_folder, package_digest

_FOLDER = "arrays"


def _folder() -> Path | None:
    return cache_folder(_FOLDER)


def _key(name: str, parts: tuple) -> str:
    h = hashlib.sha256()
    for part in (name, *parts, str(jax.config.jax_enable_x64), jax.default_backend(), jax.__version__,
                 os.environ.get("XLA_FLAGS", ""), package_digest()):
        h.update(part if isinstance(part, bytes) else repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()[:40]


def cached_arrays(name: str, parts: tuple, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """`build()` (a dict of arrays), or the same arrays read from disk for this key.

    Args:
        name: what is built (part of the key and of the file name), e.g. "GridTiming".
        parts: what the arrays depend on besides the code (bytes, or values with a
            faithful `repr`).
        build: computes the arrays.
    """
    folder = _folder()
    if folder is None:
        return build()
    path = folder / f"{name}-{_key(name, parts)}.npz"
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception:  # noqa: BLE001 - absent, truncated or foreign: build it (never worse than no cache)
        pass
    out = build()
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in out.items()})
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(buf.getvalue())
        tmp.replace(path)  # atomic: a concurrent reader sees all of it or none
    except OSError:
        pass
    return out
