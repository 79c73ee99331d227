"""`python -m splitwise_jax.evaluate`: predict one cluster's latency, SLOs, power and cost.

Examples:
    python -m splitwise_jax.evaluate --design splitwise-hh --prompt-machines 27 \
        --token-machines 3 --workload coding --rate 70 --json
    python -m splitwise_jax.evaluate --prompt-pool dgx-h200:20 --token-pool dgx-b200:4@0.8 \
        --model llama3.1-70b --workload conversation
    python -m splitwise_jax.evaluate --colocated-pool dgx-h100:40 --chunked-prefill 512
    python -m splitwise_jax.evaluate --design-file my_cluster.toml --specs my_specs.toml \
        --hf-config models/my-model/config.json

The output names, per pool, where its phase parameters come from: "calibrated" (the
GPU's own profiles) or "transferred-from:<gpu>" (no profiles: the nearest calibrated
GPU's fit on this GPU's spec sheet), with the error to expect (`provenance`).

The entry module `splitwise_jax.evaluate` (``python -m splitwise_jax.evaluate``) only
calls `main` here: it shares its name with the model function `splitwise_jax.evaluate`,
which importing it leaves in place (see the package's `__init__`).
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from splitwise_jax.cli import _cli, _design_args
from splitwise_jax.cli._table import format_table  # noqa: F401  (re-exported: splitwise_jax.evaluate reads it here)
from splitwise_jax._exported import cached_jit
from splitwise_jax.cluster.cluster import evaluate
from splitwise_jax.cluster.metrics import STATUS_WORDS, metrics_to_dict, status_words  # noqa: F401  (re-exported)
from splitwise_jax.cluster.designs import PHASE_MODELS, PRESETS, TRANSFER_MODES, build_cluster

#: status bit -> word (`metrics.Status`), the name this module has exported.
STATUS_BITS = STATUS_WORDS
# The command line's evaluate: exported to the cache folder on a first run, so a warm run
# loads its program instead of tracing the model again (~4 s; `_exported`). The
# parameter-uncertainty sigma points reuse it.
_EVALUATE = cached_jit(evaluate, static_argnames=("resolution",))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m splitwise_jax.evaluate", description=__doc__.splitlines()[0])
    ap.add_argument("--design", choices=sorted(PRESETS),
                    help="a named design (default splitwise-hh); or --design-file, or pool flags")
    ap.add_argument("--machines", type=_cli.positive_float, help="machines of a colocated design (baseline, chunked)")
    ap.add_argument("--prompt-machines", type=_cli.positive_float,
                    help="prompt machines (Splitwise; DGX-H100 for HA)")
    ap.add_argument("--token-machines", type=_cli.positive_float, help="token machines (Splitwise; DGX-A100 for HA)")
    _design_args.add_design_arguments(ap, counts=True)
    ap.add_argument("--workload", default="coding", help=_design_args.WORKLOAD_HELP)
    ap.add_argument("--rate", type=_cli.positive_float,
                    help="arrival rate, req/s (default: the trace's, 70 for presets)")
    _design_args.add_resample_argument(ap)
    ap.add_argument("--horizon", type=_cli.positive_float, default=120.0, help="length of the arrival window, s")
    _design_args.add_model_arguments(ap)
    ap.add_argument("--phase-model", choices=PHASE_MODELS, default="calibrated")
    ap.add_argument("--transfer", "--transfer-mode", dest="transfer", choices=TRANSFER_MODES,
                    help="KV-cache transfer mode (default: the design's, serialized for presets)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--no-uncertainty", action="store_true",
                    help="leave the 'uncertainty' object (90%% intervals, SLO probabilities; docs/uncertainty.md) out "
                         "of --json: it costs 2 x 23 extra evaluations per GPU type in the cluster")
    ap.add_argument("--no-cache", action="store_true", help="do not use the persistent compilation cache "
                                                            "(as optimize; SPLITWISE_JAX_CACHE moves it)")
    ap.add_argument("--simulate", type=_cli.positive_int, metavar="K",
                    help="also simulate the cluster request by request on K seeds (Poisson arrivals of a preset "
                         "workload or of --resample-poisson; a trace is replayed once with its own arrivals) and print the model's and the "
                         "simulation's percentiles side by side, with the seeds' spread")
    return ap


def main(argv=None) -> int:
    """Command-line entry point; bad arguments or inputs exit 2 with a message."""
    _cli.preamble()  # float64, loop emitters: before any array is built or JAX starts its backend
    ap = build_parser()
    a = ap.parse_args(argv)
    sizes = _design_args.sizes_from_args(ap, a)
    with _cli.input_errors(ap):
        llm, design = _design_args.model_and_design(a, sizes)
        wl = _design_args.workload_from_args(a, a.rate)
        params_path = _design_args.params_path_from_args(a)
        cluster = build_cluster(design, model=llm, phase_model=a.phase_model, params_path=params_path)
        pools = _design_args.pools_dict(cluster, params_path, phase_model=a.phase_model)
        traces, seeds = _simulation_traces(a, design, wl) if a.simulate else (None, None)
        if a.simulate:  # what the simulator cannot run (fractional token budgets), before anything compiles
            from splitwise_jax.simulate.policies import simulated
            simulated(cluster)
    if not a.no_cache:
        _cli.enable_cache()
    ev = _EVALUATE
    m = ev(cluster, wl, a.horizon)
    d = metrics_to_dict(m)
    d["design"] = {"name": design.name, "kind": design.kind, "model": llm.name,
                   "chunked_prefill_tokens": design.chunked_prefill_tokens, "transfer_mode": design.transfer_mode}
    d["pools"] = pools
    runs = None
    if traces is not None:
        from splitwise_jax.simulate.side_by_side import side_by_side_dict, simulate_runs
        runs = simulate_runs(cluster, traces, progress=not a.json and sys.stderr.isatty())
        d["simulation"] = side_by_side_dict(d, runs, seeds)
    if a.json:
        if not a.no_uncertainty:
            from splitwise_jax.uncertainty import uncertainty_dict
            d["uncertainty"] = uncertainty_dict(cluster, wl, m, a.horizon, evaluate_fn=ev)
        print(json.dumps(d))
    else:
        what = ", ".join(f"{p['count']:g} {p['role']} {p['machine']}" for p in pools)
        print(format_table(d, f"{design.name} ({what}{design.strategy.describe(design)}), {llm.name}, {a.workload} at "
                              f"{float(wl.rate_per_s):g} req/s, {a.phase_model} phases"))
        print("\n".join(_design_args.pool_lines(pools)))
        if runs is not None:
            from splitwise_jax.simulate.side_by_side import side_by_side_text
            print(side_by_side_text(d, runs, seeds))
    return 0


def _simulation_traces(a, design, wl):
    """`--simulate K`'s traces: K seeded Poisson traces of a preset workload, or the trace
    file replayed once; (traces, seeds or None). ValueError on what cannot be simulated."""
    from splitwise_jax.simulate import trace as trace_mod

    path = _design_args.trace_file(a.workload)
    if path is None or a.resample_poisson:  # Poisson arrivals (a preset, or a trace's sizes resampled)
        seeds = list(range(a.simulate))
        rate = float(np.asarray(wl.rate_per_s))
        return [trace_mod.poisson(wl, rate, a.horizon, s) for s in seeds], seeds
    return [_design_args.replay_trace(path, a.rate)], None  # its own arrivals, rescaled by --rate (one grammar)


if __name__ == "__main__":
    _cli.run(main)
