"""The package's public surface: `sj.evaluate` stays the model function when the
same-named command-line module is imported, and the CLI modules still run with -m.

Each check runs in a fresh interpreter: the defect only shows when the CLI module is
imported for the first time after the package, which pytest's own imports would hide.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_importing_the_cli_module_keeps_the_evaluate_function():
    proc = _run("""
        import types
        import splitwise_jax as sj
        before = sj.evaluate
        import splitwise_jax.evaluate  # the CLI module of the same name
        assert sj.evaluate is before, type(sj.evaluate)
        assert callable(sj.evaluate) and isinstance(sj.evaluate, types.FunctionType)
        assert not isinstance(sj.evaluate, types.ModuleType)
        # The CLI module is still importable by its name.
        from splitwise_jax.evaluate import main
        import sys
        assert sys.modules["splitwise_jax.evaluate"].main is main
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_cli_imported_first_keeps_the_function_too():
    """`import splitwise_jax.evaluate` as the very first import (the package's
    __init__ runs inside it)."""
    proc = _run("""
        import types
        import splitwise_jax.evaluate
        import splitwise_jax as sj
        assert isinstance(sj.evaluate, types.FunctionType), type(sj.evaluate)
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_simulator_names_load_on_first_use():
    """The simulator's names (`sj.simulate`, `sj.SimConfig`, ...) load when first read
    (the package's `__getattr__`), and `sj.simulate` is the function whether or not the
    `splitwise_jax.simulate` package was imported before."""
    proc = _run("""
        import sys, types
        import splitwise_jax as sj
        assert "splitwise_jax.simulate" not in sys.modules
        assert {"simulate", "SimConfig", "RequestTrace", "trace_from_csv", "poisson_trace"} <= set(dir(sj))
        f = sj.simulate
        assert isinstance(f, types.FunctionType), type(f)
        import splitwise_jax.simulate  # the same-named package does not replace it
        from splitwise_jax.simulate.api import simulate
        assert sj.simulate is f is simulate
        from splitwise_jax import SimConfig, poisson_trace
        from splitwise_jax.simulate.policies import SimConfig as direct
        assert SimConfig is direct and callable(poisson_trace)
        try:
            sj.no_such_name
        except AttributeError as err:
            assert "no_such_name" in str(err)
        else:
            raise AssertionError("no AttributeError")
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr
    proc = _run("""
        import types
        import splitwise_jax.simulate
        import splitwise_jax as sj
        assert isinstance(sj.simulate, types.FunctionType), type(sj.simulate)
        print("ok")
    """)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr


def test_model_command_lines_do_not_import_the_table_libraries():
    """`evaluate` and `optimize` start without pandas, scipy, the simulator or the
    calibration package: together ~0.3-0.5 s of every run's start on the 2-core machine
    (docs/speed.md §4, "JAX's import"). They load where used (traces, profiles, tables)."""
    proc = _run("""
        import sys
        import splitwise_jax.evaluate, splitwise_jax.optimize.cli, splitwise_jax.uncertainty
        loaded = [m for m in ("pandas", "scipy", "splitwise_jax.simulate", "splitwise_jax.calibrate")
                  if m in sys.modules]
        print("loaded:", loaded)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "loaded: []" in proc.stdout, proc.stdout


def test_other_attributes_are_still_settable():
    """Only protected names holding a function refuse a module; everything else binds."""
    import types

    import splitwise_jax as sj

    sentinel = types.ModuleType("x")
    sj._test_attribute = sentinel
    try:
        assert sj._test_attribute is sentinel
    finally:
        del sj._test_attribute


@pytest.mark.parametrize("module", ["evaluate", "optimize", "calibrate", "predict"])
def test_cli_modules_run_with_dash_m(module):
    proc = subprocess.run([sys.executable, "-m", f"splitwise_jax.{module}", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"python -m splitwise_jax.{module}" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("env, expected", [
    ({}, "--xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=1"),
    # a user's own setting of a flag wins, and other flags are kept
    ({"XLA_FLAGS": "--xla_cpu_use_fusion_emitters=true --xla_force_host_platform_device_count=2"},
     "--xla_cpu_use_fusion_emitters=true --xla_force_host_platform_device_count=2 --xla_backend_optimization_level=1"),
    ({"XLA_FLAGS": "--xla_backend_optimization_level=0"},
     "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"),
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
     "--xla_force_host_platform_device_count=2 --xla_cpu_use_fusion_emitters=false --xla_backend_optimization_level=1"),
    ({"SPLITWISE_XLA_DEFAULTS": "1"}, ""),
])
def test_cli_compile_policy_sets_its_flags_unless_told_otherwise(env, expected):
    """`_cli.fast_compile` (every CLI's first lines) adds the loop-emitter and -O1 flags to
    XLA_FLAGS before JAX starts its backend, and only then."""
    code = textwrap.dedent("""
        import os
        from splitwise_jax.cli import _cli
        _cli.fast_compile()
        print(os.environ.get("XLA_FLAGS", ""))
        import jax.numpy as jnp
        jnp.zeros(1).block_until_ready()           # the backend has started: too late now
        os.environ["XLA_FLAGS"] = "x"
        _cli.fast_compile()
        print(os.environ["XLA_FLAGS"])
    """)
    base = {k: v for k, v in __import__("os").environ.items() if k not in ("XLA_FLAGS", "SPLITWISE_XLA_DEFAULTS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**base, **env}, check=True)
    first, second = out.stdout.splitlines()
    assert first == expected
    assert second == "x"
