"""Arrays kept on disk next to the compilation cache (`splitwise_jax._array_cache`),
and the simulator's tables read through it (`simulate.timing`)."""

import jax
import numpy as np
import pytest

from splitwise_jax import _array_cache as A


@pytest.fixture
def cache_dir(tmp_path):
    old = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    yield tmp_path
    jax.config.update("jax_compilation_cache_dir", old)


def _builder(calls):
    def build():
        calls.append(1)
        return {"a": np.linspace(0.0, 1.0, 7) ** 0.3, "b": np.arange(6.0).reshape(2, 3)}
    return build


def test_built_once_then_read_back_bit_for_bit(cache_dir):
    calls = []
    first = A.cached_arrays("t", ("x", b"\x01", (3, 4)), _builder(calls))
    again = A.cached_arrays("t", ("x", b"\x01", (3, 4)), _builder(calls))
    assert calls == [1]
    for k in first:
        assert again[k].dtype == first[k].dtype and np.array_equal(again[k], first[k])
    # any key part differing is another entry
    A.cached_arrays("t", ("x", b"\x02", (3, 4)), _builder(calls))
    assert calls == [1, 1]
    assert len(list((cache_dir / "arrays").glob("t-*.npz"))) == 2


def test_without_a_cache_folder_it_always_builds():
    old = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        calls = []
        A.cached_arrays("t", ("y",), _builder(calls))
        A.cached_arrays("t", ("y",), _builder(calls))
        assert calls == [1, 1]
    finally:
        jax.config.update("jax_compilation_cache_dir", old)


def test_a_damaged_file_is_rebuilt(cache_dir):
    calls = []
    A.cached_arrays("t", ("z",), _builder(calls))
    (path,) = (cache_dir / "arrays").glob("t-*.npz")
    path.write_bytes(b"not a zip file")
    out = A.cached_arrays("t", ("z",), _builder(calls))
    assert calls == [1, 1] and np.array_equal(out["b"], np.arange(6.0).reshape(2, 3))


def test_simulator_tables_from_disk_equal_the_built_ones(cache_dir):
    from splitwise_jax.cluster.designs import make_cluster
    from splitwise_jax.simulate import timing as st

    c = make_cluster("splitwise-hh", 4, 2)
    built = st.GridTiming(c.prompt, max_tokens=512, max_batch=32, max_context=2048)
    read = st.GridTiming(c.prompt, max_tokens=512, max_batch=32, max_context=2048)
    assert len(list((cache_dir / "arrays").glob("GridTiming-*.npz"))) == 1
    for name in ("_p_t", "_d_m", "_d_t", "_s_p", "_s_n", "_s_u", "_x_k", "_x_b", "_x_m"):
        assert getattr(read, name) == getattr(built, name)  # the same Python floats
    assert np.array_equal(read._s_d, built._s_d) and np.array_equal(read._x_d, built._x_d)
    # the alone times: a table of every whole prompt size, the same values as the
    # strategy evaluated at the trace's own sizes
    p = np.array([1.0, 17.0, 600.0, 4095.0, 5000.0, 17.0])
    st._ALONE.clear()
    ttft, tbt = st.alone_s(c.alone, p)
    want = st._chunked(st._alone_eval, c.alone, p)
    assert np.array_equal(ttft, want[0]) and np.array_equal(tbt, want[1])
    assert len(list((cache_dir / "arrays").glob("alone-*.npz"))) == 1
