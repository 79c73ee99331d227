# Each target creates and fills its own virtualenv (.venv) on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

.PHONY: install run test bench calibrate
install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m splitwise_jax.optimize

test: $(STAMP)
	$(BIN)/python -m pytest

calibrate: $(STAMP)
	$(BIN)/python -m splitwise_jax.calibrate

bench: $(STAMP)
	for f in benchmarks/*.py; do $(BIN)/python $$f || exit 1; done
