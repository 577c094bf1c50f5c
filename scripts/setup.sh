#!/usr/bin/env bash
# Creates .venv and installs bitlake with its test and benchmark tools: the extras test and bench pull in every
# other one but airflow (spark, service, client, cli, formats). Needs Python 3.11+ and Java 17.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v java >/dev/null 2>&1; then
    echo "bitlake needs Java 17 for Spark and none is on PATH; on Debian: apt-get install -y openjdk-17-jre-headless" >&2
    exit 1
fi
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[test,bench]"
