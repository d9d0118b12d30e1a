# `make quickstart` and `make test` each create .venv on first use (mlmkit with its [train] extra and
# the dev tools). `make test`: ruff, the import-linter contracts and mypy (docs/architecture.md), then
# the tests in worker processes (pytest-xdist; one torch thread each, tests/conftest.py) with the 15
# slowest listed.
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
	$(BIN)/python -m pytest -q --numprocesses auto --maxprocesses 4 --dist worksteal --durations 15

lint: $(BIN)/mlmkit
	$(BIN)/ruff check mlmkit mlmkit_tasks tests benchmarks
	$(BIN)/lint-imports
	$(BIN)/mypy

bench: $(BIN)/mlmkit
	$(BIN)/python benchmarks/pretrain_throughput.py
	$(BIN)/python benchmarks/inference_throughput.py
	$(BIN)/python benchmarks/precision.py
	$(BIN)/python benchmarks/batch_cuts.py
	$(BIN)/python benchmarks/serve_throughput.py
	$(BIN)/python benchmarks/batch_scale.py
	$(BIN)/python benchmarks/pretrain_data_scale.py
	$(BIN)/python benchmarks/families.py
	$(BIN)/python benchmarks/retrieval_training.py

clean:
	rm -rf $(VENV) runs .pytest_cache
