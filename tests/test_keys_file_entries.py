"""A batch of deletes whose keys file holds exactly its commit's key-store rows: the file is listed in the key store
(a shared file at the commit's version) instead of a copy of its rows (docs/FORMAT.md, "Key store", "Keys files as
entries")."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest

import bitlake
from bitlake.engine.keys import indexsession, keycache
from bitlake.format import commitlog, keystore
from bitlake.format.protocol import KEYS_FILE_ENTRIES

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("mod", pa.int64())])


def _rows(ids, mod, op: str | None = None) -> pa.Table:
    ids = list(ids)
    t = pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids],
                  "mod": pa.array([mod] * len(ids), pa.int64())}, schema=SCHEMA)
    return t.append_column("op", pa.array([op or "upsert"] * len(ids)))


def _entries(t) -> dict[int, tuple[int, bool, int]]:
    state = t.state()
    tables = keystore.read_entries(t.io, state.keystore, state.metadata)
    return {r["id"]: (r[keystore.DELTA], r[keystore.DELETED], r[keystore.VERSION])
            for table in tables for r in table.to_pylist()}


def _table(tmp_path, **properties):
    return bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=4,
                                properties={"keystore.index_idle_seconds": "0", **properties})


def _keystore_files(t) -> set[str]:
    return {p for p in t.io.walk("_bitlake/keystore") if "/prior/" not in p}


def test_a_batch_of_deletes_lists_its_keys_file_in_the_key_store(tmp_path):
    t = _table(tmp_path)
    t.ingest(_rows(range(100), 1), op_column="op")
    before = _keystore_files(t)
    r = t.ingest(_rows([50, 3, 10, 200], 2, "delete"), op_column="op")  # 200: no row, an ignored delete
    assert (r.counts["deleted"], r.counts["ignored_deletes"]) == (3, 1)
    c = commitlog.read(t.io, r.version)
    (keys_file,) = c.batches[0].keys_files
    assert [f.to_json() for f in c.keystore_add] == [{"bucket": keystore.SHARED, "path": keys_file.path, "rows": 4,
                                                      "bytes": keys_file.bytes, "base": False, "version": r.version}]
    assert _keystore_files(t) == before  # no key-store file written
    # A writer feature: scans never read the key store.
    assert KEYS_FILE_ENTRIES in c.protocol.writer_features and KEYS_FILE_ENTRIES not in c.protocol.reader_features
    entries = _entries(t)
    assert {k: entries[k] for k in (3, 10, 50, 200, 4)} == {
        3: (2, True, r.version), 10: (2, True, r.version), 50: (2, True, r.version), 200: (2, True, r.version),
        4: (1, False, 1)}
    # The markers decide later records, from memory, from the files and from a key index rebuilt from them.
    assert t.ingest(_rows([3], 1), op_column="op").counts["stale"] == 1
    saved = keycache.CACHE
    try:
        keycache.CACHE = keycache.KeyStoreCache(0)
        r = t.ingest(_rows([10, 11], 1), op_column="op")  # 10 older than its marker; 11 at its delta
        assert (r.counts["stale"], r.counts["updated"]) == (1, 1)
        indexsession.close_idle()
        shutil.rmtree(tmp_path / "t" / "_bitlake" / "index")
        assert t.ingest(_rows([50, 12], 3), op_column="op").counts["inserted"] == 1  # 50: deleted at 2, back at 3
    finally:
        keycache.CACHE = saved
    view = {r["id"]: r["mod"] for r in t.to_arrow().to_pylist()}
    assert len(view) == 98 and 3 not in view and 10 not in view and view[50] == 3 and view[12] == 3


def test_a_key_index_behind_catches_up_from_a_listed_keys_file(tmp_path):
    t = _table(tmp_path)
    t.ingest(_rows(range(20), 1), op_column="op")
    t.ingest(_rows([7], 1), op_column="op")  # the index at this version, copied aside
    indexsession.close_idle()
    index = tmp_path / "t" / "_bitlake" / "index"
    shutil.copytree(index, tmp_path / "index-before")
    r = t.ingest(_rows([2, 5], 2, "delete"), op_column="op")
    assert commitlog.read(t.io, r.version).keystore_add[0].version == r.version
    indexsession.close_idle()
    shutil.rmtree(index)
    shutil.copytree(tmp_path / "index-before", index)  # one version behind: it catches up from the commit
    saved = keycache.CACHE
    try:
        keycache.CACHE = keycache.KeyStoreCache(0)  # no files in memory: the writer looks keys up in the index
        r = t.ingest(_rows([2, 5, 6], 1), op_column="op")
    finally:
        keycache.CACHE = saved
    assert (r.counts["stale"], r.counts["updated"]) == (2, 1)


def test_a_pending_batch_of_deletes_made_live_alone_lists_its_keys_file_read_back(tmp_path):
    t = _table(tmp_path)
    t.ingest(_rows(range(30), 1), op_column="op")
    landed = t.ingest(_rows([4, 8, 9], 2, "delete"), op_column="op", metagen=False)
    r = t.metagen()  # a new call: the records come from the keys file, not from the landing's memory
    (keys_file,) = commitlog.read(t.io, landed.version).batches[0].keys_files
    assert [(f.path, f.version) for f in commitlog.read(t.io, r.version).keystore_add] == [(keys_file.path, r.version)]
    assert {k: v for k, v in _entries(t).items() if k in (4, 8, 9)} == {k: (2, True, r.version) for k in (4, 8, 9)}
    assert sorted(row["id"] for row in t.to_arrow().to_pylist()) == [i for i in range(30) if i not in (4, 8, 9)]


@pytest.mark.parametrize(("records", "why"), [
    (lambda: _rows([3, 3], 2, "delete"), "a key twice"),
    (lambda: pa.concat_tables([_rows([3], 0, "delete"), _rows([10], 2, "delete")]), "a stale delete"),
    (lambda: pa.concat_tables([_rows([3], 2, "delete"), _rows([4], 2)]), "upserts too"),
    (lambda: _rows(range(70_000, 140_000), 2, "delete"), "more rows than keystore.LISTED_ROWS (made 65,536 here)"),
])
def test_other_batches_write_key_store_files_of_their_own(tmp_path, monkeypatch, records, why):
    monkeypatch.setattr(keystore, "LISTED_ROWS", 65_536)
    t = _table(tmp_path)
    t.ingest(_rows(range(100), 1), op_column="op")
    r = t.ingest(records(), op_column="op")
    added = commitlog.read(t.io, r.version).keystore_add
    assert added and all(f.version is None and f.path.startswith("_bitlake/keystore/") for f in added), why


def test_a_batch_of_deletes_larger_than_a_shared_file_lists_its_keys_file_too(tmp_path):
    """Past the rows a commit writes as one shared file (65,536), a batch of deletes alone still lists its keys file,
    where it would write a key-store file per bucket; a later small commit folds its rows into the buckets."""
    t = _table(tmp_path, **{"keystore.max_increments": "2"})
    t.ingest(_rows(range(100_000), 1), op_column="op")
    before = _keystore_files(t)
    r = t.ingest(_rows(range(0, 100_000, 2), 2, "delete"), op_column="op")
    assert r.counts["deleted"] == 50_000
    r = t.ingest(_rows(range(1, 140_000, 2), 2, "delete"), op_column="op")
    assert (r.counts["deleted"], r.counts["ignored_deletes"]) == (50_000, 20_000)
    (keys_file,) = commitlog.read(t.io, r.version).batches[0].keys_files
    assert [(f.path, f.rows, f.version) for f in commitlog.read(t.io, r.version).keystore_add] == [
        (keys_file.path, 70_000, r.version)]
    assert _keystore_files(t) == before
    r = t.ingest(_rows([4, 5, 200_000], 3), op_column="op")  # two shared files listed: folded into the buckets
    assert (r.counts["inserted"], r.counts["updated"]) == (3, 0)
    assert t.state().keystore.get(keystore.SHARED, []) == []
    entries = _entries(t)
    assert {k: entries[k][:2] for k in (4, 5, 7, 120_001, 200_000)} == {
        4: (3, False), 5: (3, False), 7: (2, True), 120_001: (2, True), 200_000: (3, False)}
    assert sorted(row["id"] for row in t.to_arrow().to_pylist()) == [4, 5, 200_000]


def test_listed_keys_files_merge_into_the_buckets_and_stay_while_their_batch_names_them(tmp_path):
    t = _table(tmp_path, **{"keystore.max_increments": "2"})
    t.ingest(_rows(range(70_000), 1), op_column="op")  # past a shared file's rows: the buckets' files
    first = t.ingest(_rows([1, 2], 2, "delete"), op_column="op")
    t.ingest(_rows([3, 4], 2, "delete"), op_column="op")
    listed = [f.path for f in t.state().keystore[keystore.SHARED]]
    assert len(listed) == 2 and all(p.startswith("_bitlake/keys/") for p in listed)
    r = t.ingest(_rows([5, 1], 3), op_column="op")  # past max_increments: the shared rows go into the buckets
    assert (r.counts["updated"], r.counts["inserted"]) == (1, 1)
    state = t.state()
    assert state.keystore.get(keystore.SHARED, []) == []
    entries = _entries(t)
    assert {k: entries[k] for k in (1, 2, 3, 4, 5)} == {
        1: (3, False, r.version), 2: (2, True, first.version), 3: (2, True, first.version + 1),
        4: (2, True, first.version + 1), 5: (3, False, r.version)}
    # The key store no longer lists them, their batches do: cleanup keeps them, and the change feed reads them.
    t.cleanup(min_age_seconds=0)
    assert all(t.io.exists(p) for p in listed)
    assert {row["id"] for row in t.changes_to_arrow(starting_version=first.version, ending_version=first.version)
            .to_pylist()} == {1, 2}
    reverted = t.revert_batch(first.batch_id)
    assert reverted.committed
    view = {row["id"]: row["mod"] for row in t.to_arrow().to_pylist()}
    assert view[2] == 1 and view[1] == 3 and 3 not in view and 4 not in view
    # Once no version inside the retention window reads their batches' records and the key store lists them no
    # more, they go.
    t.compact(major=True, look_back=t.version)
    assert set(listed) <= set(t.cleanup(min_age_seconds=0))


def test_the_spark_metagen_takes_the_markers_of_a_listed_keys_file(tmp_path, spark):
    t = _table(tmp_path)
    t.ingest(_rows(range(40), 1), op_column="op")
    t.ingest(_rows([6, 7], 3, "delete"), op_column="op")
    assert [f.version is not None for f in t.state().keystore[keystore.SHARED]] == [False, True]
    r = t.ingest(_rows([6, 7, 8], 2), op_column="op", inline=False, spark=spark)  # 6, 7: older than their markers
    assert (r.counts["stale"], r.counts["updated"]) == (2, 1)
    assert sorted(row["id"] for row in t.to_arrow().to_pylist()) == [i for i in range(40) if i not in (6, 7)]


@pytest.mark.parametrize("form", ["table", "stream"])
def test_a_batch_of_deletes_in_several_chunks_lands_sorted_and_lists_its_keys_file(tmp_path, form):
    """A file of keys read with pyarrow is a chunk a row group, a stream a record batch at a time: its deletes land as
    one run, sorted by key, so the keys file is the commit's key-store rows, listed as they are; the batch's digest is
    its records' (a retry of the same records in one chunk is a no-op)."""
    t = _table(tmp_path)
    t.ingest(_rows(range(1000), 1), op_column="op")
    chunks = [_rows([900 - i for i in range(0, 300, 3)], 2, "delete"), _rows([5, 1, 3], 2, "delete"),
              _rows(range(950, 990), 2, "delete")]
    data = pa.concat_tables(chunks)
    if form == "stream":
        data = pa.RecordBatchReader.from_batches(data.schema, data.to_batches())
    r = t.ingest(data, op_column="op", batch_id="d")
    assert r.counts["deleted"] == 143
    c = commitlog.read(t.io, r.version)
    (keys_file,) = c.batches[0].keys_files
    assert [(f.path, f.version) for f in c.keystore_add] == [(keys_file.path, r.version)]
    assert not t.ingest(pa.concat_tables(chunks).combine_chunks(), op_column="op", batch_id="d").committed
    view = {row["id"] for row in t.to_arrow().to_pylist()}
    assert len(view) == 857 and 1 not in view and 900 not in view and 2 in view


def test_a_stream_of_delete_runs_between_upserts_keeps_the_order_of_arrival(tmp_path):
    """Consecutive record batches of deletes alone land as one run, sorted by key; an upsert between two runs still
    comes after the first and before the second (same delta value: the later arrival wins)."""
    t = _table(tmp_path)
    t.ingest(_rows(range(20), 1), op_column="op")
    batches = [_rows([10, 2], 2, "delete"), _rows([2, 3], 2), _rows([7, 12], 2, "delete"), _rows([3, 1], 2, "delete"),
               _rows([7], 2)]
    data = pa.concat_tables(batches)
    r = t.ingest(pa.RecordBatchReader.from_batches(data.schema, data.to_batches()), op_column="op")
    assert (r.counts["deleted"], r.counts["updated"], r.counts["inserted"]) == (6, 1, 2)  # 2 and 7 come back
    view = {row["id"]: row["mod"] for row in t.to_arrow().to_pylist()}
    assert sorted(view) == [i for i in range(20) if i not in (1, 3, 10, 12)]
    assert view[2] == 2 and view[7] == 2
