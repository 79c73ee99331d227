"""Design files (TOML or JSON) and pool flags: a `designs.Design` from the outer edge.

A design file names its pools, and optionally its KV link and scheduler
(docs/designs.md has the full schema)::

    name = "h200-prefill-b200-decode"

    [[pool]]
    role = "prompt"              # prompt | token | colocated
    machine = "dgx-h200"         # or a list, for optimize to choose: ["dgx-h100", "dgx-h200"]
    count = 20                   # machines (optional for optimize)
    cap = 1.0                    # power cap, fraction of TDP (default 1)
    tp = 8                       # tensor parallelism (default: all GPUs of the machine)

    [[pool]]
    role = "token"
    machine = "dgx-b200"
    count = 4
    cap = 0.8

    [transfer]
    mode = "layerwise"           # serialized | layerwise
    bandwidth_gb_per_s = 50      # optional override of the KV link, GB/s

    [scheduler]
    max_batch_tokens = 2048
    max_batch_size = 512         # decodes one iteration may carry (vLLM's max_num_seqs)
    draft_pending_tokens = 8192
    memory_reserve_frac = 0.0
    chunked_prefill_tokens = 512 # colocated pool only: chunked prefill with this budget

Pool flags give the same in one token each, ``MACHINE[,MACHINE...][:COUNT][@CAP][/TP]``:
``dgx-h100:27``, ``dgx-h100:3@0.7``, ``dgx-h100,dgx-h200,dgx-b200@0.8`` (no count:
optimize chooses), ``dgx-h100:54/4`` (54 four-GPU instances).

Every problem raises ValueError naming the file (or flag), the entry and the field,
and what is accepted; the CLIs turn it into exit status 2.
"""

from __future__ import annotations

import math
from pathlib import Path

from splitwise_jax._tables import read_table_file
from splitwise_jax.cluster.cluster import Scheduling
from splitwise_jax.cluster.designs import ROLES, TRANSFER_MODES, Design, Pool

_TOP = {"name", "pool", "transfer", "scheduler"}
_POOL = {"role", "machine", "count", "cap", "tp"}
_TRANSFER = {"mode", "bandwidth_gb_per_s"}
_SCHEDULER = {"max_batch_tokens", "max_batch_size", "draft_pending_tokens", "memory_reserve_frac",
              "chunked_prefill_tokens"}


def _number(where: str, v, *, positive: bool = True, hi: float | None = None) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or \
            (positive and v == 0) or (hi is not None and v > hi):
        rule = "> 0" if positive else ">= 0"
        rng = f" and <= {hi:g}" if hi is not None else ""
        raise ValueError(f"{where} must be a finite number {rule}{rng}, got {v!r}")
    return float(v)


def _unknown(where: str, table: dict, accepted: set) -> None:
    extra = sorted(set(table) - accepted)
    if extra:
        raise ValueError(f"{where}: unknown fields {extra}; accepted: {sorted(accepted)}")


def _table(where: str, v) -> dict:
    if not isinstance(v, dict):
        raise ValueError(f"{where} must be a table/object")
    return v


def _machines(where: str, v) -> tuple[str, ...]:
    names = [v] if isinstance(v, str) else v
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"{where} must be a machine name or a non-empty list of names, got {v!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"{where} lists a machine twice: {names}")
    return tuple(names)


def _pool(where: str, raw) -> Pool:
    e = _table(where, raw)
    _unknown(where, e, _POOL)
    missing = [f for f in ("role", "machine") if f not in e]
    if missing:
        raise ValueError(f"{where}: missing fields {missing}; a pool needs role ({' | '.join(ROLES)}) and machine")
    if e["role"] not in ROLES:
        raise ValueError(f"{where}.role must be one of {list(ROLES)}, got {e['role']!r}")
    machines = _machines(f"{where}.machine", e["machine"])
    count = _number(f"{where}.count", e["count"]) if "count" in e else None
    cap = _number(f"{where}.cap", e["cap"], hi=1.0) if "cap" in e else 1.0
    tp = e.get("tp")
    if tp is not None and (isinstance(tp, bool) or not isinstance(tp, int) or tp < 1):
        raise ValueError(f"{where}.tp must be an integer >= 1, got {tp!r}")
    return Pool(e["role"], machines[0], count, cap, tp, machines if len(machines) > 1 else ())


def design_from_dict(data: dict, where: str = "design") -> Design:
    """A `Design` from a parsed design file (see the module docstring for the schema)."""
    data = _table(where, data)
    _unknown(where, data, _TOP)
    name = data.get("name", "custom")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: name must be a non-empty string, got {name!r}")
    pools_raw = data.get("pool")
    if not isinstance(pools_raw, list) or not pools_raw:
        raise ValueError(f"{where}: needs [[pool]] entries (one colocated pool, or a prompt and a token pool)")
    pools = tuple(_pool(f"{where}: pool[{i}]", p) for i, p in enumerate(pools_raw))
    tr = _table(f"{where}: transfer", data.get("transfer", {}))
    _unknown(f"{where}: transfer", tr, _TRANSFER)
    mode = tr.get("mode", "serialized")
    if mode not in TRANSFER_MODES:
        raise ValueError(f"{where}: transfer.mode must be one of {list(TRANSFER_MODES)}, got {mode!r}")
    bw = _number(f"{where}: transfer.bandwidth_gb_per_s", tr["bandwidth_gb_per_s"]) * 1e9 \
        if "bandwidth_gb_per_s" in tr else None
    sc = _table(f"{where}: scheduler", data.get("scheduler", {}))
    _unknown(f"{where}: scheduler", sc, _SCHEDULER)
    base = Scheduling()
    sched = Scheduling(
        max_batch_tokens=_number(f"{where}: scheduler.max_batch_tokens", sc.get("max_batch_tokens", base.max_batch_tokens)),
        max_batch_size=_number(f"{where}: scheduler.max_batch_size", sc.get("max_batch_size", base.max_batch_size)),
        draft_pending_tokens=_number(f"{where}: scheduler.draft_pending_tokens",
                                     sc.get("draft_pending_tokens", base.draft_pending_tokens)),
        memory_reserve_frac=_number(f"{where}: scheduler.memory_reserve_frac",
                                    sc.get("memory_reserve_frac", base.memory_reserve_frac), positive=False, hi=0.99),
        service_jitter_rel=base.service_jitter_rel)
    chunk = _number(f"{where}: scheduler.chunked_prefill_tokens", sc["chunked_prefill_tokens"]) \
        if "chunked_prefill_tokens" in sc else None
    try:
        return Design(name, pools, chunked_prefill_tokens=chunk, transfer_mode=mode, kv_bandwidth_bytes_per_s=bw,
                      scheduling=sched)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def load_design(path: str | Path) -> Design:
    """Read a design file (.toml or .json).

    Raises:
        ValueError: unreadable or malformed file, unknown fields, bad values, or a pool
            layout the cluster model does not have; the message names the file.
    """
    path = Path(path)
    data = read_table_file(path, "design file")
    return design_from_dict(data, f"design file {path}")


def parse_pool_flag(flag: str, text: str, role: str) -> Pool:
    """A `Pool` from ``MACHINE[,MACHINE...][:COUNT][@CAP][/TP]`` (module docstring).

    Args:
        flag: the option's name, for messages ("--prompt-pool").
        text: the flag's value.
        role: the pool's role.
    """
    form = "MACHINE[,MACHINE...][:COUNT][@CAP][/TP], e.g. dgx-h100:27, dgx-h100:3@0.7 or dgx-h100,dgx-b200"
    rest = text.strip()
    tp = count = None
    cap = 1.0
    try:
        if "/" in rest:
            rest, _, tp_text = rest.rpartition("/")
            tp = int(tp_text)
            if tp < 1:
                raise ValueError
        if "@" in rest:
            rest, _, cap_text = rest.rpartition("@")
            cap = float(cap_text)
            if not (0.0 < cap <= 1.0):
                raise ValueError
        if ":" in rest:
            rest, _, count_text = rest.rpartition(":")
            count = float(count_text)
            if not (math.isfinite(count) and count > 0):
                raise ValueError
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected {form}; COUNT > 0, 0 < CAP <= 1, TP an integer >= 1") from None
    machines = [m.strip() for m in rest.split(",")]
    if not all(machines):
        raise ValueError(f"{flag} {text!r}: expected {form}")
    if len(set(machines)) != len(machines):
        raise ValueError(f"{flag} {text!r}: a machine is listed twice")
    return Pool(role, machines[0], count, cap, tp, tuple(machines) if len(machines) > 1 else ())
