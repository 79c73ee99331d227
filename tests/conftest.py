"""Suite-wide set-up: float64, the shared-data skip marker, one compilation cache.

One JAX persistent compilation cache serves the whole test session (a fresh temporary
folder per session, so CI's cold start is what is measured here too): every pytest-xdist
worker and every subprocess a test starts (CLIs, study scripts, notebook kernels) reads
and writes it, so a program that several tests build - the same design evaluated at the
same resolution - is compiled once per session, not once per test and process. The
cache is keyed by the program text and JAX's flags, so it can never return a program for
different code. `SPLITWISE_TEST_JAX_CACHE` names a folder to reuse across sessions
instead (local iteration; CI leaves it unset).

The suite compiles far more than it runs (a gradient of the whole cluster model is ~30 s
of XLA compilation and ~0.2 s of running), so it compiles with LLVM's optimisation
level 0 (`--xla_backend_optimization_level=0`, set before JAX starts its backend and
inherited by every subprocess): measured on the 2-core machine, a gradient program
compiles in 47 s instead of 81 s (loaded machine; 35 vs 41 s idle) and runs 7% slower.
The operations are the same (no fast-math either way), but the generated exp/log/pow
code differs in the last 2-3 bits (tests/test_phases.py's pins allow 4 ulp for it);
users' runs keep XLA's default.
`SPLITWISE_TEST_XLA_OPT=1` turns this off.
"""

import os
import shutil
import tempfile

if os.environ.get("SPLITWISE_TEST_XLA_OPT", "") in ("", "0"):
    _flag = "--xla_backend_optimization_level=0"
    if _flag not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402
import pytest

jax.config.update("jax_enable_x64", True)

from splitwise_jax._paths import shared_dir  # noqa: E402

SHARED = shared_dir()
needs_shared = pytest.mark.skipif(
    SHARED is None,
    reason="../shared (measured profiles, traces, reference runs) is absent; set SPLITWISE_SHARED to run",
)

_CACHE_ENV = "SPLITWISE_TEST_JAX_CACHE"
# Programs that compile faster than this are not worth a file (eager per-operation ones).
_MIN_COMPILE_S = "0.1"


def pytest_configure(config):
    # The controller (or a plain run) picks the folder; xdist workers and subprocesses
    # inherit it through the environment.
    if not os.environ.get(_CACHE_ENV):
        os.environ[_CACHE_ENV] = tempfile.mkdtemp(prefix="splitwise_jax_test_cache_")
        config._splitwise_cache_to_remove = os.environ[_CACHE_ENV]
    path = os.environ[_CACHE_ENV]
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = _MIN_COMPILE_S
    os.environ["SPLITWISE_JAX_CACHE"] = path  # the CLIs' own cache policy (_cli.enable_cache)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(_MIN_COMPILE_S))


def pytest_unconfigure(config):
    path = getattr(config, "_splitwise_cache_to_remove", None)
    if path:
        shutil.rmtree(path, ignore_errors=True)
