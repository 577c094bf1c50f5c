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
:func:`~bitlake.triggers.database.once_more_if_disconnected`).

Python CPU is the other cost, so the events a request hands out are written as JSON by the database
(:func:`~bitlake.triggers.statements.event_json_sql`): the ``*_json`` methods return the service's response
bodies, and the model-returning methods decode those same bytes. A registration is the exception: its answer
holds the request's own events, which Python writes with the ids the database drew, rather than have the
database write them again.

This module holds :class:`TriggerStore`'s queries, triggers and transactions; the rest of the store is in
:mod:`~bitlake.triggers.database` (engines, migrations, the retry on a dead connection),
:mod:`~bitlake.triggers.statements` (the SQL written by hand, PostgreSQL's fast paths),
:mod:`~bitlake.triggers.registration` (registration planning), :mod:`~bitlake.triggers.tokens` (API tokens)
and :mod:`~bitlake.triggers.tables` (the tables).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import zoneinfo
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    and_,
    literal,
    literal_column,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Row
from sqlalchemy.exc import OperationalError

from bitlake.triggers import statements
from bitlake.triggers.config import DEFAULT_DB_URL, TriggerConfig
from bitlake.triggers.database import MIGRATION_LOCK, MIGRATIONS, make_engine, once_more_if_disconnected, run_migrations
from bitlake.triggers.errors import (
    BadCursorError,
    EventConflictError,
    EventNotFoundError,
    FlowConflictError,
    FlowNotFoundError,
)
from bitlake.triggers.event import (
    EventIn,
    canonical_partition,
    canonical_tags,
    from_micros,
    now_micros,
    to_micros,
)
from bitlake.triggers.models import ANY_PARTITION, EventPage, Registration, RegistrationResult, Role
from bitlake.triggers.registration import PAYLOAD, Found, PlannedRegistration, found_inserted
from bitlake.triggers.statements import PG_INSERT_NEW, PG_INSERT_UNREGISTERED, REGISTRATION_LOCK, event_json_sql
from bitlake.triggers.tables import EVENTS, FLOWS
from bitlake.triggers.tokens import MAX_TOKEN_GLOBS, TOKEN_PREFIX, TokenInfo, TokenStore, hash_token
from bitlake.triggers.trigger import (
    FlowCursor,
    PartitionTrigger,
    PartitionTriggerResult,
    SnapshotTrigger,
    SnapshotTriggerResult,
    render_partition,
)

# The store's names, and those it re-exports from the modules it is built from (imported from here before).
__all__ = [
    "ANY_PARTITION", "MAX_TOKEN_GLOBS", "MIGRATIONS", "MIGRATION_LOCK", "PG_INSERT_NEW", "REGISTRATION_LOCK",
    "TOKEN_PREFIX", "EventPage", "PlannedRegistration", "Registration", "RegistrationResult", "Role", "TokenInfo",
    "TriggerStore", "create_token", "decode_cursor", "encode_cursor", "event_json_sql", "hash_token",
    "make_engine", "now_micros", "run_migrations",
]


def encode_cursor(after_event_id: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"after": after_event_id}).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))["after"]
    except (ValueError, TypeError, KeyError, binascii.Error):
        raise BadCursorError(f"cursor {cursor[:64]!r} was not handed out by this service") from None
    # Event ids are 64-bit: a larger "after" was never handed out, and the database could not compare with it.
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise BadCursorError(f"cursor {cursor[:64]!r} was not handed out by this service")
    return value


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


def _tag_filter(tags: Mapping[str, str] | None) -> list:
    return [EVENTS.c.tags[k].as_string() == v for k, v in (tags or {}).items()]


class TriggerStore(TokenStore):
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
        """The highest event id below which no registration is still in flight (None: no limit needed; see
        :func:`~bitlake.triggers.statements.stable_horizon`)."""
        if self.dialect != "postgresql":
            return None
        if conn is None:
            with self._reader.connect() as c:
                return statements.stable_horizon(c)
        return statements.stable_horizon(conn)

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

    @once_more_if_disconnected
    def register_together_json(self, requests: Sequence[Iterable[EventIn | Mapping[str, Any]]], *,
                               insert_new_first: bool = True) -> list[bytes | EventConflictError]:
        """Several registration requests in one transaction, each answered as if they had run one after the
        other: with what :meth:`register_json` returns, or the :class:`EventConflictError` it raises.

        This is the service's group commit: requests that arrive while the store is busy cost one transaction
        between them. Ids follow the order of the requests; an event a request repeats from an earlier one
        is a retry of it. When a request conflicts, each request runs again in a transaction of its own, so
        the others are registered and the one that conflicts writes nothing.

        ``insert_new_first``: on PostgreSQL, first try the one-statement insert of new events
        (:func:`~bitlake.triggers.statements.insert_new`); False when the caller tried it already (see
        storecalls.py).
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
            inserted = statements.insert_new(self._reader, plan.pg_params)
            if inserted is not None:
                return plan.answers_inserted(inserted)
        with self.engine.begin() as conn:
            if postgres:
                found = found_inserted(conn.execute(PG_INSERT_UNREGISTERED, plan.pg_params))
            else:
                ev = EVENTS
                statement = (self._insert(ev)
                             .on_conflict_do_nothing(index_elements=["table_name", "partition_json", "snapshot_id"])
                             .returning(ev.c.table_name, ev.c.partition_json, ev.c.snapshot_id, ev.c.event_id))
                found = found_inserted(conn.execute(statement, list(plan.unique.values())))
            missing = [key for key in plan.unique if key not in found]
            if missing:  # registered before, or by a transaction that committed while this one ran; now visible
                found.update(self._stored(conn, plan.unique, missing))
            return plan.answers(found)  # a conflict raises here: nothing is committed

    def _stored(self, conn: Connection, unique: Mapping[tuple[str, str, str], dict[str, Any]],
                keys: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], Found]:
        """The stored events of ``keys``, each with the payload fields in which it differs from ``unique``'s."""
        ev = EVENTS
        query = select(ev.c.table_name, ev.c.partition_json, ev.c.snapshot_id, ev.c.event_id,
                       *(ev.c[f] for f in PAYLOAD), self._event_json).where(
            tuple_(ev.c.table_name, ev.c.partition_json, ev.c.snapshot_id).in_(keys))
        found: dict[tuple[str, str, str], Found] = {}
        for r in conn.execute(query):
            key = (r.table_name, r.partition_json, r.snapshot_id)
            found[key] = (r.event_id, False, [f for f in PAYLOAD if getattr(r, f) != unique[key][f]], r.event_json)
        return found

    def _fired(self, conn: Connection, where: list, limit: int) -> tuple[list[str], int | None, bool]:
        """The JSON of the first ``limit`` events matching ``where`` by event id, the last one's id, and
        whether more matched."""
        ev = EVENTS
        # The LIMIT is written into the SQL, not bound: a prepared statement's generic plan cannot see a bound
        # limit, and for a partition trigger on PostgreSQL it then walked the table's (table_name, event_id)
        # index filtering every event of the table instead of reading the partition's rows from the unique
        # index and sorting them: a cost that grew with the table.
        rows = conn.execute(select(ev.c.event_id, self._event_json).where(*where)
                            .order_by(ev.c.event_id).limit(literal(limit + 1, literal_execute=True))).all()
        shown = rows[:limit]
        return [event_json for _, event_json in shown], shown[-1][0] if shown else None, len(rows) > limit

    def _whole_commits(self, conn: Connection, where: list, limit: int) -> tuple[list[str], bool]:
        """The JSON of the first events matching ``where`` by event id, at most ``limit`` of them, that end
        with a whole commit, and whether more matched.

        A commit that touches several partitions has one event per partition, registered together, so they
        are consecutive among the table's events. A flow acknowledges a batch's last event; had the batch
        ended inside a commit, the next one would start with the rest of it, and its snapshot range would
        start before that commit again: the commit read twice. So a batch that would end inside a commit
        ends before it instead; one that the commit starts is extended to the commit's last event, more
        than ``limit`` events, so that every batch makes progress. Events without a snapshot id (Hive
        landings) are each a commit of their own.
        """
        ev = EVENTS
        query = select(ev.c.event_id, ev.c.snapshot_id, self._event_json).where(*where).order_by(ev.c.event_id)
        # LIMIT written into the SQL, as in _fired
        rows = conn.execute(query.limit(literal(limit + 1, literal_execute=True))).all()
        if len(rows) <= limit:
            return [r.event_json for r in rows], False
        commit = rows[limit - 1].snapshot_id
        if commit == "" or rows[limit].snapshot_id != commit:
            return [r.event_json for r in rows[:limit]], True
        start = limit - 1
        while start > 0 and rows[start - 1].snapshot_id == commit:
            start -= 1
        if start > 0:
            return [r.event_json for r in rows[:start]], True
        # One commit fills the batch: read on to its last event.
        shown = list(rows[:limit])
        while True:
            rest = conn.execute(query.where(ev.c.event_id > shown[-1].event_id)
                                .limit(literal(limit, literal_execute=True))).all()
            ours = next((i for i, r in enumerate(rest) if r.snapshot_id != commit), len(rest))
            shown.extend(rest[:ours])
            if ours < len(rest) or len(rest) < limit:
                return [r.event_json for r in shown], ours < len(rest)

    def events(self, table: str, *, partition: list[str | None] | None = ANY_PARTITION,
               tags: Mapping[str, str] | None = None, since: dt.datetime | None = None,
               until: dt.datetime | None = None, min_event_id: int | None = None, max_event_id: int | None = None,
               cursor: str | None = None, limit: int = 100) -> EventPage:
        """The events of ``table`` by event id, filtered: ``partition`` exactly (``None``: unpartitioned),
        every tag in ``tags``, ``since <= event_ts < until``, ``min_event_id <= event_id <= max_event_id``."""
        return EventPage.model_validate_json(self.events_json(
            table, partition=partition, tags=tags, since=since, until=until, min_event_id=min_event_id,
            max_event_id=max_event_id, cursor=cursor, limit=limit))

    @once_more_if_disconnected
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

    @once_more_if_disconnected
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
        row, horizon = statements.flow_and_horizon(conn, flow, table)
        return (None if row is None else _cursor(row)), horizon

    def evaluate_snapshot_trigger(self, trigger: SnapshotTrigger) -> SnapshotTriggerResult:
        """Fires with the flow's events after its acknowledged cursor; never moves the cursor.

        The first evaluation of a (flow, table) records the flow with its tag filter and ``start``.

        Raises:
            FlowConflictError: the flow exists on this table with a different tag filter.
        """
        return SnapshotTriggerResult.model_validate_json(self.evaluate_snapshot_trigger_json(trigger))

    @once_more_if_disconnected
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
        found, more = self._whole_commits(conn, where, trigger.limit)
        head = SnapshotTriggerResult.model_construct(fired=bool(found), cursor=cursor, has_more=more, events=[])
        return _with_events(head, found)

    @once_more_if_disconnected
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


def create_token(role: Role | str, tables: Sequence[str] = ("*",), *, name: str = "", db_url: str | None = None,
                 config: TriggerConfig | None = None) -> str:
    """Create a token in the store named by ``db_url`` (else ``config``, else the environment) and return it.

    The admin helper: ``python -m bitlake.triggers token create --role producer --table 'sales.*'`` calls it.
    """
    config = config or TriggerConfig.load()
    with TriggerStore.from_config(config if db_url is None else config.model_copy(update={"db_url": db_url})) as s:
        return s.create_token(role, tables, name=name)
