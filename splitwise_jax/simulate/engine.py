"""The event loop: machines, their batches, the scheduler and the KV transfers.

One `heapq` of timed events (an iteration block ends, a KV transfer ends, a transfer
retries) merged with the trace's pre-sorted arrivals. Why plain `heapq` and not SimPy:
SimPy resumes a generator per process step and wraps every timeout in an event object,
several times the cost of a heap push/pop of a tuple; the speed goal (>= 20x the
reference simulator) leaves a few microseconds per event. Per-event Python work is kept
to what the policies need: no per-iteration events for decode-only batches (a batch that
does not change runs as one block of k iterations, as in SplitwiseSim, and is cut short
at the next iteration boundary when a task arrives), lists of plain objects with
``__slots__``, the timing read from lists (`timing.FastTiming`).

Where the policies come from, plainly: the machine and scheduler logic was read from
SplitwiseSim's source (commit 8f99e7d; instance.py `SplitwiseInstance`, scheduler.py
`TokenJSQScheduler` / `MixedPoolScheduler`, interconnect.py `DummyLink`) and written
anew here, in our own data structures. Two methods follow the reference's logic step by
step: `_Sim.select` (the batch selection of `SplitwiseInstance`) and
`_Sim.route_mixed_pool` (`MixedPoolScheduler`'s routing). SplitwiseSim is MIT
licensed ((c) 2024 Pratyush Patel); its notice applies to what follows it that closely
(README, "Data, licences and credits"). The policies:

Machine (continuous batching, prompts first). Tasks wait in a pending queue ordered by
(preemptions when queued, request arrival). A new batch is chosen at each block end (or
when an arrival cuts a decode block short) in this order, subject to at most
`max_batch_size` tasks, `max_batch_tokens` tokens (a prompt counts its size, a decode
one; the first task always fits) and one task per request: tasks preempted at least
`max_preemptions` times; waiting prompts (in arrival order, while their KV cache fits);
preempted decodes; the decodes of the last batch; then other waiting tasks by request
arrival (while their KV fits). Decodes of the last batch left out are preempted (they
keep their memory). Every request whose first waiting task was passed over gains a
preemption count. A batch with a prompt runs one iteration; a decode-only batch runs
until its first request finishes. An arriving task cuts a decode block at the next
iteration boundary if it fits the batch limits, or if it is a prompt that fits next to
the batch's prompts (it will preempt decodes).

Memory. A machine holds its weights plus each running request's KV cache: the prompt's
(prompt + 1 tokens) from its start, the decode's (output - 1 tokens) from its start,
all of it released when the request finishes (on the prompt machine, when the transfer
ends). A task starts only if its cache fits.

Schedulers. `token_jsq` (baselines): the machine with the fewest scheduled tokens
(prompt + 1 per request, released as phases end) runs both phases. `mixed_pool`
(Splitwise): see `_route_mixed_pool`.

KV transfer. When a prompt ends on another machine than the request's decode, the
cache (prompt tokens x KV bytes per token) moves over its own link (the reference's
per-request `DummyLink`, so transfers do not contend): set-up + bytes / bandwidth
("serialized"), or with "layerwise" only the last layer's share plus any excess of the
transfer over the prompt's compute (the same law as `kv_transfer.layerwise_transfer_s`
without its smoothing). A transfer starts only when the destination can hold the cache;
otherwise it retries every `flow_retry_s`.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
import operator
from typing import Callable, NamedTuple

import numpy as np

from splitwise_jax.simulate import tables as _tables
from splitwise_jax.simulate.plan import SimPlan, plan_of
from splitwise_jax.simulate.policies import SimConfig
from splitwise_jax.simulate.trace import RequestTrace

__all__ = ["Machine", "RawResult", "run"]

_QUEUED, _RUNNING, _BLOCKED, _DONE = 1, 2, 3, 4
_EV_ITER, _EV_FLOW, _EV_RETRY = 0, 1, 2
_INF = float("inf")


class _Task:
    __slots__ = ("r", "is_prompt", "size", "tpi", "mem", "state", "npre", "gen", "sel", "wbase", "done", "fin",
                 "hv", "bj")

    def __init__(self, r: int, is_prompt: bool, size: int, mem: float):
        self.r = r
        self.is_prompt = is_prompt
        self.size = size            # prompt tokens, or decode tokens to generate (output - 1)
        self.tpi = size if is_prompt else 1   # tokens per iteration
        self.mem = mem              # KV bytes this task allocates when it starts
        self.state = 0
        self.npre = 0               # times passed over while waiting (SplitwiseSim's preemptions), up
                                    # to when it last became its request's first waiting task here
        self.wbase = -1             # the machine's selection count then (-1: not such a task)
        self.gen = 0                # decode tokens generated (while out of a batch)
        self.sel = -1               # batch-selection stamp
        self.done = 0               # prompt tokens processed (chunked prefill)
        self.fin = 0                # in a batch: the machine's iteration count at which it finishes
        self.hv = 0                 # version of its finish-heap entry
        self.bj = 0                 # when it joined the batch (the batch is in this order)


class Machine:
    """One model instance (a DGX machine running the LLM at tensor parallel = all GPUs).

    Running decodes are not touched per iteration: the machine counts iterations (`it`)
    and each decode in the batch knows the count at which it finishes (`fin`, kept in a
    heap), so a block costs O(log batch) however large the batch.
    """

    __slots__ = ("idx", "name", "pool", "ft", "max_mem", "mem", "smem", "spt", "pq", "ppq", "blocked",
                 "batch", "btok", "preq", "waitr", "t0", "dt", "k", "start", "pause", "ver", "mixed",
                 "bP", "bn", "bS", "bB", "bC", "weights", "mem_t", "mem_area", "decodes", "prompts_run",
                 "decodes_run", "chunks", "it", "finq", "bprompts", "sum_base", "sum_fin", "n_prompt_b", "nsel")

    def __init__(self, idx: int, name: str, pool: str, ft, max_mem: float, weights: float):
        self.idx = idx
        self.name = name
        self.pool = pool            # "prompt" or "token" (the pool it starts in; baselines: "prompt")
        self.ft = ft
        self.max_mem = max_mem
        self.weights = weights
        self.mem = weights          # bytes allocated
        self.smem = weights         # bytes the scheduler has promised
        self.spt = 0                # scheduled pending tokens
        self.pq: list = []          # pending queue of tasks (see `add_pending` for its order)
        self.ppq: dict = {}         # pending prompts, insertion order
        self.blocked: dict = {}     # preempted decodes, insertion order
        self.batch: list = []       # running tasks: surviving old ones in order, then new ones
        self.btok = 0
        self.preq: list = []        # requests with a task here, by arrival
        self.waitr: list = []       # requests whose first task here is waiting, by arrival
        self.t0 = 0.0
        self.dt = 0.0
        self.k = 0
        self.start = 0.0
        self.pause = False
        self.ver = 0
        self.mixed = False          # drafted into the mixed pool
        self.bP = self.bn = self.bB = 0
        self.bS = self.bC = 0.0
        self.mem_t = 0.0            # for the time integral of KV memory
        self.mem_area = 0.0
        self.decodes: list = []     # chunked prefill: running decodes
        self.prompts_run = 0
        self.decodes_run = 0
        self.chunks: list = []      # chunked prefill: (prompt task, tokens) of the running iteration
        self.it = 0                 # iterations run
        self.finq: list = []        # (fin, seq, hv, task) of running decodes
        self.bprompts: list = []    # prompt tasks of the running batch
        self.sum_base = 0           # sum over running decodes of prompt + 1 + decode tokens
        self.sum_fin = 0            # sum over running decodes of fin
        self.n_prompt_b = 0
        # Selections so far. Every selection passes over each request whose first task
        # waits; rather than touching them all, such a task's count is read as
        # npre + nsel - wbase (read so in `add_pending` and `select`).
        self.nsel = 0


class RawResult(NamedTuple):
    """What a run produced (plain arrays; `report.py` turns them into metrics).

    Per request (index = trace row): times in seconds, machine indices (-1: none).
    `blocks`: one row per executed batch: machine, start, end, iterations, prompt
    tokens, prompts, sum of squared prompt lengths, decodes, decode context at the first
    iteration. `machines`: the machines in index order.
    """

    prompt_start: np.ndarray
    prompt_end: np.ndarray
    kv_start: np.ndarray
    kv_end: np.ndarray
    token_start: np.ndarray
    token_end: np.ndarray
    prompt_machine: np.ndarray
    token_machine: np.ndarray
    blocks: np.ndarray
    machines: list
    kv_area: np.ndarray            # per machine: integral of KV bytes over time (byte-seconds)
    kv_capacity: np.ndarray        # per machine: bytes available to the KV cache
    flow_retries: int
    end_s: float


class _Sim:
    def __init__(self, plan: SimPlan, trace: RequestTrace, cfg: SimConfig, fast: dict):
        self.cfg = cfg
        self.plan = plan
        self.kv_tok = plan.kv_bytes_per_token
        weights = plan.weights_bytes
        self.bw = plan.link_bytes_per_s
        self.setup = plan.link_setup_s
        self.layerwise = plan.layerwise
        self.n_layers = plan.n_layers
        self.chunk = cfg.chunked_prefill_tokens
        self.scheduler = cfg.scheduler or ("mixed_pool" if plan.token_pool else "token_jsq")
        if self.chunk is not None and self.scheduler != "token_jsq":
            raise ValueError("chunked prefill (SimConfig.chunked_prefill_tokens) runs on colocated designs "
                             f"(scheduler 'token_jsq'); this cluster is {plan.kind!r} with scheduler "
                             f"{self.scheduler!r}")

        # Names as SplitwiseSim's per-request records give them (<hardware>_<index>, one
        # index sequence): prompt pool first when both pools share the hardware, token
        # pool first otherwise (its cluster configs list that server type first).
        n_p, hw_p = plan.prompt.count, plan.prompt.hw_name
        n_t = plan.token.count if plan.token_pool else 0
        hw_t = plan.token.hw_name if n_t else hw_p
        first_p, first_t = (0, n_p) if hw_t == hw_p else (n_t, 0)
        machines = []
        for i in range(n_p):
            machines.append(Machine(len(machines), f"{hw_p}_{first_p + i}", "prompt", fast["prompt"],
                                    plan.prompt.kv_capacity_bytes, weights))
        for i in range(n_t):
            machines.append(Machine(len(machines), f"{hw_t}_{first_t + i}", "token", fast["token"],
                                    plan.token.kv_capacity_bytes, weights))
        self.machines = machines
        self.prompt_pool = [m for m in machines if m.pool == "prompt"]
        self.token_pool = [m for m in machines if m.pool == "token"]
        self.mixed_pool: list = []

        n = len(trace)
        self.n = n
        self.arrival = trace.arrival_s.tolist()
        self.psize = trace.prompt_tokens.tolist()
        self.osize = trace.output_tokens.tolist()
        nan = float("nan")
        self.prompt_start = [nan] * n
        self.prompt_end = [nan] * n
        self.kv_start = [nan] * n
        self.kv_end = [nan] * n
        self.token_start = [nan] * n
        self.token_end = [nan] * n
        self.pm = [-1] * n
        self.tm = [-1] * n
        self.ttask: list = [None] * n
        self.rmem = [0.0] * n        # KV bytes the request holds (SplitwiseSim's request.memory)
        self.pool: list = [None] * n  # the request's tasks on the machine it is on
        self.rsel = [-1] * n
        self.split = [False] * n
        self.heap: list = []
        self.seq = 0
        self.sel = 0
        self.now = 0.0
        self.blocks: list = []
        self.record = cfg.record_iterations
        self.max_bs = cfg.max_batch_size
        self.max_bt = cfg.max_batch_tokens
        self.max_pre = cfg.max_preemptions
        self.flow_retries = 0
        self.completed = 0

    # ---------------------------------------------------------------- event loop

    def push(self, t: float, kind: int, obj, ver: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, obj, ver))

    def run(self, progress: Callable[[int], None] | None = None) -> None:
        heap = self.heap
        pop = heapq.heappop
        arrival = self.arrival
        n = self.n
        i = 0
        tick = max(n // 100, 1)
        while True:
            if i < n and (not heap or arrival[i] <= heap[0][0]):
                self.now = arrival[i]
                self.arrive(i)
                i += 1
                if progress is not None and i % tick == 0:
                    progress(tick)
                continue
            if not heap:
                break
            t, _, kind, obj, ver = pop(heap)
            self.now = t
            if kind == _EV_ITER:
                if obj.ver == ver:
                    if self.chunk is None:
                        self.complete_block(obj)
                    else:
                        self.complete_chunked(obj)
            elif kind == _EV_FLOW:
                self.flow_done(obj)
            else:
                self.flow_try(obj)
        if progress is not None and n % tick:
            progress(n % tick)

    # ---------------------------------------------------------------- scheduler

    def arrive(self, r: int) -> None:
        p, o = self.psize[r], self.osize[r]
        pt = _Task(r, True, p, self.kv_tok * (p + 1))
        tt = _Task(r, False, o - 1, self.kv_tok * (o - 1)) if o > 1 else None
        self.ttask[r] = tt
        self.pool[r] = []
        if self.scheduler == "token_jsq":
            m = min(self.machines, key=_spt)
            m.spt += p + (1 if tt is not None else 0)
            self.pm[r] = self.tm[r] = m.idx
            self.submit(m, pt)
            if tt is not None:
                self.submit(m, tt)
            return
        self.route_mixed_pool(r, pt, tt)

    def route_mixed_pool(self, r: int, pt: _Task, tt: _Task | None) -> None:
        """SplitwiseSim's mixed-pool scheduler.

        Prompt machine: the prompt-pool machine with the fewest scheduled pending tokens,
        unless it has a queue and would pass `prompt_queue_tokens`; then the same among
        mixed-pool machines; else the token-pool machine with the fewest pending tokens
        joins the mixed pool and takes it. Token machine: the token-pool machine with the
        least scheduled KV memory, unless this request's KV (prompt + output tokens)
        would fill it; then the same among mixed machines; else the prompt-pool machine
        with the least scheduled memory joins the mixed pool. With neither, the request
        runs wholly on the machine with the fewest pending tokens. A mixed machine
        returns to its pool when it has nothing left to do.
        """
        cfg = self.cfg
        p = self.psize[r]
        need = pt.mem + (tt.mem if tt is not None else 0.0)
        pm = None
        for group in (self.prompt_pool, self.mixed_pool):
            if group:
                m = min(group, key=_spt)
                if not (m.pq and m.spt + p > cfg.prompt_queue_tokens):
                    pm = m
                    break
        tm = None
        for group in (self.token_pool, self.mixed_pool):
            if group:
                m = min(group, key=_smem)
                if m.smem + need < m.max_mem:
                    tm = m
                    break
        if pm is None and self.token_pool:
            pm = min(self.token_pool, key=_spt)
            self.token_pool.remove(pm)
            self.mixed_pool.append(pm)
            pm.mixed = True
        if tm is None and self.prompt_pool:
            tm = min(self.prompt_pool, key=_smem)
            self.prompt_pool.remove(tm)
            self.mixed_pool.append(tm)
            tm.mixed = True
        if pm is None or tm is None:
            pm = tm = min(self.prompt_pool + self.mixed_pool + self.token_pool, key=_spt)
        self.pm[r], self.tm[r] = pm.idx, tm.idx
        if pm is not tm and tt is not None:
            self.split[r] = True
            pm.smem += pt.mem
            tm.smem += pt.mem + tt.mem
            pm.spt += p
            tm.spt += 1
            self.submit(pm, pt)
        else:
            if pm is not tm:  # one-token output: nothing to decode, nothing to move
                self.tm[r] = pm.idx
            pm.smem += need
            pm.spt += p + (1 if tt is not None else 0)
            self.submit(pm, pt)
            if tt is not None:
                self.submit(pm, tt)

    def notify_free(self, m: Machine) -> None:
        if m.mixed:
            m.mixed = False
            self.mixed_pool.remove(m)
            (self.prompt_pool if m.pool == "prompt" else self.token_pool).append(m)

    # ---------------------------------------------------------------- machine: queues

    def set_mem(self, m: Machine, delta: float) -> None:
        now = self.now
        m.mem_area += (m.mem - m.weights) * (now - m.mem_t)
        m.mem_t = now
        m.mem += delta

    def add_pending(self, m: Machine, t: _Task, preempted: bool = False) -> None:
        """Queue a task. SplitwiseSim inserts with `bisect.insort` keyed by (preemptions,
        request arrival) evaluated *at insertion time on the entries it probes*, whose
        counts have grown since they were queued; the list is not sorted by any fixed key,
        so the same binary search is reproduced here (a fixed key reorders the queue and
        changes which task "preempted too often" is found first)."""
        arrival = self.arrival
        q = m.pq
        nsel = m.nsel
        key = (t.npre, arrival[t.r])
        lo, hi = 0, len(q)
        while lo < hi:
            mid = (lo + hi) // 2
            e = q[mid]
            if key < (e.npre + nsel - e.wbase if e.wbase >= 0 else e.npre, arrival[e.r]):
                hi = mid
            else:
                lo = mid + 1
        q.insert(lo, t)
        if preempted:
            m.blocked[t] = None
        if t.is_prompt:
            m.ppq[t] = None
        r = t.r
        if self.pool[r][0] is t:
            bisect.insort(m.waitr, r)
            t.wbase = nsel

    def remove_pending(self, m: Machine, t: _Task) -> None:
        m.pq.remove(t)
        if m.blocked:
            m.blocked.pop(t, None)
        if t.is_prompt:
            del m.ppq[t]
        r = t.r
        if self.pool[r][0] is t:
            w = m.waitr
            del w[bisect.bisect_left(w, r)]
            t.npre += m.nsel - t.wbase
            t.wbase = -1

    def submit(self, m: Machine, t: _Task) -> None:
        """A task arrives at a machine (SplitwiseSim's `task_arrival`)."""
        t.state = _QUEUED
        r = t.r
        lst = self.pool[r]
        if not lst:
            bisect.insort(m.preq, r)
        lst.append(t)
        if self.chunk is not None:
            self.submit_chunked(m, t)
            return
        self.add_pending(m, t)
        batch = m.batch
        if not batch:
            if m.mem + t.mem > m.max_mem:
                return
            self.start_block(m)
            return
        if len(batch) < self.max_bs and m.btok + t.tpi <= self.max_bt:
            self.cut_block(m)
            return
        if t.is_prompt:
            prompt_tokens = m.btok - (len(batch) - len(m.bprompts))
            if len(m.bprompts) < len(batch) and prompt_tokens + t.size <= self.max_bt:
                self.cut_block(m)

    def cut_block(self, m: Machine) -> None:
        """End a decode-only block at the next iteration boundary."""
        if m.pause or m.n_prompt_b > 0:
            return
        m.pause = True
        j = _tables.iterations_done(m.t0, m.dt, self.now - m.start) + 1
        if j < m.k:
            m.k = j
            m.ver += 1
            self.seq += 1
            heapq.heappush(self.heap, (m.start + j * m.t0 + m.dt * j * (j - 1) * 0.5, self.seq, _EV_ITER, m, m.ver))

    # ---------------------------------------------------------------- machine: batches

    def select(self, m: Machine):
        """The next batch (see the module docstring).

        Returns the tasks to add and how many of the last batch's decodes stay (a
        prefix: they are all decodes, none selected before, one token each).
        """
        max_bs, max_bt, max_pre = self.max_bs, self.max_bt, self.max_pre
        self.sel += 1
        sel = self.sel
        rsel = self.rsel
        new = []
        nb = 0
        bt = 0
        mem = m.mem
        cap = m.max_mem
        # 1. tasks passed over max_preemptions times (queue order; stops at the first that was not)
        nsel = m.nsel
        for t in m.pq:
            if (t.npre + nsel - t.wbase if t.wbase >= 0 else t.npre) < max_pre:
                break
            if nb == max_bs or (nb and bt + t.tpi > max_bt):
                break
            if rsel[t.r] == sel:
                continue
            if t.state == _BLOCKED:
                pass
            elif t.mem + mem <= cap:
                mem += t.mem
            else:
                continue
            new.append(t)
            t.sel = rsel[t.r] = sel
            nb += 1
            bt += t.tpi
        # 2. waiting prompts, in arrival order, while their KV fits
        for t in m.ppq:
            if nb == max_bs or (nb and bt + t.tpi > max_bt):
                break
            if rsel[t.r] == sel:
                continue
            if t.mem + mem > cap:
                break
            mem += t.mem
            new.append(t)
            t.sel = rsel[t.r] = sel
            nb += 1
            bt += t.tpi
        # 3. preempted decodes
        for t in m.blocked:
            if nb == max_bs or (nb and bt + 1 > max_bt):
                break
            if rsel[t.r] == sel:
                continue
            new.append(t)
            t.sel = rsel[t.r] = sel
            nb += 1
            bt += 1
        # 4. the last batch's decodes, in order, while they fit (one token each)
        n_old = len(m.batch)
        if n_old:
            keep = min(n_old, max_bs - nb, max_bt - bt) if nb else min(n_old, max_bs, max(max_bt, 1))
            keep = max(keep, 0)
            nb += keep
            bt += keep
        else:
            keep = 0
        # 5. other waiting requests by arrival, while their KV fits (if 4 stopped early,
        #    the same limit stops this loop at its first candidate)
        if keep == n_old and nb < max_bs:
            pool = self.pool
            for r in m.waitr:
                if nb == max_bs:
                    break
                if rsel[r] == sel:
                    continue
                t = pool[r][0]
                if nb and bt + t.tpi > max_bt:
                    break
                if t.state != _BLOCKED:
                    if t.mem + mem > cap:
                        break
                    mem += t.mem
                new.append(t)
                t.sel = rsel[r] = sel
                nb += 1
                bt += t.tpi
        m.btok = bt
        return new, keep

    def start_block(self, m: Machine) -> None:
        """Choose the next batch and start it (SplitwiseSim's `start_iteration`)."""
        batch = m.batch
        if not m.pq:
            # Nothing waits: the selection would keep the last batch's decodes whole (they
            # fitted its limits, and its prompts are done) and pass nobody over.
            if batch:
                m.btok = len(batch)
                self.launch(m)
            elif not m.preq:
                self.notify_free(m)
            return
        new, keep = self.select(m)
        if keep < len(batch):
            preempted = batch[keep:]
            del batch[keep:]
            it = m.it
            psize = self.psize
            for t in preempted:
                t.gen = t.size - (t.fin - it)
                m.sum_base -= psize[t.r] + 1 + t.size
                m.sum_fin -= t.fin
                t.state = _BLOCKED
                self.add_pending(m, t, preempted=True)
        # the newcomers leave the pending structures and join the batch (remove_pending,
        # set_mem inlined: this loop runs for every task of every request)
        now = self.now
        seq = self.seq
        pool = self.pool
        rmem = self.rmem
        pq = m.pq
        waitr = m.waitr
        it = m.it
        grown = 0.0
        for t in new:
            pq.remove(t)
            r = t.r
            if pool[r][0] is t:
                del waitr[bisect.bisect_left(waitr, r)]
                t.npre += m.nsel - t.wbase
                t.wbase = -1
            batch.append(t)
            seq += 1
            t.bj = seq
            if t.is_prompt:
                del m.ppq[t]
                grown += t.mem
                rmem[r] += t.mem
                self.prompt_start[r] = now
                m.prompts_run += 1
                m.bprompts.append(t)
            else:
                if t.state == _QUEUED:
                    grown += t.mem
                    rmem[r] += t.mem
                    self.token_start[r] = now
                    m.decodes_run += 1
                else:
                    del m.blocked[t]
                fin = it + t.size - t.gen
                t.fin = fin
                t.hv += 1
                seq += 1
                heapq.heappush(m.finq, (fin, seq, t.hv, t))
                m.sum_base += self.psize[r] + 1 + t.size
                m.sum_fin += fin
            t.state = _RUNNING
        self.seq = seq
        if grown:
            self.set_mem(m, grown)
        m.nsel += 1  # passes over every request whose first task still waits (see Machine.nsel)
        if not batch:
            if not m.preq:
                self.notify_free(m)
            return
        self.launch(m)

    def launch(self, m: Machine) -> None:
        ft = m.ft
        n = len(m.bprompts)
        m.n_prompt_b = n
        B = len(m.batch) - n
        C = float(m.sum_base - m.sum_fin + B * m.it) if (B and ft.uses_context) else 0.0
        if n:
            P = 0
            S = 0.0
            for t in m.bprompts:
                p = t.size
                P += p
                S += p * p
            m.t0, m.dt, m.k = ft.iteration(P, n, S, B, C), 0.0, 1
        else:
            P = 0
            S = 0.0
            q = m.finq
            while True:  # drop entries of decodes that left the batch
                fin, _, hv, t = q[0]
                if t.state == _RUNNING and t.hv == hv:
                    break
                heapq.heappop(q)
            k = fin - m.it
            m.k = k
            m.t0, m.dt = ft.decode_block(B, C, k)
        m.bP, m.bn, m.bS, m.bB, m.bC = P, n, S, B, C
        now = self.now
        m.start = now
        m.pause = False
        ver = m.ver = m.ver + 1
        k = m.k
        self.seq = seq = self.seq + 1
        heapq.heappush(self.heap, (now + k * m.t0 + m.dt * k * (k - 1) * 0.5, seq, _EV_ITER, m, ver))

    def complete_block(self, m: Machine) -> None:
        now = self.now
        k = m.k
        if self.record:
            self.blocks.append((m.idx, m.start, now, k, m.bP, m.bn, m.bS, m.bB, m.bC))
        m.it += k
        it = m.it
        done = m.bprompts
        m.bprompts = []
        q = m.finq
        while q and q[0][0] <= it:
            fin, _, hv, t = heapq.heappop(q)
            if t.state == _RUNNING and t.hv == hv:
                done.append(t)
        if len(done) > 1:
            # SplitwiseSim completes them in batch order: survivors keep their order and
            # newcomers are appended, so the batch is in order of joining
            done.sort(key=_bj)
        for t in done:
            self.task_done(m, t)
        m.n_prompt_b = 0
        m.pause = False
        self.start_block(m)

    def task_done(self, m: Machine, t: _Task) -> None:
        t.state = _DONE
        m.batch.remove(t)
        r = t.r
        lst = self.pool[r]
        lst.remove(t)
        if not lst:
            q = m.preq
            del q[bisect.bisect_left(q, r)]
        now = self.now
        if t.is_prompt:
            m.spt -= t.size
            self.prompt_end[r] = now
            tt = self.ttask[r]
            if tt is None:
                self.finish(m, r)
            elif self.split[r]:
                self.flow_try(r)
            elif self.chunk is None:
                # the chained decode is now the request's first task here, and waiting
                bisect.insort(m.waitr, r)
                tt.wbase = m.nsel
        else:
            m.spt -= 1
            m.sum_base -= self.psize[r] + 1 + t.size
            m.sum_fin -= t.fin
            self.finish(m, r)

    def finish(self, m: Machine, r: int) -> None:
        """The request's last token: release its KV cache."""
        freed = self.rmem[r]
        self.set_mem(m, -freed)
        m.smem -= freed
        self.rmem[r] = 0.0
        self.token_end[r] = self.now
        self.completed += 1

    # ---------------------------------------------------------------- KV transfer

    def flow_try(self, r: int) -> None:
        dest = self.machines[self.tm[r]]
        need = self.rmem[r]
        if dest.mem + need > dest.max_mem:
            self.flow_retries += 1
            self.push(self.now + self.cfg.flow_retry_s, _EV_RETRY, r)
            return
        self.set_mem(dest, need)
        self.kv_start[r] = self.now
        total = self.psize[r] * self.kv_tok / self.bw
        if self.layerwise:
            prompt_s = self.prompt_end[r] - self.prompt_start[r]  # the prompt's iteration
            L = self.n_layers
            dur = self.setup + total / L + max(0.0, (total - prompt_s) * (L - 1) / L)
        else:
            dur = self.setup + total
        self.push(self.now + dur, _EV_FLOW, r)

    def flow_done(self, r: int) -> None:
        src = self.machines[self.pm[r]]
        dest = self.machines[self.tm[r]]
        freed = self.rmem[r]
        self.set_mem(src, -freed)
        src.smem -= freed
        self.kv_end[r] = self.now
        self.submit(dest, self.ttask[r])
        # the source may have been waiting for this memory
        if src.pq and self.chunk is None:
            t = src.pq[0]
            if not src.batch:
                if src.mem + t.mem <= src.max_mem:
                    self.start_block(src)
            elif len(src.batch) < self.max_bs and src.btok < self.max_bt:
                self.cut_block(src)

    # ---------------------------------------------------------------- chunked prefill

    def submit_chunked(self, m: Machine, t: _Task) -> None:
        """Chunked prefill: prompts queue FCFS; a request's decode joins when its prompt ends."""
        if t.is_prompt:
            m.ppq[t] = None
            if not m.batch and not m.decodes:
                self.start_chunked(m)
            else:
                self.cut_block(m)

    def start_chunked(self, m: Machine) -> None:
        """Every running decode plus up to `chunked_prefill_tokens` prompt tokens.

        A prompt is admitted (FCFS) when the KV cache of its whole request fits; it is
        then never preempted. Decodes beyond `max_batch_size` wait their turn.
        """
        cfg = self.cfg
        budget = self.chunk
        now = self.now
        decodes = m.decodes[: cfg.max_batch_size]
        room = cfg.max_batch_size - len(decodes)
        chunks = []
        P = n = 0
        S = 0.0
        for t in m.ppq:
            if budget <= 0 or room <= 0:
                break
            r = t.r
            if t.state == _QUEUED:
                need = t.mem + (self.ttask[r].mem if self.ttask[r] is not None else 0.0)
                if m.mem + need > m.max_mem:
                    break
                self.set_mem(m, need)
                self.rmem[r] += need
                t.state = _RUNNING
                self.prompt_start[r] = now
                m.prompts_run += 1
            c = min(t.size - t.done, budget)
            chunks.append((t, c))
            budget -= c
            room -= 1
            P += c
            n += 1
            S += (t.done + c) ** 2 - t.done ** 2
        B = len(decodes)
        if not chunks and not B:
            m.batch = []
            if not m.preq:
                self.notify_free(m)
            return
        psize = self.psize
        C = 0.0
        for t in decodes:
            C += psize[t.r] + 1 + t.gen
        m.batch = decodes
        m.n_prompt_b = len(chunks)
        m.chunks = chunks
        if chunks:
            m.t0, m.dt, m.k = m.ft.iteration(P, n, S, B, C), 0.0, 1
        else:
            k = min(t.size - t.gen for t in decodes)
            m.k = k
            m.t0, m.dt = m.ft.decode_block(B, C, k)
        m.btok = P + B
        m.bP, m.bn, m.bS, m.bB, m.bC = P, n, S, B, C
        m.start = now
        m.pause = False
        m.ver += 1
        self.push(now + _tables.cumulative_s(m.t0, m.dt, m.k), _EV_ITER, m, m.ver)

    def complete_chunked(self, m: Machine) -> None:
        now = self.now
        k = m.k
        if self.record:
            self.blocks.append((m.idx, m.start, now, k, m.bP, m.bn, m.bS, m.bB, m.bC))
        finished = []
        for t in m.batch:
            if self.token_start[t.r] != self.token_start[t.r]:  # NaN: first decode iteration
                self.token_start[t.r] = m.start
                m.decodes_run += 1
            t.gen += k
            if t.gen >= t.size:
                finished.append(t)
        for t in finished:
            m.decodes.remove(t)
            r = t.r
            self.pool[r].remove(t)
            if not self.pool[r]:
                del m.preq[bisect.bisect_left(m.preq, r)]
            m.spt -= 1
            t.state = _DONE
            self.finish(m, r)
        for t, c in m.chunks:
            t.done += c
            if t.done >= t.size:
                r = t.r
                del m.ppq[t]
                t.state = _DONE
                self.pool[r].remove(t)
                m.spt -= t.size
                self.prompt_end[r] = now
                tt = self.ttask[r]
                if tt is None:
                    del m.preq[bisect.bisect_left(m.preq, r)]
                    self.finish(m, r)
                else:
                    tt.state = _RUNNING
                    m.decodes.append(tt)
        m.chunks = []
        m.n_prompt_b = 0
        m.pause = False
        self.start_chunked(m)


_spt = operator.attrgetter("spt")
_smem = operator.attrgetter("smem")
_bj = operator.attrgetter("bj")


def run(cluster, trace: RequestTrace, cfg: SimConfig = SimConfig(), *, fast: dict | None = None,
        progress: Callable[[int], None] | None = None) -> RawResult:
    """Simulate a trace on a cluster; see `splitwise_jax.simulate.simulate` for the public entry.

    Args:
        cluster: a `Cluster` (`designs.make_cluster`) with whole pool sizes, or its
            `plan.SimPlan` (then `fast` is needed).
        trace: the requests.
        cfg: the policies' knobs.
        fast: {"prompt": FastTiming, "token": FastTiming} (built from the cluster if None).
        progress: called with the number of requests newly arrived, now and then.
    """
    if isinstance(cluster, SimPlan):
        plan = cluster
        if fast is None:
            raise ValueError("engine.run of a SimPlan needs its fast timings (fast={'prompt': ..., 'token': ...})")
    else:
        plan = plan_of(cluster, cfg)
        if fast is None:
            fast = build_fast_timings(cluster, trace, cfg)
    sim = _Sim(plan, trace, cfg, fast)
    # The loop allocates many small tuples and objects; the cyclic collector's passes
    # over them cost ~20 % of the loop and free nothing until the run ends.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        sim.run(progress)
    finally:
        if was_enabled:
            gc.enable()
    end = sim.now
    for m in sim.machines:
        sim.now = end
        sim.set_mem(m, 0.0)
    blocks = np.asarray(sim.blocks, dtype=np.float64).reshape(-1, 9)
    kv_cap = np.asarray([m.max_mem - m.weights for m in sim.machines])
    return RawResult(
        prompt_start=np.asarray(sim.prompt_start), prompt_end=np.asarray(sim.prompt_end),
        kv_start=np.asarray(sim.kv_start), kv_end=np.asarray(sim.kv_end),
        token_start=np.asarray(sim.token_start), token_end=np.asarray(sim.token_end),
        prompt_machine=np.asarray(sim.pm), token_machine=np.asarray(sim.tm),
        blocks=blocks, machines=sim.machines,
        kv_area=np.asarray([m.mem_area for m in sim.machines]), kv_capacity=kv_cap,
        flow_retries=sim.flow_retries, end_s=end,
    )


def table_extents(trace: RequestTrace, cfg: SimConfig) -> dict:
    """The extents a run's tables need (`timing.fast_timing`, `timing.power_grid`)."""
    max_prompt = int(trace.prompt_tokens.max())
    # tokens of one iteration: the budget (or one larger prompt) plus decodes; a huge
    # budget is tabulated lazily (the tables grow on demand)
    budget = min(cfg.chunked_prefill_tokens or cfg.max_batch_tokens, 16384)
    max_tokens = max(budget, max_prompt) + cfg.max_batch_size
    max_ctx = int((trace.prompt_tokens + trace.output_tokens).max()) + 1
    return dict(max_tokens=max_tokens, max_batch=cfg.max_batch_size, max_context=max_ctx)


def build_fast_timings(cluster, trace: RequestTrace, cfg: SimConfig) -> dict:
    """Fast timings of the prompt and token machine types, sized to the trace."""
    from splitwise_jax.simulate import timing as _timing

    kw = table_extents(trace, cfg)
    prompt = _timing.fast_timing(cluster.prompt, **kw)
    token = _timing.fast_timing(cluster.token, **kw) if cluster.strategy.token_pool else prompt
    return {"prompt": prompt, "token": token}
