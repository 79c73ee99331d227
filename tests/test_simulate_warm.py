"""A warm `python -m splitwise_jax.simulate` (cli/simulate_warm.py): the cluster's plan and
tables read back from disk, the run made without JAX, the output byte for byte the
full run's; and every way a record must not be used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SHARED, needs_shared
from splitwise_jax.cli import simulate_warm as warm
from splitwise_jax.simulate.__main__ import main

pytestmark = needs_shared  # the reference's traces and the sim table's profiles

TRACE = SHARED / "validation" / "traces" / "rr_code_70_2min.csv"
SMALL = ["--design", "splitwise-hh", "--prompt-machines", "4", "--token-machines", "2"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder of the command lines' own."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("SPLITWISE_JAX_CACHE", str(folder))
    return folder


def _trace(tmp_path, n=400, name="small.csv") -> Path:
    """The first n requests of the reference's coding trace (a short run)."""
    lines = TRACE.read_text().splitlines()
    path = tmp_path / name
    path.write_text("\n".join(lines[: n + 1]) + "\n")
    return path


def _run(capsys, argv) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def _no_timing(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("simulated in "))


def test_a_warm_run_prints_what_the_full_run_printed(cache, tmp_path, capsys):
    tr = _trace(tmp_path)
    for phases in ("splitwise-sim-table", "calibrated"):
        argv = [*SMALL, "--workload", str(tr), "--phase-model", phases]
        outs = {}
        for run in ("full", "warm"):
            req = tmp_path / f"req_{run}_{phases}.csv"
            mach = tmp_path / f"mach_{run}_{phases}.csv"
            hist = tmp_path / f"hist_{run}_{phases}.csv"
            text = _run(capsys, [*argv, "--requests-out", str(req), "--machines-out", str(mach),
                                 "--histogram-out", str(hist)])
            assert warm.LAST_MISS == ("no record" if run == "full" else None), phases
            outs[run] = (_no_timing(text), req.read_bytes(), mach.read_bytes(), hist.read_bytes(),
                         _run(capsys, [*argv, "--json"]))
        assert outs["warm"] == outs["full"], phases
        assert "simulated" in outs["warm"][0] and json.loads(outs["warm"][4])["pools"][0]["count"] == 4


def test_one_record_serves_other_traces_rates_and_seeds(cache, tmp_path, capsys):
    tr = _trace(tmp_path)
    other = _trace(tmp_path, 300, "other.csv")
    argv = [*SMALL, "--workload", str(tr), "--phase-model", "splitwise-sim-table", "--json"]
    _run(capsys, argv)
    for extra in (["--rate", "15"], ["--resample-poisson", "--rate", "20", "--horizon", "10", "--seed", "3"]):
        got = _run(capsys, [*argv, *extra])
        assert warm.LAST_MISS is None, extra
        # the same as a full run (no cache)
        assert got == _run(capsys, [*argv, *extra, "--no-cache"]), extra
    _run(capsys, [*SMALL, "--workload", str(other), "--phase-model", "splitwise-sim-table", "--json"])
    assert warm.LAST_MISS is None


_TABLE = ["--phase-model", "splitwise-sim-table", "--json"]


@pytest.mark.parametrize("argv, why", [
    (["--design", "splitwise-ha", *SMALL[2:], "--workload", "TRACE", *_TABLE], "no record"),  # another design
    ([*SMALL, "--workload", "TRACE", "--phase-model", "calibrated", "--json"], "no record"),
    ([*SMALL, "--workload", "TRACE", *_TABLE, "--rat", "15"], "no record"),  # an abbreviation: the full parser's
    ([*SMALL, "--workload", "coding", "--rate", "5", "--horizon", "10", *_TABLE], "not a trace file"),  # a preset
    ([*SMALL, "--trace", "TRACE", *_TABLE], "not a trace file"),  # the deprecated flag: the full path warns
    ([*SMALL, "--workload", "TRACE", *_TABLE, "--no-cache"], "--no-cache"),
])
def test_a_record_is_not_used_for_anything_else(cache, tmp_path, capsys, argv, why):
    tr = str(_trace(tmp_path))
    _run(capsys, [*SMALL, "--workload", tr, *_TABLE])
    main([tr if x == "TRACE" else x for x in argv])
    capsys.readouterr()
    assert warm.LAST_MISS == why


@pytest.mark.parametrize("design, first, other", [
    ("splitwise-hh", ["--prompt-machines", "4", "--token-machines", "2"],
     ["--prompt-machines", "3", "--token-machines", "5"]),
    ("splitwise-ha", ["--prompt-machines", "4", "--token-machines", "2"],
     ["--prompt-machines", "6", "--token-machines", "1"]),
    ("baseline-h100", ["--machines", "5"], ["--machines", "7"]),
])
def test_one_record_serves_other_machine_counts(cache, tmp_path, capsys, design, first, other):
    """A record answers for any counts of the same design: the plan's pool sizes, the
    pools' objects, the title and the pool lines written anew; output byte for byte a
    full run's (no cache), text and JSON."""
    tr = str(_trace(tmp_path))
    base = ["--design", design, "--workload", tr, "--phase-model", "splitwise-sim-table"]
    _run(capsys, [*base, *first, "--json"])
    assert warm.LAST_MISS == "no record"
    for extra in (["--json"], []):
        got = _run(capsys, [*base, *other, *extra])
        assert warm.LAST_MISS is None, (design, extra)
        full = _run(capsys, [*base, *other, *extra, "--no-cache"])
        assert _no_timing(got) == _no_timing(full), (design, extra)
    counts = [float(x) for x in other[1::2]]
    assert [p["count"] for p in json.loads(_run(capsys, [*base, *other, "--json"]))["pools"]] == counts


def test_a_count_flag_the_design_does_not_take_is_still_an_error(cache, tmp_path, capsys):
    """Which count flags were given is part of the key: --machines on a Splitwise design
    finds no record and the full path reports the misuse."""
    tr = str(_trace(tmp_path))
    _run(capsys, [*SMALL, "--workload", tr, *_TABLE])
    with pytest.raises(SystemExit) as e:
        main(["--design", "splitwise-hh", "--machines", "4", "--workload", tr, *_TABLE])
    assert e.value.code == 2 and warm.LAST_MISS == "no record"
    assert "needs --prompt-machines P and --token-machines T" in capsys.readouterr().err


def test_a_changed_input_file_is_read_again(cache, tmp_path, capsys):
    """A file the full run read (here a design file) is recorded with its size and
    time; a record whose file changed is not used."""
    design = tmp_path / "d.toml"
    design.write_text('name = "mine"\n[[pool]]\nrole = "prompt"\nmachine = "dgx-h100"\ncount = 4\n'
                      '[[pool]]\nrole = "token"\nmachine = "dgx-h100"\ncount = 2\n')
    tr = _trace(tmp_path)
    argv = ["--design-file", str(design), "--workload", str(tr), "--json"]
    first = json.loads(_run(capsys, argv))
    _run(capsys, argv)
    assert warm.LAST_MISS is None
    design.write_text(design.read_text().replace("count = 2", "count = 3"))
    os.utime(design, ns=(design.stat().st_atime_ns, design.stat().st_mtime_ns + 10**9))
    changed = json.loads(_run(capsys, argv))
    assert warm.LAST_MISS.startswith("changed: ") and warm.LAST_MISS.endswith("d.toml")
    assert changed["pools"][1]["count"] == 3 and first["pools"][1]["count"] == 2


def test_a_warm_process_imports_neither_jax_nor_pandas(cache, tmp_path):
    tr = _trace(tmp_path)
    argv = [*SMALL, "--workload", str(tr), "--phase-model", "splitwise-sim-table", "--json"]
    env = dict(os.environ, SPLITWISE_JAX_CACHE=str(cache))
    full = subprocess.run([sys.executable, "-m", "splitwise_jax.simulate", *argv], capture_output=True, text=True,
                          env=env, check=True)
    code = ("import sys\nfrom splitwise_jax.simulate.__main__ import main\nfrom splitwise_jax.cli import simulate_warm as warm\n"
            f"main({argv!r})\nassert warm.LAST_MISS is None, warm.LAST_MISS\n"
            "assert 'jax' not in sys.modules, 'JAX was imported'\n"
            "assert 'pandas' not in sys.modules, 'pandas was imported'\n")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert got.returncode == 0, got.stderr
    assert got.stdout == full.stdout


def test_bad_input_on_a_warm_cache_is_reported_as_before(cache, tmp_path, capsys):
    tr = _trace(tmp_path)
    argv = [*SMALL, "--workload", str(tr), "--phase-model", "splitwise-sim-table", "--json"]
    _run(capsys, argv)
    for bad, flag in ((["--rate", "-3"], "--rate"), (["--horizon", "5"], "--horizon"),
                      (["--requests-out", str(tmp_path / "no" / "r.csv")], "--requests-out")):
        with pytest.raises(SystemExit) as e:
            main([*argv, *bad])
        assert e.value.code == 2
        assert flag in capsys.readouterr().err
