"""What `evaluate` answers, in one place: `ClusterMetrics`, its status bits (`Status`),
the percentile levels and their labels, and its plain-data forms (`metrics_to_dict`,
the command line's JSON object; `metrics_frame`, a flat table of a batch).

Percentile triples are (P50, P90, P99) everywhere (`LEVELS`, `KEYS`, `NAMES`); latency
metrics are ordered TTFT, TBT, E2E (`METRICS`), the rows of the SLO table
(`specs.paper.TABLE_VI_SLO`) and of `ClusterMetrics.slo_margin`.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:  # annotations only: the simulator's report reads this module without JAX
    import jax

#: Percentile levels of every latency triple.
LEVELS = (0.5, 0.9, 0.99)
#: Their keys in JSON objects and column names.
KEYS = ("p50", "p90", "p99")
#: Their names in tables and messages.
NAMES = ("P50", "P90", "P99")
#: The latency metrics, in the order of the SLO table's rows.
METRICS = ("ttft", "tbt", "e2e")


class Status(enum.IntFlag):
    """`ClusterMetrics.status` bits (a float array in the model; `int()` it to test).

    Measured alike by the simulator (`simulate.report.metrics_dict`)."""

    OK = 0
    PROMPT_POOL_OVERLOADED = 1    # prompt-pool load rho > 1
    TOKEN_POOL_OVERLOADED = 2     # token machines' drafted prompt load > 1
    KV_MEMORY_FULL = 4            # KV memory asked for > memory there
    MIXED_POOL_ACTIVE = 8         # > 5 % of prompts drafted or of decodes moved

    @property
    def word(self) -> str:
        """The bit's name in outputs: "prompt-pool-overloaded", ..."""
        return self.name.lower().replace("_", "-")


#: Share of prompts drafted (or of decodes moved) above which the mixed pool counts as active.
MIXED_ACTIVE = 0.05
#: status bit -> word, as outputs name them.
STATUS_WORDS = {int(bit): bit.word for bit in Status if bit}


def status_words(code) -> list[str]:
    """The words of a status code's bits ("ok" for none)."""
    code = int(code)
    return [w for bit, w in STATUS_WORDS.items() if code & bit] or ["ok"]


def status_code(rho_prompt, rho_token, memory_pressure, drafted, moved):
    """The status bits as a float (traced): overloads, full KV memory, an active mixed pool."""
    return (float(Status.PROMPT_POOL_OVERLOADED) * (rho_prompt > 1.0)
            + float(Status.TOKEN_POOL_OVERLOADED) * (rho_token > 1.0)
            + float(Status.KV_MEMORY_FULL) * (memory_pressure > 1.0)
            + float(Status.MIXED_POOL_ACTIVE) * ((drafted > MIXED_ACTIVE) | (moved > MIXED_ACTIVE)))


class ClusterMetrics(NamedTuple):
    """Outputs of `evaluate` (arrays; leading axes follow any vmap).

    Percentile triples are (P50, P90, P99) (`LEVELS`). `status`: `Status` bits,
    1 prompt pool overloaded, 2 token pool overloaded, 4 KV memory full, 8 mixed pool
    active (>5% of prompts or decodes moved across pools).
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
    memory_pressure: jax.Array     # KV memory asked for / memory there (token pool; baseline: all)
    mixed_prompt_frac: jax.Array   # prompts drafted onto token machines
    mixed_decode_frac: jax.Array   # decodes moved to prompt machines
    status: jax.Array


def triple(a) -> dict[str, float]:
    """A (P50, P90, P99) triple as {"p50": ..., "p90": ..., "p99": ...} (plain floats)."""
    return {k: float(v) for k, v in zip(KEYS, np.asarray(a))}


def metrics_to_dict(m: ClusterMetrics) -> dict:
    """The command line's JSON object from one evaluation's metrics (plain floats)."""
    margins = np.asarray(m.slo_margin)
    return {
        "ttft_s": triple(m.ttft_s), "tbt_s": triple(m.tbt_s), "e2e_s": triple(m.e2e_s),
        "slowdown": {"ttft": triple(m.slowdown_ttft), "tbt": triple(m.slowdown_tbt), "e2e": triple(m.slowdown_e2e)},
        "slo_margin_log": {name: triple(margins[i]) for i, name in enumerate(METRICS)},
        "meets_slo": bool(m.meets_slo),
        "throughput_rps": float(m.throughput_rps),
        "cost_per_hour": float(m.cost_per_hour),
        "power_kw": float(m.power_kw),
        "provisioned_power_kw": float(m.provisioned_power_kw),
        "utilisation": {"prompt_pool_rho": float(m.rho_prompt_pool), "token_pool_prompt_rho": float(m.rho_token_pool),
                        "prompt_pool_mean_batch": float(m.batch_prompt_pool),
                        "token_pool_mean_batch": float(m.batch_token_pool),
                        "kv_memory_pressure": float(m.memory_pressure)},
        "mixed_pool": {"prompts_drafted_frac": float(m.mixed_prompt_frac),
                       "decodes_moved_frac": float(m.mixed_decode_frac)},
        "status": " ".join(status_words(m.status)),
    }


def metrics_lists(m: ClusterMetrics) -> dict:
    """Every field as (nested) lists of floats, by field name (a batch keeps its axes)."""
    return {k: np.asarray(v).tolist() for k, v in m._asdict().items()}


#: Scalar fields of `ClusterMetrics`, the columns `metrics_frame` copies as they are.
SCALAR_FIELDS = ("throughput_rps", "cost_per_hour", "power_kw", "provisioned_power_kw", "rho_prompt_pool",
                 "rho_token_pool", "batch_prompt_pool", "batch_token_pool", "memory_pressure", "mixed_prompt_frac",
                 "mixed_decode_frac")


def metrics_frame(m: ClusterMetrics, inputs: dict | None = None, scalars=SCALAR_FIELDS):
    """`ClusterMetrics` with a leading point axis as a flat `pandas.DataFrame`: the
    `inputs` columns, then per metric and level `{met}_{p50}_s` and `slowdown_{met}_{p50}`,
    `min_margin` (the smallest of the nine SLO margins), `meets_slo`, the `scalars` and
    `status` (int)."""
    import pandas as pd

    d = dict(inputs or {})
    for met in METRICS:
        for q, pc in enumerate(KEYS):
            d[f"{met}_{pc}_s"] = np.asarray(getattr(m, f"{met}_s"))[..., q]
            d[f"slowdown_{met}_{pc}"] = np.asarray(getattr(m, f"slowdown_{met}"))[..., q]
    margin = np.asarray(m.slo_margin)
    d["min_margin"] = margin.reshape(margin.shape[:-2] + (9,)).min(axis=-1)
    d["meets_slo"] = np.asarray(m.meets_slo).astype(bool)
    for k in scalars:
        d[k] = np.asarray(getattr(m, k))
    d["status"] = np.asarray(m.status).astype(int)
    return pd.DataFrame(d)
