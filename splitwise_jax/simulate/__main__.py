"""`python -m splitwise_jax.simulate`: simulate one cluster request by request.

The design, model and workload arguments of `python -m splitwise_jax.evaluate` (one
grammar, `splitwise_jax.cli._design_args`), plus the seed and the outputs:

    python -m splitwise_jax.simulate --design splitwise-hh --prompt-machines 27 \
        --token-machines 3 --workload coding --rate 70 --seed 0 --json
    python -m splitwise_jax.simulate --design baseline-h100 --machines 40 \
        --phase-model splitwise-sim-table --workload rr_code_70_2min.csv --requests-out requests.csv
    python -m splitwise_jax.simulate --prompt-pool dgx-h100:20 --token-pool dgx-a100:6 --workload conversation
    python -m splitwise_jax.simulate --design chunked-h100 --machines 40 --workload coding --rate 70

Arrivals, as in evaluate: ``--workload coding|conversation`` gives Poisson arrivals at
``--rate`` (70) over ``--horizon`` seconds (120), seeded by ``--seed``, sizes drawn from
the preset. ``--workload CSV`` (SplitwiseSim's format, the Azure trace's, or
``arrival_s,prompt_tokens,output_tokens``) replays the trace with its own arrival times;
``--rate`` compresses or stretches them to that mean rate (evaluate's reading of a
trace). ``--resample-poisson`` instead draws Poisson arrivals at ``--rate`` (default the
trace's mean rate) over ``--horizon``, each size column sampled on its own as
SplitwiseSim's generator does. ``--trace CSV`` is the deprecated name of ``--workload
CSV``.

Designs: any of evaluate's (a preset, ``--design-file``, pool flags, ``--chunked-prefill``
on a colocated design), with whole machine counts, one machine type per pool.

``--json`` prints the object `evaluate --json` prints, with the same keys, measured on
the simulated requests. Bad arguments or inputs exit with status 2 and a message.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from splitwise_jax.cli import _cli

# Long runs show a progress bar on stderr (tqdm) from this many requests on.
PROGRESS_FROM_REQUESTS = 20_000

_TRACE_DEPRECATED = ("--trace CSV is deprecated: it is --workload CSV (a trace given as --workload is replayed with "
                     "its own arrival times, as in evaluate)")
_warned: set[str] = set()  # each deprecation is said once per process


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        print(f"warning: {message}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    from splitwise_jax.cli import _design_args
    from splitwise_jax.cluster.designs import PHASE_MODELS, PRESETS, TRANSFER_MODES

    ap = argparse.ArgumentParser(prog="python -m splitwise_jax.simulate", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--design", choices=sorted(PRESETS),
                    help="a named design (default splitwise-hh); or --design-file, or pool flags")
    ap.add_argument("--machines", type=_cli.whole_machines, help="machines of a colocated design (baseline, chunked)")
    ap.add_argument("--prompt-machines", type=_cli.whole_machines, help="prompt machines (Splitwise; DGX-H100 for HA)")
    ap.add_argument("--token-machines", type=_cli.whole_machines, help="token machines (Splitwise; DGX-A100 for HA)")
    _design_args.add_design_arguments(ap, counts=True)
    ap.add_argument("--workload", default=None, help=_design_args.WORKLOAD_HELP + " (default coding)")
    ap.add_argument("--rate", type=_cli.positive_float,
                    help="arrival rate, req/s (default: 70 for presets, the trace's for a trace CSV)")
    _design_args.add_resample_argument(ap)
    ap.add_argument("--horizon", type=_cli.positive_float, default=None,
                    help="length of the arrival window of Poisson arrivals, s (120); a replayed trace runs its own")
    ap.add_argument("--trace", metavar="CSV", help="deprecated: the same as --workload CSV")
    _design_args.add_model_arguments(ap)
    ap.add_argument("--phase-model", choices=PHASE_MODELS, default="calibrated")
    ap.add_argument("--transfer", "--transfer-mode", dest="transfer", choices=TRANSFER_MODES,
                    help="KV-cache transfer mode (default: the design's, serialized for presets)")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the keys of evaluate --json)")
    ap.add_argument("--seed", type=_cli.nonnegative_int, default=0, help="seed of the sampled arrivals and sizes")
    ap.add_argument("--requests-out", metavar="CSV", help="write one row per request here")
    ap.add_argument("--machines-out", metavar="CSV", help="write per-machine utilisation here")
    ap.add_argument("--histogram-out", metavar="CSV",
                    help="write the time-weighted active-token histograms (per pool) here")
    bar = ap.add_mutually_exclusive_group()
    bar.add_argument("--progress", action="store_true", help="always show a progress bar")
    bar.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    ap.add_argument("--no-cache", action="store_true", help="do not use the persistent compilation cache")
    return ap


def _workload_name(a) -> str:
    """--workload, or the deprecated --trace (warned once), or the default coding."""
    if a.trace is not None:
        _warn_once(_TRACE_DEPRECATED)
        if a.workload is not None:
            raise ValueError(f"--trace is the deprecated name of --workload CSV; give one of them, not --trace "
                             f"{a.trace} and --workload {a.workload}")
        return a.trace
    return "coding" if a.workload is None else a.workload


def make_trace(a):
    """The request trace the arguments ask for (ValueError naming the flag on bad input)."""
    from splitwise_jax.cli import _design_args
    from splitwise_jax.cluster.workload import workload as load_workload
    from splitwise_jax.simulate import trace as trace_mod

    a.workload = _workload_name(a)
    path = _design_args.trace_file(a.workload)
    resample = _design_args.arrival_from_args(a) == "poisson"
    if path is None:  # a preset: Poisson arrivals
        rate = 70.0 if a.rate is None else a.rate
        return trace_mod.poisson(load_workload(a.workload), rate, 120.0 if a.horizon is None else a.horizon, a.seed)
    if not resample:  # the trace's own arrivals (--rate rescales them), as evaluate reads a trace
        if a.horizon is not None:
            tr = trace_mod.from_csv(path)
            raise ValueError(f"--horizon: a trace given as --workload is replayed over its own span "
                             f"({tr.arrival_s[-1] - tr.arrival_s[0]:.4g} s; --rate rescales it); drop --horizon, or "
                             "add --resample-poisson to draw Poisson arrivals over --horizon seconds")
        return trace_mod.replay(path, a.rate)
    # --resample-poisson: SplitwiseSim's generator: exponential gaps, each size column
    # sampled on its own.
    return trace_mod.resample_poisson(path, a.rate, 120.0 if a.horizon is None else a.horizon, a.seed)


def check_simulable(design):
    """The design, or ValueError naming what the simulator cannot run in it (a
    fractional machine count or chunk budget, in the flags' words). What it runs is
    `policies.simulated` of the built cluster: a chunked design as its colocated pool
    with the budget in the `SimConfig`, a design file's scheduler limits the config's.
    """
    for p in design.pools:
        if abs(p.count - round(p.count)) > 1e-9:
            raise ValueError(f"the {p.role} pool of {design.name!r} has {p.count:g} machines: the simulator runs whole "
                             "machines (give a whole COUNT in the pool flag or design file, or --machines N)")
    chunk = design.chunked_prefill_tokens
    if chunk is not None and abs(chunk - round(chunk)) > 1e-9:
        raise ValueError(f"--chunked-prefill {chunk:g}: the simulator splits prompts at whole tokens; give a whole "
                         "number of prompt tokens per iteration (or chunked_prefill_tokens in the design file)")
    return design


def main(argv=None) -> int:
    """Command-line entry point; bad arguments or inputs exit 2 with a message."""
    argv = sys.argv[1:] if argv is None else list(argv)
    from splitwise_jax.cli import simulate_warm as warm

    got = warm.run(argv, PROGRESS_FROM_REQUESTS)  # the cluster's plan and tables kept on disk: no JAX
    if got is not None:
        _emit(*got)
        return 0
    key = None
    if "--no-cache" not in argv:
        key = warm.key_of(argv)  # before the environment changes
        warm.record_reads()  # what the full run reads besides the trace, for `warm.save`
    try:
        return _full(argv, key)
    finally:
        warm.stop_recording()


def _full(argv: list[str], key: str | None) -> int:
    """The full run: the cluster built and read into its plan and tables (JAX), then
    run; kept for later runs of the same cluster (`warm.save`) under `key`."""
    from splitwise_jax.cli import simulate_warm as warm

    _cli.float64()  # before any array is built (the precision policy of every CLI)
    _cli.fast_compile()  # before JAX starts its backend (the compile policy of every CLI)
    ap = build_parser()
    a = ap.parse_args(argv)

    from splitwise_jax.cli import _design_args
    from splitwise_jax.cli._table import title_head
    from splitwise_jax.cluster.designs import build_cluster
    from splitwise_jax.cluster.workload import _PRESET_ALIASES
    from splitwise_jax.simulate import engine
    from splitwise_jax.simulate.api import run_plan
    from splitwise_jax.simulate.plan import plan_of, tables_of
    from splitwise_jax.simulate.policies import simulated

    sizes = _design_args.sizes_from_args(ap, a)
    with _cli.input_errors(ap):
        outs = {flag: (_cli.output_file(flag, path) if path is not None else None) for flag, path in
                (("--requests-out", a.requests_out), ("--machines-out", a.machines_out),
                 ("--histogram-out", a.histogram_out))}
        llm, design = _design_args.model_and_design(a, sizes)
        check_simulable(design)
        tr = make_trace(a)
        params_path = _design_args.params_path_from_args(a)
        cluster, config = simulated(build_cluster(design, model=llm, phase_model=a.phase_model,
                                                  params_path=params_path))
        pools = _design_args.pools_dict(cluster, params_path, phase_model=a.phase_model)
    if not a.no_cache:
        _cli.enable_cache()
    show = (a.progress or len(tr) >= PROGRESS_FROM_REQUESTS) and not a.no_progress
    # `simulate(cluster, tr, config)`, its two halves: the cluster read into numbers and
    # tables (JAX), then the run (`run_plan`, what a warm run does with them read back)
    t_setup = time.perf_counter()
    plan = plan_of(cluster, config)
    tables = tables_of(cluster, engine.table_extents(tr, config), int(tr.prompt_tokens.max()))
    res = run_plan(plan, tables, tr, config, progress=show, setup_s=time.perf_counter() - t_setup)
    d = dict(res.metrics)
    d["design"] = {"name": design.name, "kind": design.kind, "model": llm.name,
                   "chunked_prefill_tokens": design.chunked_prefill_tokens, "transfer_mode": design.transfer_mode}
    d["pools"] = pools
    title = (title_head(design.name, pools, design.strategy.describe(design), llm.name),
             f", {a.phase_model} phases, simulated")
    lines = _design_args.pool_lines(pools)
    _emit(res, d, outs, a.json, f"{title[0]}{len(tr)} requests ({tr.name}){title[1]}", lines)
    path = _design_args.trace_file(a.workload)
    if not a.no_cache and path is not None:  # a warm run replays or resamples trace files only
        warm.save(key, argv, a, plan=plan, tables=tables, config=config, design=d["design"], pools=pools, title=title,
                  pool_lines=lines, trace_path=path, preset_names=_PRESET_ALIASES,
                  title_parts=(design.name, design.strategy.describe(design), llm.name))
    return 0


def _emit(res, d: dict, outs: dict, as_json: bool, title: str, pool_lines: list[str]) -> None:
    """Write the output files and print the run (JSON, or the table and the pool lines)."""
    from splitwise_jax.simulate import report

    if outs["--requests-out"] is not None:
        res.requests.to_csv(outs["--requests-out"], index=False)
    if outs["--machines-out"] is not None:
        res.machines.to_csv(outs["--machines-out"], index=False)
    if outs["--histogram-out"] is not None:
        import pandas as pd
        frames = []
        for pool in ("prompt", "token"):
            if (res.machines["pool"] == pool).any():
                frames.append(report.batch_histogram(res.raw, res.trace, pool).assign(pool=pool))
        pd.concat(frames, ignore_index=True).to_csv(outs["--histogram-out"], index=False)
    if as_json:
        print(json.dumps(d))
    else:
        from splitwise_jax.cli._table import format_table
        print(format_table(d, title))
        print("\n".join(pool_lines))
        print(f"simulated in {res.wall_s:.2f} s (event loop) + {res.setup_s + res.report_s:.2f} s (timing set-up, "
              "metrics)")


if __name__ == "__main__":
    _cli.run(main)
