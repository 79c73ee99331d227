"""Metrics of a simulated run, as the reference simulator defines them.

Per request (shared/validation/README.md, "Metric definitions"):

* TTFT = end of the prompt phase - arrival (the KV transfer is not in it);
* E2E = last token - arrival;
* TBT = (E2E - TTFT) / output tokens (so it includes the transfer in Splitwise designs);
* slowdowns against the request alone on one DGX-A100 (`cluster.alone`): TTFT alone =
  its prompt iteration, TBT alone = the strategy's own alone decode time (for the sim
  table: the token curve at x = the prompt size, the simulator notebook's convention),
  E2E alone = TTFT alone + TBT alone x (output tokens - 1);
* P50/P90/P99 over completed requests with linear interpolation (pandas `quantile`);
* `meets_slo`: all nine slowdown percentiles under the limits (Table VI, `PAPER_SLO`).

The JSON object has exactly the keys of `python -m splitwise_jax.evaluate --json`
(`evaluate.metrics_to_dict`); the quantities the fluid model predicts are measured here
instead (docs/simulate.md says how each is measured). Per-machine utilisation and the
time-weighted batch-size histograms (Splitwise Fig. 17) are separate tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from splitwise_jax.simulate.engine import RawResult
from splitwise_jax.simulate.plan import SimPlan
from splitwise_jax.simulate.trace import RequestTrace
from splitwise_jax.cluster.metrics import KEYS, LEVELS, MIXED_ACTIVE, Status
from splitwise_jax.cluster.metrics import STATUS_WORDS as _STATUS_WORDS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PERCENTILES", "request_table", "request_columns", "metrics_dict", "machine_table", "machine_columns",
           "batch_histogram", "percentiles", "STATUS_WORDS"]

PERCENTILES = LEVELS
_PCT = KEYS
#: status bits, as `evaluate` names them (`metrics.Status`)
STATUS_WORDS = _STATUS_WORDS
# A pool counts as overloaded when its machines spent this fraction of the arrival
# window running prompts (the fluid model's rho > 1 has no sharper sample-path analogue).
_OVERLOAD_BUSY = 0.95
# "mixed pool active" as in evaluate: more than 5 % of prompts or decodes moved.
_MIXED_ACTIVE = MIXED_ACTIVE
# "KV memory full": more than 1 % of requests waited for memory (a transfer retried or
# a task was held back by memory when its machine was otherwise idle... see docs).
_MEMORY_FULL = 0.01


def percentiles(x: np.ndarray) -> np.ndarray:
    """P50, P90, P99 with linear interpolation (pandas' default), NaN-free input."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return np.full(3, np.nan)
    return np.quantile(x, PERCENTILES, method="linear")


def request_table(raw: RawResult, trace: RequestTrace, alone_ttft_s: np.ndarray,
                  alone_tbt_s: np.ndarray) -> pd.DataFrame:
    """One row per request: sizes, timings, machines, the alone reference."""
    import pandas as pd
    return pd.DataFrame(request_columns(raw, trace, alone_ttft_s, alone_tbt_s))


def request_columns(raw: RawResult, trace: RequestTrace, alone_ttft_s: np.ndarray,
                    alone_tbt_s: np.ndarray) -> dict[str, np.ndarray]:
    """`request_table`'s columns, as NumPy arrays (no pandas)."""
    arrival = trace.arrival_s
    o = trace.output_tokens.astype(np.float64)
    ttft = raw.prompt_end - arrival
    e2e = raw.token_end - arrival
    names = np.asarray([m.name for m in raw.machines] + [""], dtype=object)
    a_e2e = alone_ttft_s + alone_tbt_s * (o - 1.0)
    return {
        "request_id": trace.request_id,
        "arrival_s": arrival,
        "prompt_tokens": trace.prompt_tokens,
        "output_tokens": trace.output_tokens,
        "queue_s": raw.prompt_start - arrival,
        "ttft_s": ttft,
        "tbt_s": (e2e - ttft) / o,
        "e2e_s": e2e,
        "prompt_machine": names[raw.prompt_machine],
        "prompt_start_s": raw.prompt_start,
        "prompt_end_s": raw.prompt_end,
        "kv_start_s": raw.kv_start,
        "kv_end_s": raw.kv_end,
        "token_machine": names[raw.token_machine],
        "token_start_s": raw.token_start,
        "token_end_s": raw.token_end,
        "ttft_alone_s": alone_ttft_s,
        "tbt_alone_s": alone_tbt_s,
        "e2e_alone_s": a_e2e,
    }


def _block_times(raw: RawResult):
    b = raw.blocks
    return b[:, 0].astype(int), b[:, 1], b[:, 2], b


def _window(raw: RawResult, trace: RequestTrace) -> tuple[float, float]:
    start = float(trace.arrival_s[0])
    return start, max(float(raw.end_s), start + 1e-9)


def machine_table(raw: RawResult, trace: RequestTrace, plan: SimPlan, power_per_block_w: np.ndarray | None = None
                  ) -> pd.DataFrame:
    """Per machine: busy time, prompt time, time-average decode batch and tokens, KV use.

    Fractions are of the window from the first arrival to the last completion.
    """
    import pandas as pd
    return pd.DataFrame(machine_columns(raw, trace, plan, power_per_block_w))


def machine_columns(raw: RawResult, trace: RequestTrace, plan: SimPlan, power_per_block_w: np.ndarray | None = None
                    ) -> dict[str, np.ndarray]:
    """`machine_table`'s columns, as NumPy arrays and lists (no pandas)."""
    t0, t1 = _window(raw, trace)
    span = t1 - t0
    idx, start, end, b = _block_times(raw)
    dur = end - start
    k = b[:, 3]
    n_m = len(raw.machines)
    has_prompt = b[:, 5] > 0
    busy = np.bincount(idx, weights=dur, minlength=n_m)
    prompt_busy = np.bincount(idx, weights=dur * has_prompt, minlength=n_m)
    decode_area = np.bincount(idx, weights=dur * b[:, 7], minlength=n_m)
    token_area = np.bincount(idx, weights=dur * (b[:, 4] + b[:, 7]), minlength=n_m)
    iters = np.bincount(idx, weights=k, minlength=n_m)
    rows = {
        "machine": [m.name for m in raw.machines],
        "pool": [m.pool for m in raw.machines],
        "busy_frac": busy / span,
        "prompt_busy_frac": prompt_busy / span,
        "mean_decode_batch": decode_area / span,
        "mean_active_tokens_busy": np.divide(token_area, busy, out=np.zeros(n_m), where=busy > 0),
        "iterations": iters,
        "prompts_run": [m.prompts_run for m in raw.machines],
        "decodes_run": [m.decodes_run for m in raw.machines],
        "kv_occupancy": raw.kv_area / span / raw.kv_capacity,
    }
    if power_per_block_w is not None:
        rows["energy_j"] = _machine_energy_j(raw, plan, power_per_block_w, span)
    return rows


def batch_histogram(raw: RawResult, trace: RequestTrace, pool: str | None = None, *,
                    include_idle: bool = True) -> pd.DataFrame:
    """Time-weighted distribution of active tokens per iteration (Splitwise Fig. 17).

    Active tokens = prompt tokens + decoding requests of the running iteration.

    Args:
        raw: the run.
        trace: its trace (for the window).
        pool: "prompt" or "token" machines (by the pool they start in), or None for all.
        include_idle: count idle time as 0 active tokens.

    Returns:
        DataFrame with columns ``active_tokens``, ``time_s`` (machine-seconds at that
        count), ``frac`` and ``cdf`` (fraction of time with <= that many tokens).
    """
    t0, t1 = _window(raw, trace)
    idx, start, end, b = _block_times(raw)
    pools = np.asarray([m.pool for m in raw.machines])
    keep = np.ones(idx.size, dtype=bool) if pool is None else pools[idx] == pool
    n_m = len(raw.machines) if pool is None else int(np.sum(pools == pool))
    tokens = (b[keep, 4] + b[keep, 7]).astype(np.int64)
    dur = (end - start)[keep]
    if tokens.size:
        values, inv = np.unique(tokens, return_inverse=True)
        time_s = np.bincount(inv, weights=dur)
    else:
        values, time_s = np.zeros(0, dtype=np.int64), np.zeros(0)
    if include_idle:
        idle = max(n_m * (t1 - t0) - float(dur.sum()), 0.0)
        if values.size and values[0] == 0:
            time_s[0] += idle
        else:
            values = np.concatenate([[0], values])
            time_s = np.concatenate([[idle], time_s])
    total = time_s.sum()
    frac = time_s / total if total > 0 else time_s
    import pandas as pd
    return pd.DataFrame({"active_tokens": values, "time_s": time_s, "frac": frac, "cdf": np.cumsum(frac)})


def block_power_w(raw: RawResult, tables) -> np.ndarray:
    """Per-GPU power of each executed block, read from its machine type's power grid
    (`plan.SimTables.prompt_power` / `token_power`, `timing.power_grid`)."""
    idx, start, end, b = _block_times(raw)
    out = np.zeros(idx.size)
    if idx.size == 0:
        return out
    pools = np.asarray([m.pool for m in raw.machines])
    # decode blocks at their mean context
    C = b[:, 8] + b[:, 7] * np.maximum(b[:, 3] - 1, 0) * 0.5 * (b[:, 5] == 0)
    for pool, grid in (("prompt", tables.prompt_power), ("token", tables.token_power)):
        sel = pools[idx] == pool
        if np.any(sel):
            out[sel] = grid.many(b[sel, 4], b[sel, 5], b[sel, 6], b[sel, 7], C[sel])
    return out


def _machine_energy_j(raw: RawResult, plan: SimPlan, power_w: np.ndarray, span: float) -> np.ndarray:
    idx, start, end, _ = _block_times(raw)
    dur = end - start
    out = np.zeros(len(raw.machines))
    for i, m in enumerate(raw.machines):
        pool = plan.prompt if m.pool == "prompt" else plan.token
        sel = idx == i
        busy = float(dur[sel].sum())
        active = float(np.sum(power_w[sel] * dur[sel]))
        out[i] = pool.gpus * (active + pool.idle_w * max(span - busy, 0.0)) + pool.host_power_w * span
    return out


def metrics_dict(requests, raw: RawResult, trace: RequestTrace, plan: SimPlan, slo, machines) -> dict:
    """The `evaluate --json` object, measured on the run (see the module docstring).

    `requests` and `machines` are `request_columns` and `machine_columns` (or their
    DataFrames, `request_table` and `machine_table`)."""
    def col(table, name):
        return np.asarray(table[name])

    n_requests = col(requests, "ttft_s").size
    done = ~np.isnan(col(requests, "ttft_s")) & ~np.isnan(col(requests, "e2e_s"))
    n_done = int(done.sum())
    trip = {}
    for name in ("ttft", "tbt", "e2e"):
        x = col(requests, f"{name}_s")[done]
        trip[name] = percentiles(x)
        trip["sd_" + name] = percentiles(x / col(requests, f"{name}_alone_s")[done])
    slowdowns = np.stack([trip["sd_ttft"], trip["sd_tbt"], trip["sd_e2e"]])
    with np.errstate(divide="ignore", invalid="ignore"):
        margins = np.log(np.asarray(slo, dtype=np.float64) / slowdowns)
    meets = bool(np.all(margins > 0)) and n_done == n_requests

    def as_dict(a):
        return {k: float(v) for k, v in zip(_PCT, a)}

    t0, t1 = _window(raw, trace)
    span = t1 - t0
    # throughput: first tokens per second over the last 3/4 of the arrival window: the rate
    # the cluster sustains (the offered rate while it keeps up; when prompts back up, for
    # want of prompt capacity or of KV memory to admit them, what it manages). First tokens
    # follow arrivals within a TTFT; last tokens trail them by an E2E of up to minutes,
    # which would bias a completion count over a 2-minute window.
    a0, a1 = float(trace.arrival_s[0]), float(trace.arrival_s[-1])
    lo = a0 + 0.25 * (a1 - a0)
    firsts = col(requests, "prompt_end_s")
    n_in = int(np.sum((firsts >= lo) & (firsts <= a1)))
    throughput = n_in / (a1 - lo) if a1 > lo and n_in > 0 else n_done / span

    pools = col(machines, "pool")
    is_p, is_t = pools == "prompt", pools == "token"
    n_p, n_t = int(is_p.sum()), int(is_t.sum())

    def pool_mean(col, sel):
        return float(np.mean(np.asarray(machines[col])[sel])) if sel.any() else 0.0

    # the arrival window, for the overload flags
    idx, start, end, b = _block_times(raw)
    s_ = np.clip(start, a0, a1)
    e_ = np.clip(end, a0, a1)
    in_win = (e_ - s_) * (b[:, 5] > 0)
    win = max(a1 - a0, 1e-9)
    pool_of = pools[idx] if idx.size else np.zeros(0, dtype=pools.dtype)
    rho_p_win = float(in_win[pool_of == "prompt"].sum()) / (max(n_p, 1) * win)
    rho_t_win = float(in_win[pool_of == "token"].sum()) / (max(n_t, 1) * win) if n_t else 0.0

    decode_pool = is_t if n_t else is_p
    pressure = pool_mean("kv_occupancy", decode_pool)
    pm = col(requests, "prompt_machine")
    tm = col(requests, "token_machine")
    name_pool = dict(zip(col(machines, "machine"), pools))
    if not plan.token_pool:  # one pool: nothing drafted or moved
        drafted = moved = 0.0
    else:
        drafted = float(np.mean([name_pool.get(x) == "token" for x in pm]))
        has_decode = trace.output_tokens > 1
        moved = float(np.mean([name_pool.get(x) == "prompt" for x in tm[has_decode]])) if has_decode.any() else 0.0
    mem_waits = raw.flow_retries / max(n_requests, 1)

    status = Status.OK
    if rho_p_win >= _OVERLOAD_BUSY:
        status |= Status.PROMPT_POOL_OVERLOADED
    if rho_t_win >= _OVERLOAD_BUSY:
        status |= Status.TOKEN_POOL_OVERLOADED
    if mem_waits > _MEMORY_FULL or pressure > 0.95:
        status |= Status.KV_MEMORY_FULL
    if drafted > _MIXED_ACTIVE or moved > _MIXED_ACTIVE:
        status |= Status.MIXED_POOL_ACTIVE
    words = [w for bit, w in STATUS_WORDS.items() if status & bit] or ["ok"]
    if n_done < n_requests:
        words.append(f"incomplete:{n_requests - n_done}")

    P, T = plan.prompt, plan.token
    cost = n_p * P.cost_per_hour + (n_t * T.cost_per_hour if n_t else 0.0)
    prov = n_p * P.provisioned_power_w
    if n_t:
        prov += n_t * T.provisioned_power_w
    power_kw = float(np.sum(col(machines, "energy_j"))) / span / 1e3 if "energy_j" in machines else float("nan")

    return {
        "ttft_s": as_dict(trip["ttft"]), "tbt_s": as_dict(trip["tbt"]), "e2e_s": as_dict(trip["e2e"]),
        "slowdown": {"ttft": as_dict(trip["sd_ttft"]), "tbt": as_dict(trip["sd_tbt"]), "e2e": as_dict(trip["sd_e2e"])},
        "slo_margin_log": {name: as_dict(margins[i]) for i, name in enumerate(("ttft", "tbt", "e2e"))},
        "meets_slo": meets,
        "throughput_rps": float(throughput),
        "cost_per_hour": float(cost),
        "power_kw": power_kw,
        "provisioned_power_kw": prov / 1e3,
        # the pools' busy shares in prompt iterations over the arrival window, the load the
        # fluid model's rho predicts (until 2026-12-04 the share over the whole run, to
        # the last completion: a run's drain runs no prompts, and saturated baselines read
        # 0.55-0.68 where their machines ran prompts 0.98 of the arrival window)
        "utilisation": {"prompt_pool_rho": rho_p_win,
                        "token_pool_prompt_rho": rho_t_win,
                        "prompt_pool_mean_batch": pool_mean("mean_decode_batch", is_p),
                        "token_pool_mean_batch": pool_mean("mean_decode_batch", is_t),
                        "kv_memory_pressure": pressure},
        "mixed_pool": {"prompts_drafted_frac": drafted, "decodes_moved_frac": moved},
        "status": " ".join(words),
    }
