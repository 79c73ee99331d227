"""Reading trace files (cluster/trace_file.py): the NumPy reader of plain numeric CSVs
gives pandas' values to the last bit, and hands everything else to pandas."""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from conftest import SHARED, needs_shared
from splitwise_jax.cluster import trace_file
from splitwise_jax.cluster.trace_file import load_trace, read_trace_columns


def _pandas_columns(path) -> dict:
    return trace_file._read_with_pandas(path, f"trace {path}")


@needs_shared
@pytest.mark.parametrize("name", sorted(p.name for p in (SHARED / "validation" / "traces").glob("*.csv")))
def test_the_numpy_reader_reads_every_shared_trace_as_pandas_does(name):
    path = SHARED / "validation" / "traces" / name
    assert trace_file._numeric_table(path) is not None  # the fast path is the one taken
    got, want = read_trace_columns(path), _pandas_columns(path)
    assert list(got) == ["arrival_s", "prompt_tokens", "output_tokens"]
    for column in got:
        assert got[column].dtype == np.float64
        np.testing.assert_array_equal(got[column], want[column])  # bit for bit


def test_the_numpy_reader_parses_doubles_exactly(tmp_path):
    """Shortest round-trip and 21-digit spellings of 200,000 doubles over 17 decades."""
    x = np.exp(np.random.default_rng(0).uniform(-20.0, 20.0, 200_000)).tolist()
    path = tmp_path / "t.csv"
    lines = ["arrival_s,prompt_tokens,output_tokens"]
    lines += [f"{a!r},{b:.20e},3" for a, b in zip(np.cumsum(x).tolist(), np.asarray(x) + 1.0)]
    path.write_text("\n".join(lines) + "\n")
    got, want = read_trace_columns(path), _pandas_columns(path)
    assert trace_file._numeric_table(path) is not None
    for column in got:
        np.testing.assert_array_equal(got[column], want[column])
    np.testing.assert_array_equal(got["arrival_s"], np.cumsum(x))


@pytest.mark.parametrize("text", [
    "\ufeffarrival_s,prompt_tokens,output_tokens\n0.5,10,2\n",  # a byte-order mark
    '"arrival_s","prompt_tokens","output_tokens"\n0.5,10,2\n',  # quoted names
    'arrival_s,prompt_tokens,output_tokens\n"0.5",10,2\n',  # a quoted value
    "arrival_s,prompt_tokens,output_tokens\n7,0.5,10,2\n",  # a row one longer: pandas' index column
    "arrival_s,prompt_tokens,output_tokens,note\n0.5,10,2,hello\n",  # a text column
    "arrival_s,prompt_tokens,output_tokens\n0.5,10,2\n1.5,,2\n",  # an empty field
    "arrival_s,prompt_tokens,output_tokens\n0.5,10,2\n1.5,nan,2\n",  # not finite
    "arrival_s,prompt_tokens,output_tokens\n",  # no requests
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97996,10,2\n",  # Azure's text stamps
])
def test_anything_else_is_read_by_pandas(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8")
    assert trace_file._numeric_table(path) is None or "TIMESTAMP" in text
    try:
        want = load_trace(path)
    except ValueError as err:  # bad input: the same message either way
        with pytest.raises(ValueError) as got:
            read_trace_columns(path)
        assert str(got.value) == str(err)
    else:
        got = read_trace_columns(path)
        for column in want:
            np.testing.assert_array_equal(got[column], want[column].to_numpy())


def test_bad_numeric_traces_raise_the_checks_messages_without_pandas(tmp_path):
    """The checks of a plain numeric file run on the NumPy reader's columns."""
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n1.0,10,2\n0.5,10,2\n")
    with pytest.raises(ValueError, match="column arrival_s is not sorted"):
        read_trace_columns(path)
    path.write_text("arrival_s,prompt_tokens,output_tokens\n1.0,0,2\n")
    with pytest.raises(ValueError, match="column prompt_tokens must be >= 1 token"):
        read_trace_columns(path)
    path.write_text("request_id,request_type,application_id,arrival_timestamp,batch_size,prompt_size,token_size\n"
                    "0,1,0,0.5,1,10,2\n")
    with pytest.raises(ValueError, match="column request_type must be 2"):
        read_trace_columns(path)


def test_load_trace_is_still_a_dataframe(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0.5,10,2\n1.5,20,3\n")
    df = load_trace(path)
    assert isinstance(df, pd.DataFrame) and list(df.columns) == ["arrival_s", "prompt_tokens", "output_tokens"]
    assert df["prompt_tokens"].tolist() == [10.0, 20.0] and "pandas" in sys.modules
