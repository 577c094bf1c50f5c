"""The key index (RocksDB) and the inline MetaGen: encoding, catch-up, rebuild, a busy index."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import bitlake
from bitlake.engine.keys import keyencoding, keyindex
from bitlake.engine.keys.indexsession import close_idle
from bitlake.engine.keys.keyencoding import encode_keys
from bitlake.engine.write import metagen, spill
from bitlake.format import keystore, layout
from tests.test_table import SCHEMA, batch, view


def opened(t) -> keyindex.KeyIndex:
    """The table's key index, opened here after this process's writers let go of it."""
    close_idle()
    return keyindex.KeyIndex(t.io, t.metadata)


KEY_COLUMNS = [
    {"a": pa.array([0, -1, 1, 2**62, -(2**62), 0], pa.int64())},
    {"a": pa.array([0, 1, 1, 0], pa.int32()), "b": pa.array([1, 0, 1, 0], pa.int8())},
    {"a": pa.array(["", "a", "a\x00", "\x00a", "ab", "b"], pa.string())},
    {"a": pa.array(["a", "ab", "a", "", "b", ""], pa.string()), "b": pa.array(["bc", "c", "b", "abc", "", ""], pa.string())},
    {"a": pa.array([b"", b"\x00", b"\x00\x00"], pa.binary()), "b": pa.array([1, 1, 1], pa.int64())},
    {"a": pa.array([dt.date(2020, 1, 1), dt.date(1969, 12, 31)], pa.date32()),
     "b": pa.array([dt.datetime(2020, 1, 1), dt.datetime(2020, 1, 1, 0, 0, 1)], pa.timestamp("us"))},
    {"a": pa.array([True, False], pa.bool_())},
    {"a": pa.array([3, -7, -(2**63), 2**63 - 1, -1, 0], pa.int64()), "b": pa.array([-1, 1, 0, -1, -2, 2], pa.int16())},
    {"a": pa.array(["x", "x", "y", "x"], pa.string()), "b": pa.array([-2, 5, -9, -3], pa.int64())},
]


@pytest.mark.parametrize("columns", KEY_COLUMNS)
def test_keys_encode_equal_iff_the_keys_are_equal(columns):
    table = pa.table(columns)
    encoded = encode_keys(table, list(columns))
    rows = list(zip(*[c.to_pylist() for c in columns.values()], strict=True))
    for i in range(len(rows)):
        for j in range(len(rows)):
            assert (encoded[i] == encoded[j]) == (rows[i] == rows[j]), (rows[i], rows[j])


@pytest.mark.parametrize("columns", KEY_COLUMNS)
def test_key_order_is_the_byte_order_of_the_encoded_keys(columns):
    """RocksDB takes SST entries in byte order: negative integers, dates before 1970 and false sort first."""
    table = pa.table(columns)
    encoded = encode_keys(table, list(columns))
    order = keyencoding.key_order(table, list(columns))
    in_order = [encoded[i] for i in (range(table.num_rows) if order is None else order)]
    assert in_order == sorted(encoded)
    if keyencoding.fixed_width(table, list(columns)):
        rows = list(zip(*[c.to_pylist() for c in columns.values()], strict=True))
        assert [rows[i] for i in (range(table.num_rows) if order is None else order)] == sorted(rows)


def test_tables_without_an_encodable_key_have_no_index(tmp_path):
    schema = pa.schema([("k", pa.decimal128(10, 2)), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "f"), schema, primary_key=["k"], delta_column="mod")
    assert not keyindex.supported(t.metadata)
    off = bitlake.create_table(str(tmp_path / "o"), SCHEMA, primary_key=["id"], delta_column="mod",
                               properties={"keystore.index": "none"})
    assert not keyindex.supported(off.metadata)
    with pytest.raises(bitlake.IndexUnavailableError, match="allow no index"):
        keyindex.KeyIndex(off.io, off.metadata)


@pytest.mark.spark
def test_inline_metagen_continues_from_spark_commits_and_rebuilds_a_lost_index(tmp_path, spark, monkeypatch):
    from bitlake.engine.write import metagen

    monkeypatch.setattr(metagen, "LOOKUP_COST_IN_ROWS", 0)
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch([1, 2, 3], ["a", "b", "c"], [1, 1, 1]), inline=False, spark=spark)
    r = t.ingest(batch([1, 2, 4], ["a2", None, "d"], [2, 2, 2], ["upsert", "delete", "upsert"]), op_column="op",
                 inline=True, spark=spark)
    assert r.counts == {"inserted": 1, "updated": 1, "deleted": 1, "stale": 0, "ignored_deletes": 0}
    with opened(t) as index:
        assert index.version == t.version

    shutil.rmtree(t.io.local_path(layout.INDEX_DIR))
    # The delete marker of key 2 (delta 2) must survive the rebuild: an older record stays stale.
    r = t.ingest(batch([2, 3], ["old", "c3"], [1, 3]), inline=True, spark=spark)
    assert r.counts == {"inserted": 0, "updated": 1, "deleted": 0, "stale": 1, "ignored_deletes": 0}
    assert view(t) == [(1, "a2", 2), (3, "c3", 3), (4, "d", 2)]


@pytest.mark.spark
def test_a_busy_index_makes_the_inline_metagen_scan_the_key_store(tmp_path, spark, monkeypatch):
    from bitlake.engine.write import metagen

    monkeypatch.setattr(metagen, "LOOKUP_COST_IN_ROWS", 0)  # lookups whenever the index is free
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch([1, 2], ["a", "b"], [1, 1]), spark=spark)
    # Another process holds the index (RocksDB admits one opener at a time): a writer of a bitlake from before
    # index.lock, which only RocksDB's own lock keeps out.
    close_idle()  # this process keeps the index open after a commit
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from rocksdict import Rdict, Options; "
         f"db = Rdict({t.io.local_path(layout.INDEX_DIR)!r}, Options(raw_mode=True)); print('open', flush=True); "
         "sys.stdin.read(); db.close()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(bitlake.IndexUnavailableError, match="in use by another writer"):
            keyindex.KeyIndex(t.io, t.metadata)
        r = t.ingest(batch([1, 3], ["a2", "c"], [2, 2]), inline=True, spark=spark)
        assert r.counts["updated"] == 1 and r.counts["inserted"] == 1
    finally:
        holder.communicate("")
    # The index is now behind the last commit; the next inline MetaGen replays that commit first.
    r = t.ingest(batch([1, 3], ["a1", "c0"], [3, 1]), inline=True, spark=spark)
    assert r.counts == {"inserted": 0, "updated": 1, "deleted": 0, "stale": 1, "ignored_deletes": 0}
    with opened(t) as index:
        assert index.version == t.version
    assert view(t) == [(1, "a1", 3), (2, "b", 1), (3, "c", 2)]


@pytest.mark.spark
def test_a_rebuild_keeps_other_writers_out_of_the_index(tmp_path, spark):
    """A rebuild closes RocksDB and opens a fresh database; the index lock keeps another writer out in between
    (without it, that writer opened the folder the rebuild was deleting, and crashed on the reopened lock)."""
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch([1, 2], ["a", "b"], [1, 1]), inline=False, spark=spark)
    state = t.refresh()
    index = opened(t)
    rivals = []
    reopen = index._open

    def reopen_with_a_rival_waiting():
        try:
            keyindex.KeyIndex(t.io, t.metadata).close()
            rivals.append("opened the index")
        except bitlake.IndexUnavailableError:
            rivals.append("kept out")
        return reopen()

    index._open = reopen_with_a_rival_waiting
    index._rebuild(state)
    assert rivals == ["kept out"] and index.version == state.version
    index.close()
    index.close()  # closing twice does nothing
    with opened(t) as again:
        assert again.version == t.version


@pytest.mark.spark
def test_an_index_of_another_table_at_the_same_path_is_rebuilt(tmp_path, spark, monkeypatch):
    from bitlake.engine.write import metagen

    monkeypatch.setattr(metagen, "LOOKUP_COST_IN_ROWS", 0)
    path = str(tmp_path / "t")
    t = bitlake.create_table(path, SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch([1, 2], ["a", "b"], [5, 5]), spark=spark)
    index_copy = tmp_path / "index-copy"
    close_idle()  # this process keeps the index open after a commit
    shutil.copytree(t.io.local_path(layout.INDEX_DIR), index_copy)
    shutil.rmtree(path)
    t = bitlake.create_table(path, SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch([1], ["new"], [1]), inline=False, spark=spark)
    close_idle()  # the index is deleted and replaced while no writer has it open
    shutil.rmtree(t.io.local_path(layout.INDEX_DIR))
    shutil.copytree(index_copy, t.io.local_path(layout.INDEX_DIR))
    # The old table's entries (delta 5) would make these records stale; the new table has only key 1 at 1.
    r = t.ingest(batch([1, 2], ["n1", "n2"], [2, 2]), inline=True, spark=spark)
    assert r.counts == {"inserted": 1, "updated": 1, "deleted": 0, "stale": 0, "ignored_deletes": 0}
    assert view(t) == [(1, "n1", 2), (2, "n2", 2)]


@pytest.mark.spark
def test_auto_mode_runs_inline_up_to_the_row_limit(tmp_path, spark, monkeypatch):
    from bitlake.engine.write import metagen

    calls = []
    real = metagen.run_inline
    monkeypatch.setattr(metagen, "run_inline", lambda *a, **kw: calls.append(a[2]) or real(*a, **kw))
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2,
                             properties={"metagen.inline_max_rows": "3"})
    t.ingest(batch([1, 2, 3, 4], ["a", "b", "c", "d"], [1, 1, 1, 1]), batch_id="big", spark=spark)
    assert calls == []
    # Three records (two upserts and a delete): at the limit, so inline.
    t.ingest(batch([1, 2, 3], ["a2", "b2", None], [2, 2, 2], ["upsert", "upsert", "delete"]), op_column="op",
             batch_id="small", spark=spark)
    assert [[b.batch_id for b in batches] for batches in calls] == [["small"]]
    assert view(t) == [(1, "a2", 2), (2, "b2", 2), (4, "d", 1)]


@pytest.mark.spark
def test_an_index_ahead_of_the_writers_state_sends_it_back_to_refresh(tmp_path, spark):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch([1], ["a"], [1]), spark=spark)
    old = t.state()
    other = bitlake.open_table(t.path)
    other.ingest(batch([1], ["b"], [2]), spark=spark)  # commits and brings the index to its version
    with opened(t) as index, pytest.raises(keyindex.IndexAheadError):
        index.catch_up(old)
    # A writer whose state is behind refreshes and builds again; nothing is lost.
    r = t.ingest(batch([1], ["c"], [3]), inline=True, spark=spark)
    assert r.counts["updated"] == 1 and view(t) == [(1, "c", 3)]


@pytest.mark.parametrize("key", [pa.int64(), pa.string()])
def test_a_large_ingest_writes_sst_files_in_processes_and_lookups_on_threads_answer_every_key(tmp_path, monkeypatch, key):
    monkeypatch.setattr(keyindex, "_SST_MIN_ROWS", 1)
    monkeypatch.setattr(keyindex, "_PROCESS_SST_ROWS", 1)  # one process per core, whatever the size
    monkeypatch.setattr(keyindex, "threads", lambda: 3)
    monkeypatch.setattr(keyindex, "_LOOKUP_CHUNK", 1)  # the lookups below run as three runs on threads
    schema = pa.schema([("id", key), ("v", pa.string()), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id"], delta_column="mod")
    ids = [i * 7919 % 1000 - 500 for i in range(1000)]  # negative ones too: SST files take their entries sorted
    t.ingest(pa.table({"id": pa.array(ids).cast(key), "v": [str(i) for i in ids], "mod": [1] * 1000}))
    with opened(t) as index:
        assert index.version == t.version
        files = [f["start_key"][:1] for f in index.db.live_files() if f["start_key"] >= b"\x01"]
        # Fixed-width keys go into the empty index as blocks, a file a thread; others as a file a process.
        assert files == [b"\x02"] * 3 if key == pa.int64() else files == [b"\x01"] * 3
        wanted = pa.table({"id": pa.array([5, 499, 500, -500, -501]).cast(key)})
        found, deltas, _, deleted = index.lookup(wanted)
    assert found.tolist() == [True, True, False, True, False]
    assert deltas[found].tolist() == [1, 1, 1] and not deleted.any()
    assert not [p for p in (tmp_path / "t" / "_bitlake" / "index").iterdir() if p.name.startswith(("ingest-", "stage-"))]


@pytest.mark.parametrize("key", [pa.int64(), pa.string()])
def test_a_commit_folded_in_groups_gives_the_index_one_sorted_run_per_key_range(tmp_path, monkeypatch, key):
    """A commit larger than GROUP_RECORDS is folded in groups, runs of buckets, each staging its own SST file while
    the next one folds: the index's keys start with the bucket, so the files do not overlap, whatever the key's
    type. Every key is answered, and a later commit in groups (input in no order) folds against them."""
    monkeypatch.setattr(metagen, "GROUP_RECORDS", 250)
    monkeypatch.setattr(keyindex, "_SST_MIN_ROWS", 1)
    monkeypatch.setattr(keyindex, "_PROCESS_SST_ROWS", 1)  # each group stages its entries, written by a process
    monkeypatch.setattr(keyindex, "threads", lambda: 1)  # one file a group
    schema = pa.schema([("id", key), ("v", pa.string()), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id"], delta_column="mod", num_buckets=8)
    t.ingest(pa.table({"id": pa.array(range(1000)).cast(key), "v": ["a"] * 1000, "mod": [1] * 1000}))
    with opened(t) as index:
        runs = sorted((f["start_key"], f["end_key"]) for f in index.db.live_files() if f["start_key"] >= b"\x01")
    assert len(runs) == 4
    assert all(end < start for (_, end), (start, _) in zip(runs, runs[1:], strict=False))
    shuffled = [i * 7919 % 1200 for i in range(1200)]  # 200 new keys and 1000 updates, in no order
    r = t.ingest(pa.table({"id": pa.array(shuffled).cast(key), "v": ["b"] * 1200, "mod": [2] * 1200}))
    assert r.counts["inserted"] == 200 and r.counts["updated"] == 1000
    with opened(t) as index:
        assert index.version == t.version
        wanted = pa.table({"id": pa.array([0, 999, 1199, 1200]).cast(key)})
        found, deltas, _, _ = index.lookup(wanted)
    assert found.tolist() == [True, True, True, False] and deltas[:3].tolist() == [2, 2, 2]
    assert sorted(t.to_arrow().select(["id", "v"]).to_pylist(), key=lambda row: str(row["id"])) == sorted(
        ({"id": i, "v": "b"} for i in pa.array(range(1200)).cast(key).to_pylist()), key=lambda row: str(row["id"]))


def test_a_spilled_commit_and_a_rebuild_reach_the_index_in_runs_that_answer_every_key(tmp_path, monkeypatch):
    # A commit folded from a spill stages nothing: the index catches up from its key-store files, read and taken
    # in a run of at most RUN_ROWS entries at a time, as a rebuild does; every key is answered either way.
    monkeypatch.setattr(metagen, "SPILL_RECORDS", 0)
    monkeypatch.setattr(metagen, "SPILL_GROUP_RECORDS", 300)
    monkeypatch.setattr(keyindex, "_SST_MIN_ROWS", 1)
    monkeypatch.setattr(keyindex, "RUN_ROWS", 250)
    runs = []
    real = keyindex.KeyIndex._ingest_sorted
    monkeypatch.setattr(keyindex.KeyIndex, "_ingest_sorted",
                        lambda self, t, *a: runs.append(t.num_rows) or real(self, t, *a))
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id"], delta_column="mod", num_buckets=8)
    t.ingest(pa.table({"id": list(range(1000)), "v": ["a"] * 1000, "mod": [1] * 1000}))
    with opened(t) as index:
        assert index.version == t.version
    assert sum(runs) == 1000 and len(runs) > 1 and max(runs) <= 250 + 1000 // 8 * 2  # a bucket file is not split
    runs.clear()
    shutil.rmtree(tmp_path / "t" / "_bitlake" / "index")
    with opened(t) as index:  # rebuilt from the key store, a bucket at a time
        index.catch_up(t.state())
        found, deltas, _, _ = index.lookup(pa.table({"id": [0, 500, 999, 1000]}))
    assert sum(runs) == 1000 and len(runs) > 1
    assert found.tolist() == [True, True, True, False] and deltas[:3].tolist() == [1, 1, 1]
    r = t.ingest(pa.table({"id": [5, 2000], "v": ["b", "b"], "mod": [2, 2]}))
    assert r.counts["updated"] == 1 and r.counts["inserted"] == 1


def test_a_spilled_commit_of_many_records_stages_each_groups_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(metagen, "SPILL_RECORDS", 0)
    monkeypatch.setattr(metagen, "SPILL_GROUP_RECORDS", 300)
    monkeypatch.setattr(spill, "MAX_GROUPS", 4)
    monkeypatch.setattr(metagen, "stages", lambda records: True)  # as a commit of millions of records
    monkeypatch.setattr(keyindex, "_SST_MIN_ROWS", 1)
    monkeypatch.setattr(keyindex, "threads", lambda: 1)  # one file a group
    staged = []
    real = keyindex.KeyIndex.stage
    monkeypatch.setattr(keyindex.KeyIndex, "stage", lambda self, rows, v: staged.append(rows.num_rows) or real(self, rows, v))
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id"], delta_column="mod", num_buckets=8)
    t.ingest(pa.table({"id": list(range(1000)), "v": ["a"] * 1000, "mod": [1] * 1000}))
    assert len(staged) == 4 and sum(staged) == 1000  # four groups of two buckets
    with opened(t) as index:
        assert index.version == t.version
        found, deltas, _, _ = index.lookup(pa.table({"id": [0, 500, 999, 1000]}))
        runs = [f for f in index.db.live_files() if f["start_key"] >= b"\x01"]
    assert found.tolist() == [True, True, True, False] and deltas[:3].tolist() == [1, 1, 1] and len(runs) == 4
    assert not [p for p in (tmp_path / "t" / "_bitlake" / "index").iterdir() if p.name.startswith("stage-")]


def test_entries_staged_for_a_commit_reach_the_index_only_after_that_commit(tmp_path, monkeypatch):
    """The SST files a large commit stages before it commits are taken in by commit_staged of that version,
    with the index at the version before; a catch-up (another writer took the version), a commit_staged of
    another version, or closing the index throws them away."""
    monkeypatch.setattr(keyindex, "_SST_MIN_ROWS", 1)
    monkeypatch.setattr(keyindex, "_PROCESS_SST_ROWS", 1)
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod")
    t.ingest(batch([1, 2], ["a", "b"], [1, 1]))
    folder = tmp_path / "t" / "_bitlake" / "index"

    def rows(ids, mod):
        return pa.table({"id": pa.array(ids, pa.int64()), "_delta": pa.array([mod] * len(ids), pa.int64()),
                         "_row_id": pa.array(ids, pa.int64()), "_deleted": pa.array([False] * len(ids))})

    def staged():
        return sorted(p.name for p in folder.iterdir() if p.name.startswith("stage-"))

    def lookup(index, *ids):
        return index.lookup(pa.table({"id": pa.array(ids, pa.int64())}))

    with opened(t) as index:
        # Another writer's commit takes the staged version: the catch-up reads its rows, not the staged ones.
        index.stage(rows([11, 12, 13], 9), t.version + 1)
        assert staged()
        t.ingest(batch([20, 21, 22], ["x", "y", "z"], [8, 8, 8]))  # the index is busy: a key-store scan
        index.catch_up(t.state())
        assert not staged()
        found, deltas, _, _ = lookup(index, 11, 20)
        assert found.tolist() == [False, True] and deltas[1] == 8
        # Staged for another version than the one committed: thrown away.
        index.stage(rows([7, 8, 9], 5), t.version + 2)
        assert not index.commit_staged(t.version + 1) and not staged()
        # Two groups staged for the next version, taken in after its commit.
        index.stage(rows([3, 4], 6), t.version + 1)
        index.stage(rows([5], 6), t.version + 1)
        assert index.commit_staged(t.version + 1) and not staged()
        assert index.version == t.version + 1
        found, deltas, _, _ = lookup(index, 7, 3, 5)
        assert found.tolist() == [False, True, True] and deltas[1:].tolist() == [6, 6]
        index.stage(rows([10], 7), t.version + 2)
    assert not staged()  # closed with a staged commit
    with opened(t) as index:
        found, _, _, _ = lookup(index, 10)
        assert found.tolist() == [False]


def test_a_writer_keeps_the_index_open_between_its_commits_and_closes_it_when_idle(tmp_path, monkeypatch):
    """The next commit of the process takes the open index as it is (no reopen, no new OPTIONS or LOG file);
    another process meanwhile scans the key store, and the index catches up with its commit afterwards."""
    import subprocess
    import sys
    import time

    from bitlake.engine.keys import indexsession
    from bitlake.engine.write import metagen

    monkeypatch.setattr(metagen, "LOOKUP_COST_IN_ROWS", 0)  # lookups whenever the index is free
    opens = []
    real_open = keyindex.KeyIndex._open
    monkeypatch.setattr(keyindex.KeyIndex, "_open", lambda self: opens.append(1) or real_open(self))
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch([1, 2], ["a", "b"], [1, 1]))
    folder = tmp_path / "t" / "_bitlake" / "index"
    n = len(opens)  # the first commit opens it, and opens it afresh to build it
    files = sorted(p.name for p in folder.iterdir() if p.name.startswith(("OPTIONS", "LOG")))
    r = t.ingest(batch([1, 3], ["a2", "c"], [2, 2]))
    assert r.counts["updated"] == 1 and r.counts["inserted"] == 1
    assert len(opens) == n and sorted(p.name for p in folder.iterdir() if p.name.startswith(("OPTIONS", "LOG"))) == files

    # Another process commits while this one keeps the index: it scans the key store.
    code = ("import sys, bitlake; from tests.test_table import batch; t = bitlake.open_table(sys.argv[1]); "
            "r = t.ingest(batch([2, 3], ['b9', 'c0'], [9, 1])); assert r.counts['updated'] == 1, r.counts; "
            "assert r.counts['stale'] == 1, r.counts")
    subprocess.run([sys.executable, "-c", code, t.path], check=True, cwd=str(Path(__file__).resolve().parents[1]))
    r = t.ingest(batch([2, 3], ["b8", "c1"], [8, 3]))  # caught up with the other process's commit first
    assert r.counts == {"inserted": 0, "updated": 1, "deleted": 0, "stale": 1, "ignored_deletes": 0}
    assert len(opens) == n and view(t) == [(1, "a2", 2), (2, "b9", 9), (3, "c1", 3)]

    # With an idle time of 0 the index closes after every commit (once the commit's entries are in, on a thread of
    # this process, which flush_idle waits for); a short one closes it when it is up.
    t.set_properties({"keystore.index_idle_seconds": "0"})
    t.ingest(batch([4], ["d"], [1]))
    indexsession.flush_idle()
    kept = keyindex.location(t.io, t.metadata)[0]
    assert kept not in indexsession._kept
    t.set_properties({"keystore.index_idle_seconds": "0.05"})
    t.ingest(batch([5], ["e"], [1]))
    assert len(opens) == n + 1  # opened again
    deadline = time.monotonic() + 10
    while kept in indexsession._kept and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kept not in indexsession._kept
    with opened(t) as index:
        assert index.version == t.version


def test_flush_idle_writes_the_entries_an_idle_index_holds_in_memory(tmp_path):
    """After its commits an idle index holds their entries in RocksDB's memtable; flush_idle() returns with nothing
    left there, the index at the table's version and answering every key."""
    from bitlake.engine.keys import indexsession

    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch([1, 2], ["a", "b"], [1, 1]))
    t.ingest(batch([1, 3], ["a2", "c"], [2, 2]))
    index = indexsession._kept[keyindex.location(t.io, t.metadata)[0]].index
    indexsession.join_updates()
    assert index.db.property_int_value("rocksdb.num-entries-active-mem-table") > 0  # not flushed after each commit
    indexsession.flush_idle()
    unflushed = ["rocksdb.num-entries-active-mem-table", "rocksdb.num-entries-imm-mem-tables"]
    assert [index.db.property_int_value(p) for p in unflushed] == [0, 0]
    assert index.version == t.version
    found, delta, _, _ = index.lookup(pa.table({"id": pa.array([1, 3], pa.int64())}))
    assert found.tolist() == [True, True] and delta.tolist() == [2, 2]


def test_flush_idle_closes_an_idle_index_whose_table_was_deleted(tmp_path):
    """A table deleted while this process keeps its index idle: flush_idle() does not fail on it (nothing of a
    table is lost with its cache) but closes and forgets it, and still flushes the other tables' indexes."""
    import shutil

    from bitlake.engine.keys import indexsession

    gone = bitlake.create_table(str(tmp_path / "gone"), SCHEMA, primary_key=["id"], delta_column="mod")
    kept = bitlake.create_table(str(tmp_path / "kept"), SCHEMA, primary_key=["id"], delta_column="mod")
    gone.ingest(batch([1], ["a"], [1]))
    kept.ingest(batch([1], ["a"], [1]))
    kept.ingest(batch([2], ["b"], [1]))
    gone_path, kept_path = (keyindex.location(t.io, t.metadata)[0] for t in (gone, kept))
    index = indexsession._kept[kept_path].index
    indexsession.join_updates()
    shutil.rmtree(tmp_path / "gone")
    indexsession.flush_idle()
    assert gone_path not in indexsession._kept and kept_path in indexsession._kept
    assert index.db.property_int_value("rocksdb.num-entries-active-mem-table") == 0


def test_a_writer_killed_with_entries_in_memory_leaves_an_index_the_next_writer_catches_up(tmp_path):
    """A process that commits and is killed while its idle index holds the commits' entries in memory (no
    write-ahead log) leaves the index at an older version; the next writer replays the commits it lacks, and every
    lookup agrees with the table."""
    path = str(tmp_path / "t")
    t = bitlake.create_table(path, SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch(list(range(50)), ["a"] * 50, [1] * 50))
    close_idle()  # the load's entries on disk
    child = (
        "import os, bitlake\n"
        "from bitlake.engine.keys.indexsession import join_updates\n"
        "from tests.test_table import batch\n"
        f"t = bitlake.open_table({path!r})\n"
        "t.ingest(batch(list(range(0, 50, 2)), ['b'] * 25, [2] * 25))\n"
        "t.ingest(batch([100, 101], ['c', 'c'], [3, 3]))\n"
        "join_updates()\n"
        "os._exit(0)  # killed: no close, no flush\n"
    )
    subprocess.run([sys.executable, "-c", child], check=True, cwd=Path(__file__).parent.parent)
    t = bitlake.open_table(path)
    assert t.version == 3
    with opened(t) as index:
        assert index.version < t.version  # the killed writer's entries were lost with their versions
    t.ingest(batch([1], ["d"], [4]))  # catches the index up, then commits
    with opened(t) as index:
        assert index.version == t.version
        found, delta, _, _ = index.lookup(pa.table({"id": pa.array([0, 1, 2, 3, 100, 101, 102], pa.int64())}))
    assert found.tolist() == [True] * 6 + [False]
    assert delta[:6].tolist() == [2, 4, 2, 1, 3, 3]


def test_a_process_that_exits_right_after_a_commit_lets_the_index_rebuild_finish(tmp_path):
    """A commit that finds no index rebuilds it on a thread after the commit; a process that exits at once waits
    for it (the rebuild writes its blocks on a pool of threads, which would refuse work once concurrent.futures'
    exit hook ran): nothing is logged, and the next process finds the index at the table's version."""
    path = str(tmp_path / "t")
    t = bitlake.create_table(path, SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    n = 300_000  # enough entries for the rebuild to write its blocks on threads
    t.ingest(pa.table({"id": pa.array(range(n), pa.int64()), "name": pa.array(["a"] * n),
                       "mod": pa.array([1] * n, pa.int64())}), batch_id="load")
    t.ingest(batch([1, 2], ["b", "b"], [2, 2]), batch_id="small")
    close_idle()
    shutil.rmtree(tmp_path / "t" / "_bitlake" / "index")
    child = f"import bitlake; bitlake.open_table({path!r}).revert_batch('small')\n"  # uses no index: rebuilt after
    run = subprocess.run([sys.executable, "-c", child], cwd=Path(__file__).parent.parent, capture_output=True,
                         text=True)
    assert run.returncode == 0 and "failed" not in run.stderr, run.stderr
    t = bitlake.open_table(path)
    with opened(t) as index:
        assert index.version == t.version == 3
        found, delta, _, _ = index.lookup(pa.table({"id": pa.array([1, 2, n - 1, n], pa.int64())}))
    assert found.tolist() == [True, True, True, False] and delta[:3].tolist() == [1, 1, 1]


@pytest.mark.spark
def test_a_table_restored_at_its_path_keeps_its_own_index(tmp_path, spark, monkeypatch):
    """The process keeps the index of its last commit open while the table's folder is replaced by a backup of an
    earlier version: closing the stale database must not write into the restored index, which then serves the next
    commit as it is (no rebuild) and answers for the restored version."""
    monkeypatch.setattr(metagen, "LOOKUP_COST_IN_ROWS", 0)  # lookups whenever the index is free
    path, backup = tmp_path / "t", tmp_path / "backup"
    t = bitlake.create_table(str(path), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch(list(range(100)), [f"n{i}" for i in range(100)], [1] * 100), spark=spark)
    close_idle()
    shutil.copytree(path, backup)
    t.ingest(batch(list(range(50, 150)), [f"x{i}" for i in range(50, 150)], [5] * 100), spark=spark)  # stays open
    shutil.rmtree(path)
    shutil.copytree(backup, path)

    def rebuilt(*args):
        raise AssertionError("the restored index was rebuilt")

    monkeypatch.setattr(keyindex.KeyIndex, "_rebuild", rebuilt)
    restored = bitlake.open_table(str(path))
    r = restored.ingest(batch([1, 120], ["a", "b"], [2, 2]), spark=spark)
    assert r.counts == {"inserted": 1, "updated": 1, "deleted": 0, "stale": 0, "ignored_deletes": 0}
    assert ("a", 2) in {(n, m) for _, n, m in view(restored)} and len(view(restored)) == 101


@pytest.mark.parametrize("deltas", [[0, 0, 0, 0], [7, -3, 2**62, 1], [0, 5, 0, -(2**62)]])
def test_entries_answer_their_delta_row_id_and_delete_flag(tmp_path, deltas):
    """Entry values are 9 bytes when the delta is 0 and 17 otherwise; a lookup reads both lengths, in any mix."""
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod")
    rows = pa.table({"id": pa.array([4, 1, 3, 2], pa.int64()), "_delta": pa.array(deltas, pa.int64()),
                     "_row_id": pa.array([0, 2**40 + 5, 2**62, 1], pa.int64()),
                     "_deleted": pa.array([False, True, False, True])})
    with opened(t) as index:
        index.put([rows], 0)
        found, delta, rid, deleted = index.lookup(pa.table({"id": [2, 9, 4, 1, 3]}))
    assert found.tolist() == [True, False, True, True, True]
    assert delta[found].tolist() == [deltas[3], deltas[0], deltas[1], deltas[2]]
    assert rid[found].tolist() == [1, 0, 2**40 + 5, 2**62]
    assert deleted.tolist() == [True, False, False, True, False]


def test_an_index_of_an_older_encoding_is_rebuilt(tmp_path, spark, monkeypatch):
    """An index without this bitlake's format entry (written by an earlier release, whose values were 18 bytes)
    is rebuilt from the key store before it answers a lookup."""
    monkeypatch.setattr(metagen, "LOOKUP_COST_IN_ROWS", 0)
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch([1, 2], ["a", "b"], [5, 5]), spark=spark)
    with opened(t) as index:
        index.db.delete(keyindex._FORMAT_KEY)
        index.db[encode_keys(pa.table({"id": [1]}), ["id"])[0]] = bytes(18)  # an old value: delta 0, row id 0
    rebuilds = []
    real = keyindex.KeyIndex._rebuild
    monkeypatch.setattr(keyindex.KeyIndex, "_rebuild", lambda self, state: rebuilds.append(1) or real(self, state))
    r = t.ingest(batch([1, 2], ["a2", "b2"], [4, 6]), inline=True, spark=spark)
    assert rebuilds == [1]
    assert r.counts == {"inserted": 0, "updated": 1, "deleted": 0, "stale": 1, "ignored_deletes": 0}
    assert view(t) == [(1, "a", 5), (2, "b2", 6)]


def test_an_index_reopened_by_a_later_writer_flushes_files_with_bloom_filters(tmp_path):
    """rocksdict opens an existing database with the options its OPTIONS file kept, which lack the bloom filter;
    the index passes its own, so that a lookup skips the files of other commits that lack its key."""
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    for i in range(3):  # each commit reopens the index and flushes one file when it is closed
        t.ingest(batch([10 * i + k for k in range(10)], ["x"] * 10, [1] * 10))
        close_idle()
    with opened(t) as index:
        index.db.flush()
        props = dict(part.strip().rsplit("=", 1) for part in
                     index.db.property_value("rocksdb.aggregated-table-properties").split(";") if "=" in part)
        files = len(index.db.live_files())
    assert files >= 3
    assert int(props["# entries for filter"]) == int(props["# entries"]) > 30


def test_the_index_takes_a_commits_entries_after_the_call_returns_and_the_next_commit_waits(tmp_path, monkeypatch):
    """The ingest returns while a thread puts its commit's entries into the key index; the process's next commit
    waits for that thread and looks its keys up in an index at the version before it (a failed update leaves the
    index behind: the next commit catches it up)."""
    import threading

    from bitlake.engine.keys import indexsession

    monkeypatch.setattr(metagen, "LOOKUP_COST_IN_ROWS", 0)  # lookups whenever the index is free
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch([1, 2], ["a", "b"], [1, 1]))
    indexsession.flush_idle()
    release, putting = threading.Event(), threading.Event()
    real_put = keyindex.KeyIndex.put

    def held_put(self, tables, version):
        putting.set()
        assert release.wait(10)
        return real_put(self, tables, version)

    monkeypatch.setattr(keyindex.KeyIndex, "put", held_put)
    r = t.ingest(batch([2, 3], ["b2", "c"], [2, 2]))  # returns with its entries not yet in the index
    assert r.counts["updated"] == 1 and putting.wait(10)
    waited = []
    second = threading.Thread(target=lambda: waited.append(t.ingest(batch([3, 4], ["c3", "d"], [3, 3]))))
    second.start()
    second.join(0.5)
    assert second.is_alive(), "the next commit waits for the update of the commit before"
    release.set()
    second.join(10)
    assert waited[0].counts == {"inserted": 1, "updated": 1, "deleted": 0, "stale": 0, "ignored_deletes": 0}

    def failing_put(self, tables, version):
        raise OSError("disk full")

    monkeypatch.setattr(keyindex.KeyIndex, "put", failing_put)
    r = t.ingest(batch([5], ["e"], [1]))
    assert r.committed
    indexsession.flush_idle()
    with opened(t) as index:
        assert index.version == t.version - 1  # behind by the commit whose update failed
    monkeypatch.setattr(keyindex.KeyIndex, "put", real_put)
    assert t.ingest(batch([5, 1], ["e2", "a2"], [2, 2])).counts["updated"] == 2
    with opened(t) as index:
        assert index.version == t.version
    assert view(t) == [(1, "a2", 2), (2, "b2", 2), (3, "c3", 3), (4, "d", 3), (5, "e2", 2)]


def test_an_index_behind_a_new_retention_window_catches_up_from_the_commits_cleanup_kept(tmp_path, monkeypatch):
    """A major compaction whose window starts past the index's version leaves the commits after that version in
    the log: the index catches up from them (a rebuild read the whole key store: seconds at TPC-H SF 3); once
    cleanup has dropped them, it is rebuilt."""
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch(list(range(100)), [f"n{i}" for i in range(100)], [1] * 100))
    t.ingest(batch(list(range(50, 60)), [f"u{i}" for i in range(50, 60)], [2] * 10))
    t.ingest(batch([200], ["x"], [3]))
    t.compact(major=True, look_back=t.version)  # the window starts at the compaction's commit
    state = t.state()
    assert state.window is not None and state.window.version == 4
    with opened(t) as index:
        index.put([], 2)  # an index left at version 2 (its writer's update failed, say)
    rebuilds = []
    real = keyindex.KeyIndex._rebuild
    monkeypatch.setattr(keyindex.KeyIndex, "_rebuild", lambda self, state: rebuilds.append(1) or real(self, state))
    with opened(t) as index:
        index.catch_up(state)
        assert rebuilds == [] and index.version == state.version
        assert index.lookup(pa.table({"id": [200, 55]}))[0].tolist() == [True, True]
        index.put([], 2)
    # A cleanup that removed a key-store file a kept commit names (files older than their commit go first, by
    # age): the catch-up rebuilds rather than fail.
    real_read = keystore.read_file

    def removed(*args, filters=None, **kwargs):  # a catch-up reads a commit's rows with a version filter
        if filters:
            raise FileNotFoundError("removed by cleanup")
        return real_read(*args, **kwargs)

    monkeypatch.setattr(keystore, "read_file", removed)
    with opened(t) as index:
        index.catch_up(state)
        assert rebuilds == [1] and index.version == state.version
        assert index.lookup(pa.table({"id": [200, 55]}))[0].tolist() == [True, True]
        index.put([], 2)
    monkeypatch.setattr(keystore, "read_file", real_read)
    t.cleanup(min_age_seconds=0)  # drops the commits before the window
    with opened(t) as index:
        index.catch_up(t.state())
        assert rebuilds == [1, 1] and index.version == state.version
        assert index.lookup(pa.table({"id": [200, 55]}))[0].tolist() == [True, True]


def test_an_idle_index_stays_open_while_rocksdb_compacts_it(tmp_path, monkeypatch):
    """Closing an index stops its compaction midway, and the next opening starts it again: the idle timer waits
    while RocksDB compacts (here: says it does, three times), then closes it; join_compactions returns once a real
    compaction of many first-level files has ended."""
    import time

    from bitlake.engine.keys import indexsession

    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2,
                             properties={"keystore.index_idle_seconds": "0.05"})
    t.ingest(batch([1, 2], ["a", "b"], [1, 1]))
    kept = keyindex.location(t.io, t.metadata)[0]
    db = indexsession._kept[kept].index.db
    indexsession.join_updates()
    for i in range(12):  # more first-level files than RocksDB's trigger (8): a compaction merges them
        db.put(b"\x00test:%d" % i, b"x")
        db.flush()
    indexsession.join_compactions(kept)
    assert not indexsession._compacting(db)
    assert db.property_int_value("rocksdb.num-files-at-level0") < 12

    asked = []
    real = indexsession._compacting

    def compacting(db) -> bool:  # says so the first three times the timer asks, then asks RocksDB
        if len(asked) < 3:
            asked.append(db)
            return True
        return real(db)

    monkeypatch.setattr(indexsession, "_compacting", compacting)
    t.ingest(batch([3], ["c"], [1]))
    deadline = time.monotonic() + 10
    while kept in indexsession._kept and time.monotonic() < deadline:
        time.sleep(0.02)
    assert kept not in indexsession._kept and len(asked) == 3  # asked three times, closed after the third
    assert view(t) == [(1, "a", 1), (2, "b", 1), (3, "c", 1)]
