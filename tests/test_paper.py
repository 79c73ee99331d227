"""`splitwise_jax.specs.paper`: one home for the paper's numbers, and everyone reads it."""

from __future__ import annotations

import numpy as np

import splitwise_jax as sj
from splitwise_jax.specs import catalog, paper
from splitwise_jax.cluster import cluster
from splitwise_jax.optimize import REFERENCE_MACHINES, Problem, reference_budget
from splitwise_jax.optimize.compare import metric_of


def test_table_vi_is_the_default_slo_everywhere():
    assert paper.TABLE_VI_SLO == ((2.0, 3.0, 6.0), (1.25, 1.5, 5.0), (1.25, 1.5, 5.0))  # Table VI
    assert sj.PAPER_SLO is paper.TABLE_VI_SLO
    # cluster.py still defines its own copy until it imports this one: they must agree.
    assert tuple(map(tuple, np.asarray(cluster.PAPER_SLO))) == paper.TABLE_VI_SLO
    assert Problem().slo == paper.TABLE_VI_SLO


def test_iso_budgets_are_forty_dgx_h100():
    m = catalog.get_machine(paper.ISO_REFERENCE_MACHINE)
    kw, usd = reference_budget()
    assert REFERENCE_MACHINES == paper.ISO_REFERENCE_MACHINES == 40
    assert kw == 40 * float(m.provisioned_power_w) / 1e3 and usd == 40 * float(m.cost_per_hour)


def test_headlines_name_known_designs_problems_and_metrics():
    class _Best:  # a stand-in answer: every metric the headlines use must be readable
        rate_per_s, cost_per_hour, provisioned_power_kw, prompt_machines, token_machines = 1.0, 1.0, 1.0, 1, 1

    class _Res:
        best = _Best()

    for h in paper.HEADLINES:
        assert h["design"] in sj.DESIGNS and h["reference"] in sj.DESIGNS
        assert h["problem"] in ("iso-power", "iso-cost", "cost", "power")
        assert np.isfinite(metric_of(_Res(), h["metric"]))
        assert h["paper"] > 0 and h["text"]
    for (d, ref), ratio in paper.NO_SLO_PER_DOLLAR.items():
        assert d in sj.DESIGNS and ref in paper.NO_SLO_RPS_PER_DOLLAR and ratio > 0
    assert paper.FIG12["prompt_machines"] + paper.FIG12["token_machines"] == 30
    assert set(paper.FIG20_LOSS) <= set(sj.DESIGNS)
