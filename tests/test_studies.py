"""The paper-reproduction studies and the notebooks run end to end (smoke mode).

Each study script runs with SPLITWISE_SMOKE=1 into a temporary folder; it must exit 0
and write its PNGs and non-empty CSVs with the expected columns. The scripts run
in-process, through their `main(argv)`, on one pytest-xdist worker (conftest.py's
"study-runs" group; Figs. 18-19 with the optimiser's tests), so that they share
studies/_common.py's jitted programs as they already shared the compilation cache: a
program traced by one script is not traced again by the next. Measured on the 2-core
machine (2026-12-03, warm compilation cache, all seven smoke runs in a row): 142 s as
seven processes, 96 s in one. One script (`SCRIPT_RUN`) still runs as a user runs it,
`python studies/x.py` in a subprocess. The notebooks are executed with nbclient on the
default "python3" kernel (ipykernel's spec, which jupyter_client starts with this
interpreter) in smoke mode.

All runs share the session's JAX persistent compilation cache (tests/conftest.py), so a
program compiled by one script or kernel is loaded, not recompiled, by the next.
None of this needs the shared data folder (the studies use the shipped calibration and
workloads); the tour notebook uses the measured profiles only when they are present.
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import SHARED, needs_shared

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "studies"
NOTEBOOKS = ROOT / "notebooks"
LATENCY = [f"{m}_{p}_s" for m in ("ttft", "tbt", "e2e") for p in ("p50", "p90", "p99")]
PAPER_TABLE = ["claim", "paper", "ours", "ours_over_paper_minus_1"]

# script -> {csv: required columns}, pngs
EXPECTED = {
    "fig12_provisioning.py": ({"fig12_grid.csv": ["design", "n_prompt", "n_token", "min_margin", "meets_slo",
                                                  "cost_per_hour", "provisioned_power_kw"] + LATENCY,
                               "fig12_optima.csv": ["design", "cost_opt_n_prompt", "cost_opt_n_token"],
                               "fig12_paper_vs_ours.csv": PAPER_TABLE},
                              ["fig12_heatmaps.png"]),
    "fig14_15_kv_transfer.py": ({"fig14_transfer_vs_prompt.csv": ["link", "prompt_tokens", "serialized_s",
                                                                  "layerwise_s", "layerwise_frac_of_prompt"],
                                 "fig15_e2e_overhead.csv": ["design", "mode", "rate", "e2e_p50_overhead",
                                                            "e2e_p99_overhead"],
                                 "fig15_second_token.csv": ["design", "prompt_tokens",
                                                            "second_token_increase_serialized",
                                                            "second_token_increase_layerwise"],
                                 "fig14_15_paper_vs_ours.csv": PAPER_TABLE},
                                ["fig14_15_kv_transfer.png"]),
    "fig16_latency_vs_load.py": ({"fig16_latency_vs_load.csv": ["design", "workload", "rate", "meets_slo"] + LATENCY,
                                  "fig16_throughput_at_slo.csv": ["design", "workload", "throughput_at_slo",
                                                                  "vs_baseline_h100"],
                                  "fig16_paper_vs_ours.csv": PAPER_TABLE},
                                 ["fig16_coding.png", "fig16_conversation.png"]),
    "fig17_batch_sizes.py": ({"fig17_batch_vs_load.csv": ["design", "workload", "rate", "batch_prompt_pool",
                                                          "batch_token_pool", "share_le15_tokens_prompt_pool"],
                              "fig17_paper_vs_ours.csv": PAPER_TABLE},
                             ["fig17_batch_sizes.png"]),
    "fig18_19_iso.py": ({"fig18_19_designs.csv": ["problem", "design", "feasible", "n_prompt", "n_token",
                                                  "throughput_rps", "cost_per_hour", "provisioned_power_kw"],
                         "fig18_19_no_slo.csv": ["design", "capacity_rps", "rps_per_dollar_hour"],
                         "fig18_19_paper_vs_ours.csv": PAPER_TABLE},
                        ["fig18_19_iso.png"]),
    "fig20_robustness.py": ({"fig20_robustness.csv": ["experiment", "design", "model", "throughput_at_slo",
                                                      "loss_vs_reference"],
                             "fig20_paper_vs_ours.csv": PAPER_TABLE},
                            ["fig20_robustness.png"]),
    "bandwidth_sensitivity.py": ({"bandwidth_sweep.csv": ["design", "mode", "gbps_per_gpu", "throughput_at_slo",
                                                          "cost_at_target"] + LATENCY,
                                  "bandwidth_elasticities.csv": ["design", "mode", "gbps_per_gpu",
                                                                 "fd_throughput_at_slo", "ad_throughput_at_slo",
                                                                 "ad_cost_at_target", "ad_e2e_p50_s"],
                                  "bandwidth_breakeven.csv": ["design", "mode", "throughput_breakeven_gbps",
                                                              "cost_breakeven_gbps"],
                                  "optimum_sensitivity.csv": ["design", "mode", "hbm_bw_token", "flops_prompt",
                                                              "cap_prompt"],
                                  "bandwidth_paper_vs_ours.csv": PAPER_TABLE},
                                 ["bandwidth_sensitivity.png"]),
}
NOTEBOOK_NAMES = ("tour", "kv_transfer", "latency_vs_load", "bandwidth_sensitivity")


@pytest.fixture(scope="module")
def smoke_env():
    """Environment of every run: smoke mode (the session's compilation cache is inherited: conftest.py)."""
    env = dict(os.environ)
    env.update(SPLITWISE_SMOKE="1", MPLBACKEND="Agg")
    return env


#: The study run as a user runs it (`python studies/x.py`, a subprocess): the cheapest.
SCRIPT_RUN = "fig17_batch_sizes.py"


def _run_in_process(script: str, out: Path, smoke_env: dict, monkeypatch, capsys) -> tuple[int, str, str]:
    """`main(["--out", out])` of a study, imported from studies/ in smoke mode."""
    for k, v in smoke_env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.syspath_prepend(str(STUDIES))
    monkeypatch.chdir(ROOT)
    common = importlib.import_module("_common")
    if not common.SMOKE:  # imported before without SPLITWISE_SMOKE: read the mode again
        common = importlib.reload(common)
    assert common.SMOKE
    rc = importlib.import_module(script.removesuffix(".py")).main(["--out", str(out)])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_study_smoke(script, smoke_env, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    if script == SCRIPT_RUN:
        proc = subprocess.run([sys.executable, str(STUDIES / script), "--out", str(out)], env=smoke_env, cwd=ROOT,
                              capture_output=True, text=True, timeout=1800)  # a hang guard: CI has 90 min
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    else:
        rc, stdout, stderr = _run_in_process(script, out, smoke_env, monkeypatch, capsys)
    assert rc == 0, f"{script} failed:\n{stdout[-4000:]}\n{stderr[-4000:]}"
    assert "paper" in stdout  # it printed its paper-vs-ours table
    csvs, pngs = EXPECTED[script]
    for name, columns in csvs.items():
        path = out / name
        assert path.is_file(), f"{script} did not write {name}"
        df = pd.read_csv(path)
        assert len(df) > 0, f"{name} is empty"
        missing = [c for c in columns if c not in df.columns]
        assert not missing, f"{name} lacks columns {missing}"
    for name in pngs:
        path = out / name
        assert path.is_file() and path.stat().st_size > 1000, f"{script} did not write a real {name}"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", NOTEBOOK_NAMES)
def test_notebook_executes(name, smoke_env, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    path = NOTEBOOKS / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    # Stored without outputs (the repository keeps notebooks diff-able).
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")
    for k, v in smoke_env.items():  # the kernel inherits this process's environment
        monkeypatch.setenv(k, v)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=1800,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors


# What a notebook may import from the package: the package itself (`import splitwise_jax
# as sj`, its names in splitwise_jax/__init__.py) and the public subpackages whose own
# __init__ is their API. Not the layers' modules (`splitwise_jax.cluster.cluster`, ...).
PUBLIC_MODULES = {"splitwise_jax", "splitwise_jax.optimize", "splitwise_jax.calibrate"}


def _imported_modules(source: str) -> set[str]:
    """Every module a piece of Python source imports (`import a.b`, `from a.b import c`)."""
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            modules.add("." * node.level + (node.module or ""))
    return modules


def test_imported_modules_sees_every_import_form():
    src = "import os\nimport splitwise_jax.cluster.cluster as c\nif x:\n    from splitwise_jax.phases import phases\n"
    assert _imported_modules(src) == {"os", "splitwise_jax.cluster.cluster", "splitwise_jax.phases"}


@pytest.mark.parametrize("name", NOTEBOOK_NAMES)
def test_notebook_imports_only_the_public_api(name):
    """Notebooks are what a user copies: they import `splitwise_jax` (and its public
    subpackages), never its internal modules or the studies' helpers (STYLE.md)."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    source = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    ours = {m for m in _imported_modules(source) if m.split(".")[0] in ("splitwise_jax", "_common", "studies")}
    assert ours <= PUBLIC_MODULES, f"{name} imports non-public modules {sorted(ours - PUBLIC_MODULES)}"
    assert "splitwise_jax" in ours, f"{name} does not import splitwise_jax"
    assert "splitwise_jax._" not in source and "_common" not in source



# What a study may import beyond the public API: the internal module, why, and the
# studies allowed (None: any). Studies are scripts a user reads next to the notebooks, so
# they use `import splitwise_jax as sj` too, except where they reach for something a user
# would not (the checkout's data layout, the CSV layout, the paper's numbers) or need
# the model function itself.
STUDY_PUBLIC_MODULES = PUBLIC_MODULES | {"splitwise_jax.simulate", "splitwise_jax.uncertainty", "splitwise_jax.sweep"}
STUDY_INTERNAL_IMPORTS = {
    "splitwise_jax._paths": ("where the checkout's shared data lives (validation runs, Azure traces, "
                             "benchmarks): the repository's layout, not a user's", None),
    "splitwise_jax._batching": ("map_blocks pads rows to fixed chunks so each jitted study program "
                                "compiles once; a user's sweep is splitwise_jax.sweep", None),
    "splitwise_jax.cluster.metrics": ("labels of ClusterMetrics' arrays (METRICS, KEYS, SCALAR_FIELDS) and "
                                      "metrics_frame: the layout of the studies' CSVs", None),
    "splitwise_jax.specs.paper": ("the paper's published numbers the studies compare against: data, not "
                                  "model", None),
    "splitwise_jax.cli.evaluate": ("metrics_to_dict: rows shaped like the evaluate command line's JSON", None),
    "splitwise_jax.evaluate": ("the `python -m splitwise_jax.evaluate` command line, run in-process as a "
                               "user runs it", {"catalogue_pairs.py"}),
    "splitwise_jax.simulate.timing": ("the simulator's own per-iteration timing, to size loads for the "
                                      "simulator check", {"validate_simulator.py"}),
    "splitwise_jax.phases.params": ("parameter stacks by name and path (STACKS, resolve_params, "
                                    "load_params with a path)", {"serving_validation.py"}),
    "splitwise_jax.calibrate.benchmarks": ("START_PHASE: leave-one-model-out starts where fit_benchmarks "
                                           "does", {"serving_validation.py"}),
    "splitwise_jax.io.benchmarks": ("benchmark-table internals (validate_benchmarks, kept_up) the serving "
                                    "study reports on", {"serving_validation.py"}),
    "splitwise_jax.io.benchmark_rows": ("llm_for / machine_for: a benchmark row's LLM and machine, for the "
                                        "serving simulator", {"serving_validation.py"}),
    "splitwise_jax.cluster.cluster": ("the model `evaluate` itself, jax.vmap'ed on purpose into one "
                                      "vectorised program (`sj.evaluate` maps row by row on CPU); the "
                                      "request classes and resolution a decode route's pool state is "
                                      "read with (colocated_tbt.py: the model's side of a decomposition)",
                                      {"validate_cluster.py", "catalogue_pairs.py", "colocated_tbt.py"}),
}


def _package_names(package: str) -> set[str]:
    """The names a package's __init__.py binds (its API), with its lazy `_LAZY` names."""
    init = ROOT.joinpath(*package.split("."), "__init__.py")
    names = set()
    for node in ast.walk(ast.parse(init.read_text()) if init.is_file() else ast.Module(body=[], type_ignores=[])):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id in ("_LAZY", "_MODEL_NAMES") for t in node.targets):
                names |= {k.value for k in node.value.keys if k is not None}  # None: a `**` of another dict
    return names


def _study_modules(source: str) -> set[str]:
    """`_imported_modules`, with `from pkg import mod` read as `pkg.mod` when `mod` is a
    module of `pkg` and not one of its package-level names (`from splitwise_jax.specs
    import paper`, `from splitwise_jax.simulate import timing`; not
    `from splitwise_jax.simulate import trace`, which simulate's __init__ exports)."""
    modules = _imported_modules(source)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] == "splitwise_jax":
            folder = ROOT.joinpath(*node.module.split("."))
            api = _package_names(node.module) if node.module in STUDY_PUBLIC_MODULES else set()
            subs = {f"{node.module}.{a.name}" for a in node.names if a.name not in api
                    and ((folder / f"{a.name}.py").is_file() or (folder / a.name / "__init__.py").is_file())}
            if len(subs) == len(node.names):  # every name a submodule: the package itself is not used
                modules.discard(node.module)
            modules |= subs
    return modules


def _non_public_study_imports(path: Path) -> list[str]:
    """The package modules a study imports that are neither public nor allowed for it."""
    ours = {m for m in _study_modules(path.read_text()) if m.split(".")[0] == "splitwise_jax"}
    bad = []
    for m in sorted(ours - STUDY_PUBLIC_MODULES):
        files = STUDY_INTERNAL_IMPORTS.get(m, (None, set()))[1]
        if files is not None and path.name not in files:
            bad.append(m)
    return bad


def test_study_module_reader():
    src = ("from splitwise_jax.specs import paper\nfrom splitwise_jax.simulate import trace, timing\n"
           "import splitwise_jax as sj\nfrom splitwise_jax import evaluate\n")
    assert _study_modules(src) == {"splitwise_jax.specs.paper", "splitwise_jax.simulate", "splitwise_jax.simulate.timing",
                                   "splitwise_jax"}


@pytest.mark.parametrize("path", sorted(STUDIES.glob("*.py")), ids=lambda p: p.name)
def test_study_imports_only_the_public_api(path):
    """Studies import `splitwise_jax` and its public subpackages (STYLE.md: one small
    public API); every other package module is in `STUDY_INTERNAL_IMPORTS`, with why."""
    bad = _non_public_study_imports(path)
    assert not bad, f"{path.name} imports internal modules {bad}: use `sj.<name>`, or allow it with a reason"


def test_study_allow_list_is_used():
    """An allow-list entry no study needs any more is dropped, not kept as slack."""
    used = set().union(*(_study_modules(p.read_text()) for p in STUDIES.glob("*.py")))
    assert set(STUDY_INTERNAL_IMPORTS) <= used, sorted(set(STUDY_INTERNAL_IMPORTS) - used)

def _drafting_check():
    sys.path.insert(0, str(STUDIES))
    try:
        import drafting_check
    finally:
        sys.path.remove(str(STUDIES))
    return drafting_check


def test_drafting_check_helpers():
    dc = _drafting_check()
    # Erlang C: M/M/1 waits with probability rho; M/M/2 at a = 1: 1/3 (closed forms).
    assert dc.erlang_c(1, 0.7) == pytest.approx(0.7)
    assert dc.erlang_c(2, 1.0) == pytest.approx(1.0 / 3.0)
    # Overlapping prompts (one batch) count once; a gap is idle.
    s, e = pd.Series([0.0, 0.5, 3.0]), pd.Series([2.0, 1.0, 4.0])
    assert dc.busy_fraction(s, e, span=10.0, n=1) == pytest.approx(0.3)
    names = pd.Series(["h100-80gb_3", "h100-80gb_22", "a100-80gb_0"])
    assert dc.on_prompt_pool(names[:2], "splitwise-hh", 22).tolist() == [True, False]
    assert dc.on_prompt_pool(names, "splitwise-ha", 26).tolist() == [True, True, False]


@needs_shared
def test_drafting_check_reads_the_reference_as_its_readme_says():
    """The validation README: HH 22+3 on code at 60 req/s ran 46% of its decodes on
    prompt-pool machines, 13 machines decoding in all (3 token + 10 prompt-pool)."""
    dc = _drafting_check()
    row = dc.reference_row(SHARED / "validation" / "boundary_per_request" / "splitwise-hh_P22T3_code60_bloom-176b.csv.gz")
    assert (row["design"], row["n_prompt"], row["n_token"], row["workload"], row["rate"]) == \
        ("splitwise-hh", 22, 3, "code", 60.0)
    assert row["ref_moved"] == pytest.approx(0.46, abs=0.005)
    assert row["ref_machines_hosting_moved"] == 10
    assert 0.0 < row["ref_drafted"] < row["ref_drafted_big"] < 1.0
    assert 0.7 < row["ref_rho_prompt"] < 1.0
    # The reference drafts the largest prompts (measured 2026-12-02: 0.4 / 2.7 / 7.5 %).
    assert row["ref_drafted_3_4k"] < row["ref_drafted_4_6k"] < row["ref_drafted_6_9k"] < 0.2
    # Given every prompt machine busy, the least-loaded one has a queue about as often as
    # a machine does (0.42 vs 0.48: the drafting law's form).
    assert abs(row["ref_min_queued"] - row["ref_queued_share"]) < 0.1
    # 11.7 % of token-machine decodes find a draft running as their KV lands: between the
    # lag-limited (6.6 %) and PASTA (18 %) predictions on this run, whose full token pool
    # sends overflowing decodes to drafted machines (docs/cluster.md §4).
    assert 0.10 < row["ref_draft_at_kv_end"] < 0.13
    assert row["law_first_wait_lag"] < row["ref_draft_at_kv_end"] < row["law_first_wait_pasta"]
    # 48 % of its prompt-pool prompts wait for a machine, 1.6x Erlang C at its busy share
    # (0.30), with 2.8 prompt machines holding moved decodes on average (measured
    # 2026-12-02; docs/cluster.md §4, "Who waits for a prompt machine").
    assert row["ref_prompt_wait_share"] == pytest.approx(0.48, abs=0.01)
    assert row["ref_mixed_prompt_machines"] == pytest.approx(2.77, abs=0.05)


def test_first_step_wait_counts_a_draft_running_at_the_kv_end():
    """One draft on token machine T_1 runs over [1, 3] s; a decode whose KV lands at 2 s
    on T_1 finds it, one landing at 4 s does not. PASTA: 1 draft / 10 s x 2 s = 0.2;
    lag-limited: the lags are 1.5 and 2 s, so E[min(D, L)] = 1.75 s -> 0.175."""
    dc = _drafting_check()
    d = pd.DataFrame({"prompt_machine": ["T_1", "P_0", "P_0"], "prompt_start_s": [1.0, 0.0, 0.0],
                      "prompt_end_s": [3.0, 0.2, 0.2], "arrival_s": [0.5, 0.5, 2.0],
                      "kv_end_s": [np.nan, 2.0, 4.0], "token_machine": ["T_1", "T_1", "T_1"]})
    drafted = pd.Series([True, False, False])
    moved = pd.Series([False, False, False])
    out = dc.first_step_wait(d, drafted, moved, n_token=1, span=10.0)
    assert out["ref_draft_at_kv_end"] == pytest.approx(0.5)
    assert out["law_first_wait_pasta"] == pytest.approx(0.2)
    assert out["law_first_wait_lag"] == pytest.approx(0.175)


def test_mixed_machines_is_the_time_average_of_machines_holding_moved_decodes():
    """Machine P_0 holds a moved decode over [0, 5) s and P_1 over [2.5, 5) s of a 10 s
    run: on average 0.5 + 0.25 = 0.75 machines; a decode on a token machine is not moved."""
    dc = _drafting_check()
    d = pd.DataFrame({"arrival_s": [0.0, 0.0, 1.0], "token_machine": ["P_0", "P_1", "T_0"],
                      "token_start_s": [0.0, 2.5, 1.0], "token_end_s": [5.0, 5.0, 9.0]})
    moved = pd.Series([True, True, False])
    assert dc.mixed_machines(d, moved, span=10.0) == pytest.approx(0.75, abs=1e-3)
