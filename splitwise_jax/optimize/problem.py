"""What `optimize` solves and what it returns: the problem, the solver's settings and
the result types (host-side values; nothing here is traced).

References:
    Patel et al., Splitwise, ISCA 2024: Table VI (SLOs), §VI-A (Fig. 12), §VI-C
    (Figs. 18-19: iso-power and iso-cost budgets of 40 DGX-H100).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from splitwise_jax.specs import catalog, paper
from splitwise_jax._validate import check_choice, check_int, check_positive
from splitwise_jax.cluster.cluster import ClusterMetrics, Resolution

OBJECTIVES = ("cost", "power", "throughput")
FREE_CAPS = ("none", "token", "prompt", "both")
SLO_NAMES = tuple(f"{m} P{p}" for m in ("TTFT", "TBT", "E2E") for p in (50, 90, 99))
CONSTRAINT_NAMES = SLO_NAMES + ("KV memory", "prompt-pool load", "token-pool load", "cost budget",
                                "power budget")
# Variables of the relaxed problem, in this order (log pool sizes, caps, log rate).
VARIABLES = ("log_prompt_machines", "log_token_machines", "prompt_cap_frac", "token_cap_frac", "log_rate")
#: The paper's iso-power / iso-cost reference: 40 DGX-H100 (§VI-C; `paper.ISO_REFERENCE_MACHINES`).
REFERENCE_MACHINES = paper.ISO_REFERENCE_MACHINES


# --------------------------------------------------------------------------------------
# Problem and solver configuration
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Problem:
    """What to optimise and under which constraints.

    Attributes:
        objective: "cost" ($/h), "power" (provisioned kW, the paper's accounting:
            machine power x cap) at `rate_per_s`, or "throughput" (req/s) under budgets.
        rate_per_s: target load of cost/power problems (None: the workload's own rate).
        power_budget_kw: provisioned-power budget of throughput problems (kW).
        cost_budget_per_h: cost budget of throughput problems ($/h). A throughput
            problem without a budget gets the paper's iso-power budget (40 DGX-H100).
        slo: (3, 3) slowdown limits, rows TTFT/TBT/E2E, columns P50/P90/P99 (Table VI).
        free_caps: which pools' power caps are free variables ("none", "token",
            "prompt", "both"); a baseline's machines are its prompt pool.
        cap_step: granularity of free caps (fraction of TDP) for the integer repair.
        max_machines: largest pool size searched (per pool); throughput problems are
            further bounded by their budget.
        horizon_s: arrival window of `evaluate` (s).
    """

    objective: str = "cost"
    rate_per_s: float | None = None
    power_budget_kw: float | None = None
    cost_budget_per_h: float | None = None
    slo: tuple = paper.TABLE_VI_SLO
    free_caps: str = "none"
    cap_step: float = 0.05
    max_machines: int = 128
    horizon_s: float = 120.0

    def __post_init__(self):
        check_choice("objective", self.objective, OBJECTIVES)
        check_choice("free_caps", self.free_caps, FREE_CAPS)
        check_int("max_machines", self.max_machines, 1)
        check_positive("cap_step", self.cap_step)
        check_positive("horizon_s", self.horizon_s)
        slo = np.asarray(self.slo, dtype=float)
        if slo.shape != (3, 3) or not np.all(np.isfinite(slo)) or np.any(slo <= 0):
            raise ValueError(f"slo must be 3x3 positive slowdown limits (rows TTFT/TBT/E2E, columns "
                             f"P50/P90/P99), got {self.slo!r}")
        object.__setattr__(self, "slo", tuple(tuple(float(v) for v in row) for row in slo))
        budgets = (self.power_budget_kw, self.cost_budget_per_h)
        if self.objective == "throughput":
            if self.rate_per_s is not None:
                raise ValueError("rate_per_s is the answer of a throughput problem; give power_budget_kw "
                                 "or cost_budget_per_h instead")
            if all(b is None for b in budgets):
                object.__setattr__(self, "power_budget_kw", reference_budget()[0])
            for name, b in (("power_budget_kw", self.power_budget_kw), ("cost_budget_per_h", self.cost_budget_per_h)):
                if b is not None:
                    check_positive(name, b)
        else:
            if any(b is not None for b in budgets):
                raise ValueError(f"power_budget_kw / cost_budget_per_h apply to objective 'throughput' only, "
                                 f"not {self.objective!r} (which is solved at rate_per_s)")
            if self.rate_per_s is not None:
                check_positive("rate_per_s", self.rate_per_s, unit="req/s")


@dataclasses.dataclass(frozen=True)
class SolverConfig:
    """Numerical settings of `optimize` and `grid_search`.

    Attributes:
        rounds: augmented-Lagrangian rounds (multiplier updates).
        steps_per_round: Adam steps per round.
        learning_rate: first round's step size in log units (a 0.08 step changes a pool
            by ~8%); it shrinks by `lr_decay` each round.
        rho0, rho_growth, rho_max: penalty weight, its growth while violations persist.
        temperature: softplus temperature of the smooth max(0, .) in the Lagrangian
            (multiplier units); smaller follows the kink closer, larger is smoother.
        radius: half-width of the integer repair box (machines).
        cap_radius: half-width of the cap repair box (cap steps).
        rate_tol: resolution of throughput problems' rate bisection (log units: 5e-4 = 0.05%).
        resolution: `evaluate`'s numerical resolution.
    """

    rounds: int = 5
    steps_per_round: int = 30
    learning_rate: float = 0.08
    lr_decay: float = 0.6
    rho0: float = 10.0
    rho_growth: float = 4.0
    rho_max: float = 1e3
    temperature: float = 0.01
    radius: int = 3
    cap_radius: int = 2
    rate_tol: float = 5e-4
    resolution: Resolution = Resolution()

    def __post_init__(self):
        for name in ("rounds", "steps_per_round"):
            check_int(name, getattr(self, name), 1)
        for name in ("radius", "cap_radius"):
            check_int(name, getattr(self, name), 0)
        for name in ("learning_rate", "lr_decay", "rho0", "rho_growth", "rho_max", "temperature", "rate_tol"):
            check_positive(name, getattr(self, name))


def reference_budget(machine: str = paper.ISO_REFERENCE_MACHINE, count: int = REFERENCE_MACHINES) -> tuple[float, float]:
    """(provisioned kW, $/h) of `count` machines: the paper's iso-power and iso-cost
    budgets are those of 40 DGX-H100 (§VI-C: 40 DGX-H100 ~ 70 DGX-A100 in power)."""
    m = catalog.get_machine(machine)
    return count * float(m.provisioned_power_w) / 1e3, count * float(m.cost_per_hour)



# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------

class Candidate(NamedTuple):
    """One integer configuration and its evaluation (host numpy values)."""

    prompt_machines: int
    token_machines: int        # 0 for a baseline
    prompt_cap_frac: float
    token_cap_frac: float
    rate_per_s: float
    feasible: bool
    objective: float           # $/h, provisioned kW or req/s
    constraints: np.ndarray    # (14,) g, >= 0 met
    cost_per_hour: float
    provisioned_power_kw: float
    metrics: ClusterMetrics | None = None  # numpy scalars, on the workload searched

    def as_row(self) -> np.ndarray:
        """(n_p, n_t, cap_p, cap_t, rate): the physical variables."""
        return np.array([self.prompt_machines, self.token_machines, self.prompt_cap_frac, self.token_cap_frac,
                         self.rate_per_s], float)


@dataclasses.dataclass(frozen=True)
class GridResult:
    """Outcome of `grid_search` over the integer box."""

    best: Candidate | None
    cells_in_box: int
    cells_evaluated: int
    evaluations: int
    wall_s: float


@dataclasses.dataclass(frozen=True)
class OptimizeResult:
    """Outcome of `optimize`.

    Attributes:
        design, objective: what was solved.
        best: the integer answer (None if nothing feasible was found).
        metrics: `ClusterMetrics` of the answer (on the workload given to optimize).
        continuous: the relaxed optimum (pools, caps, rate) before rounding, and the
            constraints it still violates (`violated`: name -> g < 0, log units).
        multipliers: final Lagrange multipliers by constraint name (> 0: active at the
            continuous optimum).
        binding: constraints that stop a cheaper (or faster) neighbour: for each pool,
            the constraints the configuration with one machine fewer (rate: 1% more) violates.
        history: objective (its own units) and worst constraint violation (log units)
            per gradient step.
        evaluations: configurations evaluated (gradient steps count one each).
        timings_s: wall time of each phase ("start", "gradient", "repair"), the first
            call of each compiled function included.
        bounds: largest pools searched.
    """

    design: str
    objective: str
    best: Candidate | None
    metrics: ClusterMetrics | None
    continuous: dict
    multipliers: dict
    binding: dict
    history: dict
    evaluations: int
    timings_s: dict
    bounds: tuple
    problem: Problem

    @property
    def feasible(self) -> bool:
        return self.best is not None and self.best.feasible

    def slo_headroom(self) -> dict:
        """Per SLO, limit / slowdown - 1 (> 0: met with that relative headroom)."""
        if self.best is None:
            return {}
        return {n: float(np.expm1(self.best.constraints[i])) for i, n in enumerate(SLO_NAMES)}

