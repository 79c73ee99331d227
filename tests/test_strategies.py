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


def test_simulated_as_is_agrees_with_the_simulated_hook():
    # `simulated_as_is` is what the simulator and optimize's --simulate-top ask without
    # a cluster at hand; `simulated` is what runs. They must tell the same story.
    for name in ("baseline-h100", "chunked-h100", "splitwise-hh"):
        c = sj.make_cluster(name, 4.0, 2.0 if PRESETS[name].strategy.token_pool else 0.0)
        run, options = c.strategy.simulated(c)
        assert c.strategy.simulated_as_is == (run is c and options == {}), name
        assert not run.strategy.token_pool or run is c  # what runs is a design the simulator knows by its roles
    run, options = CHUNKED.simulated(sj.make_cluster("chunked-h100", 4.0))
    assert run.strategy == BASELINE and options == {"chunked_prefill_tokens": 512, "scheduler": "token_jsq"}


# -- no design named by its kind outside the strategy layer ----------------------------

# Where a design may be tested by its name: the strategy layer itself (the base class and
# the registry, which maps names to strategies). Everything else asks the strategy
# (`token_pool`, `simulated_as_is`, `simulated`, `describe`, ...), so that adding a design
# is a new strategy object, not an edit of the callers (docs/architecture.md).
_NAMES_ALLOWED_IN = {"cluster/strategy.py", "cluster/strategies.py"}


def _kind_comparisons(source: str, names) -> list[int]:
    """Lines of `source` that compare something called `kind` (`x.kind`, `kind`) with a
    design name: ==, !=, in, not in, against a string or a tuple/list/set of them."""
    import ast

    def is_kind(node):
        return (isinstance(node, ast.Attribute) and node.attr == "kind") or (
            isinstance(node, ast.Name) and node.id == "kind")

    def names_in(node):
        if isinstance(node, ast.Constant):
            return node.value in names
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(isinstance(e, ast.Constant) and e.value in names for e in node.elts)
        return False

    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(is_kind(s) for s in sides) and any(names_in(s) for s in sides):
                hits.append(node.lineno)
    return hits


def test_the_kind_detector_bites():
    names = set(STRATEGIES)
    bad = ('if cluster.kind == "splitwise": pass\n'
           'x = "chunked" != d.kind\n'
           'y = c.kind in ("baseline", "chunked")\n'
           'z = kind not in ["engine"]\n')
    assert _kind_comparisons(bad, names) == [1, 2, 3, 4]
    fine = ('a = prov.kind == "calibrated"\n'       # a provenance's kind, not a design's
            'b = cluster.strategy.token_pool\n'
            'c = {"kind": design.kind}\n')           # naming it in an output is what kind is for
    assert _kind_comparisons(fine, names) == []


def test_no_design_is_named_by_its_kind_outside_the_strategy_layer():
    from pathlib import Path

    root = Path(sj.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel in _NAMES_ALLOWED_IN:
            continue
        found += [f"{rel}:{line}" for line in _kind_comparisons(path.read_text(), set(STRATEGIES))]
    assert not found, ("a design tested by its kind outside the strategy layer; ask its strategy instead "
                       f"(cluster/strategy.py): {found}")
