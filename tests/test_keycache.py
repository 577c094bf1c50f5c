"""The key store in a writer's memory (bitlake/engine/keys/keycache.py): a writer's next batch finds its keys' stored
entries in the files it wrote or read, without reading them again or looking them up in the key index; files
another writer committed are read once; the least recently used files go past the budget. No Spark."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

import bitlake
from bitlake.engine.keys import keycache, keyindex
from bitlake.engine.write import metagen
from bitlake.format import keystore

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("mod", pa.int64())])


def _rows(ids, mod, op=None):
    data = {"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids],
            "mod": pa.array([mod] * len(ids), pa.int64())}
    if op is not None:
        data["op"] = [op] * len(ids)
    return pa.table(data)


@pytest.fixture
def reads(monkeypatch):
    """Counts the key-store files MetaGen's scans read and the keys looked up in the key index."""
    counted = {"files": 0, "lookups": 0}
    entries, lookup = keycache.KeyStoreCache.entries, keyindex.KeyIndex.lookup

    def counting_entries(self, io, f, meta):
        counted["files"] += not self.holds(io, f.path)
        return entries(self, io, f, meta)

    def counting_lookup(self, keys, *args, **kwargs):
        counted["lookups"] += len(keys)
        return lookup(self, keys, *args, **kwargs)

    monkeypatch.setattr(keycache.KeyStoreCache, "entries", counting_entries)
    monkeypatch.setattr(keyindex.KeyIndex, "lookup", counting_lookup)
    return counted


@pytest.mark.parametrize("key", ["id", "name"])
def test_a_writers_next_batch_finds_its_keys_in_memory(tmp_path, reads, key):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=[key], delta_column="mod", num_buckets=4)
    t.ingest(_rows(range(2000), 1))
    reads.update(files=0, lookups=0)
    for mod in (2, 3):
        r = t.ingest(_rows(range(0, 2000, 100), mod))
        assert r.counts["updated"] == 20
    r = t.ingest(_rows([5, 105, 2500], 4, "delete"), op_column="op")
    assert (r.counts["deleted"], r.counts["ignored_deletes"]) == (2, 1)
    assert reads == {"files": 0, "lookups": 0}
    view = t.to_arrow()
    assert view.num_rows == 1998
    assert sorted(r["id"] for r in view.to_pylist() if r["mod"] == 3) == list(range(0, 2000, 100))


def test_merges_of_small_increments_take_their_rows_from_memory(tmp_path, monkeypatch):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2,
                             properties={"keystore.max_increments": "2"})
    t.ingest(_rows(range(1000), 1))
    read = []
    real = keystore.read_file
    monkeypatch.setattr(keystore, "read_file", lambda io, f, *a, **k: read.append(f.path) or real(io, f, *a, **k))
    for mod in range(2, 12):
        t.ingest(_rows(range(mod, 1000, 97), mod))
    state = t.state()
    assert max(len(files) for files in state.keystore.values()) <= 3  # merged all along
    assert read == []
    assert {r["id"]: r["mod"] for r in t.to_arrow().to_pylist()} == {
        i: max([1] + [m for m in range(2, 12) if i >= m and (i - m) % 97 == 0]) for i in range(1000)}


def test_files_another_writer_committed_are_read_once_and_never_taken_for_older_ones(tmp_path, reads):
    path = str(tmp_path / "t")
    t = bitlake.create_table(path, SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2,
                             properties={"keystore.index_idle_seconds": "0"})
    t.ingest(_rows(range(100), 1))
    other = (f"import bitlake, pyarrow as pa; t = bitlake.open_table({path!r}); "
             "t.ingest(pa.table({'id': pa.array([7, 8], pa.int64()), 'name': ['x', 'y'], "
             "'mod': pa.array([50, 50], pa.int64())}))")
    subprocess.run([sys.executable, "-c", other], check=True)
    reads.update(files=0, lookups=0)
    r = t.ingest(_rows([7, 8, 9], 10))  # 7 and 8 are at 50 now: stale; 9 is at 1: updated
    assert (r.counts["stale"], r.counts["updated"]) == (2, 1)
    buckets = (0, 1, keystore.SHARED)
    assert reads["files"] == len({f.path for b in buckets for f in t.state(t.version - 1).keystore.get(b, [])} -
                                 {f.path for b in buckets for f in t.state(t.version - 2).keystore.get(b, [])}) == 1
    reads.update(files=0)
    t.ingest(_rows([9], 11))
    assert reads == {"files": 0, "lookups": 0}
    assert {r["id"]: r["mod"] for r in t.to_arrow().to_pylist() if r["id"] in (7, 8, 9)} == {7: 50, 8: 50, 9: 11}


def test_the_cache_keeps_the_most_recently_used_files_within_its_budget(tmp_path):
    io = bitlake.fs.LocalFileIO(str(tmp_path))

    def entries(n):
        return keycache.Entries(pa.table({"id": pa.array(np.arange(n), pa.int64()), keystore.DELTA: np.arange(n),
                                          keystore.ROW_ID: np.arange(n), keystore.DELETED: np.zeros(n, bool),
                                          keystore.VERSION: np.ones(n, np.int64)}), ["id"])

    n = keycache._KEEP_TABLE_ROWS + 1
    large = entries(n)
    # Deltas and row ids as offsets in 4 bytes each, the search's keys (their 3 bits below the slots', in a byte)
    # and table (about half a byte a key); the flags and versions, one value each: none.
    assert large.table is None and large.search.values.nbytes == n
    assert large.nbytes == n * (4 + 4) + large.search.nbytes <= n * 10
    one = entries(100)  # a small file also keeps its Arrow rows, for merges; its deltas and row ids in a byte each
    assert one.table is not None and one.nbytes == 100 * (1 + 1) + one.search.nbytes + one.table.nbytes
    cache = keycache.KeyStoreCache(budget=3 * one.nbytes)
    for name in "abc":
        cache.put(io, name, entries(100))
    assert cache.get(io, "a") is not None  # a is now the most recently used
    cache.put(io, "d", entries(100))
    assert [cache.holds(io, n) for n in "abcd"] == [True, False, True, True] and cache.held == 3 * one.nbytes
    cache.forget(io, ["a", "zz"])
    assert not cache.holds(io, "a") and cache.held == 2 * one.nbytes
    cache.put(io, "big", entries(1000))  # more than the budget: not kept, nothing evicted
    assert not cache.holds(io, "big") and cache.held == 2 * one.nbytes
    off = keycache.KeyStoreCache(budget=0)
    off.written(io, "a", pa.table({"id": [1], keystore.DELTA: [0], keystore.ROW_ID: [0], keystore.DELETED: [False],
                                   keystore.VERSION: [1]}), _meta())
    assert not off.holds(io, "a")


def _meta():
    from bitlake.format.metadata import TableMetadata

    return TableMetadata(schema=SCHEMA, primary_key=("id",), delta_column="mod", name="t")


def test_a_writer_that_starts_cold_reads_the_files_once_its_lookups_have_cost_as_much(tmp_path, reads, monkeypatch):
    """Ski rental: a process that did not write the key store looks keys up until its lookups have cost what
    reading the files does (70 rows a key against 2,000 rows: five batches of 5 keys), then scans, which keeps
    the files: no lookup and no read after that."""
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=1)
    t.ingest(_rows(range(2000), 1))
    monkeypatch.setattr(keycache, "CACHE", keycache.KeyStoreCache(budget=1 << 30))  # a process starting now
    monkeypatch.setattr(metagen, "LOOKUP_COST_IN_ROWS", 70)
    seen = []
    for mod in range(2, 10):
        reads.update(files=0, lookups=0)
        r = t.ingest(_rows([mod * 10 + k for k in range(5)], mod))
        assert r.counts["updated"] == 5
        seen.append((reads["lookups"], reads["files"]))
    assert seen == [(5, 0)] * 5 + [(0, 1)] + [(0, 0)] * 2
