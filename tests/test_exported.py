"""Exported programs cached on disk (`splitwise_jax._exported.cached_jit`)."""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from splitwise_jax import _exported as E


class _Out(NamedTuple):
    total: jax.Array
    scaled: jax.Array


TRACES = []


def _model(x, params, steps):
    TRACES.append(steps)  # Python runs only while tracing
    y = x
    for _ in range(steps):
        y = jnp.tanh(y * params["a"] + params["b"])
    return _Out(jnp.sum(y), y * 2.0)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh compilation-cache folder for the test, and no programs remembered."""
    old = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    monkeypatch.setattr(E, "_executables", {})
    monkeypatch.setattr(E, "_pending", {})
    yield tmp_path
    jax.config.update("jax_compilation_cache_dir", old)


def _args():
    return jnp.linspace(-1.0, 1.0, 5), {"a": jnp.asarray(0.7), "b": 0.1}


def test_same_results_as_jit_and_no_tracing_once_exported(cache_dir, monkeypatch):
    f = E.cached_jit(_model, static_argnames=("steps",))
    x, p = _args()
    want = jax.jit(_model, static_argnames=("steps",))(x, p, 3)
    TRACES.clear()
    got = f(x, p, 3)
    assert isinstance(got, _Out)
    np.testing.assert_allclose(got.scaled, want.scaled, rtol=0, atol=0)
    np.testing.assert_allclose(got.total, want.total, rtol=0, atol=0)
    assert len(list((cache_dir / "exported").glob("*.jaxexport"))) == 1
    # A new process: nothing remembered, the program comes from disk; Python does not trace.
    monkeypatch.setattr(E, "_executables", {})
    TRACES.clear()
    again = E.cached_jit(_model, static_argnames=("steps",))(x * 0.5, p, 3)
    assert TRACES == []
    np.testing.assert_allclose(again.scaled, jax.jit(_model, static_argnames=("steps",))(x * 0.5, p, 3).scaled,
                               rtol=0, atol=0)


def test_static_args_and_shapes_key_the_program(cache_dir):
    f = E.cached_jit(_model, static_argnames=("steps",))
    before = f._cache_size()  # jax.jit's own count is shared with other wrappers of _model
    x, p = _args()
    f(x, p, 2)
    f(x, p, 3)
    f(jnp.ones(7), p, 3)
    f(x * 3.0, p, 3)  # new values, same shapes: the same program
    assert len(list((cache_dir / "exported").glob("*.jaxexport"))) == 3
    assert f._cache_size() - before == 3


def test_without_a_cache_folder_it_is_plain_jit(cache_dir, monkeypatch):
    monkeypatch.setattr(E, "_folder", lambda: None)  # as when no CLI turned the cache on
    f = E.cached_jit(_model, static_argnames=("steps",))
    x, p = _args()
    out = f(jnp.ones(11), p, 2)
    assert not (cache_dir / "exported").exists()
    np.testing.assert_allclose(out.total, jax.jit(_model, static_argnames=("steps",))(jnp.ones(11), p, 2).total)


def test_errors_while_building_are_the_functions_own(cache_dir):
    def bad(x):
        raise ValueError("x: not accepted")

    with pytest.raises(ValueError, match="x: not accepted"):
        E.cached_jit(bad)(jnp.ones(2))


def test_package_digest_is_stable():
    assert E.package_digest() == E.package_digest()
    assert len(E.package_digest()) == 64


def test_fresh_and_committed_inputs_share_one_executable(cache_dir):
    """The optimiser's first round gets fresh (uncommitted) arrays, its later rounds the
    previous round's outputs (committed to the device); `Exported.call` keys its wrapper
    on the inputs' placement, so without committing every input first the same program
    compiled twice (docs/speed.md §4: two 2.4 MB executables of the Fig. 12 gradient)."""
    compiles = []

    def listen(name, *_, **__):
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(name)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        f = E.cached_jit(_model, static_argnames=("steps",))
        x, p = _args()
        out = f(x, p, 2)
        first = len(compiles)
        assert first >= 1
        assert not x.committed and out.scaled.committed
        again = f(out.scaled, p, 2)  # an output (committed) back in, same shape and type
        assert len(compiles) == first
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    np.testing.assert_allclose(again.scaled, jax.jit(_model, static_argnames=("steps",))(out.scaled, p, 2).scaled,
                               rtol=0, atol=0)


def test_a_prefetched_program_is_built_once_and_called_without_tracing(cache_dir):
    f = E.cached_jit(_model, static_argnames=("steps",))
    x, p = _args()
    want = jax.jit(_model, static_argnames=("steps",))(x, p, 4)
    TRACES.clear()
    f.prefetch(jnp.zeros(5), p, 4)  # the shapes matter, not the values
    out = f(x, p, 4)  # waits for the prefetch, then calls what it built
    assert TRACES == [4]  # traced once, by the prefetch's export
    assert len(E._executables) == 1 and not E._pending
    np.testing.assert_allclose(out.scaled, want.scaled, rtol=0, atol=0)
    f.prefetch(x, p, 4)  # already built: nothing to do
    assert TRACES == [4] and len(E._executables) == 1


def test_a_failed_prefetch_leaves_the_error_to_the_call(cache_dir):
    def bad(x):
        raise ValueError("x: not accepted")

    g = E.cached_jit(bad)
    g.prefetch(jnp.ones(2))
    with pytest.raises(ValueError, match="x: not accepted"):
        g(jnp.ones(2))


def test_without_a_cache_folder_prefetch_does_nothing(cache_dir, monkeypatch):
    monkeypatch.setattr(E, "_folder", lambda: None)
    E.cached_jit(_model, static_argnames=("steps",)).prefetch(jnp.ones(5), _args()[1], 2)
    assert not E._pending and not E._executables


_OTHER_DEVICE = """
import json, tempfile
import jax, jax.numpy as jnp
jax.config.update("jax_compilation_cache_dir", tempfile.mkdtemp())
from splitwise_jax import _exported as E
f = E.cached_jit(lambda x, k: x * k + 1.0)
x = jax.device_put(jnp.arange(3.0), jax.devices()[1])  # committed to the second device
out = f(x, 2.0)
again = f(jax.device_put(jnp.arange(3.0), jax.devices()[0]), 2.0)
print(json.dumps({"devices": jax.device_count(), "out": out.tolist(), "again": again.tolist(),
                  "programs": len(E._executables)}))
"""


def test_an_input_committed_to_another_device_gets_the_same_answer_and_program():
    """Programs are compiled for the default device; an input committed to another one
    (two CPU devices, in a subprocess: the device count is fixed when JAX starts) gets
    the same answer from the same program (the optimiser's inputs are on one device, but
    a caller's may not be)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"),
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _OTHER_DEVICE], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"devices": 2, "out": [1.0, 3.0, 5.0], "again": [1.0, 3.0, 5.0], "programs": 1}
