"""The bitlake producer and the whole loop: commits -> publish -> snapshot trigger -> read_changes -> ack.

Exactly once: a publisher run registers every unpublished commit's events, re-publishing is a no-op, a
publisher that crashed between registering and moving its cursor leaves nothing twice, and a writer
killed right after its commit (``BITLAKE_CRASH_AT=after_commit``) gets its event from the next publish.
Each test runs on both stores, SQLite and a real PostgreSQL server (``db_url`` in conftest.py).
"""

from __future__ import annotations

import signal

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient
from writers import harness
from writers.harness import Writer

import bitlake
from bitlake.format import commitlog
from bitlake.triggers import Client, TriggerConfig, TriggerStore, create_app, publish, read_changes, snapshot_range
from bitlake.triggers import publisher as publisher_mod

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("id", pa.int64()), ("region", pa.string()), ("v", pa.string()), ("mod", pa.int64())])
INPUT = pa.schema(list(SCHEMA) + [pa.field("op", pa.string())])
COLUMNS = ["id", "region", "v", "mod"]


def ingest(table: bitlake.Table, spark, batch_id: str, records: list[tuple]) -> int:
    data = pa.Table.from_pylist([dict(zip(INPUT.names, r, strict=True)) for r in records], schema=INPUT)
    return table.ingest(data, op_column="op", batch_id=batch_id, spark=spark).version


def change_rows(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.select("id", "v", "_change_type", "_commit_version").collect())


class Service:
    """The trigger service through FastAPI's TestClient, with a producer and a consumer client."""

    def __init__(self, db_url: str):
        self.app = create_app(TriggerConfig(db_url=db_url, token_cache_seconds=0))
        self.store = self.app.state.store
        self.http = TestClient(self.app)
        self.producer = Client("http://testserver", self.store.create_token("producer", ["shop.*", "file://*"]),
                               http_client=self.http)
        self.consumer = Client("http://testserver", self.store.create_token("consumer", ["shop.*", "file://*"]),
                               http_client=self.http)

    def close(self) -> None:
        self.http.close()
        self.store.close()


@pytest.fixture
def service(db_url):
    s = Service(db_url)
    yield s
    s.close()


def test_end_to_end_commits_publish_trigger_read_ack(spark, tmp_path, service):
    table = bitlake.create_table(str(tmp_path / "orders"), SCHEMA, name="shop.orders", primary_key=["id"], delta_column="mod",
                                 partition_by=["region"], num_buckets=2)
    name = table.name
    assert name == "shop.orders"  # the logical name; the publisher tags each event with the table's location
    flow = "daily_orders"

    # Commit 1, published: the flow's first run reads it.
    assert ingest(table, spark, "b1", [(1, "eu", "a", 1, "upsert"), (2, "us", "b", 1, "upsert"),
                                       (3, "eu", "c", 1, "upsert")]) == 1
    published = publish(table, service.producer)
    assert [(r.created, r.event.snapshot_id, r.event.partition) for r in published] == [
        (True, "1", ["eu"]), (True, "1", ["us"])]
    fired = service.consumer.snapshot_trigger(flow, name)
    assert fired.fired
    assert change_rows(read_changes(spark, fired.events)) == [(1, "a", "insert", 1), (2, "b", "insert", 1),
                                                              (3, "c", "insert", 1)]
    service.consumer.ack(flow, name, fired.events[-1].event_id)
    assert not service.consumer.snapshot_trigger(flow, name).fired
    assert publish(table, service.producer) == []  # nothing new to publish: the cursor is at version 1
    assert not service.consumer.snapshot_trigger(flow, name).fired

    # Commits 2 and 3 before the next run: it reads exactly (1, 3].
    ingest(table, spark, "b2", [(1, "eu", "a2", 2, "upsert"), (2, "us", None, 2, "delete")])
    ingest(table, spark, "b3", [(4, "us", "d", 3, "upsert"), (3, "eu", "old", 0, "upsert")])  # 3's is stale
    assert [(r.event.snapshot_id, r.event.prev_snapshot_id, r.event.partition)
            for r in publish(table, service.producer)] == [
        ("2", "1", ["eu"]), ("2", "1", ["us"]), ("3", "2", ["us"])]  # 3's stale record touches no row of eu
    fired = service.consumer.snapshot_trigger(flow, name)
    rng = snapshot_range(fired.events)
    assert (rng.start_snapshot_id, rng.end_snapshot_id, rng.snapshot_ids) == ("1", "3", ("2", "3"))
    changes = read_changes(spark, fired.events)
    expected = [(1, "a", "update_preimage", 2), (1, "a2", "update_postimage", 2), (2, "b", "delete", 2),
                (4, "d", "insert", 3)]
    assert change_rows(changes) == expected
    assert change_rows(table.changes(spark, starting_version=2, ending_version=3)) == expected
    service.consumer.ack(flow, name, fired.events[-1].event_id)
    assert not service.consumer.snapshot_trigger(flow, name).fired

    # A commit that touches no partition (a delete of a key never seen) has no event; the next
    # commit's event chains past it, so the range stays unbroken.
    ingest(table, spark, "b4", [(99, "eu", None, 4, "delete")])
    assert commitlog.read(table.io, 4).events == ()
    ingest(table, spark, "b5", [(5, "eu", "e", 5, "upsert")])
    assert [(r.event.snapshot_id, r.event.prev_snapshot_id) for r in publish(table, service.producer)] == [("5", "3")]
    fired = service.consumer.snapshot_trigger(flow, name)
    assert change_rows(read_changes(spark, fired.events)) == [(5, "e", "insert", 5)]
    service.consumer.ack(flow, name, fired.events[-1].event_id)
    assert not service.consumer.snapshot_trigger(flow, name).fired


@pytest.fixture(scope="module")
def committed(spark, tmp_path_factory):
    """A table with three visible commits (versions 1, 2 and 4; 3 only landed a batch)."""
    root = tmp_path_factory.mktemp("published")
    table = bitlake.create_table(str(root / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    ingest(table, spark, "b1", [(1, "eu", "a", 1, "upsert")])
    ingest(table, spark, "b2", [(1, "eu", "a2", 2, "upsert")])
    data = pa.Table.from_pylist([{"id": 2, "region": "us", "v": "b", "mod": 1, "op": "upsert"}], schema=INPUT)
    table.ingest(data, op_column="op", batch_id="b3", metagen=False, spark=spark)
    table.metagen(spark=spark)
    assert table.version == 4
    return table


@pytest.fixture
def target(db_url, committed):
    """The store on each backend, the shared table's publish cursor for it removed: the PostgreSQL tests
    share one database (emptied between tests), so its cursor would outlive the events."""
    with TriggerStore(db_url) as store:
        cursor = publisher_mod.cursor_path(publisher_mod.target_id(store))
        if committed.io.exists(cursor):
            committed.io.delete(cursor)
        yield store


def snapshots(store: TriggerStore, table: bitlake.Table) -> list[str]:
    return [e.snapshot_id for e in store.events(table.name, limit=1000).events]


def test_publish_registers_each_commit_once_and_keeps_a_cursor_per_target(committed, target, tmp_path):
    table = bitlake.open_table(committed.path)
    a = target
    with TriggerStore(f"sqlite:///{tmp_path}/b.db") as b:
        first = publish(table.path, a)  # a path works as well as a Table
        assert [(r.created, r.event.snapshot_id, r.event.prev_snapshot_id) for r in first] == [
            (True, "1", None), (True, "2", "1"), (True, "4", "2")]
        assert first[0].event.tags == {"batch_ids": "b1", "location": table.io.uri()}
        assert publish(table, a) == []
        assert publisher_mod.published_version(table, publisher_mod.target_id(a)) == 4
        # Another target has its own cursor.
        assert [r.event.snapshot_id for r in publish(table, b)] == ["1", "2", "4"]
        # A lost cursor costs a rescan, never a duplicate.
        for name in table.io.listdir(publisher_mod.PUBLISHED_DIR):
            table.io.delete(f"{publisher_mod.PUBLISHED_DIR}/{name}")
        assert [r.created for r in publish(table, a)] == [False, False, False]
        assert snapshots(a, table) == ["1", "2", "4"] and snapshots(b, table) == ["1", "2", "4"]


def test_a_publisher_that_crashed_before_its_cursor_write_leaves_each_event_once(committed, target, monkeypatch):
    table = bitlake.open_table(committed.path)
    store = target

    def crash(*args):
        raise KeyboardInterrupt("killed between registering and writing the cursor")

    with monkeypatch.context() as m:
        m.setattr(publisher_mod, "_write_cursor", crash)
        with pytest.raises(KeyboardInterrupt):
            publish(table, store)
    assert snapshots(store, table) == ["1", "2", "4"]  # registered; the cursor did not move
    assert publisher_mod.published_version(table, publisher_mod.target_id(store)) == 0
    assert [r.created for r in publish(table, store)] == [False, False, False]
    assert snapshots(store, table) == ["1", "2", "4"]
    assert publish(table, store) == []


def test_publishing_in_small_batches_moves_the_cursor_commit_by_commit(committed, target, monkeypatch):
    table = bitlake.open_table(committed.path)
    calls = []
    register = target.register
    monkeypatch.setattr(target, "register", lambda events: calls.append(len(events)) or register(events))
    assert len(publish(table, target, batch_events=1)) == 3
    assert calls == [1, 1, 1]


@pytest.mark.slow
def test_a_writer_killed_after_its_commit_gets_its_event_exactly_once(spark, tmp_path, db_url):
    table = harness.create(tmp_path / "t", num_buckets=2)
    table.ingest(harness.batch_table([[1, "a", 1, "upsert"]]), op_column="op", batch_id="b1", spark=spark)
    with TriggerStore(db_url) as store:
        assert [r.event.snapshot_id for r in publish(table, store)] == ["1"]
        # The writer dies (SIGKILL) the moment its commit file exists: it never publishes.
        writer = Writer(tmp_path, "killed", table.path, [
            {"op": "ingest", "batch_id": "b2", "rows": [[1, "b", 2, "upsert"], [2, "c", 2, "upsert"]], "metagen": True}],
            crash_at="after_commit")
        try:
            assert writer.wait() == -signal.SIGKILL, writer.output()
        finally:
            harness.kill_all([writer])
        assert writer.acks() == []
        assert bitlake.open_table(table.path).version == 2
        # The next publisher run (any process) drains it, once.
        drained = publish(table.path, store)
        assert [(r.created, r.event.snapshot_id, r.event.prev_snapshot_id, r.event.operation_type.value)
                for r in drained] == [(True, "2", "1", "UPDATE")]
        assert publish(table.path, store) == []
        assert snapshots(store, table) == ["1", "2"]
        changes = read_changes(spark, [r.event for r in drained])
        assert change_rows(changes) == [(1, "a", "update_preimage", 2), (1, "b", "update_postimage", 2),
                                        (2, "c", "insert", 2)]
