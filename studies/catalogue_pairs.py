"""Every catalogue machine x model pair through the command lines, and the physical
ordering of the answers across GPUs (issue 13's goals).

For each machine type and model of the catalogue:

1. ``python -m splitwise_jax.optimize --prompt-pool M --token-pool M --model L``: the
   cheapest Splitwise cluster of that machine meeting every SLO on coding at `RATE`
   req/s (a model whose weights do not fit the machine gets exit status 2 and a message;
   it is then retried with ``--weight-dtype fp8``, as the message suggests);
2. ``python -m splitwise_jax.evaluate`` on the answer (``--prompt-pool M:P --token-pool M:T``)
   and on a chunked-prefill colocated pool of the same machines (``--colocated-pool
   M:P+T --chunked-prefill 512``), each with its provenance per pool.

Then, per model, the ordering check: colocated pools of 4 machines of each type at
the same loads, all nine latency percentiles compared (B200 and H200 never slower than
H100; MI300X reported).

The command lines run in this process (their `main(argv)`, persistent compilation
cache on), so each model compiles once per design kind.

Outputs (studies/out/catalogue_pairs/): ``pairs.csv`` (one row per pair),
``ordering.csv`` (per model, machine and load: the nine percentiles and the ratio to the
H100's).

Usage:
    python studies/catalogue_pairs.py [--out DIR] [--models a,b] [--machines x,y]
    SPLITWISE_SMOKE=1 python studies/catalogue_pairs.py      # two pairs
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

import _common as C

import splitwise_jax as sj
# The model function itself, not `sj.evaluate`: `ordering` vmaps it on purpose over
# machines and rates (one vectorised program), which `sj.evaluate` would map row by row.
from splitwise_jax.cluster.cluster import evaluate
from splitwise_jax.evaluate import main as evaluate_main
from splitwise_jax.optimize import main as optimize_main

STUDY = "catalogue_pairs"
RATE = 20.0  # req/s of coding: a load every model can meet with a pool of its machines
ORDER_RATES = (2.0, 15.0, 40.0, 120.0)  # light load to overload of 4 machines
SMOKE_PAIRS = (("dgx-b200", "mixtral-8x7b"), ("mi300x-x8", "llama3.1-8b"))


def _cli(main, argv) -> tuple[int, dict | None, str]:
    """Run a CLI main in-process: (exit status, JSON output or None, stderr's last line)."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = int(e.code or 0)
    text = out.getvalue()
    data = json.loads(text) if code == 0 and text.strip().startswith("{") else None
    last = err.getvalue().strip().splitlines()
    return code, data, last[-1] if last else ""


def one_pair(machine: str, model: str) -> dict:
    row = dict(machine=machine, model=model, weight_dtype="", fits=True)
    common = ["--model", model, "--workload", "coding"]
    t0 = time.perf_counter()
    code, opt, msg = _cli(optimize_main, ["--prompt-pool", machine, "--token-pool", machine, "--rate", str(RATE),
                                          "--json", "--quiet"] + common + (["--bins", "8"] if C.SMOKE else []))
    if code == 2 and "does not fit" in msg:
        row.update(fits=False, fit_message=msg.split("error: ", 1)[-1], weight_dtype="fp8")
        common += ["--weight-dtype", "fp8"]
        code, opt, msg = _cli(optimize_main, ["--prompt-pool", machine, "--token-pool", machine, "--rate",
                                              str(RATE), "--json", "--quiet"] + common
                              + (["--bins", "8"] if C.SMOKE else []))
    row.update(optimize_exit=code, optimize_s=time.perf_counter() - t0, optimize_message=msg if code else "")
    if code != 0 or opt is None:
        return row
    row.update(feasible=bool(opt["feasible"]), n_prompt=opt.get("prompt_machines"), n_token=opt.get("token_machines"),
               cost_per_hour=opt.get("cost_per_hour"),
               provenance=";".join(f"{p['role']}:{p['provenance']['label']}" for p in opt.get("pools", [])))
    if not opt["feasible"]:
        return row
    n_p, n_t = int(opt["prompt_machines"]), int(opt["token_machines"])
    for label, pools in (("splitwise", ["--prompt-pool", f"{machine}:{n_p}", "--token-pool", f"{machine}:{n_t}"]),
                         ("chunked", ["--colocated-pool", f"{machine}:{n_p + n_t}", "--chunked-prefill", "512"])):
        t = time.perf_counter()
        code, ev, msg = _cli(evaluate_main, pools + common + ["--rate", str(RATE), "--json", "--no-uncertainty"])
        row[f"{label}_exit"] = code
        row[f"{label}_s"] = time.perf_counter() - t
        if ev is not None:
            row[f"{label}_meets_slo"] = ev["meets_slo"]
            for met in C.METRICS:
                row[f"{label}_{met}_p99_s"] = ev[f"{met}_s"]["p99"]
            row[f"{label}_expected_mape"] = ";".join(
                f"{p['role']}:{p['provenance']['expected_mape_pct']['prompt']}/"
                f"{p['provenance']['expected_mape_pct']['token']}" for p in ev["pools"])
        else:
            row[f"{label}_message"] = msg
    return row


def ordering(model: str, machines) -> pd.DataFrame:
    """Colocated (chunked, 512) pools of 4 machines of each type at the same loads."""
    llm = sj.get_llm(model)
    ok = [m for m in machines if _fits(llm, m)]
    if "dgx-h100" not in ok:
        llm = llm.replace(name=f"{model}[weight=fp8]", weight_dtype="fp8")
        ok = [m for m in machines if _fits(llm, m)]
    wl = sj.load_workload("coding")
    cs = [sj.uniform_names(sj.build_cluster(sj.Design("x", (sj.Pool("colocated", m, 4),), chunked_prefill_tokens=512.0),
                                      model=llm)) for m in ok]
    stacked = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x, float) for x in xs]), *cs)
    rates = jnp.asarray(ORDER_RATES)
    m = jax.jit(lambda c, r: jax.vmap(lambda ci: jax.vmap(lambda ri: evaluate(ci, wl.with_rate(ri)))(r))(c))(
        stacked, rates)
    rows = []
    h = ok.index("dgx-h100")
    for i, mach in enumerate(ok):
        for j, r in enumerate(ORDER_RATES):
            row = dict(model=llm.name, machine=mach, rate=r)
            worst = 0.0
            for met in C.METRICS:
                for q, pc in enumerate(C.PCTS):
                    v = float(getattr(m, f"{met}_s")[i, j, q])
                    ref = float(getattr(m, f"{met}_s")[h, j, q])
                    row[f"{met}_{pc}_s"] = v
                    worst = max(worst, v / ref)
            row["worst_ratio_to_h100"] = worst
            rows.append(row)
    return pd.DataFrame(rows)


def _fits(llm, machine: str) -> bool:
    return sj.fits(llm, sj.get_machine(machine))


def main(argv=None) -> int:
    def extra(ap):
        ap.add_argument("--models", help="comma-separated models (default: every catalogue model)")
        ap.add_argument("--machines", help="comma-separated machines (default: every catalogue machine)")

    args = C.parse_args(STUDY, __doc__, argv, extra)
    t0 = C.banner(STUDY)
    models = args.models.split(",") if args.models else sj.llm_names()
    machines = args.machines.split(",") if args.machines else sj.machine_names()
    pairs = SMOKE_PAIRS if C.SMOKE else [(m, l) for l in models for m in machines]
    rows = []
    for k, (machine, model) in enumerate(pairs):
        if k and model != pairs[k - 1][1]:
            # Each model compiles its own programs; on CPU every loaded executable holds
            # memory mappings, and a process of ~4 models' programs reaches Linux's
            # default vm.max_map_count (65,530): LLVM then fails with "Unable to
            # allocate section memory". The previous model's programs are not needed again.
            jax.clear_caches()
        r = one_pair(machine, model)
        rows.append(r)
        print(f"{machine:<10} {model:<14} {'fits' if r['fits'] else 'fp8 ':<5} optimize exit {r['optimize_exit']} "
              f"{'feasible ' + str(r.get('n_prompt')) + 'P+' + str(r.get('n_token')) + 'T' if r.get('feasible') else ''}"
              f"  evaluate exits {r.get('splitwise_exit', '-')}/{r.get('chunked_exit', '-')}  "
              f"({r['optimize_s']:.0f} s)  {r.get('optimize_message', '')}", flush=True)
    pairs_df = pd.DataFrame(rows)
    orders = []
    for l in sorted({l for _, l in pairs}):
        jax.clear_caches()  # as above: one model's programs at a time
        orders.append(ordering(l, machines))
    order = pd.concat(orders, ignore_index=True)
    faster = order[order["machine"].isin(("dgx-b200", "dgx-h200"))]
    bad = faster[faster["worst_ratio_to_h100"] > 1.0 + 1e-9]
    C.print_frame(order.groupby(["model", "machine"])["worst_ratio_to_h100"].max().reset_index(),
                  "Worst latency ratio to the H100 pool over 9 percentiles and 4 loads (B200, H200 must be <= 1)")
    paths = [C.write_csv(pairs_df, args.out / "pairs.csv"), C.write_csv(order, args.out / "ordering.csv")]
    C.done(STUDY, t0, paths)
    failed = pairs_df[(pairs_df["optimize_exit"] != 0)]
    print(f"{len(pairs_df)} pairs: {int((pairs_df['optimize_exit'] == 0).sum())} optimised, "
          f"{int(pairs_df.get('feasible', pd.Series(dtype=bool)).fillna(False).sum())} feasible, "
          f"{len(failed)} failed; {len(bad)} ordering violations")
    return 1 if len(failed) or len(bad) else 0


if __name__ == "__main__":
    sys.exit(main())
