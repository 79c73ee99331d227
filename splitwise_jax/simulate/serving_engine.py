"""A request-level simulation of the chunked-prefill engine, iteration by iteration.

The same engine as `serving.engine` (vLLM v1's scheduler with chunked prefill), without
the fluid model's averages: every iteration takes every running decode's next token
first, then prompt chunks up to `max_num_batched_tokens` (requests already prefilling
first, then the waiting queue in arrival order) while at most `max_num_seqs` requests
run; the KV cache is counted in 16-token blocks of the capacity the engine model gives
(`engine.kv_capacity_tokens`); when a decode needs a block and none is free, the most
recently admitted request is preempted, its blocks freed, and it goes back to the head
of the queue to be recomputed (prompt and generated tokens); prefix caching keeps each
user's and each system prompt's blocks after their request ends, evicting the least
recently used when blocks run short; the client times out requests after
`client_timeout_s` (their blocks are freed at once). Load stages run back to back.

Iteration times come from the phase model (`phases.iteration`) tabulated once per run
on a grid of (running decodes, their context tokens, prefill tokens) and interpolated
(linear in decodes, in log context and log prefill tokens; the grid's spacing keeps the
interpolation within ~1 % of the model, tests/test_serving.py). The client side takes
the engine parameters' API cost, the steps before the first token streams, the
lognormal scatter of the fluid model (so the two answer the same question) and the
benchmark client's TPOT convention.

The scheduling rules were written from vLLM's documented behaviour (docs/serving.md);
no code of vLLM or of any simulator was copied.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from splitwise_jax.cluster.engine import KV_BLOCK_TOKENS, EngineParams, _phase_params, kv_capacity_tokens


@dataclass
class _Req:
    rid: int
    stage: int
    arrival: float
    prompt: int
    out: int
    user: int
    group: int
    cached: int = 0
    prefilled: int = 0       # tokens of (prompt + regenerated) computed so far
    target: int = 0          # tokens to prefill (prompt, or prompt + generated after a preemption)
    generated: int = 0
    blocks: int = 0
    first: float = -1.0
    last: float = -1.0
    admitted: int = -1       # admission order (preemption takes the latest)
    chunk: int = 0           # prefill tokens scheduled in the current iteration
    done: bool = False
    failed: bool = False


class IterationTable:
    """Iteration latency of one model on one server, tabulated for the simulation."""

    def __init__(self, params, engine: EngineParams, machine, llm, max_seqs: int, max_ctx: float, max_prefill: float):
        import jax
        import jax.numpy as jnp

        from splitwise_jax.specs.batch import Batch
        from splitwise_jax.phases.phases import iteration_time_s

        p = _phase_params(params, engine, machine.gpus_per_machine)
        self.b = np.arange(0, max_seqs + 1, dtype=float)
        self.c = np.geomspace(16.0, max(max_ctx, 32.0), 24)          # mean context per decode
        self.u = np.concatenate([[0.0], np.geomspace(1.0, max(max_prefill, 2.0), 24)])  # prefill tokens
        B, C, U = np.meshgrid(self.b, self.c, self.u, indexing="ij")

        def lat(b, c, u):
            batch = Batch(prompt_tokens=u, prompt_seqs=jnp.where(u > 0, 1.0, 0.0), prompt_sq_tokens=u * u,
                          decode_seqs=b, decode_ctx_tokens=b * c)
            return iteration_time_s(p, machine, llm, batch)

        f = jax.jit(jax.vmap(lat))
        self.t = np.asarray(f(B.ravel(), C.ravel(), U.ravel())).reshape(B.shape)
        self._lc = np.log(self.c)
        self._lu = np.log1p(self.u)

    def __call__(self, b: int, ctx_mean: float, prefill: float) -> float:
        b = min(int(b), len(self.b) - 1)
        x = np.interp(math.log(max(ctx_mean, self.c[0])), self._lc, np.arange(len(self.c)))
        y = np.interp(math.log1p(prefill), self._lu, np.arange(len(self.u)))
        i, j = min(int(x), len(self.c) - 2), min(int(y), len(self.u) - 2)
        fx, fy = x - i, y - j
        t = self.t[b]
        return float((1 - fx) * (1 - fy) * t[i, j] + fx * (1 - fy) * t[i + 1, j]
                     + (1 - fx) * fy * t[i, j + 1] + fx * fy * t[i + 1, j + 1])


def _arrivals(rate: float, duration: float, start: float, poisson: bool, rng) -> np.ndarray:
    if not poisson:
        return start + np.arange(int(round(rate * duration))) / rate
    gaps = rng.exponential(1.0 / rate, size=int(rate * duration * 1.2) + 20)
    t = start + np.cumsum(gaps)
    return t[t < start + duration]


def simulate_experiment(rows: list[dict], params, engine: EngineParams, machine, llm, *, seed: int = 0) -> list[dict]:
    """Simulate the load stages of one experiment back to back (rows: benchmark rows of one
    model and server, in stage order). Returns per-stage metrics in the predicted
    columns' names (pred_* without the prefix): ttft/tpot/e2e p50/p90/p99, throughput,
    completed, failed, preemptions."""
    rng = np.random.default_rng(seed)
    r0 = rows[0]
    M, S = int(r0["max_num_batched_tokens"]), int(r0["max_num_seqs"])
    kv_blocks = int(float(kv_capacity_tokens(engine, machine, llm, float(r0["gpu_memory_utilization"])))
                    // KV_BLOCK_TOKENS)
    from splitwise_jax.io.benchmarks import prompt_tokens

    reqs: list[_Req] = []
    t0 = 0.0
    for k, row in enumerate(rows):
        p = int(round(prompt_tokens(row)))
        users = int(row["n_system_prompts"]) * int(row["users_per_system_prompt"])
        arr = _arrivals(float(row["rate_per_s"]), float(row["duration_s"]), t0, row["arrivals"] == "poisson", rng)
        for a in arr:
            rid = len(reqs)
            u = rid % users
            reqs.append(_Req(rid, k, float(a), p, int(row["output_len_target"]), u, u % int(row["n_system_prompts"])))
        t0 += float(row["duration_s"])
    max_ctx = max(r.prompt + r.out for r in reqs)
    table = IterationTable(params, engine, machine, llm, S, max_ctx, M)
    spec = float(r0["system_prompt_len"]) + float(r0["question_len"])
    sys_tokens = int(float(r0["system_prompt_len"]) * (reqs[0].prompt / spec if spec > 0 else 1.0))
    caching = bool(r0["enable_prefix_caching"])
    multi = bool(r0["multi_turn"]) and caching
    blk = int(KV_BLOCK_TOKENS)

    # prefix cache: key -> blocks held while no request uses them (LRU order)
    cache: OrderedDict = OrderedDict()
    free = kv_blocks
    waiting: deque = deque()
    running: list[_Req] = []
    now, nxt, order, preemptions = 0.0, 0, 0, 0
    timeout = engine.client_timeout_s

    def evict(need: int) -> bool:
        nonlocal free
        while free < need and cache:
            _, nb = cache.popitem(last=False)
            free += nb
        return free >= need

    def release(r: _Req):
        nonlocal free
        free += r.blocks
        r.blocks = 0

    while nxt < len(reqs) or waiting or running:
        while nxt < len(reqs) and reqs[nxt].arrival <= now:
            waiting.append(reqs[nxt])
            nxt += 1
        if not waiting and not running:
            now = reqs[nxt].arrival
            continue
        # client timeouts
        for q in [r for r in running if now - r.arrival > timeout]:
            q.failed = True
            running.remove(q)
            release(q)
        # the queue is in arrival order but for preempted requests put back at its head,
        # which are older still: the timed-out requests are always at the head
        while waiting and now - waiting[0].arrival > timeout:
            waiting.popleft().failed = True
        # decodes first: each needs a block when its length crosses a block boundary
        decodes = [r for r in running if r.prefilled >= r.target]
        for r in sorted(decodes, key=lambda x: x.admitted):
            if r not in running:
                continue
            length = r.prompt + r.generated + 1
            if length > r.blocks * blk:
                while not evict(1):
                    victim = max(running, key=lambda x: x.admitted)
                    running.remove(victim)
                    release(victim)
                    victim.target = victim.prompt + victim.generated
                    victim.prefilled, victim.cached = 0, 0
                    waiting.appendleft(victim)
                    preemptions += 1
                    if victim is r:
                        break
                if r in running:
                    free -= 1
                    r.blocks += 1
        decodes = [r for r in running if r.prefilled >= r.target]
        budget = M - len(decodes)
        chunk_tokens, chunk_ctx = 0, 0
        # prefills already under way, then the queue
        for r in [r for r in running if r.prefilled < r.target]:
            take = min(budget, r.target - r.prefilled)
            if take <= 0:
                break
            r.chunk = take
            chunk_tokens += take
            budget -= take
        while waiting and budget > 0 and len(running) < S:
            r = waiting[0]
            if r.target == 0:
                r.target = r.prompt
            key_user, key_sys = ("u", r.user), ("s", r.group)
            cached = 0
            if multi and key_user in cache:
                cached = (r.prompt - 1) // blk * blk
                free += cache.pop(key_user)
            elif caching and key_sys in cache:
                cached = sys_tokens // blk * blk
                cache.move_to_end(key_sys)
            if r.target > r.prompt:  # recompute after preemption: nothing cached beyond the system prompt
                cached = min(cached, sys_tokens // blk * blk)
            need = -(-(r.target + 1) // blk)  # blocks for the prompt and the first token
            if not evict(need):
                break
            waiting.popleft()
            free -= need
            r.blocks = need
            r.cached = cached
            r.prefilled = cached
            r.admitted = order
            order += 1
            running.append(r)
            take = min(budget, r.target - r.prefilled)
            r.chunk = take
            chunk_tokens += take
            budget -= take
        if not running:
            now = max(now, reqs[nxt].arrival) if nxt < len(reqs) else now
            continue
        ctx = (sum(r.prompt + r.generated for r in decodes) / len(decodes)) if decodes else 0.0
        dt = table(len(decodes), ctx, chunk_tokens)
        now += dt
        for r in decodes:
            r.generated += 1
            r.last = now
        for r in list(running):
            if r.chunk and r.prefilled < r.target:
                r.prefilled += r.chunk
                r.chunk = 0
                if r.prefilled >= r.target:
                    if r.generated == 0:
                        r.generated = 1
                        r.first = r.last = now
        for r in [r for r in running if r.generated >= r.out and r.prefilled >= r.target]:
            r.done = True
            running.remove(r)
            release(r)
            if caching:  # the request's prompt blocks stay cached for its user and its group
                keep = r.prompt // blk
                if multi:
                    cache[("u", r.user)] = keep
                    free -= keep
                if ("s", r.group) not in cache and sys_tokens >= blk:
                    cache[("s", r.group)] = 0  # shared blocks are counted within the users' entries
                evict(0)
        if free < 0:
            evict(-free)

    return _stage_stats(reqs, rows, engine, rng, preemptions)


def _stage_stats(reqs, rows, engine: EngineParams, rng, preemptions: int) -> list[dict]:
    out = []
    lv = (50, 90, 99)
    for k, row in enumerate(rows):
        rs = [r for r in reqs if r.stage == k]
        ok = [r for r in rs if r.done]
        failed = len(rs) - len(ok)
        d: dict = {"completed": len(ok), "failed": failed, "preemptions": preemptions}
        if ok:
            n = np.array([r.out for r in ok], dtype=float)
            first = np.array([r.first for r in ok])
            last = np.array([r.last for r in ok])
            arr = np.array([r.arrival for r in ok])
            gap = (last - first) / np.maximum(n - 1, 1)
            # the client side: API cost, the steps before the first token streams, the
            # fluid model's scatter
            ttft = (first - arr + engine.t_api_s + engine.ttft_extra_iters * gap) * np.exp(
                engine.ttft_sigma * rng.standard_normal(len(ok)))
            decode = (last - first) * np.exp(engine.tpot_sigma * rng.standard_normal(len(ok)))
            e2e = ttft + decode
            tpot = decode / (engine.stream_events_per_token * (n + 1) - 1)
            for name, v in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
                for q, p in zip(("p50", "p90", "p99"), np.percentile(v, lv)):
                    d[f"{name}_{q}_s"] = float(p)
            ends = np.concatenate([arr + e2e, [r.arrival + engine.client_timeout_s for r in rs if not r.done]])
            span = float(ends.max() - min(r.arrival for r in rs))
            d["throughput_req_per_s"] = len(ok) / span
        else:
            d["throughput_req_per_s"] = 0.0
        out.append(d)
    return out
