"""The SQL the trigger store writes by hand, and the PostgreSQL fast paths that run it.

- :func:`event_json_sql`: an event row's JSON in the documented encoding, written by the database (SQLite
  and PostgreSQL), so that Python builds no object per event it hands out.
- The PostgreSQL registration statement (:data:`PG_INSERT_NEW`, :data:`PG_INSERT_UNREGISTERED`), and the
  reads of the stable horizon under the registration lock (:func:`stable_horizon`,
  :func:`flow_and_horizon`): each one statement on an autocommit connection, since round trips are most
  of what a request costs there. The module docstring of :mod:`bitlake.triggers.store` says why snapshot
  triggers read only up to the stable horizon.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import Row
from sqlalchemy.exc import IntegrityError

# A PostgreSQL advisory lock key ("bitlake1" as a 64-bit number; database.MIGRATION_LOCK is "bitlake2"):
# registrations hold it shared, a read of the stable horizon exclusively.
REGISTRATION_LOCK = 0x6269746C616B6531


def _timestamp_sql(dialect: str, column: str) -> str:
    """SQL of the text :func:`~bitlake.triggers.event.format_timestamp` writes for an integer of microseconds
    since the epoch (NULL stays NULL), exact over years 1 to 9999: whole seconds and microseconds are added
    separately, so no floating-point value holds more than 2**53."""
    if dialect == "postgresql":
        return (f"to_char(timestamp '1970-01-01' + ({column} / 1000000) * interval '1 second' "
                f"+ mod({column}, 1000000) * interval '1 microsecond', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
    micros = f"(({column}) % 1000000 + 1000000) % 1000000"  # SQLite's % truncates: this is the floor's remainder
    return (f"strftime('%Y-%m-%dT%H:%M:%S', (({column}) - {micros}) / 1000000, 'unixepoch') "
            f"|| printf('.%06dZ', {micros})")


def event_json_sql(dialect: str, alias: str) -> str:
    """SQL of the JSON text of the event row ``alias`` in the documented encoding (see
    :func:`~bitlake.triggers.event.encode_events`): the database writes the events a request hands out, so
    Python never builds an object per event. tests/triggers/test_store.py checks it against the models."""
    e = alias
    ts = functools.partial(_timestamp_sql, dialect)
    if dialect == "postgresql":
        return (f"CAST(json_build_object('event_id', {e}.event_id, 'event_ts', {ts(f'{e}.event_ts')}, "
                f"'table', {e}.table_name, 'partition', CAST({e}.partition_json AS json), "
                f"'snapshot_id', nullif({e}.snapshot_id, ''), 'snapshot_ts', {ts(f'{e}.snapshot_ts')}, "
                f"'prev_snapshot_id', {e}.prev_snapshot_id, 'table_format', {e}.table_format, "
                f"'operation_type', {e}.operation_type, 'tags', {e}.tags) AS text)")
    return (f"json_object('event_id', {e}.event_id, 'event_ts', {ts(f'{e}.event_ts')}, "
            f"'table', {e}.table_name, 'partition', json({e}.partition_json), "
            f"'snapshot_id', nullif({e}.snapshot_id, ''), 'snapshot_ts', {ts(f'{e}.snapshot_ts')}, "
            f"'prev_snapshot_id', {e}.prev_snapshot_id, 'table_format', {e}.table_format, "
            f"'operation_type', {e}.operation_type, 'tags', json({e}.tags))")


# One statement for any batch size, so that psycopg parses and prepares it once; the batch is one JSON
# parameter (escaping text arrays element by element cost more than the rest of the call), read as jsonb
# (json_to_recordset would parse each row's tags again). The lock CTE feeds every input
# row, so the shared lock is held before the INSERT draws an id. Only the inserted rows' keys and ids come
# back: the answer's events are the request's, which Python writes with their ids (the database writing their
# JSON, and Python reading it back, cost more: docs/triggers.md).
#
# Two forms (see store.TriggerStore._register): a plain INSERT, run alone in autocommit, which a key registered
# already fails with a unique violation (:func:`insert_new`; the service runs it on a psycopg connection of its
# own: storecalls.DirectInsert); and one that skips such keys (ON CONFLICT DO NOTHING), run in a transaction,
# after which store.TriggerStore._stored reads the skipped keys in a second statement. Looking them up in the
# statement instead, by joining the input with the events table, made the cost grow with the table: psycopg
# prepares a statement after five runs, and the generic plan made while the table was small scanned all of
# it (docs/triggers.md).
_PG_INSERT = """
WITH registration_lock AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(:lock_key) AS locked),
input AS (
    SELECT i.* FROM registration_lock,
        ROWS FROM (jsonb_to_recordset(CAST(:rows AS jsonb)) AS (table_name text, partition_json text, snapshot_id text,
                                                               snapshot_ts bigint, prev_snapshot_id text,
                                                               table_format text, operation_type text, tags jsonb))
        WITH ORDINALITY AS i(table_name, partition_json, snapshot_id, snapshot_ts, prev_snapshot_id, table_format,
                             operation_type, tags, ord)
),
inserted AS (
    INSERT INTO events (event_ts, table_name, partition_json, snapshot_id, snapshot_ts, prev_snapshot_id,
                        table_format, operation_type, tags)
    SELECT :event_ts, table_name, partition_json, snapshot_id, snapshot_ts, prev_snapshot_id, table_format,
           operation_type, tags
    FROM input ORDER BY ord
    {on_conflict}
    RETURNING *
)
SELECT table_name, partition_json, snapshot_id, event_id FROM inserted
"""
PG_INSERT_NEW = text(_PG_INSERT.format(on_conflict=""))
PG_INSERT_UNREGISTERED = text(_PG_INSERT.format(
    on_conflict="ON CONFLICT (table_name, partition_json, snapshot_id) DO NOTHING"))

# The stable horizon: the exclusive lock, then the highest id, in one autocommit statement.
_PG_STABLE_HORIZON = text("SELECT pg_advisory_xact_lock(:k), (SELECT max(event_id) FROM events)")

# The flow's cursor and the stable horizon in one autocommit statement.
_PG_FLOW_AND_HORIZON = text("""
SELECT (SELECT max(event_id) FROM events) AS horizon, f.*
FROM (SELECT pg_advisory_xact_lock(:lock_key)) AS registration_lock
LEFT JOIN flows AS f ON f.flow_name = :flow AND f.table_name = :table
""")


def insert_new(reader: Engine, params: dict[str, Any]) -> Sequence[Row[Any]] | None:
    """The rows :data:`PG_INSERT_NEW` returns (key columns, then event_id) when it inserted every key of the
    batch (``params``: :attr:`~bitlake.triggers.registration.PlannedRegistration.pg_params`) in autocommit on
    ``reader``, or None, with nothing written, when one is registered already (a retry, or a concurrent
    registration of the same event that committed first): one round trip instead of three (BEGIN, the
    statement, COMMIT), and a plain INSERT, cheaper than ON CONFLICT's speculative insertion. The unique
    violation of a retry is logged by the server."""
    try:
        with reader.connect() as conn:
            return conn.execute(PG_INSERT_NEW, params).all()
    except IntegrityError as e:
        if getattr(e.orig, "sqlstate", None) == "23505":
            return None
        raise


def stable_horizon(conn: Connection) -> int:
    """The highest event id below which no registration is still in flight (0: no events), on an autocommit
    connection: the statement holds the exclusive lock, so every registration that drew an id below the
    highest it sees (its snapshot predates the lock) has finished by the time it returns."""
    return conn.execute(_PG_STABLE_HORIZON, {"k": REGISTRATION_LOCK}).one()[1] or 0


def flow_and_horizon(conn: Connection, flow: str, table: str) -> tuple[Row[Any] | None, int]:
    """The ``flows`` row of (``flow``, ``table``), None when there is none, and the stable horizon (see
    :func:`stable_horizon`), read by one autocommit statement."""
    row = conn.execute(_PG_FLOW_AND_HORIZON, {"lock_key": REGISTRATION_LOCK, "flow": flow, "table": table}).one()
    return (None if row.flow_name is None else row), row.horizon or 0
