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

.PHONY: install dataset repro test test-slow ui benchmarks gpu-study clean-outputs help

help:
	@echo "make repro  - install what is missing, then run the whole study (dvc repro)"
	@echo "make test   - install what is missing, then run the fast test suite"
	@echo "make ui     - MLflow UI on 127.0.0.1:5000 over the project's registry"

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

$(DATASET):
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y -qq dataset-fashion-mnist

install: $(STAMP) $(DATASET)

dataset: $(DATASET)

repro: install
	$(BIN)/dvc repro

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-slow: install
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)
