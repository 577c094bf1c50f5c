#!/usr/bin/env bash
# Creates .venv-airflow: Apache Airflow (pinned below) with bitlake installed in editable mode, for the
# Airflow provider's tests (`make test-airflow`). Airflow lives in its own virtual environment because it
# caps packages that bitlake's own environment has newer (fastapi < 0.137 for Airflow 3.3), and installing
# it into .venv would downgrade them. bitlake's requirements accept the versions Airflow needs, so bitlake
# works unchanged inside this environment.
set -euo pipefail
cd "$(dirname "$0")/.."
AIRFLOW_VERSION=3.3.2
PYTHON=${PYTHON:-python3}
VENV=${AIRFLOW_VENV:-.venv-airflow}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "apache-airflow==$AIRFLOW_VERSION" -e ".[test,airflow]"
"$VENV/bin/pip" check
