# Each target creates and fills its own virtualenv (.venv) on first use.
#
# `make run` installs the package alone (no test extras); `make test` adds them. The
# installer is uv (`pip install uv` into the venv, then `uv pip install`: parallel, and
# handed the same package indexes pip is configured with, since uv does not read pip's
# configuration), else plain pip when uv cannot be had (INSTALLER=pip forces it). Then
# one import of what the command lines load writes their bytecode (a few seconds, only
# those modules), so that no later run compiles it again, even where
# PYTHONDONTWRITEBYTECODE is set. Measured on the 2-core machine (2026-12-03, loaded):
# `pip install -e '.[test]'` ~150 s, `pip install -e .` 99 s (42 s with --no-compile,
# whose runs then import JAX in 3.2 s instead of 1.2 s where bytecode is not written),
# uv: 6-8 s to install it, 7 s to install the package (docs/speed.md §6).
PY ?= python3
# What the command lines import, their lazy imports included (the certificate's
# simulator and pandas, tqdm, JAX's LAPACK set-up through scipy.linalg): their bytecode
# is written once at install. Without it, where PYTHONDONTWRITEBYTECODE is set, every
# run compiled pandas and scipy from source: a warm Fig. 12 `optimize` 9.3-10.9 -> 7.0-7.6 s
# wall (2026-12-04, docs/speed.md §8), for ~2 s more at install.
WARM_IMPORTS = import splitwise_jax, splitwise_jax.optimize.cli, splitwise_jax.evaluate, \
	splitwise_jax.simulate.__main__, splitwise_jax.simulate.certify, splitwise_jax.simulate.side_by_side, \
	splitwise_jax.optimize.confidence, splitwise_jax.uncertainty, splitwise_jax.calibrate.cli, \
	splitwise_jax.predict, tqdm, scipy.linalg
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
INSTALLER ?= uv

# pip's configured indexes and find-links, as uv's flags (nothing when none are set)
PIP_CFG = $(BIN)/python -m pip config get
UV_INDEXES = $$($(PIP_CFG) global.index-url 2>/dev/null | tr ' ' '\n' | sed -n 's|^.|--index-url &|p') \
	$$($(PIP_CFG) global.extra-index-url 2>/dev/null | tr ' ' '\n' | sed -n 's|^.|--extra-index-url &|p') \
	$$($(PIP_CFG) global.find-links 2>/dev/null | tr ' ' '\n' | sed -n 's|^.|--find-links &|p')

# $(call install,SPEC): uv where it installs, else pip
define install
	if [ "$(INSTALLER)" = uv ] && { [ -x $(BIN)/uv ] || $(BIN)/python -m pip install --quiet uv; } \
	   && $(BIN)/uv pip install --quiet --python $(BIN)/python $(UV_INDEXES) -e '$(1)'; then :; \
	else $(BIN)/python -m pip install --quiet -e '$(1)'; fi
endef

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	@$(call install,.)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -c '$(WARM_IMPORTS)'
	touch $(STAMP)

$(TEST_STAMP): $(STAMP) pyproject.toml
	@$(call install,.[test])
	touch $(TEST_STAMP)

.PHONY: install run test bench calibrate
install: $(TEST_STAMP)

run: $(STAMP)
	$(BIN)/python -m splitwise_jax.optimize

# The suite starts fresh interpreters (the CLIs, notebook kernels, the float32 run, the
# xdist workers), and where PYTHONDONTWRITEBYTECODE is set (this workplace's machines set
# it) a fresh venv has no bytecode for the test dependencies (uv writes none), so each of
# them compiled pandas, matplotlib and IPython from source. The test run writes bytecode
# into the venv as it goes, each module compiled once: a subset of the suite (test_package,
# test_cli_errors, test_predict, one notebook) 48.8 -> 35.9 s in a fresh clone's venv;
# the whole `make test` 626.8 -> 622.0 s, within its noise (2026-12-03, docs/speed.md §4).
test: $(TEST_STAMP)
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest

calibrate: $(STAMP)
	$(BIN)/python -m splitwise_jax.calibrate

bench: $(STAMP)
	for f in benchmarks/*.py; do $(BIN)/python $$f || exit 1; done
