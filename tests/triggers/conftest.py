"""Fixtures of the trigger tests: the store on SQLite and on a real PostgreSQL server started here.

The server is Debian's ``postgresql`` package (scripts/setup.sh installs it): ``initdb`` into a temporary
folder and ``pg_ctl start`` on a free loopback port, as the ``postgres`` user when the tests run as root
(the server refuses to run as root), stopped when the session ends. Durability is switched off: these
tests check behaviour, not crash safety.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest

from bitlake.triggers.store import TriggerStore, make_engine, run_migrations


def _pg_bin() -> Path:
    def version(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path))

    for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if os.path.exists(f"{bindir}/initdb") and os.path.exists(f"{bindir}/pg_ctl"):
            return Path(bindir)
    pytest.fail("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/pg_ctl): run scripts/setup.sh, "
                "or apt-get install -y postgresql")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self):
        self.bin = _pg_bin()
        self.root = Path(tempfile.mkdtemp(prefix="bitlake-pg-"))
        self.user = None
        if os.geteuid() == 0:
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                pytest.fail("running as root and there is no 'postgres' user to run the server as")
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self.data = self.root / "data"
        self.port = 0

    def _run(self, *args: str) -> None:
        command = [str(a) for a in args]
        if self.user is not None:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            log = (self.root / "server.log").read_text() if (self.root / "server.log").exists() else ""
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}\n{log}")

    def start(self) -> None:
        self._run(self.bin / "initdb", "-D", self.data, "-U", "bitlake", "--auth=trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        for attempt in range(3):  # the port is free when picked, but another process may take it meanwhile
            self.port = _free_port()
            options = (f"-p {self.port} -h 127.0.0.1 -k {self.root} -c fsync=off -c synchronous_commit=off "
                       "-c full_page_writes=off -c max_connections=50")
            try:
                self._run(self.bin / "pg_ctl", "-D", self.data, "-l", self.root / "server.log", "-w", "-t", "60",
                          "-o", options, "start")
                return
            except RuntimeError:
                if attempt == 2:
                    raise

    def stop(self) -> None:
        try:
            self._run(self.bin / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://bitlake@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=bitlake dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@pytest.fixture(scope="session")
def postgres():
    server = PostgresServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def _postgres_store_url(postgres) -> str:
    """One database for the behaviour tests, migrated once; each test empties it."""
    url = postgres.create_database("triggers")
    engine = make_engine(url)
    run_migrations(engine)
    engine.dispose()
    return url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    """The URL of an empty, migrated store on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/triggers.db"
    url = request.getfixturevalue("_postgres_store_url")
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as conn:
        conn.execute("TRUNCATE events, flows, tokens RESTART IDENTITY")
    return url


@pytest.fixture
def store(db_url):
    with TriggerStore(db_url) as s:
        yield s
