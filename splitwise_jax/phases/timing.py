"""Phase-timing strategies used by the cluster model (and the request-level simulator).

The cluster model asks one question of a machine type: how long does an iteration with
this composition (a `Batch`) take, and at what power? `PhaseTiming` is that interface;
two strategies implement it:

* `CalibratedTiming`: the smooth physical phase model (phases.py) with calibrated
  parameters, a power cap and any GPU spec: the default, and the one to differentiate.
* `SimTableTiming`: SplitwiseSim's own piecewise-linear table from the profile file,
  so the queueing model's error can be measured apart from the phase model's.

Both are pytrees; the choice between them is static (Python class), so each jits once.
All `Batch` fields broadcast, so one call times many iterations (one inlined phase
model per call site keeps compile times down).
"""

from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from splitwise_jax.phases import phases, sim_table
from splitwise_jax.specs.batch import Batch
from splitwise_jax.specs.hardware import Machine
from splitwise_jax.specs.llm import LLM
from splitwise_jax.phases.params import PhaseParams

_STATIC = dict(static=True)


@runtime_checkable
class PhaseTiming(Protocol):
    """What the cluster model and the simulator need from a machine type.

    Attributes:
        machine: the machine (GPUs, interconnect, cost, power units).
        llm: the model served.
        cap_frac: power cap as a fraction of TDP.
    """

    machine: Machine
    llm: LLM
    cap_frac: jax.Array | float

    def iteration_s(self, batch: Batch) -> jax.Array:
        """Latency (s) of iterations of the given composition (fields broadcast)."""

    def power_w(self, batch: Batch) -> jax.Array:
        """Per-GPU power (W) while running those iterations."""

    def alone_s(self, prompt_tokens, prompt_sq_tokens) -> tuple[jax.Array, jax.Array]:
        """(TTFT, TBT) of each request running alone: the slowdown reference."""


def _alone_batch(prompt_tokens, prompt_sq_tokens) -> Batch:
    """K prompt-only iterations followed by K single-request decode iterations."""
    z, one = jnp.zeros_like(prompt_tokens), jnp.ones_like(prompt_tokens)
    return Batch(prompt_tokens=jnp.concatenate([prompt_tokens, z]), prompt_seqs=jnp.concatenate([one, z]),
                 prompt_sq_tokens=jnp.concatenate([prompt_sq_tokens, z]), decode_seqs=jnp.concatenate([z, one]),
                 decode_ctx_tokens=jnp.concatenate([z, prompt_tokens]))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class CalibratedTiming:
    """The calibrated smooth phase model on one machine type at a power cap."""

    params: PhaseParams
    machine: Machine
    llm: LLM
    cap_frac: jax.Array | float = 1.0
    tp: int | None = field(default=None, metadata=_STATIC)

    def _it(self, batch: Batch):
        return phases.iteration(self.params, self.machine, self.llm, batch, tp=self.tp, cap_frac=self.cap_frac)

    def iteration_s(self, batch: Batch) -> jax.Array:
        return self._it(batch).latency_s

    def power_w(self, batch: Batch) -> jax.Array:
        return self._it(batch).power_w

    def alone_s(self, prompt_tokens, prompt_sq_tokens):
        """(TTFT, TBT) of each request alone, from one phase-model call; the decode
        iteration reads the request's own prompt as context."""
        k = prompt_tokens.shape[0]
        t = self.iteration_s(_alone_batch(prompt_tokens, prompt_sq_tokens))
        return t[:k], t[k:]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SimTableTiming:
    """SplitwiseSim's interpolated profile table (ignores context length and caps).

    Power is not in the table; it is taken from the calibrated model of the same
    machine (`power_model`), so power and cost stay comparable across modes.
    """

    table: sim_table.SimTable
    power_model: CalibratedTiming

    def iteration_s(self, batch: Batch) -> jax.Array:
        """Any iteration, dispatched on its contents as SplitwiseSim does."""
        return sim_table.iteration_time_s(self.table, batch.prompt_tokens, batch.decode_seqs)

    def power_w(self, batch: Batch) -> jax.Array:
        return self.power_model.power_w(batch)

    def alone_s(self, prompt_tokens, prompt_sq_tokens):
        # SplitwiseSim's notebook evaluates the token curve at x = the prompt size.
        return sim_table.prompt_time_s(self.table, prompt_tokens), sim_table.token_time_s(self.table, prompt_tokens)

    @property
    def machine(self) -> Machine:
        return self.power_model.machine

    @property
    def llm(self) -> LLM:
        return self.power_model.llm

    @property
    def cap_frac(self):
        return self.power_model.cap_frac
