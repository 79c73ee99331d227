"""`python -m splitwise_jax.optimize`: arguments, checks, and the run (see docs/optimize.md).

Every input is checked before anything compiles (a bad argument costs no minute of
compilation): argument types, conflicting flags, the workload, the designs, the
budget against one machine per pool. Bad input exits 2 with a message naming the
argument (`splitwise_jax.cli._cli`); the computation itself runs outside that net, so a
bug in the optimiser keeps its traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import jax
import numpy as np

from splitwise_jax.cli import _cli, _design_args
from splitwise_jax.specs import paper
from splitwise_jax._validate import check_choice
from splitwise_jax.optimize.compare import compare_designs, headline_ratios, problem_kind
from splitwise_jax.optimize.confidence import check_confidence
from splitwise_jax.optimize.pareto import parse_objectives
from splitwise_jax.optimize.gradient import optimize
from splitwise_jax.optimize.integer import evaluate_candidate, full_resolution_step_up, grid_search
from splitwise_jax.optimize.problem import FREE_CAPS, OBJECTIVES, Problem, SolverConfig
from splitwise_jax.optimize.report import _label, _print_compare, _print_result, _result_dict, plot_compare, plot_plane
from splitwise_jax.optimize.spec import free_flags, make_spec, prefetch_batch

_SLO_HELP = "9 comma-separated numbers (TTFT, TBT, E2E x P50, P90, P99), each a finite slowdown limit > 0"


def _parse_slo(text: str) -> tuple:
    try:
        vals = [float(v) for v in text.replace(";", ",").split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--slo must be {_SLO_HELP}, got {text!r}") from None
    if len(vals) != 9:
        raise ValueError(f"--slo must be {_SLO_HELP}, got {len(vals)} numbers")
    if not all(np.isfinite(v) and v > 0 for v in vals):
        raise ValueError(f"--slo must be {_SLO_HELP}, got {text!r}")
    return tuple(tuple(vals[3 * i:3 * i + 3]) for i in range(3))


def _parse_budgets(text: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        vals = ()
    if not vals or not all(np.isfinite(v) and v > 0 for v in vals):
        raise ValueError(f"--chunked-prefill must be one or more comma-separated token budgets > 0, got {text!r}")
    return vals


def _answer_pools(cluster, res, phase_model: str, params_path=None) -> list[dict]:
    """Each pool of the answer (its counts and caps) with its provenance."""
    from splitwise_jax.optimize.spec import with_cap

    b = res.best
    if b is not None:
        cluster = cluster.replace(n_prompt=float(b.prompt_machines), n_token=float(b.token_machines),
                                  prompt=with_cap(cluster.prompt, b.prompt_cap_frac),
                                  token=with_cap(cluster.token, b.token_cap_frac))
    return _design_args.pools_dict(cluster, params_path, phase_model=phase_model)


def _certify_default() -> int:
    from splitwise_jax.simulate.certify import DEFAULT_SEEDS
    return DEFAULT_SEEDS


def build_parser() -> argparse.ArgumentParser:
    from splitwise_jax.cluster.designs import DESIGNS, PHASE_MODELS, PRESETS, TRANSFER_MODES

    ap = argparse.ArgumentParser(
        prog="python -m splitwise_jax.optimize",
        description="Find the cheapest / least-power / highest-throughput cluster meeting every SLO, by gradient "
                    "(default: the paper's Fig. 12 problem: Splitwise-HH, coding, 70 req/s, cost).")
    ap.add_argument("--design", choices=sorted(PRESETS), help="a named design (default splitwise-hh); or "
                                                              "--design-file, or pool flags")
    _design_args.add_design_arguments(ap, counts=False)
    ap.add_argument("--workload", default="coding", help=_design_args.WORKLOAD_HELP)
    _design_args.add_resample_argument(ap)
    ap.add_argument("--objective", default="cost", choices=OBJECTIVES)
    ap.add_argument("--rate", type=_cli.positive_float, metavar="R",
                    help="target load, req/s, of cost/power problems (default 70 for presets)")
    ap.add_argument("--power-budget", type=_cli.positive_float, metavar="KW",
                    help="provisioned-power budget of a throughput problem (default: 40 DGX-H100, iso-power)")
    ap.add_argument("--cost-budget", type=_cli.positive_float, metavar="USD_PER_H",
                    help="cost budget of a throughput problem ($/h)")
    ap.add_argument("--free-caps", default="none", choices=FREE_CAPS,
                    help="optimise these pools' power caps too (e.g. HHcap's token cap instead of a fixed 70%%)")
    ap.add_argument("--cap-step", type=_cli.positive_float, default=0.05,
                    help="granularity of free caps (fraction of TDP, at most 1)")
    ap.add_argument("--max-machines", type=_cli.positive_int, default=128, help="largest pool searched")
    ap.add_argument("--bins", type=_cli.nonnegative_int, default=16,
                    help="request classes per marginal for the search (0: full resolution); the answer is re-checked at full resolution")
    ap.add_argument("--bin-scheme", choices=("equal-mass", "tail-dense"), default="equal-mass",
                    help="how --bins merges classes (splitwise_jax.coarsen): equal probability per bin, or the "
                         "presets' tail-dense edges")
    ap.add_argument("--slo", help="9 slowdown limits TTFT,TBT,E2E x P50,P90,P99 (default Table VI: 2,3,6,1.25,1.5,5,1.25,1.5,5)")
    _design_args.add_model_arguments(ap)
    ap.add_argument("--phase-model", default="calibrated", choices=PHASE_MODELS)
    ap.add_argument("--transfer-mode", "--transfer", dest="transfer_mode", choices=TRANSFER_MODES, help="KV transfer (default: the design's, serialized)")
    ap.add_argument("--steps", type=_cli.positive_int, help="gradient steps per augmented-Lagrangian round (default 30)")
    ap.add_argument("--verify", action="store_true", help="also evaluate the exhaustive integer grid and compare")
    ap.add_argument("--no-prune", action="store_true", help="with --verify: evaluate every cell (no exact pruning)")
    ap.add_argument("--compare-designs", action="store_true",
                    help="solve the same problem for every design; print the Fig. 18/19-style table")
    ap.add_argument("--designs", help="comma-separated designs for --compare-designs (default: all)")
    ap.add_argument("--baseline", default="baseline-h100", choices=sorted(DESIGNS),
                    help="design the --compare-designs table is normalised to")
    ap.add_argument("--json", action="store_true", help="print JSON instead of the table")
    ap.add_argument("--plot", metavar="PATH", help="write the objective over the (prompt, token) plane (Fig. 12 view)")
    ap.add_argument("--simulate-top", type=_cli.positive_int, metavar="K",
                    help="simulate the K best integer candidates (and cheaper ones the model rejects) request by "
                         "request; report where simulation and model disagree (docs/simulate.md)")
    ap.add_argument("--certify", type=_cli.positive_int, metavar="K", default=None,
                    help="simulate the answer request by request on K seeds (default %d); if a seed misses an SLO, step "
                         "to the cheapest neighbour that passes every seed; check the one-machine-cheaper neighbours "
                         "fail (docs/optimize.md, 'Certified answers')" % _certify_default())
    ap.add_argument("--no-certify", action="store_true", help="skip the certification by simulation")
    ap.add_argument("--window-confidence", type=float, metavar="P", default=None,
                    help="certify: a cell passes when every seed meets every SLO and a fresh window is estimated to "
                         "with probability >= P, 0 <= P < 1 (default 0.95; 0: every seed meeting is enough)")
    ap.add_argument("--confidence", type=float, metavar="P",
                    help="also find the best design whose nine SLOs all hold with probability >= P, 0 < P < 1, under "
                         "the model's error bars, and report what it costs over the point answer (docs/uncertainty.md)")
    ap.add_argument("--pareto", metavar="OBJ,OBJ",
                    help="the non-dominated designs over two or three of cost, power, throughput, across --designs "
                         "(default: all), pool sizes and caps (docs/uncertainty.md); --plot draws the fronts")
    ap.add_argument("--pareto-csv", metavar="PATH", help="with --pareto: write the front as CSV")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    ap.add_argument("--no-cache", action="store_true", help="do not use the persistent compilation cache")
    return ap


def _check_flags(args) -> None:
    """Flags that contradict each other or the objective (ValueError naming them)."""
    if args.objective != "throughput" and (args.power_budget is not None or args.cost_budget is not None):
        raise ValueError(f"--power-budget / --cost-budget apply to --objective throughput, not {args.objective!r} "
                         "(use --rate)")
    if args.objective == "throughput" and args.rate is not None:
        raise ValueError("--rate is the answer of --objective throughput; give --power-budget or --cost-budget")
    if args.cap_step > 1.0:
        raise ValueError(f"--cap-step must be a fraction of TDP in (0, 1], got {args.cap_step:g}")
    if args.no_prune and not args.verify:
        raise ValueError("--no-prune applies to --verify only; add --verify or drop --no-prune")
    if args.designs is not None and not (args.compare_designs or args.pareto):
        raise ValueError("--designs lists the designs of --compare-designs or --pareto; add one of them "
                         "(or use --design)")
    if args.confidence is not None:
        check_confidence(args.confidence)
        if args.compare_designs or args.pareto:
            raise ValueError("--confidence answers one design's problem; it does not combine with --compare-designs "
                             "or --pareto")
    if args.pareto is not None:
        parse_objectives(args.pareto)
        if args.compare_designs or args.verify or args.simulate_top:
            raise ValueError("--pareto is its own search; it does not combine with --compare-designs, --verify or "
                             "--simulate-top")
    if args.pareto_csv is not None and args.pareto is None:
        raise ValueError("--pareto-csv writes the front of --pareto; add --pareto OBJ,OBJ")
    if args.compare_designs and args.verify:
        raise ValueError("--verify checks one design's answer; it does not combine with --compare-designs")
    if args.window_confidence is not None and not 0.0 <= args.window_confidence < 1.0:
        raise ValueError(f"--window-confidence must be in [0, 1) (0: every seed meeting is enough); got "
                         f"{args.window_confidence:g}")
    if args.no_certify and args.certify is not None:
        raise ValueError("--certify K and --no-certify contradict each other; give one")
    if args.certify is not None and (args.compare_designs or args.pareto is not None):
        raise ValueError("--certify checks one design's answer; it does not combine with --compare-designs or "
                         "--pareto")
    if args.compare_designs and args.simulate_top:
        raise ValueError("--simulate-top checks one design's answer; it does not combine with --compare-designs")


def main(argv=None) -> int:
    """Command-line entry point (see docs/optimize.md); bad input exits 2 with a message."""
    _cli.float64()  # before any array is built (the precision policy of every CLI)
    _cli.fast_compile()  # before JAX starts its backend (the compile policy of every CLI)
    from splitwise_jax.cluster.designs import DESIGNS, build_cluster, make_cluster
    from splitwise_jax.optimize.variants import best_variant, variants, variants_table
    from splitwise_jax.cluster.workload import coarsen

    t_start = time.perf_counter() - _cli.process_seconds()  # so that perf_counter() - t_start is the process's age
    ap = build_parser()
    args = ap.parse_args(argv)
    with _cli.input_errors(ap):
        _check_flags(args)
        if args.plot is not None:
            _cli.output_file("--plot", args.plot)
        if args.pareto_csv is not None:
            _cli.output_file("--pareto-csv", args.pareto_csv)
        llm = _design_args.model_from_args(args)
        slo = _parse_slo(args.slo) if args.slo else paper.TABLE_VI_SLO
        problem = Problem(args.objective, rate_per_s=args.rate, power_budget_kw=args.power_budget,
                          cost_budget_per_h=args.cost_budget, slo=slo, free_caps=args.free_caps,
                          cap_step=args.cap_step, max_machines=args.max_machines)
        config = SolverConfig() if args.steps is None else SolverConfig(steps_per_round=args.steps)
        designs = [args.design]
        many = args.compare_designs or args.pareto is not None
        if many:
            designs = [d.strip() for d in args.designs.split(",")] if args.designs else list(DESIGNS)
            for d in designs:
                check_choice("--designs", d, sorted(DESIGNS))
            if args.compare_designs and args.baseline not in designs:
                designs.append(args.baseline)
        params_path = _design_args.params_path_from_args(args)
        kw = dict(model=llm, phase_model=args.phase_model, transfer_mode=args.transfer_mode, params_path=params_path)
        custom = not _design_args.is_preset(args) or args.chunked_prefill is not None
        if custom:  # a design file, pool flags or budgets: one problem per machine / budget choice
            if many:
                raise ValueError("--compare-designs and --pareto compare the named designs; they do not combine "
                                 "with --design-file, pool flags or --chunked-prefill")
            budgets = _parse_budgets(args.chunked_prefill) if args.chunked_prefill is not None else None
            design = _design_args.design_from_args(args, chunked_prefill=budgets[0] if budgets else None)
            if any(p.count is not None for p in design.pools):
                print("note: pool counts in the design are what optimize searches; the given counts are not used",
                      file=sys.stderr)
            if args.transfer_mode is not None:
                design = design.replace(transfer_mode=args.transfer_mode)
            found = variants(design, budgets)
            clusters = {k: build_cluster(v.with_counts(1.0, 1.0 if v.strategy.token_pool else None),
                                         model=llm, phase_model=args.phase_model, params_path=params_path)
                        for k, v in found.items()}
            designs = list(clusters)
            args.design = designs[0]
        else:
            args.design = args.design or "splitwise-hh"
            designs = designs if many else [args.design]
            clusters = {d: make_cluster(d, 1.0, 1.0, **kw) for d in designs}
        if args.simulate_top and any(not clusters[d].strategy.simulated_as_is for d in designs):
            raise ValueError("--simulate-top simulates SplitwiseSim's policies; chunked-prefill designs are checked "
                             "in studies/chunked_prefill.py")
        for d in designs:  # structural checks before any compilation
            if not many or clusters[d].strategy.token_pool or problem.free_caps in ("none", "prompt"):
                free_flags(clusters[d], problem.free_caps)
        wl_full = _design_args.workload_from_args(args, args.rate if args.objective != "throughput" else None)
        wl = coarsen(wl_full, args.bins, args.bins, scheme=args.bin_scheme) if args.bins else wl_full
        for d in designs:  # budgets that cannot buy a machine per pool, pool bounds
            if not many or clusters[d].strategy.token_pool or problem.free_caps in ("none", "prompt"):
                make_spec(clusters[d], wl, problem)

    if not args.no_cache:
        _cli.enable_cache()
    progress = not args.quiet and not (args.json and not sys.stderr.isatty())
    bins_text = "all workload classes" if not args.bins else f"{len(wl.prompt_tokens)}x{len(wl.output_tokens)} classes"
    load = (f"at {float(np.asarray(wl.rate_per_s)) if problem.rate_per_s is None else problem.rate_per_s:g} req/s"
            if problem.objective != "throughput" else
            "under " + " and ".join(t for t in (
                f"{problem.power_budget_kw:g} kW provisioned" if problem.power_budget_kw else "",
                f"${problem.cost_budget_per_h:g}/h" if problem.cost_budget_per_h else "") if t))
    goal = {"cost": "minimise cost", "power": "minimise provisioned power", "throughput": "maximise throughput"}[
        problem.objective]

    if args.compare_designs:
        t0 = time.perf_counter()
        results = compare_designs(lambda d: clusters[d], designs, wl, problem, config, progress=progress)
        wall = time.perf_counter() - t0
        if args.json:
            out = dict(workload=args.workload, objective=problem.objective, problem=problem_kind(problem),
                       baseline=args.baseline, wall_s=wall,
                       designs={d: _result_dict(r, clusters[d].strategy.token_pool, None, None, r.timings_s["gradient"])
                                for d, r in results.items()},
                       headlines=headline_ratios(results, problem))
            print(json.dumps(out, indent=2))
        else:
            _print_compare(results, clusters, problem, args.baseline,
                           f"{args.workload}: {goal} {load}, every design ({bins_text}); normalised to {args.baseline}")
            print(f"  ({wall:.1f} s for {len(results)} designs, {time.perf_counter() - t_start:.1f} s from process start)")
        if args.plot:
            with _cli.input_errors(ap):  # no feasible reference to normalise to
                fig = plot_compare(results, args.baseline)
            fig.savefig(args.plot, dpi=120)
        return 0

    if args.pareto is not None:
        return _run_pareto(args, clusters, designs, wl, problem, config, progress, bins_text, load, t_start, ap)

    t0 = time.perf_counter()
    searched = None
    if len(designs) > 1:  # machine types per pool / token budgets: one problem each, the best kept
        searched = compare_designs(lambda d: clusters[d], designs, wl, problem, config, progress=progress)
        args.design = best_variant(searched, problem.objective) or designs[0]
        res = searched[args.design]
    else:
        # The full-resolution check's program loads during the gradient phase, once the
        # start-point program has loaded and run (alongside them it slowed both).
        full_check = (lambda: prefetch_batch(clusters[args.design], wl_full, problem, config.resolution)) \
            if args.bins else None
        res = optimize(clusters[args.design], wl, problem, config, progress=progress, after_start=full_check)
    cluster = clusters[args.design]
    opt_wall = time.perf_counter() - t0
    searched_best = res.best  # what the grid verifies: the search's answer before any step-up
    full = None
    stepped = None
    if args.bins and res.best is not None:
        full = evaluate_candidate(cluster, wl_full, res.best, problem, config)
        if not full.feasible:
            # The coarse-class answer misses a limit at full resolution: the cheapest
            # configuration with up to two more machines per pool that meets them all.
            up = full_resolution_step_up(cluster, wl_full, res.best, problem, config)
            if up is not None:
                stepped = dict(searched=[res.best.prompt_machines, res.best.token_machines],
                               answer=[up.prompt_machines, up.token_machines])
                res = dataclasses.replace(res, best=up, metrics=up.metrics)
                full = up
    grid = None
    if args.verify:
        grid = grid_search(cluster, wl, problem, config, incumbent=res.best, prune=not args.no_prune,
                           progress=progress)
    conf = None
    if args.confidence is not None:
        from splitwise_jax.optimize.confidence import confident_answer
        conf = confident_answer(cluster, wl, problem, res, args.confidence, config, progress=progress)
    cert = None
    if not args.no_certify and res.best is not None:
        from splitwise_jax.simulate.certify import certify
        seeds = range(args.certify if args.certify is not None else _certify_default())
        cert = certify(cluster, wl_full, problem, res.best, seeds=seeds, splitwise=cluster.strategy.token_pool,
                       confidence=args.window_confidence, progress=progress)
        if cert.stepped:
            moved = evaluate_candidate(cluster, wl_full, _candidate_at(res.best, cert.answer), problem, config)
            res = dataclasses.replace(res, best=moved, metrics=moved.metrics)
            full = moved
    sim_check = None
    if args.simulate_top and res.best is not None:
        from splitwise_jax.simulate.candidates import check_optimum
        sim_check = check_optimum(cluster, wl, wl_full, problem, config, res.best, args.simulate_top, progress=progress)
    fig12 = (args.design == paper.FIG12["design"] and args.workload == paper.FIG12["workload"]
             and problem.objective == "cost" and abs(float(np.asarray(wl.rate_per_s)) - paper.FIG12["rate_per_s"]) < 1e-9)
    if args.json:
        d = _result_dict(res, cluster.strategy.token_pool, full, grid, opt_wall, searched=searched_best)
        d.update(workload=args.workload, problem=dict(kind=problem_kind(problem), **dataclasses.asdict(problem)),
                 bins=args.bins, wall_s_from_start=time.perf_counter() - t_start)
        if stepped is not None:
            d["stepped_up_at_full_resolution"] = stepped
        if fig12:
            d["paper"] = {k: paper.FIG12[k] for k in ("prompt_machines", "token_machines")}
        if sim_check is not None:
            d["simulate_top"] = sim_check[1]
        if cert is not None:
            d["certificate"] = cert.to_dict()
            d["certified"] = bool(cert.certified)
        if searched is not None:
            d["variants"] = {k: _result_dict(r, clusters[k].strategy.token_pool, None, None, r.timings_s["gradient"])
                             for k, r in searched.items()}
        d["pools"] = _answer_pools(cluster, res, args.phase_model, params_path)
        if conf is not None:
            from splitwise_jax.optimize.confidence import confidence_dict
            d["confidence"] = confidence_dict(conf, cluster.strategy.token_pool)
        print(json.dumps(d, indent=2))
    else:
        if searched is not None:
            print(variants_table(searched, {k: c.strategy.token_pool for k, c in clusters.items()},
                                 best_variant(searched, problem.objective),
                                 f"{len(searched)} machine / budget choices on {args.workload}: {goal} {load}"))
        name = _label(args.design) if args.design in DESIGNS else args.design
        _print_result(res, cluster, f"{name} on {args.workload}: {goal} {load} ({bins_text})",
                      full, grid, opt_wall, bins_text, fig12,
                      certified=cert.certified if cert is not None and cert.supported else None,
                      searched=searched_best)
        if stepped is not None:
            print(f"  the search's answer ({stepped['searched'][0]} + {stepped['searched'][1]} machines, on "
                  f"{bins_text}) missed a limit at full resolution; stepped up to the cheapest neighbour "
                  f"that meets every one: {stepped['answer'][0]} + {stepped['answer'][1]}")
        if cert is not None:
            from splitwise_jax.simulate.certify import certificate_text
            print(certificate_text(cert, problem.objective))
        if sim_check is not None:
            print(sim_check[0])
        print("\n".join("  " + line for line in _design_args.pool_lines(_answer_pools(cluster, res,
                                                                                    args.phase_model,
                                                                                    params_path))))
        if conf is not None:
            from splitwise_jax.optimize.confidence import confidence_text
            print(confidence_text(conf, cluster.strategy.token_pool))
        print(f"  {time.perf_counter() - t_start:.1f} s from process start")
    if args.plot:
        with _cli.input_errors(ap):  # nothing feasible to centre the plane on
            fig = plot_plane(res, cluster, wl, problem, config, grid, progress)
        fig.savefig(args.plot, dpi=120)
    return 0


def _candidate_at(best, row):
    """The optimiser's answer moved to another cell (n_p, n_t, cap_p, cap_t, rate); evaluated later."""
    return best._replace(prompt_machines=int(round(row[0])), token_machines=int(round(row[1])),
                         prompt_cap_frac=float(row[2]), token_cap_frac=float(row[3]), rate_per_s=float(row[4]))


def _run_pareto(args, clusters, designs, wl, problem, config, progress, bins_text, load, t_start, ap) -> int:
    """`--pareto`: the front across designs, printed (or JSON), as CSV and as a plot."""
    from splitwise_jax.optimize.pareto import pareto_front, plot_pareto

    objectives = parse_objectives(args.pareto)
    res = pareto_front(lambda d: clusters[d], designs, wl, problem, objectives, config, progress=progress)
    if args.pareto_csv:
        res.front.to_csv(args.pareto_csv, index=False, float_format="%.6g")
    if args.json:
        print(json.dumps({"objectives": list(objectives), "designs": designs, "workload": args.workload,
                          "front": res.front.to_dict(orient="records"), "candidates": int(len(res.candidates)),
                          "evaluations": res.evaluations, "wall_s": res.wall_s, "per_design_s": res.per_design_s},
                         indent=2))
    else:
        what = "" if "throughput" in objectives else f" {load}"
        print(f"{args.workload}: Pareto front of {', '.join(objectives)}{what}, {len(designs)} designs ({bins_text})")
        if len(res.front):
            print(res.front.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
        else:
            print("  no feasible design in the searched pools: raise --max-machines or relax --slo")
        print(f"  {len(res.front)} non-dominated of {len(res.candidates)} candidates; {res.evaluations} evaluations "
              f"in {res.wall_s:.1f} s ({time.perf_counter() - t_start:.1f} s from process start)")
        if args.pareto_csv:
            print(f"  wrote {args.pareto_csv}")
    if args.plot:
        with _cli.input_errors(ap):
            if not len(res.candidates):
                raise ValueError("--plot: no feasible design to draw")
            plot_pareto(res).savefig(args.plot, dpi=120)
    return 0
