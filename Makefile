# Set-up and entry points. Everything installs from this repository's files
# into ./.venv (packages by name from the package index; bubblewrap from the
# system's package manager); nothing is fetched at run time.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
EXTRAS ?= dev,local,openai,anthropic,docker,plot,memory,memory-ann,train
# Building llama-cpp-python takes minutes on 2 cores; the LLaVA part is not needed.
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF

.PHONY: setup system-deps docker-engine docker-image demo test coverage bench lint clean

setup: system-deps $(VENV)/.installed

system-deps:
	@command -v bwrap >/dev/null || { \
	  echo "installing bubblewrap (the default sandbox)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq bubblewrap; }

## Make a Docker engine answer for the docker sandbox (as root: installs docker.io and starts dockerd if needed).
docker-engine:
	PY=$(PY) sh scripts/docker-engine.sh

## Build the docker sandbox's default image on that engine (from this repository's files).
docker-image: setup docker-engine
	$(VENV)/bin/factory sandbox build-image

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and exactly this version (a CPU build); any other spec would pull GBs of CUDA
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	touch $@

## The main job on the embedded defaults: fork the example tasks on the packaged model in bwrap sandboxes.
demo: setup
	$(VENV)/bin/factory tasks validate examples/tasks.jsonl
	$(VENV)/bin/factory fork examples/tasks.jsonl --branches 2 --max-turns 4 --max-tokens 256
	$(VENV)/bin/factory runs

## The full test suite.
test: setup
	$(PY) -m pytest -q

## Line coverage of the suite, CLI subprocesses included (see [tool.coverage] in pyproject.toml).
coverage: setup
	$(VENV)/bin/coverage erase
	$(VENV)/bin/coverage run -m pytest -q
	$(VENV)/bin/coverage combine -q
	$(VENV)/bin/coverage report
	$(VENV)/bin/coverage html -q && echo "HTML report: htmlcov/index.html"

## Benchmarks (on demand; they print figures and ratios against a baseline).
bench: setup
	$(PY) bench/bench_store.py
	$(PY) bench/bench_fork.py
	$(PY) bench/bench_verify.py
	$(PY) bench/bench_sandbox.py
	$(PY) bench/bench_rank.py
	$(PY) bench/bench_memory.py
	$(PY) bench/bench_export.py
	$(PY) bench/bench_train.py

lint: setup
	$(VENV)/bin/ruff check factory tests bench

clean:
	rm -rf $(VENV) factory.duckdb .pytest_cache .coverage .coverage.* htmlcov
