"""Designs as strategy objects (`cluster.strategy`, `cluster.strategies`): what the
`Cluster` carries instead of a `kind` string, and what callers ask of it. No model is
evaluated here (tests/test_pinned_outputs.py pins `evaluate`'s numbers for every
strategy); these check identity, the registry, the derived names and the hooks."""

from __future__ import annotations

import pickle

import jax
import pytest

import splitwise_jax as sj
from splitwise_jax.cluster.chunked import Chunked, ChunkedScheduling
from splitwise_jax.cluster.designs import PRESETS, cluster_pools, uniform_names
from splitwise_jax.cluster.engine import ServingEngine, stage_metrics
from splitwise_jax.cluster.flows_baseline import Baseline
from splitwise_jax.cluster.flows_splitwise import Splitwise
from splitwise_jax.cluster.strategies import (BASELINE, CHUNKED, ENGINE, SPLITWISE, STRATEGIES, strategy_for,
                                              strategy_of_pools)
from splitwise_jax.cluster.strategy import Colocated, DesignStrategy


def test_registry_holds_every_design_once_by_kind():
    assert set(STRATEGIES) == {"baseline", "chunked", "splitwise", "engine"}
    assert all(s.kind == k and isinstance(s, DesignStrategy) for k, s in STRATEGIES.items())
    assert (BASELINE, CHUNKED, SPLITWISE, ENGINE) == (Baseline(), Chunked(), Splitwise(), ServingEngine())
    assert strategy_for("chunked") is CHUNKED and strategy_for(SPLITWISE) is SPLITWISE
    with pytest.raises(ValueError, match="design kind must be one of"):
        strategy_for("disaggregated")


def test_strategies_are_hashable_stateless_singletons():
    # Equal (and equally hashed) by class only: a static pytree field whose every instance
    # of one design shares one tree structure, hence one compiled program.
    assert Splitwise() == SPLITWISE and hash(Splitwise()) == hash(SPLITWISE)
    assert BASELINE != CHUNKED and BASELINE != SPLITWISE and CHUNKED != Baseline()
    assert repr(SPLITWISE) == "Splitwise()"  # part of the exported programs' cache key (str(treedef))
    assert pickle.loads(pickle.dumps(CHUNKED)) == CHUNKED
    with pytest.raises(AttributeError):
        SPLITWISE.kind_extra = 1  # no instance state


def test_roles_and_token_pool():
    assert isinstance(BASELINE, Colocated) and isinstance(CHUNKED, Colocated) and not isinstance(SPLITWISE, Colocated)
    assert (BASELINE.roles, CHUNKED.roles, SPLITWISE.roles) == (("colocated",), ("colocated",), ("prompt", "token"))
    assert (BASELINE.token_pool, CHUNKED.token_pool, SPLITWISE.token_pool) == (False, False, True)
    assert strategy_of_pools(("prompt", "token"), False) is SPLITWISE
    assert strategy_of_pools(("colocated",), False) is BASELINE and strategy_of_pools(("colocated",), True) is CHUNKED


@pytest.mark.parametrize("name, strategy", [("baseline-h100", BASELINE), ("chunked-h100", CHUNKED),
                                            ("splitwise-hh", SPLITWISE)])
def test_clusters_carry_their_designs_strategy(name, strategy):
    design = PRESETS[name]
    c = sj.make_cluster(name, 4.0, 2.0 if strategy.token_pool else 0.0)
    assert design.strategy is strategy and c.strategy is strategy
    assert design.kind == c.kind == strategy.kind   # the read-only names files and outputs use
    assert [r for r, _, _ in cluster_pools(c)] == list(strategy.roles)
    assert isinstance(c.scheduling, ChunkedScheduling) == (strategy is CHUNKED)
    # The strategy is static metadata: not a leaf, and the same tree for every size.
    other = sj.make_cluster(name, 9.0, 3.0 if strategy.token_pool else 0.0)
    assert jax.tree_util.tree_structure(uniform_names(c)) == jax.tree_util.tree_structure(uniform_names(other))
    assert strategy not in jax.tree_util.tree_leaves(c)


def test_kind_is_read_only_and_replace_still_takes_it():
    c = sj.make_cluster("chunked-h100", 4.0)
    with pytest.raises(AttributeError):
        c.kind = "baseline"
    b = c.replace(kind="baseline", scheduling=sj.Scheduling())
    assert b.strategy is BASELINE and b.kind == "baseline" and b.n_prompt == c.n_prompt
    assert sj.Cluster(c.prompt, c.token, c.alone, 1.0, 1.0, c.transfer).strategy is SPLITWISE  # the old default


def test_validation_and_naming_come_from_the_strategy():
    c = sj.make_cluster("chunked-h100", 4.0)
    with pytest.raises(ValueError, match="needs ChunkedScheduling"):
        CHUNKED.check(c.replace(scheduling=sj.Scheduling()))
    BASELINE.check(c)  # nothing to check
    assert CHUNKED.describe(PRESETS["chunked-h100"]) == ", chunked prefill 512 tokens"
    assert BASELINE.describe(PRESETS["baseline-h100"]) == "" and SPLITWISE.label == "Splitwise"


def test_the_serving_engine_is_registered_but_not_a_cluster_design():
    assert ENGINE.stage_metrics is stage_metrics and ENGINE.roles == ("colocated",)
    c = sj.make_cluster("baseline-h100", 4.0)
    with pytest.raises(ValueError, match="per load stage"):
        sj.evaluate(c.replace(strategy=ENGINE), sj.load_workload("coding", rate_per_s=10.0))
