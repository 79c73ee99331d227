"""The outer edge shared by every command line: one precision policy, one exit style.

Precision: every CLI computes in float64. `float64()` switches JAX to it and must run
before the first workload, cluster or parameter array is built (arrays made earlier
stay float32 inside a float64 run); each `main` calls it on its first line. Latency
percentiles span 10 ms to minutes and the optimiser and the fit take logs of them, so
float32's 7 digits would show in printed numbers (1142.4000244140625) and in answers.

Exit style: a bad argument or input file ends the program through argparse's `error`:
usage and ``prog: error: <message>`` on stderr, exit status 2, no traceback. Messages
name the argument (``--rate``, ``--queries FILE``) and say what is accepted. Library
code raises ValueError (or OSError for files) with such a message; `input_errors`
turns those raised while reading and checking inputs into the exit above. Errors
after the inputs are accepted are bugs and keep their traceback.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, NoReturn

# JAX is imported where it is used, not here: a warm `python -m splitwise_jax.simulate`
# parses its arguments and runs without it (cli/simulate_warm.py).


def process_seconds() -> float:
    """Seconds since this process started (interpreter start, imports included), read
    from Linux's /proc; elsewhere (or if /proc cannot be read) since this module was
    imported."""
    try:
        with open("/proc/self/stat") as fh:
            started = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22: start time, clock ticks
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return max(uptime - started / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _IMPORTED


_IMPORTED = time.perf_counter()


def float64() -> None:
    """Compute in float64 from here on (the precision policy of every CLI)."""
    import jax

    jax.config.update("jax_enable_x64", True)


def preamble() -> None:
    """The first line of every command line's `main`: float64 (`float64`) and XLA:CPU's
    loop emitters (`fast_compile`), before any array is built or JAX starts its backend."""
    float64()
    fast_compile()


#: XLA flags of every command line (`fast_compile`): the loop emitters, LLVM at -O1.
_CLI_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_backend_optimization_level=1")


def fast_compile() -> None:
    """Compile with XLA:CPU's loop emitters at LLVM's -O1 (the compile policy of every CLI).

    A CLI run is one process that compiles a handful of large programs and runs them for
    seconds, so compilation is most of a cold run. XLA:CPU's older loop emitters
    (`--xla_cpu_use_fusion_emitters=false`: the same operations, code generated without
    the newer fusion emitters) compile them in ~60 % of the time: `python -m
    splitwise_jax.optimize` (Fig. 12) from process start with an empty cache 75.6 ->
    55.0 s, warm 7.8 -> 7.9 s, same answer (2-core machine, 2026-12-01). LLVM's -O1
    instead of its default -O2 (`--xla_backend_optimization_level=1`) compiles the
    optimiser's gradient program in 16 s instead of 18-21 s and runs it no slower
    (5.6-7.1 against 6.9-10.6 ms a call); together with the quick exit (`run`), cold /
    warm Fig. 12 runs went from 96.4 / 13.6 to 86.7 / 12.2 CPU s side by side
    (docs/speed.md §8; -O0 was tried in 2026-12-03 and runs the programs 2x slower). A program run for long (a big sweep) runs up to ~20 % slower with the loop
    emitters, so library use and the notebooks keep XLA's defaults. Only takes effect
    before JAX starts its backend, and never overrides a user's own setting of either
    flag in `XLA_FLAGS`; `SPLITWISE_XLA_DEFAULTS=1` keeps XLA's defaults.
    """
    if os.environ.get("SPLITWISE_XLA_DEFAULTS", "") not in ("", "0"):
        return
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        return
    flags = os.environ.get("XLA_FLAGS", "")
    extra = [f for f in _CLI_FLAGS if f.split("=")[0] not in flags]
    os.environ["XLA_FLAGS"] = " ".join([flags, *extra]).strip()


def run(main: Callable[[], int | None]) -> NoReturn:
    """Run a command line's `main` and end the process with its status once its output
    is written, skipping the interpreter's teardown (every ``python -m`` entry point).

    Python's own exit destroys every object left, and a CLI run leaves XLA's loaded
    executables: rebuilding their HLO on load and freeing it at exit are proportional
    to the programs' size. Measured on the 2-core machine (2026-12-04, warm Fig. 12
    `optimize --no-certify`, two runs each): 0.45-0.58 s from the end of `main` to the
    process's exit, 0.09-0.12 s with this. The atexit handlers still run first (a
    prefetch still compiling is waited for, `_exported._wait_at_exit`; logging is
    flushed), then the standard streams are flushed and the process exits with
    `os._exit`. Output cut short by a closed pipe (``| head``) ends quietly with status
    1 instead of a traceback. Only the ``__main__`` modules call this: library calls of
    `main` (the tests, notebooks) return as before. `SPLITWISE_FULL_EXIT=1` exits
    through the interpreter instead.
    """
    try:
        code = main()
    except BrokenPipeError:
        # the reader went away: send what is left nowhere, as Python's docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    code = 0 if code is None else int(code)
    if os.environ.get("SPLITWISE_FULL_EXIT", "") not in ("", "0"):
        sys.exit(code)
    atexit._run_exitfuncs()  # the registered handlers, in the order Python would run them
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more to write
            pass
    os._exit(code)


@contextlib.contextmanager
def input_errors(parser: argparse.ArgumentParser) -> Iterator[None]:
    """Turn ValueError / OSError raised inside into ``parser.error`` (exit 2)."""
    try:
        yield
    except (ValueError, OSError) as e:
        parser.error(_one_line(e))


def _one_line(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in text:
        text = f"{e.filename}: {text}"
    return text


# --------------------------------------------------------------------------------------
# argparse types: each names what it accepts; argparse prefixes the argument's name.


def positive_float(text: str) -> float:
    """A finite number > 0."""
    v = _float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return v


def whole_machines(text: str) -> int:
    """A whole number of machines >= 1 (the simulator runs each one)."""
    v = positive_float(text)
    if abs(v - round(v)) > 1e-9:
        raise argparse.ArgumentTypeError(f"must be a whole number of machines (the simulator runs each one), "
                                         f"got {text!r}")
    return int(round(v))


def nonnegative_float(text: str) -> float:
    """A finite number >= 0."""
    v = _float(text)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return v


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _int(text, 1)


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    return _int(text, 0)


def _float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return v


def _int(text: str, lo: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text!r}") from None
    if v < lo:
        raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text!r}")
    return v


# --------------------------------------------------------------------------------------
# Files


def input_file(flag: str, path: str | os.PathLike) -> Path:
    """An existing, readable, non-empty regular file, or ValueError naming `flag`."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{flag} {p}: no such file")
    if not p.is_file():
        raise ValueError(f"{flag} {p}: not a regular file")
    if not os.access(p, os.R_OK):
        raise ValueError(f"{flag} {p}: not readable")
    if p.stat().st_size == 0:
        raise ValueError(f"{flag} {p}: the file is empty")
    return p


def output_file(flag: str, path: str | os.PathLike, *, make_parents: bool = False) -> Path:
    """A path a file can be written to (checked before any work is done).

    Args:
        flag: the argument's name, for the message.
        path: where the file will go.
        make_parents: create missing parent folders (else a missing folder is an error).
    """
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {p}: is a folder; give a file name")
    parent = p.parent
    if make_parents:
        existing = parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise ValueError(f"{flag} {p}: {existing} is not a folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ValueError(f"{flag} {p}: folder {existing} is not writable")
    else:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"{flag} {p}: {parent} is not a folder")
        if not parent.is_dir():
            raise ValueError(f"{flag} {p}: folder {parent} does not exist")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ValueError(f"{flag} {p}: folder {parent} is not writable")
    if p.exists() and not os.access(p, os.W_OK):
        raise ValueError(f"{flag} {p}: the file exists and is not writable")
    return p


def output_folder(flag: str, path: str | os.PathLike) -> Path:
    """A folder that exists or can be created, and is writable."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {p}: exists and is not a folder")
    existing = p
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {p}: folder {existing} is not writable")
    return p


def cache_root() -> Path:
    """The command lines' cache folder (`SPLITWISE_JAX_CACHE`, default
    ~/.cache/splitwise_jax/xla), whether or not it exists."""
    return Path(os.environ.get("SPLITWISE_JAX_CACHE", Path.home() / ".cache" / "splitwise_jax" / "xla"))


def enable_cache(min_compile_s: float = 0.2) -> None:
    """Turn on JAX's persistent compilation cache for a CLI run (every CLI: one policy).

    A second run of the same problem loads its programs instead of compiling them
    (the Fig. 12 `optimize` then answers in seconds from process start; a 2-minute
    trace simulates in ~1 s of work after JAX's import). Programs that compiled in
    under `min_compile_s` are not written: they cost less to compile than to load.
    `SPLITWISE_JAX_CACHE` moves the folder (default ~/.cache/splitwise_jax/xla); an
    unwritable folder leaves the cache off rather than failing the run.
    """
    path = cache_root()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
