"""Design search: the cheapest, least power-hungry or highest-throughput cluster that
meets every SLO, found by gradient and proved on the integer neighbourhood.

The paper sizes its clusters by brute-force simulation over a grid of prompt and token
machine counts (Splitwise §VI-A, Fig. 12: Splitwise-HH on coding at 70 req/s needs 27
prompt + 3 token machines). Here the pool sizes (and, optionally, the power caps) are
relaxed to continuous variables and optimised by gradient through `cluster.evaluate`.
One job per file:

* `problem`: what is solved (`Problem`, `SolverConfig`) and what comes back
  (`OptimizeResult`, `Candidate`, `GridResult`);
* `spec`: the traced problem (variables -> metrics, constraints, objective) and batched
  evaluation, one compiled program shared by every design of a kind;
* `gradient`: the augmented-Lagrangian solver, `optimize`;
* `integer`: repair to integers, the largest feasible rate of each candidate, and the
  exhaustive `grid_search` that verifies answers;
* `search`: the vectorised boundary search of a monotone predicate ("the highest rate
  that meets the SLOs"), shared with the studies;
* `compare`: every design on one problem and the paper's headline ratios (Figs. 18-19);
* `report`, `cli`, `__main__`: printing, figures and `python -m splitwise_jax.optimize`.

Example:
    >>> from splitwise_jax.cluster.designs import make_cluster
    >>> from splitwise_jax.cluster.workload import workload, coarsen
    >>> wl = coarsen(workload("coding", 70.0), 16, 16)
    >>> res = optimize(make_cluster("splitwise-hh", 1, 1), wl, Problem("cost"))  # doctest: +SKIP
    >>> res.prompt_machines, res.token_machines  # doctest: +SKIP

References:
    Patel et al., Splitwise, ISCA 2024: §VI-A (Fig. 12, grid search), §VI-C (Figs. 18-19,
    iso-power / iso-cost / iso-throughput designs), Table VI (SLOs).
    Nocedal & Wright, Numerical Optimization, §17.4 (augmented Lagrangian, inequalities).
"""

from splitwise_jax.optimize.cli import main as main
from splitwise_jax.optimize.compare import compare_designs as compare_designs
from splitwise_jax.optimize.compare import headline_ratios as headline_ratios
from splitwise_jax.optimize.compare import problem_kind as problem_kind
from splitwise_jax.optimize.gradient import optimize as optimize
from splitwise_jax.optimize.integer import evaluate_candidate as evaluate_candidate
from splitwise_jax.optimize.integer import full_resolution_step_up as full_resolution_step_up
from splitwise_jax.optimize.integer import evaluate_plane as evaluate_plane
from splitwise_jax.optimize.integer import grid_search as grid_search
from splitwise_jax.optimize.integer import same_answer as same_answer
from splitwise_jax.optimize.problem import CONSTRAINT_NAMES as CONSTRAINT_NAMES
from splitwise_jax.optimize.problem import FREE_CAPS as FREE_CAPS
from splitwise_jax.optimize.problem import OBJECTIVES as OBJECTIVES
from splitwise_jax.optimize.problem import REFERENCE_MACHINES as REFERENCE_MACHINES
from splitwise_jax.optimize.problem import SLO_NAMES as SLO_NAMES
from splitwise_jax.optimize.problem import VARIABLES as VARIABLES
from splitwise_jax.optimize.problem import Candidate as Candidate
from splitwise_jax.optimize.problem import GridResult as GridResult
from splitwise_jax.optimize.problem import OptimizeResult as OptimizeResult
from splitwise_jax.optimize.problem import Problem as Problem
from splitwise_jax.optimize.problem import SolverConfig as SolverConfig
from splitwise_jax.optimize.problem import reference_budget as reference_budget
from splitwise_jax.optimize.report import plot_compare as plot_compare
from splitwise_jax.optimize.report import plot_plane as plot_plane
from splitwise_jax.optimize.search import Boundary as Boundary
from splitwise_jax.optimize.search import search_boundary as search_boundary
from splitwise_jax.optimize.spec import CHUNK as CHUNK
