# Set-up and entry points. Everything installs from this repository's files
# into ./.venv (packages by name from the package index; bubblewrap from the
# system's package manager); nothing is fetched at run time.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
EXTRAS ?= dev,local,openai,anthropic,docker,plot,view,memory,memory-ann,train,ray
# The embedded engine: llama-cpp-python, pinned (pyproject's `local` extra pins the same
# version), built here as a wheel once per build kind and installed from it.
# `portable` (the default) never uses -march=native: a native build on a CPU that
# advertises AMX executes tile instructions the hypervisor may refuse (SIGILL). The
# baseline is AVX2 + FMA + F16C (x86-64-v3); AVX-512 is off as well as AMX because a
# build without runtime dispatch that uses AVX-512 dies on every AVX2-only CPU.
# `native` (LLAMA_BUILD=native) tunes for this machine's CPU, for comparison only.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_BUILD ?= portable
LLAMA_CMAKE_portable := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF
LLAMA_CMAKE_native := -DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF
LLAMA_WHEELS := .cache/wheels/llama-cpp-python-$(LLAMA_CPP_VERSION)-$(LLAMA_BUILD)

.PHONY: llama-wheel bench-engine setup system-deps docker-engine docker-image docker-browser-image demo test coverage bench lint clean

setup: system-deps $(VENV)/.installed

system-deps:
	@command -v bwrap >/dev/null || { \
	  echo "installing bubblewrap (the default sandbox)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq bubblewrap; }
	@command -v chromium >/dev/null || { \
	  echo "installing chromium (the headless browser factory view's tests drive)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium; }

## Make a Docker engine answer for the docker sandbox (as root: installs docker.io and starts dockerd if needed).
docker-engine:
	PY=$(PY) sh scripts/docker-engine.sh

## Build the docker sandbox's default image on that engine (from this repository's files), and the browser
## image the browser verifier runs in on docker (Chromium + Playwright, ~850 MB; 88 s on 2 cores at load 15-18).
docker-image: setup docker-engine
	$(VENV)/bin/factory sandbox build-image
	$(VENV)/bin/factory sandbox build-image --browser

## Only the browser image (factory-sandbox-browser:pyX.Y).
docker-browser-image: setup docker-engine
	$(VENV)/bin/factory sandbox build-image --browser

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and exactly this version (a CPU build); any other spec would pull GBs of CUDA
	$(PY) -m pip install --quiet torch==2.13.0
	$(MAKE) --no-print-directory llama-wheel
	$(PY) -m pip install --quiet --no-deps $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	echo "llama-cpp-python $(LLAMA_CPP_VERSION) $(LLAMA_BUILD): $(LLAMA_CMAKE_$(LLAMA_BUILD))" > $(VENV)/llama-build.txt
	@echo "embedded engine: llama-cpp-python $(LLAMA_CPP_VERSION), $(LLAMA_BUILD) build ($$(sed 's/.*: //' $(VENV)/llama-build.txt))"
	touch $@

## Build the embedded engine's wheel once per version and build kind (about 7 minutes on 2 cores).
## Never from pip's wheel cache: it keys on the source, not on CMAKE_ARGS, and could hand back a native build.
llama-wheel:
	@if ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1; then \
	  echo "embedded engine: reusing $$(ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl)"; \
	else \
	  echo "embedded engine: building llama-cpp-python $(LLAMA_CPP_VERSION), $(LLAMA_BUILD) build"; \
	  CMAKE_ARGS="$(LLAMA_CMAKE_$(LLAMA_BUILD))" $(PY) -m pip wheel --quiet --no-deps --no-cache-dir \
	    --no-binary llama-cpp-python -w $(LLAMA_WHEELS) llama-cpp-python==$(LLAMA_CPP_VERSION); \
	fi

## The main job on the embedded defaults: fork the examples on the packaged model in bwrap sandboxes, rank,
## power, export DPO, train a few steps on the tiny model, and write a static view of the run (examples/demo.sh).
demo: setup
	bash examples/demo.sh $(VENV)/bin/factory

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
	$(PY) bench/bench_view.py

## The embedded engine's portable build against a native one (builds the native wheel once, ~7 minutes).
bench-engine: setup
	$(MAKE) --no-print-directory llama-wheel LLAMA_BUILD=native
	$(PY) bench/bench_engine.py

lint: setup
	$(VENV)/bin/ruff check factory tests bench

clean:
	rm -rf $(VENV) factory.duckdb .pytest_cache .coverage .coverage.* htmlcov
