"""`sweep.sweep`: rows sharded over devices give the answers of one device.

The two-device case runs in a subprocess: the number of CPU devices is fixed when JAX
starts, so it needs `--xla_force_host_platform_device_count=2` in XLA_FLAGS before
JAX is imported (the same code then uses a GPU, or every host's devices under
`jax.distributed`, unchanged).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from splitwise_jax.sweep import sweep

_TWO_DEVICES = textwrap.dedent("""
    import json, sys
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from splitwise_jax.cluster.cluster import Resolution, evaluate
    from splitwise_jax.cluster.designs import make_cluster
    from splitwise_jax.sweep import sweep
    from splitwise_jax.cluster.workload import coarsen, workload

    res = Resolution(window_points=4, table_points=32, grid_points=12, refine_iters=4, lookup_points=256)

    def fn(row, cluster, wl):
        m = evaluate(cluster.replace(n_prompt=row[0]), wl.with_rate(row[1]), resolution=res)
        return {"q": jnp.stack([m.ttft_s, m.tbt_s, m.e2e_s, m.slowdown_e2e]), "cost": m.cost_per_hour}

    # The baseline design: the smallest program (the sweep, not the model, is under test).
    cluster = make_cluster("baseline-h100", 10.0)
    wl = coarsen(workload("coding", 30.0), 4, 4)
    # 7 rows: not a multiple of the 2 devices, nor of the block, so padding is exercised.
    rows = np.stack([np.array([8.0, 12.0, 20.0, 30.0, 5.0, 16.0, 25.0]),
                     np.array([20.0, 40.0, 60.0, 30.0, 10.0, 80.0, 50.0])], axis=1)
    two = sweep(fn, rows, (cluster, wl), batch_size=2)
    one = sweep(fn, rows, (cluster, wl), batch_size=2, devices=jax.devices()[:1])
    print(json.dumps({"devices": jax.device_count(), "two": two["q"].tolist(), "one": one["q"].tolist(),
                      "cost_two": two["cost"].tolist(), "cost_one": one["cost"].tolist()}))
""")


def test_two_cpu_devices_give_the_one_device_answers():
    """Same rows, same block size, one device or two. The two programs are compiled
    apart (XLA may fuse differently for one device and two), so the CDF values differ
    in the last bits, and at this smoke resolution (4 search steps, short of full
    convergence) the search can stop at points that differ by more than rounding:
    measured 1.6e-6 relative at most; rtol 1e-5. Costs have no search: 1e-12."""
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"),
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _TWO_DEVICES], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 2
    two, one = np.asarray(out["two"]), np.asarray(out["one"])
    assert two.shape == (7, 4, 3)
    assert np.all(np.isfinite(two))
    np.testing.assert_allclose(two, one, rtol=1e-5)
    np.testing.assert_allclose(out["cost_two"], out["cost_one"], rtol=1e-12)


def test_pytrees_padding_and_shared_arguments():
    rows = {"a": np.arange(5.0), "b": np.arange(10.0).reshape(5, 2)}
    out = sweep(lambda r, k: (r["a"] * k, r["b"].sum()), rows, (jnp.asarray(3.0),), batch_size=2)
    np.testing.assert_array_equal(out[0], 3.0 * np.arange(5.0))
    np.testing.assert_array_equal(out[1], np.arange(10.0).reshape(5, 2).sum(axis=1))


@pytest.mark.parametrize("rows, batch_size, match", [
    ({"a": np.zeros(3), "b": np.zeros(4)}, 4, "same leading axis"),
    (np.zeros(0), 4, "same leading axis"),
    ({}, 4, "empty"),
    (np.zeros(3), 0, "batch_size"),
])
def test_bad_rows_are_named(rows, batch_size, match):
    with pytest.raises(ValueError, match=match):
        sweep(lambda r: r, rows, batch_size=batch_size)


def test_default_block_is_one_row_on_cpu_and_a_vector_on_an_accelerator():
    """`default_batch_size`: one row at a time on CPU (measured 2x faster on the Fig. 12
    grid than blocks of 16, docs/speed.md §3), `ACCELERATOR_BATCH` rows when any device
    is not a CPU; the default sweep gives the same rows back."""
    from splitwise_jax.sweep import ACCELERATOR_BATCH, default_batch_size

    class _Gpu:
        platform = "gpu"

    assert default_batch_size(jax.devices("cpu")) == 1
    assert default_batch_size([_Gpu()]) == ACCELERATOR_BATCH
    out = sweep(lambda r: r * 2.0, np.arange(5.0))
    np.testing.assert_array_equal(out, 2.0 * np.arange(5.0))
