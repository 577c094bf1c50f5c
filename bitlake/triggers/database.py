"""The trigger store's database connection: engines set up for SQLite and PostgreSQL, the schema migrations
that run whenever a store is opened, and the retry of a call whose pooled connection turned out dead.
"""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool

from bitlake.errors import InvalidSettingError

MIGRATIONS = Path(__file__).parent / "migrations"
# A PostgreSQL advisory lock key ("bitlake2" as a 64-bit number; statements.REGISTRATION_LOCK is "bitlake1").
MIGRATION_LOCK = 0x6269746C616B6532


def make_engine(url: str, *, pool_size: int = 5, max_overflow: int = 10, echo: bool = False) -> Engine:
    """An engine for ``url`` set up for the store: SQLite in WAL mode with a busy timeout; PostgreSQL via psycopg 3."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:"):
            # One shared connection, or every connection would see its own empty in-memory database.
            return create_engine(parsed, echo=echo, poolclass=StaticPool,
                                 connect_args={"check_same_thread": False})
        Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, echo=echo, connect_args={"timeout": 30, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _wal(dbapi_connection, _record):  # readers never block the writer, nor it them
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.close()

        return engine
    if backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        return create_engine(parsed, echo=echo, pool_size=pool_size, max_overflow=max_overflow)
    raise InvalidSettingError(f"the trigger store runs on SQLite or PostgreSQL, not {backend!r} ({url})")


def run_migrations(engine: Engine, revision: str = "head") -> None:
    """Upgrade the store's schema to ``revision`` (Alembic), serialised against concurrent starts."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def once_more_if_disconnected(method):
    """Runs ``method`` again when its connection turned out to be dead (the database restarted).

    The pool does not ping a connection before handing it out (a round trip on every request); SQLAlchemy
    instead drops every pooled connection when one fails as disconnected, so the second attempt opens a new
    one. Each operation wrapped is idempotent: a registration whose commit landed before the connection died
    is a retry (its events come back with ``created`` false), an acknowledgement a no-op.
    """
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except DBAPIError as e:
            if not e.connection_invalidated:
                raise
        return method(self, *args, **kwargs)

    return call
