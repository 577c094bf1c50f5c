"""Behaviour of the trigger store, written once and run on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import datetime as dt
import json
import random
import threading
import time

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import func, inspect, select, text

from bitlake.triggers import (
    BadCursorError,
    EventConflictError,
    EventNotFoundError,
    FlowConflictError,
    FlowNotFoundError,
    PartitionTrigger,
    SnapshotTrigger,
    TriggerError,
    TriggerStore,
    encode_events,
)
from bitlake.triggers.event import (
    MAX_PARTITION_JSON_BYTES,
    MAX_SNAPSHOT_ID_CHARS,
    MAX_TABLE_BYTES,
    canonical_partition,
    format_timestamp,
    parse_timestamp,
)
from bitlake.triggers.incremental import snapshot_range
from bitlake.triggers.store import RegistrationResult, encode_cursor, make_engine
from bitlake.triggers.tables import EVENTS, TOKENS, VERSION_TABLE, Base
from tests.triggers.samples import commits, event

UTC = dt.UTC


def count(store: TriggerStore, table=EVENTS) -> int:
    with store.engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


def now() -> dt.datetime:
    return dt.datetime.now(UTC)


# -- schema ---------------------------------------------------------------------------------------------


def test_migrations_build_the_models_schema_and_rerun_as_no_ops(db_url):
    with TriggerStore(db_url) as first:
        first.register([event()])
    with TriggerStore(db_url) as store:  # opening again upgrades nothing and keeps the data
        assert count(store) == 1
        with store.engine.connect() as conn:
            assert conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar_one() == "0001"
            names = set(inspect(conn).get_table_names())
            assert {"events", "flows", "tokens", VERSION_TABLE} <= names
            indexes = {i["name"] for i in inspect(conn).get_indexes("events")}
            assert {"ix_events_table_event_id", "ix_events_table_event_ts"} <= indexes
            # The migration and the models describe the same schema (types, indexes, constraints).
            context = MigrationContext.configure(conn, opts={"compare_type": True, "version_table": VERSION_TABLE})
            assert compare_metadata(context, Base.metadata) == []


# -- registration ---------------------------------------------------------------------------------------


def test_registration_assigns_increasing_ids_and_the_registration_time(store):
    before = now()
    first = store.register([event(snapshot_id="1"), event(snapshot_id="2")])
    second = store.register([event(snapshot_id="3")])
    ids = [r.event.event_id for r in first + second]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert all(r.created for r in first + second)
    for r in first + second:
        assert before <= r.event.event_ts <= now()
    assert first[0].event.event_ts == first[1].event.event_ts  # one batch, one registration time
    ordered = store.register([event(snapshot_id="9"), event(snapshot_id="10"), event(snapshot_id="10a")])
    assert [r.event.event_id for r in ordered] == [ids[-1] + 1, ids[-1] + 2, ids[-1] + 3]  # the batch's order


def test_a_retried_registration_returns_the_existing_event(store):
    original = store.register([event(snapshot_id="1"), event(snapshot_id="2")])
    retry = store.register([event(snapshot_id="2"), event(snapshot_id="1"), event(snapshot_id="3")])
    assert [r.created for r in retry] == [False, False, True]
    assert retry[0].event == original[1].event and retry[1].event == original[0].event
    assert count(store) == 3


def test_a_duplicate_inside_one_batch_is_registered_once(store):
    result = store.register([event(), event(), event(snapshot_id="2"), event()])
    assert [r.created for r in result] == [True, False, True, False]
    assert result[0].event == result[1].event == result[3].event
    assert count(store) == 2


def test_idempotency_key_is_table_partition_and_snapshot_also_when_null(store):
    hive = event(table="db.hive", snapshot_id=None, snapshot_ts=None, table_format="HIVE", partition=["2024-01-01"])
    unpartitioned = event(table="db.flat", partition=None)
    assert [r.created for r in store.register([hive, unpartitioned])] == [True, True]
    assert [r.created for r in store.register([hive, unpartitioned])] == [False, False]
    # Each of table, partition (including a null level) and snapshot id distinguishes events.
    others = [event(table="db.other"), event(partition=["2024-01-02"]), event(partition=["2024-01-01", None]),
              event(partition=[None]), event(snapshot_id="9"), event(table="db.flat", partition=None, snapshot_id="2")]
    assert all(r.created for r in store.register([event(), *others]))
    assert count(store) == 2 + 1 + len(others)


def test_a_conflicting_payload_under_an_existing_key_refuses_the_whole_batch(store):
    store.register([event()])
    for change in ({"operation_type": "DELETE"}, {"tags": {"a": "b"}}, {"snapshot_ts": "2024-01-02T00:00:00Z"},
                   {"prev_snapshot_id": "0"}, {"table_format": "DELTA"}):
        with pytest.raises(EventConflictError, match="nothing of this request"):
            store.register([event(snapshot_id="new"), event(**change)])
    # The message names the stored event.
    stored = store.events("db.orders").events[0].event_id
    with pytest.raises(EventConflictError, match=f"^event {stored} of table 'db.orders'"):
        store.register([event(operation_type="DELETE")])
    # and within one batch: the second differs from the first; no event was registered, so none is named
    # (the id the rolled-back insert drew does not exist)
    with pytest.raises(EventConflictError, match="holds the event of table 'db.orders', partition "
                       r"\['2024-01-01'\], snapshot 'x' twice, with different operation_type") as refused:
        store.register([event(snapshot_id="x"), event(snapshot_id="x", operation_type="UPDATE")])
    assert "event " not in str(refused.value).split("twice")[0].replace("the event of", "")
    assert count(store) == 1


def test_requests_registered_together_are_answered_as_if_one_after_the_other(store):
    store.register([event(snapshot_id="old")])
    first, second, conflicting, fourth = store.register_together_json([
        [event(snapshot_id="1"), event(snapshot_id="old")],
        [event(snapshot_id="2"), event(snapshot_id="1")],  # repeats an event of the first request: a retry
        [event(snapshot_id="3"), event(snapshot_id="old", operation_type="DELETE")],
        [event(snapshot_id="4")],
    ])
    first, second, fourth = (RegistrationResult.model_validate_json(a).events for a in (first, second, fourth))
    assert [r.created for r in first] == [True, False] and [r.created for r in second] == [True, False]
    assert second[1].event == first[0].event
    assert isinstance(conflicting, EventConflictError) and "nothing of this request" in str(conflicting)
    assert [r.created for r in fourth] == [True]
    assert first[0].event.event_id < second[0].event.event_id < fourth[0].event.event_id
    # The conflicting request wrote nothing, not even its new event; the others are stored once each.
    assert sorted(e.snapshot_id for e in store.events("db.orders").events) == ["1", "2", "4", "old"]
    assert store.register_together_json([]) == [] and store.register_together_json([[]]) == [b'{"events":[]}']


def test_the_largest_valid_event_fits_the_unique_index(store):
    """The longest table name, snapshot id and partition, of text that does not compress: PostgreSQL's B-tree
    entry (at most 2,704 bytes) holds their key, so no valid event fails at the database."""
    rng = random.Random(7)
    wide = [chr(c) for c in range(0x1F300, 0x1F600)]  # 4 bytes of UTF-8 each
    table = "".join(rng.choice(wide) for _ in range(MAX_TABLE_BYTES // 4))
    snapshot = "".join(rng.choice(wide) for _ in range(MAX_SNAPSHOT_ID_CHARS))
    ascii_text = [chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"\\']
    values = ["".join(rng.choice(ascii_text) for _ in range(100)) for _ in range(14)]
    rest = MAX_PARTITION_JSON_BYTES - len(canonical_partition(values)) - len(',""')
    values.append("".join(rng.choice(ascii_text) for _ in range(rest)))
    assert len(canonical_partition(values).encode()) == MAX_PARTITION_JSON_BYTES
    assert len(table.encode()) == MAX_TABLE_BYTES
    [registered] = store.register([event(table=table, snapshot_id=snapshot, partition=values)])
    assert registered.created and registered.event.partition == values
    assert not store.register([event(table=table, snapshot_id=snapshot, partition=values)])[0].created


def test_canonical_partition_is_the_json_modules_compact_text_for_every_code_point():
    """Stored keys were written by the json module before; pydantic's writer must give the same text."""
    compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    characters = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for start in range(0, len(characters), 4096):
        values = [*characters[start:start + 4096], None, "", 'a"b\\c']
        assert canonical_partition(values) == compact(values)
    assert canonical_partition(None) == "null"


def test_events_keep_every_field_exactly(store):
    sent = event(table="lake/ünïcode tàble", partition=["2024-01-01", None, "naïve ✓", "a,b\"c"],
                 snapshot_id="8023498234", snapshot_ts="2024-05-06T07:08:09.123456+02:00",
                 prev_snapshot_id="8023498233", table_format="ICEBERG", operation_type="UPDATE",
                 tags={"batch_ids": "b1,b2", "completeness.hourly": "99%", "k:/-_": "v\nmultiline"})
    (registration,) = store.register([sent])
    e = registration.event
    assert (e.table, e.partition, e.snapshot_id, e.prev_snapshot_id) == (
        sent["table"], sent["partition"], sent["snapshot_id"], sent["prev_snapshot_id"])
    assert e.snapshot_ts == dt.datetime(2024, 5, 6, 5, 8, 9, 123456, tzinfo=UTC)
    assert (e.table_format, e.operation_type, e.tags) == ("ICEBERG", "UPDATE", sent["tags"])
    assert store.events(sent["table"]).events == [e]
    hive = store.register([event(snapshot_id=None, snapshot_ts=None, partition=None)])[0].event
    assert (hive.snapshot_id, hive.snapshot_ts, hive.partition) == (None, None, None)


def test_the_database_writes_events_in_the_documented_encoding(store):
    """The store hands out events as JSON the database writes (``event_json_sql``): it must be what
    ``encode_events`` writes, at the ends of the timestamp range and for text that JSON escapes."""
    stamps = ["0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "1969-12-31T23:59:59.999999Z", -1, 0,
              "1970-01-01T00:00:00.000001Z", "2024-02-29T12:34:56.654321+05:30", None]
    sent = [event(table='db."quoted" \\ tàble', partition=["a\nb", None, "\u2028 ✓ \x7f", '"'], snapshot_id=str(i),
                  snapshot_ts=ts, prev_snapshot_id=str(i - 1) if i else None,
                  tags={"k": 'v"\\\u0001\t', "u": "ß"} if i % 2 else {}) for i, ts in enumerate(stamps)]
    sent.append(event(table=sent[0]["table"], partition=None, snapshot_id=None, snapshot_ts=None))
    registered = [r.event for r in store.register(sent)]
    written = json.loads(store.events_json(sent[0]["table"]))["events"]
    assert written == json.loads(encode_events(registered))
    for e, raw in zip(sent, written, strict=True):
        assert (raw["table"], raw["partition"], raw["snapshot_id"], raw["tags"]) == (
            e["table"], e["partition"], e["snapshot_id"], e["tags"])
        assert raw["snapshot_ts"] == (None if e["snapshot_ts"] is None else
                                      format_timestamp(parse_timestamp(e["snapshot_ts"])))
    assert store.events(sent[0]["table"]).events == registered


def test_snapshot_ts_accepts_epoch_milliseconds(store):
    (r,) = store.register([event(snapshot_ts=1_704_067_200_123)])
    assert r.event.snapshot_ts == dt.datetime(2024, 1, 1, 0, 0, 0, 123000, tzinfo=UTC)


# -- queries --------------------------------------------------------------------------------------------


def test_events_are_filtered_by_table_partition_tags_time_and_id(store):
    store.register(commits("db.a", 3, partition=["p1"], tags={"freq": "hourly"}))
    middle = now()
    time.sleep(0.002)
    store.register(commits("db.a", 2, first=4, partition=["p2"], tags={"freq": "daily", "team": "x"}))
    store.register(commits("db.b", 2, partition=None))

    def ids(**filters):
        return [e.event_id for e in store.events(filters.pop("table", "db.a"), **filters).events]

    assert ids() == [1, 2, 3, 4, 5]
    assert ids(table="db.b") == [6, 7] and ids(table="db.none") == []
    assert ids(partition=["p2"]) == [4, 5] and ids(partition=["p3"]) == []
    assert ids(table="db.b", partition=None) == [6, 7] and ids(partition=None) == []
    assert ids(tags={"freq": "daily"}) == [4, 5] and ids(tags={"freq": "daily", "team": "x"}) == [4, 5]
    assert ids(tags={"freq": "daily", "team": "y"}) == [] and ids(tags={"absent": "x"}) == []
    assert ids(since=middle) == [4, 5] and ids(until=middle) == [1, 2, 3]  # since <= event_ts < until
    e4 = store.events("db.a", min_event_id=4).events[0]
    assert ids(since=e4.event_ts) == [4, 5] and ids(until=e4.event_ts) == [1, 2, 3]
    assert ids(min_event_id=2, max_event_id=4) == [2, 3, 4]


def test_events_page_by_cursor(store):
    store.register(commits("db.a", 25))
    seen, cursor, pages = [], None, 0
    while True:
        page = store.events("db.a", limit=10, cursor=cursor)
        seen += [e.event_id for e in page.events]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == list(range(1, 26)) and pages == 3
    assert store.events("db.a", limit=25).next_cursor is None
    with pytest.raises(BadCursorError):
        store.events("db.a", cursor="not-a-cursor")
    # well-formed, but beyond the 64-bit ids the database compares with: never handed out
    for after in (2**63, 10**30, -1):
        with pytest.raises(BadCursorError):
            store.events("db.a", cursor=encode_cursor(after))
    assert store.events("db.a", cursor=encode_cursor(2**63 - 1)).events == []


# -- partition triggers ---------------------------------------------------------------------------------


def test_partition_trigger_fires_for_events_registered_by_the_evaluation_time(store):
    before = now()
    store.register(commits("db.a", 2, partition=["2024-01-01"], tags={"freq": "daily"}))
    store.register([event(table="db.a", partition=["2024-01-02"], snapshot_id="3")])
    trigger = PartitionTrigger(table="db.a", partition=["2024-01-01"])
    fired = store.evaluate_partition_trigger(trigger)
    assert fired.fired and [e.snapshot_id for e in fired.events] == ["1", "2"] and not fired.has_more
    assert fired.partition == ["2024-01-01"] and fired.scheduled_time == fired.evaluated_at
    # The search range is [0, at]: before the registration nothing had arrived.
    assert not store.evaluate_partition_trigger(trigger.model_copy(update={"at": before})).fired
    assert store.evaluate_partition_trigger(trigger.model_copy(update={"tags": {"freq": "daily"}})).fired
    assert not store.evaluate_partition_trigger(trigger.model_copy(update={"tags": {"freq": "hourly"}})).fired
    assert not store.evaluate_partition_trigger(PartitionTrigger(table="db.a", partition=["2024-01-03"])).fired
    assert not store.evaluate_partition_trigger(PartitionTrigger(table="db.b", partition=["2024-01-01"])).fired
    limited = store.evaluate_partition_trigger(trigger.model_copy(update={"limit": 1}))
    assert len(limited.events) == 1 and limited.has_more


def test_partition_trigger_renders_templates_at_the_scheduled_tick(store):
    store.register([event(table="db.h", partition=["2024-03-01", "23"], snapshot_id="1"),
                    event(table="db.u", partition=None, snapshot_id="1")])
    late = now() + dt.timedelta(minutes=1)  # "at" after the registration, so only the partition decides
    hourly = dict(table="db.h", partition=["{{ ds }}", "{{ hour }}"], start="2024-03-01T00:00:00Z", frequency=1,
                  frequency_unit="HOURS")
    # the tick for 23:40 is 23:00 -> partition [2024-03-01, 23]
    result = store.evaluate_partition_trigger(PartitionTrigger(**hourly), now=late)
    assert not result.fired  # "at" defaults to now, which is years after 2024-03-01; the tick is today's
    at_2340 = PartitionTrigger(**hourly).model_copy(update={"at": dt.datetime(2024, 3, 1, 23, 40, tzinfo=UTC)})
    result = store.evaluate_partition_trigger(at_2340)
    assert result.partition == ["2024-03-01", "23"]
    assert result.scheduled_time == dt.datetime(2024, 3, 1, 23, tzinfo=UTC)
    assert result.next_scheduled_time == dt.datetime(2024, 3, 2, tzinfo=UTC)
    assert not result.fired  # the event was registered after that "at"
    # the previous hour's partition, evaluated at a tick in the future of the registration
    shifted = PartitionTrigger(table="db.h", partition=["{{ ds - 1h }}", "{{ hour - 1h }}"],
                               scheduled_time="2024-03-02T00:00:00Z")
    result = store.evaluate_partition_trigger(shifted, now=late)
    assert result.fired and result.partition == ["2024-03-01", "23"] and result.next_scheduled_time is None
    # before start: nothing is scheduled yet
    early = PartitionTrigger(**{**hourly, "start": "2999-01-01T00:00:00Z"})
    result = store.evaluate_partition_trigger(early, now=late)
    assert not result.fired and result.scheduled_time is None
    assert result.next_scheduled_time == dt.datetime(2999, 1, 1, tzinfo=UTC)
    # an unpartitioned table has the partition null
    assert store.evaluate_partition_trigger(PartitionTrigger(table="db.u", partition=None), now=late).fired


# -- snapshot triggers ----------------------------------------------------------------------------------


def snapshot(store, flow="agg", table="db.a", **kw):
    return store.evaluate_snapshot_trigger(SnapshotTrigger(flow=flow, table=table, **kw))


def test_snapshot_trigger_fires_until_acknowledged_then_only_for_new_events(store):
    first = snapshot(store)
    assert not first.fired and first.cursor.last_event_id == 0 and first.cursor.acked_at is None
    store.register(commits("db.a", 3) + commits("db.other", 1))
    fired = snapshot(store)
    assert fired.fired and [e.snapshot_id for e in fired.events] == ["1", "2", "3"]
    assert snapshot(store).events == fired.events  # evaluating does not advance
    cursor = store.ack("agg", "db.a", fired.events[-1].event_id)
    assert cursor.last_event_id == fired.events[-1].event_id and cursor.acked_at is not None
    assert not snapshot(store).fired
    assert store.ack("agg", "db.a", fired.events[-1].event_id) == cursor  # idempotent
    store.register(commits("db.a", 2, first=4))
    again = snapshot(store)
    assert [e.snapshot_id for e in again.events] == ["4", "5"]
    # Each flow has its own cursor.
    assert [e.snapshot_id for e in snapshot(store, flow="other").events] == ["1", "2", "3", "4", "5"]


def test_ack_refuses_going_back_unknown_flows_and_foreign_events(store):
    ids = [r.event.event_id for r in store.register(commits("db.a", 3) + commits("db.b", 1))]
    with pytest.raises(FlowNotFoundError):
        store.ack("agg", "db.a", ids[0])
    snapshot(store)
    store.ack("agg", "db.a", ids[1])
    with pytest.raises(FlowConflictError, match="never moves back"):
        store.ack("agg", "db.a", ids[0])
    with pytest.raises(EventNotFoundError):
        store.ack("agg", "db.a", ids[3])  # an event of another table
    with pytest.raises(EventNotFoundError):
        store.ack("agg", "db.a", 10_000)
    assert store.flow("agg", "db.a").last_event_id == ids[1]


def test_snapshot_trigger_filters_by_tags_and_keeps_the_flows_filter(store):
    store.register(commits("db.a", 2, tags={"freq": "hourly"}) + commits("db.a", 2, first=3, tags={"freq": "daily"}))
    daily = snapshot(store, tags={"freq": "daily"})
    assert [e.snapshot_id for e in daily.events] == ["3", "4"] and daily.cursor.tags == {"freq": "daily"}
    with pytest.raises(FlowConflictError, match="another flow name"):
        snapshot(store, tags={"freq": "hourly"})


def test_snapshot_trigger_start_and_limit(store):
    store.register(commits("db.a", 2))
    time.sleep(0.002)
    start = now()
    store.register(commits("db.a", 3, first=3))
    late = snapshot(store, flow="late", start=start)
    assert [e.snapshot_id for e in late.events] == ["3", "4", "5"] and late.cursor.start == start
    # start is read when the flow is first seen only
    assert [e.snapshot_id for e in snapshot(store, flow="late").events] == ["3", "4", "5"]
    page = snapshot(store, limit=2)
    assert [e.snapshot_id for e in page.events] == ["1", "2"] and page.has_more
    store.ack("agg", "db.a", page.events[-1].event_id)
    rest = snapshot(store, limit=2)
    assert [e.snapshot_id for e in rest.events] == ["3", "4"] and rest.has_more
    store.ack("agg", "db.a", rest.events[-1].event_id)
    last = snapshot(store, limit=2)
    assert [e.snapshot_id for e in last.events] == ["5"] and not last.has_more


def test_a_snapshot_batch_ends_with_a_whole_commit(store):
    """A commit has one event per partition; a batch that ended inside them would have the flow read the commit
    again in its next batch (its snapshot range would start before it)."""
    def version(v: int, partitions: str) -> list[dict]:
        return [event(table="db.a", partition=[p], snapshot_id=str(v), prev_snapshot_id=str(v - 1) if v > 1 else None)
                for p in partitions]

    store.register(version(1, "ab") + version(2, "abcde") + version(3, "a") + version(4, "ab") + version(5, "a"))
    batches, ranges = [], []
    while (fired := snapshot(store, limit=2)).fired:
        batches.append([(e.snapshot_id, e.partition[0]) for e in fired.events])
        rng = snapshot_range(fired.events)
        ranges.append((rng.start_snapshot_id, rng.end_snapshot_id, fired.has_more))
        store.ack("agg", "db.a", fired.events[-1].event_id)
    assert batches == [
        [("1", "a"), ("1", "b")],  # exactly the limit, ending where commit 1 ends
        [("2", c) for c in "abcde"],  # one commit over the limit: all of it, read on in steps of the limit
        [("3", "a")],  # ends before commit 4 rather than inside it: fewer than the limit
        [("4", "a"), ("4", "b")],
        [("5", "a")],
    ]
    # The ranges the flow reads follow each other: no commit twice.
    assert ranges == [(None, "1", True), ("1", "2", True), ("2", "3", True), ("3", "4", True), ("4", "5", False)]
    # A commit that just fills the limit, and the last pending commit over it: no has_more.
    store.register(version(6, "abc"))
    assert [len(snapshot(store, limit=n).events) for n in (1, 2, 3, 4)] == [3, 3, 3, 3]
    assert [snapshot(store, limit=n).has_more for n in (1, 3)] == [False, False]
    # Events without a snapshot id (Hive landings) are each a commit of their own.
    store.register([event(table="db.h", partition=[p], snapshot_id=None, table_format="HIVE") for p in "abc"])
    assert [e.partition for e in snapshot(store, table="db.h", limit=2).events] == [["a"], ["b"]]


# -- tokens ---------------------------------------------------------------------------------------------


def test_tokens_are_stored_hashed_scoped_and_revocable(store):
    token = store.create_token("producer", ["db.sales_*", "lake/*"], name="ingest")
    info = store.authenticate(token)
    assert info.role == "producer" and info.name == "ingest" and info.revoked_at is None
    assert info.allows("db.sales_eu") and info.allows("lake/x/y") and not info.allows("db.hr")
    assert store.authenticate(token + "x") is None and store.authenticate("") is None
    with store.engine.connect() as conn:
        stored = conn.execute(select(TOKENS.c.token_hash)).scalar_one()
    assert token not in stored and len(stored) == 64
    assert store.revoke_token(info.token_id) and not store.revoke_token(info.token_id)
    assert store.authenticate(token) is None
    assert [t.revoked_at is not None for t in store.tokens()] == [True]
    for role, tables in (("reader", ["*"]), ("consumer", []), ("consumer", ["x" * 600])):
        with pytest.raises(TriggerError):
            store.create_token(role, tables)


# -- concurrency ----------------------------------------------------------------------------------------


def test_concurrent_retries_register_each_event_once(db_url):
    batch = commits("db.a", 40)
    results, errors = [], []

    def register():
        try:
            with TriggerStore(db_url, migrate=False) as s:
                for i in range(0, 40, 8):
                    results.extend(s.register(batch[i:i + 8]))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    TriggerStore(db_url).close()
    threads = [threading.Thread(target=register) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(r.created for r in results) == 40 and len(results) == 160
    assert len({r.event.event_id for r in results}) == 40


@pytest.mark.postgres
def test_snapshot_trigger_waits_for_a_registration_in_flight_with_a_lower_id(postgres, _postgres_store_url):
    """Ids 1 and 2; 2 commits first. A snapshot evaluated meanwhile must not hand out 2 without 1."""
    url = _postgres_store_url
    with TriggerStore(url) as store:
        with store.engine.connect() as conn:
            conn.execute(text("TRUNCATE events, flows, tokens RESTART IDENTITY"))
            conn.commit()
        snapshot(store)  # create the flow
        slow = store.engine.connect()
        tx = slow.begin()
        slow.execute(text("SELECT pg_advisory_xact_lock_shared(:k)"), {"k": 0x6269746C616B6531})
        slow.execute(EVENTS.insert(), {"event_ts": 0, "table_name": "db.a", "partition_json": "null",
                                       "snapshot_id": "1", "table_format": "BITLAKE", "operation_type": "APPEND",
                                       "tags": {}})
        store.register([event(table="db.a", partition=None, snapshot_id="2")])  # id 2, committed
        result = {}
        evaluation = threading.Thread(target=lambda: result.setdefault("r", snapshot(store)))
        evaluation.start()
        evaluation.join(0.5)
        assert evaluation.is_alive()  # waiting for id 1's transaction
        tx.commit()
        slow.close()
        evaluation.join(10)
        assert [e.event_id for e in result["r"].events] == [1, 2]


@pytest.mark.postgres
def test_every_call_needs_one_pooled_connection_at_a_time(_postgres_store_url):
    """A flow's first evaluation records it without holding its read connection: holding both, concurrent
    first evaluations could take the whole pool and wait for each other. A pool of one connection shows it."""
    with TriggerStore(make_engine(_postgres_store_url, pool_size=1, max_overflow=0), migrate=False) as store:
        store.register([event(table="db.pool", partition=None, snapshot_id=str(v)) for v in (1, 2)])
        fired = store.evaluate_snapshot_trigger(SnapshotTrigger(flow="pool_flow", table="db.pool"))
        assert [e.snapshot_id for e in fired.events] == ["1", "2"]
        store.ack("pool_flow", "db.pool", fired.events[-1].event_id)
        assert not store.evaluate_snapshot_trigger(SnapshotTrigger(flow="pool_flow", table="db.pool")).fired
        assert store.evaluate_partition_trigger(PartitionTrigger(table="db.pool", partition=None)).fired


@pytest.mark.postgres
def test_a_database_restart_costs_no_failed_call(_postgres_store_url):
    """The pool does not ping connections before use: a call whose connection the server closed runs again on a
    new one. Every backend of the database is terminated, as a restart would, before each call."""
    url = _postgres_store_url

    def restart() -> None:
        with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE datname = current_database() AND pid <> pg_backend_pid()")

    with TriggerStore(url) as store:
        with store.engine.begin() as conn:
            conn.execute(text("TRUNCATE events, flows, tokens RESTART IDENTITY"))
        token = store.create_token("producer", ["db.*"])
        store.register([event(table="db.r", snapshot_id="1")])
        restart()
        assert [r.created for r in store.register([event(table="db.r", snapshot_id="2")])] == [True]
        restart()
        assert store.authenticate(token) is not None
        restart()
        fired = store.evaluate_snapshot_trigger(SnapshotTrigger(flow="f", table="db.r"))
        assert [e.snapshot_id for e in fired.events] == ["1", "2"]
        restart()
        assert store.ack("f", "db.r", fired.events[-1].event_id).last_event_id == fired.events[-1].event_id
        restart()
        assert store.evaluate_partition_trigger(PartitionTrigger(table="db.r", partition=["2024-01-01"])).fired
        restart()
        assert len(store.events("db.r").events) == 2
