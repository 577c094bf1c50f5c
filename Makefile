VENV ?= .venv
PY := $(VENV)/bin/python
AIRFLOW_VENV ?= .venv-airflow
PAIMON_VENV ?= .venv-paimon
PAIMON_PYTHON ?= $(shell command -v python3.11 || command -v python3)
SF ?= 1
SFS ?= 0.1,1,3
SYSTEMS ?= all
TIMEOUT ?= 600

.PHONY: help setup setup-airflow setup-paimon demo test test-airflow test-fast lint bench bench-timetravel bench-peers bench-maintenance bench-restatement bench-clustering bench-lake bench-memory bench-cold bench-reads bench-mirror bench-triggers bench-fsync clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup: $(VENV)/.installed  ## create the virtual environment and install bitlake with its test tools

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $@

setup-airflow: $(AIRFLOW_VENV)/.installed  ## a separate environment with Apache Airflow (pinned) and bitlake, for the provider

$(AIRFLOW_VENV)/.installed: pyproject.toml scripts/setup-airflow.sh
	AIRFLOW_VENV=$(AIRFLOW_VENV) bash scripts/setup-airflow.sh
	touch $@

setup-paimon: $(PAIMON_VENV)/.installed  ## a separate environment with pypaimon (it needs pyarrow < 20), for the Paimon peers of bench-peers

$(PAIMON_VENV)/.installed:
	$(PAIMON_PYTHON) -m venv $(PAIMON_VENV)
	$(PAIMON_VENV)/bin/pip install -q --upgrade pip
	$(PAIMON_VENV)/bin/pip install -q pypaimon pypaimon-rust
	$(PAIMON_VENV)/bin/pip check
	touch $@

demo: setup  ## run the demo: create a table, ingest a base and changes, show the view and the history
	$(PY) examples/demo.py

test: setup setup-airflow  ## run every test (unit, Spark, concurrency, crash, trigger service on SQLite and PostgreSQL, console in Chromium, Airflow)
	bash scripts/setup-postgres.sh
	@# Debian's chromium for the console's browser tests (tests/test_console_browser.py: Playwright drives it)
	@command -v chromium >/dev/null 2>&1 || if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium (apt-get) for the console's browser tests" >&2; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "chromium is missing and this is not root: the console's browser tests will fail;" \
		"install it with: apt-get install -y chromium" >&2; fi
	$(PY) -m pytest -q
	$(MAKE) --no-print-directory test-airflow

test-airflow: setup-airflow  ## the Airflow provider's tests, against a real Airflow (in $(AIRFLOW_VENV))
	$(AIRFLOW_VENV)/bin/python -m pytest -q tests/airflow

test-fast: setup  ## only the pure-Python tests
	$(PY) -m pytest -q -m "not spark and not slow and not postgres"

lint: setup  ## ruff and mypy on the pure layer
	$(VENV)/bin/ruff check bitlake tests benchmarks
	$(VENV)/bin/mypy bitlake --ignore-missing-imports --exclude bitlake/spark

bench: setup  ## the benchmarks on TPC-H lineitem (SF=1 by default), then the trigger service's, one after the other, written to docs/benchmarks.md
	$(PY) benchmarks/core.py --scale-factor $(SF)
	$(PY) benchmarks/timetravel.py --scale-factor $(SF)
	$(MAKE) --no-print-directory bench-triggers

bench-timetravel: setup  ## past views (version, valid_at) and change feeds against the current-view scan
	$(PY) benchmarks/timetravel.py --scale-factor $(SF)

bench-maintenance: setup  ## compaction: current-view scans and storage over a churning table against plain Spark (SF=1)
	$(PY) benchmarks/maintenance.py --scale-factor $(SF)

bench-restatement: setup  ## revert, replace, tombstone, vacuum and DML against the batches' ingestion, delta-rs and lance (SF=1)
	$(PY) benchmarks/restatement.py --scale-factor $(SF)

bench-clustering: setup  ## the erasure of 1,000 suppliers before and after compact(cluster_by="l_suppkey"), against delta-rs delete before and after z_order (SF=1)
	$(PY) benchmarks/clustering.py --scale-factor $(SF)

bench-lake: setup  ## bitlake on an S3 API (moto) against local disk and delta-rs; the data source against the JVM reader; Arrow reads against pyarrow and DuckDB (SF=1)
	$(PY) benchmarks/lake.py --scale-factor $(SF)

bench-memory: setup  ## peak memory of a base load from an Arrow stream, by phase (landing, MetaGen) (SF=1)
	$(PY) benchmarks/memory.py --scale-factor $(SF) --output

bench-cold: setup  ## small batches (deletes of 0.1 % of the keys) each from a new process against the writer that loaded the table (SF=1)
	$(PY) benchmarks/cold_writer.py --scale-factor $(SF)

bench-cluster: setup  ## a standalone Spark cluster (a master, two 1-core workers): the load from a Spark DataFrame and a 10 % batch's Spark MetaGen, with executor memory (SF=1; SF=10 is the issue's)
	$(PY) benchmarks/cluster.py --scale-factor $(SF)

bench-reads: setup  ## reads of a churned table by pyarrow, DuckDB and Polars against plain Parquet, lance and delta-rs, and after a major compaction (SF=1)
	$(PY) benchmarks/reads.py --scale-factor $(SF) --output

bench-mirror: setup  ## the PostgreSQL mirror: its snapshot against a dump to Parquet, pgbench beside it (lag), a backlog's catch-up against Spark and delta-rs
	bash scripts/setup-postgres.sh
	$(PY) benchmarks/mirror.py --scale 100

bench-peers: setup setup-paimon  ## bitlake against delta-rs, pyiceberg, lance, Paimon and plain Spark (SFS=0.1,1,3 SYSTEMS=all TIMEOUT=600 s per operation)
	$(PY) benchmarks/peers.py --scale-factors $(SFS) --systems $(SYSTEMS) --timeout $(TIMEOUT)

bench-fsync: setup  ## what durable local files cost: the peers workload for bitlake with fsync on and off (SF=1, 6 rounds)
	PYTHONPATH=benchmarks/fsynclog $(PY) benchmarks/fsync_cost.py $(SF) 6

bench-triggers: setup  ## the trigger service on PostgreSQL: events registered/s and trigger p50/p99 at 1M and 10M events, against pgbench
	bash scripts/setup-postgres.sh
	$(PY) benchmarks/triggers.py

.PHONY: bench-soak
bench-soak: setup  ## the trigger service and the mirror under load while they and PostgreSQL are killed and restarted (60 s each)
	bash scripts/setup-postgres.sh
	$(PY) benchmarks/soak.py --seconds 60

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) $(AIRFLOW_VENV) $(PAIMON_VENV) .pytest_cache .hypothesis demo-lake
