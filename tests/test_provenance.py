"""Tests for splitwise_jax.phases.provenance: calibrated vs transferred parameters, said out loud."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from splitwise_jax.specs import catalog
from splitwise_jax.phases.params import PRIOR, load_params
from splitwise_jax.phases.provenance import (
    HELD_OUT_ERRORS_FILE,
    calibrated_gpus,
    nearest_calibrated_gpu,
    params_for,
    provenance,
    summarise_errors_csv,
)

ERRORS_CSV = Path(__file__).parent.parent / "calibration" / "errors.csv"


def test_shipped_error_table_is_the_one_errors_csv_gives():
    """The one data constant is derived from calibration/errors.csv, not retyped."""
    shipped = json.loads(HELD_OUT_ERRORS_FILE.read_text())["mape_pct"]
    assert shipped == summarise_errors_csv(ERRORS_CSV)
    # and it is the table calibration/README.md prints (one decimal there)
    assert round(shipped["spec_transfer"]["h100-80gb"]["prompt"], 1) == 9.7
    assert round(shipped["spec_transfer"]["h100-80gb"]["token"], 1) == 4.6


def test_the_profiled_gpus_are_calibrated():
    assert set(calibrated_gpus()) == {"a100-80gb", "h100-80gb"}
    for g in ("a100-80gb", "h100-80gb"):
        params, prov = params_for(g)
        assert prov.kind == "calibrated" and prov.label == "calibrated" and prov.source_gpu == g
        assert params == load_params(g)
        assert 0 < prov.expected_prompt_mape_pct < 10 and 0 < prov.expected_token_mape_pct < 10


@pytest.mark.parametrize("gpu", ["h200-141gb", "b200-180gb", "mi300x-192gb"])
def test_other_gpus_transfer_from_the_nearest_calibrated_one_and_say_so(gpu):
    params, prov = params_for(gpu)
    assert prov.kind == "transferred" and prov.source_gpu == "h100-80gb"
    assert prov.label == "transferred-from:h100-80gb"
    assert params == load_params("h100-80gb")
    table = json.loads(HELD_OUT_ERRORS_FILE.read_text())["mape_pct"]["spec_transfer"]
    assert prov.expected_mape_pct() == (table["h100-80gb"]["prompt"], table["h100-80gb"]["token"])
    # the cap model transfers worse: split (c)'s capped H100 rows
    assert prov.expected_mape_pct(capped=True)[0] == table["h100-80gb-pcap"]["prompt"]
    assert prov.expected_prompt_mape_capped_pct > prov.expected_prompt_mape_pct


def test_nearest_is_by_spec_sheet():
    a100 = catalog.get_gpu("a100-80gb")
    slow = a100.__class__(**{**{f: getattr(a100, f) for f in ("hbm_bytes", "tdp_w", "idle_w", "min_cap_w")},
                             "peak_flops_per_s": 0.9 * a100.peak_flops_per_s,
                             "hbm_bw_bytes_per_s": 0.8 * a100.hbm_bw_bytes_per_s}, name="a100-40gb-ish")
    assert nearest_calibrated_gpu(slow) == "a100-80gb"
    assert provenance(slow).label == "transferred-from:a100-80gb"  # an unregistered GPU object works too


def test_notes_say_what_the_profiles_do_not_cover():
    assert provenance("h100-80gb", catalog.get_llm("llama2-70b")).notes == ()
    notes = " ".join(provenance("h100-80gb", catalog.get_llm("deepseek-v3")).notes)
    assert "fp8" in notes and "MoE" in notes and "MLA" in notes


def test_params_files_without_gpu_fits(tmp_path):
    prior = tmp_path / "prior.json"
    prior.write_text(json.dumps({"shared": PRIOR.to_dict(), "per_gpu": {}, "meta": {}}))
    params, prov = params_for("h200-141gb", path=prior)
    assert prov.kind == "prior" and params == PRIOR and math.isnan(prov.expected_prompt_mape_pct)
    shared = tmp_path / "shared.json"
    shared.write_text(json.dumps({"shared": PRIOR.replace(mfu_max=0.5).to_dict(), "per_gpu": {}, "meta": {}}))
    params, prov = params_for("h100-80gb", path=shared)
    assert prov.kind == "shared" and prov.label == "shared" and params.mfu_max == 0.5
