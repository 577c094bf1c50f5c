#!/usr/bin/env bash
# Creates .venv and installs bitlake with its test and benchmark tools: the extras test and bench pull in every
# other one but airflow (spark, service, client, cli, formats). Needs Python 3.11+ and Java 17.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v java >/dev/null 2>&1; then
    echo "bitlake needs Java 17 for Spark and none is on PATH; on Debian: apt-get install -y openjdk-17-jre-headless" >&2
    exit 1
fi
# bitlake's row filter for Spark reads is compiled on first use (bitlake/spark/jar.py): it needs javac, a JDK.
if ! command -v javac >/dev/null 2>&1 && [ ! -x "${JAVA_HOME:-/nonexistent}/bin/javac" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless >/dev/null
    else
        echo "no javac: Spark reads of tables with superseded rows will filter them by a slower join" \
             "(on Debian: apt-get install -y openjdk-17-jdk-headless)" >&2
    fi
fi
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".[test,bench]"
# bitlake's bytecode, as a wheel's install writes it: an editable install under PYTHONDONTWRITEBYTECODE has none, and
# each process (a CLI call, an Airflow task, a test's child process) would compile every module it imports.
.venv/bin/python -m compileall -q bitlake >/dev/null
# Azurite, the Azure Blob Storage emulator of the az:// tests (tests/emulators.py): an npm package in .node/, with
# Debian's Node.js. (fake-gcs-server, the GCS one, comes with the test extra, from PyPI.)
AZURITE_VERSION=3.35.0
if ! grep -qs "\"version\": \"$AZURITE_VERSION\"" .node/node_modules/azurite/package.json; then
    if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
    fi
    if command -v npm >/dev/null 2>&1; then
        npm install --prefix .node --no-audit --no-fund --loglevel=error "azurite@$AZURITE_VERSION" >/dev/null
    else
        echo "no npm: the Azure tests will fail without Azurite (on Debian: apt-get install -y nodejs npm)" >&2
    fi
fi
