"""The drafts' spike in the mixed pool's peak (`flows_splitwise._draft_spike`, issue 39).

On by default (`DRAFT_SPIKES`, with the drafting regime, the first-step wait and the
cascade's pass it goes with; the thirty-second session). The tests set the switches
they need for themselves, each under a jit of its own (the switches are read when a
program is traced), so that they keep checking the spike if a default changes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SHARED, needs_shared, study_module

from splitwise_jax.cluster import flows_splitwise as fs
from splitwise_jax.cluster.cluster import _classes, evaluate
from splitwise_jax.cluster.designs import make_cluster
from splitwise_jax.cluster.percentiles import Resolution
from splitwise_jax.cluster.workload import workload


def _switch_on(monkeypatch):
    for name in ("BALKING_DRAFTS", "TOKEN_FIRST_WAIT", "CASCADE_PASS", "DRAFT_SPIKES"):
        monkeypatch.setattr(fs, name, True)


def test_on_by_default():
    assert fs.DRAFT_SPIKES is True


@needs_shared
def test_the_drained_token_pool_moves_decodes_as_the_reference_does(monkeypatch):
    """Splitwise-HH 22 + 3 and 20 + 4 on coding at 60 req/s (reference timing): the
    reference ran 46 % and 41 % of its decodes on prompt machines and drafted 0.82 % and
    1.9 % of its prompts (its per-request records); both fail the SLOs. Without the
    spike the same switches move 35 % and 11 % (the thirtieth session's blocker); with
    it 55 % and 37 %, drafting 0.96 % and 1.9 %. Tolerance 25 % on both shares, as
    tests/test_cluster.py's drained-pool check (the cascade's constant was read off five
    runs that gave 6-9, and two seeds of our simulator at 20 + 4 moved 31 % and 48 %);
    the verdicts exactly."""
    _switch_on(monkeypatch)
    vc, dc = study_module("validate_cluster"), study_module("drafting_check")
    runs = vc.load_runs()
    fn = jax.jit(lambda c, w: evaluate(c, w, vc.HORIZON_S))
    wl = workload("coding", 60.0)
    for n_p, n_t in ((22, 3), (20, 4)):
        row = runs[(runs["trace"] == "") & (runs["design"] == "splitwise-hh") & (runs["workload"] == "code")
                   & (runs["rate"] == 60.0) & (runs["prompt_machines"] == n_p)
                   & (runs["token_machines"] == n_t)].iloc[0]
        ref = dc.reference_row(SHARED / "validation" / "boundary_per_request"
                               / f"splitwise-hh_P{n_p}T{n_t}_code60_bloom-176b.csv.gz")
        m = fn(vc.cluster_of_run(row, "splitwise-sim-table"), wl)
        assert float(m.mixed_decode_frac) == pytest.approx(ref["ref_moved"], rel=0.25), (n_p, n_t, ref)
        assert float(m.mixed_prompt_frac) == pytest.approx(ref["ref_drafted"], rel=0.25), (n_p, n_t, ref)
        assert bool(m.meets_slo) is bool(row["meets_slo"]) is False


def _spike(rate):
    """`_draft_spike` of Splitwise-HH 20 + 4 on coding, from the steps it reads."""
    wl = workload("coding", 60.0)
    c, cls = make_cluster("splitwise-hh", 20.0, 4.0), _classes(wl)
    s = fs._setup(c, cls, rate, jnp.asarray(wl.arrival_cv2, float), 120.0, Resolution(), 120.0)
    d = fs._step1_drafting(s)
    return fs._draft_spike(s, d, fs._step2_reservations(s, d))


def test_the_spike_is_smooth_and_vanishes_without_drafts(monkeypatch):
    # Light load drafts nothing, so no spike; near the pool's capacity drafts come in
    # bursts; the derivative in the rate is finite across (the law is a product of
    # smooth pieces).
    _switch_on(monkeypatch)
    value_and_grad = jax.jit(jax.value_and_grad(_spike))
    light, g_light = value_and_grad(jnp.asarray(5.0))
    busy, g_busy = value_and_grad(jnp.asarray(75.0))
    assert float(light) < 1e-3 * float(busy)
    assert float(busy) > 0.0
    assert np.isfinite(float(g_light)) and np.isfinite(float(g_busy))
