"""Property tests of `evaluate` over its whole domain (seeded random clusters).

Domain: pool sizes 0.3-300 machines, arrival rates 0.01-2,000 req/s, KV-transfer
bandwidth 1 MB/s-1 TB/s, power caps from each GPU's floor to its TDP, both workloads,
every design. Properties:

* every output is finite and so is the gradient of the log latencies, log throughput
  and log power with respect to pool sizes, caps, bandwidth and rate (overload, rho = 1
  and the cap floor included: the model reports them, it never returns NaN or inf);
* latency percentiles never fall when the arrival rate rises or machines are removed:
  asserted for the Fig. 12 cluster as the load rises, and shown false elsewhere: a
  random search found drops of 5-94% for every design and each change (rate up, prompt
  or token machines down), and small ones (0.3-3%) at the paper's operating points;
  each is pinned as an `xfail(strict=True)` reproducer below and reported to the lead.

Cost: one jitted, vmapped evaluation (values and gradients of a batch of `BATCH`
clusters) per design and workload, compiled once per design kind and shared by the four
Splitwise designs (and the two baselines) through uniform static names; workloads
coarsened to 8 x 8 classes and a low `Resolution`. Each batch holds 50 random clusters
drawn over the whole domain (seeded: the same every run), the domain's corners, and the
monotonicity tests' points for that design and workload, so every test of the file reads
one of twelve batches (`_batch`, computed once). Measured on the 2-core machine
(2026-12-04, loaded): ~40 ms per cluster, ~2.6 s per batch; the compile (~40-85 s per
kind) is what it was with the former 4-row batches.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import splitwise_jax as sj
from splitwise_jax.phases._caps import cap_floor_frac
from splitwise_jax.cluster.cluster import Resolution
from splitwise_jax.cluster.designs import uniform_names

RES = Resolution(window_points=4, table_points=32, grid_points=16, refine_iters=4)
BINS = 8
LATENCY = ("ttft_s", "tbt_s", "e2e_s")
# Monotonicity tolerance: the percentile solver at this resolution (16 grid points, 4
# Illinois steps) places a percentile to ~5e-4 relative (tests/test_quantiles.py,
# coarse case), so two solves of nearly equal percentiles may cross by up to twice that.
MONO_RTOL = 1e-3
# Random clusters per design and workload (>= 50 per design, issue 38), and the batch
# size of the one compiled program: 50 random + 8 corners + up to 6 monotonicity points.
N_RANDOM = 50
BATCH = 64


def _workload(name: str) -> sj.Workload:
    """An 8 x 8 class grid (padded with zero-weight classes) so both workloads share shapes."""
    wl = sj.coarsen(sj.load_workload(name, 1.0), BINS, BINS)
    k, m = wl.weights.shape
    p = jnp.concatenate([wl.prompt_tokens, jnp.full(BINS - k, wl.prompt_tokens[-1])])
    o = jnp.concatenate([wl.output_tokens, jnp.full(BINS - m, wl.output_tokens[-1])])
    w = jnp.pad(wl.weights, ((0, BINS - k), (0, BINS - m)))
    return dataclasses.replace(wl, prompt_tokens=p, output_tokens=o, weights=w, name="_")


WORKLOADS = {name: _workload(name) for name in ("coding", "conversation")}


def _with(c, x):
    """The cluster at x = (n_prompt, n_token, cap_prompt, cap_token, log bandwidth, rate)."""
    prompt = dataclasses.replace(c.prompt, cap_frac=x[2]) if hasattr(c.prompt, "cap_frac") else c.prompt
    token = dataclasses.replace(c.token, cap_frac=x[3]) if hasattr(c.token, "cap_frac") else c.token
    n_t = x[1] if c.kind == "splitwise" else 0.0
    return c.replace(n_prompt=x[0], n_token=n_t, prompt=prompt, token=token,
                     transfer=dataclasses.replace(c.transfer, bandwidth_bytes_per_s=jnp.exp(x[4])))


def _one(c, wl, x):
    def summary(x):
        m = sj.evaluate(_with(c, x), wl.with_rate(x[5]), resolution=RES)
        logs = jnp.log(jnp.concatenate([m.ttft_s, m.tbt_s, m.e2e_s, m.throughput_rps[None], m.power_kw[None]]))
        return jnp.sum(logs), m

    (_, m), g = jax.value_and_grad(summary, has_aux=True)(x)
    return m, g


@jax.jit
def _evaluate_batch(c, wl, xs):
    """Metrics and gradients at each row of xs (one compile per design kind)."""
    return jax.vmap(lambda x: _one(c, wl, x))(xs)


def _bounds(design: str) -> np.ndarray:
    """(lo, hi) per column of x: pools 0.3-300, caps from each GPU's floor to its TDP,
    log bandwidth 1 MB/s-1 TB/s, rate 0.01-2,000 req/s (pools and rate log-uniform)."""
    c = sj.make_cluster(design, 1.0, 1.0 if sj.DESIGNS[design].kind == "splitwise" else 0.0)
    floors = [float(cap_floor_frac(t.machine.gpu)) for t in (c.prompt, c.token)]
    return np.array([[0.3, 300.0], [0.3, 300.0], [floors[0], 1.0], [floors[1], 1.0],
                     [math.log(1e6), math.log(1e12)], [0.01, 2000.0]])


def random_clusters(design: str, workload: str, n: int = N_RANDOM) -> np.ndarray:
    """n points drawn over the domain (seeded by design and workload), then the 2^3
    corners of (pool sizes, rate) with caps at the floor and bandwidth at its ends."""
    b = _bounds(design)
    rng = np.random.default_rng([sorted(sj.DESIGNS).index(design), sorted(WORKLOADS).index(workload)])
    log_uniform = lambda lo, hi, k: np.exp(rng.uniform(math.log(lo), math.log(hi), k))  # noqa: E731
    xs = np.column_stack([log_uniform(*b[0], n), log_uniform(*b[1], n), rng.uniform(*b[2], n),
                          rng.uniform(*b[3], n), rng.uniform(*b[4], n), log_uniform(*b[5], n)])
    corners = [[b[0][i], b[1][j], b[2][0], b[3][0], b[4][(i + j + k) % 2], b[5][k]]
               for i in (0, 1) for j in (0, 1) for k in (0, 1)]
    return np.vstack([xs, np.asarray(corners)])


def _monotonicity_rows(design: str, workload: str) -> list[tuple]:
    """The points of the monotonicity tests below for this design and workload."""
    rows = []
    for d, w, *_, before, after in _HOLDS_PAIRS + _VIOLATIONS + _FORMER_VIOLATIONS:
        if (d, w) == (design, workload):
            rows += [tuple(map(float, before)), tuple(map(float, after))]
    return list(dict.fromkeys(rows))


@functools.cache
def _batch(design: str, workload: str):
    """(xs, metrics, gradients) of this design and workload's batch: the random
    clusters, the corners and the monotonicity points, padded to `BATCH` rows."""
    xs = np.vstack([random_clusters(design, workload), np.asarray(_monotonicity_rows(design, workload)).reshape(-1, 6)])
    assert len(xs) <= BATCH, f"{len(xs)} rows: raise BATCH"
    xs = np.vstack([xs, np.repeat(xs[-1:], BATCH - len(xs), axis=0)])
    c = uniform_names(sj.make_cluster(design, 1.0, 1.0 if sj.DESIGNS[design].kind == "splitwise" else 0.0))
    m, g = _evaluate_batch(c, WORKLOADS[workload], jnp.asarray(xs, float))
    return xs, jax.tree.map(np.asarray, m), np.asarray(g)


def _row(design: str, workload: str, x) -> int:
    xs = _batch(design, workload)[0]
    return int(np.flatnonzero(np.all(xs == np.asarray(x, float), axis=1))[0])


def _latency_drops(design: str, workload: str, before, afters) -> list[str]:
    """Percentiles that fall from `before` to any of `afters` by more than MONO_RTOL."""
    _, m, _ = _batch(design, workload)
    lat = np.concatenate([getattr(m, k) for k in LATENCY], axis=1)  # (BATCH, 9)
    names = [f"{k[:-2].upper()} P{p}" for k in LATENCY for p in (50, 90, 99)]
    base = lat[_row(design, workload, before)]
    out = []
    for i, x in enumerate(afters, start=1):
        after = lat[_row(design, workload, x)]
        out += [f"row {i}: {n} {b:.4g} -> {a:.4g}" for n, b, a in zip(names, base, after) if a < b * (1 - MONO_RTOL)]
    return out


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("design", sorted(sj.DESIGNS))
def test_outputs_and_gradients_are_finite_everywhere(design, workload):
    """Every metric and the gradient of the log latencies, throughput and power are
    finite over the whole domain: 50 random clusters per design and workload (100 per
    design), the domain's 8 corners and the monotonicity points, in one vmapped call.
    A failure names the clusters (x = n_p, n_t, cap_p, cap_t, log bw, rate)."""
    xs, m, g = _batch(design, workload)
    bad = {name: xs[~np.all(np.isfinite(leaf.reshape(len(xs), -1)), axis=1)].tolist()
           for name, leaf in m._asdict().items() if not np.all(np.isfinite(leaf))}
    assert not bad, f"outputs not finite at: {bad}"
    rows = ~np.all(np.isfinite(g), axis=1)
    assert not rows.any(), f"gradient not finite at {xs[rows].tolist()}: {g[rows].tolist()}"


def test_random_clusters_cover_the_domain():
    """The draws span the domain: every column reaches its lowest and highest tenth."""
    for design in sj.DESIGNS:
        b = _bounds(design)
        xs = random_clusters(design, "coding")[:N_RANDOM]
        assert len(xs) >= 50
        for j, log in enumerate((True, True, False, False, False, True)):
            lo, hi = (np.log(b[j]) if log else b[j])
            v = np.log(xs[:, j]) if log else xs[:, j]
            assert v.min() < lo + 0.1 * (hi - lo) and v.max() > hi - 0.1 * (hi - lo), (design, j)


# Latency never falls as load rises or machines are removed: where it holds. The
# Fig. 12 cluster (Splitwise-HH, 26 + 4 machines, coding) from 40 to 70 req/s. (From 40
# to 55 req/s its TBT P99 falls by 0.11%, 0.4456 -> 0.4451 s: barely past MONO_RTOL, so
# possibly the low resolution's percentile error; reported, not asserted.)
_HOLDS = [
    ("splitwise-hh", "coding", [[26, 4, 1, 1, 23.0, 40.0], [26, 4, 1, 1, 23.0, 70.0], [26, 4, 1, 1, 23.0, 70.0],
                                [26, 4, 1, 1, 23.0, 70.0]]),
]


_HOLDS_PAIRS = [(d, w, "load", xs[0], xs[1]) for d, w, xs in _HOLDS]


@pytest.mark.parametrize("design, workload, xs", _HOLDS, ids=[f"{d}-{w}" for d, w, _ in _HOLDS])
def test_latency_rises_with_load_at_the_fig12_cluster(design, workload, xs):
    assert not _latency_drops(design, workload, xs[0], xs[1:])


# Where it does not: the first reproducer found for each design and change by a random
# search of 60 points per design and workload (each a drop far beyond MONO_RTOL). The
# model's latency falls when load rises or machines are removed in every design; reported
# to the lead (issue 9) with these points. strict: the day the model is monotone here,
# these fail and the marks come off.
_NON_MONOTONE = "the model's latency falls here (issue 9 report); x = (n_p, n_t, cap_p, cap_t, log bw, rate)"
_VIOLATIONS = [
    # At an operating point: Splitwise-HH 26 + 4 at 40 req/s: one token machine fewer
    # lowers TBT and E2E (E2E P50 1.643 -> 1.632 s with the previous solver).
    ("splitwise-hh", "coding", "token- (operating point)", [26, 4, 1, 1, 23.0, 40.0], [26, 3, 1, 1, 23.0, 40.0]),
    # Across the domain (random search):
    ("splitwise-aa", "conversation", "prompt-", [0.7622, 201.8333, 0.3958, 0.8466, 22.0203, 1.4337],
     [0.2367, 201.8333, 0.3958, 0.8466, 22.0203, 1.4337]),
    ("splitwise-aa", "coding", "rate", [66.6964, 1.4081, 0.5023, 0.2752, 27.2039, 9.543],
     [66.6964, 1.4081, 0.5023, 0.2752, 27.2039, 11.5383]),
    ("splitwise-aa", "coding", "token-", [66.6964, 1.4081, 0.5023, 0.2752, 27.2039, 9.543],
     [66.6964, 0.7167, 0.5023, 0.2752, 27.2039, 9.543]),
    ("splitwise-ha", "coding", "token-", [0.8355, 236.4157, 0.3348, 0.3429, 27.1721, 1090.7127],
     [0.8355, 86.7204, 0.3348, 0.3429, 27.1721, 1090.7127]),
    ("splitwise-hh", "conversation", "prompt-", [20.4861, 75.2987, 0.9211, 0.3461, 21.2155, 194.1435],
     [9.0713, 75.2987, 0.9211, 0.3461, 21.2155, 194.1435]),
    ("splitwise-hh", "conversation", "rate", [37.6242, 162.2723, 0.6084, 0.9722, 17.2116, 322.3832],
     [37.6242, 162.2723, 0.6084, 0.9722, 17.2116, 725.6607]),
    ("splitwise-hh", "conversation", "token-", [204.1863, 3.3318, 0.4193, 0.5648, 23.9938, 10.8512],
     [204.1863, 2.2448, 0.4193, 0.5648, 23.9938, 10.8512]),
    ("splitwise-hhcap", "conversation", "prompt-", [21.4853, 237.846, 0.753, 0.6142, 15.2612, 106.828],
     [12.1601, 237.846, 0.753, 0.6142, 15.2612, 106.828]),
    ("splitwise-hhcap", "coding", "token-", [227.4451, 4.1567, 0.9635, 0.5729, 24.3047, 53.7557],
     [227.4451, 1.3542, 0.9635, 0.5729, 24.3047, 53.7557]),
]


# Former entries of the list above that hold since the percentile solver converges
# (issue 12: the previous solver stopped up to 2% short of the root, which is what
# lowered these latencies, not the model): kept as checks that they stay monotone.
_FORMER_VIOLATIONS = [
    ("baseline-h100", "coding", "rate (operating point)", [40, 0, 1, 1, 23.0, 30.0], [40, 0, 1, 1, 23.0, 45.0]),
    ("splitwise-hh", "coding", "prompt- (operating point)", [26, 4, 1, 1, 23.0, 40.0], [24, 4, 1, 1, 23.0, 40.0]),
    ("baseline-a100", "conversation", "rate", [4.9416, 121.5353, 0.5787, 0.9123, 21.7669, 1.782],
     [4.9416, 121.5353, 0.5787, 0.9123, 21.7669, 2.7478]),
    ("baseline-h100", "coding", "rate", [31.2898, 40.0993, 0.4328, 0.9476, 18.3407, 12.4229],
     [31.2898, 40.0993, 0.4328, 0.9476, 18.3407, 15.5436]),
    # Monotone since Little's law counts a run that starts empty (issue 39, pool.window_share;
    # its strict xfail passed).
    ("splitwise-ha", "conversation", "rate", [0.4881, 101.049, 0.9905, 0.3716, 23.5425, 192.0276],
     [0.4881, 101.049, 0.9905, 0.3716, 23.5425, 557.8984]),
    # Monotone since queued prompts share iterations on colocated pools (issue 39,
    # pool._batched_rates; their strict xfails passed).
    ("baseline-a100", "coding", "prompt-", [1.0616, 232.3693, 0.8507, 0.6109, 25.0549, 15.6935],
     [0.9489, 232.3693, 0.8507, 0.6109, 25.0549, 15.6935]),
    ("baseline-h100", "conversation", "prompt-", [47.9437, 28.7921, 0.8935, 0.5931, 18.5173, 559.3246],
     [44.584, 28.7921, 0.8935, 0.5931, 18.5173, 559.3246]),
    # Monotone again since the drafting regime became the default (thirty-second
    # session; its strict xfail passed). Before it, monotone from the eleventh session
    # (flows_splitwise._after_onset) until the thirteenth's decode residual
    # (pool.pool_state_at: a prompt reaching a decoding machine waits t_d / 2 whatever the
    # prompt load). At this corner (a 4 MB/s KV link)
    # the mixed prompt machines hold moved decodes with a 74 ms iteration, so their
    # prompts wait 37 ms, while a prompt drafted onto the nearly idle token pool waits
    # 4 ms; from 107 to 301 req/s the drafted share of the smallest class rises from 3 %
    # to 60 % and TTFT P50 falls 0.222 -> 0.213 s (full resolution 0.219 -> 0.213).
    # Our simulator at 21 + 238 machines, same caps and link (2 seeds, 2026-12-05):
    # TTFT P50 0.79 s at 107 req/s, 1.13-1.16 s at 150: it rises, and the model is 3.6x
    # low here; the old drafting law's route was what missed (issue 39).
    ("splitwise-hhcap", "conversation", "rate", [21.4853, 237.846, 0.753, 0.6142, 15.2612, 106.828],
     [21.4853, 237.846, 0.753, 0.6142, 15.2612, 300.9845]),
    # Monotone since the mixed pool (issue 10, docs/cluster.md §4).
    ("splitwise-ha", "coding", "prompt-", [99.0187, 2.2292, 0.3007, 0.7992, 27.1014, 553.9346],
     [59.4339, 2.2292, 0.3007, 0.7992, 27.1014, 553.9346]),
]


@pytest.mark.parametrize("design, workload, change, before, after", _FORMER_VIOLATIONS,
                         ids=[f"{d}-{w}-{c}" for d, w, c, _, _ in _FORMER_VIOLATIONS])
def test_latency_never_falls_former_violations(design, workload, change, before, after):
    assert not _latency_drops(design, workload, before, [after])


@pytest.mark.xfail(strict=True, reason=_NON_MONOTONE)
@pytest.mark.parametrize("design, workload, change, before, after", _VIOLATIONS,
                         ids=[f"{d}-{w}-{c}" for d, w, c, _, _ in _VIOLATIONS])
def test_latency_never_falls_known_violations(design, workload, change, before, after):
    assert not _latency_drops(design, workload, before, [after])
