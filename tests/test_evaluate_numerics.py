"""Numerics of `evaluate` end to end: the float32 path users get from the quick start
(JAX's default precision) against float64, with finite values and gradients, and
reverse-mode gradients with respect to pool sizes, caps, KV bandwidth and rate against
finite differences, input by input.

tests/conftest.py turns float64 on for the whole session, so the float32 run happens in
a fresh interpreter (a subprocess) that never enables it.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import fixture_module

import splitwise_jax as sj
from splitwise_jax.cluster.cluster import Resolution

ROOT = Path(__file__).resolve().parent.parent
RES = Resolution(window_points=4, table_points=32, grid_points=16, refine_iters=4)
# (design, prompt machines, token machines, rate): light, moderate and overloaded points,
# then nearly idle pools, where float32 once gave NaN values and gradients (a drafted
# share or a count tail near 1e-38, divided by a 1e-30 floor whose inverse square
# overflows float32: `_smooth.den_floor`). The last three came from a random search over
# the property tests' domain in float32 (2026-12-03), the fourth is the optimiser's start
# point for Fig. 12 (32 + 8 machines).
POINTS = [("splitwise-hh", 26.0, 4.0, 70.0), ("splitwise-hh", 12.0, 3.0, 70.0), ("splitwise-hh", 26.0, 4.0, 20.0),
          ("splitwise-hh", 32.0, 8.0, 70.0), ("splitwise-hh", 178.3, 10.3, 1.58), ("splitwise-hh", 4.75, 47.7, 0.042),
          ("splitwise-hh", 36.6, 16.7, 0.18)]
METRICS = ("ttft_s", "tbt_s", "e2e_s", "throughput_rps", "power_kw", "cost_per_hour", "memory_pressure")

# The same program in both precisions (tests/fixtures/float_precision_run.py): evaluate at
# the points' pool sizes and rates, on each workload coarsened to 8 x 8 classes (one
# program: the workload is an argument). In float32 it also takes the gradient of the log
# latencies, throughput and power with respect to (prompt machines, token machines, rate).
# float32 runs as a script in a fresh interpreter (JAX's default precision); float64 runs
# here, where conftest has turned x64 on.
_SCRIPT = ROOT / "tests" / "fixtures" / "float_precision_run.py"


def _run_float32() -> dict:
    proc = subprocess.run([sys.executable, str(_SCRIPT), json.dumps(POINTS), json.dumps(METRICS), "grad"],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _env() -> dict:
    import os

    env = dict(os.environ)
    env.pop("JAX_ENABLE_X64", None)  # the float32 run must get JAX's default
    return env


@pytest.fixture(scope="session")
def float32_run() -> dict:
    return _run_float32()


@pytest.mark.parametrize("workload", ["coding", "conversation"])
def test_float32_evaluate_is_finite(float32_run, workload):
    """Every metric and the gradient of the log metrics finite in float32, nearly idle
    pools included (before `_smooth.den_floor` the last three points gave NaN on
    conversation and NaN gradients on coding)."""
    run = float32_run[workload]
    assert run["dtype"] == "float32"
    for k in METRICS:
        assert np.all(np.isfinite(np.asarray(run[k]))), (k, np.asarray(run[k]))
    assert np.all(np.isfinite(np.asarray(run["grad"]))), np.asarray(run["grad"])


def test_float32_is_close_to_float64(float32_run):
    """Latency percentiles, throughput, power and cost within 1e-3 relative of float64.

    Origin: float32 carries ~7 significant digits (eps 1.2e-7); the pool fixed point
    (12 Newton steps), the tabulated wait law (32 points, linear interpolation in log x)
    and the percentile solver's secant steps each amplify rounding by at most a few
    hundred near steep CDFs, which leaves 1e-4 typical, 1e-3 worst (measured below
    that at these points)."""
    f64 = fixture_module("float_precision_run").run(POINTS, list(METRICS), grad=False)
    for name, run in f64.items():
        assert run["dtype"] == "float64"
        for k in METRICS:
            a, b = np.asarray(float32_run[name][k]), np.asarray(run[k])
            for i in range(len(POINTS)):
                rtol = _ILL_CONDITIONED.get((name, i, k), 1e-3)
                np.testing.assert_allclose(a[i], b[i], rtol=rtol, atol=1e-9, err_msg=f"{name}, {POINTS[i]}: {k}")


# Where a percentile is ill-conditioned, float32's rounding of the CDF moves it further.
# Conversation on 12 + 3 machines at 70 req/s is deep overload (E2E P50 ~23 s, P90 ~71 s):
# there the float64 E2E CDF rises by only 3.3e-4 between the float64 and float32 P50
# (22.74 and 22.89 s, dF/dlog t ~ 0.05; measured 2026-12-03), so a float32 error of a
# few 1e-4 in F moves the time by 0.6 %: 1e-2 for that metric at that point.
_ILL_CONDITIONED = {("conversation", 1, "e2e_s"): 1e-2}


# --------------------------------------------------------------------------------------
# Gradients


@pytest.fixture(scope="module")
def grad_case():
    wl = sj.coarsen(sj.load_workload("coding", 1.0), 4, 4)
    base = sj.make_cluster("splitwise-hhcap", 26.0, 4.0)

    def f(x):
        """log P50 and P90 of TTFT, TBT and E2E, log throughput and log power, summed,
        at x = (n_prompt, n_token, token cap, log KV bandwidth, rate)."""
        c = base.replace(n_prompt=x[0], n_token=x[1], token=dataclasses.replace(base.token, cap_frac=x[2]),
                         transfer=dataclasses.replace(base.transfer, bandwidth_bytes_per_s=jnp.exp(x[3])))
        m = sj.evaluate(c, wl.with_rate(x[4]), resolution=Resolution())
        body = jnp.concatenate([m.ttft_s[:2], m.tbt_s[:2], m.e2e_s[:2], m.throughput_rps[None], m.power_kw[None]])
        return jnp.sum(jnp.log(body))

    x0 = jnp.asarray([26.0, 4.0, 0.7, float(jnp.log(base.transfer.bandwidth_bytes_per_s)), 60.0])
    # One compiled program gives both the values the finite differences need and the
    # gradient (`check_grads` on a jitted f compiled three: f, and the forward and
    # transposed halves of its VJP; this test 29 -> 19.5 s alone, 2026-12-03).
    return jax.jit(jax.value_and_grad(f)), x0


def test_gradient_wrt_pools_caps_bandwidth_rate_matches_finite_differences(grad_case):
    """Reverse-mode gradient against central differences (step 1e-4 in each input's units:
    machines, fraction of TDP, log bytes/s, req/s), input by input.

    Tolerance 2e-3 (absolute and relative, per component): the percentile solver places a
    percentile to ~1e-9 relative at the default resolution (tests/test_quantiles.py), so
    central differences of step 1e-4 carry ~1e-5 of solver noise and ~1e-8 of truncation;
    the smooth minima of the pool model (temperatures 0.01-0.02) curve the function over
    the step by less than 1e-3. P99 is left out: on a 4 x 4 class mixture the 99th
    percentile sits on one class's steep component, where a finite-difference step moves
    the solver's bracket (its implicit gradient is checked against the closed form in
    tests/test_quantiles.py). Each component is checked, which is stricter than
    `check_grads`' one random projection (used here before 2026-12-03)."""
    value_and_grad, x0 = grad_case
    value, grad = value_and_grad(x0)
    assert np.isfinite(float(value))
    eps = 1e-4
    fd = np.array([(float(value_and_grad(x0.at[i].add(eps))[0]) - float(value_and_grad(x0.at[i].add(-eps))[0]))
                   / (2 * eps) for i in range(x0.size)])
    np.testing.assert_allclose(np.asarray(grad), fd, rtol=2e-3, atol=2e-3)


def test_gradient_is_finite_at_the_edges(grad_case):
    """Overload (rate x 5), the cap floor and a 1 MB/s link: finite gradients."""
    value_and_grad, x0 = grad_case
    floor = float(200.0 / 700.0)  # H100 min cap / TDP (catalog), the floor of the token cap
    for x in (x0.at[4].multiply(5.0), x0.at[2].set(floor), x0.at[3].set(jnp.log(1e6))):
        g = value_and_grad(x)[1]
        assert np.all(np.isfinite(np.asarray(g))), (x, g)
