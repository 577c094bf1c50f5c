"""A throwaway PostgreSQL server: a temporary folder, a free loopback port, gone when stopped.

The trigger tests and the trigger benchmark start one each. It is Debian's ``postgresql`` package
(``scripts/setup-postgres.sh`` installs it): ``initdb`` and ``pg_ctl`` from the newest
``/usr/lib/postgresql/*/bin``, run as the ``postgres`` user when the caller is root (the server refuses to
run as root). Clients connect as ``bitlake`` over TCP without a password (``--auth=trust``, loopback only).
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
import time
from collections.abc import Mapping
from pathlib import Path

import psycopg


def postgres_bin() -> Path:
    """The newest installed server's ``bin`` folder (``initdb``, ``pg_ctl``, ``postgres``, ``pgbench``)."""
    def version(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path))

    for bindir in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if os.path.exists(f"{bindir}/initdb") and os.path.exists(f"{bindir}/pg_ctl"):
            return Path(bindir)
    raise RuntimeError("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/pg_ctl): run "
                       "bash scripts/setup-postgres.sh, or apt-get install -y postgresql")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """``start()``, then ``url(database)`` or ``connect(database)``; ``stop()`` removes everything.

    Args:
        settings: server settings (``-c name=value``), e.g. ``{"fsync": "off"}`` for tests that check
            behaviour rather than durability, or memory for a benchmark.
        stop_mode: ``pg_ctl stop -m``: ``fast`` (clean shutdown) or ``immediate`` (no checkpoint).
    """

    def __init__(self, settings: Mapping[str, str] | None = None, *, stop_mode: str = "fast"):
        self.bin = postgres_bin()
        self.settings = dict(settings or {})
        self.stop_mode = stop_mode
        self.root = Path(tempfile.mkdtemp(prefix="bitlake-pg-"))
        self.user = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
        if self.user is not None:
            os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self.data = self.root / "data"
        self.port = 0
        self.version = ""

    def _run(self, *args) -> str:
        command = [str(a) for a in args]
        if self.user is not None:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            log = self.root / "server.log"
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}\n"
                               f"{log.read_text() if log.exists() else ''}")
        return result.stdout

    def start(self) -> PostgresServer:
        self._run(self.bin / "initdb", "-D", self.data, "-U", "bitlake", "--auth=trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        for attempt in range(3):  # the port was free when picked, but another process may take it meanwhile
            self.port = free_port()
            try:
                self._start()
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        self.version = self._run(self.bin / "postgres", "--version").strip()
        return self

    def _start(self) -> None:
        settings = "".join(f" -c {name}={value}" for name, value in self.settings.items())
        self._run(self.bin / "pg_ctl", "-D", self.data, "-l", self.root / "server.log", "-w", "-t", "120",
                  "-o", f"-p {self.port} -h 127.0.0.1 -k {self.root}{settings}", "start")

    def down(self, mode: str = "fast") -> None:
        """Stops the server and keeps its data (``pg_ctl stop -m mode``: ``immediate`` is a crash, recovered at
        the next start); :meth:`up` starts it again on the same port."""
        self._run(self.bin / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def up(self) -> None:
        self._start()

    def restart(self, mode: str = "immediate", pause: float = 0.0) -> None:
        """:meth:`down`, ``pause`` seconds, :meth:`up`: every connection is cut; the data stays."""
        self.down(mode)
        time.sleep(pause)
        self.up()

    def stop(self) -> None:
        try:
            self._run(self.bin / "pg_ctl", "-D", self.data, "-m", self.stop_mode, "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def dsn(self, database: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=bitlake dbname={database}"

    def url(self, database: str = "postgres") -> str:
        """The SQLAlchemy URL of ``database`` (psycopg 3)."""
        return f"postgresql+psycopg://bitlake@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(self.dsn(database), autocommit=True)

    def create_database(self, name: str) -> str:
        """A new, empty database ``name`` (dropped first if it exists); its URL."""
        with self.connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
