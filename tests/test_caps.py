"""`splitwise_jax.phases._caps.cap_floor_frac`: the one definition of the power-cap floor."""

from __future__ import annotations

import numpy as np
import pytest

from splitwise_jax.specs import catalog
from splitwise_jax.phases._caps import cap_floor_frac
from splitwise_jax.cluster.designs import make_cluster
from splitwise_jax.optimize import Problem
from splitwise_jax.optimize.spec import make_spec
from splitwise_jax.cluster.workload import coarsen, workload


def test_h100_floor_is_min_cap_over_tdp():
    gpu = catalog.get_gpu("h100-80gb")
    assert cap_floor_frac(gpu) == pytest.approx(200.0 / 700.0, rel=1e-15)  # catalogue: 200 W of 700 W


def test_every_catalogue_gpu_has_a_floor_in_0_1():
    for name in catalog.gpu_names():
        f = float(cap_floor_frac(catalog.get_gpu(name)))
        assert 0.0 < f <= 1.0, name


def test_the_optimiser_bounds_free_caps_by_the_floor():
    wl = coarsen(workload("coding", 10.0), 4, 4)
    c = make_cluster("splitwise-hhcap", 1.0, 1.0)
    spec, info = make_spec(c, wl, Problem("power", free_caps="both"))
    floor = float(cap_floor_frac(c.token.machine.gpu))
    np.testing.assert_allclose(np.asarray(spec.cap_lo), [floor, floor], rtol=1e-15)
    assert info.cap_lo == (floor, floor)
