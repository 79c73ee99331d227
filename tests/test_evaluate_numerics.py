"""Numerics of `evaluate` end to end: the float32 path users get from the quick start
(JAX's default precision) against float64, and reverse-mode gradients with respect to
pool sizes, caps, KV bandwidth and rate against finite differences (`check_grads`).

tests/conftest.py turns float64 on for the whole session, so the float32 run happens in
a fresh interpreter (a subprocess) that never enables it.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import splitwise_jax as sj
from splitwise_jax.cluster import Resolution

ROOT = Path(__file__).resolve().parent.parent
RES = Resolution(window_points=4, table_points=32, grid_points=16, refine_iters=4)
# (design, prompt machines, token machines, rate): light, moderate and overloaded points.
POINTS = [("splitwise-hh", 26.0, 4.0, 70.0), ("splitwise-hh", 12.0, 3.0, 70.0), ("splitwise-hh", 26.0, 4.0, 20.0)]
METRICS = ("ttft_s", "tbt_s", "e2e_s", "throughput_rps", "power_kw", "cost_per_hour", "memory_pressure")

# The same program in both precisions: evaluate, vmapped over the points' pool sizes and
# rates, on the coding workload coarsened to 8 x 8 classes.
_PROGRAM = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import splitwise_jax as sj
    from splitwise_jax.cluster import Resolution
    RES = Resolution(window_points=4, table_points=32, grid_points=16, refine_iters=4)
    POINTS = json.loads(sys.argv[1])
    METRICS = json.loads(sys.argv[2])
    wl = sj.coarsen(sj.load_workload("coding", 1.0), 8, 8)
    c = sj.make_cluster(POINTS[0][0], 1.0, 1.0)
    def one(n_p, n_t, rate):
        return sj.evaluate(c.replace(n_prompt=n_p, n_token=n_t), wl.with_rate(rate), resolution=RES)
    cols = [jnp.asarray([p[i] for p in POINTS]) for i in (1, 2, 3)]
    m = jax.jit(jax.vmap(one))(*cols)
    print(json.dumps({"dtype": str(m.ttft_s.dtype),
                      **{k: np.asarray(getattr(m, k), dtype=np.float64).tolist() for k in METRICS}}))
""")


def _run(x64: bool) -> dict:
    code = _PROGRAM if not x64 else "import jax; jax.config.update('jax_enable_x64', True)\n" + _PROGRAM
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(POINTS), json.dumps(METRICS)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800, env={k: v for k, v in _env().items()})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _env() -> dict:
    import os

    env = dict(os.environ)
    env.pop("JAX_ENABLE_X64", None)  # the float32 run must get JAX's default
    return env


@pytest.fixture(scope="session")
def float32_run() -> dict:
    return _run(x64=False)


def test_float32_evaluate_is_finite(float32_run):
    assert float32_run["dtype"] == "float32"
    for k in METRICS:
        assert np.all(np.isfinite(np.asarray(float32_run[k]))), k


def test_float32_is_close_to_float64(float32_run):
    """Latency percentiles, throughput, power and cost within 1e-3 relative of float64.

    Origin: float32 carries ~7 significant digits (eps 1.2e-7); the pool fixed point
    (12 Newton steps), the tabulated wait law (32 points, linear interpolation in log x)
    and the percentile solver's secant steps each amplify rounding by at most a few
    hundred near steep CDFs, which leaves 1e-4 typical, 1e-3 worst (measured below
    that at these points)."""
    f64 = _run(x64=True)
    assert f64["dtype"] == "float64"
    for k in METRICS:
        np.testing.assert_allclose(np.asarray(float32_run[k]), np.asarray(f64[k]), rtol=1e-3, atol=1e-9, err_msg=k)


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
    return jax.jit(f), x0


def test_gradient_wrt_pools_caps_bandwidth_rate_matches_finite_differences(grad_case):
    """`check_grads`, first order, reverse mode, against central differences (step 1e-4
    in each input's units: machines, fraction of TDP, log bytes/s, req/s).

    Tolerance 2e-3 (absolute and relative, on projections of the gradient): the
    percentile solver places a percentile to ~1e-9 relative at the default resolution
    (tests/test_quantiles.py), so central differences of step 1e-4 carry ~1e-5 of solver
    noise and ~1e-8 of truncation; the smooth minima of the pool model (temperatures
    0.01-0.02) curve the function over the step by less than 1e-3. P99 is left out: on a
    4 x 4 class mixture the 99th percentile sits on one class's steep component, where a
    finite-difference step moves the solver's bracket (its implicit gradient is checked
    against the closed form in tests/test_quantiles.py)."""
    f, x0 = grad_case
    assert np.isfinite(float(f(x0)))
    check_grads(f, (x0,), order=1, modes=["rev"], eps=1e-4, atol=2e-3, rtol=2e-3)


def test_gradient_is_finite_at_the_edges(grad_case):
    """Overload (rate x 5), the cap floor and a 1 MB/s link: finite gradients."""
    f, x0 = grad_case
    floor = float(200.0 / 700.0)  # H100 min cap / TDP (catalog), the floor of the token cap
    for x in (x0.at[4].multiply(5.0), x0.at[2].set(floor), x0.at[3].set(jnp.log(1e6))):
        g = jax.grad(f)(x)
        assert np.all(np.isfinite(np.asarray(g))), (x, g)
