"""The driver path: Arrow and pandas input land and commit on this machine without Spark; input is conformed
to the table schema batch by batch; a stream lands in segments cut in input order."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import bitlake
from bitlake.engine.write import landing
from tests.test_table import files_under

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("mod", pa.int64())])


def test_arrow_and_pandas_input_never_start_spark(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        import pandas as pd
        import pyarrow as pa
        import bitlake

        schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("mod", pa.int64())])
        t = bitlake.create_table({str(tmp_path / "t")!r}, schema, primary_key=["id"], delta_column="mod")
        t.ingest(pa.table({{"id": [1, 2, 3], "name": ["a", "b", "c"], "mod": [1, 1, 1]}}))
        t.ingest(pd.DataFrame({{"id": [2, 3], "name": ["B", None], "mod": [2, 2], "op": ["upsert", "delete"]}}),
                 op_column="op")
        reader = pa.RecordBatchReader.from_batches(schema, pa.table({{"id": [4], "name": ["d"], "mod": [1]}}).to_batches())
        t.ingest(reader)
        t.ingest(pa.table({{"id": [5], "name": ["e"], "mod": [1]}}).to_batches()[0])
        print(sorted((r["id"], r["name"]) for r in t.to_arrow().to_pylist()))
        print("pyspark" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[(1, 'a'), (2, 'B'), (4, 'd'), (5, 'e')]"
    assert out[1] == "False"


@pytest.fixture
def table(tmp_path):
    schema = pa.schema([
        ("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()), ("at", pa.timestamp("us", tz="UTC")),
        ("local", pa.timestamp("us")), ("mod", pa.int64()),
    ])
    return bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id"], delta_column="mod")


def test_arrow_representations_are_conformed(table):
    at = dt.datetime(2026, 1, 2, 3, 4, 5, 6)
    data = pa.table({
        "MOD": pa.array([1, 1], pa.int32()),  # names match case-insensitively; int32 widens
        "id": pa.array([1, 2], pa.uint16()),
        "name": pa.array(["a", "b"], pa.large_string()),
        "score": pa.array([0.5, None], pa.float32()),
        "at": pa.array([at, at], pa.timestamp("ns")),  # a wall-clock time into a zoned column is UTC
        "local": pa.array([at, at], pa.timestamp("ms")).cast(pa.timestamp("us")),
    })
    table.ingest(pa.table({**{n: data.column(n) for n in data.column_names if n != "score"}}))  # score: nullable
    table.ingest(data.slice(1), batch_id="again")
    rows = {r["id"]: r for r in table.to_arrow().to_pylist()}
    assert rows[1]["score"] is None and rows[2]["score"] is None
    assert rows[1]["at"] == at.replace(tzinfo=dt.UTC) and rows[1]["name"] == "a"
    assert rows[1]["local"] == at.replace(microsecond=0)
    categorical = pa.table({"id": [3], "name": pa.array(["c"]).dictionary_encode(), "mod": [1]})
    table.ingest(categorical)
    assert table.to_arrow().sort_by("id").column("name").to_pylist() == ["a", "b", "c"]


@pytest.mark.parametrize("data, error, message", [
    (pa.table({"id": pa.array([1], pa.uint64()), "mod": [1]}), bitlake.SchemaMismatchError, "'id' has type uint64"),
    (pa.table({"id": [1], "mod": [1.5]}), bitlake.SchemaMismatchError, "'mod' has type double"),
    (pa.table({"id": [1], "mod": [1], "local": pa.array([dt.datetime(2026, 1, 1)], pa.timestamp("us", tz="UTC"))}),
     bitlake.SchemaMismatchError, "'local' has type timestamp"),
    (pa.table({"id": [1], "mod": [1], "ID": [2]}), bitlake.SchemaMismatchError, "repeat a name"),
    (pa.table({"id": [1], "mod": [1], "at": pa.array([1_000_000_001], pa.timestamp("ns"))}),
     bitlake.InvalidInputError, "'at'.* do not fit.*floor_temporal"),
    (pa.table({"id": [1], "mod": [1], "op": [1]}), bitlake.SchemaMismatchError, "must be a string column"),
    ({"id": [1], "mod": [1]}, bitlake.InvalidInputError, "cannot ingest a dict"),
])
def test_input_that_does_not_conform_writes_nothing(table, data, error, message):
    before = files_under(table.path)
    with pytest.raises(error, match=message):
        table.ingest(data, op_column="op" if isinstance(data, pa.Table) and "op" in data.column_names else None)
    assert table.version == 0
    assert [p for p in files_under(table.path) if p not in before and not p.startswith("_bitlake/parts/")] == []


@pytest.mark.parametrize("lookups", [True, False], ids=["key-index", "key-store-scan"])
def test_unsigned_64_bit_keys_and_deltas_beyond_the_int64_range(tmp_path, monkeypatch, lookups):
    """uint64 keys from 2^63 on (hash ids) are keys like any other, found by the key index's lookups and by the
    key-store scan; a uint64 delta value from 2^63 - 1 on, which bitlake cannot order among its int64 deltas, is
    refused with the column named and nothing written; valid_at beyond the int64 range is +infinity."""
    from bitlake.engine.write import metagen

    monkeypatch.setattr(metagen, "LOOKUP_COST_IN_ROWS", 0 if lookups else 10**12)
    schema = pa.schema([("k", pa.uint64()), ("d", pa.uint64()), ("v", pa.string())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["k"], delta_column="d", num_buckets=4)
    big = [2**63, 2**63 + 5, 2**64 - 1]
    keys = pa.array([*big, 0, 7], pa.uint64())
    t.ingest(pa.table({"k": keys, "d": pa.array([1, 1, 2**63 - 2, 1, 1], pa.uint64()), "v": list("abcde")}))
    r = t.ingest(pa.table({"k": pa.array([2**63 + 5, 2**64 - 1, 7, 2**63 + 6], pa.uint64()),
                           "d": pa.array([2, 3, 0, 1], pa.uint64()), "v": ["B", "C", "E", "f"]}))
    assert r.counts == {"inserted": 1, "updated": 1, "deleted": 0, "stale": 2, "ignored_deletes": 0}
    view = {row["k"]: row["v"] for row in t.to_arrow().to_pylist()}
    assert view == {2**63: "a", 2**63 + 5: "B", 2**64 - 1: "c", 0: "d", 7: "e", 2**63 + 6: "f"}
    assert len(t.to_arrow(valid_at=2**64 + 1).to_pylist()) == 6
    before = files_under(t.path)
    with pytest.raises(bitlake.InvalidInputError, match="delta column 'd' holds 1 value.* at or above the largest"):
        t.ingest(pa.table({"k": pa.array([1], pa.uint64()), "d": pa.array([2**63], pa.uint64()), "v": ["x"]}))
    assert t.version == 2
    assert [p for p in files_under(t.path) if p not in before and not p.startswith("_bitlake/parts/")] == []


@pytest.mark.parametrize("lookups", [True, False], ids=["key-index", "key-store-scan"])
def test_decimal_keys(tmp_path, monkeypatch, lookups):
    """Decimal key columns, alone and with an integer: updates find their stored entries by the key index and by
    the key-store scan (an ingest crashed in the key encoding before)."""
    import decimal

    from bitlake.engine.write import metagen

    monkeypatch.setattr(metagen, "LOOKUP_COST_IN_ROWS", 0 if lookups else 10**12)
    D = decimal.Decimal
    schema = pa.schema([("a", pa.int64()), ("k", pa.decimal128(10, 3)), ("v", pa.string()), ("d", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["a", "k"], delta_column="d", num_buckets=2)
    t.ingest(pa.table({"a": [1, 1, 2], "k": pa.array([D("-1"), D("0.001"), D("-1")], schema.field("k").type),
                       "v": ["x", "y", "z"], "d": [1, 1, 1]}))
    r = t.ingest(pa.table({"a": [1, 2, 1], "k": pa.array([D("-1.000"), D("-1"), D("5")], pa.decimal128(8, 2)),
                           "v": ["X", "old", "new"], "d": [2, 0, 1]}))
    assert r.counts == {"inserted": 1, "updated": 1, "deleted": 0, "stale": 1, "ignored_deletes": 0}
    view = {(row["a"], row["k"]): row["v"] for row in t.to_arrow().to_pylist()}
    assert view == {(1, D("-1.000")): "X", (1, D("0.001")): "y", (2, D("-1.000")): "z", (1, D("5.000")): "new"}


def test_a_stream_lands_in_segments_in_input_order(tmp_path, monkeypatch):
    monkeypatch.setattr(landing, "STREAM_TASK_ROWS", 7)
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod")
    # Every record has key 1 and the same delta: each supersedes the one before it in the batch.
    batches = [pa.record_batch({"id": [1] * n, "name": [f"{i}-{j}" for j in range(n)], "mod": [0] * n}, schema=SCHEMA)
               for i, n in enumerate([5, 9, 1, 12])]
    result = t.ingest(pa.RecordBatchReader.from_batches(SCHEMA, batches))
    assert result.counts == {"inserted": 1, "updated": 26, "deleted": 0, "stale": 0, "ignored_deletes": 0}
    assert t.to_arrow().to_pylist() == [{"id": 1, "name": "3-11", "mod": 0}]
    data = [f for f in files_under(t.path) if f.startswith("data/")]
    assert len(data) == 4  # 27 rows in segments of 7


def test_a_stream_segment_also_ends_at_its_byte_budget(tmp_path, monkeypatch):
    # Wide rows in small batches: the segments end at the budget, never slicing a batch for it, in input order.
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod")
    batches = [pa.record_batch({"id": list(range(i * 10, i * 10 + 10)), "name": ["x" * 1000] * 10, "mod": [0] * 10},
                               schema=SCHEMA) for i in range(9)]
    monkeypatch.setattr(landing, "STREAM_TASK_BYTES", 2 * batches[0].nbytes)
    held = {}
    real = landing.LandTask.cut

    def cut(self, seq, segment):
        held[seq] = []
        return real(self, seq, (held[seq].append(b.num_rows) or b for b in segment))

    monkeypatch.setattr(landing.LandTask, "cut", cut)
    assert t.ingest(pa.RecordBatchReader.from_batches(SCHEMA, batches)).counts["inserted"] == 90
    assert [held[seq] for seq in sorted(held)] == [[10, 10]] * 4 + [[10]]
    assert sorted(r["id"] for r in t.to_arrow().to_pylist()) == list(range(90))


def test_a_stream_that_fails_midway_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(landing, "STREAM_TASK_ROWS", 2)
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod")
    t.ingest(pa.table({"id": [1], "name": ["a"], "mod": [1]}))
    before = files_under(t.path)
    good = pa.record_batch({"id": [2, 3, 4], "name": ["b", "c", "d"], "mod": [1, 1, 1]}, schema=SCHEMA)
    bad = pa.record_batch({"id": [5, None], "name": ["e", "f"], "mod": [1, 1]}, schema=SCHEMA)
    with pytest.raises(bitlake.NullValueError, match="primary key column 'id' holds 1 null"):
        t.ingest(pa.RecordBatchReader.from_batches(SCHEMA, [good, good, bad]))
    assert t.version == 1 and t.to_arrow().to_pylist() == [{"id": 1, "name": "a", "mod": 1}]
    assert [p for p in files_under(t.path) if p not in before and not p.startswith("_bitlake/parts/")] == []


@pytest.mark.parametrize("limit, kept", [(100, True), (12, False)])
def test_a_stream_keeps_its_keys_for_metagen_up_to_the_inline_limit(tmp_path, monkeypatch, limit, kept):
    """A stream's records' keys-file rows are kept for the inline MetaGen while the stream holds at most
    ``metagen.inline_max_rows`` records (it then reads none of the files); past that the landing drops them, and
    MetaGen reads the files."""
    from bitlake.format import datafile

    monkeypatch.setattr(landing, "STREAM_TASK_ROWS", 7)
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod",
                             properties={"metagen.inline_max_rows": limit})
    t.ingest(pa.table({"id": [1], "name": ["old"], "mod": [0]}, schema=SCHEMA))
    read = []
    real = datafile.read_upserts
    monkeypatch.setattr(datafile, "read_upserts", lambda *a, **k: read.append(a[1]) or real(*a, **k))
    batches = [pa.record_batch({"id": list(range(i * 5, i * 5 + 5)), "name": ["n"] * 5, "mod": [1] * 5},
                               schema=SCHEMA) for i in range(4)]
    r = t.ingest(pa.RecordBatchReader.from_batches(SCHEMA, batches))
    assert r.counts["inserted"] == 19 and r.counts["updated"] == 1
    assert (read == []) is kept
    assert sorted((x["id"], x["name"]) for x in t.to_arrow().to_pylist()) == [(i, "n") for i in range(20)]


def test_a_segment_task_that_fails_midway_through_a_stream_stops_it(tmp_path, monkeypatch):
    """A task that fails while the stream still feeds it (a write error): the error is raised at once, not after
    the whole stream is read, and nothing is left."""
    from bitlake.format import datafile

    monkeypatch.setattr(datafile, "ROW_GROUP_ROWS", 4)
    monkeypatch.setattr(landing, "_FEED_BYTES", 1)  # each batch handed over at once
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod")
    t.ingest(pa.table({"id": [1], "name": ["a"], "mod": [1]}, schema=SCHEMA))
    before = files_under(t.path)

    def encode(self, table):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(datafile.FileWriter, "_encode", encode)
    given = []

    def stream():
        for i in range(10_000):
            given.append(i)
            yield pa.record_batch({"id": [i * 2, i * 2 + 1], "name": ["x", "y"], "mod": [1, 1]}, schema=SCHEMA)

    with pytest.raises(OSError, match="No space left"):
        t.ingest(pa.RecordBatchReader.from_batches(SCHEMA, stream()))
    assert len(given) < 10_000
    monkeypatch.undo()
    assert t.version == 1 and t.to_arrow().to_pylist() == [{"id": 1, "name": "a", "mod": 1}]
    assert [p for p in files_under(t.path) if p not in before and not p.startswith("_bitlake/parts/")] == []


def test_a_large_spark_partition_lands_in_parallel_in_input_order(tmp_path, spark):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod",
                             properties={"ingest.driver_max_bytes": "0"})
    n = 3000
    data = pa.table({"id": pa.array([i % 7 for i in range(n)], pa.int64()), "name": [f"{i:05d}" for i in range(n)],
                     "mod": pa.array([0] * n, pa.int64())})
    df = spark.createDataFrame(data).coalesce(1)  # one partition, as a file of one row group reads
    previous = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "1k")  # so that it would fill every core
    try:
        t.ingest(df)
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", previous)
    data_files = [f for f in t.state().data_files()]
    assert len(data_files) == spark.sparkContext.defaultParallelism > 1
    # Row ids follow the input: every key keeps its last record (equal deltas), and in (seq, offset) order
    # the rows are the input's.
    assert sorted((r["id"], r["name"]) for r in t.to_arrow().to_pylist()) == [
        (k, f"{max(i for i in range(n) if i % 7 == k):05d}") for k in range(7)]
    rows = pa.concat_tables([pq.read_table(t.io.local_path(f.path)) for f in data_files])
    rows = rows.sort_by([("_segment_seq", "ascending"), ("_segment_offset", "ascending")])
    assert rows.column("name").to_pylist() == [f"{i:05d}" for i in range(n)]


@pytest.mark.parametrize("driver_max_bytes, files", [(None, 1), ("0", 2)])
def test_a_small_spark_dataframe_is_collected_and_lands_on_the_driver(tmp_path, spark, driver_max_bytes, files):
    properties = {"ingest.driver_max_bytes": driver_max_bytes} if driver_max_bytes else {}
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod",
                             properties=properties)
    df = spark.createDataFrame(pa.table({"id": [1, 2, 3, 4], "name": list("abcd"), "mod": [1, 1, 1, 1]}))
    t.ingest(df.repartition(2))
    # Collected, it is one segment of the driver path; in a Spark job, one per task.
    assert len(t.state().data_files()) == files
    assert sorted(r["id"] for r in t.to_arrow().to_pylist()) == [1, 2, 3, 4]


@pytest.mark.parametrize("landing", ["driver", "spark-job"])
def test_only_delete_records_have_keys_files(tmp_path, request, landing):
    """An upsert's key, delta and row id are in its data file: a batch writes keys files for its deletes only,
    and its record count is both."""
    properties = {"ingest.driver_max_bytes": "0"} if landing == "spark-job" else {}
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod",
                             properties=properties)

    def ingest(data: pa.Table, **kw):
        if landing == "spark-job":
            data = request.getfixturevalue("spark").createDataFrame(data).coalesce(1)
        return t.ingest(data, **kw)

    ingest(pa.table({"id": [1, 2, 3], "name": list("abc"), "mod": [1, 1, 1]}), batch_id="base")
    base = t.state().batch("base")
    assert (base.keys_files, base.records) == ((), 3)
    assert not os.path.exists(tmp_path / "t" / "_bitlake" / "keys")
    r = ingest(pa.table({"id": [2, 3, 4], "name": ["B", None, "d"], "mod": [2, 2, 2],
                         "op": ["upsert", "delete", "upsert"]}), op_column="op", batch_id="changes")
    assert r.counts == {"inserted": 1, "updated": 1, "deleted": 1, "stale": 0, "ignored_deletes": 0}
    batch = t.state().batch("changes")
    assert batch.records == 3
    keys = pa.concat_tables([pq.read_table(t.io.local_path(f.path)) for f in batch.keys_files])
    assert keys.column("id").to_pylist() == [3] and keys.column("_deleted").to_pylist() == [True]
    assert sorted((x["id"], x["name"]) for x in t.to_arrow().to_pylist()) == [(1, "a"), (2, "B"), (4, "d")]


def test_a_large_commit_gives_its_freed_memory_back(tmp_path, monkeypatch):
    """A commit of RELEASE_AFTER_RECORDS records or more returns what it freed to the system (pyarrow's pool and
    the C library's heap), a smaller one leaves it to the next allocations."""
    from bitlake import memory

    released = []
    real = memory.release_unused
    monkeypatch.setattr(memory, "release_unused", lambda: released.append(1) or real())
    monkeypatch.setattr(memory, "RELEASE_AFTER_RECORDS", 100)
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod")
    t.ingest(pa.table({"id": list(range(99)), "name": ["a"] * 99, "mod": [1] * 99}, schema=SCHEMA))
    assert released == []
    t.ingest(pa.table({"id": list(range(100)), "name": ["b"] * 100, "mod": [2] * 100}, schema=SCHEMA))
    assert released == [1] and t.to_arrow().num_rows == 100
    assert memory._malloc_trim() is not None  # glibc here: the heap is trimmed too


def test_metagen_runs_while_the_landing_still_writes_the_files(tmp_path, monkeypatch):
    """The inline MetaGen needs the records' keys, not the files: it starts before the batch's data file is
    written (here the file's last write waits for it), and the commit names the file at its size."""
    import threading

    from bitlake.engine.write import metagen
    from bitlake.format import datafile

    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod")
    t.ingest(pa.table({"id": [1, 2], "name": ["a", "b"], "mod": [1, 1]}, schema=SCHEMA))
    started = threading.Event()
    real_run, real_close = metagen.run_inline, datafile.FileWriter.close
    monkeypatch.setattr(metagen, "run_inline", lambda *a, **k: started.set() or real_run(*a, **k))
    monkeypatch.setattr(datafile.FileWriter, "close", lambda self: started.wait(30) and real_close(self))
    r = t.ingest(pa.table({"id": [2, 3], "name": ["B", "c"], "mod": [2, 2]}, schema=SCHEMA))
    assert r.counts["updated"] == 1 and r.counts["inserted"] == 1
    assert sorted(x["name"] for x in t.to_arrow().to_pylist()) == ["B", "a", "c"]
    for f in t.state().data_files():
        assert f.bytes == os.path.getsize(t.io.local_path(f.path)) > 0


def test_a_landing_write_that_fails_after_metagen_leaves_nothing(tmp_path, monkeypatch):
    """A data file whose write fails once MetaGen has run (a full disk): the error is raised, the table stays at
    its last commit, and neither the landing's files nor MetaGen's are left."""
    from bitlake.format import datafile

    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod")
    t.ingest(pa.table({"id": [1, 2], "name": ["a", "b"], "mod": [1, 1]}, schema=SCHEMA))
    before = files_under(tmp_path / "t")
    version = t.state().version

    def close(self):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(datafile.FileWriter, "close", close)
    with pytest.raises(OSError, match="No space left"):
        t.ingest(pa.table({"id": [2, 3], "name": ["B", "c"], "mod": [2, 2]}, schema=SCHEMA))
    monkeypatch.undo()
    assert t.state().version == version
    after = [f for f in files_under(tmp_path / "t") if not f.startswith("_bitlake/parts/")]
    assert after == [f for f in before if not f.startswith("_bitlake/parts/")]


def test_a_delete_batch_is_numbered_in_key_order_and_keeps_its_input_order(tmp_path):
    """Deletes alone take their row ids in key order (a stable sort: a key's deletes keep their order of arrival),
    and the keys file's ``_position`` keeps each one's offset in input order, which the change feed lists them in
    (acceptance order); of two deletes of one key at one delta value the later arrival is the key's entry."""
    from bitlake.format import datafile, keystore, protocol, rowid

    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("v", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["a", "b"], delta_column="v", num_buckets=2)
    t.ingest(pa.table({"a": [1, 2, 3, 3, 9], "b": ["x", "x", "y", "x", "x"], "v": [0] * 5}, schema=schema))
    assert protocol.DELETE_POSITIONS not in t.state().protocol.reader_features
    deletes = pa.table({"a": [9, 3, 2, 3, 3, 2], "b": ["x", "y", "x", "x", "y", "x"], "v": [1, 2, 1, 1, 2, 3],
                        "op": ["delete"] * 6})
    assert t.ingest(deletes, op_column="op").counts["deleted"] == 4
    state = t.state()
    assert protocol.DELETE_POSITIONS in state.protocol.reader_features
    [keys_file] = [k for b in state.parts.values() if b.batch_id != state.parts[min(state.parts)].batch_id
                   for k in b.keys_files]
    rows = pq.read_table(t.io.local_path(keys_file.path))
    offsets = rows.column(keystore.ROW_ID).to_numpy() & rowid.MAX_OFFSET
    assert offsets.tolist() == list(range(6))  # the file in offset order, the offsets in key order
    assert list(zip(rows.column("a").to_pylist(), rows.column("b").to_pylist(), rows.column(keystore.DELTA).to_pylist(),
                    rows.column(datafile.POSITION).to_pylist(), strict=True)) == \
        [(2, "x", 1, 2), (2, "x", 3, 5), (3, "x", 1, 3), (3, "y", 2, 1), (3, "y", 2, 4), (9, "x", 1, 0)]
    # The feed in input order: (9, x), then (3, y) at delta 2 and (2, x) at delta 1 ... by delta value first.
    feed = t.changes_to_arrow(starting_version=state.version, ending_version=state.version)
    assert list(zip(feed.column("a").to_pylist(), feed.column("_change_type").to_pylist(), strict=True)) == \
        [(9, "delete"), (2, "delete"), (3, "delete"), (3, "delete")]
    assert feed.column("b").to_pylist() == ["x", "x", "x", "y"]
    entries = pa.concat_tables(keystore.read_file(t.io, f, state.metadata)
                               for fs in state.keystore.values() for f in fs)
    latest = {}
    for r in entries.to_pylist():
        key = (r["a"], r["b"])
        if key not in latest or r[keystore.VERSION] >= latest[key][keystore.VERSION]:
            latest[key] = r
    # The tie of (3, y) at delta 2: the later of its two deletes is the entry.
    tied = [int(r) for a, b, r in zip(rows.column("a").to_pylist(), rows.column("b").to_pylist(),
                                       rows.column(keystore.ROW_ID).to_pylist(), strict=True) if (a, b) == (3, "y")]
    assert latest[(3, "y")][keystore.ROW_ID] == max(tied) and latest[(3, "y")][keystore.DELETED]
    assert t.to_arrow().column("a").to_pylist() == [1]
