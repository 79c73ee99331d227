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

* the share of prompt-pool prompts that wait for a machine, beside Erlang C at the
  reference's own busy share, the time-averaged number of prompt-pool machines holding
  moved decodes, and the model's TTFT P50 / P90 errors;
* the drafted share by prompt size; the prompt pool's state at arrivals given every
  machine busy (queued prompts per machine, the share with a queue, whether the
  least-loaded machine has one and its pending tokens then): the factors of the
  drafting law; and the token-pool decodes that find a draft running on their machine
  as their KV cache lands, beside the PASTA and lag-limited predictions.

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


# Prompt sizes (tokens) of the per-size drafted shares.
SIZE_BINS = ((3000, 4000), (4000, 6000), (6000, 9000))
# Every k-th arrival is a sampling instant of the prompt pool's state (PASTA).
_STATE_STRIDE = 3


def queue_state(d: pd.DataFrame, on_p: pd.Series, warmup_s: float = 10.0) -> dict:
    """The prompt pool's state at arrival instants, from the per-request records: a
    prompt is queued on its machine from arrival to its start, running from start to
    end, and a machine's pending tokens are its running and queued prompts' sizes (the
    reference counts a running prompt whole). Given every prompt-pool machine busy
    (`all_busy`, the chance an arrival finds it so): the mean number of queued prompts
    per machine (`nq_share`), the share of machines with a queue (`queued_share`), the
    chance the machine with the fewest pending tokens has one (`min_queued`) and then
    that its pending tokens exceed 1,200 and 3,200 (a 7,000- and a 5,000-token prompt
    are drafted past 8,192). A prompt-pool machine in the mixed pool that runs decodes
    only counts as idle here."""
    pm = d[on_p]
    names = sorted(pm["prompt_machine"].unique())
    idx = pm["prompt_machine"].map({m: i for i, m in enumerate(names)}).to_numpy()
    arr, start, end = (pm[c].to_numpy() for c in ("arrival_s", "prompt_start_s", "prompt_end_s"))
    tok = pm["prompt_tokens"].to_numpy(float)
    t_all = d["arrival_s"].to_numpy()
    ts = np.sort(t_all[(t_all > t_all.min() + warmup_s) & (t_all < t_all.max() - 5.0)])[::_STATE_STRIDE]
    n = len(names)
    busy_n, nq, sh, minq, spt_min = 0, [], [], [], []
    for t in ts:
        q = (arr < t) & (start > t)
        r = (start <= t) & (end > t)
        qc = np.bincount(idx[q], minlength=n)
        if not np.all((qc + np.bincount(idx[r], minlength=n)) > 0):
            continue
        busy_n += 1
        spt = np.bincount(idx[q | r], weights=tok[q | r], minlength=n)
        j = int(np.argmin(spt))
        nq.append(qc.sum() / n)
        sh.append(np.mean(qc > 0))
        minq.append(qc[j] > 0)
        spt_min.append(spt[j])
    minq, spt_min = np.asarray(minq, bool), np.asarray(spt_min)
    m = lambda x: float(np.mean(x)) if len(x) else np.nan  # noqa: E731
    return {"ref_all_busy": busy_n / max(len(ts), 1), "ref_nq_share": m(nq), "ref_queued_share": m(sh),
            "ref_min_queued": m(minq), "ref_min_pending_gt_1200": m(spt_min[minq] > 1200),
            "ref_min_pending_gt_3200": m(spt_min[minq] > 3200)}


def mixed_machines(d: pd.DataFrame, moved: pd.Series, span: float, points: int = 2000) -> float:
    """Time-averaged number of prompt-pool machines holding moved decodes (in the mixed
    pool), sampled at `points` instants over the run: a machine holds one from a moved
    request's first decode step to its last."""
    t0 = float(d["arrival_s"].min())
    ts = t0 + span * (np.arange(points) + 0.5) / points
    held = np.zeros(points)
    for _, g in d[moved].groupby("token_machine"):
        s, e = g["token_start_s"].to_numpy(), g["token_end_s"].to_numpy()
        held += ((ts[:, None] >= s[None, :]) & (ts[:, None] < e[None, :])).any(axis=1)
    return float(held.mean())


def first_step_wait(d: pd.DataFrame, drafted: pd.Series, moved: pd.Series, n_token: int, span: float) -> dict:
    """Decodes on token-pool machines whose machine runs a drafted prompt when their KV
    cache lands (`ref_draft_at_kv_end`), beside two predictions from the reference's own
    drafts: PASTA, r E[D] (r drafts per token machine per second, D a draft's run
    time), and the lag-limited r E[min(D, L)], L the request's time from arrival to its
    KV's end (its token machine was in the token pool when it arrived, so the draft
    started within L). docs/cluster.md §4."""
    tok = d[~moved & d["kv_end_s"].notna()]
    runs = {m: g[["prompt_start_s", "prompt_end_s"]].to_numpy() for m, g in d[drafted].groupby("prompt_machine")}
    hit = [bool(iv is not None and np.any((iv[:, 0] <= k) & (iv[:, 1] > k)))
           for iv, k in zip((runs.get(m) for m in tok["token_machine"]), tok["kv_end_s"])]
    dur = (d["prompt_end_s"] - d["prompt_start_s"])[drafted].to_numpy()
    lag = (tok["kv_end_s"] - tok["arrival_s"]).to_numpy()
    r = len(dur) / span / max(n_token, 1)
    lags = np.random.default_rng(0).choice(lag, min(len(lag), 2000), replace=False) if len(lag) else lag
    both = np.minimum(dur[:, None], lags[None, :]) if len(dur) and len(lags) else np.zeros(1)
    return {"ref_draft_at_kv_end": float(np.mean(hit)) if hit else np.nan,
            "law_first_wait_pasta": r * float(dur.mean()) if len(dur) else 0.0,
            "law_first_wait_lag": r * float(both.mean())}


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
    by_size = {f"ref_drafted_{lo // 1000}_{hi // 1000}k": float(drafted[(d["prompt_tokens"] > lo)
                                                                         & (d["prompt_tokens"] <= hi)].mean())
               for lo, hi in SIZE_BINS}
    return {
        "design": design, "n_prompt": n_p, "n_token": n_t,
        "workload": rate[1] if rate else wl, "rate": float(rate[2]) if rate else np.nan,
        "ref_rho_prompt": rho, "ref_drafted": float(drafted.mean()), "ref_drafted_big": float(drafted[big].mean()),
        "ref_drafted_median_tokens": float(d["prompt_tokens"][drafted].median()) if drafted.any() else np.nan,
        "ref_draft_time_per_token_machine": draft_time / span / n_t,
        "ref_moved": float(moved.mean()), "ref_machines_hosting_moved": int(d["token_machine"][moved].nunique()),
        "ref_mixed_prompt_machines": mixed_machines(d, moved, span),
        "ref_prompt_wait_share": float(((d["prompt_start_s"] - d["arrival_s"]) > 1e-3)[on_p].mean()),
        "ref_token_wait_p90_s": q(tok_wait, 0.9), "ref_token_wait_p99_s": q(tok_wait, 0.99),
        **{f"ref_tbt_{'token' if k else 'prompt'}_p{int(x * 100)}_s": q(d["tbt_s"][moved != k], x)
           for k in (True, False) for x in (0.5, 0.9, 0.99)},
        **by_size, **queue_state(d, on_p), **first_step_wait(d, drafted, moved, n_t, span),
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
            "mixed_decode_frac", "err_ttft_p50", "err_ttft_p90"]
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
    state = ["design", "n_prompt", "n_token", "workload", "rate"] + [f"ref_drafted_{lo // 1000}_{hi // 1000}k"
                                                                      for lo, hi in SIZE_BINS] + [
        "ref_all_busy", "ref_nq_share", "ref_queued_share", "ref_min_queued", "ref_min_pending_gt_1200",
        "ref_min_pending_gt_3200", "ref_draft_at_kv_end", "law_first_wait_pasta", "law_first_wait_lag"]
    waits = ["design", "n_prompt", "n_token", "workload", "rate", "ref_rho_prompt", "rho_prompt",
             "ref_prompt_wait_share", "erlang_c", "ref_mixed_prompt_machines", "err_ttft_p50", "err_ttft_p90"]
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        print(table[show].round(4).to_string(index=False))
        print("\nThe drafting law's factors and the token machines' first-step wait (docs/cluster.md §4):")
        print(table[state].round(4).to_string(index=False))
        print("\nWho waits for a prompt machine: the reference's share of prompt-pool prompts that wait, against "
              "Erlang C at its own busy share, with its mixed prompt machines and our TTFT errors "
              "(docs/cluster.md §4):")
        print(table[waits].round(3).to_string(index=False))
    print(f"wrote {out / 'drafting_check.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
