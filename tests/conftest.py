"""Suite-wide set-up: float64, the shared-data skip marker, one compilation cache.

One JAX persistent compilation cache serves the whole test session (a fresh temporary
folder per session, so CI's cold start is what is measured here too): every pytest-xdist
worker and every subprocess a test starts (CLIs, study scripts, notebook kernels) reads
and writes it, so a program that several tests build - the same design evaluated at the
same resolution - is compiled once per session, not once per test and process. The
cache is keyed by the program text and JAX's flags, so it can never return a program for
different code. `SPLITWISE_TEST_JAX_CACHE` names a folder to reuse across sessions
instead (local iteration; CI leaves it unset).

The suite compiles far more than it runs (a gradient of the whole cluster model is ~30 s
of XLA compilation and ~0.2 s of running), so it compiles with LLVM's optimisation
level 0 (`--xla_backend_optimization_level=0`, set before JAX starts its backend and
inherited by every subprocess): measured on the 2-core machine, a gradient program
compiles in 47 s instead of 81 s (loaded machine; 35 vs 41 s idle) and runs 7% slower.
The operations are the same (no fast-math either way), but the generated exp/log/pow
code differs in the last 2-3 bits (tests/test_phases.py's pins allow 4 ulp for it);
users' runs keep XLA's default.
It also turns off XLA:CPU's newer fusion emitters (`--xla_cpu_use_fusion_emitters=false`,
the older loop emitters, same operations): one vmapped gradient of Splitwise-HH's
`evaluate` (8 x 8 classes) compiled in 10.1 s instead of 17.3 s and ran in 42 ms instead
of 35 ms (2-core machine, 2026-12-01, fresh processes, no cache); tracing (9 s) is
unchanged. The whole suite, side by side on one commit: 793 s -> 646 s wall, 1,327 ->
1,048 CPU s.
`SPLITWISE_TEST_XLA_OPT=1` turns both off.
"""

import os
import shutil
import tempfile

if os.environ.get("SPLITWISE_TEST_XLA_OPT", "") in ("", "0"):
    for _flag in ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false"):
        if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402
import pytest

jax.config.update("jax_enable_x64", True)

from splitwise_jax._paths import shared_dir  # noqa: E402

SHARED = shared_dir()
needs_shared = pytest.mark.skipif(
    SHARED is None,
    reason="../shared (measured profiles, traces, reference runs) is absent; set SPLITWISE_SHARED to run",
)


def fixture_module(name: str):
    """A module of tests/fixtures/ (e.g. "make_pinned_evaluate"), imported once per
    process: the test files that use it share its objects, and so its jitted programs'
    in-memory caches (tracing a vmapped `evaluate` again costs ~10-20 s even when the
    compiled program comes from the persistent cache)."""
    import importlib.util
    import sys
    from pathlib import Path

    key = f"_splitwise_fixture_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("fixtures") / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules[key] = mod
    return sys.modules[key]


def study_module(name: str):
    """A study script (studies/<name>.py), imported by path once per process (under its
    own name, so the test files that use it share it)."""
    import importlib.util
    import sys
    from pathlib import Path

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "studies" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


_CACHE_ENV = "SPLITWISE_TEST_JAX_CACHE"
# Programs that compile faster than this are not worth a file (eager per-operation ones).
_MIN_COMPILE_S = "0.1"


def pytest_configure(config):
    # The controller (or a plain run) picks the folder; xdist workers and subprocesses
    # inherit it through the environment.
    if not os.environ.get(_CACHE_ENV):
        os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="splitwise_jax_test_cache_")
        config._splitwise_cache_to_remove = os.environ[_CACHE_ENV]
    path = os.environ[_CACHE_ENV]
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = _MIN_COMPILE_S
    os.environ["SPLITWISE_JAX_CACHE"] = path  # the CLIs' own cache policy (_cli.enable_cache)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(_MIN_COMPILE_S))


def pytest_unconfigure(config):
    path = getattr(config, "_splitwise_cache_to_remove", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)


# Longest-first scheduling. pytest-xdist (`--dist load`) hands tests to its workers in
# collection order, so a few minute-long tests collected last (the study smoke runs are
# in test_studies.py) leave one worker running alone at the end: the suite's wall time
# was 625 s on the 2-core machine against ~1,100 s of test time. Moving the longest
# tests to the front (longest first, the classic LPT rule) lets the short ones fill the
# gaps. Only the order changes; every test still runs. Seconds are the durations
# measured on the 2-core machine (`pytest --durations=30`, 2026-12-01, second
# session, both workers busy; three added 2026-12-01 from a later run at 716 s, where
# they had started last); a renamed test just loses its place.
_LONGEST_S = {
    "tests/test_studies.py::test_study_smoke[bandwidth_sensitivity.py]": 95,
    "tests/test_optimize.py::test_power_optimum_matches_grid_with_free_token_cap": 81,
    "tests/test_optimize.py::test_pruned_grid_is_exact": 71,
    "tests/test_properties.py::test_outputs_and_gradients_are_finite_everywhere[splitwise-ha-coding]": 39,
    "tests/test_evaluate_numerics.py::test_gradient_wrt_pools_caps_bandwidth_rate_matches_finite_differences": 41,
    "tests/test_pinned_outputs.py::test_evaluate_matches_pinned_outputs": 45,  # 33-53 s alone (-n 0), 2026-12-03
    "tests/test_cluster.py::test_jit_matches_eager": 20,  # Baseline-H100 since 2026-12-03
    "tests/test_studies.py::test_notebook_executes[tour]": 35,
    "tests/test_studies.py::test_notebook_executes[bandwidth_sensitivity]": 31,
    "tests/test_evaluate_numerics.py::test_gradient_is_finite_at_the_edges": 31,
    "tests/test_properties.py::test_outputs_and_gradients_are_finite_everywhere[splitwise-aa-coding]": 28,
    "tests/test_optimize.py::test_cost_optimum_matches_exhaustive_grid": 28,
    "tests/test_cluster.py::test_gradients_finite[near-saturation]": 27,
    "tests/test_studies.py::test_study_smoke[fig20_robustness.py]": 26,
    "tests/test_optimize.py::test_baseline_cost_optimum_matches_grid": 23,
    "tests/test_cluster.py::test_trace_overload_stretch_builds_a_fluid_backlog": 22,
    "tests/test_studies.py::test_notebook_executes[kv_transfer]": 21,
    "tests/test_optimize.py::test_throughput_optimum_matches_grid_under_power_budget": 21,
    "tests/test_cluster.py::test_accuracy_vs_splitwisesim_runs": 19,
    # Tests that share a module fixture with one above keep its place (adjacent, so a
    # worker that takes both builds the fixture once).
    "tests/test_cluster.py::test_validation_batching_matches_single_runs": 19,
    "tests/test_cluster.py::test_moved_decodes_run_at_the_mixed_machines_pace": 19,
    "tests/test_studies.py::test_study_smoke[fig12_provisioning.py]": 15,
    "tests/test_studies.py::test_notebook_executes[latency_vs_load]": 15,
    "tests/test_percentiles.py::test_implicit_gradients_match_finite_differences[True]": 14,
    "tests/test_studies.py::test_study_smoke[fig14_15_kv_transfer.py]": 14,
    "tests/test_properties.py::test_outputs_and_gradients_are_finite_everywhere[splitwise-aa-conversation]": 13,
    "tests/test_properties.py::test_outputs_and_gradients_are_finite_everywhere[baseline-a100-conversation]": 12,
    "tests/test_optimize.py::test_cli_json": 12,
    "tests/test_studies.py::test_study_smoke[fig16_latency_vs_load.py]": 11,
}


# Tests that compile the same large programs run on one worker (`--dist loadgroup`), so
# that the program is compiled once and loaded from the session's cache by the rest
# instead of being compiled by both workers at once: the property tests (one gradient
# program per design kind, shared by all designs of the kind) and the optimiser's tests
# with the Figs. 18-19 smoke run, whose Splitwise-HH and Baseline-H100 sizings use the
# optimiser programs tests/test_optimize.py compiles (the smoke run goes last in its
# group, after them). Measured on the 2-core machine, same commit side by side: 646 ->
# 595 s wall, 1,048 -> 998 CPU s; the fig18_19 smoke 120 -> 41 s.
_GROUPS = {
    "tests/test_properties.py::": "property-programs",
    # The paper-claims test evaluates on the pinned test's programs (one vmapped evaluate
    # per design kind, `fixture_module("make_pinned_evaluate")`): on one worker the two
    # files trace and compile them once, whichever runs first (measured 2026-12-04, -n 2
    # on the loaded 2-core machine: pinned 107 s, the claims ~21 s beside it; alone ~85 s).
    "tests/test_pinned_outputs.py::": "pinned-evaluate-programs",
    "tests/test_paper_claims.py::": "pinned-evaluate-programs",
    "tests/test_optimize.py::": "optimiser-programs",
    "tests/test_studies.py::test_study_smoke[fig18_19_iso.py]": "optimiser-programs",
    # The other study smoke runs, in-process on one worker: they share studies/_common's
    # jitted programs (tests/test_studies.py; first match wins, so Figs. 18-19 stay above).
    "tests/test_studies.py::test_study_smoke[": "study-runs",
    # One gradient program of Splitwise-HH's evaluate (`_value_and_grad`), traced once:
    # on two workers each traced it (~10 s more; --durations 2026-12-03: 29 s and 11 s).
    "tests/test_cluster.py::test_gradient": "cluster-gradient",
    # Beside the grid's tests: it evaluates Splitwise-HH through the scalar `_evaluate` the
    # grid's point check compiles (one trace of that program per session, not per worker).
    "tests/test_cluster.py::test_layerwise_transfer_never_slower_in_tbt": "cluster-grid",
}


# Fixtures that take 8-30 s to build (a vmapped grid, the validation runs): the tests that
# use one form one group, kept adjacent in the order below, and the fixtures are
# session-scoped, so that a worker builds each at most once. Measured before (`--durations`,
# 2026-12-02): `sim_table_validation` set up twice (27 and 17 s), the cluster `grid` too
# (17 and 15 s).
_FIXTURE_GROUPS = {
    ("tests/test_cluster.py", "sim_table_validation"): "validation-runs",
    ("tests/test_cluster.py", "grid"): "cluster-grid",
    ("tests/test_evaluate_numerics.py", "float32_run"): "float32-run",
    ("tests/test_evaluate_numerics.py", "grad_case"): "grad-case",
    ("tests/test_chunked.py", "grid"): "chunked-grid",
}


def _group(nodeid: str, fixtures=()):
    module = nodeid.split("::", 1)[0]
    by_fixture = (g for (mod, fx), g in _FIXTURE_GROUPS.items() if mod == module and fx in fixtures)
    return next(by_fixture, None) or next((g for prefix, g in _GROUPS.items() if nodeid.startswith(prefix)), None)


# First among the hooks: pytest-xdist's worker reads the `xdist_group` marks in its own
# `pytest_collection_modifyitems` (it appends "@group" to each node id, which the
# controller's loadgroup scheduler reads), and a conftest hook otherwise runs after it:
# the marks added here came too late and no group was ever formed (found 2026-12-02,
# the `grid` fixture's tests ran on both workers, each building it; pytest 9.2 broke the
# suffix too, hence pyproject's pin below it).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session, config, items):
    for item in items:
        group = _group(item.nodeid, getattr(item, "fixturenames", ()))
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))

    # A stable sort: the rest keep their collection order (and their module fixtures).
    # A group is scheduled as one unit where its first test stands (its longest) and runs
    # in this order, so the fig18_19 smoke is put last: after the optimiser tests whose
    # programs it loads.
    # The tests of a group stay adjacent (at their longest test's place). Measured on the
    # 2-core machine, clean worktrees, 2026-12-02: the suite 576 s before the fixture
    # groups, 479 s with them and this order, 466 s with the fixtures session-scoped too
    # (run-to-run noise ~30 s); those gains were the order's alone, since the groups
    # never formed (the hook above, and pytest 9.2): `--durations` showed the validation
    # runs' and the grid's fixtures set up twice.
    groups = {item.nodeid: _group(item.nodeid, getattr(item, "fixturenames", ())) for item in items}
    longest: dict = {}
    for item in items:
        g = groups[item.nodeid]
        if g is not None:
            longest[g] = max(longest.get(g, 0), _LONGEST_S.get(item.nodeid, 0))
    order = {item.nodeid: i for i, item in enumerate(items)}

    def key(item):
        if item.nodeid == "tests/test_studies.py::test_study_smoke[fig18_19_iso.py]":
            return (1, 0, 0, "", 0)
        g = groups[item.nodeid]
        if g is not None:
            return (0, -longest[g], 0, g, order[item.nodeid])
        return (0, -_LONGEST_S.get(item.nodeid, 0), 1, "", order[item.nodeid])

    items.sort(key=key)
