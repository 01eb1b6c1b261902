# The two commands of the README's quick start, and the checks behind them. Each target installs what it
# needs into .venv first (uv resolves the pinned set in seconds; plain pip backtracks for minutes).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The stamp names both projects' settings: gpucert's and the simulator's (gpucert-sim, in sim/).
WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml sim/pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo check test static lint format layers types unit bench docs clean

$(STAMP): pyproject.toml sim/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv
	# gpucert and its simulator (its own distribution, never in the production image): the demo and the tests
	# need both.
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e '.[test]' -e ./sim
	$(BIN)/python -m pip install --quiet --disable-pip-version-check torch==2.13.0  # CPU wheel for the payload's tests: pip, never uv (uv would fetch a multi-GB CUDA build)
	# Bytecode once, here: where PYTHONDONTWRITEBYTECODE is set (this image sets it) no .pyc is ever written, and
	# every process would compile pandas, Prefect and the rest again (~2 s each; the suite starts hundreds).
	# A few files are for newer Pythons (torch's py312 intrinsics): their errors are expected.
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1 || true
	rm -f $(VENV)/.installed-* && touch $@

demo: $(STAMP)          ## the main job on the embedded default
	$(BIN)/gpucert demo

check: static $(STAMP)  ## the fast tier: static checks and the tests that need no server (<= 3 min on 2 cores)
	$(BIN)/pytest -q -n auto --dist worksteal -m "not e2e"

test: static unit       ## everything CI runs: static checks, then every test, end-to-end ones included

static: lint format layers types

lint: $(STAMP)
	$(BIN)/ruff check .

format: $(STAMP)        ## `ruff format .` fixes what this finds
	$(BIN)/ruff format --check .

layers: $(STAMP)        ## the import contracts of .importlinter
	$(BIN)/lint-imports

types: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/python -m compileall -q gpucert flows tasks blocks sim tests >/dev/null  # see $(STAMP): ours too
	# worksteal: a worker that runs out of tests takes queued ones from the other. With the default (load)
	# a worker could sit idle for two minutes while the other ran the fault matrix's 100 s test with tests
	# still queued behind it (measured on 2 cores: 543 and 556 s with load, 489 s with worksteal).
	# One worker more than cores: the end-to-end tests wait on servers, Jobs and polls more than they compute
	# (2 cores: 704 and 775 s with 2 workers, 638 s with 3, the same 2,157 tests).
	$(BIN)/pytest -q -n $(WORKERS) --dist worksteal --durations=25  # the slowest, in every CI log

bench: $(STAMP)         ## detection quality and compare speed: figures, not pass/fail
	$(BIN)/python benchmarks/detection.py
	$(BIN)/python benchmarks/compare_speed.py

docs: $(STAMP)          ## docs/reference/cli.md from the parser (tests/test_cli_reference.py checks it is current)
	$(BIN)/python scripts/cli_reference.py

clean:
	rm -rf $(VENV) gpucert-demo .pytest_cache .mypy_cache .ruff_cache
