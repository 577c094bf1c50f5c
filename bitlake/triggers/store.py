"""The trigger store: Data Change Events, consumer flow cursors and API tokens in a SQL database.

SQLite (one embedded file, the default) or PostgreSQL, through SQLAlchemy; the schema is created and
upgraded by the Alembic migrations in ``migrations/`` whenever a store is opened.

Why snapshot triggers read only up to a "stable horizon" on PostgreSQL: event ids come from a sequence,
so two concurrent registrations can commit out of id order (id 11 visible while id 10 is still in
flight). A flow that acknowledged 11 would never see 10. Registrations therefore hold a shared advisory
lock for their whole transaction, and a snapshot evaluation briefly takes it exclusively to read the
highest committed id: every id at or below it is final. SQLite has one writer at a time, so ids commit in
order there and no horizon is needed.

Round trips are what a request costs on PostgreSQL, so each operation sends few statements: reads run on
autocommit connections (no BEGIN and ROLLBACK around a single SELECT), the stable horizon is one statement
that takes the lock and reads the highest id (and the flow's cursor), a registration of new events is one
autocommit statement whatever its size (one JSON parameter, the advisory lock taken in it before any id is
drawn; a retry runs again between BEGIN and COMMIT), and the pool pings no connection before use (see
:func:`_once_more_if_disconnected`).

Python CPU is the other cost, so the events a request hands out are written as JSON by the database
(:func:`event_json_sql`): the ``*_json`` methods return the service's response bodies, and the model-returning
methods decode those same bytes. A registration is the exception: its answer holds the request's own events,
which Python writes with the ids the database drew, rather than have the database write them again.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import fnmatch
import functools
import hashlib
import json
import secrets
import time
import zoneinfo
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic_core
from alembic import command
from alembic.config import Config as AlembicConfig
from pydantic import BaseModel, Field
from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    and_,
    create_engine,
    event,
    insert,
    literal,
    literal_column,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Row, make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.pool import StaticPool

from bitlake.triggers.config import DEFAULT_DB_URL, TriggerConfig
from bitlake.triggers.errors import (
    BadCursorError,
    EventConflictError,
    EventNotFoundError,
    FlowConflictError,
    FlowNotFoundError,
    TriggerError,
)
from bitlake.triggers.event import (
    EventIn,
    Timestamp,
    canonical_partition,
    canonical_tags,
    format_timestamp,
    from_micros,
    to_micros,
)
from bitlake.triggers.models import ANY_PARTITION, EventPage, Registration, RegistrationResult, Role
from bitlake.triggers.tables import EVENTS, FLOWS, TOKENS
from bitlake.triggers.trigger import (
    FlowCursor,
    PartitionTrigger,
    PartitionTriggerResult,
    SnapshotTrigger,
    SnapshotTriggerResult,
    render_partition,
)

MIGRATIONS = Path(__file__).parent / "migrations"
# PostgreSQL advisory lock keys ("bitlake" + a digit, as 64-bit numbers); see the module docstring.
REGISTRATION_LOCK = 0x6269746C616B6531
MIGRATION_LOCK = 0x6269746C616B6532
TOKEN_PREFIX = "blt_"
MAX_TOKEN_GLOBS = 64


class TokenInfo(BaseModel):
    """A token as the store knows it (never the token itself)."""

    token_id: int
    name: str
    role: Role
    tables: list[str] = Field(description="fnmatch globs of the tables the token may touch")
    created_at: Timestamp
    revoked_at: Timestamp | None

    def allows(self, table: str) -> bool:
        return any(fnmatch.fnmatchcase(table, glob) for glob in self.tables)


def now_micros() -> int:
    return time.time_ns() // 1000


def hash_token(token: str) -> str:
    # Tokens are 256 random bits, so a fast hash is as safe as a slow one and keeps every request cheap.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def encode_cursor(after_event_id: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"after": after_event_id}).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))["after"]
    except (ValueError, TypeError, KeyError, binascii.Error):
        raise BadCursorError(f"cursor {cursor[:64]!r} was not handed out by this service") from None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadCursorError(f"cursor {cursor[:64]!r} was not handed out by this service")
    return value


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
    raise ValueError(f"the trigger store runs on SQLite or PostgreSQL, not {backend!r} ({url})")


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


def _with_events(head: BaseModel, events: Iterable[str]) -> bytes:
    """``head`` as JSON with the events' JSON texts as its ``events``, which must be its last field, empty."""
    text = head.model_dump_json()
    assert text.endswith(',"events":[]}'), text[-40:]
    return f"{text[:-2]}{','.join(events)}]}}".encode()


def _cursor(row: Row) -> FlowCursor:
    return FlowCursor(
        flow=row.flow_name, table=row.table_name, tags=json.loads(row.tags_json),
        start=None if row.start_ts is None else from_micros(row.start_ts), last_event_id=row.last_event_id,
        created_at=from_micros(row.created_at), acked_at=None if row.acked_at is None else from_micros(row.acked_at))


def _token(row: Row) -> TokenInfo:
    return TokenInfo(token_id=row.token_id, name=row.name, role=Role(row.role), tables=row.tables,
                     created_at=from_micros(row.created_at),
                     revoked_at=None if row.revoked_at is None else from_micros(row.revoked_at))


_PAYLOAD = ("snapshot_ts", "prev_snapshot_id", "table_format", "operation_type", "tags")


def _row(e: EventIn, event_ts: int) -> dict[str, Any]:
    table, partition_json, snapshot_id = e.key()
    return {
        "event_ts": event_ts, "table_name": table, "partition_json": partition_json, "snapshot_id": snapshot_id,
        "snapshot_ts": None if e.snapshot_ts is None else to_micros(e.snapshot_ts),
        "prev_snapshot_id": e.prev_snapshot_id, "table_format": e.table_format.value,
        "operation_type": e.operation_type.value, "tags": e.tags,
    }


# One statement for any batch size, so that psycopg parses and prepares it once; the batch is one JSON
# parameter (escaping text arrays element by element cost more than the rest of the call), read as jsonb
# (half the time of json_to_recordset, which parses each row's tags again). The lock CTE feeds every input
# row, so the shared lock is held before the INSERT draws an id. Only the inserted rows' keys and ids come
# back: the answer's events are the request's, which Python writes with their ids (the database writing their
# JSON cost it a third of the statement, and Python as much again to read it).
#
# Two forms (see TriggerStore._register): a plain INSERT, run alone in autocommit, which a key registered
# already fails with a unique violation (the service runs it on a psycopg connection of its own:
# storecalls.DirectInsert); and one that skips such keys (ON CONFLICT DO NOTHING), run in a transaction,
# after which _stored reads the skipped keys in a second statement. Looking them up in the
# statement instead, by joining the input with the events table, made the cost grow with the table: psycopg
# prepares a statement after five runs, and the generic plan made while the table was small scanned all of
# it (10 ms a request at 10,000 events, 50 ms at 70,000).
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
_PG_INSERT_UNREGISTERED = text(_PG_INSERT.format(
    on_conflict="ON CONFLICT (table_name, partition_json, snapshot_id) DO NOTHING"))

# The flow's cursor and the stable horizon (see the module docstring) in one autocommit statement.
_PG_FLOW_AND_HORIZON = text("""
SELECT (SELECT max(event_id) FROM events) AS horizon, f.*
FROM (SELECT pg_advisory_xact_lock(:lock_key)) AS registration_lock
LEFT JOIN flows AS f ON f.flow_name = :flow AND f.table_name = :table
""")

# What _register finds for each key of a batch: event id, whether this request created it, the payload
# fields in which the stored event differs from the request's, and the stored event's JSON (None when created).
_Found = tuple[int, bool, list[str], str | None]


def _created(inserted: Iterable[Sequence]) -> dict[tuple[str, str, str], _Found]:
    """What _register finds for the rows an INSERT returned (key columns, then event_id): created events."""
    return {(table, partition, snapshot): (event_id, True, [], None)
            for table, partition, snapshot, event_id in inserted}


class PlannedRegistration:
    """The requests of one registration transaction, validated and keyed: what the store inserts, and how it
    answers each request once it knows the event id of every key (:meth:`answers`).

    Built without the database, so that the service can plan in its event loop and try the insert of new
    events on its own connection (storecalls.py) before it hands the plan's requests to the store.
    """

    def __init__(self, batches: list[list[EventIn]], registered_at: int):
        self.batches, self.registered_at = batches, registered_at
        self.rows = [[_row(e, registered_at) for e in batch] for batch in batches]
        # the first row of each key, in request order; a later one is a retry of it
        self.unique: dict[tuple[str, str, str], dict[str, Any]] = {}
        for batch_rows in self.rows:
            for r in batch_rows:
                self.unique.setdefault((r["table_name"], r["partition_json"], r["snapshot_id"]), r)

    @classmethod
    def of(cls, requests: Sequence[Iterable[EventIn | Mapping[str, Any]]]) -> PlannedRegistration:
        return cls([[e if isinstance(e, EventIn) else EventIn.model_validate(e) for e in events]
                    for events in requests], now_micros())

    def one_by_one(self) -> list[PlannedRegistration]:
        """Each request as a plan of its own, with the same registration time."""
        return [PlannedRegistration([batch], self.registered_at) for batch in self.batches]

    @property
    def distinct(self) -> bool:
        """No key is repeated: every event may be new."""
        return len(self.unique) == sum(map(len, self.rows))

    @functools.cached_property
    def pg_params(self) -> dict[str, Any]:
        """The parameters of the PostgreSQL INSERT (``_PG_INSERT``)."""
        values = list(self.unique.values())
        # pydantic's JSON writer (Rust), three times as fast as the json module; event_ts is ignored: one for all
        return {"rows": pydantic_core.to_json(values).decode(), "event_ts": self.registered_at,
                "lock_key": REGISTRATION_LOCK}

    def answers_inserted(self, inserted: Iterable[Sequence]) -> list[bytes]:
        """:meth:`answers` when every key was inserted: ``inserted`` are the rows :data:`PG_INSERT_NEW` returned."""
        return self.answers(_created(inserted))

    def answers(self, found: Mapping[tuple[str, str, str], _Found]) -> list[bytes]:
        """Each request's answer, the JSON of a :class:`RegistrationResult`; raises :class:`EventConflictError`
        for the first event that differs from the one registered under its key."""
        registered_at = format_timestamp(from_micros(self.registered_at))
        answers = []
        for batch, batch_rows in zip(self.batches, self.rows, strict=True):
            out = []
            for e, r in zip(batch, batch_rows, strict=True):
                key = (r["table_name"], r["partition_json"], r["snapshot_id"])
                event_id, created, differs, stored = found[key]
                first = self.unique[key]
                if r is not first:  # a duplicate of an earlier event of these requests is a retry of it
                    created, differs = False, [f for f in _PAYLOAD if r[f] != first[f]]
                if differs:
                    raise EventConflictError(
                        f"event {event_id} of table {e.table!r}, partition {e.partition!r}, snapshot "
                        f"{e.snapshot_id!r} is registered with other {', '.join(differs)}; a retry must "
                        f"repeat the event exactly (nothing of this request was registered)")
                out.append({"created": created, "event": json.loads(stored) if stored is not None else {
                    "event_id": event_id, "event_ts": registered_at, "table": e.table, "partition": e.partition,
                    "snapshot_id": e.snapshot_id,
                    "snapshot_ts": None if e.snapshot_ts is None else format_timestamp(e.snapshot_ts),
                    "prev_snapshot_id": e.prev_snapshot_id, "table_format": r["table_format"],
                    "operation_type": r["operation_type"], "tags": r["tags"]}})
            answers.append(pydantic_core.to_json({"events": out}))
        return answers


def _once_more_if_disconnected(method):
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


def _tag_filter(tags: Mapping[str, str] | None) -> list:
    return [EVENTS.c.tags[k].as_string() == v for k, v in (tags or {}).items()]


class TriggerStore:
    """The events, flow cursors and tokens of one database; opening it migrates the schema to the latest.

    Args:
        url: a SQLAlchemy URL (``sqlite:///path``, ``sqlite://`` in memory, ``postgresql://...``) or an engine.
        migrate: run the migrations (``upgrade head``) before use.

    >>> store = TriggerStore("sqlite://")
    >>> [r.created for r in store.register([{"table": "db.t", "snapshot_id": "1", "table_format": "BITLAKE",
    ...                                      "operation_type": "APPEND"}] * 2)]
    [True, False]
    >>> store.close()
    """

    def __init__(self, url: str | Engine = DEFAULT_DB_URL, *, migrate: bool = True):
        self.engine = url if isinstance(url, Engine) else make_engine(url)
        # Single-statement reads need no transaction block; on PostgreSQL one costs two extra round trips.
        self._reader = (self.engine.execution_options(isolation_level="AUTOCOMMIT")
                        if self.dialect == "postgresql" else self.engine)
        self._event_json: ColumnElement = literal_column(event_json_sql(self.dialect, EVENTS.name)).label("event_json")
        if migrate:
            run_migrations(self.engine)

    @classmethod
    def from_config(cls, config: TriggerConfig) -> TriggerStore:
        return cls(make_engine(config.db_url, pool_size=config.pool_size, max_overflow=config.max_overflow,
                               echo=config.sql_echo))

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> TriggerStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _insert(self, table):
        return (postgresql.insert if self.dialect == "postgresql" else sqlite.insert)(table)

    def _stable_horizon(self, conn: Connection | None = None) -> int | None:
        """The highest event id below which no registration is still in flight (None: no limit needed).

        One autocommit statement: it holds the exclusive lock, so every registration that drew an id below
        the highest it sees (its snapshot predates the lock) has finished by the time it returns.
        """
        if self.dialect != "postgresql":
            return None
        query = text("SELECT pg_advisory_xact_lock(:k), (SELECT max(event_id) FROM events)")
        if conn is None:
            with self._reader.connect() as c:
                return c.execute(query, {"k": REGISTRATION_LOCK}).one()[1] or 0
        return conn.execute(query, {"k": REGISTRATION_LOCK}).one()[1] or 0

    # -- events ---------------------------------------------------------------------------------------

    def register(self, events: Iterable[EventIn | Mapping[str, Any]]) -> list[Registration]:
        """Register events in one transaction; those already registered (same table, partition and
        snapshot_id, same payload) are returned as they are, so a retried registration changes nothing.

        Raises:
            EventConflictError: an event exists under the same key with a different payload; nothing of
                the batch is written.
        """
        return RegistrationResult.model_validate_json(self.register_json(events)).events

    def register_json(self, events: Iterable[EventIn | Mapping[str, Any]]) -> bytes:
        """:meth:`register`, answering with the JSON of a :class:`RegistrationResult` (what ``POST /events``
        returns): the new events written from the request with the ids drawn, the others as the database
        writes them."""
        (answer,) = self.register_together_json([events])
        if isinstance(answer, EventConflictError):
            raise answer
        return answer

    @_once_more_if_disconnected
    def register_together_json(self, requests: Sequence[Iterable[EventIn | Mapping[str, Any]]], *,
                               insert_new_first: bool = True) -> list[bytes | EventConflictError]:
        """Several registration requests in one transaction, each answered as if they had run one after the
        other: with what :meth:`register_json` returns, or the :class:`EventConflictError` it raises.

        This is the service's group commit: requests that arrive while the store is busy cost one transaction
        between them. Ids follow the order of the requests; an event a request repeats from an earlier one
        is a retry of it. When a request conflicts, each request runs again in a transaction of its own, so
        the others are registered and the one that conflicts writes nothing.

        ``insert_new_first``: on PostgreSQL, first try the one-statement insert of new events
        (:meth:`_insert_new_postgresql`); False when the caller tried it already (see storecalls.py).
        """
        plan = PlannedRegistration.of(requests)
        try:
            return list(self._register_retrying(plan, insert_new_first))
        except EventConflictError as e:
            if len(plan.batches) == 1:
                return [e]
        answers: list[bytes | EventConflictError] = []
        for one in plan.one_by_one():
            try:
                answers.extend(self._register_retrying(one, insert_new_first))
            except EventConflictError as e:
                answers.append(e)
        return answers

    def _register_retrying(self, plan: PlannedRegistration, insert_new_first: bool) -> list[bytes]:
        for attempt in range(3):
            try:
                return self._register(plan, insert_new_first)
            except OperationalError as e:
                # Two batches sharing events in different orders can deadlock on PostgreSQL; the loser's
                # transaction was rolled back whole, so running it again is safe.
                if attempt == 2 or getattr(e.orig, "sqlstate", None) not in ("40P01", "40001"):
                    raise
        raise AssertionError("unreachable")

    def _register(self, plan: PlannedRegistration, insert_new_first: bool) -> list[bytes]:
        # Ids follow the order of the batches (a producer sends its commits in order); a duplicate key
        # inserts once, and the INSERT skips keys already registered.
        if not plan.unique:
            return [b'{"events":[]}' for _ in plan.batches]
        postgres = self.dialect == "postgresql"
        if postgres and insert_new_first and plan.distinct:
            found = self._insert_new_postgresql(plan.pg_params)
            if found is not None:
                return plan.answers(found)
        with self.engine.begin() as conn:
            if postgres:
                found = _created(conn.execute(_PG_INSERT_UNREGISTERED, plan.pg_params))
            else:
                ev = EVENTS
                statement = (self._insert(ev)
                             .on_conflict_do_nothing(index_elements=["table_name", "partition_json", "snapshot_id"])
                             .returning(ev.c.table_name, ev.c.partition_json, ev.c.snapshot_id, ev.c.event_id))
                found = _created(conn.execute(statement, list(plan.unique.values())))
            missing = [key for key in plan.unique if key not in found]
            if missing:  # registered before, or by a transaction that committed while this one ran; now visible
                found.update(self._stored(conn, plan.unique, missing))
            return plan.answers(found)  # a conflict raises here: nothing is committed

    def _insert_new_postgresql(self, params: dict[str, Any]) -> dict[tuple[str, str, str], _Found] | None:
        """Every key of the batch (``params``: :attr:`PlannedRegistration.pg_params`) inserted by one statement
        in autocommit, or None, with nothing written, when one is registered already (a retry, or a concurrent
        registration of the same event that committed first): one round trip instead of three (BEGIN, the
        statement, COMMIT), and a plain INSERT, cheaper than ON CONFLICT's speculative insertion. The unique
        violation of a retry is logged by the server."""
        try:
            with self._reader.connect() as conn:
                return _created(conn.execute(PG_INSERT_NEW, params))
        except IntegrityError as e:
            if getattr(e.orig, "sqlstate", None) == "23505":
                return None
            raise

    def _stored(self, conn: Connection, unique: Mapping[tuple[str, str, str], dict[str, Any]],
                keys: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], _Found]:
        """The stored events of ``keys``, each with the payload fields in which it differs from ``unique``'s."""
        ev = EVENTS
        query = select(ev.c.table_name, ev.c.partition_json, ev.c.snapshot_id, ev.c.event_id,
                       *(ev.c[f] for f in _PAYLOAD), self._event_json).where(
            tuple_(ev.c.table_name, ev.c.partition_json, ev.c.snapshot_id).in_(keys))
        found: dict[tuple[str, str, str], _Found] = {}
        for r in conn.execute(query):
            key = (r.table_name, r.partition_json, r.snapshot_id)
            found[key] = (r.event_id, False, [f for f in _PAYLOAD if getattr(r, f) != unique[key][f]], r.event_json)
        return found

    def _fired(self, conn: Connection, where: list, limit: int) -> tuple[list[str], int | None, bool]:
        """The JSON of the first ``limit`` events matching ``where`` by event id, the last one's id, and
        whether more matched."""
        ev = EVENTS
        # The LIMIT is written into the SQL, not bound: a prepared statement's generic plan cannot see a bound
        # limit, and for a partition trigger on PostgreSQL it then walked the table's (table_name, event_id)
        # index filtering every event of the table (7.7 ms at 10 million events) instead of reading the
        # partition's rows from the unique index and sorting them (0.5 ms).
        rows = conn.execute(select(ev.c.event_id, self._event_json).where(*where)
                            .order_by(ev.c.event_id).limit(literal(limit + 1, literal_execute=True))).all()
        shown = rows[:limit]
        return [event_json for _, event_json in shown], shown[-1][0] if shown else None, len(rows) > limit

    def events(self, table: str, *, partition: list[str | None] | None = ANY_PARTITION,
               tags: Mapping[str, str] | None = None, since: dt.datetime | None = None,
               until: dt.datetime | None = None, min_event_id: int | None = None, max_event_id: int | None = None,
               cursor: str | None = None, limit: int = 100) -> EventPage:
        """The events of ``table`` by event id, filtered: ``partition`` exactly (``None``: unpartitioned),
        every tag in ``tags``, ``since <= event_ts < until``, ``min_event_id <= event_id <= max_event_id``."""
        return EventPage.model_validate_json(self.events_json(
            table, partition=partition, tags=tags, since=since, until=until, min_event_id=min_event_id,
            max_event_id=max_event_id, cursor=cursor, limit=limit))

    @_once_more_if_disconnected
    def events_json(self, table: str, *, partition: list[str | None] | None = ANY_PARTITION,
                    tags: Mapping[str, str] | None = None, since: dt.datetime | None = None,
                    until: dt.datetime | None = None, min_event_id: int | None = None,
                    max_event_id: int | None = None, cursor: str | None = None, limit: int = 100) -> bytes:
        """:meth:`events` as the JSON of an :class:`EventPage` (what ``GET /events`` returns)."""
        ev = EVENTS
        where = [ev.c.table_name == table, *_tag_filter(tags)]
        if partition is not ANY_PARTITION:
            where.append(ev.c.partition_json == canonical_partition(partition))
        if since is not None:
            where.append(ev.c.event_ts >= to_micros(since))
        if until is not None:
            where.append(ev.c.event_ts < to_micros(until))
        if min_event_id is not None:
            where.append(ev.c.event_id >= min_event_id)
        if max_event_id is not None:
            where.append(ev.c.event_id <= max_event_id)
        if cursor is not None:
            where.append(ev.c.event_id > decode_cursor(cursor))
        with self._reader.connect() as conn:
            found, last, more = self._fired(conn, [and_(*where)], limit)
        page = EventPage.model_construct(next_cursor=encode_cursor(last) if more and last is not None else None,
                                         events=[])
        return _with_events(page, found)

    # -- triggers -------------------------------------------------------------------------------------

    def evaluate_partition_trigger(self, trigger: PartitionTrigger, *, now: dt.datetime | None = None
                                   ) -> PartitionTriggerResult:
        """Fires when events of the rendered partition with the tags were registered at or before ``at``."""
        return PartitionTriggerResult.model_validate_json(self.evaluate_partition_trigger_json(trigger, now=now))

    @_once_more_if_disconnected
    def evaluate_partition_trigger_json(self, trigger: PartitionTrigger, *, now: dt.datetime | None = None
                                        ) -> bytes:
        """:meth:`evaluate_partition_trigger` as the JSON of its result (what ``POST /triggers/partition``
        returns)."""
        at, scheduled, following = trigger.evaluate_at(now or dt.datetime.now(dt.UTC))
        partition = trigger.partition
        found: list[str] = []
        more = False
        if scheduled is not None:
            partition = render_partition(trigger.partition, scheduled, zoneinfo.ZoneInfo(trigger.timezone))
            ev = EVENTS
            where = [ev.c.table_name == trigger.table, ev.c.partition_json == canonical_partition(partition),
                     ev.c.event_ts <= to_micros(at), *_tag_filter(trigger.tags)]
            with self._reader.connect() as conn:
                found, _, more = self._fired(conn, where, trigger.limit)
        head = PartitionTriggerResult.model_construct(
            fired=bool(found), table=trigger.table, partition=partition, tags=trigger.tags, evaluated_at=at,
            scheduled_time=scheduled, next_scheduled_time=following, has_more=more, events=[])
        return _with_events(head, found)

    def flow(self, flow: str, table: str, *, conn: Connection | None = None) -> FlowCursor | None:
        query = select(FLOWS).where(FLOWS.c.flow_name == flow, FLOWS.c.table_name == table)
        if conn is None:
            with self._reader.connect() as c:
                row = c.execute(query).first()
        else:
            row = conn.execute(query).first()
        return None if row is None else _cursor(row)

    def _flow_and_horizon(self, conn: Connection, flow: str, table: str) -> tuple[FlowCursor | None, int | None]:
        if self.dialect != "postgresql":
            return self.flow(flow, table, conn=conn), None
        row = conn.execute(_PG_FLOW_AND_HORIZON, {"lock_key": REGISTRATION_LOCK, "flow": flow, "table": table}).one()
        return (None if row.flow_name is None else _cursor(row)), row.horizon or 0

    def evaluate_snapshot_trigger(self, trigger: SnapshotTrigger) -> SnapshotTriggerResult:
        """Fires with the flow's events after its acknowledged cursor; never moves the cursor.

        The first evaluation of a (flow, table) records the flow with its tag filter and ``start``.

        Raises:
            FlowConflictError: the flow exists on this table with a different tag filter.
        """
        return SnapshotTriggerResult.model_validate_json(self.evaluate_snapshot_trigger_json(trigger))

    @_once_more_if_disconnected
    def evaluate_snapshot_trigger_json(self, trigger: SnapshotTrigger) -> bytes:
        """:meth:`evaluate_snapshot_trigger` as the JSON of its result (what ``POST /triggers/snapshot``
        returns)."""
        with self._reader.connect() as conn:
            cursor, horizon = self._flow_and_horizon(conn, trigger.flow, trigger.table)
            if cursor is not None:
                return self._snapshot_events(conn, trigger, cursor, horizon)
        # The first evaluation records the flow while holding no other connection, so that many first
        # evaluations at once cannot take the whole pool and wait for each other.
        with self.engine.begin() as writer:
            writer.execute(self._insert(FLOWS).on_conflict_do_nothing(), {
                "flow_name": trigger.flow, "table_name": trigger.table, "tags_json": canonical_tags(trigger.tags),
                "start_ts": None if trigger.start is None else to_micros(trigger.start), "last_event_id": 0,
                "created_at": now_micros(), "acked_at": None})
        with self._reader.connect() as conn:
            cursor, horizon = self._flow_and_horizon(conn, trigger.flow, trigger.table)
            assert cursor is not None
            return self._snapshot_events(conn, trigger, cursor, horizon)

    def _snapshot_events(self, conn: Connection, trigger: SnapshotTrigger, cursor: FlowCursor,
                         horizon: int | None) -> bytes:
        # The flow's cursor with the horizon, then the events: two autocommit statements on one connection
        # (one pool checkout) on PostgreSQL, the horizon's lock released once it is read.
        if cursor.tags != trigger.tags:
            raise FlowConflictError(
                f"flow {trigger.flow!r} follows table {trigger.table!r} with tags {cursor.tags}, not "
                f"{trigger.tags}: use another flow name for another filter")
        ev = EVENTS
        where = [ev.c.table_name == trigger.table, ev.c.event_id > cursor.last_event_id, *_tag_filter(trigger.tags)]
        if horizon is not None:
            where.append(ev.c.event_id <= horizon)
        if cursor.start is not None:
            where.append(ev.c.event_ts >= to_micros(cursor.start))
        found, _, more = self._fired(conn, where, trigger.limit)
        head = SnapshotTriggerResult.model_construct(fired=bool(found), cursor=cursor, has_more=more, events=[])
        return _with_events(head, found)

    @_once_more_if_disconnected
    def ack(self, flow: str, table: str, event_id: int) -> FlowCursor:
        """Move the flow's cursor on ``table`` to ``event_id``: its run processed every event up to it.

        Acknowledging the current position again is a no-op.

        Raises:
            FlowNotFoundError: the flow never evaluated a snapshot trigger on ``table``.
            EventNotFoundError: ``event_id`` is not an event of ``table``.
            FlowConflictError: ``event_id`` is below the cursor (the cursor never moves back), or is
                not yet stable (a registration with a lower id is still in flight; retry).
        """
        horizon = self._stable_horizon()
        stable = horizon is None or event_id <= horizon
        fl, ev = FLOWS, EVENTS
        this_flow = (fl.c.flow_name == flow, fl.c.table_name == table)
        with self.engine.begin() as conn:
            moved = 0
            if stable:
                # The write comes first: a SQLite transaction that reads and then writes can fail
                # instead of waiting for the lock.
                moved = conn.execute(
                    update(fl)
                    .where(*this_flow, fl.c.last_event_id < event_id,
                           select(ev.c.event_id).where(ev.c.event_id == event_id, ev.c.table_name == table).exists())
                    .values(last_event_id=event_id, acked_at=now_micros())).rowcount
            row = conn.execute(select(fl).where(*this_flow)).first()
            if row is None:
                raise FlowNotFoundError(f"flow {flow!r} has no cursor on table {table!r}: evaluate its snapshot "
                                        "trigger first")
            if moved or row.last_event_id == event_id:
                return _cursor(row)
            exists = conn.execute(select(ev.c.event_id).where(ev.c.event_id == event_id,
                                                              ev.c.table_name == table)).first()
            if exists is None:
                raise EventNotFoundError(f"no event {event_id} on table {table!r}")
            if row.last_event_id > event_id:
                raise FlowConflictError(f"flow {flow!r} on {table!r} already acknowledged event {row.last_event_id}; "
                                        f"the cursor never moves back to {event_id}")
            raise FlowConflictError(f"event {event_id} is not yet stable (a registration with a lower id is still "
                                    "in flight); retry")

    # -- tokens ---------------------------------------------------------------------------------------

    def create_token(self, role: Role | str, tables: Sequence[str] = ("*",), *, name: str = "") -> str:
        """Create a token and return it; only its hash is stored, so this is the one time it is seen.

        Args:
            role: ``producer`` (register events), ``consumer`` (query, evaluate, acknowledge) or ``admin``.
            tables: fnmatch globs of the tables the token may touch (``*`` for all).
            name: a label for the token list.
        """
        try:
            role = Role(role)
        except ValueError:
            raise TriggerError(f"unknown role {role!r}: producer, consumer or admin") from None
        globs = [tables] if isinstance(tables, str) else list(tables)
        if not globs or len(globs) > MAX_TOKEN_GLOBS or not all(isinstance(g, str) and 0 < len(g) <= 512
                                                                 for g in globs):
            raise TriggerError(f"a token needs 1 to {MAX_TOKEN_GLOBS} table globs of 1 to 512 characters")
        if len(name) > 200:
            raise TriggerError("a token name has at most 200 characters")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.engine.begin() as conn:
            conn.execute(insert(TOKENS), {"name": name, "token_hash": hash_token(token), "role": role.value,
                                                  "tables": globs, "created_at": now_micros(), "revoked_at": None})
        return token

    @_once_more_if_disconnected
    def authenticate(self, token: str) -> TokenInfo | None:
        """The token's details, or None when it is unknown or revoked."""
        tk = TOKENS
        with self._reader.connect() as conn:
            row = conn.execute(select(tk).where(tk.c.token_hash == hash_token(token),
                                                tk.c.revoked_at.is_(None))).first()
        return None if row is None else _token(row)

    def revoke_token(self, token_id: int) -> bool:
        """Revoke a token by id; False when there is no such active token."""
        tk = TOKENS
        with self.engine.begin() as conn:
            return bool(conn.execute(update(tk).where(tk.c.token_id == token_id, tk.c.revoked_at.is_(None))
                                     .values(revoked_at=now_micros())).rowcount)

    def tokens(self) -> list[TokenInfo]:
        with self.engine.connect() as conn:
            return [_token(r) for r in conn.execute(select(TOKENS).order_by(TOKENS.c.token_id))]


def create_token(role: Role | str, tables: Sequence[str] = ("*",), *, name: str = "", db_url: str | None = None,
                 config: TriggerConfig | None = None) -> str:
    """Create a token in the store named by ``db_url`` (else ``config``, else the environment) and return it.

    The admin helper: ``python -m bitlake.triggers token create --role producer --table 'sales.*'`` calls it.
    """
    config = config or TriggerConfig.load()
    with TriggerStore.from_config(config if db_url is None else config.model_copy(update={"db_url": db_url})) as s:
        return s.create_token(role, tables, name=name)
