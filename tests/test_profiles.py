"""Tests for splitwise_jax.phases.profiles: loading, validation, medians, outlier flags."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from conftest import needs_shared

from splitwise_jax.phases.profiles import (
    CONFIG_KEYS,
    REQUIRED_COLUMNS,
    flag_outliers,
    load_profiles,
    profile_medians,
    validate_profiles,
)

# --------------------------------------------------------------------------------------
# Synthetic tables (no shared data needed)


def _synthetic_rows(levels=(128, 256, 512, 1024, 2048), repeats=3, spike_at=None, spike=1.0) -> pd.DataFrame:
    """A smooth series at batch 1: prompt ~ 50 + 0.3 ms/token, token ~ 40 ms, A100-like power."""
    rows = []
    for p in levels:
        for r in range(repeats):
            jitter = 1.0 + 0.01 * r
            prompt = (50.0 + 0.3 * p) * jitter * (spike if p == spike_at else 1.0)
            rows.append(
                dict(model="m", hardware="hw", prompt_size=p, batch_size=1, token_size=128,
                     peak_power=0.9, average_power=0.7, prompt_time=prompt, token_time=40.0 * jitter,
                     e2e_time=prompt + 128 * 40.0, tensor_parallel=8)
            )
    return pd.DataFrame(rows, columns=list(REQUIRED_COLUMNS))


def test_validate_adds_derived_columns():
    df = validate_profiles(_synthetic_rows())
    np.testing.assert_array_equal(df["batch_tokens"], df["prompt_size"] * df["batch_size"])
    np.testing.assert_allclose(df["prompt_time_s"], df["prompt_time"] / 1000.0, rtol=0, atol=0)
    np.testing.assert_allclose(df["token_time_s"], df["token_time"] / 1000.0, rtol=0, atol=0)
    assert df["config_id"].nunique() == 5
    assert (df.groupby("config_id").size() == 3).all()
    assert df["power_measured"].all()


def test_zero_power_means_not_measured():
    raw = _synthetic_rows()
    raw.loc[:2, ["peak_power", "average_power"]] = 0.0
    df = validate_profiles(raw)
    assert not df.loc[:2, "power_measured"].any() and df.loc[3:, "power_measured"].all()
    assert df.loc[:2, "peak_power_frac"].isna().all() and df.loc[:2, "average_power_frac"].isna().all()
    med = profile_medians(df)
    assert np.isnan(med.loc[0, "peak_power_frac"]) and np.isfinite(med.loc[1, "peak_power_frac"])


def _write(tmp_path, df: pd.DataFrame, text_edit=None):
    path = tmp_path / "perf_model.csv"
    df.to_csv(path, index=False)
    if text_edit is not None:
        path.write_text(text_edit(path.read_text()))
    return path


@pytest.mark.parametrize(
    "column, corrupt",
    [
        ("token_time", lambda df: df.drop(columns="token_time")),  # missing column
        ("prompt_time", lambda df: df.assign(prompt_time=df["prompt_time"].where(df.index != 4))),  # NaN
        ("token_time", lambda df: df.assign(token_time=df["token_time"].where(df.index != 2, -1.0))),  # negative
        ("e2e_time", lambda df: df.assign(e2e_time=df["e2e_time"].where(df.index != 0, 0.0))),  # zero time
        ("batch_size", lambda df: df.assign(batch_size=df["batch_size"].astype(object).where(df.index != 7, "abc"))),
        ("prompt_size", lambda df: df.assign(prompt_size=df["prompt_size"].where(df.index != 3, 0))),  # zero size
        ("tensor_parallel", lambda df: df.assign(tensor_parallel=df["tensor_parallel"].where(df.index != 1, 2.5))),
        ("peak_power", lambda df: df.assign(peak_power=df["peak_power"].where(df.index != 5, -0.1))),
        ("model", lambda df: df.assign(model=df["model"].where(df.index != 6, ""))),  # empty name
    ],
)
def test_malformed_csv_raises_naming_the_column(tmp_path, column, corrupt):
    path = _write(tmp_path, corrupt(_synthetic_rows()))
    with pytest.raises(ValueError, match=re.escape(repr(column))):
        load_profiles(path)


def test_error_reports_count_and_first_row(tmp_path):
    raw = _synthetic_rows()
    raw.loc[[4, 9], "prompt_time"] = -3.0
    with pytest.raises(ValueError, match=r"'prompt_time'.*2 row\(s\) \(first: data row 4, file line 6\)"):
        load_profiles(_write(tmp_path, raw))


def test_non_numeric_names_the_value(tmp_path):
    path = _write(tmp_path, _synthetic_rows(), lambda t: t.replace(",40.0,", ",forty,", 1))
    with pytest.raises(ValueError, match=r"'token_time'.* must be numeric; non-numeric value 'forty'.*data row 0"):
        load_profiles(path)


def test_profile_medians_on_synthetic():
    med = profile_medians(validate_profiles(_synthetic_rows()))
    assert len(med) == 5 and (med["n_repeats"] == 3).all() and (med["n_rows"] == 3).all()
    # repeats are x1.00, x1.01, x1.02: median x1.01, spread 1.02/1.00 - 1.
    np.testing.assert_allclose(med["token_time"], 40.4, rtol=1e-12)
    np.testing.assert_allclose(med["token_time_spread"], 0.02, rtol=1e-9)


def test_duplicate_rows_counted_as_rows_not_repeats():
    raw = _synthetic_rows()
    raw = pd.concat([raw, raw[raw["prompt_size"] == 512]], ignore_index=True)
    med = profile_medians(validate_profiles(raw)).set_index("prompt_size")
    assert med.loc[512, "n_rows"] == 6 and med.loc[512, "n_repeats"] == 3


def test_flag_outliers_synthetic_spike_flags_only_the_spike():
    # A 10x-low prompt time at 1024 tokens; its neighbours (512 and 2048) must stay clean.
    med = profile_medians(validate_profiles(_synthetic_rows(spike_at=1024, spike=0.1)))
    flags = flag_outliers(med)
    assert flags["prompt_size"].tolist() == [1024]
    assert flags["metric"].tolist() == ["prompt_time_per_token_ms"]
    assert "below" in flags["reason"].iloc[0]
    # A 3x spike is within the threshold (legitimate adjacent levels differ by up to 2.3x).
    assert flag_outliers(profile_medians(validate_profiles(_synthetic_rows(spike_at=1024, spike=3.0)))).empty
    with pytest.raises(ValueError, match="factor"):
        flag_outliers(med, factor=1.0)


# --------------------------------------------------------------------------------------
# The shipped file


@pytest.fixture(scope="module")
def profiles():
    return load_profiles()


@needs_shared
def test_loads_all_rows(profiles):
    assert len(profiles) == 1260
    assert set(REQUIRED_COLUMNS) <= set(profiles.columns)
    for col in ("prompt_size", "batch_size", "token_size", "tensor_parallel", "batch_tokens", "config_id"):
        assert profiles[col].dtype == np.int64, col
    assert set(profiles["hardware"]) == {"a100-80gb", "h100-80gb", "h100-80gb-pcap"}


@needs_shared
def test_configuration_count(profiles):
    # 1,260 rows = 252 blocks of 5 repeats, but the block prompt 512 x batch 1 x token 128
    # appears three times verbatim in each of the 12 series: 252 - 2 * 12 = 228 configs.
    med = profile_medians(profiles)
    assert profiles["config_id"].nunique() == 228 == len(med)
    assert (med["n_repeats"] == 5).all()
    tripled = med[med["n_rows"] == 15]
    assert len(tripled) == 12
    assert set(zip(tripled["prompt_size"], tripled["batch_size"], tripled["token_size"])) == {(512, 1, 128)}
    assert med["n_rows"].sum() == 1260
    assert med.duplicated(subset=list(CONFIG_KEYS)).sum() == 0


@needs_shared
def test_power_measured_only_on_a100(profiles):
    assert not profiles.loc[profiles["hardware"] != "a100-80gb", "power_measured"].any()
    assert profiles.loc[profiles["hardware"] == "a100-80gb", "power_measured"].any()


@needs_shared
def test_medians_and_spread_match_a_hand_computation(profiles):
    med = profile_medians(profiles)
    sel = (profiles["model"] == "bloom-176b") & (profiles["hardware"] == "a100-80gb") & (
        profiles["prompt_size"] == 2048
    )
    rows = profiles[sel]
    row = med[med["config_id"] == rows["config_id"].iloc[0]].iloc[0]
    assert row["prompt_time"] == rows["prompt_time"].median()
    assert row["prompt_time"] == pytest.approx(540.411861, abs=1e-6)
    assert row["token_time_spread"] == rows["token_time"].max() / rows["token_time"].min() - 1


@needs_shared
def test_outlier_flag_catches_llama2_70b_tp2_batch_64(profiles):
    flags = flag_outliers(profile_medians(profiles))
    # Exactly the known artefact, on all three hardware kinds, and nothing else.
    assert set(flags["hardware"]) == {"a100-80gb", "h100-80gb", "h100-80gb-pcap"}
    assert (flags["model"] == "llama2-70b").all()
    assert (flags["tensor_parallel"] == 2).all()
    assert (flags["batch_size"] == 64).all() and (flags["prompt_size"] == 512).all()
    assert (flags["metric"] == "prompt_time_per_token_ms").all()
    assert (flags["ratio"] < 1 / 10).all()  # ~13-17x below its neighbours
    assert flags["reason"].str.contains("below its neighbours").all()
