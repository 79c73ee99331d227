"""Evaluation speed: configurations per second, and what a gradient costs.

Splitwise-HH serving coding at 70 req/s (the paper's Fig. 12 problem), on the 16x16
coarsened workload the optimiser searches and on the full-resolution one. Measured,
once compiled (best of `--repeats`):

* configurations evaluated per second: one jitted `evaluate` per call; the optimiser's
  batch function (`optimize.spec.assess_batch`, `lax.map` over 64 configurations); a
  `vmap` over the same 64 for comparison; and `sweep.sweep` of 256 configurations over
  every local device (one per core: `use_cpu_cores`);
* the cost of a gradient: jitted `value_and_grad` of a scalar of the metrics (the sum
  of the nine SLO margins) with respect to the pool sizes, over the jitted forward
  alone; and one step of the optimiser (`optimize.gradient._al_round`, a scan of Adam steps on
  the augmented Lagrangian) over one configuration of `_assess_batch`;
* compile time of each function (first call minus a compiled call).

Usage:
    python benchmarks/eval_speed.py [--repeats 5] [--json PATH]
    SPLITWISE_SMOKE=1 python benchmarks/eval_speed.py    # coarse workload only, 2 repeats
"""

from __future__ import annotations

import argparse
import json
import os
import time

from splitwise_jax.sweep import use_cpu_cores

N_DEVICES = use_cpu_cores()  # before JAX starts its backend

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_enable_x64", True)

from splitwise_jax.cluster.cluster import Resolution  # noqa: E402
from splitwise_jax.optimize import gradient, spec as S  # noqa: E402
from splitwise_jax.optimize.problem import CONSTRAINT_NAMES, Problem  # noqa: E402
from splitwise_jax.cluster.cluster import evaluate  # noqa: E402
from splitwise_jax.cluster.designs import make_cluster  # noqa: E402
from splitwise_jax.sweep import sweep  # noqa: E402
from splitwise_jax.cluster.workload import coarsen, workload  # noqa: E402

SMOKE = os.environ.get("SPLITWISE_SMOKE", "") not in ("", "0")


def _sweep_row(row, cluster, wl):
    return evaluate(cluster.replace(n_prompt=row[0], n_token=row[1]), wl).slo_margin


def timed(fn, *args, repeats: int):
    """(first call s, best compiled call s) of fn(*args), results blocked on."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    first = time.perf_counter() - t0
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return first, best


def bench(wl_name: str, bins: int, repeats: int) -> dict:
    wl = workload("coding", 70.0)
    if bins:
        wl = coarsen(wl, bins, bins)
    cluster = make_cluster("splitwise-hh", 30.0, 5.0)
    x = jnp.asarray([30.0, 5.0])

    def margins(x):
        return jnp.sum(evaluate(cluster.replace(n_prompt=x[0], n_token=x[1]), wl).slo_margin)

    fwd = jax.jit(margins)
    grad = jax.jit(jax.value_and_grad(margins))
    batch = jnp.tile(jnp.asarray([30.0, 5.0, 1.0, 1.0, 70.0]), (S.CHUNK, 1))
    spec, _ = S.make_spec(cluster, wl, Problem("cost"))
    res = Resolution()
    vmapped = jax.jit(jax.vmap(lambda p: S.assess(spec, p, res)))
    steps = 10
    u = jnp.asarray([np.log(30.0), np.log(5.0), 6.0, 6.0, np.log(70.0)])
    al_args = (u, gradient._ADAM.init(u), jnp.zeros(len(CONSTRAINT_NAMES)), jnp.asarray(10.0), jnp.asarray(0.05),
               jnp.asarray(0.01), spec)

    out = {"workload": wl_name, "classes": f"{len(wl.prompt_tokens)}x{len(wl.output_tokens)}"}
    f1, f = timed(fwd, x, repeats=repeats)
    g1, g = timed(grad, x, repeats=repeats)
    b1, b = timed(lambda p: S.assess_batch(p, spec, res), batch, repeats=repeats)
    v1, v = timed(vmapped, batch, repeats=repeats)
    a1, a = timed(lambda *z: gradient._al_round(*z, steps=steps, resolution=res), *al_args, repeats=repeats)
    n_sweep = 256
    rows = np.stack([np.linspace(20.0, 38.0, n_sweep), np.linspace(2.0, 10.0, n_sweep)], axis=1)
    shared = jax.tree.map(np.asarray, (cluster, wl))
    s1, s = timed(lambda r: sweep(_sweep_row, r, shared), rows, repeats=repeats)
    out.update(
        forward_s=f, forward_compile_s=f1 - f, value_and_grad_s=g, grad_compile_s=g1 - g, grad_over_forward=g / f,
        batch_configs_per_s=S.CHUNK / b, batch_compile_s=b1 - b, vmap_configs_per_s=S.CHUNK / v,
        vmap_compile_s=v1 - v, single_configs_per_s=1.0 / f, al_step_s=a / steps, al_compile_s=a1 - a,
        al_step_over_batch_config=(a / steps) / (b / S.CHUNK),
        sweep_configs_per_s=n_sweep / s, sweep_compile_s=s1 - s, sweep_devices=N_DEVICES,
    )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2 if SMOKE else 5)
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()
    cases = [("coding 16x16", 16)] + ([] if SMOKE else [("coding full", 0)])
    rows = [bench(name, bins, args.repeats) for name, bins in cases]
    print(f"{'workload':<14} {'classes':>8} {'cfg/s 1-by-1':>13} {'cfg/s batch':>12} {'cfg/s vmap':>11} "
          f"{'cfg/s sweep':>12} {'grad/fwd':>9} {'AL step/cfg':>12} {'compile fwd/grad/batch/AL/sweep s':>34}")
    for r in rows:
        comp = (f"{r['forward_compile_s']:.1f}/{r['grad_compile_s']:.1f}/{r['batch_compile_s']:.1f}/"
                f"{r['al_compile_s']:.1f}/{r['sweep_compile_s']:.1f}")
        print(f"{r['workload']:<14} {r['classes']:>8} {r['single_configs_per_s']:>13.0f} {r['batch_configs_per_s']:>12.0f} "
              f"{r['vmap_configs_per_s']:>11.0f} {r['sweep_configs_per_s']:>12.0f} {r['grad_over_forward']:>9.2f} "
              f"{r['al_step_over_batch_config']:>12.2f} {comp:>34}")
    print(f"sweep: {N_DEVICES} devices ({jax.default_backend()}); goals (issue 12): >= 2,000 cfg/s batched at full "
          "resolution, gradient <= 3x forward")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
