VENV ?= .venv
PY := $(VENV)/bin/python
SF ?= 1

.PHONY: help setup demo test test-fast lint bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup: $(VENV)/.installed  ## create the virtual environment and install bitlake with its test tools

$(VENV)/.installed: pyproject.toml
	bash scripts/setup.sh
	touch $@

demo: setup  ## run the demo: create a table, ingest a base and changes, show the view and the history
	$(PY) examples/demo.py

test: setup  ## run every test (unit, Spark, concurrency, crash, trigger service on SQLite and PostgreSQL)
	bash scripts/setup-postgres.sh
	$(PY) -m pytest -q

test-fast: setup  ## only the pure-Python tests
	$(PY) -m pytest -q -m "not spark and not slow and not postgres"

lint: setup  ## ruff and mypy on the pure layer
	$(VENV)/bin/ruff check bitlake tests benchmarks
	$(VENV)/bin/mypy bitlake --ignore-missing-imports --exclude bitlake/spark

bench: setup  ## the core benchmark on TPC-H lineitem (SF=1 by default), written to docs/benchmarks.md
	$(PY) benchmarks/core.py --scale-factor $(SF)

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .hypothesis demo-lake
