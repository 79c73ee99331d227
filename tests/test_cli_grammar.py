"""One command-line grammar (issue 38, item 4): the commands that take a cluster
(evaluate, optimize, simulate) accept the same design, model and workload flags, and
each flag means the same in all of them.

Parse-only where possible (argparse, no model built, no program compiled): the whole
file takes a few seconds. The two meanings `--workload trace.csv` used to have (evaluate
replayed the trace's arrival curve; simulate resampled its sizes as Poisson arrivals,
with `--trace` for the replay) are gone: both replay, both resample with
`--resample-poisson`, and `--trace` is a deprecated alias of `--workload CSV`.
"""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from splitwise_jax.cluster.designs import build_cluster
from splitwise_jax.simulate.policies import simulated

from splitwise_jax.cli import _design_args
from splitwise_jax.cli.evaluate import build_parser as evaluate_parser
from splitwise_jax.optimize.cli import build_parser as optimize_parser
from splitwise_jax.simulate import __main__ as sim_cli

PARSERS = {"evaluate": evaluate_parser, "optimize": optimize_parser, "simulate": sim_cli.build_parser}

#: The flags every cluster command takes, with a value each (files need not exist:
#: argparse does not open them) and the attribute they set.
SHARED = [
    (["--design", "chunked-h100"], "design", "chunked-h100"),
    (["--design-file", "cluster.toml"], "design_file", "cluster.toml"),
    (["--prompt-pool", "dgx-h100:20"], "prompt_pool", "dgx-h100:20"),
    (["--token-pool", "dgx-a100:4@0.7"], "token_pool", "dgx-a100:4@0.7"),
    (["--colocated-pool", "dgx-h100:40"], "colocated_pool", "dgx-h100:40"),
    (["--hf-config", "models/qwen"], "hf_config", "models/qwen"),
    (["--model", "llama2-70b"], "model", "llama2-70b"),
    (["--specs", "specs.toml"], "specs", "specs.toml"),
    (["--weight-dtype", "fp8"], "weight_dtype", "fp8"),
    (["--kv-dtype", "fp8"], "kv_dtype", "fp8"),
    (["--params", "vllm-2026"], "params", "vllm-2026"),
    (["--workload", "trace.csv"], "workload", "trace.csv"),
    (["--rate", "12.5"], "rate", 12.5),
    (["--resample-poisson"], "resample_poisson", True),
    (["--phase-model", "splitwise-sim-table"], "phase_model", "splitwise-sim-table"),
    (["--json"], "json", True),
    (["--no-cache"], "no_cache", True),
]
#: The transfer mode: evaluate and simulate store it as `transfer`, optimize as
#: `transfer_mode`; both spellings are accepted by all three.
TRANSFER_DEST = {"evaluate": "transfer", "optimize": "transfer_mode", "simulate": "transfer"}

#: Flags one command has and another lacks, each with the reason. Anything else one
#: command takes must be taken by the others (test below): a new flag is either shared
#: or listed here.
OWN = {
    "evaluate": {"--machines", "--prompt-machines", "--token-machines",  # evaluate, simulate: counts of a preset
                 "--horizon",  # the fluid model's window; optimize's problems are stationary
                 "--no-uncertainty",  # evaluate's output
                 "--simulate"},  # evaluate's side-by-side simulation on K seeds (simulate always simulates)
    "simulate": {"--machines", "--prompt-machines", "--token-machines", "--horizon",
                 "--seed", "--trace", "--requests-out", "--machines-out", "--histogram-out", "--progress",
                 "--no-progress"},  # the simulation's arrivals, alias and outputs
}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"}


@pytest.mark.parametrize("cli", sorted(PARSERS))
@pytest.mark.parametrize("argv, dest, value", SHARED, ids=[a[0] for a, _, _ in SHARED])
def test_every_cluster_command_takes_the_shared_flags(cli, argv, dest, value):
    a = PARSERS[cli]().parse_args(argv)
    assert getattr(a, dest) == value


@pytest.mark.parametrize("cli", sorted(PARSERS))
@pytest.mark.parametrize("flag", ["--transfer", "--transfer-mode"])
def test_transfer_mode_has_one_meaning_under_both_names(cli, flag):
    a = PARSERS[cli]().parse_args([flag, "layerwise"])
    assert getattr(a, TRANSFER_DEST[cli]) == "layerwise"


@pytest.mark.parametrize("cli", ["evaluate", "simulate"])
def test_preset_counts_are_taken_by_evaluate_and_simulate(cli):
    a = PARSERS[cli]().parse_args(["--design", "splitwise-ha", "--prompt-machines", "26", "--token-machines", "6"])
    assert (a.prompt_machines, a.token_machines) == (26, 6)
    a = PARSERS[cli]().parse_args(["--colocated-pool", "dgx-h100:4", "--chunked-prefill", "512"])
    assert a.chunked_prefill == 512


def test_evaluate_and_simulate_take_each_others_flags():
    """Each cluster command's flags, less its own (`OWN`, with reasons), are the
    shared ones: evaluate's and simulate's flags are the same set beyond `OWN`."""
    ev, sim = _options(evaluate_parser()), _options(sim_cli.build_parser())
    assert ev - OWN["evaluate"] == sim - OWN["simulate"], (sorted((ev - OWN["evaluate"]) ^ (sim - OWN["simulate"])))
    shared = {a[0] for a, _, _ in SHARED} | {"--transfer", "--transfer-mode", "--chunked-prefill"}
    assert shared <= _options(optimize_parser())
    assert ev - OWN["evaluate"] == shared


# ------------------------------------------------------------------------- one meaning of --workload CSV


@pytest.fixture(scope="module")
def bursty_trace(tmp_path_factory):
    """A trace with its own arrival pattern: 3 bursts of 40 requests, 10 s apart, each
    spread over 0.4 s (mean rate ~4 req/s over the 20.4 s span, far from Poisson)."""
    rng = np.random.default_rng(0)
    t = np.sort(np.concatenate([b * 10.0 + rng.uniform(0.0, 0.4, 40) for b in range(3)]))
    t -= t[0]
    p = rng.integers(100, 3000, t.size)
    o = rng.integers(5, 300, t.size)
    path = tmp_path_factory.mktemp("grammar") / "bursty.csv"
    rows = "".join(f"{float(a)!r},{x},{y}\n" for a, x, y in zip(t, p, o))
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    return path, t


def _sim_trace(argv):
    return sim_cli.make_trace(sim_cli.build_parser().parse_args(argv))


def _eval_workload(argv):
    return _design_args.workload_from_args(evaluate_parser().parse_args(argv),
                                           evaluate_parser().parse_args(argv).rate)


def test_a_trace_workload_is_replayed_by_evaluate_and_simulate(bursty_trace):
    path, t = bursty_trace
    tr = _sim_trace(["--workload", str(path)])
    np.testing.assert_array_equal(tr.arrival_s, t)  # simulate: the file's own arrival times
    wl = _eval_workload(["--workload", str(path)])
    assert wl.profile is not None  # evaluate: the file's own arrival curve
    assert float(wl.arrival_cv2) > 5.0  # bursts: far from Poisson's 1
    assert float(wl.rate_per_s) == pytest.approx(tr.rate_per_s, rel=1e-12)


def test_rate_rescales_a_replayed_trace_in_both(bursty_trace):
    path, t = bursty_trace
    tr = _sim_trace(["--workload", str(path), "--rate", "20"])
    assert tr.rate_per_s == pytest.approx(20.0, rel=1e-12)
    gaps = np.diff(tr.arrival_s)
    np.testing.assert_allclose(gaps / gaps.sum(), np.diff(t) / (t[-1] - t[0]), rtol=1e-9)  # same shape
    assert float(_eval_workload(["--workload", str(path), "--rate", "20"]).rate_per_s) == 20.0


def test_resample_poisson_is_the_explicit_resampling_in_both(bursty_trace):
    path, t = bursty_trace
    tr = _sim_trace(["--workload", str(path), "--resample-poisson", "--rate", "5", "--horizon", "200", "--seed", "3"])
    gaps = np.diff(tr.arrival_s)
    assert abs(gaps.var() / gaps.mean() ** 2 - 1.0) < 0.3  # Poisson (cv2 1), 1,000 arrivals: sd of cv2 ~0.06
    assert tr.rate_per_s == pytest.approx(5.0, rel=0.1)
    sizes = set(np.loadtxt(path, delimiter=",", skiprows=1)[:, 1].astype(int))
    assert set(tr.prompt_tokens) <= sizes  # sizes drawn from the trace's own
    wl = _eval_workload(["--workload", str(path), "--resample-poisson"])
    assert wl.profile is None and float(wl.arrival_cv2) == 1.0


def test_trace_is_a_deprecated_alias_warned_once(bursty_trace, capsys, monkeypatch):
    path, t = bursty_trace
    monkeypatch.setattr(sim_cli, "_warned", set())
    for _ in range(2):
        tr = _sim_trace(["--trace", str(path)])
        np.testing.assert_array_equal(tr.arrival_s, t)
    err = capsys.readouterr().err
    assert err.count("--trace CSV is deprecated") == 1


def test_simulate_runs_chunked_designs_as_its_colocated_design_with_the_budget():
    """A chunked design (by name or by flags) is simulated as SimConfig's chunked prefill."""
    for argv in (["--design", "chunked-h100", "--machines", "3"],
                 ["--colocated-pool", "dgx-h100:3", "--chunked-prefill", "512"],
                 ["--design", "baseline-h100", "--machines", "3", "--chunked-prefill", "512"]):
        a = sim_cli.build_parser().parse_args(argv)
        sizes = _design_args.preset_sizes(None, a) if _design_args.is_preset(a) else None
        design = _design_args.design_from_args(a, preset_sizes=sizes, chunked_prefill=a.chunked_prefill)
        sim_cli.check_simulable(design)
        run, config = simulated(build_cluster(design))
        assert design.kind == "chunked" and run.kind == "baseline", argv
        assert config.chunked_prefill_tokens == 512 and float(run.n_prompt) == 3


def test_simulate_replays_a_trace_on_pool_flags_end_to_end(bursty_trace, tmp_path, capsys):
    """The whole command: a custom split design from pool flags, the trace replayed
    (every request, at its own arrival time), evaluate's JSON keys plus design and pools."""
    import json

    import pandas as pd

    path, t = bursty_trace
    out = tmp_path / "req.csv"
    code = sim_cli.main(["--prompt-pool", "dgx-h100:2", "--token-pool", "dgx-a100:1", "--workload", str(path),
                         "--json", "--requests-out", str(out), "--no-progress"])
    assert code == 0
    d = json.loads(capsys.readouterr().out)
    assert d["design"]["kind"] == "splitwise" and [p["machine"] for p in d["pools"]] == ["dgx-h100", "dgx-a100"]
    q = pd.read_csv(out).sort_values("arrival_s")
    np.testing.assert_allclose(q["arrival_s"], t, rtol=0, atol=1e-12)
    assert q["e2e_s"].notna().all()


def test_evaluate_simulate_reads_a_trace_as_simulate_does(bursty_trace):
    """`evaluate --simulate K` simulates what `simulate` would: the trace replayed (at
    --rate, rescaled), or K Poisson traces with --resample-poisson."""
    from splitwise_jax.cli.evaluate import _simulation_traces

    path, t = bursty_trace
    for extra in ([], ["--rate", "20"]):
        argv = ["--workload", str(path), "--simulate", "2"] + extra
        a = evaluate_parser().parse_args(argv)
        design = _design_args.design_from_args(a, preset_sizes=(2.0, 1.0))
        (tr,), seeds = _simulation_traces(a, design, _design_args.workload_from_args(a, a.rate))
        assert seeds is None
        np.testing.assert_array_equal(tr.arrival_s, _sim_trace(["--workload", str(path)] + extra).arrival_s)
    a = evaluate_parser().parse_args(["--workload", str(path), "--resample-poisson", "--simulate", "2"])
    traces, seeds = _simulation_traces(a, _design_args.design_from_args(a, preset_sizes=(2.0, 1.0)),
                                       _design_args.workload_from_args(a, a.rate))
    assert seeds == [0, 1] and len(traces) == 2
