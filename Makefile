# Set-up and entry points. Everything installs from this repository's files
# into ./.venv; nothing is fetched at run time except packages by name.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
EXTRAS ?= dev

.PHONY: setup demo test bench lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

## The main job on the embedded defaults.
demo: setup
	$(VENV)/bin/factory tasks validate examples/tasks.jsonl
	$(VENV)/bin/factory tasks validate examples/tasks.yaml
	$(VENV)/bin/factory db migrate
	$(VENV)/bin/factory db info
	$(VENV)/bin/factory runs

## The full test suite.
test: setup
	$(PY) -m pytest -q

## Benchmarks (on demand; they print figures and ratios against a baseline).
bench: setup
	$(PY) bench/bench_store.py

lint: setup
	$(VENV)/bin/ruff check factory tests bench

clean:
	rm -rf $(VENV) factory.duckdb .pytest_cache
