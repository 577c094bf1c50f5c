"""Clustering at compaction (``compact(cluster_by=...)``): each partition's files rewritten into files of disjoint
ranges of one column, every row and row id kept, every view at every version the same; a vacuum of a few values
then reads the few files whose range holds them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import bitlake
from bitlake.engine.maintain import cluster, compaction
from bitlake.errors import InvalidInputError
from bitlake.format import bitmap, stats
from tests.oracle import rows_key
from tests.test_compaction import check_offsets

SCHEMA = pa.schema([("k", pa.int64()), ("user", pa.int64()), ("name", pa.string()), ("score", pa.float64()),
                    ("v", pa.int64())])
COLUMNS = SCHEMA.names


def rows(keys, users, v, names=None, scores=None) -> pa.Table:
    keys = list(keys)
    return pa.table({
        "k": pa.array(keys, pa.int64()), "user": pa.array(users, pa.int64()),
        "name": names if names is not None else [f"n{u % 97:03d}" for u in users],
        "score": pa.array(scores if scores is not None else [float(k % 13) for k in keys], pa.float64()),
        "v": pa.array([v] * len(keys), pa.int64())})


def table(path, batches: int = 4, per_batch: int = 3000):
    """A table of ``batches`` ingests of random users (each its own data files), the later ones updating half of
    the earlier keys (so compaction writes history files too)."""
    rng = np.random.default_rng(3)
    t = bitlake.create_table(path, SCHEMA, primary_key=["k"], delta_column="v", num_buckets=4)
    for b in range(batches):
        keys = np.arange(b * per_batch // 2, b * per_batch // 2 + per_batch)
        t.ingest(rows(keys, rng.integers(0, 10_000, len(keys)).tolist(), b + 1), batch_id=f"b{b}")
    return t


def views(t, upto: int) -> dict:
    """Every version's rows, NaN as a string (NaN equals nothing, itself included)."""
    def same_nan(row: dict) -> dict:
        return {c: "NaN" if isinstance(x, float) and x != x else x for c, x in row.items()}
    return {v: rows_key([same_nan(r) for r in t.to_arrow(version=v).to_pylist()], COLUMNS) for v in range(upto + 1)}


def spans(t, column: str) -> list[tuple]:
    t_ = t.metadata.schema.field(column).type
    out = []
    for f in t.state().data_files():
        lo, hi = f.stats["min"].get(column), f.stats["max"].get(column)
        if lo is not None:
            out.append((stats.decode(lo, t_).as_py(), stats.decode(hi, t_).as_py(), f.rows))
    return sorted(out)


def test_clustered_files_hold_disjoint_ranges_and_every_view_reads_the_same(tmp_path):
    t = table(str(tmp_path / "t"))
    before = views(t, t.version)
    current_files = len(t.state().data_files())
    r = t.compact(cluster_by="user", target_file_bytes=20_000)
    assert r.version is not None and r.removed_files == current_files
    assert views(t, t.version - 1) == before and views(t, t.version)[t.version] == before[t.version - 1]
    check_offsets(t)
    assert len(t.state().data_files()) >= 6  # the target size makes many ranges
    # Current files and history files are each cut into ranges: within a kind, the ranges do not overlap.
    found = compaction.metrics(bitmap.BitmapCache(t.io), t.state())
    for history in (False, True):
        files = [m.file for m in found if (m.valid_rows == 0) == history]
        assert files and cluster.clustered(files, "user", pa.int64())
    # Nothing left to cluster: a second compaction by the same column does nothing.
    assert t.compact(cluster_by="user", target_file_bytes=20_000).version is None


def test_a_vacuum_of_a_few_values_reads_only_the_files_of_their_range(tmp_path):
    t = table(str(tmp_path / "t"), batches=3, per_batch=4000)
    # A major compaction whose window starts at it: the vacuum need not rewrite the files it replaced, which no
    # version of the window reads any more (with a window reaching back before it, those files are read too).
    t.compact(cluster_by="user", target_file_bytes=30_000, major=True, look_back=t.version)
    files = len(t.state().data_files())
    assert files >= 4  # current files only: the window lets the history rows go
    erased = [u for u in t.to_arrow().column("user").to_pylist() if u < 300]
    t.tombstone("user", sorted(set(erased)))
    expected = rows_key([r for r in t.to_arrow().to_pylist()], COLUMNS)
    r = t.vacuum()
    assert r.rows_purged > 0
    assert r.files_considered == files
    assert r.files_read == 1  # the range of users 0..299 is in one file
    assert rows_key(t.to_arrow().to_pylist(), COLUMNS) == expected
    assert not any(u < 300 for u in t.to_arrow().column("user").to_pylist())


def test_unclustered_vacuum_reads_every_file(tmp_path):
    """The control of the test above: the same table compacted without clustering."""
    t = table(str(tmp_path / "t"), batches=3, per_batch=4000)
    t.compact(target_file_bytes=30_000, major=True, look_back=t.version)
    erased = sorted({u for u in t.to_arrow().column("user").to_pylist() if u < 300})
    t.tombstone("user", erased)
    r = t.vacuum()
    assert r.files_read == r.files_considered > 1


def test_strings_floats_nulls_and_nan_are_clustered_without_losing_a_row(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["k"], delta_column="v", num_buckets=2)
    rng = np.random.default_rng(5)
    for b in range(3):
        keys = list(range(b * 2000, b * 2000 + 2000))
        names = [None if k % 11 == 0 else f"user-{rng.integers(0, 500):04d}" for k in keys]
        scores = [None if k % 7 == 0 else float("nan") if k % 5 == 0 else float(rng.normal()) for k in keys]
        t.ingest(rows(keys, [k % 100 for k in keys], 1, names, scores))
    before = views(t, t.version)
    t.compact(cluster_by="name", target_file_bytes=15_000)
    assert views(t, t.version)[t.version] == before[t.version - 1]
    t.compact(cluster_by="score", target_file_bytes=15_000)
    assert views(t, t.version)[t.version] == before[t.version - 2]
    check_offsets(t)
    found = compaction.metrics(bitmap.BitmapCache(t.io), t.state())
    assert len(found) > 2 and cluster.clustered([m.file for m in found], "score", pa.float64())
    assert t.compact(cluster_by="score", target_file_bytes=15_000).version is None


def test_ranges_split_sorted_rows_at_their_bounds():
    r = cluster.Ranges("x", (10, 20))
    t = pa.table({"x": pa.array([25, None, 10, 11, 5, 20, 21], pa.int64())})
    ids = np.arange(7, dtype=np.int64) * 100
    got = [(i, part.column("x").to_pylist(), part_ids.tolist())
           for i, part, part_ids in r.split(t, ids, np.arange(7))]
    assert got == [(0, [5, 10], [400, 200]), (1, [11, 20], [300, 500]), (2, [21, 25, None], [600, 0, 100])]
    some = [(i, part.column("x").to_pylist()) for i, part, _ in r.split(t, ids, np.array([0, 1, 4, 6]))]
    assert some == [(0, [5]), (2, [21, 25, None])]


@pytest.mark.parametrize(("column", "message"), [("nope", "not a column"), (3, "column name")])
def test_a_bad_cluster_column_is_refused_and_nothing_is_written(tmp_path, column, message):
    t = table(str(tmp_path / "t"), batches=2, per_batch=100)
    v = t.version
    with pytest.raises(InvalidInputError, match=message):
        t.compact(cluster_by=column)
    assert t.version == v


def test_a_column_without_an_order_is_refused(tmp_path):
    s = pa.schema([("k", pa.int64()), ("tags", pa.list_(pa.string())), ("v", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), s, primary_key=["k"], delta_column="v")
    t.ingest(pa.table({"k": [1], "tags": [["a"]], "v": [1]}, schema=s))
    with pytest.raises(InvalidInputError, match="clustering takes"):
        t.compact(cluster_by="tags")


def test_a_filter_on_the_clustered_column_opens_the_files_of_its_range(tmp_path, monkeypatch):
    import pyarrow.compute as pc

    from bitlake.engine.read import reader as reader_mod

    t = table(str(tmp_path / "t"), batches=3, per_batch=4000)
    t.compact(cluster_by="user", target_file_bytes=30_000, major=True, look_back=t.version)
    files = len(t.state().data_files())
    opened = []  # the data files given to pyarrow's scanner
    real = reader_mod._chunks
    monkeypatch.setattr(reader_mod, "_chunks", lambda io, meta, files, *a: opened.extend(f.path for f in files)
                        or real(io, meta, files, *a))
    expected = sorted((r for r in t.to_arrow().to_pylist() if r["user"] < 300), key=lambda r: r["k"])
    opened.clear()
    got = t.to_arrow(filter=pc.field("user") < 300)
    assert len([p for p in opened if p.startswith("data/")]) == 1 < files
    assert sorted(got.to_pylist(), key=lambda r: r["k"]) == expected
