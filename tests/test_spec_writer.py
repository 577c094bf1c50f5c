"""A table written by tests/spec_writer.py (docs/FORMAT.md alone, no bitlake) is a bitlake table: bitlake opens,
reads, time-travels, feeds its changes and ingests into it, and tests/spec_reader.py (also FORMAT.md alone) reads
what both wrote the same way. The expected rows are written out by hand from BRIEF.md's semantics."""
from __future__ import annotations

import datetime as dt
import importlib
import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import bitlake
from tests import spec_reader
from tests.spec_writer import SpecWriter, bucket_of, delta_int64, envelope


def _bitlake(name: str):
    """bitlake's internal function `name`, imported when asked: when a module moves, fix its path here only."""
    module, attr = {"buckets": ("bitlake.format.bucket", "buckets")}[name]
    return getattr(importlib.import_module(module), attr)


UTC = dt.UTC
SCHEMA = pa.schema([pa.field("region", pa.string(), False), pa.field("id", pa.int64(), False),
                    pa.field("ts", pa.timestamp("us", tz="UTC"), False), pa.field("name", pa.string())])
KEY = ["region", "id"]


def at(seconds: int) -> dt.datetime:
    return dt.datetime(2024, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=seconds)


def up(region, i, t, name):
    return {"region": region, "id": i, "ts": at(t), "name": name, "_op": "upsert"}


def rm(region, i, t):
    return {"region": region, "id": i, "ts": at(t), "_op": "delete"}


BATCHES = [
    ("b1", [up("eu", 1, 10, "a1"), up("eu", 2, 10, "b1"), up("us", 1, 10, "c1"), up("us", 2, 10, "d1")]),
    # an update, a delete, an insert and a stale record (older than its key's entry)
    ("b2", [up("eu", 1, 20, "a2"), rm("us", 2, 20), up("us", 3, 20, "e2"), up("eu", 2, 5, "stale")]),
    # two records of one key, applied in delta order (a25 first, then a3); a key inserted again after its
    # delete; a delete of a key the table never had
    ("b3", [up("eu", 1, 30, "a3"), up("eu", 1, 25, "a25"), up("us", 2, 30, "d3"), rm("zz", 9, 30)]),
]
ROW = {"a1": ("eu", 1, 10), "a2": ("eu", 1, 20), "a25": ("eu", 1, 25), "a3": ("eu", 1, 30), "b1": ("eu", 2, 10),
       "c1": ("us", 1, 10), "d1": ("us", 2, 10), "e2": ("us", 3, 20), "d3": ("us", 2, 30), "c4": ("us", 1, 40),
       "f4": ("eu", 9, 40)}
VIEWS = {0: [], 1: ["a1", "b1", "c1", "d1"], 2: ["a2", "b1", "c1", "e2"], 3: ["a3", "b1", "c1", "d3", "e2"],
         4: ["a3", "c4", "d3", "e2", "f4"]}
# (version, valid_at seconds) -> rows
EVENT_TIME_VIEWS = {(3, 15): ["a1", "b1", "c1", "d1"], (3, 27): ["a25", "b1", "c1", "e2"],
                    (2, 20): ["a2", "b1", "c1", "e2"], (4, 35): ["a3", "b1", "c1", "d3", "e2"]}
CHANGES = [  # in the change feed's order
    (1, "insert", "a1"), (1, "insert", "b1"), (1, "insert", "c1"), (1, "insert", "d1"),
    (2, "update_preimage", "a1"), (2, "update_postimage", "a2"), (2, "delete", "d1"), (2, "insert", "e2"),
    (3, "update_preimage", "a2"), (3, "update_postimage", "a25"), (3, "update_preimage", "a25"),
    (3, "update_postimage", "a3"), (3, "insert", "d3"),
    (4, "update_preimage", "c1"), (4, "update_postimage", "c4"), (4, "insert", "f4"), (4, "delete", "b1"),
]
COUNTS = {1: dict(inserted=4, updated=0, deleted=0, stale=0, ignored_deletes=0),
          2: dict(inserted=1, updated=1, deleted=1, stale=1, ignored_deletes=0),
          3: dict(inserted=1, updated=2, deleted=0, stale=0, ignored_deletes=1),
          4: dict(inserted=1, updated=1, deleted=1, stale=0, ignored_deletes=0)}


def rows(names: list[str]) -> list[tuple]:
    return sorted((*ROW[n], n) for n in names)


def as_rows(table_rows: list[dict]) -> list[tuple]:
    """(region, id, ts seconds, name) of each row, sorted."""
    return sorted((r["region"], r["id"], int((r["ts"] - at(0)).total_seconds()), r["name"]) for r in table_rows)


def as_changes(table_rows: list[dict]) -> list[tuple]:
    """(version, change type, name) of each change row, in the feed's order."""
    return [(r["_commit_version"], r["_change_type"], r["name"]) for r in table_rows]


@pytest.fixture
def written(tmp_path):
    """The table of BATCHES, written by spec_writer, with a checkpoint at its last version."""
    base = str(tmp_path / "t")
    w = SpecWriter(base, SCHEMA, KEY, "ts", num_buckets=8, name="spec_table")
    assert w.create() == 0
    for i, (batch_id, records) in enumerate(BATCHES, start=1):
        assert w.ingest(batch_id, records) == i
    assert w.ingest("b1", BATCHES[0][1]) is None  # a taken batch id: a no-op
    assert w.checkpoint() == 3
    return base


def test_bitlake_reads_what_spec_writer_wrote(written):
    t = bitlake.open_table(written)
    assert (t.version, t.name, t.metadata.primary_key, t.metadata.delta_column) == (3, "spec_table", tuple(KEY), "ts")
    for v in range(4):
        assert as_rows(t.to_arrow(version=v).to_pylist()) == rows(VIEWS[v]), f"version {v}"
    for (v, seconds), names in EVENT_TIME_VIEWS.items():
        if v <= 3:
            assert as_rows(t.to_arrow(version=v, valid_at=at(seconds)).to_pylist()) == rows(names), (v, seconds)
    assert as_changes(t.changes_to_arrow(starting_version=1).to_pylist()) == [c for c in CHANGES if c[0] <= 3]
    assert [h["counts"] for h in reversed(t.history()[:-1])] == [COUNTS[v] for v in (1, 2, 3)]


def test_spec_writer_buckets_and_key_order_are_bitlakes(written):
    """Every key-store row is in the bucket bitlake computes for its key, and each file is in key order."""
    buckets = _bitlake("buckets")
    t = bitlake.open_table(written)
    for bucket, files in t.state().keystore.items():
        for f in files:
            table = pq.read_table(os.path.join(written, f.path))
            assert set(buckets(table, KEY, 8).tolist()) == {bucket}
            keys = [(r["region"], r["id"]) for r in table.select(KEY).to_pylist()]
            assert {bucket_of(k, [pa.string(), pa.int64()], 8) for k in keys} == {bucket}
            assert keys == sorted(set(keys), key=lambda k: (k[0].encode(), k[1]))


def test_spec_writer_checkpoint_is_bitlakes_state(written, tmp_path):
    """The checkpoint spec_writer wrote is the state bitlake replays from the commits alone."""
    replayed = str(tmp_path / "replayed")
    shutil.copytree(written, replayed)
    shutil.rmtree(os.path.join(replayed, "_bitlake", "state"))
    with open(os.path.join(written, "_bitlake", "state", f"{3:020d}.json"), "rb") as f:
        checkpoint = f.read()
    assert checkpoint == envelope(json.loads(checkpoint[checkpoint.index(b',"body":') + 8:-1]))
    body = json.loads(checkpoint[checkpoint.index(b',"body":') + 8:-1])
    assert body == json.loads(json.dumps(bitlake.open_table(replayed).state(3).to_json()))


def test_bitlake_ingests_into_spec_table_and_spec_reader_agrees(written):
    t = bitlake.open_table(written)
    assert not t.ingest(pa.table({"region": ["eu"], "id": [1], "ts": [at(99)], "name": ["x"]}, schema=SCHEMA),
                        batch_id="b2").committed  # spec_writer's batch id is taken
    batch = pa.table({"region": ["us", "eu", "eu"], "id": [1, 9, 2], "ts": [at(40)] * 3, "name": ["c4", "f4", None],
                      "op": ["upsert", "upsert", "delete"]})
    result = t.ingest(batch, op_column="op", batch_id="b4")
    assert (result.version, result.counts) == (4, COUNTS[4])
    for v in range(5):
        assert as_rows(t.to_arrow(version=v).to_pylist()) == rows(VIEWS[v]), f"version {v}"
        assert as_rows(spec_reader.read_view(written, v)) == rows(VIEWS[v]), f"spec_reader, version {v}"
    for (v, seconds), names in EVENT_TIME_VIEWS.items():
        valid_at = delta_int64(at(seconds), SCHEMA.field("ts").type)
        assert as_rows(t.to_arrow(version=v, valid_at=at(seconds)).to_pylist()) == rows(names), (v, seconds)
        assert as_rows(spec_reader.read_view(written, v, valid_at=valid_at)) == rows(names), (v, seconds)
    assert as_changes(t.changes_to_arrow(starting_version=1).to_pylist()) == CHANGES
    assert as_changes(spec_reader.read_changes(written, 0, 4)) == CHANGES
    assert as_changes(spec_reader.read_changes(written, 2, 4)) == [c for c in CHANGES if c[0] > 2]
