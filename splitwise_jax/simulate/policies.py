"""Scheduling and batching knobs of the simulated cluster, and the reference's constants.

The policies themselves (what the knobs steer) are carried out in `engine.py`, which
was written from SplitwiseSim's source (github Mutinifni/splitwise-sim, commit 8f99e7d,
MIT; two of its methods follow the reference step by step, engine.py's docstring names
them); what they are, per docs/simulate.md:

* baselines: every machine runs both phases; a request goes to the machine with the
  fewest scheduled pending tokens ("token JSQ"), prompt and decode on that machine;
* Splitwise: the "mixed pool" scheduler (prompt machine = fewest pending prompt tokens,
  drafting past `prompt_queue_tokens`; token machine = least scheduled KV memory,
  memory admission; drafted machines return to their pool when idle) with the KV cache
  shipped after the prompt;
* on every machine, iteration-level continuous batching with prompts first, at most
  `max_batch_size` requests and `max_batch_tokens` tokens per iteration, and token
  tasks preempted by prompts at most `max_preemptions` times;
* optionally chunked prefill (`chunked_prefill_tokens`): each iteration carries every
  running decode plus up to that many prompt tokens, prompts split across iterations.
"""

from __future__ import annotations

import dataclasses

__all__ = ["SimConfig", "SPLITWISESIM_WEIGHTS_BYTES", "SCHEDULERS"]

#: Model weights as SplitwiseSim's model repository sizes them (configs/model_repo/sizes:
#: bloom-176b-fp16 and llama2-70b-fp16), in bytes. Its memory admission counts these
#: against 80 GiB x 8 per instance; the catalogue's BLOOM is 352.4e9 B (176.2e9 params
#: x 2 B), which would leave ~7 % less room for the KV cache than the reference had.
SPLITWISESIM_WEIGHTS_BYTES = {"bloom-176b": 329e9, "llama2-70b": 135e9}

SCHEDULERS = ("token_jsq", "mixed_pool")


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Knobs of the request-level simulation (defaults: SplitwiseSim's configuration).

    Attributes:
        max_batch_size: requests per iteration (SplitwiseSim: 512).
        max_batch_tokens: tokens per iteration; a prompt larger than this still runs,
            alone (SplitwiseSim: 2,048).
        max_preemptions: a token task pushed out of the batch this many times is
            scheduled first (SplitwiseSim: 4).
        prompt_queue_tokens: the mixed-pool scheduler drafts a prompt onto another pool
            when the best prompt machine has a queue and would exceed this many pending
            tokens (SplitwiseSim: 8,192).
        flow_retry_s: a KV transfer whose destination lacks memory retries after this
            long (SplitwiseSim's link retry delay: 1 s).
        chunked_prefill_tokens: None for whole prompts (SplitwiseSim); an integer budget
            of prompt tokens per iteration turns on chunked prefill (colocated designs).
        scheduler: None picks "token_jsq" for baselines and "mixed_pool" for Splitwise.
        reference_memory: size the weights as SplitwiseSim does
            (`SPLITWISESIM_WEIGHTS_BYTES`); None follows the cluster's KV transfer
            (on when it ignores grouped-query attention, i.e. the sim-compatible mode).
        record_iterations: keep one row per executed batch (block of iterations) for the
            utilisation and batch-size histograms.
    """

    max_batch_size: int = 512
    max_batch_tokens: int = 2048
    max_preemptions: int = 4
    prompt_queue_tokens: int = 8192
    flow_retry_s: float = 1.0
    chunked_prefill_tokens: int | None = None
    scheduler: str | None = None
    reference_memory: bool | None = None
    record_iterations: bool = True

    def __post_init__(self):
        for name in ("max_batch_size", "max_batch_tokens", "prompt_queue_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"SimConfig.{name} must be an integer >= 1, got {v!r}")
        # >= 1: with 0 every waiting task would count as "preempted too often", including
        # a decode whose prompt has not run yet.
        if isinstance(self.max_preemptions, bool) or not isinstance(self.max_preemptions, int) \
                or self.max_preemptions < 1:
            raise ValueError(f"SimConfig.max_preemptions must be an integer >= 1, got {self.max_preemptions!r}")
        if not (isinstance(self.flow_retry_s, (int, float)) and self.flow_retry_s > 0):
            raise ValueError(f"SimConfig.flow_retry_s must be a number > 0 (seconds), got {self.flow_retry_s!r}")
        c = self.chunked_prefill_tokens
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise ValueError(f"SimConfig.chunked_prefill_tokens must be None or an integer >= 1, got {c!r}")
        if self.scheduler is not None and self.scheduler not in SCHEDULERS:
            raise ValueError(f"SimConfig.scheduler must be None or one of {list(SCHEDULERS)}, got {self.scheduler!r}")


def simulated(cluster) -> tuple:
    """What the simulator runs for a cluster: (the cluster, its `SimConfig`).

    The design's scheduler limits become the config's (`max_batch_tokens`,
    `max_batch_size`, and the mixed pool's `draft_pending_tokens` as
    `prompt_queue_tokens`). The design says
    what else (`cluster.strategy.simulated`): chunked prefill, a policy of the simulated
    machines rather than of the cluster's timing, runs as its colocated pool with the
    simulator's chunked prefill at the design's token budget. ValueError where a limit
    or the budget is not a whole number of tokens.
    """
    sched = cluster.scheduling
    knobs = {}
    for field, knob in (("max_batch_tokens", "max_batch_tokens"), ("max_batch_size", "max_batch_size"),
                        ("draft_pending_tokens", "prompt_queue_tokens")):
        v = float(getattr(sched, field))
        if abs(v - round(v)) > 1e-9:
            what = "requests" if field == "max_batch_size" else "tokens"
            raise ValueError(f"the design's scheduler.{field} is {v:g}: the simulator counts whole {what}")
        knobs[knob] = int(round(v))
    cluster, options = cluster.strategy.simulated(cluster)
    return cluster, SimConfig(**options, **knobs)
