"""Tests for splitwise_jax.phases.sim_table: SplitwiseSim's interpolated phase table in JAX."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from conftest import needs_shared
from jax.test_util import check_grads

from splitwise_jax.phases.profiles import SERIES_KEYS, load_profiles
from splitwise_jax.phases.sim_table import (
    MIXED_BATCH_FACTOR,
    SimTable,
    interp_baseline_predict,
    iteration_time_s,
    mixed_time_s,
    prompt_time_s,
    token_time_s,
)

# Tolerances: values are float64 (conftest enables x64). The interpolation itself is a
# few flops, so 1e-12 relative is ~1e4 ulp of slack; the smooth floor changes values
# above 28 ms (every knot) by < 1e-15 s.
RTOL = 1e-12


def _toy_table() -> SimTable:
    """Knots at 1, 2, 4 (tokens); prompt 1, 3, 4 s; token 2, 2, 1 s."""
    f = lambda v: jnp.asarray(v, dtype=jnp.float64)  # noqa: E731
    return SimTable(
        prompt_x=f([1.0, 2.0, 4.0]), prompt_s=f([1.0, 3.0, 4.0]),
        token_x=f([1.0, 2.0, 4.0]), token_s=f([2.0, 2.0, 1.0]),
    )


# --------------------------------------------------------------------------------------
# Synthetic table (no shared data)


def test_toy_interpolation_and_extrapolation():
    t = _toy_table()
    x = jnp.array([0.0, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    # Below 1: line through (1,1),(2,3); above 4: line through (2,3),(4,4).
    expected = np.array([-1.0, 1.0, 2.0, 3.0, 3.5, 4.0, 5.0])
    got = np.asarray(prompt_time_s(t, x, temperature_s=1e-3))
    pos = expected > 0
    np.testing.assert_allclose(got[pos], expected[pos], rtol=RTOL)
    assert got[0] > 0  # the extrapolated -1 s is floored smoothly, not returned


def test_smooth_floor_is_positive_with_finite_gradient():
    t = _toy_table()
    # The token curve falls 0.5 s per token after x=2, crossing zero at x=6.
    xs = jnp.array([5.0, 5.999, 6.0, 6.001, 7.0, 50.0])
    y = token_time_s(t, xs)
    g = jax.vmap(jax.grad(lambda x: token_time_s(t, x)))(xs)
    assert np.all(np.asarray(y) > 0) and np.all(np.isfinite(np.asarray(g)))
    # At the zero crossing the floor is T ln 2 (T = 1 ms).
    assert float(token_time_s(t, 6.0)) == pytest.approx(1e-3 * np.log(2), rel=1e-12)
    # Far below zero it decays like 2 (T ln 2)^2 / |y| instead of underflowing to 0.
    a = 1e-3 * np.log(2)
    assert float(token_time_s(t, 50.0)) == pytest.approx(a / (1 + 22.0 / (2 * a)), rel=1e-12)
    assert float(token_time_s(t, 1e12)) > 0
    # 40 T above zero the floor is invisible at float64 precision: identical to a floor
    # a million times colder (T = 1 ns).
    x = 6.0 - 0.08
    assert float(token_time_s(t, x)) == float(token_time_s(t, x, temperature_s=1e-9))
    assert float(token_time_s(t, x)) == pytest.approx(0.04, rel=1e-13)


def test_mixed_is_1p1_times_prompt_curve_at_total_tokens():
    t = _toy_table()
    got = mixed_time_s(t, 1.0, 1.0)
    assert MIXED_BATCH_FACTOR == 1.1
    assert float(got) == pytest.approx(1.1 * float(prompt_time_s(t, 2.0)), rel=RTOL)  # 1.1 * 3 s


def test_iteration_time_dispatch():
    t = _toy_table()
    np.testing.assert_allclose(iteration_time_s(t, 3.0, 0.0), prompt_time_s(t, 3.0), rtol=RTOL)
    np.testing.assert_allclose(iteration_time_s(t, 0.0, 3.0), token_time_s(t, 3.0), rtol=RTOL)
    np.testing.assert_allclose(iteration_time_s(t, 2.0, 1.0), mixed_time_s(t, 2.0, 1.0), rtol=RTOL)
    grads = jax.grad(lambda p, d: iteration_time_s(t, p, d), argnums=(0, 1))(2.0, 1.0)
    assert all(np.isfinite(float(g)) for g in grads)


def test_integer_inputs_are_accepted():
    t = _toy_table()
    assert float(token_time_s(t, 2)) == 2.0
    assert float(prompt_time_s(t, jnp.array(2, dtype=jnp.int32))) == 3.0


def test_pytree_roundtrip_and_grad_wrt_table():
    t = _toy_table()
    leaves, treedef = jax.tree_util.tree_flatten(t)
    assert len(leaves) == 4
    t2 = jax.tree_util.tree_unflatten(treedef, leaves)
    assert isinstance(t2, SimTable)
    # d/dprompt_s of the value at x=1.5 is the hat weights (0.5, 0.5, 0).
    g = jax.grad(lambda tab: prompt_time_s(tab, 1.5))(t)
    np.testing.assert_allclose(g.prompt_s, [0.5, 0.5, 0.0], rtol=RTOL)
    np.testing.assert_allclose(g.token_s, [0.0, 0.0, 0.0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.prompt_s = jnp.zeros(3)


# --------------------------------------------------------------------------------------
# The shipped profiles


@pytest.fixture(scope="module")
def profiles():
    return load_profiles()


@pytest.fixture(scope="module")
def bloom_a100(profiles):
    return SimTable.from_profiles(profiles, "bloom-176b", "a100-80gb", 8)


def _series(profiles, model, hardware, tp):
    s = profiles[(profiles["model"] == model) & (profiles["hardware"] == hardware) & (profiles["tensor_parallel"] == tp)]
    return s.groupby("batch_tokens")[["prompt_time", "token_time"]].median()


@needs_shared
def test_bloom_a100_prompt_knot_at_2048(profiles, bloom_a100):
    # SplitwiseSim groups ALL rows of the series by batch tokens: at 2,048 that is the five
    # 2048x1 rows and the five 512x4 rows, whose median is 536.06 ms. (The 2048x1 rows
    # alone have median 540.41 ms; that is the per-configuration median, not the knot.)
    rows = profiles[(profiles["model"] == "bloom-176b") & (profiles["hardware"] == "a100-80gb")
                    & (profiles["batch_tokens"] == 2048)]
    assert len(rows) == 10
    got_ms = 1000 * float(prompt_time_s(bloom_a100, 2048.0))
    assert got_ms == pytest.approx(rows["prompt_time"].median(), rel=RTOL)
    assert got_ms == pytest.approx(536.0554573, abs=1e-6)


@needs_shared
@pytest.mark.parametrize("model, hardware, tp", [
    ("bloom-176b", "a100-80gb", 8), ("bloom-176b", "h100-80gb", 8), ("bloom-176b", "h100-80gb-pcap", 8),
    ("llama2-70b", "a100-80gb", 2), ("llama2-70b", "h100-80gb", 4), ("llama2-70b", "h100-80gb-pcap", 8),
])
def test_table_reproduces_medians_at_every_knot(profiles, model, hardware, tp):
    table = SimTable.from_profiles(profiles, model, hardware, tp)
    med = _series(profiles, model, hardware, tp)
    x = jnp.asarray(med.index.to_numpy(dtype=np.float64))
    np.testing.assert_array_equal(np.asarray(table.prompt_x), med.index.to_numpy())
    np.testing.assert_allclose(1000 * np.asarray(prompt_time_s(table, x)), med["prompt_time"], rtol=RTOL)
    np.testing.assert_allclose(1000 * np.asarray(token_time_s(table, x)), med["token_time"], rtol=RTOL)


@needs_shared
def test_matches_scipy_interp1d_extrapolate(profiles):
    # SplitwiseSim's predictor is interp1d(x, y, fill_value="extrapolate").
    interp1d = pytest.importorskip("scipy.interpolate").interp1d
    table = SimTable.from_profiles(profiles, "llama2-70b", "h100-80gb", 8)
    med = _series(profiles, "llama2-70b", "h100-80gb", 8)
    xs = np.array([1, 17, 100, 128, 200, 513, 3000, 8192, 20000, 32768, 40000, 100000], dtype=np.float64)
    for col, fn in (("prompt_time", prompt_time_s), ("token_time", token_time_s)):
        ref = interp1d(med.index.to_numpy(dtype=np.float64), med[col].to_numpy() / 1000, fill_value="extrapolate")(xs)
        np.testing.assert_allclose(np.asarray(fn(table, jnp.asarray(xs))), ref, rtol=RTOL)


@needs_shared
def test_extrapolation_is_linear_at_both_ends(bloom_a100):
    t = bloom_a100
    x_hi = jnp.array([32768.0, 40000.0, 50000.0, 65536.0])
    x_lo = jnp.array([128.0, 100.0, 64.0, 1.0])
    for fn, xk, yk in ((prompt_time_s, t.prompt_x, t.prompt_s), (token_time_s, t.token_x, t.token_s)):
        hi_slope = (yk[-1] - yk[-2]) / (xk[-1] - xk[-2])
        lo_slope = (yk[1] - yk[0]) / (xk[1] - xk[0])
        np.testing.assert_allclose(fn(t, x_hi), yk[-1] + hi_slope * (x_hi - xk[-1]), rtol=RTOL)
        np.testing.assert_allclose(fn(t, x_lo), yk[0] + lo_slope * (x_lo - xk[0]), rtol=RTOL)
        # constant derivative beyond the ends
        g = jax.vmap(jax.grad(lambda x: fn(t, x)))
        np.testing.assert_allclose(g(x_hi[1:]), hi_slope, rtol=1e-10)
        np.testing.assert_allclose(g(x_lo[1:]), lo_slope, rtol=1e-10)


@needs_shared
def test_artefact_series_extrapolates_negative_but_stays_positive(profiles):
    # llama2-70b TP2 a100: the 32,768-token knot (the flagged artefact) is ~8x below the
    # 16,384 one, so the continued line crosses zero near 35k tokens. The simulator
    # would assert; we return a small positive time with a finite gradient.
    t = SimTable.from_profiles(profiles, "llama2-70b", "a100-80gb", 2)
    xs = jnp.array([33000.0, 35000.0, 40000.0, 1e6])
    y = prompt_time_s(t, xs)
    g = jax.vmap(jax.grad(lambda x: prompt_time_s(t, x)))(xs)
    assert np.all(np.asarray(y) > 0) and np.all(np.isfinite(np.asarray(g)))
    assert float(y[-1]) < 1e-6  # ~1e-6 s at a line value of -190 s


@needs_shared
def test_gradients_finite_at_knots_and_between(bloom_a100):
    t = bloom_a100
    knots = t.prompt_x
    mids = 0.5 * (knots[1:] + knots[:-1])
    xs = jnp.concatenate([knots, mids, jnp.array([1.0, 1e5])])
    for fn in (prompt_time_s, token_time_s):
        g = jax.vmap(jax.grad(lambda x: fn(t, x)))(xs)
        assert np.all(np.isfinite(np.asarray(g)))
        gt = jax.vmap(jax.grad(lambda tab, x: fn(tab, x)), in_axes=(None, 0))(t, xs)
        for leaf in jax.tree_util.tree_leaves(gt):
            assert np.all(np.isfinite(np.asarray(leaf)))
    # At an interior knot the derivative is the slope of the segment to its right.
    k = 3
    right = (t.prompt_s[k + 1] - t.prompt_s[k]) / (t.prompt_x[k + 1] - t.prompt_x[k])
    assert float(jax.grad(lambda x: prompt_time_s(t, x))(knots[k])) == pytest.approx(float(right), rel=1e-10)
    # Between knots the gradient agrees with finite differences, in x and in the table.
    # (eps is 1 token on a ~1e3-token segment: the function is linear there, so the
    # central difference is exact up to rounding; check_grads' default tolerances apply.)
    for x in mids[:4]:
        check_grads(lambda x_: prompt_time_s(t, x_), (x,), order=2, modes=("fwd", "rev"), eps=1.0)
        check_grads(lambda tab: token_time_s(tab, x), (t,), order=1, modes=("rev",), eps=1e-6)


@needs_shared
def test_jit_equals_nonjit(bloom_a100):
    t = bloom_a100
    xs = jnp.array([1.0, 77.0, 128.0, 700.0, 2048.0, 9000.0, 32768.0, 50000.0])
    for fn in (prompt_time_s, token_time_s):
        np.testing.assert_allclose(jax.jit(fn)(t, xs), fn(t, xs), rtol=RTOL)
    f = lambda tab, p, d: mixed_time_s(tab, p, d)  # noqa: E731
    np.testing.assert_allclose(jax.jit(f)(t, xs, 3.0), f(t, xs, 3.0), rtol=RTOL)
    g = lambda tab, p, d: iteration_time_s(tab, p, d)  # noqa: E731
    np.testing.assert_allclose(jax.jit(g)(t, xs, xs[::-1] - 1.0), g(t, xs, xs[::-1] - 1.0), rtol=RTOL)


@needs_shared
def test_vmap_shapes(profiles, bloom_a100):
    t = bloom_a100
    xs = jnp.linspace(1.0, 40000.0, 7)
    assert jax.vmap(lambda x: prompt_time_s(t, x))(xs).shape == (7,)
    assert jax.vmap(lambda x: token_time_s(t, x))(xs).shape == (7,)
    assert prompt_time_s(t, xs.reshape(7, 1) + xs.reshape(1, 7)).shape == (7, 7)
    assert jax.vmap(lambda p, d: mixed_time_s(t, p, d), in_axes=(0, None))(xs, 5.0).shape == (7,)
    # Stack tables of equal knot count (bloom on the three hardware kinds) and vmap over them.
    tables = [SimTable.from_profiles(profiles, "bloom-176b", hw, 8) for hw in ("a100-80gb", "h100-80gb", "h100-80gb-pcap")]
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *tables)
    out = jax.vmap(prompt_time_s, in_axes=(0, None))(stacked, xs)
    assert out.shape == (3, 7)
    np.testing.assert_allclose(out[1], prompt_time_s(tables[1], xs), rtol=RTOL)
    # pcap prompt times are exactly 1.3x the uncapped H100's in the file.
    np.testing.assert_allclose(tables[2].prompt_s, 1.3 * tables[1].prompt_s, rtol=1e-12)


@needs_shared
def test_unknown_series_raise_listing_accepted_values(profiles):
    with pytest.raises(ValueError, match=r"unknown model 'gpt-4'.*\['bloom-176b', 'llama2-70b'\]"):
        SimTable.from_profiles(profiles, "gpt-4", "a100-80gb")
    with pytest.raises(ValueError, match=r"unknown hardware 'v100'.*'a100-80gb', 'h100-80gb', 'h100-80gb-pcap'"):
        SimTable.from_profiles(profiles, "bloom-176b", "v100")
    with pytest.raises(ValueError, match=r"tensor_parallel=4 .*'bloom-176b'.*\[8\]"):
        SimTable.from_profiles(profiles, "bloom-176b", "a100-80gb", 4)


@needs_shared
def test_from_path_and_default_path(profiles):
    from splitwise_jax._paths import profiles_csv

    a = SimTable.from_profiles(profiles_csv(), "llama2-70b", "a100-80gb", 4)
    b = SimTable.from_profiles(None, "llama2-70b", "a100-80gb", 4)
    c = SimTable.from_profiles(pd.read_csv(profiles_csv()), "llama2-70b", "a100-80gb", 4)  # raw table
    for other in (b, c):
        for la, lo in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(other)):
            np.testing.assert_array_equal(la, lo)


@needs_shared
def test_interp_baseline_with_all_rows_is_the_sim_table(profiles):
    query = profiles.drop_duplicates(subset=["model", "hardware", "tensor_parallel", "batch_tokens"])
    pred = interp_baseline_predict(profiles, query)
    assert list(pred.columns) == ["prompt_time", "token_time"] and pred.index.equals(query.index)
    for key, q in query.groupby(list(SERIES_KEYS)):
        t = SimTable.from_profiles(profiles, *key)
        x = jnp.asarray(q["batch_tokens"].to_numpy(dtype=np.float64))
        np.testing.assert_allclose(pred.loc[q.index, "prompt_time"], 1000 * np.asarray(prompt_time_s(t, x)), rtol=RTOL)
        np.testing.assert_allclose(pred.loc[q.index, "token_time"], 1000 * np.asarray(token_time_s(t, x)), rtol=RTOL)


@needs_shared
def test_interp_baseline_held_out_level(profiles):
    # Hold out batch tokens 4096 of bloom/a100: prediction = line between the 2048 and 8192 medians.
    series = profiles[(profiles["model"] == "bloom-176b") & (profiles["hardware"] == "a100-80gb")]
    held = series["batch_tokens"] == 4096
    pred = interp_baseline_predict(series[~held], series[held])
    med = series[~held].groupby("batch_tokens")["prompt_time"].median()
    expected = med[2048] + (4096 - 2048) / (8192 - 2048) * (med[8192] - med[2048])
    np.testing.assert_allclose(pred["prompt_time"], expected, rtol=RTOL)
    other = profiles[(profiles["model"] == "bloom-176b") & (profiles["hardware"] == "h100-80gb")]
    with pytest.raises(ValueError, match="unknown hardware 'h100-80gb'.*\\['a100-80gb'\\]"):
        interp_baseline_predict(series, other)
    with pytest.raises(ValueError, match="query_df lacks"):
        interp_baseline_predict(series, series.drop(columns="batch_size"))
