"""The split cluster as one vectorised fluid/queueing model.

Designs (Splitwise §V):
* `baseline`: N machines, each running prompts and decodes with mixed continuous
  batching (prompts first), join-the-shortest-queue routing.
* `splitwise`: a prompt pool (Np machines) and a token pool (Nt machines). Prompts go
  to the prompt pool; when it saturates (load past `draft_threshold`) the excess is
  drafted onto token machines, which then run mixed batches (the paper's mixed pool).
  Decodes go to the token pool; when its KV memory is full the excess decodes on
  prompt machines (mixed pool again). The KV cache moves from the prompt machine to
  the token machine, serialized or layer-wise.

Each pool is a fluid model of continuous batching (pool.py) plus a c-server queue for
prompts (queueing.py). Latency percentiles are percentiles of the mixture over request
classes (prompt size x output size, from the workload) and routes, solved by bisection
with implicit gradients (quantiles.py). Metric definitions follow the reference
simulator (shared/validation/README.md): TTFT ends when the prompt ends (transfer not
included); TBT = (E2E - TTFT) / output tokens per request; slowdowns against the request
alone on one DGX-A100.

Everything is a pure function of pytrees: `evaluate` jits, vmaps over pool sizes, caps,
bandwidths and rates, and differentiates with respect to all of them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.stats import norm

from splitwise_jax import kv_transfer, memory, power
from splitwise_jax.batch import Batch
from splitwise_jax._smooth import smooth_max_pos, smooth_min_one, smooth_min_pos, softplus
from splitwise_jax.pool import _MEMORY_P, PoolState, pool_state, pool_state_at
from splitwise_jax.quantiles import mixture_quantiles
from splitwise_jax.queueing import WaitModel, wait_cdf_busy, wait_model
from splitwise_jax.workload import Workload

_STATIC = dict(static=True)
PERCENTILES = (0.5, 0.9, 0.99)
# Splitwise Table VI: slowdown limits at P50, P90, P99 for TTFT, TBT, E2E.
PAPER_SLO = ((2.0, 3.0, 6.0), (1.25, 1.5, 5.0), (1.25, 1.5, 5.0))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Transfer:
    """How the KV cache moves between machines.

    Attributes:
        bandwidth_bytes_per_s: bytes/s of one transfer.
        setup_s: fixed cost per transfer (s).
        mode: "serialized" or "layerwise" (static).
        ignore_gqa: size the cache with every attention head, as SplitwiseSim does (static).
    """

    bandwidth_bytes_per_s: jax.Array | float
    setup_s: jax.Array | float
    mode: str = field(default="serialized", metadata=_STATIC)
    ignore_gqa: bool = field(default=False, metadata=_STATIC)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Scheduling:
    """Scheduler knobs (floats are traced).

    Attributes:
        draft_threshold: prompt-pool load above which prompts overflow to token
            machines. SplitwiseSim drafts when the least-loaded prompt machine has
            >8,192 tokens pending, which starts before saturation; 0.9 was chosen
            between 0.9 and 1.0 by the reference runs at 110 req/s (docs/cluster.md).
        draft_temperature: smoothness of that overflow (load units).
        memory_reserve_frac: HBM fraction not available to the KV cache.
        service_jitter_rel: relative spread given to each class's deterministic
            latency (the width of a workload bin and the profiles' ~1-2% repeat noise);
            it also turns CDF steps into slopes so percentiles have gradients.
    """

    draft_threshold: jax.Array | float = 0.9
    draft_temperature: jax.Array | float = 0.03
    memory_reserve_frac: jax.Array | float = 0.0
    service_jitter_rel: jax.Array | float = 0.03


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Cluster:
    """A cluster design with its pool sizes (continuous) and phase timings.

    Attributes:
        prompt: timing of the prompt-pool machines (all machines, for a baseline).
        token: timing of the token-pool machines (unused by a baseline).
        alone: timing of the slowdown reference (one DGX-A100 at full power).
        n_prompt: prompt machines (a baseline's machine count).
        n_token: token machines (0 for a baseline).
        transfer: KV-cache transfer.
        scheduling: scheduler knobs.
        kind: "baseline" or "splitwise" (static).
        name: design name (static).
    """

    prompt: object
    token: object
    alone: object
    n_prompt: jax.Array | float
    n_token: jax.Array | float
    transfer: Transfer
    scheduling: Scheduling = Scheduling()
    kind: str = field(default="splitwise", metadata=_STATIC)
    name: str = field(default="custom", metadata=_STATIC)

    def replace(self, **changes) -> "Cluster":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class Resolution:
    """Numerical resolution of `evaluate` (static; trades accuracy for speed).

    Attributes:
        window_points: quadrature points over the arrival window.
        table_points: log-spaced points tabulating each pool's wait CDF.
        grid_points: coarse grid that brackets each percentile.
        refine_iters: Illinois refinement steps per percentile.
    """

    window_points: int = 8
    table_points: int = 64
    grid_points: int = 24
    refine_iters: int = 6


class ClusterMetrics(NamedTuple):
    """Outputs of `evaluate` (arrays; leading axes follow any vmap).

    Percentile triples are (P50, P90, P99). `status` bits: 1 prompt pool overloaded,
    2 token pool overloaded, 4 KV memory full, 8 mixed pool active (>5% of prompts or
    decodes moved across pools).
    """

    ttft_s: jax.Array
    tbt_s: jax.Array
    e2e_s: jax.Array
    slowdown_ttft: jax.Array
    slowdown_tbt: jax.Array
    slowdown_e2e: jax.Array
    slo_margin: jax.Array          # (3, 3) log(limit / slowdown): > 0 meets
    meets_slo: jax.Array
    throughput_rps: jax.Array
    cost_per_hour: jax.Array
    power_kw: jax.Array
    provisioned_power_kw: jax.Array
    rho_prompt_pool: jax.Array
    rho_token_pool: jax.Array      # prompt load drafted onto token machines
    batch_prompt_pool: jax.Array
    batch_token_pool: jax.Array
    memory_pressure: jax.Array     # decode batch needed / batch that fits (token pool)
    mixed_prompt_frac: jax.Array   # prompts drafted onto token machines
    mixed_decode_frac: jax.Array   # decodes moved to prompt machines
    status: jax.Array


def _classes(wl: Workload):
    p = jnp.asarray(wl.prompt_tokens, float)
    o = jnp.asarray(wl.output_tokens, float)
    w = jnp.asarray(wl.weights, float)
    wp = jnp.sum(w, axis=1)
    iters = jnp.maximum(o - 1.0, 0.0)
    mean_iters = jnp.sum(w * iters[None, :])
    # Context of a decoding request, averaged over its decode iterations.
    ctx = jnp.sum(w * iters[None, :] * (p[:, None] + 0.5 * o[None, :])) / jnp.maximum(mean_iters, 1e-9)
    return p, o, w, wp, iters, mean_iters, ctx


def _batch_cap(timing, cluster: Cluster, ctx):
    cap_tokens = memory.kv_capacity_tokens(timing.llm, timing.machine, reserve_frac=cluster.scheduling.memory_reserve_frac,
                                           ignore_gqa=cluster.transfer.ignore_gqa)
    return cap_tokens / ctx


def _transfer_s(cluster: Cluster, p, prompt_s):
    tr = cluster.transfer
    nbytes = kv_transfer.kv_transfer_bytes(cluster.prompt.llm, p, tr.ignore_gqa)
    total = nbytes / tr.bandwidth_bytes_per_s
    if tr.mode == "serialized":
        return tr.setup_s + total
    L = cluster.prompt.llm.n_layers
    excess = softplus(total * (L - 1) / L - prompt_s * (L - 1) / L, 1e-3)
    return tr.setup_s + total / L + excess


def _pool_power_w(timing, n, st: PoolState, mean_p, mean_p2, ctx):
    busy = smooth_min_one(st.rho_prompt, 0.02)
    decoding = 1.0 - jnp.exp(-st.batch)
    gpu = timing.machine.gpu
    b = jnp.maximum(st.batch, 1.0)
    p_prompt, p_decode = timing.power_w(Batch(prompt_tokens=jnp.stack([mean_p, 0.0]), prompt_seqs=jnp.array([1.0, 0.0]),
                                              prompt_sq_tokens=jnp.stack([mean_p2, 0.0]), decode_seqs=jnp.stack([0.0, b]),
                                              decode_ctx_tokens=jnp.stack([0.0, b * ctx])))
    per_gpu = busy * p_prompt + (1.0 - busy) * (decoding * p_decode + (1.0 - decoding) * gpu.idle_w)
    return n * power.machine_power_w(timing.machine, per_gpu)


class _BusyTable(NamedTuple):
    """A route's busy-wait CDF tabulated on a log grid (interpolated per component)."""

    p_wait: jax.Array
    log_x0: jax.Array
    dlog: jax.Array
    values: jax.Array
    x_max: jax.Array


def _busy_table(wm: WaitModel, res: "Resolution") -> _BusyTable:
    # Far enough to cover queues growing over the window plus 8 standard deviations.
    x_max = jax.lax.stop_gradient(
        jnp.maximum(wm.drift, 0.0) * wm.horizon_s + 8.0 * jnp.sqrt(wm.var * wm.horizon_s)
        + 40.0 * wm.var / jnp.maximum(-wm.drift, 1e-3) + 1e-2)
    log_x0 = jnp.log(1e-5)
    dlog = (jnp.log(x_max) - log_x0) / (res.table_points - 1)
    xs = jnp.exp(log_x0 + dlog * jnp.arange(res.table_points))
    return _BusyTable(wm.p_wait, log_x0, dlog, wait_cdf_busy(xs, wm, res.window_points), x_max)


def _busy_cdf(x, tab: _BusyTable):
    n = tab.values.shape[0]
    u = jnp.clip((jnp.log(jnp.maximum(x, 1e-30)) - tab.log_x0) / tab.dlog, 0.0, n - 1.0)
    i = jnp.clip(jnp.floor(u), 0, n - 2).astype(int)
    frac = u - i
    v = tab.values[i] * (1.0 - frac) + tab.values[i + 1] * frac
    below = jnp.clip(x / jnp.exp(tab.log_x0), 0.0, 1.0)  # linear to zero under the grid
    return jnp.where(x > jnp.exp(tab.log_x0), v, tab.values[0] * below)


def _quantiles(shift, sd, weight, scale, tabs: _BusyTable, res: "Resolution"):
    """P50/P90/P99 of sum_j weight_j P((W_r + shift_j + noise_j) / scale_j <= t).

    Arrays are (R, K, M): routes x prompt classes x output classes; `tabs` holds each
    route's wait law. The noise is logistic with the scale of a normal of s.d. `sd`
    (1.702 matches the normal's slope at the median): cheaper than erf, equally smooth.
    """

    def cdf_one(t):
        x = t * scale - shift
        atom = jax.nn.sigmoid(1.702 * x / sd)
        busy = jax.vmap(_busy_cdf)(x, tabs)
        c = tabs.p_wait[:, None, None]
        return jnp.sum(weight * ((1.0 - c) * atom + c * busy))

    def cdf(ts):
        return jax.vmap(cdf_one)(ts)

    extra = tabs.x_max[:, None, None] * (tabs.p_wait[:, None, None] > 0)
    lo = 0.5 * jnp.min(jnp.maximum(shift - 6.0 * sd, 0.05 * shift) / scale)
    hi = 2.0 * jnp.max((shift + 8.0 * sd + extra) / scale)
    return mixture_quantiles(cdf, jnp.asarray(PERCENTILES), lo, hi, res.grid_points, res.refine_iters)


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
    sched = cluster.scheduling
    lam = jnp.asarray(workload.rate_per_s, float)
    ca2 = jnp.asarray(workload.arrival_cv2, float)
    p, o, w, wp, iters, mean_iters, ctx = _classes(workload)
    p_sq = p * p
    P, T = cluster.prompt, cluster.token
    n_p = jnp.asarray(cluster.n_prompt, float)
    cap_P = _batch_cap(P, cluster, ctx)

    if cluster.kind == "baseline":
        st_p = pool_state(P, n_p, lam, wp, p, p_sq, lam, mean_iters, ctx, cap_P)
        w_p = wait_model(lam, st_p.mean_prompt_s, st_p.scv_prompt, n_p, ca2, horizon_s)
        prompt_routes = [(st_p, w_p, 1.0)]
        decode_routes = [(st_p, 1.0)]
        kv = jnp.zeros_like(p)
        join = 0.0
        x = f = jnp.asarray(0.0)
        st_t = None
        pressure = st_p.batch_need / cap_P
        n_t = jnp.asarray(0.0)
    else:
        n_t = jnp.asarray(cluster.n_token, float)
        cap_T = _batch_cap(T, cluster, ctx)
        e_s0 = jnp.dot(wp, P.iteration_s(Batch.prompts(p)))
        rho0 = lam * e_s0 / jnp.maximum(n_p, 1e-6)
        x = softplus(rho0 - sched.draft_threshold, sched.draft_temperature) / jnp.maximum(rho0, 1e-9)
        x = smooth_min_one(x, 0.01) * (n_t / (n_t + 1e-3))
        # Token pool without a memory limit, then held to what fits: the decodes that do
        # not fit (Little's law at the capped batch) move to prompt machines. "Without a
        # limit" is 1000x the memory: past the token pool's decode capacity Little's law
        # has no fixed point and the Newton solve runs to this ceiling; at 1e12 the phase
        # model overflowed there in float32 (NaN for every metric) and memory_pressure
        # read 1e10. b_t is unchanged (smooth_min_pos of anything >> cap_T is cap_T).
        need = pool_state(T, n_t, lam * x, wp, p, p_sq, lam, mean_iters, ctx, 1e3 * cap_T).batch
        b_t = smooth_min_pos(need, cap_T, _MEMORY_P)
        st_t = pool_state_at(T, n_t, lam * x, wp, p, p_sq, lam, mean_iters, ctx, b_t)
        f = jnp.clip(1.0 - b_t / jnp.maximum(st_t.batch_need, 1e-12), 0.0, 1.0) * (n_p / (n_p + 1e-3))
        st_p = pool_state(P, n_p, lam * (1.0 - x), wp, p, p_sq, lam * f, mean_iters, ctx, cap_P)
        w_p = wait_model(lam * (1.0 - x), st_p.mean_prompt_s, st_p.scv_prompt, n_p, ca2, horizon_s)
        w_t = wait_model(lam * x, st_t.mean_prompt_s, st_t.scv_prompt, n_t, ca2, horizon_s)
        prompt_routes = [(st_p, w_p, 1.0 - x), (st_t, w_t, x)]
        decode_routes = [(st_t, 1.0 - f), (st_p, f)]
        kv = _transfer_s(cluster, p, st_p.prompt_s)
        pressure = need / cap_T

    jit_rel = sched.service_jitter_rel
    a_ttft, a_tbt = cluster.alone.alone_s(p, p_sq)
    a_e2e = a_ttft[:, None] + a_tbt[:, None] * iters[None, :]

    # Mixture components, one (K, M) block per (prompt route, decode route); every metric
    # uses the same block shape so one vmapped percentile solver serves all six
    # (three metrics, as times and as slowdowns): one copy to compile.
    blocks = {"ttft": [], "tbt": [], "e2e": []}
    route_tables = []
    route_weights = []
    for st, wm, wr in prompt_routes:
        s_k = st.residual_s + st.prompt_s
        table = _busy_table(wm, resolution)
        for st_d, wd in decode_routes:
            join = 0.5 * st_d.decode_s if cluster.kind != "baseline" else 0.0
            dec = kv[:, None] + join + iters[None, :] * st_d.tbt_mean_s
            dec_var = iters[None, :] * st_d.tbt_var_s2
            ttft_shift = jnp.broadcast_to(s_k[:, None], dec.shape)
            e2e_shift = s_k[:, None] + dec
            tbt_shift = dec / o[None, :]
            blocks["ttft"].append((ttft_shift, jit_rel * ttft_shift))
            blocks["e2e"].append((e2e_shift, jnp.sqrt((jit_rel * e2e_shift) ** 2 + dec_var)))
            blocks["tbt"].append((tbt_shift, jnp.sqrt((jit_rel * tbt_shift) ** 2 + dec_var / o[None, :] ** 2)))
            route_tables.append(table)
            route_weights.append(wr * wd * w)
    weights = jnp.stack(route_weights)
    tabs = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *route_tables)
    no_wait = tabs._replace(p_wait=jnp.zeros_like(tabs.p_wait))
    ones = jnp.ones_like(weights)
    variants = []
    for metric, scale in (("ttft", ones), ("tbt", ones), ("e2e", ones),
                          ("ttft", ones * a_ttft[:, None]), ("tbt", ones * a_tbt[:, None]), ("e2e", ones * a_e2e)):
        shift = jnp.stack([b_[0] for b_ in blocks[metric]])
        sd = jnp.stack([b_[1] for b_ in blocks[metric]])
        variants.append((shift, sd, weights, scale, no_wait if metric == "tbt" else tabs))
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *variants)
    out = jax.vmap(lambda v: _quantiles(*v, resolution))(stacked)
    ttft, tbt, e2e, sd_ttft, sd_tbt, sd_e2e = (out[i] for i in range(6))
    slowdowns = jnp.stack([sd_ttft, sd_tbt, sd_e2e])
    margin = jnp.log(jnp.asarray(slo, float) / slowdowns)
    meets = jnp.all(margin > 0)

    # Throughput: the offered rate, scaled down by the worst saturation.
    loads = [st_p.rho_prompt, pressure]
    if st_t is not None:
        loads.append(st_t.rho_prompt)
        loads.append(st_p.batch_need / cap_P)
    worst = loads[0]
    for l_ in loads[1:]:
        worst = smooth_max_pos(worst, l_, 16.0)
    throughput = lam / smooth_max_pos(1.0, worst, 16.0)

    mean_p = jnp.dot(wp, p)
    mean_p2 = jnp.dot(wp, p_sq)
    power_w = _pool_power_w(P, n_p, st_p, mean_p, mean_p2, ctx)
    cost = n_p * P.machine.cost_per_hour
    prov = n_p * power.provisioned_power_w(P.machine, P.cap_frac)
    if st_t is not None:
        power_w = power_w + _pool_power_w(T, n_t, st_t, mean_p, mean_p2, ctx)
        cost = cost + n_t * T.machine.cost_per_hour
        prov = prov + n_t * power.provisioned_power_w(T.machine, T.cap_frac)
    rho_t = st_t.rho_prompt if st_t is not None else jnp.asarray(0.0)
    batch_t = st_t.batch if st_t is not None else jnp.asarray(0.0)

    status = (1.0 * (st_p.rho_prompt > 1.0) + 2.0 * (rho_t > 1.0) + 4.0 * (pressure > 1.0)
              + 8.0 * ((x > 0.05) | (f > 0.05)))
    return ClusterMetrics(
        ttft_s=ttft, tbt_s=tbt, e2e_s=e2e,
        slowdown_ttft=sd_ttft, slowdown_tbt=sd_tbt, slowdown_e2e=sd_e2e,
        slo_margin=margin, meets_slo=meets, throughput_rps=throughput,
        cost_per_hour=cost, power_kw=power_w / 1e3, provisioned_power_kw=prov / 1e3,
        rho_prompt_pool=st_p.rho_prompt, rho_token_pool=rho_t,
        batch_prompt_pool=st_p.batch, batch_token_pool=batch_t, memory_pressure=pressure,
        mixed_prompt_frac=x, mixed_decode_frac=f, status=status,
    )
