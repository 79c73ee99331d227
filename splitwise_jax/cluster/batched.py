"""`evaluate` with a batching rule: `jax.vmap` of it runs the configurations one at a
time on CPU (`lax.map`, sweep's path), not as one vectorised program.

Why: `jax.jit(jax.vmap(evaluate))` of the paper's Fig. 12 grid (1,521 clusters) took
33-41 s on the 2-core machine where `splitwise_jax.sweep` took 6 s. Vectorising the
model turns each of its loops (the pools' Newton steps, the drafting and overflow fixed
points, the percentile search's safeguarded Newton steps) into one loop over the whole
batch that runs until its slowest element is done, with every exit and branch a select
over the batch; its table lookups become batched gathers; and its (points, components)
arrays grow by the batch size (the E2E mixture's 17,920 components x 1,521 rows),
out of every cache. One configuration at a time does none of that, and on CPU it is
what `sweep` and the optimiser's `assess_batch` already do (docs/speed.md §6).

How: `evaluate` here is the model function (`cluster.cluster.evaluate`) wrapped twice:
* a `jax.custom_batching.custom_vmap` whose rule maps the batched arguments row by row
  (`lax.map`) with the unbatched ones shared, on CPU; on an accelerator the rule is the
  plain `vmap` (a GPU needs the whole batch at once). The mapped body calls this
  `evaluate` again, so a `vmap` of a `vmap` maps twice;
* outside it a `jax.custom_jvp` whose rule is the JVP of the plain model function, so
  forward and reverse differentiation (the implicit-function rules of its roots) are
  exactly what they were: `custom_vmap` alone has no reverse mode. A gradient inside a
  `vmap` therefore batches the plain model (vectorised) as before.
Outside any transformation (concrete arrays) it calls the model function directly, and
under `jit` the wrappers inline, so a jitted call compiles the same program as before.

Example:
    >>> import jax, jax.numpy as jnp, splitwise_jax as sj
    >>> wl = sj.load_workload("coding", rate_per_s=70.0)
    >>> c = sj.make_cluster("splitwise-hh", 27, 3)
    >>> f = jax.jit(jax.vmap(lambda n: sj.evaluate(c.replace(n_prompt=n), wl).e2e_s))
    >>> f(jnp.arange(20.0, 30.0)).shape  # doctest: +SKIP
    (10, 3)
"""

from __future__ import annotations

import functools

import jax
from jax.custom_batching import custom_vmap

from splitwise_jax.cluster import cluster as _model
from splitwise_jax.cluster.percentiles import Resolution
from splitwise_jax.cluster.cluster import Cluster
from splitwise_jax.cluster.metrics import ClusterMetrics
from splitwise_jax.cluster.workload import Workload


def _vectorise() -> bool:
    """Whether the batching rule vectorises (an accelerator) or maps row by row (CPU)."""
    return jax.default_backend() != "cpu"


@functools.lru_cache(maxsize=64)
def _wrapped(resolution: Resolution, tree):
    """The model at this (static) resolution on the leaves of arguments shaped as `tree`,
    with its batching and JVP rules.

    The wrappers take the arguments' leaves, not the arguments: JAX rebuilds a wrapped
    function's arguments from flags (batched or not) and zero tangents, and a `Cluster`
    rebuilt from those would run the specs' checks of plain numbers on them."""

    def plain(*leaves):
        return _model.evaluate(*jax.tree_util.tree_unflatten(tree, leaves), resolution=resolution)

    @custom_vmap
    def mapped(*leaves):
        return plain(*leaves)

    @mapped.def_vmap
    def _rule(axis_size, in_batched, *leaves):
        del axis_size
        rows = [x for x, b in zip(leaves, in_batched) if b]

        def one(row, fn):
            it = iter(row)
            return fn(*[next(it) if b else x for x, b in zip(leaves, in_batched)])

        if _vectorise():
            out = jax.vmap(lambda r: one(r, plain))(rows)
        else:
            out = jax.lax.map(lambda r: one(r, outer), rows)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    @jax.custom_jvp
    def outer(*leaves):
        return mapped(*leaves)

    @outer.defjvp
    def _jvp(primals, tangents):
        return jax.jvp(plain, primals, tangents)

    return outer


def evaluate(cluster: Cluster, workload: Workload, horizon_s=120.0, slo=_model.PAPER_SLO,
             resolution: Resolution = Resolution()) -> ClusterMetrics:
    """Predict a cluster's latency percentiles, SLO verdict, throughput, power and cost.

    The model function `splitwise_jax.cluster.cluster.evaluate` (same arguments, same
    values, same gradients), whose `jax.vmap` runs one configuration at a time on CPU
    (module docstring): `jax.jit(jax.vmap(evaluate))` of a grid then runs at the speed
    of `splitwise_jax.sweep.sweep` on one device.

    Args:
        cluster: the design, its pool sizes and timings (see `make_cluster`).
        workload: request classes and arrival process.
        horizon_s: length of the arrival window (s); with overload, queues grow for
            this long (finite-window prediction, never infinite).
        slo: (3, 3) slowdown limits, rows TTFT/TBT/E2E, columns P50/P90/P99.
        resolution: numerical resolution (static).

    Returns:
        ClusterMetrics.
    """
    args = (cluster, workload, horizon_s, slo)
    if not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(args)):
        return _model.evaluate(*args, resolution=resolution)  # eager: nothing to batch or differentiate
    leaves, tree = jax.tree_util.tree_flatten(args)
    return _wrapped(resolution, tree)(*leaves)
