"""Phase-timing strategies used by the cluster model.

The cluster model asks one question of a machine type: how long does an iteration take
with this many prompt tokens and decoding sequences? Two answers:

* `CalibratedTiming`: the smooth physical phase model (phases.py) with calibrated
  parameters, a power cap and any GPU spec — the default, and the one to differentiate.
* `SimTableTiming`: SplitwiseSim's own piecewise-linear table from the profile file,
  so the queueing model's error can be measured apart from the phase model's.

Both are pytrees; the choice between them is static (Python class), so each jits once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field

import jax
import jax.numpy as jnp

from splitwise_jax import phases, sim_table
from splitwise_jax.batch import Batch
from splitwise_jax.hardware import Machine
from splitwise_jax.llm import LLM
from splitwise_jax.params import PhaseParams

_STATIC = dict(static=True)


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

    def iteration_s(self, prompt_tokens, prompt_sq_tokens, prompt_seqs, decode_seqs, decode_ctx_tokens):
        """Any iteration (arrays broadcast): one phase-model call for many batches."""
        return self._it(Batch(prompt_tokens, prompt_seqs, prompt_sq_tokens, decode_seqs, decode_ctx_tokens)).latency_s

    def prompt_s(self, prompt_tokens, prompt_sq_tokens, prompt_seqs=1.0):
        return self._it(Batch(prompt_tokens, prompt_seqs, prompt_sq_tokens)).latency_s

    def decode_s(self, batch_size, context_tokens):
        return self._it(Batch.decode(batch_size, context_tokens)).latency_s

    def mixed_s(self, prompt_tokens, prompt_sq_tokens, batch_size, context_tokens):
        b = jnp.asarray(batch_size, dtype=float)
        batch = Batch(prompt_tokens, 1.0, prompt_sq_tokens, b, b * context_tokens)
        return self._it(batch).latency_s

    def alone_tbt_s(self, prompt_tokens):
        """A request's own decode iteration time when running alone."""
        return self.decode_s(1.0, prompt_tokens)

    def alone_s(self, prompt_tokens, prompt_sq_tokens):
        """(TTFT, TBT) of each request running alone, from one phase-model call."""
        k = prompt_tokens.shape[0]
        z, one = jnp.zeros(k), jnp.ones(k)
        t = self.iteration_s(jnp.concatenate([prompt_tokens, z]), jnp.concatenate([prompt_sq_tokens, z]),
                             jnp.concatenate([one, z]), jnp.concatenate([z, one]), jnp.concatenate([z, prompt_tokens]))
        return t[:k], t[k:]

    def power_w(self, prompt_tokens, prompt_sq_tokens, prompt_seqs, decode_seqs, decode_ctx_tokens):
        """Per-GPU power of iterations (arrays broadcast)."""
        return self._it(Batch(prompt_tokens, prompt_seqs, prompt_sq_tokens, decode_seqs, decode_ctx_tokens)).power_w

    def prompt_power_w(self, prompt_tokens, prompt_sq_tokens):
        return self._it(Batch(prompt_tokens, 1.0, prompt_sq_tokens)).power_w

    def decode_power_w(self, batch_size, context_tokens):
        return self._it(Batch.decode(batch_size, context_tokens)).power_w


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SimTableTiming:
    """SplitwiseSim's interpolated profile table (ignores context length and caps).

    Power is not in the table; it is taken from the calibrated model of the same
    machine (`power_model`), so power and cost stay comparable across modes.
    """

    table: sim_table.SimTable
    power_model: CalibratedTiming

    def iteration_s(self, prompt_tokens, prompt_sq_tokens, prompt_seqs, decode_seqs, decode_ctx_tokens):
        """Any iteration, dispatched on its contents as SplitwiseSim does."""
        return sim_table.iteration_time_s(self.table, prompt_tokens, decode_seqs)

    def prompt_s(self, prompt_tokens, prompt_sq_tokens, prompt_seqs=1.0):
        return sim_table.prompt_time_s(self.table, prompt_tokens)

    def decode_s(self, batch_size, context_tokens):
        return sim_table.token_time_s(self.table, batch_size)

    def mixed_s(self, prompt_tokens, prompt_sq_tokens, batch_size, context_tokens):
        return sim_table.mixed_time_s(self.table, prompt_tokens, batch_size)

    def alone_tbt_s(self, prompt_tokens):
        # SplitwiseSim's notebook evaluates the token curve at x = the prompt size.
        return sim_table.token_time_s(self.table, prompt_tokens)

    def alone_s(self, prompt_tokens, prompt_sq_tokens):
        return sim_table.prompt_time_s(self.table, prompt_tokens), self.alone_tbt_s(prompt_tokens)

    def power_w(self, *batch):
        return self.power_model.power_w(*batch)

    def prompt_power_w(self, prompt_tokens, prompt_sq_tokens):
        return self.power_model.prompt_power_w(prompt_tokens, prompt_sq_tokens)

    def decode_power_w(self, batch_size, context_tokens):
        return self.power_model.decode_power_w(batch_size, context_tokens)

    @property
    def machine(self) -> Machine:
        return self.power_model.machine

    @property
    def llm(self) -> LLM:
        return self.power_model.llm

    @property
    def cap_frac(self):
        return self.power_model.cap_frac
