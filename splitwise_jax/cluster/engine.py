"""A colocated chunked-prefill serving engine (vLLM's scheduler) as a fluid model.

One engine instance (one server, tensor parallel over its GPUs) serves one load stage:
requests arrive at rate lambda (fixed-rate or Poisson), each with a prompt of P tokens
of which C are already in the prefix cache, and generate n tokens. vLLM's scheduler
(v1, chunked prefill on) builds every iteration from every running decode's next token
first, then prompt chunks up to `max_num_batched_tokens`, with at most `max_num_seqs`
requests running; the KV cache holds what the GPU memory left after the weights at
`gpu_memory_utilization` holds, and the scheduler preempts (recomputes) requests when it
runs out. This module turns that into steady-state flows, in the manner of the rest of
the package (docs/serving.md has every equation and its source):

    uncached prompt  u = P - C_hit            (prefix cache: full 16-token blocks resident)
    chunks           n_c = max(1, u / (budget - B))
    prefill steps/s  q = lambda n_c            (fixed rate: one prompt per step when 1/lambda > step)
                     q = (1 - exp(-lambda n_c tau_d)) / tau_d     (Poisson: prompts share a step)
    step times       tau_d(B) = iteration(B decodes at mean context P + n/2)
                     tau_p(B) = iteration(B decodes + one chunk of u / n_c tokens)
    steps/s          R(B) = q + (1 - q tau_p) / tau_d
    running decodes  B = lambda (n - 1) / R(B)                        (Little's law; solved)
    capacity         B_cap = min(max_num_seqs, KV tokens / (P + n/2)),
                     mu = B_cap / tau_d / [(n - 1) + B_cap n_c (tau_p / tau_d - 1)]

A stage keeps up when lambda < mu. Then each request's decode gap is 1/R (lognormal
scatter `tpot_sigma` between requests), its TTFT is the API's fixed cost, the rest of
the step in flight, its prefill steps and `ttft_extra_iters` steps more (vLLM streams a
step's tokens while the next step runs), with lognormal scatter `ttft_sigma`. When it
does not keep up, the engine first fills its batch, and once its first requests finish
the queue grows at lambda - mu; requests whose latency would pass the client's timeout
fail, and the served rate is what completes over the stage plus the timeout (how the
benchmark client counts).

What the benchmark client measures: the TPOT of inference-perf builds before its fix
#566 (June 2026) divides a request's decode time by the number of streamed events it
timed, and each token arrived as two events (its ITL median is ~30 us: half the gaps are
zero), so reported TPOT = (n - 1) x gap / (k (n + 1) - 1) with k =
`stream_events_per_token` (2 for those builds; 1 for a client that counts tokens).
docs/serving.md ("The roofline puzzle") has the evidence.

All functions are pure JAX: jit, vmap over rows of one (model, GPU, TP) group, grad.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from splitwise_jax._roots import newton_implicit
from splitwise_jax._smooth import softplus
from splitwise_jax.specs.batch import Batch
from splitwise_jax.specs.hardware import Machine
from splitwise_jax.specs.llm import LLM
from splitwise_jax.phases.memory import kv_bytes_per_token_stored
from splitwise_jax.phases.params import PhaseParams
from splitwise_jax.phases.phases import iteration_time_s
from splitwise_jax.cluster.metrics import LEVELS
from splitwise_jax.cluster.strategy import DesignStrategy

GIB = 2.0**30
#: vLLM's KV block (tokens); prefix-cache hits come in whole blocks.
KV_BLOCK_TOKENS = 16.0
#: Standard normal quantiles of the reported levels (P50, P90, P99; `metrics.LEVELS`).
Z_LEVELS = (0.0, 1.2815515655446004, 2.3263478740408408)
# Newton steps for the running batch (`_solve_batch`): from the lower bound the residual
# is below 1e-10 after 5 steps over the benchmark rows (tests/test_serving.py checks it
# against a bisection)
_NEWTON_STEPS = 6
# Width (in log of offered/capacity) of the blend between the kept-up and the
# overloaded regimes: 1% of load. Narrower gives a sharper (less smooth) switch.
_REGIME_TEMPERATURE = 0.01


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class EngineParams:
    """Parameters of the serving engine and of the benchmark client (positive floats).

    Engine (fitted with the phase parameters; shared by every model the engine serves):
        t_api_s: per-request cost outside the engine's iterations on the way to the
            first token (HTTP, tokenisation, detokenisation, streaming), s.
        ttft_extra_iters: engine steps between a prompt's last prefill step and its
            first token reaching the client (output processing runs a step behind).
        allreduce_call_s: latency of one all-reduce call, s. vLLM's custom all-reduce is
            one-shot over NVLink for decode-sized messages, so the latency per call is
            flat in TP; it replaces the ring's 2 (tp - 1) steps of the 2023 stack.
        tpot_sigma: lognormal s.d. of a request's mean decode gap between requests.
        ttft_sigma: lognormal s.d. of TTFT.
        kv_reserve_gib: GPU memory per GPU held by neither weights nor KV cache
            (activations of a full token budget, CUDA graphs, NCCL buffers), GiB;
            vLLM's start-up profile; not fitted (prior 3 GiB, docs/serving.md).
    Client (measurement conventions; not fitted):
        stream_events_per_token: streamed events the client times per token (2 for
            inference-perf before #566, whose TPOT halves the real gap).
        client_timeout_s: the client's request timeout (aiohttp's default total of
            300 s when inference-perf's request_timeout is unset).
    """

    t_api_s: float = 8e-3
    ttft_extra_iters: float = 1.0
    allreduce_call_s: float = 1e-5
    tpot_sigma: float = 0.05
    ttft_sigma: float = 0.15
    kv_reserve_gib: float = 3.0
    stream_events_per_token: float = 2.0
    client_timeout_s: float = 300.0

    def replace(self, **changes) -> "EngineParams":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> "EngineParams":
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(d, dict):
            raise ValueError(f"engine parameters must be an object of name: number, got {type(d).__name__}")
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown engine parameters {sorted(unknown)}; accepted: {sorted(names)}")
        bad = {k: v for k, v in d.items() if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0}
        if bad:
            raise ValueError(f"engine parameters must be finite numbers >= 0, got {bad}")
        return dataclasses.replace(cls(), **{k: float(v) for k, v in d.items()})


ENGINE_FIELDS = tuple(f.name for f in dataclasses.fields(EngineParams))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Stage:
    """One load stage of one engine instance (floats; vmap over a leading axis).

    Attributes:
        rate_per_s: offered load (requests/s).
        duration_s: stage length (s).
        prompt_tokens: prompt length (tokens).
        cached_hit_tokens: prompt tokens the prefix cache holds when the request's own
            earlier prompt is resident (multi-turn chats repeat it).
        cached_shared_tokens: prompt tokens the cache holds otherwise (the shared system
            prompt), 0 without prefix caching.
        working_set_tokens: distinct prompt tokens that must stay resident for the
            `cached_hit_tokens` hits (users x prompt); 0 when there are none to keep.
        output_tokens: tokens generated per request.
        max_num_batched_tokens, max_num_seqs, gpu_memory_utilization: engine settings.
        poisson: 1 for Poisson arrivals, 0 for fixed-rate ones.
        backlog_in: requests queued at the stage's start (from the stage before).
    """

    rate_per_s: jax.Array | float
    duration_s: jax.Array | float
    prompt_tokens: jax.Array | float
    cached_hit_tokens: jax.Array | float
    cached_shared_tokens: jax.Array | float
    working_set_tokens: jax.Array | float
    output_tokens: jax.Array | float
    max_num_batched_tokens: jax.Array | float
    max_num_seqs: jax.Array | float
    gpu_memory_utilization: jax.Array | float = 0.9
    poisson: jax.Array | float = 0.0
    backlog_in: jax.Array | float = 0.0


class StageMetrics(NamedTuple):
    """What the engine model predicts for a stage (seconds unless named otherwise).

    ttft_s, tpot_s, e2e_s: P50, P90, P99 (shape (..., 3)); tpot_s as the benchmark
    client reports it (`EngineParams.stream_events_per_token`); gap_s is the real mean
    time between tokens. throughput_req_per_s as the client counts it (completed over the
    stage plus its drain). capacity_req_per_s: the most the engine sustains. load: offered
    over capacity (> 1: overloaded). batch: running decodes. kv_tokens: KV capacity.
    backlog_out: requests queued at the stage's end.
    """

    ttft_s: jax.Array
    tpot_s: jax.Array
    e2e_s: jax.Array
    gap_s: jax.Array
    throughput_req_per_s: jax.Array
    capacity_req_per_s: jax.Array
    load: jax.Array
    batch: jax.Array
    kv_tokens: jax.Array
    prefix_hit: jax.Array
    backlog_out: jax.Array


def kv_capacity_tokens(engine: EngineParams, machine: Machine, llm: LLM, mem_util):
    """KV-cache tokens of one instance: tp x (HBM x utilisation - reserve) - weights."""
    tp = machine.gpus_per_machine
    free = tp * (machine.gpu.hbm_bytes * mem_util - engine.kv_reserve_gib * GIB) - llm.weight_bytes
    return softplus(free, 1e9) / kv_bytes_per_token_stored(llm, tp)


def _phase_params(params: PhaseParams, engine: EngineParams, tp: int) -> PhaseParams:
    # The phase model's ring takes 2 (tp - 1) latency steps per all-reduce; one call of
    # vLLM's one-shot all-reduce is `allreduce_call_s` whatever the TP.
    if tp <= 1:
        return params
    return params.replace(allreduce_latency_s=engine.allreduce_call_s / (2.0 * (tp - 1)))


def _step_times(params, engine, machine, llm, st: Stage, batch):
    """Decode-only and prefill step times at `batch` running decodes, the chunks per
    prompt, the prefix-cache hit probability and the KV capacity."""
    ctx = st.prompt_tokens + 0.5 * st.output_tokens
    kv = kv_capacity_tokens(engine, machine, llm, st.gpu_memory_utilization)
    # prefix cache: a request's own earlier prompt stays resident while the blocks free
    # of running requests hold the working set (LRU over a cyclic reuse is all or nothing;
    # the logistic of width 10% of the working set smooths the switch)
    spare = kv - batch * ctx
    ws = jnp.maximum(st.working_set_tokens, 1.0)
    hit = jnp.where(st.working_set_tokens > 0, jax.nn.sigmoid((spare - ws) / (0.1 * ws)), 0.0)
    cached = hit * st.cached_hit_tokens + (1.0 - hit) * st.cached_shared_tokens
    uncached = jnp.maximum(st.prompt_tokens - cached, 1.0)
    budget = 1.0 + softplus(st.max_num_batched_tokens - batch - 1.0, 1.0)
    n_chunks = 1.0 + softplus(uncached / budget - 1.0, 0.05)
    chunk = uncached / n_chunks
    decode = Batch(decode_seqs=batch, decode_ctx_tokens=batch * ctx)
    tau_d = iteration_time_s(params, machine, llm, decode)
    # a chunk attends to the cached prefix and to itself (causal): sum of s^2 -> u (2 C + u)
    prefill = Batch(prompt_tokens=chunk, prompt_seqs=1.0, prompt_sq_tokens=chunk * (2.0 * cached + chunk),
                    decode_seqs=batch, decode_ctx_tokens=batch * ctx)
    tau_p = iteration_time_s(params, machine, llm, prefill)
    return tau_d, tau_p, n_chunks, hit, kv


def _steps_per_s(st: Stage, rate, tau_d, tau_p, n_chunks):
    """Engine steps per second when prompts arrive at `rate` (module docstring)."""
    steps_wanted = rate * n_chunks
    q_poisson = -jnp.expm1(-steps_wanted * tau_d) / tau_d
    q = jnp.where(st.poisson > 0.5, q_poisson, steps_wanted)
    busy = softplus(1.0 - q * tau_p, 0.01)  # share of time in decode-only steps, floored smoothly at 0
    return q + busy / tau_d


def _solve_batch(params, engine, machine, llm, st: Stage):
    """Running decodes B with B R(B) = lambda (n - 1).

    r(x) = x + log R(e^x) - log(lambda (n - 1)) rises with x = log B and is concave (its
    slope, 1 minus the elasticity of the step time in B, falls as B grows), so Newton's
    method started below the root climbs to it without overshooting; the start,
    B = lambda (n - 1) tau_d(1), is below it because R <= 1 / tau_d(1). The iterations
    run on stopped values and one last step carries the implicit gradient.
    """
    demand = st.rate_per_s * (st.output_tokens - 1.0)
    x_hi = jnp.log(4.0 * jnp.maximum(st.max_num_seqs, 1.0))

    def resid(args, log_b):
        params, engine, machine, st = args
        b = jnp.exp(log_b)
        tau_d, tau_p, n_chunks, _, _ = _step_times(params, engine, machine, llm, st, b)
        steps = _steps_per_s(st, st.rate_per_s, tau_d, tau_p, n_chunks)
        return log_b + jnp.log(steps) - jnp.log(st.rate_per_s * (st.output_tokens - 1.0))

    args = (params, engine, machine, st)
    args_sg = jax.lax.stop_gradient(args)
    tau1 = _step_times(*args_sg[:3], llm, args_sg[3], jnp.ones_like(demand))[0]
    x0 = jnp.minimum(jnp.log(jax.lax.stop_gradient(demand) * tau1), x_hi)

    x = newton_implicit(lambda v: resid(args, v), lambda v: resid(args_sg, v), x0, _NEWTON_STEPS,
                        slope_floor=1e-3, x_max=x_hi)
    return jnp.exp(x)


def stage_metrics(params: PhaseParams, engine: EngineParams, machine: Machine, llm: LLM,
                  st: Stage) -> StageMetrics:
    """Predicted latency percentiles, throughput and capacity of one load stage.

    Args:
        params: phase parameters (the GPU's; a stack's `params_for`).
        engine: engine and client parameters.
        machine: the server (its GPUs = the tensor-parallel degree).
        llm: the model.
        st: the stage (scalars; `jax.vmap` for several of one model and server).

    Returns:
        StageMetrics.
    """
    tp = machine.gpus_per_machine
    params = _phase_params(params, engine, tp)
    n = st.output_tokens
    lam = st.rate_per_s
    ctx = st.prompt_tokens + 0.5 * n
    kv = kv_capacity_tokens(engine, machine, llm, st.gpu_memory_utilization)
    # capacity: the batch the engine can hold, max_num_seqs or what the KV cache holds at
    # the mean context (vLLM preempts to stay within it); smooth min, temperature 1 request
    b_cap = jnp.minimum(st.max_num_seqs, kv / ctx) - softplus(-jnp.abs(st.max_num_seqs - kv / ctx), 1.0)
    b_cap = jnp.maximum(b_cap, 1e-3)
    tau_d_c, tau_p_c, nc_c, _, _ = _step_times(params, engine, machine, llm, st, b_cap)
    mu_batch = b_cap / tau_d_c / ((n - 1.0) + b_cap * nc_c * (tau_p_c / tau_d_c - 1.0))
    mu_prefill = 1.0 / (nc_c * tau_p_c)
    mu = 1.0 / (1.0 / mu_batch ** 8 + 1.0 / mu_prefill ** 8) ** 0.125  # smooth min (8-norm)
    load = lam / mu

    # kept up: the fluid steady state at the offered rate
    b = jnp.minimum(_solve_batch(params, engine, machine, llm, st), b_cap)
    tau_d, tau_p, n_chunks, hit, _ = _step_times(params, engine, machine, llm, st, b)
    steps = _steps_per_s(st, lam, tau_d, tau_p, n_chunks)
    gap = 1.0 / steps
    z = jnp.asarray(Z_LEVELS)
    lv = jnp.asarray(LEVELS)
    base = engine.t_api_s + n_chunks * tau_p + engine.ttft_extra_iters * gap
    ttft_ok = (base[..., None] + lv * gap[..., None]) * jnp.exp(engine.ttft_sigma * z)
    decode_ok = (n - 1.0)[..., None] * gap[..., None] * jnp.exp(engine.tpot_sigma * z)
    e2e_ok = jnp.mean(ttft_ok, axis=-1, keepdims=True) + decode_ok
    thr_ok = lam * st.duration_s / (st.duration_s + e2e_ok[..., 0])

    # overloaded: served at capacity, the queue grows through the stage
    steps_c = _steps_per_s(st, mu, tau_d_c, tau_p_c, nc_c)
    gap_c = 1.0 / steps_c
    decode_c = (n - 1.0) * gap_c
    base_c = engine.t_api_s + nc_c * tau_p_c + engine.ttft_extra_iters * gap_c
    excess = softplus(lam - mu, 1e-3 * mu)
    w_lim = jnp.maximum(engine.client_timeout_s - decode_c - base_c, 0.0)
    full = st.backlog_in > 0.0  # a stage that starts behind starts with a full batch

    def queue(t):
        # requests waiting when an arrival at time t comes: the engine first fills its
        # batch (no queue until b_cap run), completes nothing before the first requests'
        # decode time D = b_cap / mu, then the queue grows at lambda - mu, so
        # q(t) = max(0, min(lambda t - b_cap, (lambda - mu) t)); smooth max and min with a
        # temperature of one request
        fill = lam * t - b_cap
        grow = excess * t
        fresh = softplus(grow - softplus(grow - fill, 1.0), 1.0)
        return jnp.where(full, st.backlog_in + grow, fresh)

    # arrivals until t* complete (their wait stays under the timeout's allowance): q is
    # the smaller of two rising lines, so it reaches mu w_lim when both have
    level = mu * w_lim
    t_star = jnp.where(full, (level - st.backlog_in) / jnp.maximum(excess, 1e-9),
                       jnp.maximum((level + b_cap) / lam, level / jnp.maximum(excess, 1e-9)))
    t_done = jnp.clip(t_star, 0.0, st.duration_s)
    timed_out = t_star < st.duration_s
    w_end = queue(st.duration_s) / mu
    # waits rise with the arrival time, so the completed requests' p-quantile is the wait
    # at p of the way through the arrivals that complete
    ttft_over = base_c[..., None] + queue(lv * t_done[..., None]) / mu[..., None]
    e2e_over = ttft_over + decode_c[..., None] * jnp.exp(engine.tpot_sigma * z)
    decode_over = decode_c[..., None] * jnp.exp(engine.tpot_sigma * z)
    thr_over = jnp.where(timed_out, lam * t_done / (st.duration_s + engine.client_timeout_s),
                         lam * st.duration_s / (st.duration_s + w_end + decode_c + base_c))
    backlog_out = jnp.minimum(queue(st.duration_s), level)

    wgt = jax.nn.sigmoid(jnp.log(load) / _REGIME_TEMPERATURE)
    mix = lambda a, o: (1.0 - wgt[..., None]) * a + wgt[..., None] * o  # noqa: E731
    events = engine.stream_events_per_token * (n + 1.0) - 1.0
    decode = mix(decode_ok, decode_over)
    return StageMetrics(
        ttft_s=mix(ttft_ok, ttft_over),
        tpot_s=decode / events[..., None],
        e2e_s=mix(e2e_ok, e2e_over),
        gap_s=(1.0 - wgt) * gap + wgt * gap_c,
        throughput_req_per_s=(1.0 - wgt) * thr_ok + wgt * thr_over,
        capacity_req_per_s=mu,
        load=load,
        batch=(1.0 - wgt) * b + wgt * b_cap,
        kv_tokens=kv,
        prefix_hit=hit,
        backlog_out=wgt * backlog_out,
    )


class ServingEngine(DesignStrategy):
    """The serving engine as a design of the registry (`strategies.STRATEGIES`): one
    colocated server per load stage, running chunked prefill as vLLM's scheduler does.

    It has no `Cluster` flows: a benchmark stage is one engine instance at a fixed or
    Poisson rate, evaluated by `stage_metrics` (the calibration and `predict
    --benchmarks` call it; docs/serving.md), not by `cluster.evaluate`; the chunked-prefill
    cluster design (`chunked.Chunked`) is the fleet-level model of the same scheduler."""

    __slots__ = ()
    kind: ClassVar[str] = "engine"
    label: ClassVar[str] = "a serving engine (one server per load stage)"

    #: The engine's own model function: (params, engine, machine, llm, stage) -> StageMetrics.
    stage_metrics = staticmethod(stage_metrics)

    def flows(self, cluster, cls, rate, ca2, horizon_s, res, window_s=None):
        raise NotImplementedError("the serving engine is evaluated per load stage by cluster.engine.stage_metrics "
                                  "(docs/serving.md), not as a Cluster; for a fleet use the chunked-prefill design")

    def check(self, cluster) -> None:
        raise ValueError("a Cluster cannot carry the serving engine's strategy: it is evaluated per load stage by "
                         "cluster.engine.stage_metrics (docs/serving.md); use kind 'chunked' for a fleet")
