"""Fixtures of the trigger tests: the store on SQLite and on a real PostgreSQL server started here.

The server is :class:`bitlake.triggers.pgserver.PostgresServer` (Debian's ``postgresql`` package, ``initdb``
into a temporary folder, ``pg_ctl start`` on a free loopback port), stopped when the session ends.
Durability is switched off: these tests check behaviour, not crash safety.
"""

from __future__ import annotations

import pytest

from bitlake.triggers.pgserver import PostgresServer
from bitlake.triggers.store import TriggerStore, make_engine, run_migrations


@pytest.fixture(scope="session")
def postgres() -> PostgresServer:
    server = PostgresServer({"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
                             "max_connections": "50"}, stop_mode="immediate").start()
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
    with request.getfixturevalue("postgres").connect("triggers") as conn:
        conn.execute("TRUNCATE events, flows, tokens RESTART IDENTITY")
    return url


@pytest.fixture
def store(db_url):
    with TriggerStore(db_url) as s:
        yield s
