"""`python -m splitwise_jax.simulate`: simulate one cluster request by request.

The arguments of `python -m splitwise_jax.evaluate`, plus the trace and the outputs:

    python -m splitwise_jax.simulate --design splitwise-hh --prompt-machines 27 \
        --token-machines 3 --workload coding --rate 70 --seed 0 --json
    python -m splitwise_jax.simulate --design baseline-h100 --machines 40 \
        --phase-model splitwise-sim-table --trace rr_code_70_2min.csv --requests-out requests.csv

Arrivals: ``--trace CSV`` replays a trace with its own arrival times (SplitwiseSim's
format, the Azure trace's, or ``arrival_s,prompt_tokens,output_tokens``). Otherwise
Poisson arrivals at ``--rate`` over ``--horizon`` seconds, seeded by ``--seed``, with
sizes drawn from ``--workload``: a preset (coding, conversation: its binned size
distribution) or a trace CSV (its own prompt and output columns, each drawn on its own
as SplitwiseSim's generator does; the rate defaults to the trace's).

``--json`` prints the object `evaluate --json` prints, with the same keys, measured on
the simulated requests. Bad arguments or inputs exit with status 2 and a message.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from splitwise_jax.cli import _cli, _design_args

# Long runs show a progress bar on stderr (tqdm) from this many requests on.
PROGRESS_FROM_REQUESTS = 20_000


def _whole_machines(text: str) -> int:
    v = _cli.positive_float(text)
    if abs(v - round(v)) > 1e-9:
        raise argparse.ArgumentTypeError(f"must be a whole number of machines (the simulator runs each one), "
                                         f"got {text!r}")
    return int(round(v))


def build_parser() -> argparse.ArgumentParser:
    from splitwise_jax.cluster.designs import DESIGNS, PHASE_MODELS, TRANSFER_MODES

    ap = argparse.ArgumentParser(prog="python -m splitwise_jax.simulate", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--design", choices=sorted(DESIGNS), default="splitwise-hh")
    ap.add_argument("--machines", type=_whole_machines, help="machines of a baseline design")
    ap.add_argument("--prompt-machines", type=_whole_machines, help="prompt machines (Splitwise; DGX-H100 for HA)")
    ap.add_argument("--token-machines", type=_whole_machines, help="token machines (Splitwise; DGX-A100 for HA)")
    ap.add_argument("--workload", default=None,
                    help="coding, conversation, or a trace CSV whose sizes are sampled (default coding)")
    ap.add_argument("--rate", type=_cli.positive_float,
                    help="Poisson arrival rate, req/s (default: 70 for presets, the trace's for a CSV workload)")
    ap.add_argument("--horizon", type=_cli.positive_float, default=None, help="length of the arrival window, s (120)")
    ap.add_argument("--model", default="bloom-176b", help="LLM name from the catalogue (or a --specs file)")
    ap.add_argument("--specs", metavar="FILE", help="TOML/JSON spec file of extra GPUs, machines, LLMs")
    ap.add_argument("--phase-model", choices=PHASE_MODELS, default="calibrated")
    _design_args.add_params_argument(ap)
    ap.add_argument("--transfer", choices=TRANSFER_MODES, default="serialized", help="KV-cache transfer mode")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the keys of evaluate --json)")
    ap.add_argument("--seed", type=_cli.nonnegative_int, default=0, help="seed of the sampled arrivals and sizes")
    ap.add_argument("--trace", metavar="CSV", help="replay this trace with its own arrival times")
    ap.add_argument("--requests-out", metavar="CSV", help="write one row per request here")
    ap.add_argument("--machines-out", metavar="CSV", help="write per-machine utilisation here")
    ap.add_argument("--histogram-out", metavar="CSV",
                    help="write the time-weighted active-token histograms (per pool) here")
    ap.add_argument("--chunked-prefill", type=_cli.positive_int, metavar="TOKENS",
                    help="chunked prefill with this prompt-token budget per iteration (baseline designs)")
    bar = ap.add_mutually_exclusive_group()
    bar.add_argument("--progress", action="store_true", help="always show a progress bar")
    bar.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    ap.add_argument("--no-cache", action="store_true", help="do not use the persistent compilation cache")
    return ap


def make_trace(a, ap):
    """The request trace the arguments ask for (argparse error on bad input)."""
    import numpy as np

    from splitwise_jax.simulate import trace as trace_mod
    from splitwise_jax.cluster.workload import load_trace, workload as load_workload

    if a.trace is not None:
        if a.rate is not None or a.horizon is not None or a.workload is not None:
            ap.error("--trace replays its own arrivals: drop --workload, --rate and --horizon")
        return trace_mod.from_csv(_cli.input_file("--trace", a.trace))
    horizon = 120.0 if a.horizon is None else a.horizon
    name = "coding" if a.workload is None else a.workload
    if name.lower() in ("coding", "code", "conversation", "conv"):
        wl = load_workload(name)
        rate = 70.0 if a.rate is None else a.rate
        return trace_mod.poisson(wl, rate, horizon, a.seed)
    df = load_trace(_cli.input_file("--workload", name))
    if a.rate is None:
        gaps = np.diff(df["arrival_s"].to_numpy())
        if gaps.size < 1 or gaps.mean() <= 0:
            ap.error(f"--workload {name}: cannot read a rate from its arrival times; give --rate")
        rate = 1.0 / float(gaps.mean())
    else:
        rate = a.rate
    # SplitwiseSim's generator: exponential gaps, each size column sampled on its own.
    rng = np.random.default_rng(a.seed)
    expected = rate * horizon
    gaps = rng.exponential(1.0 / rate, size=int(expected + 10 * math.sqrt(expected) + 10))
    arrival = np.cumsum(gaps)
    arrival = arrival[arrival < horizon]
    if arrival.size == 0:
        ap.error(f"no request arrives within --horizon {horizon:g} s at --rate {rate:g}")
    p = rng.choice(np.round(df["prompt_tokens"].to_numpy()), size=arrival.size)
    o = rng.choice(np.round(df["output_tokens"].to_numpy()), size=arrival.size)
    return trace_mod.RequestTrace.from_arrays(arrival, np.maximum(p, 1), np.maximum(o, 1),
                                              name=f"{Path(name).stem}-poisson-{rate:g}rps")


def main(argv=None) -> int:
    """Command-line entry point; bad arguments or inputs exit 2 with a message."""
    _cli.float64()  # before any array is built (the precision policy of every CLI)
    _cli.fast_compile()  # before JAX starts its backend (the compile policy of every CLI)
    ap = build_parser()
    a = ap.parse_args(argv)

    from splitwise_jax.cluster.designs import DESIGNS, make_cluster
    from splitwise_jax.simulate import SimConfig, report, simulate

    baseline = DESIGNS[a.design].kind == "baseline"
    if baseline:
        if a.machines is None or a.prompt_machines is not None or a.token_machines is not None:
            ap.error(f"--design {a.design} is a baseline: give --machines N (and not --prompt/--token-machines)")
        sizes = (a.machines, 0)
    else:
        if a.prompt_machines is None or a.token_machines is None or a.machines is not None:
            ap.error(f"--design {a.design} needs --prompt-machines P and --token-machines T (not --machines)")
        sizes = (a.prompt_machines, a.token_machines)
    if a.chunked_prefill is not None and not baseline:
        ap.error("--chunked-prefill runs on colocated (baseline) designs, where each machine runs both phases")
    with _cli.input_errors(ap):
        outs = {flag: (_cli.output_file(flag, path) if path is not None else None) for flag, path in
                (("--requests-out", a.requests_out), ("--machines-out", a.machines_out),
                 ("--histogram-out", a.histogram_out))}
        if a.specs is not None:
            from splitwise_jax.specs.catalog import load_specs
            load_specs(_cli.input_file("--specs", a.specs))
        tr = make_trace(a, ap)
        cluster = make_cluster(a.design, sizes[0], sizes[1] if not baseline else 0.0, model=a.model,
                               phase_model=a.phase_model, transfer_mode=a.transfer,
                               params_path=_design_args.params_path_from_args(a))
        config = SimConfig(chunked_prefill_tokens=a.chunked_prefill)
    if not a.no_cache:
        _cli.enable_cache()
    show = (a.progress or len(tr) >= PROGRESS_FROM_REQUESTS) and not a.no_progress
    res = simulate(cluster, tr, config, progress=show)
    d = res.metrics
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
    if a.json:
        print(json.dumps(d))
    else:
        from splitwise_jax.cli.evaluate import format_table
        what = f"{sizes[0]} machines" if baseline else f"{sizes[0]} prompt + {sizes[1]} token machines"
        print(format_table(d, f"{a.design}, {what}, {a.model}, {len(tr)} requests ({tr.name}), "
                              f"{a.phase_model} phases, simulated"))
        print(f"simulated in {res.wall_s:.2f} s (event loop) + {res.setup_s + res.report_s:.2f} s (timing set-up, "
              "metrics)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
