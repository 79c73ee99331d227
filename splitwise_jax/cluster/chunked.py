"""The chunked-prefill colocated design (Sarathi-Serve; vLLM's and SGLang's default).

Every machine runs both phases, and every iteration carries all of its running decodes
plus up to C = `token_budget` prompt tokens, taken first-come first-served from the
machine's prompt queue: a prompt of p tokens is split over n(p) = ceil(p / C)
iterations (n - 1 full chunks and a last one of r = p - (n - 1) C tokens), and a
chunk may share its iteration with the next prompt's first chunk. Decodes are never
stalled by a prompt (the paper's baselines run a whole prompt and make the decodes
wait); each decode iteration is instead slowed by the chunk it carries. C bounds that
interference and sets the time to first token.

Per machine, with B running decodes (requests routed to the machine with the fewest
pending tokens, as the baselines are):

    X(c)   = t(c prompt tokens + B decodes) - t_d(B)   what a chunk adds to an iteration
    W(p)   = (n - 1) X(C) + X(r)                      extra iteration time one prompt causes
    phi    = lambda_p E[W]                            share of time spent on prompt chunks
    step   = t_d(B) / (1 - phi)                       mean time per decode iteration
           <= t_d(B) + X(C)                           (every iteration full: the bound C sets)
    B      = lambda_d E[o - 1] step                   Little's law, capped by KV memory
    q      = lambda_p E[n] step                       share of iterations that carry a chunk

The prompt queue of a machine is one FCFS server of prompt tokens: a prompt occupies it
for s(p) = (p / C) t_d + W(p) (its tokens' share of the iterations, plus the time its
chunks add), so the load rho = lambda_p E[s] reaches 1 exactly where full chunks of C
tokens fill every iteration (lambda_p E[p] (t_d + X(C)) / C = 1 for X linear). Queue
waits follow the pool's M/G/c diffusion (`queueing.wait_model`, c = machines, as for the
baselines under join-the-shortest-queue). TTFT = queue wait + the iteration in flight +
the prompt's own n(p) iterations, n t_d + W on the machine it joins (which, routed by
pending tokens, holds fewer decodes than the mean: `pool.jsq_share`).

Decode interference: a decode iteration carries a chunk with probability q, which adds
X. The count over o - 1 iterations is binomial (o - 1, q); the cluster model mixes over
Poisson counts (`components.components`), so the chunks are given to it as Poisson events
with the binomial's mean and variance where every machine has prompts queued (rate
q / (1 - q) per iteration, each adding (1 - q) X: near saturation, q -> 1, every
iteration carries a chunk and a plain Poisson count would overstate the TBT spread),
and with the Poisson's where routing leaves a choice. Exposure is uneven: routed by
pending tokens, prompts go to the machines with the fewest decoders, so a share
jsq_share(B) of the decoders (those on such machines) sees the full prompt rate and the
rest see prompts only when every machine has a queue. The two groups are two decode
routes of the cluster model (same mean interference as the average decoder's).

All of it is smooth in C: n(p) is a smoothed ceiling (`smooth_ceil`), so C is a
differentiable, searchable knob (gradients of any percentile with respect to
`ChunkedScheduling.token_budget`).

Departures, named:
* A chunk's attention work is its share of p^2 ((offset + c)^2 - offset^2, summed over
  the full chunks and averaged), the same total as the whole prompt; reading the earlier
  chunks' KV cache is not counted (neither does the request-level simulator).
* Own TTFT counts each prompt's iterations alone (light load); chunks of two prompts
  sharing an iteration save at most one decode-iteration time per prompt, which the
  queue's token-fluid service time s(p) does count.
* The token budget counts prompt tokens only (as `simulate.SimConfig.chunked_prefill_tokens`
  does); vLLM's `max_num_batched_tokens` also counts the decodes, so its prompt budget
  is C - B.

References:
    A. Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM Inference with
    Sarathi-Serve", OSDI 2024 (stall-free batching, chunked prefills); vLLM PR #4580
    (chunked prefill on by default later; 512 tokens "has the best ITL on A100");
    Patel et al., Splitwise, ISCA 2024 §V (the colocated baselines this replaces).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from splitwise_jax._roots import newton_log_root
from splitwise_jax._smooth import smooth_min_one, smooth_min_pos
from splitwise_jax.specs.batch import Batch
from splitwise_jax.cluster.flows_baseline import Baseline
from splitwise_jax.cluster.strategy import Colocated
from splitwise_jax.cluster.types import Classes, DecodeRoute, Flows, PromptRoute, Scheduling, _kv_capacity_tokens
from splitwise_jax.cluster.pool import PoolState, jsq_share
from splitwise_jax.cluster.queueing import prob_wait, wait_model

#: Prompt tokens per iteration by default: vLLM's default when it turned chunked prefill
#: on (PR #4580, May 2024: "512 has the best ITL/TTFT balance at various qps on A100").
DEFAULT_TOKEN_BUDGET = 512.0

# Sharpness r of the smoothed ceiling (`smooth_ceil`): the Fourier series of the
# staircase damped by r^k. r = 0.9 is within 0.02 iterations of the staircase a quarter
# chunk from a step and spreads each step over about +-0.1 chunk (max slope 19), less
# than a workload class spans (prompt bins are wider than a tenth of a chunk for any
# budget below the prompt size); a sharper r only steepens the gradient.
_CEIL_R = 0.9
_NEWTON_ITERS = 12
# min(B, B_max) as p-norm: the pool model's choice (pool._MEMORY_P), same reasons.
_MEMORY_P = 32.0
# Smooth cap of the prompt share of time phi at phi_max (p-norm min): p = 16 moves phi
# by < 0.1% below 60% of the cap and by 4.4% exactly at it.
_PHI_P = 16.0
# Share of iterations carrying a chunk, capped for the Poisson rate q / (1 - q): at the
# cap of 0.98 one decode iteration in 50 runs without a chunk (the TBT mean is kept exact).
_Q_MAX = 0.98
# min(rho, 1) in the residual wait, as the pool model (pool._RHO_TEMPERATURE).
_RHO_TEMPERATURE = 0.02


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ChunkedScheduling(Scheduling):
    """`Scheduling` plus the chunked-prefill token budget (traced: differentiable).

    Attributes:
        token_budget: prompt tokens one iteration may carry beside its decodes (C);
            prompts longer than C are split across iterations. Default 512 (vLLM's).
    """

    token_budget: jax.Array | float = DEFAULT_TOKEN_BUDGET


def smooth_ceil(x, r: float = _CEIL_R):
    """ceil(x) for x > 0, smoothed: 1 + max(floor_r(x), 0), where
    floor_r(x) = x - 1/2 + atan2(r sin 2 pi x, 1 - r cos 2 pi x) / pi
    is the floor's Fourier series with the k-th harmonic damped by r^k (r -> 1: exact).

    Off by < 0.02 a quarter step from a jump at r = 0.9; every jump is spread over
    about +-0.1 (the `_CEIL_R` note). Finite gradient everywhere (1 - r cos > 0).
    """
    theta = 2.0 * jnp.pi * x
    floor_r = x - 0.5 + jnp.arctan2(r * jnp.sin(theta), 1.0 - r * jnp.cos(theta)) / jnp.pi
    return 1.0 + jnp.maximum(floor_r, 0.0)


def _chunks(p_tok, budget):
    """(n (K,), last chunk r (K,), attention work of one full chunk (K,), of the last (K,))."""
    n = smooth_ceil(p_tok / budget)
    last = jnp.clip(p_tok - (n - 1.0) * budget, 0.0, budget)
    # Chunk i at offset i C does (i C + C)^2 - (i C)^2 = C^2 (2 i + 1) of attention work;
    # the n - 1 full chunks do C^2 (n - 1)^2 together, the last chunk the rest of p^2.
    sq_full = budget**2 * jnp.maximum(n - 1.0, 0.0)
    sq_last = jnp.maximum(p_tok**2 - budget**2 * (n - 1.0) ** 2, 0.0)
    return n, last, sq_full, sq_last


def _extra_times(timing, budget, n, last, sq_full, sq_last, batches, ctx):
    """X of a full and of a last chunk per class, and t_d, at each decode batch in
    `batches` (one timing call: one inlined phase model).

    Returns (x_full (G, K), x_last (G, K), t_d (G,)) for G = len(batches)."""
    k = n.shape[0]
    g = batches.shape[0]
    b = jnp.repeat(batches, 2 * k + 1)
    ones, zeros = jnp.ones(k), jnp.zeros(k)
    tokens = jnp.tile(jnp.concatenate([budget * ones, last, zeros[:1]]), g)
    seqs = jnp.tile(jnp.concatenate([ones, ones, zeros[:1]]), g)
    sq = jnp.tile(jnp.concatenate([sq_full, sq_last, zeros[:1]]), g)
    t = timing.iteration_s(Batch(prompt_tokens=tokens, prompt_seqs=seqs, prompt_sq_tokens=sq, decode_seqs=b,
                                 decode_ctx_tokens=b * ctx)).reshape(g, 2 * k + 1)
    t_d = t[:, 2 * k]
    return jnp.maximum(t[:, :k] - t_d[:, None], 0.0), jnp.maximum(t[:, k:2 * k] - t_d[:, None], 0.0), t_d


class _Rates(NamedTuple):
    """A machine's iteration law at decode batch B (decoders' view)."""

    step: jax.Array        # mean time per decode iteration
    t_d: jax.Array         # decode-only iteration
    x_full: jax.Array      # (K,) what a full chunk adds
    x_last: jax.Array      # (K,) what the last chunk adds
    work: jax.Array        # (K,) W(p)
    rho: jax.Array         # prompt load of the machine's prompt queue
    serv: jax.Array        # (K,) token-fluid service time s(p)
    seen: jax.Array        # prompts per second landing beside a given decoder
    phi_max: jax.Array     # share of time chunks take when every iteration carries a full one


def _rates(timing, budget, lam_p, n_machines, prompt_w, p_tok, chunks, ctx, batch) -> _Rates:
    n, last, sq_full, sq_last = chunks
    # Decoders see at least themselves in the batch (as pool._iteration_times).
    b_dec = jnp.maximum(batch, 1.0)
    x_full, x_last, t_d = _extra_times(timing, budget, n, last, sq_full, sq_last, b_dec[None], ctx)
    x_full, x_last, t_d = x_full[0], x_last[0], t_d[0]
    work = (n - 1.0) * x_full + x_last
    serv = p_tok / budget * t_d + work
    rho = lam_p * jnp.dot(prompt_w, serv)
    # Routed by fewest pending tokens, a prompt joins a machine without queued prompts
    # and with the fewest decoders: a decoder sees the prompt rate times jsq_share(B)
    # while some machine is free of prompts, the full rate when all have a queue.
    p_all = prob_wait(rho, n_machines)
    seen = lam_p * (jsq_share(batch) * (1.0 - p_all) + p_all)
    # What a full iteration adds at saturation, when chunks of C tokens fill every
    # iteration: its tokens come from class k in proportion to lambda_k p_k.
    x_cap = jnp.dot(prompt_w * p_tok, x_full) / jnp.dot(prompt_w, p_tok)
    phi_max = x_cap / (t_d + x_cap)
    phi = smooth_min_pos(seen * jnp.dot(prompt_w, work) + 1e-12, phi_max, p=_PHI_P)
    return _Rates(t_d / (1.0 - phi), t_d, x_full, x_last, work, rho, serv, seen, phi_max)


class ChunkedState(NamedTuple):
    """A chunked-prefill machine's steady state, and the two views its decoders have.

    Attributes:
        pool: the machine (`PoolState`): prompt load, decode batch, prompt times, queue
            service, and the mean decoder's interference.
        exposed: the decoders beside which routing sends prompts (full prompt rate).
        sheltered: the others (prompts only when every machine has a queue).
        exposed_share: share of decoders exposed.
    """

    pool: PoolState
    exposed: PoolState
    sheltered: PoolState
    exposed_share: jax.Array


def _decoder_view(st: PoolState, r: _Rates, seen, p_all, phi_max, e_n, e_w, var_x) -> PoolState:
    """The interference fields of `st` for decoders that see `seen` prompts per second."""
    phi = smooth_min_pos(seen * e_w + 1e-12, phi_max, p=_PHI_P)
    step = r.t_d / (1.0 - phi)
    # q of the decoder's iterations carry a chunk, as Poisson events whose variance is the
    # binomial's where every machine has prompts queued and the Poisson's otherwise
    # (module docstring); the mean step is kept exact.
    q = smooth_min_pos(seen * e_n * step + 1e-12, _Q_MAX, p=_PHI_P)
    events = q / (1.0 - q * p_all)
    return st._replace(step_s=step, events_per_step=events, interf_mean_s=(step - r.t_d) / events,
                       interf_var_s2=q * var_x / events)


def _need(lam_d, mean_decode_iters, r: _Rates):
    """Decode batch Little's law asks for. Decodes start as prompts finish: at most the
    rate the prompt queue serves, 1 / rho of the arrivals in overload (otherwise the
    decode batch of an overloaded pool would grow with prompts that never ran, slowing
    the prompts further)."""
    return lam_d * smooth_min_one(1.0 / jnp.maximum(r.rho, 1e-12), _RHO_TEMPERATURE) * mean_decode_iters * r.step


def _residual(args, log_b):
    """log B - log need(B), need capped by memory (`chunked_state`'s fixed point)."""
    timing, budget, lam_p, n_m, prompt_w, p_tok, chunks, ctx_tokens, lam_d, mean_decode_iters, batch_cap = args
    r = _rates(timing, budget, lam_p, n_m, prompt_w, p_tok, chunks, ctx_tokens, jnp.exp(log_b))
    need = _need(lam_d, mean_decode_iters, r)
    return log_b - jnp.log(jnp.maximum(smooth_min_pos(need, batch_cap, p=_MEMORY_P), 1e-12))


def chunked_state(timing, n_machines, prompt_rate, prompt_w, p_tok, p_sq, decode_rate, mean_decode_iters,
                  ctx_tokens, batch_cap, token_budget) -> ChunkedState:
    """Steady state of a chunked-prefill pool: solves Little's law for the decode batch B.

    Args:
        timing: phase-timing strategy (`PhaseTiming`) of the pool's machine type.
        n_machines: machines in the pool (continuous).
        prompt_rate, decode_rate: prompts and decoding requests per second into the pool.
        prompt_w, p_tok, p_sq: (K,) prompt class probabilities, tokens, tokens^2.
        mean_decode_iters: E[o - 1], decode iterations per request.
        ctx_tokens: mean KV context of a decoding request (tokens).
        batch_cap: most decoding requests a machine's KV memory holds.
        token_budget: prompt tokens per iteration, C (> 0; traced).

    Returns:
        `ChunkedState` (per machine; module docstring for each field's law).
    """
    del p_sq  # chunks carry their own attention work (`_chunks`)
    n_m = jnp.maximum(n_machines, 1e-6)
    lam_p = prompt_rate / n_m
    lam_d = decode_rate / n_m
    budget = jnp.asarray(token_budget, float)
    chunks = _chunks(p_tok, budget)
    n = chunks[0]

    args = (timing, budget, lam_p, n_m, prompt_w, p_tok, chunks, ctx_tokens, lam_d, mean_decode_iters, batch_cap)

    def rates(b):
        return _rates(timing, budget, lam_p, n_m, prompt_w, p_tok, chunks, ctx_tokens, b)

    def need_of(r: _Rates):
        return _need(lam_d, mean_decode_iters, r)

    # Newton in log B, as pool.pool_state (the residual's slope lies in (0, 1]): run
    # undifferentiated, with the exact implicit gradient (`_roots.newton_log_root`).
    b0 = smooth_min_pos(lam_d * mean_decode_iters * 0.04 + 1e-9, batch_cap, p=_MEMORY_P)
    batch = jnp.exp(newton_log_root(_residual, _NEWTON_ITERS, args, jnp.log(b0)))
    r = rates(batch)
    e_s = jnp.dot(prompt_w, r.serv)
    scv = jnp.maximum(jnp.dot(prompt_w, r.serv**2) / e_s**2 - 1.0, 0.0)
    # Own TTFT: the prompt's n iterations on the machine it joins (fewer decoders there).
    found = batch * jsq_share(batch)
    xf_f, xl_f, td_f = _extra_times(timing, budget, *chunks, found[None], ctx_tokens)
    own = n * td_f[0] + (n - 1.0) * xf_f[0] + xl_f[0]
    e_n = jnp.dot(prompt_w, n)
    e_w = jnp.dot(prompt_w, r.work)
    x_mean = e_w / jnp.maximum(e_n, 1e-12)
    x_sq = jnp.dot(prompt_w, (n - 1.0) * r.x_full**2 + r.x_last**2) / jnp.maximum(e_n, 1e-12)
    var_x = jnp.maximum(x_sq - x_mean**2, 0.0)
    p_all = prob_wait(r.rho, n_m)
    decoding = 1.0 - jnp.exp(-batch)
    resid = (1.0 - smooth_min_one(r.rho, _RHO_TEMPERATURE)) * decoding * 0.5 * r.t_d
    mean = PoolState(rho_prompt=r.rho, batch=batch, batch_need=need_of(r), prompt_s=own, mean_prompt_s=e_s,
                     scv_prompt=scv, decode_s=r.t_d, step_s=r.step, events_per_step=jnp.zeros(()),
                     interf_mean_s=jnp.zeros(()), interf_var_s2=jnp.zeros(()), residual_s=resid,
                     carry_share=jnp.ones(()),  # chunks fit the batch: decoders always ride along
                     decode_slope_s=jnp.zeros(()))  # no arrival profile for the chunked engine
    # Uneven exposure: a share jsq_share(B) of decoders sits on the machines routing sends
    # prompts to and sees the full prompt rate; the rest see prompts only when every
    # machine has a queue. Same mean as `r.seen`; the spread of TBT across requests is
    # what separates them (coding, 40 x H100 at 70 req/s: TBT P90 error -13% -> -5%).
    share = jsq_share(batch)
    mean = _decoder_view(mean, r, r.seen, p_all, r.phi_max, e_n, e_w, var_x)
    exposed = _decoder_view(mean, r, lam_p, p_all, r.phi_max, e_n, e_w, var_x)
    sheltered = _decoder_view(mean, r, lam_p * p_all, p_all, r.phi_max, e_n, e_w, var_x)
    return ChunkedState(mean, exposed, sheltered, share)


class Chunked(Colocated):
    """Chunked prefill on a colocated pool (`flows` below; `scheduling.token_budget`)."""

    __slots__ = ()
    kind: ClassVar[str] = "chunked"
    label: ClassVar[str] = "colocated (chunked prefill)"
    simulated_as_is: ClassVar[bool] = False

    def flows(self, cluster, cls, rate, ca2, horizon_s, res, window_s=None):
        del res, window_s  # no drafting: nothing here needs the wait-CDF resolution; stationary decodes
        return chunked_flows(cluster, cls, rate, ca2, horizon_s)

    def check(self, cluster) -> None:
        if not hasattr(cluster.scheduling, "token_budget"):
            raise ValueError("a cluster of kind 'chunked' needs ChunkedScheduling (its token_budget), got "
                             f"{type(cluster.scheduling).__name__}; build it with designs.make_cluster or "
                             "designs.build_cluster")

    def scheduling(self, sched, design):
        base = {f.name: getattr(sched, f.name) for f in dataclasses.fields(Scheduling)}
        return ChunkedScheduling(**base, token_budget=float(design.chunked_prefill_tokens))

    def describe(self, design) -> str:
        return f", chunked prefill {design.chunked_prefill_tokens:g} tokens"

    def simulated(self, cluster) -> tuple:
        # Chunked prefill is a policy of the simulated machines, not of the cluster's
        # timing: the colocated pool (a baseline) with the simulator's chunked prefill at
        # the design's token budget.
        budget = float(cluster.scheduling.token_budget)
        if abs(budget - round(budget)) > 1e-9:
            raise ValueError(f"the chunked-prefill budget is {budget:g} tokens: the simulator splits prompts at whole "
                             "tokens")
        return (cluster.replace(strategy=Baseline()),
                {"chunked_prefill_tokens": int(round(budget)), "scheduler": "token_jsq"})


def chunked_flows(cluster, cls: Classes, lam, ca2, horizon_s) -> Flows:
    """The chunked design's flows: one colocated pool (like the baselines), every
    machine running chunked prefill at `scheduling.token_budget` (`Chunked.check`)."""
    sched = cluster.scheduling
    P = cluster.prompt
    n_p = jnp.asarray(cluster.n_prompt, float)
    cap_tok = _kv_capacity_tokens(P, cluster)
    cap = cap_tok / cls.ctx
    cs = chunked_state(P, n_p, lam, cls.wp, cls.p, cls.p_sq, lam, cls.mean_iters, cls.ctx, cap, sched.token_budget)
    st = cs.pool
    wm = wait_model(lam, st.mean_prompt_s, st.scv_prompt, n_p, ca2, horizon_s)
    zero = jnp.zeros_like(cls.p)
    pressure = st.batch_need / cap
    ones = jnp.ones_like(cls.w)
    # A decode starts in the iteration after its prompt's last chunk: no join wait.
    decode_routes = (DecodeRoute(cs.exposed, cs.exposed_share * ones, zero, 0.0),
                     DecodeRoute(cs.sheltered, (1.0 - cs.exposed_share) * ones, zero, 0.0))
    return Flows((PromptRoute(st, wm, jnp.ones_like(cls.p)),), decode_routes, st, None, zero, jnp.asarray(0.0),
                 pressure, (st.rho_prompt, pressure))
