"""Sweeps over many configurations on every device: each core of a CPU, a GPU, or the
devices of several hosts, with the same code.

A sweep applies one per-configuration function (say `evaluate` of a cluster whose pool
sizes and rate come from a row) to N rows. `sweep` lays the rows along a one-axis device
mesh (axis "sweep") and runs `jax.shard_map` over it; each device runs `jax.lax.map`
over its share in blocks of `batch_size` rows (vectorised on an accelerator; one row
at a time on CPU, where that is faster: `default_batch_size`). Rows are padded (with copies
of the last) to fill every device equally and cut off again on return.

Which devices:

* CPU: XLA shows one device per process unless told otherwise, and one device keeps
  one core busy for most of a sweep. `use_cpu_cores()` (before JAX first runs) or
  ``XLA_FLAGS=--xla_force_host_platform_device_count=2`` makes one device per core.
* GPU: `jax.devices()` are the GPUs; nothing to change.
* Several hosts (`jax.distributed`, JAX's own multi-host runtime): start one process
  per host with the same script and call ``jax.distributed.initialize(coordinator,
  num_processes, process_id)`` before anything else (on SLURM or Cloud TPU it reads
  them from the environment). `jax.devices()` then lists every host's devices, the
  mesh spans them, every process passes the same rows (cheap: they are host numpy) and
  every process receives all outputs (`process_allgather`). docs/speed.md has a
  worked example.

Example:
    >>> import jax.numpy as jnp
    >>> from splitwise_jax.sweep import sweep
    >>> out = sweep(lambda row: row * 2.0, jnp.arange(5.0))
    >>> out.tolist()
    [0.0, 2.0, 4.0, 6.0, 8.0]
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from splitwise_jax._batching import pad_rows

AXIS = "sweep"


def use_cpu_cores(n: int | None = None) -> int:
    """Ask for one CPU device per core (or `n`), if JAX has not started yet.

    Returns:
        The number of devices JAX will use: `n` (default: the cores this process may
        use) when the backend was not yet initialised, else what it already has.
    """
    if n is None:
        n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        from jax._src import xla_bridge
        started = xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):  # a future JAX without the private probe: ask the flag
        started = True
    if not started:
        jax.config.update("jax_num_cpu_devices", int(n))
        return int(n)
    return jax.local_device_count()


@functools.lru_cache(maxsize=64)
def _program(fn: Callable, devices: tuple, batch_size: int):
    mesh = Mesh(np.asarray(devices), (AXIS,))

    def local(rows, shared):
        # One row at a time without a vmap of one: `lax.map`'s blocks are vmapped, and a
        # vmapped loop (the model's fixed points, the percentile search's fallback) turns
        # its exits and branches into selects over the block.
        return jax.lax.map(lambda r: fn(r, *shared), rows, batch_size=None if batch_size == 1 else batch_size)

    # check_vma=False: the model's loops start from constants (invariant across devices)
    # and carry per-row values; the check would ask for a pcast in every one of them.
    # Nothing here communicates between devices, so there is nothing for it to verify.
    sharded = jax.shard_map(local, mesh=mesh, in_specs=(PartitionSpec(AXIS), PartitionSpec()),
                            out_specs=PartitionSpec(AXIS), check_vma=False)
    return mesh, jax.jit(sharded)


def _global(x: np.ndarray, sharding: NamedSharding):
    # Every process holds the whole (padded) input; each device takes its block.
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


# Rows per `lax.map` block on an accelerator (vectorised); on CPU one row at a time
# (`default_batch_size`).
ACCELERATOR_BATCH = 16


def default_batch_size(devices: Sequence) -> int:
    """1 when every device is a CPU, else `ACCELERATOR_BATCH`.

    On CPU a vectorised block runs each of the model's inner loops (fixed points, the
    percentile search's extra Newton steps) until its slowest row is done, and its
    table lookups become batched gathers; one row at a time does neither. Measured on
    the 2-core machine, Fig. 12's 39 x 39 grid at full resolution over 2 CPU devices
    (one run each, 2026-12-02): blocks of 16 / 8 / 4 / 2 / 1 rows took 14.7 / 12.8 /
    11.7 / 10.6 / 7.5 s (the optimiser's `assess_batch` maps row by row for the same
    reason). A GPU needs the blocks to fill it."""
    return 1 if all(d.platform == "cpu" for d in devices) else ACCELERATOR_BATCH


def sweep(fn: Callable, rows: Any, shared: Sequence = (), *, batch_size: int | None = None,
          devices: Sequence | None = None) -> Any:
    """Apply ``fn(row, *shared)`` to every row, sharded over all devices.

    Args:
        fn: one configuration -> a pytree of arrays. Pass the same function object on
            every call: the compiled program is cached on it.
        rows: pytree of arrays with a common leading axis N (one entry per
            configuration); host numpy is best (no copy to a default device first).
        shared: arguments every row sees (a workload, a cluster template); replicated
            to every device once, and traced (not baked into the program as constants).
        batch_size: rows each device evaluates at once (`lax.map` blocks); default
            `default_batch_size(devices)`: 1 on CPU, 16 on an accelerator.
        devices: devices to use (default: `jax.devices()`, all hosts' when
            `jax.distributed` is initialised).

    Returns:
        The pytree `fn` returns, each leaf with leading axis N, as numpy arrays on every
        process.

    For a design-space grid, `fn` may evaluate at `SWEEP_RESOLUTION` with float32
    inputs (rows and shared cast to float32, or ``jax.enable_x64(False)``): on the
    Fig. 12 grid 2.4x faster than full resolution in float64, every percentile within
    a median 2e-6 and a largest 1.9 % of it (docs/speed.md §12). Keep full resolution
    for the answers you report.
    """
    devices = tuple(jax.devices() if devices is None else devices)
    leaves, treedef = jax.tree_util.tree_flatten(rows)
    if not leaves:
        raise ValueError("sweep: rows is empty (no arrays)")
    leaves = [np.asarray(a) for a in leaves]
    n = leaves[0].shape[0]
    if n == 0 or any(a.ndim == 0 or a.shape[0] != n for a in leaves):
        raise ValueError(f"sweep: every leaf of rows needs the same leading axis > 0, got shapes "
                         f"{[a.shape for a in leaves]}")
    if batch_size is None:
        batch_size = default_batch_size(devices)
    if batch_size < 1:
        raise ValueError(f"sweep: batch_size must be >= 1, got {batch_size}")
    per_device = -(-n // len(devices))
    block = min(batch_size, per_device)
    per_device = -(-per_device // block) * block
    total = per_device * len(devices)
    padded = [pad_rows(a, total) for a in leaves]

    mesh, program = _program(fn, devices, block)
    row_sharding = NamedSharding(mesh, PartitionSpec(AXIS))
    replicated = NamedSharding(mesh, PartitionSpec())
    rows_g = jax.tree_util.tree_unflatten(treedef, [_global(a, row_sharding) for a in padded])
    shared_g = jax.tree_util.tree_map(lambda a: _global(np.asarray(a), replicated), tuple(shared))
    out = program(rows_g, shared_g)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        out = multihost_utils.process_allgather(out, tiled=True)
    return jax.tree_util.tree_map(lambda a: np.asarray(a)[:n], out)
