"""`simulate`: run a request trace through a cluster and measure it."""

from __future__ import annotations

import functools
import os
import time
from typing import TYPE_CHECKING

import numpy as np

from splitwise_jax.simulate import engine, report
from splitwise_jax.simulate.plan import SimPlan, SimTables, plan_of, tables_of
from splitwise_jax.simulate.policies import SimConfig
from splitwise_jax.simulate.trace import RequestTrace, from_csv

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SimResult", "simulate", "run_plan"]


class SimResult:
    """A simulated run.

    Attributes:
        metrics: the `evaluate --json` object measured on the run (`report.metrics_dict`).
        requests: one row per request (`report.request_table`), a DataFrame built on
            first use (`request_columns` holds its columns as NumPy arrays).
        machines: one row per machine (`report.machine_table`), likewise built on first
            use from `machine_columns`.
        raw: the engine's arrays (`engine.RawResult`), e.g. for `report.batch_histogram`.
        trace: the trace simulated.
        wall_s: seconds spent in the event loop (`setup_s` before it, building the fast
            timing; `report_s` after it, metrics and power).
        cpu_s: CPU seconds of this process in the event loop (on a shared machine, closer
            to what the loop would take alone than `wall_s`).

    The tables are DataFrames on demand so that a run that only prints its metrics
    (a warm command line) never imports pandas (~0.2 s; docs/speed.md §11).
    """

    def __init__(self, metrics: dict, request_columns: dict, machine_columns: dict, raw: engine.RawResult,
                 trace: RequestTrace, wall_s: float, setup_s: float, report_s: float, cpu_s: float):
        self.metrics = metrics
        self.request_columns = request_columns
        self.machine_columns = machine_columns
        self.raw = raw
        self.trace = trace
        self.wall_s = wall_s
        self.setup_s = setup_s
        self.report_s = report_s
        self.cpu_s = cpu_s

    @functools.cached_property
    def requests(self) -> pd.DataFrame:
        import pandas as pd
        return pd.DataFrame(self.request_columns)

    @functools.cached_property
    def machines(self) -> pd.DataFrame:
        import pandas as pd
        return pd.DataFrame(self.machine_columns)

    def __repr__(self) -> str:
        return (f"SimResult({len(self.trace)} requests of {self.trace.name!r}, meets_slo={self.metrics['meets_slo']}, "
                f"event loop {self.wall_s:.3g} s)")

    def histogram(self, pool: str | None = None, include_idle: bool = True) -> pd.DataFrame:
        """Time-weighted active-token histogram of a pool (see `report.batch_histogram`)."""
        return report.batch_histogram(self.raw, self.trace, pool, include_idle=include_idle)


def _slo_default():
    from splitwise_jax.specs.paper import PAPER_SLO
    return PAPER_SLO


def simulate(cluster, trace: RequestTrace | str | os.PathLike, config: SimConfig = SimConfig(), *,
             slo=None, progress: bool = False, power: bool = True, fast: dict | None = None) -> SimResult:
    """Simulate a request trace on a cluster, request by request.

    The same cluster object `evaluate` takes (`designs.make_cluster`, whole pool sizes),
    timed by the same strategies (`cluster.prompt`, `cluster.token`, `cluster.alone`),
    with SplitwiseSim's policies (docs/simulate.md). Deterministic: one trace, one result.

    Args:
        cluster: the design, its pool sizes and timings.
        trace: a `RequestTrace` (`trace.poisson`, `trace.from_csv`) or a trace CSV path.
        config: the policies' knobs (`SimConfig`; defaults are SplitwiseSim's).
        slo: (3, 3) slowdown limits, rows TTFT/TBT/E2E, columns P50/P90/P99; default
            `cluster.PAPER_SLO` (Table VI).
        progress: show a progress bar (tqdm) over arrivals.
        power: compute power and energy (from a grid of each machine type's power).
        fast: prebuilt fast timings (`engine.build_fast_timings`), to reuse across runs.

    Returns:
        `SimResult`.

    Example:
        >>> from splitwise_jax.cluster.designs import make_cluster
        >>> from splitwise_jax.simulate import simulate, trace
        >>> c = make_cluster("splitwise-hh", 27, 3, phase_model="splitwise-sim-table")
        >>> r = simulate(c, trace.from_csv("rr_code_70_2min.csv"))  # doctest: +SKIP
        >>> r.metrics["ttft_s"]["p50"]  # doctest: +SKIP

    References:
        Splitwise (ISCA 2024) Sec. V-A; SplitwiseSim (github Mutinifni/splitwise-sim).
    """
    if not isinstance(trace, RequestTrace):
        trace = from_csv(trace)
    t_setup = time.perf_counter()
    plan = plan_of(cluster, config)
    tables = tables_of(cluster, engine.table_extents(trace, config), int(trace.prompt_tokens.max()), fast, power)
    return run_plan(plan, tables, trace, config, slo=slo, progress=progress, power=power,
                    setup_s=time.perf_counter() - t_setup)


def run_plan(plan: SimPlan, tables: SimTables, trace: RequestTrace, config: SimConfig = SimConfig(), *,
             slo=None, progress: bool = False, power: bool = True, setup_s: float = 0.0) -> SimResult:
    """`simulate` of a cluster already read into its plan and tables (`plan.plan_of`,
    `plan.tables_of`, or a warm command line's copies on disk): NumPy and Python only.

    Args:
        plan: the cluster's numbers.
        tables: its timing tables, reaching the trace's extents.
        trace, config, slo, progress, power: as `simulate`.
        setup_s: seconds spent building `plan` and `tables` (reported in the result).
    """
    slo = _slo_default() if slo is None else slo
    t_loop = time.perf_counter()
    cpu_loop = time.process_time()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(trace), unit="req", desc="simulate", leave=False)
    try:
        raw = engine.run(plan, trace, config, fast={"prompt": tables.prompt, "token": tables.token},
                         progress=bar.update if bar is not None else None)
    finally:
        if bar is not None:
            bar.close()
    t_report = time.perf_counter()
    cpu_s = time.process_time() - cpu_loop
    a_ttft, a_tbt = tables.alone_s(trace.prompt_tokens)
    requests = report.request_columns(raw, trace, a_ttft, a_tbt)
    block_w = report.block_power_w(raw, tables) if power else None
    machines = report.machine_columns(raw, trace, plan, block_w)
    metrics = report.metrics_dict(requests, raw, trace, plan, slo, machines)
    t_end = time.perf_counter()
    return SimResult(metrics, requests, machines, raw, trace, t_report - t_loop, setup_s, t_end - t_report, cpu_s)
