"""A catalogue of bad input for the five command lines (evaluate, optimize, simulate,
calibrate, predict) and the files they read (spec, trace, profile, query and parameter files).

Every case must end the program through argparse's error: exit status 2, a message on
stderr that names the problem (the fragment listed with the case), and no traceback
(`splitwise_jax.cli._cli`). Cases run in-process through each CLI's `main(argv)` (all of
them fail before anything compiles, so the whole catalogue takes seconds); two run in a
subprocess to prove the same from a real process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from splitwise_jax.calibrate import main as calibrate_main
from splitwise_jax.evaluate import main as evaluate_main
from splitwise_jax.optimize import main as optimize_main
from splitwise_jax.phases.params import FITTED_PARAMS_FILE
from splitwise_jax.predict import main as predict_main
from splitwise_jax.simulate.__main__ import main as simulate_main

ROOT = Path(__file__).resolve().parent.parent
MAINS = {"evaluate": evaluate_main, "optimize": optimize_main, "calibrate": calibrate_main,
         "predict": predict_main, "simulate": simulate_main}
SPLITWISE = ["--prompt-machines", "3", "--token-machines", "2"]
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
PROFILE_HEADER = ("model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,prompt_time,"
                  "token_time,e2e_time,tensor_parallel\n")
PROFILE_ROW = "llama2-70b,a100-80gb,512,1,128,1.0,0.73,196.2,54.8,7168.9,2\n"
QUERY_HEADER = "model,hardware,tensor_parallel,prompt_size,batch_size,token_size\n"
QUERY_ROW = "llama2-70b,a100-80gb,2,512,1,128\n"
GPU_TOML = ('[[gpu]]\nname = "test-gpu"\npeak_tflops = 100\nhbm_gib = 80\nhbm_bw_gb_per_s = 2000\n'
            'tdp_w = 400\nidle_w = 60\nmin_cap_w = 100\n')

# name -> file content (text); written once into a temporary folder.
FILES = {
    "empty.csv": "",
    "wrong_header.csv": "a,b,c\n1,2,3\n",
    "trace_non_numeric.csv": AZURE_HEADER + "2023-11-16 18:15:46.68,abc,12\n2023-11-16 18:15:47.68,10,12\n",
    "trace_negative.csv": AZURE_HEADER + "2023-11-16 18:15:46.68,-5,12\n2023-11-16 18:15:47.68,10,12\n",
    "trace_nan.csv": AZURE_HEADER + "2023-11-16 18:15:46.68,nan,12\n2023-11-16 18:15:47.68,10,12\n",
    "trace_header_only.csv": AZURE_HEADER,
    "trace_ok.csv": "arrival_s,prompt_tokens,output_tokens\n0.0,100,10\n0.5,200,20\n1.5,300,5\n",
    "profiles_non_numeric.csv": PROFILE_HEADER + PROFILE_ROW.replace("196.2", "abc"),
    "profiles_negative.csv": PROFILE_HEADER + PROFILE_ROW.replace("196.2", "-3"),
    "profiles_nan.csv": PROFILE_HEADER + PROFILE_ROW.replace(",1,128,", ",nan,128,"),
    "profiles_unknown_hardware.csv": PROFILE_HEADER + PROFILE_ROW.replace("a100-80gb", "tpu-v5"),
    "queries.csv": QUERY_HEADER + QUERY_ROW,
    "queries_non_numeric.csv": QUERY_HEADER + QUERY_ROW.replace(",1,128", ",many,128"),
    "queries_negative.csv": QUERY_HEADER + QUERY_ROW.replace(",1,128", ",-4,128"),
    "queries_nan.csv": QUERY_HEADER + QUERY_ROW.replace(",1,128", ",nan,128"),
    "queries_inf.csv": QUERY_HEADER + QUERY_ROW.replace(",1,128", ",inf,128"),
    "queries_unknown_model.csv": QUERY_HEADER + QUERY_ROW.replace("llama2-70b", "gpt-9"),
    "queries_binary.csv": "\x00\x01\x02\xff\xfe\n",
    "params_malformed.json": "{not json",
    "params_no_shared.json": json.dumps({"per_gpu": {}}),
    "params_unknown_field.json": json.dumps({"shared": {"mfu_maximum": 0.5}}),
    "params_negative.json": json.dumps({"shared": {"mfu_max": -0.5}}),
    "params_nan.json": '{"shared": {"mfu_max": NaN}}',
    "params_inf.json": '{"shared": {"t_iter_s": Infinity}}',
    "params_string.json": json.dumps({"shared": {"mfu_max": "0.5"}}),
    "params_bad_per_gpu.json": json.dumps({"shared": {}, "per_gpu": {"h100-80gb": {"bw_eff": 0}}}),
    "specs_malformed.toml": "[[gpu]\nname = ",
    "specs_unknown_section.toml": "[[tpu]]\nname = \"x\"\n",
    "specs_negative.toml": GPU_TOML.replace("tdp_w = 400", "tdp_w = -400"),
    "specs_missing_field.toml": GPU_TOML.replace("idle_w = 60\n", ""),
    "specs_wrong_type.toml": GPU_TOML.replace("hbm_gib = 80", 'hbm_gib = "eighty"'),
    "specs.yaml": "gpu: []\n",
    "a_file.txt": "not a folder\n",
}


# Design files and Hugging Face configs (issue 13: designs as data, models from files).
_POOL = '[[pool]]\nrole = "colocated"\nmachine = "dgx-h100"\ncount = 4\n'
FILES.update({
    "design_malformed.toml": "[[pool]\nrole = ",
    "design_unknown_field.toml": _POOL + "gpus = 8\n",
    "design_bad_cap.toml": _POOL.replace("count = 4", "count = 4\ncap = 1.5"),
    "design_negative_count.toml": _POOL.replace("count = 4", "count = -4"),
    "design_unknown_machine.toml": _POOL.replace("dgx-h100", "dgx-z100"),
    "design_one_prompt_pool.toml": _POOL.replace("colocated", "prompt"),
    "design_no_pools.toml": 'name = "empty"\n',
    "design.yaml": "pool: []\n",
    "hf_missing_key.json": '{"model_type": "llama", "hidden_size": 4096}',
    "hf_unknown_family.json": '{"model_type": "gpt2", "n_layer": 12}',
})


def _case(cli, argv, fragment, id_):
    return pytest.param(cli, argv, fragment, id=id_)


# (cli, argv with {name} standing for the file of that name, fragment of the message)
CASES = [
    # evaluate: numbers, flags, names
    _case("evaluate", SPLITWISE + ["--rate", "nan"], "argument --rate: must be a finite number", "eval-rate-nan"),
    _case("evaluate", SPLITWISE + ["--rate", "-5"], "argument --rate: must be a positive finite number",
          "eval-rate-negative"),
    _case("evaluate", SPLITWISE + ["--rate", "fast"], "argument --rate: must be a number", "eval-rate-non-numeric"),
    _case("evaluate", ["--prompt-machines", "inf", "--token-machines", "2"],
          "argument --prompt-machines: must be a finite number", "eval-machines-inf"),
    _case("evaluate", SPLITWISE + ["--horizon", "0"], "argument --horizon: must be a positive finite number",
          "eval-horizon-zero"),
    _case("evaluate", SPLITWISE + ["--machines", "4"], "needs --prompt-machines P and --token-machines T",
          "eval-conflicting-pool-flags"),
    _case("evaluate", ["--design", "baseline-h100"] + SPLITWISE, "is a baseline: give --machines N",
          "eval-baseline-with-pools"),
    _case("evaluate", ["--design", "splitwise-xx"] + SPLITWISE, "argument --design: invalid choice",
          "eval-unknown-design"),
    _case("evaluate", SPLITWISE + ["--model", "gpt-9"], "--model must be one of", "eval-unknown-model"),
    _case("evaluate", SPLITWISE + ["--phase-model", "exact"], "argument --phase-model: invalid choice",
          "eval-unknown-phase-model"),
    _case("evaluate", SPLITWISE + ["--params", "vllm-2027"], "is neither a stack name", "eval-unknown-stack"),
    _case("optimize", ["--params", "{missing.json}"], "is neither a stack name", "opt-missing-params-file"),
    _case("evaluate", SPLITWISE + ["--params", "{params_malformed.json}"], "cannot be read", "eval-params-malformed"),
    # evaluate: trace files
    _case("evaluate", SPLITWISE + ["--workload", "{missing.csv}"], "neither a preset nor an existing trace file",
          "trace-missing"),
    _case("evaluate", SPLITWISE + ["--workload", "{empty.csv}"], "is empty", "trace-empty"),
    _case("evaluate", SPLITWISE + ["--workload", "{wrong_header.csv}"], "no accepted format", "trace-wrong-header"),
    _case("evaluate", SPLITWISE + ["--workload", "{trace_header_only.csv}"], "has a header but no requests",
          "trace-no-rows"),
    _case("evaluate", SPLITWISE + ["--workload", "{trace_non_numeric.csv}"], "non-numeric", "trace-non-numeric"),
    _case("evaluate", SPLITWISE + ["--workload", "{trace_negative.csv}"], "must be >= 1 token", "trace-negative"),
    _case("evaluate", SPLITWISE + ["--workload", "{trace_nan.csv}"], "missing, non-numeric or infinite",
          "trace-nan"),
    # evaluate: spec files
    _case("evaluate", SPLITWISE + ["--specs", "{missing.toml}"], "--specs", "specs-missing"),
    _case("evaluate", SPLITWISE + ["--specs", "{specs_malformed.toml}"], "is malformed", "specs-malformed"),
    _case("evaluate", SPLITWISE + ["--specs", "{specs_unknown_section.toml}"], "unknown sections ['tpu']",
          "specs-unknown-section"),
    _case("evaluate", SPLITWISE + ["--specs", "{specs_negative.toml}"], "tdp_w must be a non-negative number",
          "specs-negative"),
    _case("evaluate", SPLITWISE + ["--specs", "{specs_missing_field.toml}"], "missing fields ['idle_w']",
          "specs-missing-field"),
    _case("evaluate", SPLITWISE + ["--specs", "{specs_wrong_type.toml}"], "hbm_gib must be a non-negative number",
          "specs-wrong-type"),
    _case("evaluate", SPLITWISE + ["--specs", "{specs.yaml}"], "must end in .toml or .json", "specs-extension"),
    _case("evaluate", SPLITWISE + ["--specs", "{empty.csv}"], "the file is empty", "specs-empty"),
    # optimize: flags, numbers, outputs
    _case("optimize", ["--slo", "1,2,3"], "--slo must be 9 comma-separated numbers", "opt-slo-short"),
    _case("optimize", ["--slo", "2,3,6,1.25,1.5,nan,1.25,1.5,5"], "each a finite slowdown limit > 0", "opt-slo-nan"),
    _case("optimize", ["--slo", "2,3,6,1.25,1.5,-5,1.25,1.5,5"], "each a finite slowdown limit > 0",
          "opt-slo-negative"),
    _case("optimize", ["--objective", "cost", "--power-budget", "100"], "apply to --objective throughput",
          "opt-budget-with-cost"),
    _case("optimize", ["--objective", "throughput", "--rate", "10"], "--rate is the answer of --objective throughput",
          "opt-rate-with-throughput"),
    _case("optimize", ["--no-prune"], "--no-prune applies to --verify only", "opt-no-prune-alone"),
    _case("optimize", ["--designs", "splitwise-aa"], "--designs lists the designs of --compare-designs",
          "opt-designs-alone"),
    _case("optimize", ["--compare-designs", "--verify"], "does not combine with --compare-designs",
          "opt-verify-compare"),
    _case("optimize", ["--compare-designs", "--designs", "splitwise-xx"], "--designs must be one of",
          "opt-unknown-design-list"),
    _case("optimize", ["--max-machines", "0"], "argument --max-machines: must be an integer >= 1",
          "opt-max-machines-zero"),
    _case("optimize", ["--bins", "-1"], "argument --bins: must be an integer >= 0", "opt-bins-negative"),
    _case("optimize", ["--cap-step", "2"], "--cap-step must be a fraction of TDP in (0, 1]", "opt-cap-step"),
    _case("optimize", ["--objective", "throughput", "--power-budget", "1"], "cannot buy one machine per pool",
          "opt-budget-too-small"),
    _case("optimize", ["--design", "baseline-h100", "--free-caps", "token"], "free_caps 'token' needs a Splitwise",
          "opt-free-token-cap-baseline"),
    _case("optimize", ["--plot", "{no_such_folder/plane.png}"], "does not exist", "opt-plot-missing-folder"),
    _case("optimize", ["--plot", "{a_file.txt/plane.png}"], "is not a folder", "opt-plot-under-a-file"),
    _case("optimize", ["--plot", "{.}"], "is a folder; give a file name", "opt-plot-is-folder"),
    _case("optimize", ["--workload", "{trace_nan.csv}"], "missing, non-numeric or infinite", "opt-trace-nan"),
    # calibrate: profile files and outputs
    _case("calibrate", ["--profiles", "{missing.csv}"], "no such file", "cal-profiles-missing"),
    _case("calibrate", ["--profiles", "{empty.csv}"], "the file is empty", "cal-profiles-empty"),
    _case("calibrate", ["--profiles", "{wrong_header.csv}"], "lacks required column(s)", "cal-profiles-header"),
    _case("calibrate", ["--profiles", "{profiles_non_numeric.csv}"], "must be numeric", "cal-profiles-non-numeric"),
    _case("calibrate", ["--profiles", "{profiles_negative.csv}"], "must be a positive time", "cal-profiles-negative"),
    _case("calibrate", ["--profiles", "{profiles_nan.csv}"], "missing (NaN/empty) values", "cal-profiles-nan"),
    _case("calibrate", ["--profiles", "{profiles_unknown_hardware.csv}"], "unknown hardware ['tpu-v5']",
          "cal-profiles-unknown-hardware"),
    _case("calibrate", ["--splits", "z"], "unknown split 'z'", "cal-unknown-split"),
    _case("calibrate", ["--seeds", "0"], "argument --seeds: must be an integer >= 1", "cal-seeds-zero"),
    _case("calibrate", ["--steps", "many"], "argument --steps: must be an integer >= 1", "cal-steps-non-numeric"),
    _case("calibrate", ["--out", "{a_file.txt/params.json}"], "is not a folder", "cal-out-unwritable"),
    _case("calibrate", ["--report", "{a_file.txt}"], "exists and is not a folder", "cal-report-is-a-file"),
    # predict: query files, parameter files, outputs
    _case("predict", ["--queries", "{missing.csv}", "--out", "{o.csv}"], "no such file", "pred-queries-missing"),
    _case("predict", ["--queries", "{empty.csv}", "--out", "{o.csv}"], "the file is empty", "pred-queries-empty"),
    _case("predict", ["--queries", "{wrong_header.csv}", "--out", "{o.csv}"], "lacks column(s)",
          "pred-queries-header"),
    _case("predict", ["--queries", "{queries_non_numeric.csv}", "--out", "{o.csv}"],
          "'batch_size' must hold positive integers", "pred-queries-non-numeric"),
    _case("predict", ["--queries", "{queries_negative.csv}", "--out", "{o.csv}"],
          "'batch_size' must hold positive integers", "pred-queries-negative"),
    _case("predict", ["--queries", "{queries_nan.csv}", "--out", "{o.csv}"],
          "'batch_size' must hold positive integers", "pred-queries-nan"),
    _case("predict", ["--queries", "{queries_inf.csv}", "--out", "{o.csv}"],
          "'batch_size' must hold positive integers", "pred-queries-inf"),
    _case("predict", ["--queries", "{queries_unknown_model.csv}", "--out", "{o.csv}"], "unknown model 'gpt-9'",
          "pred-queries-unknown-model"),
    _case("predict", ["--queries", "{queries_binary.csv}", "--out", "{o.csv}"], "--queries",
          "pred-queries-binary"),
    _case("predict", ["--queries", "{queries.csv}"], "the following arguments are required: --out",
          "pred-out-missing-flag"),
    _case("predict", ["--queries", "{queries.csv}", "--out", "{no_such_folder/o.csv}"], "does not exist",
          "pred-out-missing-folder"),
    _case("predict", ["--queries", "{queries.csv}", "--out", "{.}"], "is a folder; give a file name",
          "pred-out-is-folder"),
    _case("predict", ["--queries", "{queries.csv}", "--out", "{o.csv}", "--params", "{missing.json}"],
          "--params", "params-missing"),
    _case("predict", ["--queries", "{queries.csv}", "--out", "{o.csv}", "--params", "{params_malformed.json}"],
          "cannot be read", "params-malformed"),
    _case("predict", ["--queries", "{queries.csv}", "--out", "{o.csv}", "--params", "{params_no_shared.json}"],
          "with a 'shared' object", "params-no-shared"),
    _case("predict", ["--queries", "{queries.csv}", "--out", "{o.csv}", "--params", "{params_unknown_field.json}"],
          "unknown PhaseParams fields ['mfu_maximum']", "params-unknown-field"),
    _case("predict", ["--queries", "{queries.csv}", "--out", "{o.csv}", "--params", "{params_negative.json}"],
          "finite positive numbers", "params-negative"),
    _case("predict", ["--queries", "{queries.csv}", "--out", "{o.csv}", "--params", "{params_nan.json}"],
          "finite positive numbers", "params-nan"),
    _case("predict", ["--queries", "{queries.csv}", "--out", "{o.csv}", "--params", "{params_inf.json}"],
          "finite positive numbers", "params-inf"),
    _case("predict", ["--queries", "{queries.csv}", "--out", "{o.csv}", "--params", "{params_string.json}"],
          "finite positive numbers", "params-string"),
    _case("predict", ["--queries", "{queries.csv}", "--out", "{o.csv}", "--params", "{params_bad_per_gpu.json}"],
          "'per_gpu' 'h100-80gb'", "params-per-gpu-zero"),
    _case("predict", ["--queries", "{queries.csv}", "--out", "{o.csv}", "--params", "{empty.csv}"],
          "the file is empty", "params-empty"),
]

# Designs as data, pool flags, models from files (issue 13).
COLO = ["--colocated-pool", "dgx-h100:4"]
CASES += [
    _case("evaluate", ["--design-file", "{missing.toml}"], "--design-file", "design-missing"),
    _case("evaluate", ["--design-file", "{design_malformed.toml}"], "is malformed", "design-malformed"),
    _case("evaluate", ["--design-file", "{design_unknown_field.toml}"], "unknown fields ['gpus']",
          "design-unknown-field"),
    _case("evaluate", ["--design-file", "{design_bad_cap.toml}"], "cap must be a finite number > 0 and <= 1",
          "design-bad-cap"),
    _case("evaluate", ["--design-file", "{design_negative_count.toml}"], "count must be a finite number > 0",
          "design-negative-count"),
    _case("evaluate", ["--design-file", "{design_unknown_machine.toml}"], "machine must be one of",
          "design-unknown-machine"),
    _case("evaluate", ["--design-file", "{design_one_prompt_pool.toml}"], "one prompt and one token pool",
          "design-half-split"),
    _case("evaluate", ["--design-file", "{design_no_pools.toml}"], "needs [[pool]] entries", "design-no-pools"),
    _case("evaluate", ["--design-file", "{design.yaml}"], "must end in .toml or .json", "design-extension"),
    _case("evaluate", ["--design-file", "{empty.csv}"], "the file is empty", "design-empty"),
    _case("evaluate", ["--colocated-pool", "dgx-h100:4@1.5"], "--colocated-pool 'dgx-h100:4@1.5': expected",
          "pool-flag-bad-cap"),
    _case("evaluate", ["--colocated-pool", "dgx-h100:-4"], "COUNT > 0", "pool-flag-negative-count"),
    _case("evaluate", ["--colocated-pool", "dgx-h100:4/x"], "TP an integer >= 1", "pool-flag-bad-tp"),
    _case("evaluate", ["--colocated-pool", "dgx-h100:4/3"], "tp must divide the 8 GPUs", "pool-flag-tp-not-divisor"),
    _case("evaluate", ["--colocated-pool", "dgx-h100"], "has no count", "pool-flag-no-count"),
    _case("evaluate", ["--colocated-pool", "dgx-h100,dgx-b200:4"], "lists 2 machines", "pool-flag-list-evaluate"),
    _case("evaluate", ["--colocated-pool", "tpu-v5:4"], "machine must be one of", "pool-flag-unknown-machine"),
    _case("evaluate", ["--prompt-pool", "dgx-h100:4"], "give --prompt-pool and --token-pool", "pool-flag-half-split"),
    _case("evaluate", ["--design", "baseline-h100"] + COLO, "give one of --design NAME, --design-file FILE or pool",
          "pool-flag-with-design"),
    _case("evaluate", COLO + ["--machines", "4"], "size a named --design", "pool-flag-with-machines"),
    _case("evaluate", SPLITWISE + ["--chunked-prefill", "512"], "--chunked-prefill applies to a colocated design",
          "chunked-on-splitwise"),
    _case("evaluate", COLO + ["--chunked-prefill", "0"], "argument --chunked-prefill: must be a positive",
          "chunked-zero"),
    _case("evaluate", COLO + ["--model", "llama3.1-405b"], "does not fit on dgx-h100", "model-does-not-fit"),
    _case("evaluate", COLO + ["--weight-dtype", "fp4"], "--weight-dtype must be one of", "weight-dtype-unknown"),
    _case("evaluate", COLO + ["--hf-config", "{missing.json}"], "--hf-config: config.json", "hf-config-missing"),
    _case("evaluate", COLO + ["--hf-config", "{hf_missing_key.json}"], "num_hidden_layers", "hf-config-missing-key"),
    _case("evaluate", COLO + ["--hf-config", "{hf_unknown_family.json}"], "gpt2", "hf-config-unknown-family"),
    _case("optimize", COLO + ["--compare-designs"], "not combine with --design-file, pool flags",
          "opt-compare-with-pools"),
    _case("optimize", ["--colocated-pool", "dgx-h100", "--chunked-prefill", "512,x"],
          "--chunked-prefill must be one or more comma-separated token budgets", "opt-chunked-list-bad"),
    _case("optimize", ["--prompt-pool", "dgx-h100", "--token-pool", "dgx-h100", "--chunked-prefill", "512"],
          "applies to a colocated design", "opt-chunked-on-splitwise"),
    _case("optimize", ["--colocated-pool", "dgx-h100,dgx-x"], "machine must be one of", "opt-pool-list-unknown"),
    _case("optimize", ["--design-file", "{design_bad_cap.toml}"], "cap must be a finite number", "opt-design-bad-cap"),
]


# simulate: what the simulator cannot run, and the one grammar's workload rules (issue 38).
CASES += [
    _case("simulate", ["--colocated-pool", "dgx-h100:2.5"], "the simulator runs whole machines", "sim-pool-fraction"),
    _case("simulate", ["--design", "baseline-h100", "--machines", "2.5"], "must be a whole number of machines",
          "sim-machines-fraction"),
    _case("simulate", COLO + ["--chunked-prefill", "256.5"], "--chunked-prefill 256.5: the simulator splits prompts",
          "sim-chunked-fraction"),
    _case("simulate", SPLITWISE + ["--chunked-prefill", "512"], "--chunked-prefill applies to a colocated design",
          "sim-chunked-on-splitwise"),
    _case("simulate", ["--colocated-pool", "dgx-h100,dgx-b200:4"], "lists 2 machines", "sim-pool-list"),
    _case("simulate", COLO + ["--resample-poisson"], "--resample-poisson resamples a trace CSV", "sim-resample-preset"),
    _case("evaluate", COLO + ["--resample-poisson"], "--resample-poisson resamples a trace CSV",
          "eval-resample-preset"),
    _case("optimize", ["--workload", "conversation", "--resample-poisson"], "--resample-poisson resamples a trace CSV",
          "opt-resample-preset"),
    _case("simulate", COLO + ["--workload", "{trace_ok.csv}", "--horizon", "10"],
          "--horizon: a trace given as --workload is replayed", "sim-horizon-with-replay"),
    _case("simulate", COLO + ["--trace", "{trace_ok.csv}", "--workload", "coding"], "--trace is the deprecated name",
          "sim-trace-and-workload"),
    _case("simulate", COLO + ["--workload", "{missing.csv}"], "neither a preset nor an existing trace file",
          "sim-trace-missing"),
    _case("simulate", COLO + ["--workload", "{trace_negative.csv}"], "must be >= 1 token", "sim-trace-negative"),
    _case("simulate", COLO + ["--hf-config", "{hf_missing_key.json}"], "num_hidden_layers",
          "sim-hf-config-missing-key"),
    _case("simulate", ["--design-file", "{design_bad_cap.toml}"], "cap must be a finite number", "sim-design-bad-cap"),
]


# The kinds of bad input the catalogue covers (the issue asks for at least 25).
KINDS = {
    "missing file", "empty file", "wrong header", "header without rows", "non-numeric", "negative", "NaN",
    "infinite", "zero where positive", "unknown name", "unknown design", "unknown choice", "unknown section",
    "unknown field", "missing field", "wrong type", "wrong extension", "binary garbage", "malformed JSON/TOML",
    "conflicting flags", "flag without its partner", "missing required flag", "too few values",
    "budget too small", "structural mismatch (cap of a missing pool)", "output folder missing",
    "output under a file", "output is a folder", "report path is a file",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad_inputs")
    for name, text in FILES.items():
        (d / name).write_text(text, encoding="latin-1")
    return d


def _argv(argv, folder: Path) -> list[str]:
    out = []
    for a in argv:
        if a.startswith("{") and a.endswith("}"):
            a = str(folder / a[1:-1])
        out.append(a)
    return out


def test_the_catalogue_is_large_enough():
    assert len(KINDS) >= 25 and len(CASES) >= 60


@pytest.mark.parametrize("cli, argv, fragment", CASES)
def test_bad_input_exits_2_with_a_message(cli, argv, fragment, files, capsys, monkeypatch):
    monkeypatch.chdir(files)  # relative outputs of a case never land in the checkout
    args = _argv(argv, files)
    if cli == "optimize":
        args += ["--quiet", "--no-cache"]
    if cli == "calibrate" and "--out" not in args:
        args += ["--out", str(files / "params_out.json")]  # never the shipped fit
    before = FITTED_PARAMS_FILE.stat().st_mtime_ns
    with pytest.raises(SystemExit) as e:
        MAINS[cli](args)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert fragment in err, err
    assert "Traceback" not in err
    assert f"python -m splitwise_jax.{cli}: error:" in err  # argparse's one exit style
    assert FITTED_PARAMS_FILE.stat().st_mtime_ns == before


@pytest.mark.parametrize("cli, argv, fragment", [
    ("evaluate", SPLITWISE + ["--workload", "{trace_negative.csv}"], "must be >= 1 token"),
    ("predict", ["--queries", "{queries.csv}", "--out", "{o.csv}", "--params", "{params_nan.json}"],
     "finite positive numbers"),
])
def test_bad_input_from_a_real_process_has_no_traceback(cli, argv, fragment, files):
    proc = subprocess.run([sys.executable, "-m", f"splitwise_jax.{cli}", *_argv(argv, files)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (files / "o.csv").exists()


def test_queries_file_is_valid_so_params_cases_test_the_params(files):
    """The params cases reuse one good queries file: it must pass validation by itself."""
    from splitwise_jax.predict import validate_queries

    assert len(validate_queries(pd.read_csv(files / "queries.csv"))) == 1


def test_process_seconds_counts_from_the_process_start():
    """The CLIs' "s from process start" (`_cli.process_seconds`) includes the
    interpreter's start and its imports: a child that sleeps 0.5 s before importing the
    package reports at least that, and not more than its own wall time."""
    import subprocess
    import sys
    import time

    code = ("import time; time.sleep(0.5)\nfrom splitwise_jax.cli import _cli\nprint(_cli.process_seconds())")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    wall = time.perf_counter() - t0
    assert 0.5 <= float(out) <= wall + 0.02  # /proc's clock ticks are 0.01 s


def test_a_command_line_exits_with_its_output_whole_and_its_handlers_run():
    """`_cli.run` (every `python -m` entry point) ends the process with `os._exit`
    after `main`: a large output still arrives whole, the atexit handlers run, the
    status is `main`'s; a reader that closes the pipe early gets status 1 and no
    traceback on stderr."""
    code = ("import atexit, sys\nfrom splitwise_jax.cli import _cli\n"
            "atexit.register(lambda: print('handler ran', file=sys.stderr))\n"
            "_cli.run(lambda: print('x' * 200_000) or 3)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3
    assert proc.stdout == "x" * 200_000 + "\n"
    assert proc.stderr == "handler ran\n"

    code = "from splitwise_jax.cli import _cli\n_cli.run(lambda: [print(i) for i in range(200_000)] and 0)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"0\n"
    proc.stdout.close()  # the reader goes away, as `| head -1` would
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert b"Traceback" not in err, err.decode()
