"""Bitmap deltas: a commit that changes a few offsets of a segment with a large bitmap writes the offsets whose
validity differs from that bitmap, not the bitmap again (docs/FORMAT.md, "Bitmaps")."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyroaring import BitMap

import bitlake
from bitlake.format import bitmap, commitlog
from bitlake.format.commit import SegmentState
from bitlake.format.protocol import BITMAP_DELTAS
from bitlake.fs import LocalFileIO
from tests import spec_reader

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64())])


@pytest.mark.parametrize("remembered", [True, False], ids=["from-the-writer's-memory", "from-the-files"])
def test_a_delta_flips_offsets_of_its_bitmap_and_may_grow_the_universe(tmp_path, monkeypatch, remembered):
    if not remembered:
        monkeypatch.setattr(bitmap, "_HELD", bitmap._Recent(0))
    io = LocalFileIO(str(tmp_path))
    holes = BitMap(range(0, 100_000, 10))  # 10,000 holes in [0, 100,000)
    bitmap.write_holes(io, "base.parquet", [(1, 0, holes, 100_000)])
    base = SegmentState(1, 0, 100_010, 100_010, "base.parquet", 90_000)
    cache = bitmap.BitmapCache(io)
    # The commit invalidates offsets 1 and 2, makes hole 10 valid again and offsets 100,000 .. 100,004 valid.
    after = BitMap(holes)
    after.update([1, 2])
    after.discard(10)
    flips = cache.delta(base, after, 100_005, changed=8)
    assert flips == BitMap([1, 2, 10, 100_000, 100_001, 100_002, 100_003, 100_004])
    bitmap.write_holes(io, "delta.parquet", [], [(1, 0, flips)])
    table = pq.read_table(tmp_path / "delta.parquet")
    assert table.column("complement_of").to_pylist() == [None] and table.column("cardinality").to_pylist() == [8]
    state = base.with_delta("delta.parquet", 100_005 - len(after))
    cache = bitmap.BitmapCache(io)
    expected = BitMap(range(100_005)) - after
    assert cache.valid(state) == expected and len(expected) == state.cardinality
    assert cache.holes(state) == (after, 100_005)
    # A delta that would cost more than writing the bitmap again is not made: every other offset flips.
    assert cache.delta(base, BitMap(range(1, 100_000, 2)), 100_000, changed=50_000) is None
    # Nor one that says nothing: the segment is valid as in its bitmap.
    assert cache.delta(base, BitMap(holes), 100_000, changed=3) is None
    assert state.with_bitmap(None, 3) == SegmentState(1, 0, 100_010, 100_010, None, 3)


@pytest.mark.parametrize("form", ["holes", "valid"])
@pytest.mark.parametrize("with_delta", [False, True])
def test_rows_ended_alone_give_the_delta_the_holes_give(tmp_path, form, with_delta):
    """A commit that only ends rows of a segment works out its delta from the ended offsets and the segment's
    delta (BitmapCache.ended), and gets what the holes of the whole segment give (BitmapCache.holes, then delta):
    offsets already invalid, past the bitmap's universe or made valid by the delta included."""
    rng = np.random.default_rng(len(form) + with_delta)
    io = LocalFileIO(str(tmp_path))
    universe = 50_000
    invalid = BitMap(rng.choice(universe, 30_000 if form == "valid" else 5_000, replace=False).tolist())
    bitmap.write_holes(io, "base.parquet", [(1, 0, invalid, universe)])
    assert (bitmap.read_stored(io, "base.parquet")[(1, 0)].complement_of is None) == (form == "valid")
    cache = bitmap.BitmapCache(io)
    base_valid = cache.file("base.parquet")[(1, 0)]
    state = SegmentState(1, 0, universe + 100, universe + 100, "base.parquet", len(base_valid))
    flips = BitMap()
    if with_delta:  # holes made valid again, valid offsets ended, offsets past the universe made valid
        flips = BitMap(rng.choice(universe, 400, replace=False).tolist()) | BitMap(range(universe, universe + 60))
        bitmap.write_holes(io, "delta.parquet", [], [(1, 0, flips)])
        state = state.with_delta("delta.parquet", len(base_valid ^ flips))
    valid = cache.valid(state)
    assert len(valid) == state.cardinality
    # Ended: valid offsets or not, offsets the delta flipped, offsets past the universe (valid by the delta or not).
    gone = BitMap(rng.choice(universe, 300, replace=False).tolist()) | BitMap(list(flips)[::20]) | \
        BitMap(range(universe + 50, universe + 70))
    ended, count = cache.ended(state, gone)
    assert base_valid ^ ended == valid - gone and count == len(valid - gone)
    holes, top = cache.holes(state)
    holes |= BitMap([o for o in gone if o < top])
    assert cache.delta(state, holes, top, changed=len(gone), always=True) == ended


def _batch(ids, v, deleted=()) -> pa.Table:
    ids = [int(i) for i in ids]
    ops = ["delete" if i in set(deleted) else "upsert" for i in ids]
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([v] * len(ids), pa.int64()), "op": ops})


def test_small_commits_after_churn_write_deltas_and_every_version_reads_right(tmp_path, monkeypatch):
    rng = np.random.default_rng(7)
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="v", num_buckets=2)
    expected: dict[int, dict[int, int]] = {}
    live: dict[int, int] = {}

    def ingest(batch: pa.Table) -> int:
        r = t.ingest(batch, op_column="op")
        for row in batch.to_pylist():
            if row["op"] == "delete":
                live.pop(row["id"], None)
            else:
                live[row["id"]] = row["v"]
        expected[r.version] = dict(live)
        return r.version

    ingest(_batch(range(200_000), 1))
    ingest(_batch(rng.choice(200_000, 40_000, replace=False), 2))  # churn: holes all over the load's segments
    sizes = {}
    for v in range(3, 13):
        keys = rng.choice(200_010, 300, replace=False)
        version = ingest(_batch(keys, v, deleted=keys[:20]))
        c = commitlog.read(t.io, version)
        sizes[version] = {p: t.io.size(p) for p in {s.delta or s.bitmap for s in c.segments} if p}  # its own
        assert all(s.delta is None or s.bitmap not in {x.delta for x in c.segments} for s in c.segments)
    state = t.state()
    with_delta = [s for s in state.segments.values() if s.delta]
    assert with_delta, "small commits after churn write deltas"
    assert BITMAP_DELTAS in state.protocol.reader_features and BITMAP_DELTAS in state.protocol.writer_features
    stored = bitmap.BitmapCache(t.io)
    for s in with_delta:  # never more than half the bitmap it is to
        assert stored.stored(s.delta)[s.segment].nbytes * 2 <= stored.stored(s.bitmap)[s.segment].nbytes
    # A commit after churn writes much less than the bitmaps it changes.
    churned = sum(t.io.size(s.bitmap) for s in commitlog.read(t.io, 2).segments if s.bitmap)
    assert sorted(sum(v.values()) for v in sizes.values())[len(sizes) // 2] * 4 < churned, (sizes, churned)

    def check_every_version():
        for version, rows in expected.items():
            got = t.to_arrow(version=version)
            assert dict(zip(got.column("id").to_pylist(), got.column("v").to_pylist(), strict=True)) == rows
            assert sum(s.cardinality for s in t.state(version).segments.values()) == len(rows)
        feed = t.changes_to_arrow(starting_version=4, ending_version=12)
        assert feed.num_rows > 0
        # tests/spec_reader.py, written from docs/FORMAT.md alone, reads the same.
        for version in (6, max(expected)):
            assert {r["id"]: r["v"] for r in spec_reader.read_view(t.path, version=version)} == expected[version]

    check_every_version()
    # Read by a process that wrote none of the files, after a cleanup of unreferenced ones.
    monkeypatch.setattr(bitmap, "_HELD", bitmap._Recent(0))
    t.cleanup(min_age_seconds=0)
    check_every_version()
    # And the writer goes on from the files alone.
    ingest(_batch(rng.choice(200_000, 300, replace=False), 20))
    check_every_version()


def test_a_writer_keeps_the_bitmaps_it_used_last_up_to_its_bytes():
    recent = bitmap._Recent(max_bytes=100)

    def stored(nbytes):
        return {(1, 0): bitmap.Stored(BitMap([1]), None, nbytes)}

    recent.put(("io", "a"), stored(40))
    recent.put(("io", "b"), stored(40))
    assert recent.get(("io", "a")) is not None  # used: the most recent now
    recent.put(("io", "c"), stored(40))  # 120 bytes: the least recently used goes
    assert recent.get(("io", "b")) is None and recent.get(("io", "a")) and recent.get(("io", "c"))
    recent.put(("io", "d"), stored(500))  # more than the bound: not kept, and the others stay
    assert recent.get(("io", "d")) is None and recent.get(("io", "a")) and recent.get(("io", "c"))


def test_a_process_reads_a_bitmap_file_once(tmp_path, monkeypatch):
    """A writer that did not write a segment's bitmap (another process did, or a compaction) reads the file for its
    first commit to the segment, and keeps it for the next ones: files never change."""
    io = LocalFileIO(str(tmp_path))
    bitmap.write_holes(io, "b.parquet", [(1, 0, BitMap(range(0, 100_000, 10)), 100_000)])
    monkeypatch.setattr(bitmap, "_HELD", bitmap._Recent(64 << 20))  # a process that holds none
    first = bitmap.read_stored(io, "b.parquet")
    assert first[(1, 0)].complement_of == 100_000 and len(first[(1, 0)].bitmap) == 10_000
    io.delete("b.parquet")
    assert bitmap.read_stored(io, "b.parquet") is first
    monkeypatch.setattr(bitmap, "_HELD", bitmap._Recent(0))  # nothing held: the file is read (and gone)
    with pytest.raises(FileNotFoundError):
        bitmap.read_stored(io, "b.parquet")


def test_an_unkeyed_tables_deletes_write_deltas_too(tmp_path):
    import pyarrow.compute as pc

    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA)
    t.ingest(pa.table({"id": pa.array(range(200_000), pa.int64()), "v": pa.array([0] * 200_000, pa.int64())}))
    def delete(ids) -> set[int]:
        t.delete(pc.field("id").isin(pa.array(sorted(ids), pa.int64())))
        return set(ids)

    gone = delete(range(0, 200_000, 5))  # churn: a hole every 5 rows
    for k in range(1, 6):
        gone |= delete(range(k, 200_000, 997))
    state = t.state()
    assert [s.delta for s in state.segments.values()] != [None] * len(state.segments)
    assert BITMAP_DELTAS in state.protocol.reader_features
    assert sorted(t.to_arrow().column("id").to_pylist()) == [i for i in range(200_000) if i not in gone]
    assert sum(s.cardinality for s in state.segments.values()) == 200_000 - len(gone)
    assert len(spec_reader.read_view(t.path)) == 200_000 - len(gone)


def test_a_table_may_keep_to_whole_bitmaps(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="v",
                             properties={"bitmap.deltas": "false"})
    t.ingest(_batch(range(100_000), 1), op_column="op")
    t.ingest(_batch(range(0, 100_000, 4), 2), op_column="op")
    for v in range(3, 6):
        t.ingest(_batch(range(v, 100_000, 1_000), v), op_column="op")
    state = t.state()
    assert all(s.delta is None for s in state.segments.values()) and any(s.bitmap for s in state.segments.values())
    assert BITMAP_DELTAS not in state.protocol.reader_features
    t.set_properties({"bitmap.deltas": "true"})
    t.ingest(_batch(range(7, 100_000, 1_000), 6), op_column="op")
    assert any(s.delta for s in t.state().segments.values())
    assert len(t.to_arrow()) == 100_000


def test_the_property_takes_true_false_or_always(tmp_path):
    with pytest.raises(bitlake.InvalidInputError, match="bitmap.deltas.*one of"):
        bitlake.create_table(str(tmp_path / "x"), SCHEMA, properties={"bitmap.deltas": "sometimes"})
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="v",
                             properties={"bitmap.deltas": "always"})
    t.ingest(_batch(range(10), 1, deleted=[3]), op_column="op")
    t.ingest(_batch([5], 2), op_column="op")  # a hole at 3, then one at 5: too small for the cost rule
    t.ingest(_batch([7], 3), op_column="op")
    assert [s.delta is not None for s in t.state().segments.values()] == [True, False, False]
    assert sorted(t.to_arrow().column("id").to_pylist()) == [0, 1, 2, 4, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("deltas", ["always", "true"])
def test_random_upserts_deletes_reverts_and_replaces_read_as_their_replay(tmp_path, deltas):
    """Every version reads as the replay of its live batches in arrival order (each record's delta value is its
    commit's step, so the latest arrival of a key wins), whether segments' bitmaps are deltas or whole."""
    rng = np.random.default_rng(11)
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="v", num_buckets=2,
                             properties={"bitmap.deltas": deltas})
    live: list[tuple[str, pa.Table]] = []  # in arrival order
    expected: dict[int, dict[int, int]] = {}

    def replay() -> dict[int, int]:
        rows: dict[int, int] = {}
        for _, batch in live:
            for r in batch.to_pylist():
                if r["op"] == "delete":
                    rows.pop(r["id"], None)
                else:
                    rows[r["id"]] = r["v"]
        return rows

    def ingest(batch_id: str, batch: pa.Table) -> None:
        version = t.ingest(batch, op_column="op", batch_id=batch_id).version
        live.append((batch_id, batch))
        expected[version] = replay()

    ingest("b0", _batch(range(5_000), 0))
    ingest("b1", _batch(rng.choice(5_000, 1_500, replace=False), 1))  # holes all over the load's segment
    for step in range(2, 30):
        action = rng.choice(["upsert", "delete", "revert", "replace"], p=[0.4, 0.25, 0.2, 0.15])
        keys = rng.choice(5_200, 60, replace=False)
        if action in ("revert", "replace") and len(live) > 2:
            batch_id = live[int(rng.integers(1, len(live)))][0]
            live[:] = [b for b in live if b[0] != batch_id]
            if action == "revert":
                version = t.revert_batch(batch_id).version
            else:
                batch = _batch(keys, step)
                version = t.replace_batch(batch_id, batch, op_column="op").version
                live.append((batch_id, batch))
            expected[version] = replay()
        else:
            ingest(f"s{step}", _batch(keys, step, deleted=keys if action == "delete" else ()))
    state = t.state()
    if deltas == "always":
        assert any(s.delta for s in state.segments.values())
    for version, rows in expected.items():
        got = t.to_arrow(version=version)
        assert dict(zip(got.column("id").to_pylist(), got.column("v").to_pylist(), strict=True)) == rows, version
        assert sum(s.cardinality for s in t.state(version).segments.values()) == len(rows)
    assert {r["id"]: r["v"] for r in spec_reader.read_view(t.path)} == expected[t.version]
