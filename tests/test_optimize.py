"""Tests of splitwise_jax.optimize: the gradient answer equals the exhaustive grid's,
pruning is exact, designs share compilations, bad input fails loudly, the CLI speaks JSON.

Small problems keep the file fast: an 8x8-class coding workload at low load, pools of at
most 12 machines (a 12 x 12 grid), throughput under a budget of a few machines. Every
optimiser run shares two compiled functions per cluster kind (see the sharing test).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from splitwise_jax import optimize as O
from splitwise_jax.optimize.gradient import _al_round
from splitwise_jax.optimize.integer import full_resolution_step_up
from splitwise_jax.optimize.report import _candidate_dict
from splitwise_jax.optimize.spec import assess_batch
from splitwise_jax.cluster.designs import make_cluster
from splitwise_jax.cluster.workload import coarsen, workload

RATE = 12.0        # req/s: the cheapest Splitwise-HH cluster then has ~6 machines
BINS = 8
MAX = 12           # pools searched: 1..12 (the grid has 144 cells)
CONFIG = O.SolverConfig()


@pytest.fixture(scope="module")
def wl():
    return coarsen(workload("coding", RATE), BINS, BINS)


def _check_match(cluster, wl, problem, prune=False):
    res = O.optimize(cluster, wl, problem, CONFIG)
    grid = O.grid_search(cluster, wl, problem, CONFIG, incumbent=res.best, prune=prune)
    assert grid.best is not None, "the test problem must have a feasible grid optimum"
    assert res.best is not None and res.feasible
    assert O.same_answer(res.best, grid.best, problem.objective), (res.best[:7], grid.best[:7])
    return res, grid


def test_cost_optimum_matches_exhaustive_grid(wl):
    cluster = make_cluster("splitwise-hh", 1, 1)
    res, grid = _check_match(cluster, wl, O.Problem("cost", max_machines=MAX))
    assert grid.cells_evaluated == grid.cells_in_box == MAX * MAX  # prune=False: every cell
    b = res.best
    # The answer really is feasible and really costs what it says (DGX-H100: $38.08/h).
    assert np.all(b.constraints >= 0) and bool(b.metrics.meets_slo)
    assert b.cost_per_hour == pytest.approx(38.08 * (b.prompt_machines + b.token_machines), rel=1e-12)
    # Binding: removing a machine from either pool breaks something (else it was not optimal).
    assert all(res.binding[k] for k in res.binding), res.binding


def test_verification_compares_the_grid_with_the_searched_answer(wl, capsys):
    """`--verify`'s grid checks the search on its classes: after a step-up (full
    resolution, the certificate) the answer printed differs from the grid's optimum
    while the verification still matches the search's own answer."""
    import dataclasses

    from splitwise_jax.optimize.report import _print_result, _result_dict

    cluster = make_cluster("splitwise-hh", 1, 1)
    res, grid = _check_match(cluster, wl, O.Problem("cost", max_machines=MAX))
    b = res.best
    up = b._replace(token_machines=b.token_machines + 1, objective=b.objective + 38.08, cost_per_hour=b.cost_per_hour + 38.08)
    stepped = dataclasses.replace(res, best=up)
    assert _result_dict(stepped, True, None, grid, 1.0, searched=res.best)["verification"]["matches"]
    assert not _result_dict(stepped, True, None, grid, 1.0)["verification"]["matches"]
    _print_result(stepped, cluster, "t", None, grid, 1.0, "8x8 classes", False, searched=res.best)
    assert "-> matches the search's" in capsys.readouterr().out


def test_power_optimum_matches_grid_with_free_token_cap(wl):
    """HHcap with its token cap free (on a 0.05 grid) instead of the fixed 70%."""
    cluster = make_cluster("splitwise-hhcap", 1, 1)
    problem = O.Problem("power", max_machines=MAX, free_caps="token", cap_step=0.1)
    res, grid = _check_match(cluster, wl, problem)
    cap_floor = 200.0 / 700.0  # H100 min cap / TDP (catalog)
    assert cap_floor - 1e-9 <= res.best.token_cap_frac <= 1.0
    # Power is the paper's provisioned accounting: machines x 10.2 kW x cap.
    b = res.best
    assert b.provisioned_power_kw == pytest.approx(10.2 * (b.prompt_machines * b.prompt_cap_frac
                                                           + b.token_machines * b.token_cap_frac), rel=1e-9)


def test_throughput_optimum_matches_grid_under_power_budget(wl):
    budget_kw = O.reference_budget(count=2)[0]  # two DGX-H100's provisioned power = 3.5 DGX-A100
    cluster = make_cluster("splitwise-aa", 1, 1)
    problem = O.Problem("throughput", power_budget_kw=budget_kw)
    res, grid = _check_match(cluster, wl, problem, prune=False)
    b = res.best
    assert b.provisioned_power_kw <= budget_kw * (1 + 1e-9)
    # The rate found is the edge: 1% more load breaks a constraint.
    assert res.binding["rate +1%"], res.binding
    assert b.rate_per_s > 0.5


def test_repair_from_past_the_budget_finds_the_grid_answer(wl):
    """A throughput problem's relaxation can stop past its budget (Splitwise-AA at
    iso-cost on the full workload: 58.6 + 35.6 machines against a budget of 86, every
    cell of the box around it over budget, so the repair found none). Its pools are
    scaled onto the budget before the box is built: from the far corner of the pool
    bounds (11 + 11 machines, a budget of 12; the box of +-3 around it holds no cell the
    budget allows) the repair still reaches the grid's answer."""
    from splitwise_jax.optimize.integer import repair, unit_cost
    from splitwise_jax.optimize.spec import make_spec
    cluster = make_cluster("splitwise-aa", 1, 1)
    problem = O.Problem("throughput", cost_budget_per_h=12.0 * unit_cost(cluster)[0], max_machines=MAX)
    grid = O.grid_search(cluster, wl, problem, CONFIG)
    g = grid.best
    spec, info = make_spec(cluster, wl, problem)
    assert (info.hi_p, info.hi_t) == (11, 11)  # each pool alone within the budget, with one machine of the other
    far = np.array([info.hi_p, info.hi_t, g.prompt_cap_frac, g.token_cap_frac, g.rate_per_s], float)
    best, _ = repair(cluster, spec, info, problem, CONFIG, far, progress=False)
    assert best is not None
    assert O.same_answer(best, g, "throughput"), (best[:7], g[:7])


def test_baseline_cost_optimum_matches_grid(wl):
    cluster = make_cluster("baseline-h100", 1)
    res, grid = _check_match(cluster, wl, O.Problem("cost", max_machines=3 * MAX))
    assert res.best.token_machines == 0 and grid.cells_in_box == 3 * MAX


def test_pruned_grid_is_exact(wl):
    cluster = make_cluster("splitwise-hh", 1, 1)
    problem = O.Problem("cost", max_machines=MAX)
    res = O.optimize(cluster, wl, problem, CONFIG)
    full = O.grid_search(cluster, wl, problem, CONFIG)
    pruned = O.grid_search(cluster, wl, problem, CONFIG, incumbent=res.best, prune=True)
    assert pruned.cells_evaluated < full.cells_evaluated
    assert pruned.best[:7] == full.best[:7]


def test_step_up_reaches_the_nearest_answer_that_meets_every_limit(wl):
    """`full_resolution_step_up` (what the CLI does when the coarse-class answer fails at
    full resolution), given an answer one prompt machine short (infeasible: the optimum
    is binding), returns a feasible neighbour that costs what the optimum does (HH: both
    pools the same machine price), and nothing for the throughput objective."""
    cluster = make_cluster("splitwise-hh", 1, 1)
    problem = O.Problem("cost", max_machines=MAX)
    best = O.optimize(cluster, wl, problem, CONFIG).best
    short = best._replace(prompt_machines=best.prompt_machines - 1)
    assert not O.evaluate_candidate(cluster, wl, short, problem, CONFIG).feasible
    up = full_resolution_step_up(cluster, wl, short, problem, CONFIG)
    assert up is not None and up.feasible and bool(up.metrics.meets_slo)
    assert up.cost_per_hour == pytest.approx(best.cost_per_hour, rel=1e-12)
    assert full_resolution_step_up(cluster, wl, short, O.Problem("throughput", power_budget_kw=100.0), CONFIG) is None


def test_designs_of_one_kind_share_one_compilation(wl, monkeypatch):
    """Splitwise-AA/-HH/-HA/-HHcap differ only in leaves once names are stripped."""
    problem = O.Problem("cost", max_machines=MAX)
    rounds, calls = [], []

    def counted(*args, **kwargs):
        rounds.append(1)
        return _al_round(*args, **kwargs)

    counted.prefetch = _al_round.prefetch
    monkeypatch.setattr("splitwise_jax.optimize.gradient._al_round", counted)
    O.optimize(make_cluster("splitwise-hh", 1, 1), wl, problem, CONFIG, after_start=lambda: calls.append(len(rounds)))
    # `after_start` (where the CLI starts loading its full-resolution check's program)
    # runs once, after the start-point search and before the first gradient round.
    assert calls == [0] and len(rounds) == CONFIG.rounds
    monkeypatch.undo()
    before = _al_round._cache_size(), assess_batch._cache_size()
    for d in ("splitwise-aa", "splitwise-ha"):
        O.optimize(make_cluster(d, 1, 1), wl, problem, CONFIG)
    assert (_al_round._cache_size(), assess_batch._cache_size()) == before


def test_a_non_finite_gradient_step_repairs_from_the_last_finite_iterate(wl, monkeypatch):
    """If a gradient round ever reached a NaN (in float32, before 2026-12-03, the first
    step did: `_smooth.den_floor`), the repair got NaN pool sizes and failed with "cannot
    convert float NaN to integer". Now optimize stops the rounds, warns, and repairs from
    the last finite iterate: a NaN injected into the second round's later steps leaves
    the answer of the rounds before it."""
    problem = O.Problem("cost", max_machines=MAX)
    calls = []

    def broken(*args, **kwargs):
        u, opt_state, us, gs, fs = _al_round(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            us, u = np.asarray(us).copy(), np.full(np.shape(u), np.nan)
            us[3:] = np.nan
        return u, opt_state, us, gs, fs

    broken.prefetch = _al_round.prefetch
    monkeypatch.setattr("splitwise_jax.optimize.gradient._al_round", broken)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        res = O.optimize(make_cluster("splitwise-hh", 1, 1), wl, problem, CONFIG)
    assert len(calls) == 2
    assert res.best is not None and res.feasible
    assert np.isfinite(res.continuous["prompt_machines"]) and np.isfinite(res.continuous["token_machines"])


@pytest.mark.parametrize("kwargs, word", [
    (dict(objective="speed"), "objective"),
    (dict(objective="cost", power_budget_kw=100.0), "power_budget_kw"),
    (dict(objective="throughput", rate_per_s=10.0), "rate_per_s"),
    (dict(objective="cost", rate_per_s=-1.0), "rate_per_s"),
    (dict(slo=((2, 3), (1, 1))), "slo"),
    (dict(free_caps="all"), "free_caps"),
    (dict(max_machines=0), "max_machines"),
])
def test_bad_problem_raises_naming_the_argument(kwargs, word):
    with pytest.raises(ValueError, match=word):
        O.Problem(**kwargs)


def test_structural_errors(wl):
    with pytest.raises(ValueError, match="free_caps"):
        O.optimize(make_cluster("baseline-a100", 1), wl, O.Problem("cost", free_caps="token"))
    with pytest.raises(ValueError, match="budget"):
        O.optimize(make_cluster("splitwise-hh", 1, 1), wl, O.Problem("throughput", power_budget_kw=5.0))
    with pytest.raises(ValueError, match="cluster"):
        O.optimize("splitwise-hh", wl)


@pytest.mark.parametrize("argv, word", [
    (["--objective", "speed"], "--objective"),
    (["--objective", "cost", "--power-budget", "100"], "--power-budget"),
    (["--objective", "throughput", "--rate", "10"], "--rate"),
    (["--rate", "-5"], "--rate"),
    (["--slo", "1,2,3"], "--slo"),
    (["--design", "splitwise-xx"], "--design"),
    (["--workload", "no-such-trace.csv"], "no-such-trace"),
    (["--design", "baseline-h100", "--free-caps", "token"], "free_caps"),
    (["--max-machines", "0"], "--max-machines"),
])
def test_cli_bad_arguments_exit_2_with_message(argv, word, capsys):
    with pytest.raises(SystemExit) as e:
        O.main(argv + ["--quiet", "--no-cache"])
    assert e.value.code == 2
    assert word in capsys.readouterr().err


def test_cli_json(capsys, tmp_path):
    plot = tmp_path / "plane.png"
    code = O.main(["--json", "--quiet", "--no-cache", "--rate", str(RATE), "--bins", str(BINS), "--max-machines",
                   str(MAX), "--plot", str(plot)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("prompt_machines", "token_machines", "prompt_cap_frac", "token_cap_frac", "feasible", "slo_margins",
                "slo_headroom", "metrics", "binding", "continuous", "timings_s", "full_resolution", "cost_per_hour"):
        assert key in out, key
    assert out["feasible"] and out["prompt_machines"] >= 1 and out["token_machines"] >= 1
    assert set(out["slo_margins"]) == set(O.SLO_NAMES)
    assert plot.stat().st_size > 1000
    # certified by default: the answer printed is the certificate's
    cert = out["certificate"]
    assert cert["supported"] and cert["seeds"] == [0, 1, 2, 3] and len(cert["per_seed"]) == 4
    if cert["certified"]:
        assert all(r["meets"] for r in cert["per_seed"])
        assert (cert["answer"]["prompt_machines"], cert["answer"]["token_machines"]) == (out["prompt_machines"],
                                                                                         out["token_machines"])


def test_baseline_json_names_machines():
    c = O.Candidate(7, 0, 1.0, 1.0, 10.0, True, 266.56, np.ones(len(O.CONSTRAINT_NAMES)), 266.56, 71.4)
    d = _candidate_dict(c, splitwise=False)
    assert d["machines"] == 7 and "prompt_machines" not in d and "token_machines" not in d
