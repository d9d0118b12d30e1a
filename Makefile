# `make quickstart` and `make test` each create .venv on first use (mlmkit with its [train] extra and
# the dev tools). `make test`: ruff, the import-linter contracts and mypy (docs/architecture.md), then
# the tests in worker processes (pytest-xdist; one torch thread each, tests/conftest.py) with the 15
# slowest listed. Bytecode is written even where the environment says not to (PYTHONDONTWRITEBYTECODE):
# else each worker rewrites the asserts of every test module on every run (7 s a worker on the second
# run on, 2026-12-08; a fresh clone pays it once).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch; an unpinned torch pulls a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: quickstart test lint bench clean

$(BIN)/mlmkit: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/mlmkit

quickstart: $(BIN)/mlmkit
	$(BIN)/mlmkit quickstart --out runs/quickstart

test: $(BIN)/mlmkit
	$(BIN)/ruff check mlmkit mlmkit_tasks tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/mypy
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q --numprocesses auto --maxprocesses 4 --dist worksteal --durations 15

lint: $(BIN)/mlmkit
	$(BIN)/ruff check mlmkit mlmkit_tasks tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/mypy

# every benchmark that needs no peer installed, in turn; it first prints which it skips and why
# (benchmarks/harness.py, CATALOGUE; `python benchmarks/harness.py --list` prints that alone)
bench: $(BIN)/mlmkit
	$(BIN)/python benchmarks/harness.py

clean:
	rm -rf $(VENV) runs .pytest_cache
