#!/usr/bin/env bash
# Installs Debian's PostgreSQL server and its wal2json logical decoding plugin when they are missing: the
# trigger store's tests start a real server (tests/triggers/conftest.py), the PostgreSQL mirror's tests one
# with wal_level=logical (tests/test_mirror.py), and `make bench-triggers` one with pgbench (in the same
# package); the demo needs neither.
set -euo pipefail
have_server() { ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; }
have_wal2json() { ls /usr/lib/postgresql/*/lib/wal2json.so >/dev/null 2>&1; }
if have_server && have_wal2json; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing PostgreSQL and wal2json (apt-get) for the trigger store's and the mirror's tests" >&2
    apt-get update -qq
    if ! have_server; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    fi
    major=$(ls /usr/lib/postgresql | sort -n | tail -1)
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "postgresql-${major}-wal2json" >/dev/null
else
    echo "PostgreSQL or wal2json is missing and this is not root: the postgres tests will fail;" \
         "install them with: apt-get install -y postgresql postgresql-15-wal2json" >&2
fi
