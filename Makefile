# The two commands of the README:
#   make serve   install everything into .venv and start Lethe (embedded: SQLite + inline worker)
#   make test    start PostgreSQL/Redis if stopped, install chromium if missing, install the
#                test extras and run the whole suite but the image test, in four processes,
#                with the lint beside it (.ci/run: this, then make test-image)
#   make test-image  build the container image with podman from Debian's packages and run it,
#                and bring the compose deployment up from those images and test it
#   make compose-up  the distributed deployment (PostgreSQL, Redis, SeaweedFS, a witness, the
#                API and 2 workers) with podman-compose, from locally built images
#   make compose-down  stop it (scripts/compose-down --volumes drops its data)
#   make unit    the fast loop between edits: tests/unit (no server, no database, no process)
#   make service tests/unit and tests/service: one process on SQLite and PostgreSQL
#   make lint    ruff (lint + format check), mypy, the layers' import contracts
#                (.importlinter) and the docs site built strictly
#   make docs    the docs site into site/ (make docs-serve: with live reload)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: install install-test prerequisites serve test test-image compose-up compose-down unit service lint docs docs-serve

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch first and pinned, and the CPU build (PyTorch's CPU index, or a local wheel of it)
# unless a GPU is asked for (LETHE_TORCH=cuda) or found (nvidia-smi): PyPI's torch==2.13.0
# alone is the CUDA build, with gigabytes of nvidia-* packages.
LETHE_TORCH ?= $(if $(shell command -v nvidia-smi 2>/dev/null),cuda,cpu)
ifeq ($(LETHE_TORCH),cuda)
TORCH_INSTALL := torch==2.13.0
else
TORCH_INSTALL := "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu --retries 1
endif

$(VENV)/.installed: $(BIN)/python pyproject.toml
	@echo "installing torch 2.13.0 ($(LETHE_TORCH) build; LETHE_TORCH=cuda|cpu chooses)"
	$(BIN)/pip install -q $(TORCH_INSTALL) || { echo "the $(LETHE_TORCH) build of torch \
	  could not be installed (no PyTorch index or local wheel): PyPI's build instead"; \
	  $(BIN)/pip install -q torch==2.13.0; }
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/pip install -q -e ".[test]"
	touch $@

# The MLflow tracking server tests/integration/test_mlflow.py starts: the full `mlflow` package,
# in an environment of its own; Lethe itself needs only the `mlflow` extra's mlflow-skinny.
MLFLOW_VENV ?= .venv-mlflow
MLFLOW_VERSION := 3.17.2
$(MLFLOW_VENV)/.installed:
	$(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install -q mlflow==$(MLFLOW_VERSION)
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test $(MLFLOW_VENV)/.installed

serve: install
	$(BIN)/lethe serve --host $(HOST) --port $(PORT)

# PostgreSQL and Redis up, chromium installed: what a fresh machine lacks (scripts/test-prerequisites)
prerequisites:
	scripts/test-prerequisites

# Four pytest processes (pytest-xdist), each with its own PostgreSQL database, Redis and
# SeaweedFS (session fixtures): most of a test's time is waiting on servers and worker processes.
TEST_PROCESSES ?= 4
# One compute thread in each of them and in every server a test starts (they inherit it): with
# OpenMP's default of a thread per core, their waiting spun on cores the others needed.
TEST_THREADS ?= 1

# The project's bytecode compiled first: where PYTHONDONTWRITEBYTECODE is set, every process the
# suite starts (hundreds of servers and workers) would compile what it imports again.
# The lint runs beside the suite (its output printed after it, its failure failing the target):
# the suite leaves part of the cores idle while its servers and workers wait on each other.
test: prerequisites install-test
	$(BIN)/python -m compileall -q $(SOURCES) > /dev/null
	@lint_log=$$(mktemp); \
	$(MAKE) --no-print-directory lint > $$lint_log 2>&1 & lint=$$!; \
	OMP_NUM_THREADS=$(TEST_THREADS) MKL_NUM_THREADS=$(TEST_THREADS) \
	  $(BIN)/python -m pytest -q -m "not image" -n $(TEST_PROCESSES) --dist worksteal; \
	tests=$$?; wait $$lint; linted=$$?; \
	echo "--- make lint (run beside the tests): exit $$linted"; cat $$lint_log; rm -f $$lint_log; \
	test $$tests -eq 0 && test $$linted -eq 0

# The container image built with podman from Debian's packages and run (tests/image/test_image.py).
test-image: install-test
	scripts/test-prerequisites --image
	$(BIN)/python -m pytest -q -m image

compose-up: install-test
	scripts/test-prerequisites --image
	PODMAN_COMPOSE=$(BIN)/podman-compose scripts/compose-up

compose-down:
	PODMAN_COMPOSE=$(BIN)/podman-compose scripts/compose-down

# The tiers (tests/README.md): unit, service (one process on both databases), integration
# (servers and worker processes), image (make test-image).
unit: install-test
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q tests/unit

service: install-test
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 tests/unit tests/service

SOURCES = app workers methods architectures maths lethe clients migrations tests bench scripts

lint: install-test
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	@site=$$(mktemp -d); NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet \
	  --site-dir $$site; built=$$?; rm -rf $$site; exit $$built

# The docs site (mkdocs.yml): its figures are rendered from bench/results/ and its API
# reference from the OpenAPI document when it is built (scripts/docs_hooks.py).
docs: install-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: install-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve
