"""Tests for the predict command: round trip through a subprocess, and clear errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from splitwise_jax.calibrate import Fitted, predict_frame
from splitwise_jax.predict import QUERY_COLUMNS, main, validate_queries

QUERIES = pd.DataFrame({
    "model": ["bloom-176b", "llama2-70b", "llama2-70b", "llama2-70b"],
    "hardware": ["a100-80gb", "h100-80gb", "h100-80gb-pcap", "a100-80gb"],
    "tensor_parallel": [8, 4, 4, 2],
    "prompt_size": [512, 2048, 2048, 1500],
    "batch_size": [4, 1, 1, 16],
    "token_size": [128, 256, 256, 100],
    "note": ["a", "b", "c", "d"],  # extra columns pass through
})


def test_predict_command_round_trips_a_queries_csv(tmp_path):
    q, out = tmp_path / "q.csv", tmp_path / "out.csv"
    QUERIES.to_csv(q, index=False)
    res = subprocess.run([sys.executable, "-m", "splitwise_jax.predict", "--queries", str(q), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    got = pd.read_csv(out)
    assert list(got.columns) == list(QUERIES.columns) + ["prompt_time", "token_time"]
    pd.testing.assert_frame_equal(got[QUERIES.columns], QUERIES)
    # same numbers as the library (the CSV keeps ~17 significant digits)
    ref = predict_frame(Fitted.load(), validate_queries(QUERIES))
    np.testing.assert_allclose(got["prompt_time"], ref["prompt_time"], rtol=1e-12)
    np.testing.assert_allclose(got["token_time"], ref["token_time"], rtol=1e-12)
    # the 70% cap slows the prompt, not the decode (same configuration, rows 1 and 2)
    assert got["prompt_time"][2] > 1.1 * got["prompt_time"][1]
    assert got["token_time"][2] == pytest.approx(got["token_time"][1], rel=0.02)


def test_bad_query_exits_2_from_the_process(tmp_path):
    q = tmp_path / "q.csv"
    QUERIES.assign(model=["gpt-5"] * 4).to_csv(q, index=False)
    res = subprocess.run([sys.executable, "-m", "splitwise_jax.predict", "--queries", str(q), "--out",
                          str(tmp_path / "o.csv")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert "unknown model 'gpt-5'" in res.stderr and "llama2-70b" in res.stderr
    assert not (tmp_path / "o.csv").exists()


@pytest.mark.parametrize("change,message", [
    (lambda d: d.assign(hardware="tpu-v5"), "unknown hardware 'tpu-v5'"),
    (lambda d: d.drop(columns=["token_size"]), "lacks column(s) ['token_size']"),
    (lambda d: d.assign(batch_size=[4, -1, 1, 16]), "'batch_size' must hold positive integers"),
    (lambda d: d.assign(prompt_size=[512, 2048.5, 2048, 1500]), "'prompt_size' must hold positive integers"),
    (lambda d: d.assign(tensor_parallel=[16, 4, 4, 2]), "exceeds the 8 GPUs"),
    (lambda d: d.iloc[:0], "no rows"),
])
def test_bad_queries_exit_2_with_a_message(tmp_path, capsys, change, message):
    q = tmp_path / "q.csv"
    change(QUERIES).to_csv(q, index=False)
    assert _exit_code(["--queries", str(q), "--out", str(tmp_path / "o.csv")]) == 2
    assert message in capsys.readouterr().err


def _exit_code(argv) -> int:
    """main's exit status: argparse's error raises SystemExit(2)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_bad_arguments_exit_2(tmp_path, capsys):
    q = tmp_path / "q.csv"
    QUERIES.to_csv(q, index=False)
    assert _exit_code(["--queries", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "o.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert _exit_code(["--queries", str(q), "--out", str(tmp_path / "o.csv"),
                       "--params", str(tmp_path / "x.json")]) == 2
    assert "--params" in capsys.readouterr().err
    assert _exit_code(["--queries", str(q), "--out", str(tmp_path / "nodir" / "o.csv")]) == 2
    assert _exit_code(["--queries", str(q)]) == 2  # argparse: a required flag missing
    assert set(QUERY_COLUMNS) <= set(QUERIES.columns)
