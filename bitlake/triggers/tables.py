"""The store's tables as SQLAlchemy models; the Alembic migrations in ``migrations/`` create them.

Every timestamp is an integer of microseconds since the Unix epoch (one type on SQLite and PostgreSQL, exact
comparisons, no time-zone handling in SQL). Keep the models and the latest migration in step:
``tests/triggers/test_store.py`` compares them on both databases.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import JSON, BigInteger, Index, Integer, String, Table, UniqueConstraint
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite gives an autoincrement key only to a column declared exactly INTEGER PRIMARY KEY.
Id = BigInteger().with_variant(Integer(), "sqlite")
Json = JSON().with_variant(JSONB(), "postgresql")

VERSION_TABLE = "bitlake_triggers_version"


class Base(DeclarativeBase):
    pass


class EventRow(Base):
    """One Data Change Event.

    ``snapshot_id`` is '' rather than NULL when the event has none (Hive), and ``partition_json`` is the
    text ``null`` for an unpartitioned table, because SQL unique constraints treat NULLs as distinct and
    registration must be idempotent for those events too. The unique index (table, partition, snapshot)
    also serves the partition trigger; (table, event_id) serves the snapshot trigger and id paging;
    (table, event_ts) serves time-range listings.
    """

    __tablename__ = "events"
    __table_args__ = (
        UniqueConstraint("table_name", "partition_json", "snapshot_id", name="uq_events_table_partition_snapshot"),
        Index("ix_events_table_event_id", "table_name", "event_id"),
        Index("ix_events_table_event_ts", "table_name", "event_ts"),
        # AUTOINCREMENT: SQLite never reuses an id, so event ids only grow even if the newest row is deleted.
        {"sqlite_autoincrement": True},
    )

    event_id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    event_ts: Mapped[int] = mapped_column(BigInteger, nullable=False)
    table_name: Mapped[str] = mapped_column(String(512), nullable=False)
    partition_json: Mapped[str] = mapped_column(String(2048), nullable=False)
    snapshot_id: Mapped[str] = mapped_column(String(128), nullable=False)
    snapshot_ts: Mapped[int | None] = mapped_column(BigInteger)
    prev_snapshot_id: Mapped[str | None] = mapped_column(String(128))
    table_format: Mapped[str] = mapped_column(String(16), nullable=False)
    operation_type: Mapped[str] = mapped_column(String(16), nullable=False)
    tags: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False)


class FlowRow(Base):
    """A consumer flow's cursor on one table: the last event id it acknowledged, and its tag filter."""

    __tablename__ = "flows"

    flow_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    table_name: Mapped[str] = mapped_column(String(512), primary_key=True)
    tags_json: Mapped[str] = mapped_column(String(16384), nullable=False)
    start_ts: Mapped[int | None] = mapped_column(BigInteger)
    last_event_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    created_at: Mapped[int] = mapped_column(BigInteger, nullable=False)
    acked_at: Mapped[int | None] = mapped_column(BigInteger)


class TokenRow(Base):
    """An API token: only its SHA-256 is kept; ``tables`` is a JSON list of fnmatch globs."""

    __tablename__ = "tokens"
    __table_args__ = (UniqueConstraint("token_hash", name="uq_tokens_token_hash"), {"sqlite_autoincrement": True})

    token_id: Mapped[int] = mapped_column(Id, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    token_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    tables: Mapped[list[str]] = mapped_column(Json, nullable=False)
    created_at: Mapped[int] = mapped_column(BigInteger, nullable=False)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger)


EVENTS = cast(Table, EventRow.__table__)
FLOWS = cast(Table, FlowRow.__table__)
TOKENS = cast(Table, TokenRow.__table__)
