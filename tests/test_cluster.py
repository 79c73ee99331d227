"""Tests of the cluster model (cluster.py with pool.py, queueing.py, quantiles.py, designs.py).

Compile time dominates (about 10 s per distinct pytree structure on 2 cores), so the
tests share a few jitted functions: one scalar `evaluate`, one vmapped grid over
(n_prompt, n_token, rate), one value-and-gradient, and the validation study's vmapped
`evaluate` (one compile per design kind for all reference runs).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SHARED, needs_shared, study_module

from splitwise_jax.cluster.batched import evaluate as batched_evaluate
from splitwise_jax.cluster.cluster import ClusterMetrics, Resolution, evaluate
from splitwise_jax.cluster.designs import DESIGNS, make_cluster
from splitwise_jax.cluster.workload import workload

HORIZON_S = 120.0
_evaluate = jax.jit(evaluate)


def _study(name="validate_cluster"):
    """A study script (studies/<name>.py), imported by path."""
    return study_module(name)


def _all_finite(m: ClusterMetrics) -> bool:
    return all(bool(jnp.all(jnp.isfinite(jnp.asarray(leaf, float)))) for leaf in m)


@pytest.fixture(scope="session")
def hh():
    """Splitwise-HH with the calibrated phase model: the design to differentiate."""
    return make_cluster("splitwise-hh", 30.0, 10.0)


@pytest.fixture(scope="session")
def coding():
    return workload("coding", 50.0)


# ---------------------------------------------------------------------------------------
# Accuracy against the reference simulator (GitHub issue 4)
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def sim_table_validation():
    vc = _study()
    # Poisson runs of both reference files; the four real-arrival replays compile one
    # windowed program each (~1 min apiece on 2 cores) and are left to the study.
    runs = vc.load_runs()
    runs = runs[runs["trace"] == ""].reset_index(drop=True)
    return vc, vc.compare(runs, vc.predict(runs, "splitwise-sim-table"), "splitwise-sim-table")


# Median |relative error| of each percentile over the 120 Poisson reference runs with
# SplitwiseSim's own phase table, measured 2026-12-04 (this test's fixture; docs/
# validation.md has the same figures over all 124 runs), and SLO verdict agreement
# (118 / 120). Issue 4's goal was 10% at P50 and 20% at P90/P99 with 90% agreement, and
# issue 10's 5% / 10% / 95%; the model has been inside both since 2026-12-02.
ACCURACY_TODAY = {"ttft_p50": 0.0361, "tbt_p50": 0.0128, "e2e_p50": 0.0266,
                  "ttft_p90": 0.0477, "tbt_p90": 0.0343, "e2e_p90": 0.0299,
                  "ttft_p99": 0.0297, "tbt_p99": 0.0592, "e2e_p99": 0.0403}
AGREEMENT_TODAY = 118 / 120


@needs_shared
def test_accuracy_vs_splitwisesim_runs(sim_table_validation):
    """Today's accuracy against the reference runs, with SplitwiseSim's own phase table
    so that only the queueing and batching model is tested. Limits: today's median
    (ACCURACY_TODAY) plus 2 points or plus half of it, whichever is larger (a model
    change that worsens a median by that much is a regression to look at; the figures
    are deterministic), and at most two more verdict disagreements than today's two."""
    vc, per_run = sim_table_validation
    assert len(per_run) >= 110  # the shared folder holds 72 + 48 Poisson runs; a truncated file is a defect
    med = {c: float(per_run[f"err_{c}"].abs().median()) for c in vc.ERR_COLS}
    limits = {c: ACCURACY_TODAY[c] + max(0.02, 0.5 * ACCURACY_TODAY[c]) for c in vc.ERR_COLS}
    over = {c: f"{med[c]:.2%} > {limits[c]:.2%} (today {ACCURACY_TODAY[c]:.2%})" for c in vc.ERR_COLS
            if med[c] > limits[c]}
    assert not over, over
    assert (~per_run["slo_agree"]).sum() <= round((1 - AGREEMENT_TODAY) * len(per_run)) + 2, \
        per_run.loc[~per_run["slo_agree"], ["design", "n_prompt", "n_token", "workload", "rate"]].to_dict("records")


@needs_shared
def test_moved_decodes_run_at_the_mixed_machines_pace(sim_table_validation):
    """The mixed pool (docs/cluster.md §4): on conversation, HH with 5-6 token machines
    overflows KV memory (30-36% of decodes moved in the model) while its prompt pool
    seldom drafts; the reference's moved decodes then run on machines that left the
    prompt pool and get no prompts (TBT P90 0.036 s, as on token machines). Before the
    mixed pool the model had them sit through the prompt pool's prompts: TBT P90 0.064-
    0.081 s and three false "fails". Tolerance 7%: measured 2026-12-04, |error| 3.1-3.2% at
    P90 and 2.6-5.1% at P99 (issue 10's goal was 10%), plus 2 points."""
    vc, per_run = sim_table_validation
    runs = per_run[(per_run["design"] == "splitwise-hh") & (per_run["workload"] == "conv")]
    cases = [(16, 6, 60.0), (20, 6, 60.0), (30, 10, 110.0), (35, 5, 110.0)]
    for n_p, n_t, rate in cases:
        row = runs[(runs["n_prompt"] == n_p) & (runs["n_token"] == n_t) & (runs["rate"] == rate)]
        assert len(row) == 1, (n_p, n_t, rate)
        row = row.iloc[0]
        assert row["mixed_decode_frac"] > 0.25, row["mixed_decode_frac"]  # the case: heavy overflow
        for pc in ("p90", "p99"):
            assert abs(row[f"err_tbt_{pc}"]) <= 0.07, (n_p, n_t, rate, pc, row[f"err_tbt_{pc}"])
        assert row["slo_agree"], (n_p, n_t, rate)


@needs_shared
def test_no_false_meets_at_the_boundary(sim_table_validation):
    """Issue 10's goal: no SLO verdict of "meets" where the reference fails, on
    boundary_runs.csv (its Poisson runs here; the four replays are the study's). The
    last one, Splitwise-HH 22+3 on coding at 60 req/s, went with the drained token
    pool and the mixed machines' own prompts (docs/cluster.md §4, "The cascade")."""
    vc, per_run = sim_table_validation
    b = per_run[per_run["source"] == "boundary_runs"]
    false_meets = b[b["ours_meets_slo"] & ~b["ref_meets_slo"]]
    assert false_meets.empty, false_meets[["design", "n_prompt", "n_token", "workload", "rate"]].to_dict("records")


@needs_shared
def test_the_drained_token_pool_moves_decodes_as_the_reference_does(sim_table_validation):
    """Near prompt-pool saturation on coding the token pool drains into the mixed pool
    and decodes spread over every mixed machine by memory (docs/cluster.md §4, "The
    cascade"): the reference ran 46 % (HH 22+3) and 41 % (HH 20+4) of its decodes on
    prompt machines, read here from its per-request records. The model's overflow law
    alone moved 15 % and 19 %; with the cascade 38 % and 42 %. Tolerance 25 %: the
    cascade's one constant (6 drafts per token machine) was read off five runs that
    gave 6-9, and the model holds fewer mixed prompt machines than the reference."""
    vc, per_run = sim_table_validation
    dc = _study("drafting_check")
    folder = SHARED / "validation" / "boundary_per_request"
    for n_p, n_t in ((22, 3), (20, 4)):
        ref = dc.reference_row(folder / f"splitwise-hh_P{n_p}T{n_t}_code60_bloom-176b.csv.gz")["ref_moved"]
        row = per_run[(per_run["design"] == "splitwise-hh") & (per_run["workload"] == "code")
                      & (per_run["rate"] == 60.0) & (per_run["n_prompt"] == n_p) & (per_run["n_token"] == n_t)]
        assert len(row) == 1, (n_p, n_t)
        ours = float(row["mixed_decode_frac"].iloc[0])
        assert ours == pytest.approx(ref, rel=0.25), (n_p, n_t, ours, ref)


@needs_shared
def test_validation_batching_matches_single_runs(sim_table_validation):
    # The study pads workloads with zero-weight classes and makes static names uniform
    # to share one compile per design kind; that must not change any prediction.
    # Tolerance: float64 round-off through the percentile solver (observed ~1e-12).
    vc, per_run = sim_table_validation
    runs = vc.load_runs()
    runs = runs[runs["trace"] == ""].reset_index(drop=True)
    for i in (0, 71):  # a baseline (code) and a Splitwise design (conv)
        row = runs.iloc[i]
        m = _evaluate(vc.cluster_of_run(row, "splitwise-sim-table"),
                      workload(vc.WORKLOADS[row["workload"]], float(row["rate"])), vc.HORIZON_S)
        for met in vc.METRICS:
            ours = [per_run.loc[i, f"ours_{met}_{pc}_s"] for pc in vc.PCTS]
            np.testing.assert_allclose(ours, np.asarray(getattr(m, f"{met}_s")), rtol=1e-8)


# ---------------------------------------------------------------------------------------
# Invariants
# ---------------------------------------------------------------------------------------

def test_jit_matches_eager(coding):
    # Baseline-H100 (the pool, wait-law and percentile code every design runs): its op-by-op
    # run is ~15 s on the 2-core machine against Splitwise-HH's 37 s (3x the operations;
    # measured 2026-12-03); the Splitwise flows are compared against their vmapped and
    # gradient programs elsewhere in this file. Tolerance: float64 round-off amplified by
    # the Newton and Illinois iterations (observed 1e-15 on latencies, 1e-10 relative on
    # near-zero drafted fractions).
    c = make_cluster("baseline-h100", 20.0)
    wl = coding.with_rate(60.0)
    eager = evaluate(c, wl, HORIZON_S)
    jitted = _evaluate(c, wl, HORIZON_S)
    for name, a, b in zip(ClusterMetrics._fields, eager, jitted):
        np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=1e-8, atol=1e-12, err_msg=name)


N_PROMPT = (20.0, 30.0, 40.0)
N_TOKEN = (5.0, 10.0, 20.0, 30.0)
# Light load up to 10x the capacity of the smallest cluster (25 H100s at ~0.3 s per
# coding prompt is ~80 prompts/s; 800 req/s overloads every grid point).
RATES = (20.0, 50.0, 80.0, 110.0, 800.0)


def _grid(cluster, wl, n_prompt, n_token, rates):
    # The package's `evaluate` (cluster/batched.py) over the flattened grid: its vmap maps
    # the 60 points one at a time through one model body, as a user's grid runs. (The
    # model function's own vmap, vectorised, or three nested vmaps traced the model two
    # to three times over; tests/test_batched.py checks that the two paths agree.)
    p, t, r = jnp.meshgrid(n_prompt, n_token, rates, indexing="ij")

    def one(n_p, n_t, rate):
        return batched_evaluate(cluster.replace(n_prompt=n_p, n_token=n_t), wl.with_rate(rate), HORIZON_S)

    flat = jax.vmap(one)(p.ravel(), t.ravel(), r.ravel())
    return jax.tree_util.tree_map(lambda x: x.reshape(p.shape + x.shape[1:]), flat)


_grid_jit = jax.jit(_grid)


@pytest.fixture(scope="session")
def grid(hh, coding):
    return _grid_jit(hh, coding, jnp.asarray(N_PROMPT), jnp.asarray(N_TOKEN), jnp.asarray(RATES))


def test_vmap_shapes_and_values(grid, hh, coding):
    shape = (len(N_PROMPT), len(N_TOKEN), len(RATES))
    assert grid.ttft_s.shape == shape + (3,)
    assert grid.slo_margin.shape == shape + (3, 3)
    assert grid.meets_slo.shape == shape
    assert grid.cost_per_hour.shape == shape
    # One grid point against the scalar jitted call. Tolerance: vmapped and scalar
    # programs fuse differently; float64 round-off through the iterations.
    i, j, k = 1, 2, 3
    m = _evaluate(hh.replace(n_prompt=N_PROMPT[i], n_token=N_TOKEN[j]), coding.with_rate(RATES[k]), HORIZON_S)
    for name, a, b in zip(ClusterMetrics._fields, grid, m):
        np.testing.assert_allclose(np.asarray(a[i, j, k], float), np.asarray(b, float), rtol=1e-8, atol=1e-12,
                                   err_msg=name)


def test_grid_finite_including_overload(grid):
    assert _all_finite(grid)
    # Drafting holds the prompt pool near its threshold and pushes the excess onto the
    # token machines, so 10x capacity shows as an overloaded prompt or token pool.
    over = np.asarray(grid.status[:, :, -1]).astype(int)
    assert np.all(over & 3), over


# Tolerance of the monotonicity checks. The percentile solver converges to ~1e-9 in log
# t, but the model itself lets TTFT P99 rise slightly with more prompt machines at light
# load: the service jitter (3% of each class's latency) smooths only the no-wait part of
# each class (cluster.py, `(1 - c) * atom + c * busy`), so moving mass out of the waiting
# part (more machines, smaller C) widens the upper tail by a fraction of the jitter
# (observed 1e-4 to 1.3e-3 as the calibration changed). A third of the jitter, 1e-2,
# covers that and still catches a real reversal.
_MONO_RTOL = 1e-2
_TABLE_XFAIL = pytest.mark.xfail(strict=True, reason=(
    "percentiles.busy_table tabulates the wait CDF on 64 log-spaced points from 1e-5 s: ~34% "
    "spacing near the top, so in overload (waits spread linearly over [0, (rho-1)T]) "
    "interpolation overstates TTFT P90/P99 by up to ~25%"))
_DRAFT_XFAIL = pytest.mark.xfail(strict=True, reason=(
    "drafting sends a fixed random fraction x of prompts to the lightly loaded token pool "
    "while the prompt pool stays pinned at the threshold load, so the mixture's TTFT/TBT "
    "percentiles fall by up to ~15-18% as the rate rises (SplitwiseSim drafts the prompts "
    "that would have waited longest)"))


def _rises(t, axis):
    """Where t increases along axis beyond the tolerance."""
    return np.diff(t, axis=axis) > _MONO_RTOL * np.take(t, range(1, t.shape[axis]), axis=axis)


def test_more_machines_never_raise_ttft(grid):
    for q, axis, what in ((2, 0, "prompt"), (0, 1, "token"), (2, 1, "token")):  # (P50 on prompt axis: below)
        t = np.asarray(grid.ttft_s[..., q])
        bad = _rises(t, axis)
        assert not np.any(bad), f"more {what} machines raised TTFT q={q} at {np.argwhere(bad)[:5].tolist()}"


def test_more_prompt_machines_never_raise_ttft_p50(grid):
    """A known violation (strict xfail) until the drafting regime became the default
    (thirty-second session): at 110 req/s on 20 vs 30 prompt machines with 30 token
    machines the old law drafted 43 % vs 16 % of prompts (the large ones) onto nearly idle
    token machines, where they started at once (TTFT P50 0.20 vs 0.21 s); the regime
    drafts only what the prompt pool cannot hold, as our simulator does."""
    assert not np.any(_rises(np.asarray(grid.ttft_s[..., 0]), 0))


def _falls(t, axis):
    return np.diff(t, axis=axis) < -_MONO_RTOL * np.take(t, range(1, t.shape[axis]), axis=axis)


def test_higher_rate_never_lowers_e2e(grid):
    """Until the drafting regime became the default (thirty-second session) one grid step
    fell, a known exception: Splitwise-HH 20 + 5 on coding, 80 -> 110 req/s, E2E P99 96.2
    -> 93.5 s, the moved decodes' TBT falling with the rate while the old drafting law held
    the prompt pool at its threshold (docs/cluster.md §7, item 2). No step falls now."""
    bad = {tuple(int(i) for i in ix) for ix in np.argwhere(_falls(np.asarray(grid.e2e_s), 2))}
    assert bad == set(), sorted(bad)[:5]


def test_higher_rate_never_lowers_latency_baseline():
    # One queue, no drafting: every percentile must rise with the rate, into overload.
    c = make_cluster("baseline-h100", 20.0)
    wl = workload("conversation", 30.0)
    ms = [_evaluate(c, wl.with_rate(r), HORIZON_S) for r in (10.0, 40.0, 80.0, 120.0, 400.0)]
    for name in ("ttft_s", "tbt_s", "e2e_s"):
        t = np.stack([np.asarray(getattr(m, name)) for m in ms])
        bad = _falls(t, 0)
        assert not np.any(bad), (name, t.tolist())


@_DRAFT_XFAIL
def test_higher_rate_never_lowers_ttft_tbt_splitwise(grid):
    for name in ("ttft_s", "tbt_s"):
        assert not np.any(_falls(np.asarray(getattr(grid, name)), 2)), name


def test_cost_is_machines_times_price(grid, hh):
    n_p = np.asarray(N_PROMPT)[:, None, None]
    n_t = np.asarray(N_TOKEN)[None, :, None]
    want = n_p * float(hh.prompt.machine.cost_per_hour) + n_t * float(hh.token.machine.cost_per_hour)
    np.testing.assert_allclose(np.asarray(grid.cost_per_hour), np.broadcast_to(want, grid.cost_per_hour.shape),
                               rtol=1e-14)


def test_throughput_never_exceeds_rate(grid):
    rate = np.asarray(RATES)[None, None, :]
    thr = np.asarray(grid.throughput_rps)
    assert np.all(thr <= rate * (1.0 + 1e-12))
    # Overload is reported as lost throughput: 10x capacity serves well under half.
    assert np.all(thr[..., -1] < 0.5 * RATES[-1])


def test_baseline_is_a_design_too():
    c = make_cluster("baseline-h100", 20.0)
    m = _evaluate(c, workload("conversation", 30.0), HORIZON_S)
    assert _all_finite(m)
    assert float(m.cost_per_hour) == pytest.approx(20.0 * float(c.prompt.machine.cost_per_hour), rel=1e-14)
    assert float(m.rho_token_pool) == 0.0


def test_overload_ttft_grows_with_the_window():
    # Baseline (no drafting, one queue) at 10x its prompt capacity. Past saturation the
    # pending work grows at (rho - 1) seconds per second, so an arrival at time u of the
    # window waits about (rho - 1) u; arrivals are uniform on [0, T], so the wait is
    # uniform on [0, (rho - 1) T] and its median (rho - 1) T / 2. Tolerance, term by term:
    # * the window is integrated with N midpoint arrival times, so the median can sit
    #   anywhere between the two middle ones: +-(rho - 1) T / (2 N);
    # * TTFT adds the prompt's own service S >= 0: bounded by the service P99 (the same
    #   model with a vanishing window), the 1% above it shifting the quantile level by at
    #   most 0.01, i.e. by 0.01 (rho - 1) T of wait;
    # * the diffusion noise (s.d. of a few seconds at T / 2) is symmetric about the drift
    #   line and moves the median by much less than the quadrature term.
    # Llama2-70B: its decodes stay far inside the KV memory at this load. BLOOM-176B's
    # fill it, and the queue then takes the memory's load as well and the pool's reported
    # load is what it admits (a second law since the twenty-fifth session,
    # flows_baseline._memory_full, tested in tests/test_memory_full.py).
    c = make_cluster("baseline-h100", 20.0, model="llama2-70b")
    wl = workload("coding", 10.0)
    light = _evaluate(c, wl, HORIZON_S)
    rate = 10.0 * 10.0 / float(light.rho_prompt_pool)
    m = _evaluate(c, wl.with_rate(rate), HORIZON_S)
    assert _all_finite(m)
    rho = float(m.rho_prompt_pool)
    assert rho > 5.0
    service = _evaluate(c, wl.with_rate(rate), 1e-6)
    s99 = float(service.ttft_s[2])
    n = Resolution().window_points
    expected = (rho - 1.0) * HORIZON_S / 2.0
    tol = (rho - 1.0) * HORIZON_S * (1.0 / (2 * n) + 0.01) + s99
    assert abs(float(m.ttft_s[0]) - expected) <= tol, (float(m.ttft_s[0]), expected, tol)
    assert int(m.status) & 1


@_TABLE_XFAIL
def test_overload_ttft_p99_within_the_window():
    # No arrival waits longer than the work queued ahead of it at the end of the window,
    # (rho - 1) T (the last quadrature point sits at (1 - 1/(2N)) T), plus its service.
    c = make_cluster("baseline-h100", 20.0)
    wl = workload("coding", 10.0)
    rate = 100.0 / float(_evaluate(c, wl, HORIZON_S).rho_prompt_pool)
    m = _evaluate(c, wl.with_rate(rate), HORIZON_S)
    s99 = float(_evaluate(c, wl.with_rate(rate), 1e-6).ttft_s[2])
    assert float(m.ttft_s[2]) <= (float(m.rho_prompt_pool) - 1.0) * HORIZON_S + s99


def test_layerwise_transfer_never_slower_in_tbt(hh, coding):
    # Layer-wise transfer overlaps the KV copy with the prompt; it can only hide time.
    # Slow to fast links (1 GB/s to 400 GB/s), light to heavy load.
    lw = dataclasses.replace(hh, transfer=dataclasses.replace(hh.transfer, mode="layerwise"))
    for bw in (1e9, 25e9, 400e9):
        for rate in (20.0, 80.0):
            wl = coding.with_rate(rate)

            def with_bw(c):
                return c.replace(transfer=dataclasses.replace(c.transfer, bandwidth_bytes_per_s=bw))

            ser = _evaluate(with_bw(hh), wl, HORIZON_S)
            lay = _evaluate(with_bw(lw), wl, HORIZON_S)
            assert np.all(np.asarray(lay.tbt_s) <= np.asarray(ser.tbt_s) * (1.0 + _MONO_RTOL)), (bw, rate)
            assert np.all(np.asarray(lay.e2e_s) <= np.asarray(ser.e2e_s) * (1.0 + _MONO_RTOL)), (bw, rate)


# ---------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------

def _objective(theta, cluster, wl):
    """log E2E P90 + cost in k$/h, as a function of (n_prompt, n_token, token cap
    fraction, KV bandwidth in GB/s, rate)."""
    n_p, n_t, cap, bw_gb, rate = theta
    c = cluster.replace(
        n_prompt=n_p, n_token=n_t, token=dataclasses.replace(cluster.token, cap_frac=cap),
        transfer=dataclasses.replace(cluster.transfer, bandwidth_bytes_per_s=bw_gb * 1e9))
    m = evaluate(c, wl.with_rate(rate), HORIZON_S)
    return jnp.log(m.e2e_s[1]) + m.cost_per_hour / 1e3, jnp.maximum(m.rho_prompt_pool, m.rho_token_pool)


_value_and_grad = jax.jit(jax.value_and_grad(_objective, has_aux=True))


@pytest.mark.parametrize("load", ["light", "near-saturation", "overload", "memory-bound"])
def test_gradients_finite(hh, coding, load):
    # Rates from the calibrated H100 prompt time (~0.3 s per coding prompt, 30 machines:
    # ~100 prompts/s); the assertion on the larger pool load keeps the regimes honest
    # (in overload drafting holds the prompt pool near its threshold and the token
    # machines take the excess).
    # "memory-bound": 20 + 5 machines at 80 req/s, where the moved decodes fill the prompt
    # machines' KV memory (rho_m = 1.13) and prompts wait for it (flows_splitwise.
    # _memory_bound switched on).
    n_p, n_t, rate, lo, hi = {"light": (30.0, 10.0, 10.0, 0.0, 0.3), "near-saturation": (30.0, 10.0, 95.0, 0.8, 1.2),
                              "overload": (30.0, 10.0, 400.0, 1.2, np.inf),
                              "memory-bound": (20.0, 5.0, 80.0, 1.0, 1.3)}[load]
    theta = jnp.array([n_p, n_t, 0.9, 25.0, rate])
    (value, rho), g = _value_and_grad(theta, hh, coding)
    assert lo < float(rho) < hi, float(rho)
    assert np.isfinite(float(value))
    assert np.all(np.isfinite(np.asarray(g))), np.asarray(g)


def test_gradient_matches_finite_differences(hh, coding):
    # Central differences of the same compiled function at moderate load. Step h = 1e-4
    # relative: truncation ~h^2 times the curvature, round-off ~1e-12 / h from the
    # percentile solver; 2% relative (or 1e-6 absolute for near-zero entries) covers both
    # with a margin, and still catches a missing or wrong implicit gradient.
    theta = jnp.array([30.0, 10.0, 0.9, 25.0, 60.0])
    (_, _), g = _value_and_grad(theta, hh, coding)
    for i in range(theta.shape[0]):
        h = 1e-4 * float(theta[i])
        (fp, _), _ = _value_and_grad(theta.at[i].add(h), hh, coding)
        (fm, _), _ = _value_and_grad(theta.at[i].add(-h), hh, coding)
        fd = (float(fp) - float(fm)) / (2.0 * h)
        assert abs(float(g[i]) - fd) <= 0.02 * abs(fd) + 1e-6, (i, float(g[i]), fd)


# ---------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, kwargs, names", [
    (("splitwise-xx", 10.0, 10.0), {}, "design"),
    (("splitwise-hh", -1.0, 10.0), {}, "n_prompt"),
    (("splitwise-hh", 10.0, -3.0), {}, "n_token"),
    (("splitwise-hh", 10.0, 0.0), {}, "n_token"),
    (("splitwise-hh", math.nan, 10.0), {}, "n_prompt"),
    (("splitwise-hh", 10.0, math.nan), {}, "n_token"),
    (("baseline-a100", -5.0), {}, "machines"),
    (("baseline-a100", math.inf), {}, "machines"),
    (("splitwise-hh", 10.0, 10.0), {"token_cap_frac": 1.5}, "cap_frac"),
    (("splitwise-hh", 10.0, 10.0), {"prompt_cap_frac": 0.01}, "cap_frac"),
    (("splitwise-hh", 10.0, 10.0), {"token_cap_frac": math.nan}, "cap_frac"),
    (("splitwise-hh", 10.0, 10.0), {"kv_bandwidth_bytes_per_s": -1.0}, "kv_bandwidth_bytes_per_s"),
    (("splitwise-hh", 10.0, 10.0), {"kv_bandwidth_bytes_per_s": math.nan}, "kv_bandwidth_bytes_per_s"),
    (("splitwise-hh", 10.0, 10.0), {"transfer_mode": "teleport"}, "transfer_mode"),
    (("splitwise-hh", 10.0, 10.0), {"phase_model": "magic"}, "phase_model"),
    (("splitwise-hh", 10.0, 10.0), {"phase_model": "splitwise-sim-table", "token_cap_frac": 0.85}, "cap_frac"),
])
def test_make_cluster_rejects_bad_input(args, kwargs, names):
    with pytest.raises(ValueError, match=names):
        make_cluster(*args, **kwargs)


def test_every_design_builds():
    for name, spec in DESIGNS.items():
        c = make_cluster(name, 10.0, 5.0)
        assert c.kind == spec.kind and c.name == name


def test_bursty_trace_waits_longer():
    """A trace's own bursts (Poisson batches of mean 10, docs/cluster.md §3b) against the
    same rate and sizes arriving as Poisson, window by window, on a colocated baseline:
    more requests wait (TTFT P50 up), decodes sit through their bursts' later prompts
    (TBT P50 up). (The burst law's gradients: tests/test_queueing.py; a gradient program
    of the windowed model costs ~90 s to compile here, too much for what it adds.)"""
    import pandas as pd

    from splitwise_jax.cluster.workload import Workload, coarsen

    rng = np.random.default_rng(0)
    base = coarsen(workload("coding", 1.0), 8, 8)
    n = 1_000
    sizes = rng.geometric(0.1, n)
    bursty = np.repeat(np.cumsum(rng.exponential(10.0 / 40.0, n)), sizes)[:n]   # 40 req/s
    poisson = np.cumsum(rng.exponential(1.0 / 40.0, n))
    p, o = _sample_sizes(base, n, rng)

    def wl(t):
        df = pd.DataFrame({"arrival_s": t, "prompt_tokens": p, "output_tokens": o})
        # 1,000 arrivals: 20 windows either way, so both share one compiled program.
        return Workload.from_trace(df, rate_per_s=40.0, arrival="trace", n_prompt_bins=8, n_output_bins=8)

    c = make_cluster("baseline-h100", 16.0)   # prompt load ~0.6
    run = jax.jit(lambda cl, w: evaluate(cl, w, HORIZON_S))
    calm, burst = run(c, wl(poisson)), run(c, wl(bursty))
    assert float(burst.ttft_s[0]) > 1.5 * float(calm.ttft_s[0])
    assert float(burst.tbt_s[0]) > float(calm.tbt_s[0])


def _sample_sizes(wl, n, rng):
    k = rng.choice(wl.weights.size, size=n, p=np.asarray(wl.weights).ravel())
    i, j = np.unravel_index(k, wl.weights.shape)
    return np.asarray(wl.prompt_tokens)[i].round(), np.asarray(wl.output_tokens)[j].round()


@pytest.mark.parametrize("capacity", [1.0, 1.5])
def test_fluid_backlog_drains_at_the_pools_rate(capacity):
    """docs/cluster.md §3c: a backlog built at load rho > c for D seconds holds
    (rho - c) D seconds of one prompt machine's work, and an arrival that finds it waits
    that work over the drain rate c (the token machines drain it too, past the drafting
    threshold). Before this was read as the wait itself, Splitwise replays' TTFT came out
    1 + N_t / N_p too long (HH 5+2 on the 900 s code replay: +44 % at P50 against our
    simulator, +8 % after). Exact up to the 5 ms softplus floor and the threshold's
    sigmoid (threshold 10 ms here, so the whole stretch is past it): 1 %."""
    from splitwise_jax.cluster.cluster import _backlog_fluid

    rho, d, h = 2.0, 10.0, 0.5
    n = int(d / h)
    rho_sub = jnp.concatenate([jnp.full((n,), rho), jnp.zeros((n,))])[None, :]
    found, wait, busy_for, _ = _backlog_fluid(rho_sub, jnp.asarray([capacity]), jnp.asarray([0.01]),
                                              jnp.asarray([0.3]), h, jnp.asarray([5.0]), 1.0)
    # The last sub-bin of the stretch: its arrivals find the backlog at its middle. The
    # rate is read at each sub-bin's start, so the first runs at c(0) = 1.
    expect = (rho - 1.0) * h + (rho - capacity) * (d - 1.5 * h)
    assert float(found[0, n - 1]) == pytest.approx(expect, rel=0.01)
    assert float(wait[0, n - 1]) == pytest.approx(expect / capacity, rel=0.01)
    # It drains at c once the arrivals stop: flat out for backlog / c after the stretch.
    end = (rho - 1.0) * h + (rho - capacity) * (d - h)
    assert float(busy_for[0, n - 1]) == pytest.approx(end / capacity, rel=0.05)


def test_trace_overload_stretch_builds_a_fluid_backlog(monkeypatch):
    """A trace that overloads the prompt pool for a stretch of D seconds (docs/cluster.md
    §3c): its queue grows at rho_b - 1 seconds of wait per second and drains after, so
    the last arrivals of the stretch wait ~(rho_b - 1) D and the mean queued arrival half
    that; doubling D doubles the wait. Read at TTFT P99 (the stretch holds a quarter to a
    half of the arrivals); rho_b is the model's own prompt load at the stretch's rate.
    Tolerance 25%: the wait law adds its own in-window wait and the percentile mixes
    windows. The compute queue alone: the baselines' wait for KV memory is switched off
    here (at 1.35x capacity the model puts this pool's decodes at ~1.2x its memory, so
    the queue would grow faster than rho_b - 1; that wait has its own tests,
    tests/test_baseline_memory_wait.py)."""
    import pandas as pd

    from splitwise_jax.cluster import flows_baseline
    from splitwise_jax.cluster.workload import Workload, coarsen

    monkeypatch.setattr(flows_baseline, "MEMORY_WAIT", False)  # read when traced: the jits below are this test's own

    base = coarsen(workload("coding", 1.0), 8, 8)
    c = make_cluster("baseline-h100", 16.0)
    rng = np.random.default_rng(0)
    calm, busy = 15.0, 65.0   # req/s: load ~0.35, then ~1.35
    rho_b = float(jax.jit(lambda w: evaluate(c, w, HORIZON_S).rho_prompt_pool)(base.with_rate(busy)))  # compiled: eager was ~2x slower
    assert 1.1 < rho_b < 1.6

    def trace(d):
        # The same number of arrivals either way (the calm tail shortens), so both traces
        # have the same windows and share one compiled program.
        tail = 80.0 - busy * (d - 10.0) / calm
        t = np.concatenate([np.sort(rng.uniform(0.0, 40.0, int(calm * 40))),
                            40.0 + np.sort(rng.uniform(0.0, d, int(busy * d))),
                            40.0 + d + np.sort(rng.uniform(0.0, tail, int(round(calm * tail))))])
        p, o = _sample_sizes(base, len(t), rng)
        df = pd.DataFrame({"arrival_s": t, "prompt_tokens": p, "output_tokens": o})
        return Workload.from_trace(df, arrival="trace", n_prompt_bins=8, n_output_bins=8)

    run = jax.jit(lambda w: evaluate(c, w, HORIZON_S).ttft_s)
    short, long = np.asarray(run(trace(10.0))), np.asarray(run(trace(20.0)))
    for ttft, d in ((short, 10.0), (long, 20.0)):
        peak = (rho_b - 1.0) * d
        assert abs(ttft[2] / peak - 1.0) < 0.25, (ttft, peak)
    assert 1.6 < long[2] / short[2] < 2.4


def test_count_mixture_gradient_finite_in_float32():
    """The count mixture's gradient in float32 for every mean from 1e-9 to 50: its
    lumped tail's moments divide by the tail, whose square underflowed float32 for means
    1e-7-1e-4 (tails ~1e-25): NaN gradients, which stopped the optimiser in float32
    (`cluster._tail_floor`). Its weights and means stay within float32 rounding of
    float64's (1e-5 relative, on the mixture's own mean and second moment)."""
    from splitwise_jax.cluster.cluster import _count_mixture

    def moments(lam):
        w, m, v = _count_mixture(lam)
        return jnp.stack([jnp.sum(w * m, axis=0), jnp.sum(w * (v + m * m), axis=0)])

    lam = np.geomspace(1e-9, 50.0, 61)
    g32 = jax.jit(jax.vmap(jax.grad(lambda x: jnp.sum(moments(x[None])))))(jnp.asarray(lam, jnp.float32))
    assert np.all(np.isfinite(np.asarray(g32))), np.asarray(g32)
    m32 = np.asarray(moments(jnp.asarray(lam, jnp.float32)), float)
    m64 = np.asarray(moments(jnp.asarray(lam, jnp.float64)))
    np.testing.assert_allclose(m32, m64, rtol=1e-5)
    # Poisson: E[N] = lam and E[N^2] = lam + lam^2, exactly, in float64.
    np.testing.assert_allclose(m64, np.stack([lam, lam + lam**2]), rtol=1e-12)


def test_trace_windows_one_at_a_time_equal_the_vectorised_batch(monkeypatch):
    """On CPU a trace's windows are evaluated one at a time (`window._per_row`, `lax.map`:
    each window's fixed points stop when it has converged); `jax.vmap` over them, the
    accelerator's path, gives the same answer. Tolerance 1e-12 relative: float64
    round-off of reordered reductions, nothing a loop's exit could move (one more Newton
    or regula falsi step moves a root by far more)."""
    import pandas as pd

    from splitwise_jax.cluster import window
    from splitwise_jax.cluster.workload import Workload, coarsen

    rng = np.random.default_rng(1)
    base = coarsen(workload("coding", 1.0), 8, 8)
    n = 600  # bursts of mean 6 at 30 req/s: windows from idle to overloaded
    t = np.repeat(np.cumsum(rng.exponential(6.0 / 30.0, n)), rng.geometric(1.0 / 6.0, n))[:n]
    p, o = _sample_sizes(base, n, rng)
    df = pd.DataFrame({"arrival_s": t, "prompt_tokens": p, "output_tokens": o})
    wl = Workload.from_trace(df, arrival="trace", n_prompt_bins=8, n_output_bins=8)
    c = make_cluster("splitwise-hh", 6.0, 2.0)
    # TTFT and the pools' loads only: the programs keep the windows' flows and the TTFT
    # mixture (XLA drops the TBT and E2E searches), ~4x cheaper to compile than every metric.
    def some(w):
        m = evaluate(c, w, HORIZON_S)
        return m.ttft_s, m.rho_prompt_pool, m.rho_token_pool, m.throughput_rps

    one_at_a_time = jax.tree_util.tree_map(np.asarray, jax.jit(some)(wl))
    monkeypatch.setattr(window, "_per_row", lambda fn, *xs: jax.vmap(fn)(*xs))
    batched = jax.tree_util.tree_map(np.asarray, jax.jit(some)(wl))
    for a, b in zip(jax.tree_util.tree_leaves(one_at_a_time), jax.tree_util.tree_leaves(batched)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-300)


# ---------------------------------------------------------------------------------------
# Waiting for KV memory on the prompt machines (issue 39, docs/cluster.md §4)
# ---------------------------------------------------------------------------------------


def _prompt_pool_drift(n_prompt, cluster, wl, rate):
    """The Splitwise prompt pool's queue drift (s of wait per s of the window) and the
    onset of its wait for KV memory (s into the window: what the wait law's horizon
    lost, `flows_splitwise._after_onset`)."""
    from splitwise_jax.cluster import flows_splitwise
    from splitwise_jax.cluster.cluster import _classes
    fl = flows_splitwise.splitwise_flows(cluster.replace(n_prompt=n_prompt), _classes(wl), jnp.asarray(rate),
                                         jnp.asarray(wl.arrival_cv2, float), HORIZON_S, Resolution(), HORIZON_S)
    wait = fl.prompt_routes[0].wait
    return wait.drift, HORIZON_S - wait.horizon_s


@pytest.fixture(scope="module")
def memory_wait_run():
    """Splitwise-HH 27 + 6 (and 28 + 6), BLOOM-176B, conversation at 148.4 req/s: the
    model's drift and onset, and our simulator's per-request records (seed 173)."""
    import splitwise_jax as sj
    rate = 148.421
    cl = make_cluster("splitwise-hh", 27.0, 6.0, model="bloom-176b")
    wl = workload("conversation", rate)
    (drift, more), (onset, _) = jax.jit(jax.vmap(lambda n: _prompt_pool_drift(n, cl, wl, rate)))(
        jnp.asarray([27.0, 28.0]))
    req = sj.simulate(cl, sj.poisson_trace(wl, rate, HORIZON_S, 173), power=False).requests
    return float(drift), float(more), float(onset), req


def test_prompt_pool_waits_for_kv_memory_at_the_simulated_rate(memory_wait_run):
    """Splitwise-HH 27 + 6, BLOOM-176B, conversation at 148.4 req/s: the moved decodes
    fill the prompt machines' KV memory, and in the simulation prompts wait for it
    (the prompt machines run prompts about half the window, yet the queue grows). The
    queue's growth over the second half of the window (s of wait per s, a line fitted to
    the per-request queueing times) against the model's drift: over the ten memory-bound
    configurations of the near-saturation study the ratio was 0.52-2.1 (docs/
    validation.md), 0.94 on this one; before the law the model's drift here was 0.11
    (a ratio of 0.13; 0 on three of the ten). The wait starts once memory has filled, in
    the model as in the simulation."""
    drift, _, onset, req = memory_wait_run
    late = req[req["arrival_s"] > HORIZON_S / 2]
    slope, intercept = (float(x) for x in np.polyfit(late["arrival_s"], late["queue_s"], 1))
    assert slope > 0.4, slope  # the simulation waits for memory (measured 0.85)
    assert 0.5 <= drift / slope <= 2.2, (drift, slope)
    # The onset: where the fitted line leaves zero in the simulation (16.6 s), the time
    # memory takes to fill from empty in the model (14.2 s). Within a factor 2: the
    # estimate ignores departures during the fill and a decode's growing context.
    sim_onset = -intercept / slope
    assert 0.5 <= onset / sim_onset <= 2.0, (onset, sim_onset)


@pytest.mark.xfail(strict=True, reason=(
    "a known violation since the drafting regime became the default (docs/validation.md, "
    "thirty-second session): the mixed pool sits at its cap, 4/5 of the prompt pool, so a 28th "
    "prompt machine adds 0.2 of a free one (+3.7 %) while the share the free machines draft "
    "falls 0.561 -> 0.543 and leaves them 4.1 % more prompts: drift 1.347 -> 1.370 (+1.7 %)"))
def test_more_prompt_machines_wait_less_for_kv_memory(memory_wait_run):
    """One more prompt machine lowers the drift (the gradient through the law:
    test_gradients_finite's "memory-bound" case)."""
    drift, more, _, _ = memory_wait_run
    assert more < drift, (more, drift)


# ---------------------------------------------------------------------------------------
# Prompt batching on colocated pools (issue 39, docs/cluster.md §3)
# ---------------------------------------------------------------------------------------


def test_colocated_prompts_share_iterations_at_the_simulated_load():
    """Baseline-A100 13, Llama2-70B, conversation at 60.45 req/s (a near-saturation
    configuration of docs/validation.md): the simulation runs prompts 0.98 of its arrival
    window, several queued prompts (and the ~180 decodes riding with them) to one
    2,048-token iteration. With one prompt per iteration the model's load was 1.40 (43 %
    high, TTFT P50 10.7x the simulation's); with queued prompts sharing iterations
    (pool._batched_rates) it is 1.10, and 1.07 with the queue's prompts counted from
    both sides (`segments.queue_segments`, `pool.prompt_batching`; twenty-eighth session).
    The bounds: batching must take at least 15 % off the one-prompt load (it takes 24 %),
    and the load must lie within 0.9-1.2 of the
    simulated busy share (a saturated pool: the simulation's share cannot pass 1, the
    model's offered load can)."""
    import splitwise_jax as sj
    from splitwise_jax.cluster.cluster import _classes
    from splitwise_jax.cluster.pool import pool_state, prompt_batching
    from splitwise_jax.cluster.types import _kv_capacity_tokens

    rate = 60.45
    cl = make_cluster("baseline-a100", 13.0, model="llama2-70b")
    wl = workload("conversation", rate)
    cls = _classes(wl)
    cap = _kv_capacity_tokens(cl.prompt, cl) / cls.ctx

    @jax.jit
    def loads():
        args = (cl.prompt, 13.0, rate, cls.wp, cls.p, cls.p_sq, rate, cls.mean_iters, cls.ctx, cap,
                cl.scheduling.max_batch_tokens)
        batching = prompt_batching(cls.wp, cls.p, cl.scheduling.max_batch_tokens)
        return (pool_state(*args, window_s=HORIZON_S, batch_prompts=batching).rho_prompt,
                pool_state(*args, window_s=HORIZON_S).rho_prompt)

    batched, alone = (float(x) for x in loads())
    assert batched <= 0.85 * alone, (batched, alone)
    assert abs(float(evaluate(cl, wl, HORIZON_S).rho_prompt_pool) - batched) < 1e-9  # what evaluate uses
    sim = sj.simulate(cl, sj.poisson_trace(wl, rate, HORIZON_S, 35), power=False)
    sim_rho = sim.metrics["utilisation"]["prompt_pool_rho"]
    assert sim_rho > 0.9, sim_rho  # saturated in the simulation too
    assert 0.9 <= batched / sim_rho <= 1.2, (batched, sim_rho)


# ---------------------------------------------------------------------------------------
# Prompts routed on arrival wait on their machine (issue 39, docs/cluster.md §3)
# ---------------------------------------------------------------------------------------


def test_routed_residual_is_zero_for_one_machine_and_floors_the_busy_wait():
    """`queueing.routed_residual_s`: (1 - 1/c) kappa E[S] (1 + cs^2) / 2, so 0 for one
    machine (the central queue is exact there); the wait given that it waits has no mass
    below the shift, and the law's gradient in the service time is finite."""
    from splitwise_jax.cluster.queueing import routed_residual_s, wait_cdf_busy, wait_model

    assert float(routed_residual_s(0.3, 1.0, 1.0, 0.5)) == 0.0
    assert abs(float(routed_residual_s(0.3, 1.0, 33.0, 0.5)) - 0.5 * (32 / 33) * 0.3) < 1e-12
    wm = wait_model(90.0, 0.3, 1.1, 33.0, 1.0, HORIZON_S, 0.5)
    assert float(wm.shift_s) > 0.1
    below = wait_cdf_busy(jnp.asarray([0.5 * float(wm.shift_s), float(wm.shift_s)]), wm, 8)
    assert float(below[0]) == 0.0 and float(below[1]) == 0.0
    assert float(wait_cdf_busy(jnp.asarray(float(wm.shift_s) + 5.0), wm, 8)) > 0.99

    def mean_ish(s):
        m = wait_model(90.0, s, 1.1, 33.0, 1.0, HORIZON_S, 0.5)
        return wait_cdf_busy(jnp.asarray(0.4), m, 8)

    g = jax.grad(mean_ish)(0.3)
    assert np.isfinite(float(g)) and float(g) < 0.0


def test_colocated_prompts_routed_on_arrival_wait_for_their_machine():
    """Baseline-H100 x 33, BLOOM-176B, coding at 94.39 req/s (0.91 of the capacity
    estimate; a near-saturation configuration of docs/validation.md, simulated here on
    another seed). Waiting prompts wait for their own machine's iteration in flight
    (queueing.routed_residual_s): on this seed the simulated TTFT P50 / P90 are 0.370 /
    1.064 s, the model's 0.394 / 1.060 s with it and 0.286 / 0.973 s without (-23 %
    at P50; before the thirteenth session 0.262 s). Bound: 20 %, the spread of a 120 s
    run's TTFT P50 between seeds near saturation (docs/validation.md: a second seed
    moved it by a median 12 %) plus the ~6 % left; it fails without the shift."""
    import splitwise_jax as sj

    rate = 94.38588
    cl = make_cluster("baseline-h100", 33.0, model="bloom-176b")
    wl = workload("coding", rate)
    model = evaluate(cl, wl, HORIZON_S)
    sim = sj.simulate(cl, sj.poisson_trace(wl, rate, HORIZON_S, 7), power=False)
    p50, p90 = float(model.ttft_s[0]), float(model.ttft_s[1])
    s50, s90 = sim.metrics["ttft_s"]["p50"], sim.metrics["ttft_s"]["p90"]
    assert abs(p50 / s50 - 1.0) < 0.2, (p50, s50)
    assert abs(p90 / s90 - 1.0) < 0.2, (p90, s90)
