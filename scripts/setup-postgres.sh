#!/usr/bin/env bash
# Installs Debian's PostgreSQL server when it is missing: the trigger store's tests start a real one
# (tests/triggers/conftest.py) and `make bench-triggers` starts one and runs pgbench (in the same package);
# the demo does not need it.
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing PostgreSQL (apt-get install postgresql) for the trigger store's tests" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    else
        echo "PostgreSQL is missing and this is not root: the postgres tests will fail;" \
             "install it with: apt-get install -y postgresql" >&2
    fi
fi
