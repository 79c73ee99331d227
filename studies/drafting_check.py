"""Where the reference's mixed pool works: drafting and overflow, request by request.

Reads the reference simulator's per-request records of the Splitwise boundary runs
(`../shared/validation/boundary_per_request/`) and sets beside each run what the cluster
model predicted for it (a `studies/validate_cluster.py` output, `--runs`). Per run:

* drafted prompts (a prompt that ran on a token-pool machine): share of all prompts,
  share of the >6,000-token ones, their median size, and the share of token-machine
  time they took;
* decodes on prompt-pool machines (the token pool was full) and how many machines
  hosted them;
* the wait from the end of a request's KV transfer to its first decode step, P90/P99,
  for decodes on token machines, and TBT P50/P90/P99 by where the decode ran;
* the model's drafted and moved shares (`mixed_prompt_frac`, `mixed_decode_frac`) and
  two predictions of the share of the largest prompts drafted, both from the
  reference's own prompt-pool busy share rho (merged prompt intervals per machine) and
  pool size c: the model's law P(W > E[S]) ~ C exp(-c (1 - rho))
  and C E[min(Q, c)] / c = C rho (1 - rho^c) / (c (1 - rho)) (M/M/c: the least-loaded
  machine is a random busy one; docs/cluster.md §4).

Writes ``drafting_check.csv`` into ``--out`` and prints it as a table. Pure pandas,
seconds. Needs the shared data folder (`SPLITWISE_SHARED`).

Usage:
    python studies/drafting_check.py --runs studies/out/validation_runs.csv --out studies/out/drafting_check
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from splitwise_jax._paths import shared_dir

BIG_PROMPT = 6000
_NAME = re.compile(r"^(?P<design>splitwise-[a-z]+)_P(?P<p>\d+)T(?P<t>\d+)_(?P<wl>.+)_bloom-176b\.csv\.gz$")


def erlang_c(c: int, a: float) -> float:
    """Erlang C: probability an arrival waits in M/M/c with offered load a (< c)."""
    if a >= c:
        return 1.0
    term, total = 1.0, 1.0
    for k in range(1, c):
        term *= a / k
        total += term
    last = term * a / (c - a)  # (a^c / c!) c / (c - a)
    return last / (total + last)


def on_prompt_pool(machines: pd.Series, design: str, n_prompt: int) -> pd.Series:
    """Whether each machine name belongs to the prompt pool (the validation README's
    naming: HA and HHcap name the pools by hardware, HH and AA by index)."""
    if design in ("splitwise-ha", "splitwise-hhcap"):
        return machines.str.startswith("h100-80gb_")
    return machines.str.rsplit("_", n=1).str[-1].astype(int) < n_prompt


def busy_fraction(start: pd.Series, end: pd.Series, span: float, n: int) -> float:
    """Time share the n machines spent running prompts (each machine's intervals merged:
    prompts batched together overlap)."""
    if n == 0 or len(start) == 0:
        return 0.0
    iv = sorted(zip(start.to_numpy(), end.to_numpy()))
    total, lo, hi = 0.0, iv[0][0], iv[0][1]
    for a, b in iv[1:]:
        if a > hi:
            total, lo, hi = total + hi - lo, a, b
        else:
            hi = max(hi, b)
    return (total + hi - lo) / span / n


def reference_row(path: Path) -> dict:
    m = _NAME.match(path.name)
    design, n_p, n_t, wl = m["design"], int(m["p"]), int(m["t"]), m["wl"]
    d = pd.read_csv(path)
    drafted = ~on_prompt_pool(d["prompt_machine"], design, n_p)
    moved = on_prompt_pool(d["token_machine"], design, n_p)
    big = d["prompt_tokens"] > BIG_PROMPT
    span = float(d["prompt_end_s"].max() - d["arrival_s"].min())  # the prompts' window (not the drain)
    draft_time = float((d["prompt_end_s"] - d["prompt_start_s"])[drafted].sum())
    tok_wait = (d["token_start_s"] - d["kv_end_s"])[~moved]
    on_p = ~drafted
    rho = sum(busy_fraction(g["prompt_start_s"], g["prompt_end_s"], span, 1)
              for _, g in d[on_p].groupby("prompt_machine")) / n_p
    q = lambda s, x: float(s.quantile(x)) if len(s) else np.nan  # noqa: E731
    rate = re.match(r"^(code|conv)(\d+)$", wl)
    return {
        "design": design, "n_prompt": n_p, "n_token": n_t,
        "workload": rate[1] if rate else wl, "rate": float(rate[2]) if rate else np.nan,
        "ref_rho_prompt": rho, "ref_drafted": float(drafted.mean()), "ref_drafted_big": float(drafted[big].mean()),
        "ref_drafted_median_tokens": float(d["prompt_tokens"][drafted].median()) if drafted.any() else np.nan,
        "ref_draft_time_per_token_machine": draft_time / span / n_t,
        "ref_moved": float(moved.mean()), "ref_machines_hosting_moved": int(d["token_machine"][moved].nunique()),
        "ref_token_wait_p90_s": q(tok_wait, 0.9), "ref_token_wait_p99_s": q(tok_wait, 0.99),
        **{f"ref_tbt_{'token' if k else 'prompt'}_p{int(x * 100)}_s": q(d["tbt_s"][moved != k], x)
           for k in (True, False) for x in (0.5, 0.9, 0.99)},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="studies/out/validation_runs.csv",
                    help="studies/validate_cluster.py output with the model's predictions")
    ap.add_argument("--mode", default="splitwise-sim-table", choices=("splitwise-sim-table", "calibrated"))
    ap.add_argument("--out", default="studies/out/drafting_check")
    args = ap.parse_args(argv)
    shared = shared_dir()
    if shared is None:
        raise SystemExit("drafting_check: the shared data folder is absent (set SPLITWISE_SHARED)")
    folder = shared / "validation" / "boundary_per_request"
    ref = pd.DataFrame([reference_row(p) for p in sorted(folder.glob("splitwise-*.csv.gz")) if _NAME.match(p.name)])
    runs = Path(args.runs)
    if not runs.is_file():
        raise SystemExit(f"drafting_check: --runs {runs} not found (run studies/validate_cluster.py first)")
    ours = pd.read_csv(runs)
    ours = ours[(ours["mode"] == args.mode) & (ours["source"] == "boundary_runs")]
    keep = ["design", "n_prompt", "n_token", "workload", "rate", "rho_prompt", "mixed_prompt_frac",
            "mixed_decode_frac"]
    ours = ours[keep].astype({"n_prompt": int, "n_token": int}).assign(rate=lambda f: f["rate"].fillna(0.0))
    table = ref.assign(rate=ref["rate"].fillna(0.0)).merge(
        ours, on=["design", "n_prompt", "n_token", "workload", "rate"], how="left")
    table["rate"] = table["rate"].replace(0.0, np.nan)  # a replay has its trace's own rate
    rows = []
    for _, r in table.iterrows():
        c, rho = int(r["n_prompt"]), float(r["ref_rho_prompt"])
        cw = erlang_c(c, rho * c) if rho < 1 else 1.0
        rows.append({"erlang_c": cw, "law_p_w_gt_es": cw * math.exp(-c * (1 - rho)),
                     "law_queue_share": cw * min(1.0, rho * (1 - rho**c) / (c * (1 - rho))) if rho < 1 else 1.0})
    table = pd.concat([table, pd.DataFrame(rows, index=table.index)], axis=1)
    table = table.rename(columns={"mixed_prompt_frac": "ours_drafted", "mixed_decode_frac": "ours_moved"})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "drafting_check.csv", index=False)
    show = ["design", "n_prompt", "n_token", "workload", "rate", "ref_rho_prompt", "rho_prompt", "ref_drafted", "ours_drafted",
            "ref_drafted_big", "law_p_w_gt_es", "law_queue_share", "ref_draft_time_per_token_machine",
            "ref_moved", "ours_moved", "ref_token_wait_p99_s", "ref_tbt_token_p50_s", "ref_tbt_token_p99_s"]
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(table[show].round(4).to_string(index=False))
    print(f"wrote {out / 'drafting_check.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
