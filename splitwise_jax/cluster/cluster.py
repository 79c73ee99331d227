"""The cluster model: a design (`Cluster`, carrying its `strategy`) under a workload,
as one vectorised fluid/queueing model (`evaluate`).

`evaluate` reads as its stages (docs/cluster.md derives each):

1. request classes (`_classes`): prompt size x output size, from the workload;
2. with a trace's arrival curve, window by window (`window`): each window's load
   (`window.window_loads`), the prompt pool's backlog carried over the windows
   (`window.window_regimes`);
3. flows (`cluster.strategy.flows`): who runs where, each pool's steady state and wait
   law; the design's own model (`flows_baseline`, `flows_splitwise`, `chunked`);
4. latency components per route, class and number of prompt iterations a decode sits
   through (`components.components`; per window and regime,
   `window.window_components`);
5. quantiles: percentiles of the mixtures (`percentiles.quantiles`), slowdowns, SLO margins;
6. metrics: throughput, power, cost (`totals.totals`), loads and status (`_metrics`).

Each pool is a fluid model of continuous batching (pool.py) plus a c-server queue for
prompts (queueing.py). Latency percentiles are percentiles of the mixture over request
classes (prompt size x output size, from the workload) and routes, solved by bisection
with implicit gradients (quantiles.py). Metric definitions follow the reference
simulator (shared/validation/README.md): TTFT ends when the prompt ends (transfer not
included); TBT = (E2E - TTFT) / output tokens per request; slowdowns against the request
alone on one DGX-A100.

Everything is a pure function of pytrees: `evaluate` jits, vmaps over pool sizes, caps,
bandwidths and rates, and differentiates with respect to all of them. The design is a
static field (`Cluster.strategy`): one compiled program per design.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import NamedTuple

import jax
import jax.numpy as jnp

from splitwise_jax._roots import ROOT_STEPS as _ROOT_STEPS  # noqa: F401  (tests' old path)
from splitwise_jax._roots import fixed_point_01 as _fixed_point_01  # noqa: F401
from splitwise_jax.cluster.components import Mixtures, components
from splitwise_jax.cluster.components import _count_mixture as _count_mixture  # noqa: F401
from splitwise_jax.cluster.metrics import ClusterMetrics, status_code
from splitwise_jax.cluster.percentiles import SWEEP_RESOLUTION, Resolution, quantiles
from splitwise_jax.cluster.queueing import Burstiness
from splitwise_jax.cluster.strategies import SPLITWISE, strategy_for
from splitwise_jax.cluster.strategy import DesignStrategy
from splitwise_jax.cluster.totals import totals
from splitwise_jax.cluster.types import Classes, Flows, Scheduling, Transfer
from splitwise_jax.cluster.window import backlog_fluid as _backlog_fluid  # noqa: F401  (tests' old path)
from splitwise_jax.cluster.window import window_components, window_loads, window_regimes
from splitwise_jax.cluster.workload import Workload
from splitwise_jax.phases.timing import PhaseTiming
from splitwise_jax.specs.paper import PAPER_SLO

__all__ = ["Cluster", "ClusterMetrics", "PAPER_SLO", "Resolution", "SWEEP_RESOLUTION", "Scheduling", "Transfer",
           "evaluate"]

_STATIC = dict(static=True)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Cluster:
    """A cluster design with its pool sizes (continuous) and phase timings.

    Attributes:
        prompt: timing of the prompt-pool machines (all machines, for a colocated design).
        token: timing of the token-pool machines (unused by a colocated design).
        alone: timing of the slowdown reference (one DGX-A100 at full power).
        n_prompt: prompt machines (a colocated design's machine count).
        n_token: token machines (0 for a colocated design).
        transfer: KV-cache transfer.
        scheduling: scheduler knobs.
        strategy: the design (`strategy.DesignStrategy`: its flows, pools and hooks;
            static): `strategies.SPLITWISE`, `BASELINE` or `CHUNKED`.
        name: design name (static).
    """

    prompt: PhaseTiming
    token: PhaseTiming
    alone: PhaseTiming
    n_prompt: jax.Array | float
    n_token: jax.Array | float
    transfer: Transfer
    scheduling: Scheduling = Scheduling()
    strategy: DesignStrategy = field(default=SPLITWISE, metadata=_STATIC)
    name: str = field(default="custom", metadata=_STATIC)

    @property
    def kind(self) -> str:
        """The design's name in files and outputs: "baseline", "chunked" or "splitwise"
        (read-only: `strategy.kind`)."""
        return self.strategy.kind

    def replace(self, **changes) -> "Cluster":
        """The same cluster with fields changed; `kind=` (a design kind's name) sets the
        strategy, as it set the old `kind` field."""
        if "kind" in changes:
            changes["strategy"] = strategy_for(changes.pop("kind"))
        return dataclasses.replace(self, **changes)


def evaluate(cluster: Cluster, workload: Workload, horizon_s=120.0, slo=PAPER_SLO,
             resolution: Resolution = Resolution()) -> ClusterMetrics:
    """Predict a cluster's latency percentiles, SLO verdict, throughput, power and cost.

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
    strategy = cluster.strategy
    strategy.check(cluster)
    lam = jnp.asarray(workload.rate_per_s, float)
    cls = _classes(workload)
    prof = workload.profile
    # issue 39: the decoding population over the whole run, started empty and drained
    # (pool.window_share); a trace's windows share one run.
    window = horizon_s if prof is None else prof.window_s * prof.rate_rel.shape[0]
    if prof is None:
        flows = strategy.flows(cluster, cls, lam, jnp.asarray(workload.arrival_cv2, float), horizon_s, resolution,
                               window)
        mixtures = components(cluster, cls, flows, resolution, window)
    else:
        # A trace's own arrival curve: the model window by window (each window's rate,
        # burstiness and length), latencies the arrival-weighted mixture over windows.
        # Throughput, power and cost are those of the mean rate.
        loads = window_loads(strategy, cluster, cls, lam, prof, resolution, window)
        regimes = window_regimes(cluster, cls, prof, loads)
        mean_idc = jnp.dot(prof.rate_rel, prof.idc) / jnp.sum(prof.rate_rel)  # as the arrivals see it
        flows = strategy.flows(cluster, cls, lam, Burstiness(mean_idc, prof.idc_scale_s),
                               prof.window_s * prof.rate_rel.shape[0], resolution, window)
        mixtures = window_components(strategy, cluster, cls, lam, prof, regimes, resolution, window)
    latency = _latency(mixtures, slo, resolution)
    return _metrics(cluster, cls, flows, lam, latency)


def _classes(wl: Workload) -> Classes:
    """Stage 1: the workload's request classes (K prompt sizes x M output sizes)."""
    p = jnp.asarray(wl.prompt_tokens, float)
    o = jnp.asarray(wl.output_tokens, float)
    w = jnp.asarray(wl.weights, float)
    wp = jnp.sum(w, axis=1)
    iters = jnp.maximum(o - 1.0, 0.0)
    mean_iters = jnp.sum(w * iters[None, :])
    # Context of a decoding request, averaged over its decode iterations.
    ctx = jnp.sum(w * iters[None, :] * (p[:, None] + 0.5 * o[None, :])) / jnp.maximum(mean_iters, 1e-9)
    # The KV memory it holds: the prompt and the whole output, reserved when it starts.
    mem_ctx = jnp.sum(w * iters[None, :] * (p[:, None] + o[None, :])) / jnp.maximum(mean_iters, 1e-9)
    return Classes(p, p * p, o, w, wp, iters, mean_iters, ctx, mem_ctx)


class _Latency(NamedTuple):
    times: tuple          # (TTFT, TBT, E2E) percentile triples (s)
    slowdowns: jax.Array  # (3, 3)
    margin: jax.Array     # (3, 3) log(limit / slowdown)


def _latency(mixtures: Mixtures, slo, res: Resolution) -> _Latency:
    """Stage 5: the mixtures' percentiles, their slowdowns and the SLO margins."""
    (ttft, sd_ttft), (tbt, sd_tbt), (e2e, sd_e2e) = (quantiles(m, res) for m in mixtures)
    slowdowns = jnp.stack([sd_ttft, sd_tbt, sd_e2e])
    margin = jnp.log(jnp.asarray(slo, float) / slowdowns)
    return _Latency((ttft, tbt, e2e), slowdowns, margin)


def _metrics(cluster: Cluster, cls: Classes, flows: Flows, lam, latency: _Latency) -> ClusterMetrics:
    """Stage 6: throughput, power and cost, the pools' loads and the status bits."""
    throughput, power_w, cost, prov = totals(cluster.strategy, cluster, cls, flows, lam)
    st_p, st_t = flows.st_p, flows.st_t
    rho_t = st_t.rho_prompt if st_t is not None else jnp.asarray(0.0)
    batch_t = st_t.batch if st_t is not None else jnp.asarray(0.0)
    x_tot = jnp.dot(cls.wp, flows.drafted)
    (ttft, tbt, e2e), sd, margin = latency
    return ClusterMetrics(
        ttft_s=ttft, tbt_s=tbt, e2e_s=e2e,
        slowdown_ttft=sd[0], slowdown_tbt=sd[1], slowdown_e2e=sd[2],
        slo_margin=margin, meets_slo=jnp.all(margin > 0), throughput_rps=throughput,
        cost_per_hour=cost, power_kw=power_w / 1e3, provisioned_power_kw=prov / 1e3,
        rho_prompt_pool=st_p.rho_prompt, rho_token_pool=rho_t,
        batch_prompt_pool=st_p.batch, batch_token_pool=batch_t, memory_pressure=flows.memory_pressure,
        mixed_prompt_frac=x_tot, mixed_decode_frac=flows.moved,
        status=status_code(st_p.rho_prompt, rho_t, flows.memory_pressure, x_tot, flows.moved),
    )
