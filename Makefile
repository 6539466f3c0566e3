# Two commands set up and run everything on a fresh Debian machine:
#   make repro   install what is missing, then run the main job (dvc repro)
#   make test    install what is missing, then run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DATASET_DIR := /usr/share/datasets/fashion-mnist
DATASET := $(DATASET_DIR)/train-images-idx3-ubyte.gz
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

.PHONY: install dataset browser milvus-server repro lint docs test test-slow ui benchmarks five-seed-study full-cpu-study gpu-study help

help:
	@echo "make repro  - install what is missing, then run the whole study (dvc repro)"
	@echo "make lint   - ruff check and ruff format --check over the whole tree, mypy over the library"
	@echo "make test   - install what is missing, then run lint and the fast test suite"
	@echo "make docs   - build the pages under docs/ into site/ (MkDocs; open site/index.html)"
	@echo "make ui     - MLflow UI on 127.0.0.1:5000 over the project's registry"
	@echo "make five-seed-study - the claims at five seeds, DMU on extended-class too (a dvc experiment, ~20 min)"
	@echo "make full-cpu-study - every scenario, strategy, head and chain on one seed (a dvc experiment)"
	@echo "make gpu-study  - the full-size study of params/gpu-full.yaml (3 seeds, GPU) as a dvc experiment"
	@echo "make benchmarks - print the measured figures of benchmarks/ on this machine"

# The [scale] extra (Ray Data, prefect-ray) is optional for users; the project's own installs take it
# so that its tests run (EXTRAS=dev for a lean environment).
EXTRAS ?= dev,scale
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

$(DATASET):
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y -qq dataset-fashion-mnist

# Headless Chromium drives the MLflow UI test; a machine where apt-get cannot install it skips that test.
BROWSER := /usr/bin/chromium
$(BROWSER):
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y -qq chromium chromium-driver || echo "chromium could not be installed: the MLflow UI test will be skipped"

install: $(STAMP) $(DATASET)

# A Milvus 2.3.5 standalone server for the store's tests, in an environment of its own (the PyPI
# `milvus` package ships the server binary, unpacked under .venv-milvus/server on first use); the
# tests start it on 127.0.0.1 once per session (tests/milvus_server.py).
MILVUS_VENV := .venv-milvus
MILVUS_STAMP := $(MILVUS_VENV)/.installed
$(MILVUS_STAMP):
	$(PYTHON) -m venv $(MILVUS_VENV)
	$(MILVUS_VENV)/bin/pip install --quiet milvus==2.3.5
	touch $(MILVUS_STAMP)

milvus-server: $(MILVUS_STAMP)

browser: $(BROWSER)

dataset: $(DATASET)

# dvc runs each stage's `python -m stages.<name>` through PATH: the project's environment first.
# OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads of torch sleep rather than spin, so a stage on both
# cores does not collapse when anything else runs beside it (modelupgrade/replicates.py).
repro: install
	PATH="$(CURDIR)/$(BIN):$$PATH" OMP_WAIT_POLICY=PASSIVE $(BIN)/dvc repro

# ruff's lint rules and formatting (pyproject.toml: [tool.ruff]) and mypy over the library
# ([tool.mypy]); a finding fails `make test`.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The pages under docs/ as a static site (mkdocs.yml: the built-in theme, nothing fetched); a
# broken link, a missing anchor or a page left out of the nav fails it. tests/test_docs.py builds
# it in `make test` too.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --site-dir site

# The suite on three worker processes (pytest-xdist), one file per worker at a time so that a file's
# module-wide fixtures (a Prefect server, an MLflow UI) start once; each worker runs torch on one
# thread (tests/conftest.py). Three on two cores because much of the suite waits (on the Milvus
# server's load ticks, a Prefect or MLflow server, subprocesses): measured from a fresh clone, the
# tests took 17.6 min on two workers and 13.7 min on three, all passing. TEST_WORKERS=0 runs it in
# one process.
TEST_WORKERS ?= 3
test: install browser milvus-server lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-slow: install
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

ui: install
	$(BIN)/mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5000

# The full-size study: params/gpu-full.yaml applied over params.yaml as one DVC experiment.
# Everything the CPU study can train (params/full-cpu.yaml) on its one seed, as a DVC experiment.
# The claims at five seeds with DMU on extended-class too (20 min: over make repro's budget).
five-seed-study: install
	PATH="$(CURDIR)/$(BIN):$$PATH" OMP_WAIT_POLICY=PASSIVE $(BIN)/modelupgrade experiments --overlay params/five-seeds.yaml --seeds 666

full-cpu-study: install
	PATH="$(CURDIR)/$(BIN):$$PATH" OMP_WAIT_POLICY=PASSIVE $(BIN)/modelupgrade experiments --overlay params/full-cpu.yaml --seeds 666

gpu-study: install
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/modelupgrade experiments --overlay params/gpu-full.yaml --seeds 0 1 2

benchmarks: install
	for b in train_throughput eval_throughput adapter_throughput adapter_costs backfill_curve backfill_job store_backends; do \
		$(BIN)/python -m benchmarks.$$b || exit 1; done
