"""Shared key-store files: a small commit's key-store rows of every bucket in one file, which a later commit writes
into the buckets' files (docs/FORMAT.md, "Key store")."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest

import bitlake
from bitlake.engine.keys import indexsession, keycache
from bitlake.format import keystore
from bitlake.format.protocol import SHARED_KEYSTORE_FILES

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("mod", pa.int64())])


def _rows(ids, mod) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids],
                     "mod": pa.array([mod] * len(ids), pa.int64())}, schema=SCHEMA)


def _entries(t) -> dict[int, tuple[int, bool]]:
    state = t.state()
    tables = keystore.read_entries(t.io, state.keystore, state.metadata)
    return {r["id"]: (r[keystore.DELTA], r[keystore.DELETED]) for table in tables for r in table.to_pylist()}


@pytest.mark.parametrize("cached", [True, False], ids=["keys-in-memory", "keys-from-files-or-index"])
def test_a_key_takes_its_row_of_the_highest_version_across_shared_and_bucket_files(tmp_path, monkeypatch, cached):
    if not cached:
        monkeypatch.setattr(keycache, "CACHE", keycache.KeyStoreCache(0))
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2,
                             properties={"keystore.max_increments": "2"})
    t.ingest(_rows(range(100), 1))  # small: one shared file, at version 1
    state = t.state()
    assert [f.rows for f in state.keystore[keystore.SHARED]] == [100] and set(state.keystore) == {keystore.SHARED}
    assert SHARED_KEYSTORE_FILES in state.protocol.writer_features  # readers never read the key store
    assert SHARED_KEYSTORE_FILES not in state.protocol.reader_features
    assert t.ingest(_rows([5], 0)).counts["stale"] == 1  # its entry is in the shared file alone
    r = t.ingest(_rows(range(70_000), 2))  # large: the buckets' files, newer than the shared file's rows
    assert (r.counts["updated"], r.counts["inserted"]) == (100, 69_900)
    state = t.state()
    assert len(state.keystore[keystore.SHARED]) == 1 and {0, 1} <= set(state.keystore)
    assert t.ingest(_rows([5], 1)).counts["stale"] == 1  # its entry is the bucket file's (delta 2), not the shared one
    t.ingest(_rows([5], 3))
    assert len(t.state().keystore[keystore.SHARED]) == 2  # max_increments: the next small commit takes them in
    r = t.ingest(_rows([6, 70_001], 3))
    assert (r.counts["updated"], r.counts["inserted"]) == (1, 1)
    state = t.state()
    assert state.keystore.get(keystore.SHARED, []) == []
    # The shared files' rows went into the buckets at their own versions: key 7's entry is still the large
    # commit's, though the first shared file's older row of it now sits in a newer bucket file.
    assert t.ingest(_rows([7], 1)).counts["stale"] == 1
    entries = _entries(t)
    assert len(entries) == 70_001
    assert {k: entries[k] for k in (0, 5, 6, 7, 99, 69_999, 70_001)} == {
        0: (2, False), 5: (3, False), 6: (3, False), 7: (2, False), 99: (2, False), 69_999: (2, False),
        70_001: (3, False)}
    view = {r["id"]: r["mod"] for r in t.to_arrow().to_pylist()}
    assert len(view) == 70_001 and (view[5], view[6], view[7], view[70_001]) == (3, 3, 2, 3)


def test_the_key_index_rebuilt_from_shared_files_answers_like_the_key_store(tmp_path):
    path = tmp_path / "t"
    t = bitlake.create_table(str(path), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=4,
                             properties={"keystore.index_idle_seconds": "0"})
    t.ingest(_rows(range(200), 1))
    for mod in range(2, 6):
        t.ingest(_rows(range(mod, 200, 7), mod))
    t.ingest(pa.table({"id": pa.array([3, 10], pa.int64()), "name": ["x", "y"], "mod": pa.array([9, 9], pa.int64()),
                       "op": ["delete", "delete"]}), op_column="op")
    indexsession.close_idle()
    assert len(t.state().keystore[keystore.SHARED]) == 6
    shutil.rmtree(path / "_bitlake" / "index")  # the next writer rebuilds it from the key store
    monkey = keycache.KeyStoreCache(0)  # no key-store files in memory: the writer looks keys up in the index
    saved, keycache.CACHE = keycache.CACHE, monkey
    try:
        r = t.ingest(_rows([3, 10, 11, 12], 4))  # 3, 10 deleted at 9: stale; 11 at 4 (mod 4); 12 at 5 (mod 5)
    finally:
        keycache.CACHE = saved
    assert (r.counts["stale"], r.counts["updated"]) == (3, 1)
    assert _entries(t)[11] == (4, False) and _entries(t)[3] == (9, True)
