"""The designs the cluster model knows, by name: one registry (`STRATEGIES`), so that
adding a design is one new module and one line here (docs/architecture.md, "Where to
add a design"; `strategy.DesignStrategy` says what a design supplies).
"""

from __future__ import annotations

from splitwise_jax._validate import check_choice
from splitwise_jax.cluster.chunked import Chunked
from splitwise_jax.cluster.engine import ServingEngine
from splitwise_jax.cluster.flows_baseline import Baseline
from splitwise_jax.cluster.flows_splitwise import Splitwise
from splitwise_jax.cluster.strategy import DesignStrategy

BASELINE = Baseline()
CHUNKED = Chunked()
SPLITWISE = Splitwise()
ENGINE = ServingEngine()

#: kind -> strategy: the designs of `Cluster.strategy`, and the serving engine (a model
#: of one server per load stage, evaluated by `engine.stage_metrics`, not `evaluate`).
STRATEGIES: dict[str, DesignStrategy] = {s.kind: s for s in (BASELINE, CHUNKED, SPLITWISE, ENGINE)}


def strategy_for(kind: str | DesignStrategy) -> DesignStrategy:
    """The strategy of a design kind ("baseline", "chunked", "splitwise", "engine"), or
    ValueError listing them; a strategy is returned as it is."""
    if isinstance(kind, DesignStrategy):
        return kind
    return STRATEGIES[check_choice("design kind", kind, sorted(STRATEGIES))]


def strategy_of_pools(roles, chunked_prefill: bool) -> DesignStrategy:
    """The strategy of a design by its pools' roles: a prompt and a token pool are
    Splitwise; one colocated pool is chunked prefill with a token budget, else a
    baseline."""
    if "colocated" not in roles:
        return SPLITWISE
    return CHUNKED if chunked_prefill else BASELINE
