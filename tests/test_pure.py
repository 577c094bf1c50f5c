"""Fast tests of the format layer (bitlake.format) and the pure pieces of the engine: row ids, bitmaps, the key
store, the bucket hash, partition folders, the commit envelope, the protocol, state replay and checkpoints,
table metadata, Data Change Events, segment logs and format v1 tables. No Spark: tables are built from
hand-written commits (bitlake.format.commit) written with bitlake.format.commitlog.write."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import pathlib
import shutil
import struct
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

import bitlake
from bitlake.errors import (
    CorruptTableError,
    InvalidInputError,
    NotATableError,
    SchemaMismatchError,
    TableNotFoundError,
    UnsupportedFormatVersionError,
    VersionNotFoundError,
)
from bitlake.format import bitmap, bucket, commitlog, datafile, keystore, layout, rowid, segmentlog
from bitlake.format.commit import (
    CREATE,
    INGEST,
    LAND,
    METAGEN,
    SET_METADATA,
    BatchRecord,
    BucketFile,
    Commit,
    DataFile,
    KeysFile,
    LogFile,
    SegmentRows,
    SegmentState,
    Tombstone,
)
from bitlake.format.metadata import DELTA_INFINITY, TableMetadata, delta_to_int
from bitlake.format.protocol import TOMBSTONES, Protocol
from bitlake.format.state import TableState, load, write_checkpoint
from bitlake.fs import LocalFileIO, file_io

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("mod", pa.int64())])
FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "v1"


def meta(**kw) -> TableMetadata:
    base = dict(schema=SCHEMA, primary_key=("id",), delta_column="mod", name="t")
    base.update(kw)
    return TableMetadata(**base)


# -- row ids -------------------------------------------------------------------------------------


@pytest.mark.parametrize("rid", [(0, 0, 0), (1, 2, 3), (rowid.MAX_PART, rowid.MAX_SEQ, rowid.MAX_OFFSET)])
def test_row_id_packs_and_unpacks(rid):
    packed = rowid.pack(*rid)
    assert 0 <= packed < 2**63
    assert packed == rid[0] << 39 | rid[1] << 23 | rid[2]  # the layout docs/FORMAT.md states
    assert rowid.unpack(packed) == rid


def test_packing_preserves_row_id_order():
    ids = [(1, 0, 5), (1, 1, 0), (2, 0, 0), (1, 0, 6), (0, rowid.MAX_SEQ, rowid.MAX_OFFSET)]
    assert sorted(ids) == sorted(ids, key=lambda r: rowid.pack(*r))


def test_row_id_out_of_range_is_refused():
    for bad in [(rowid.MAX_PART + 1, 0, 0), (0, rowid.MAX_SEQ + 1, 0), (0, 0, rowid.MAX_OFFSET + 1), (-1, 0, 0)]:
        with pytest.raises(ValueError):
            rowid.pack(*bad)


def test_vectorised_packing_agrees_with_scalar_packing():
    ids = [(0, 0, 0), (1, 2, 3), (7, 0, rowid.MAX_OFFSET), (rowid.MAX_PART, rowid.MAX_SEQ, rowid.MAX_OFFSET)]
    parts, seqs, offsets = (np.array(c, np.int32) for c in zip(*ids, strict=True))
    packed = rowid.pack_arrays(parts, seqs, offsets)
    assert packed.tolist() == [rowid.pack(*r) for r in ids]
    assert [tuple(int(x) for x in r) for r in zip(*rowid.unpack_arrays(packed), strict=True)] == ids
    assert rowid.segment_key(7, 0) == rowid.pack(7, 0, 0)


# -- bitmaps -------------------------------------------------------------------------------------


def test_invalid_offsets_is_the_complement():
    assert bitmap.invalid_offsets(BitMap([0, 2, 3]), 6).tolist() == [1, 4, 5]
    assert bitmap.invalid_offsets(BitMap(), 3).tolist() == [0, 1, 2]
    assert bitmap.valid_mask(BitMap([1, 3]), np.arange(5)).tolist() == [False, True, False, True, False]
    assert bitmap.valid_mask(BitMap(), np.arange(2)).tolist() == [False, False]
    assert bitmap.of(np.array([4, 1, 4], np.int64)) == BitMap([1, 4])


def test_a_segment_without_a_bitmap_file_has_the_offsets_below_its_cardinality(tmp_path):
    cache = bitmap.BitmapCache(LocalFileIO(str(tmp_path)))
    assert list(cache.valid(SegmentState(1, 0, 5, 5, None, 5))) == [0, 1, 2, 3, 4]
    assert list(cache.valid(SegmentState(1, 0, 5, 5, None, 0))) == []


def test_bitmap_file_round_trip_uses_portable_serialization(tmp_path):
    io = LocalFileIO(str(tmp_path))
    bm = BitMap(range(0, 100_000, 3))
    bitmap.write_file(io, "b.parquet", [(1, 2, bm), (1, 3, BitMap())])
    back = bitmap.BitmapCache(io).file("b.parquet")
    assert back[(1, 2)] == bm and len(back[(1, 3)]) == 0
    table = pq.read_table(tmp_path / "b.parquet")
    assert table.schema == bitmap.FILE_SCHEMA
    assert table.column("cardinality").to_pylist() == [len(bm), 0]
    blob = table.column("bitmap")[0].as_py()
    assert BitMap.deserialize(blob) == bm  # the portable format, readable by any roaring library
    # A segment state naming the file reads its own segment's offsets, as a copy the caller may change.
    cache = bitmap.BitmapCache(io)
    valid = cache.valid(SegmentState(1, 2, 100_000, 100_000, "b.parquet", len(bm)))
    valid.add(1)
    assert cache.valid(SegmentState(1, 2, 100_000, 100_000, "b.parquet", len(bm))) == bm


@pytest.mark.parametrize("remembered", [True, False], ids=["from-the-writer's-memory", "from-the-file"])
def test_bitmaps_written_as_holes_read_back_as_valid_offsets_and_as_holes(tmp_path, monkeypatch, remembered):
    """A commit hands a segment's holes in [0, universe) to write_holes: few holes are stored as such, many as
    the valid offsets; readers get the valid offsets either way, and a later commit the holes again (in the process
    that wrote the file, from what it wrote, which the caller may change afterwards)."""
    if not remembered:
        monkeypatch.setattr(bitmap, "_HELD", bitmap._Recent(0))
    io = LocalFileIO(str(tmp_path))
    few, many = BitMap([3, 70_000, 99_999]), BitMap(range(0, 99_990))
    given = [BitMap(few), BitMap(many)]
    bitmap.write_holes(io, "h.parquet", [(1, 0, given[0], 100_000), (1, 1, given[1], 100_000)])
    given[0].add(4)
    given[1].add(99_995)
    table = pq.read_table(tmp_path / "h.parquet")
    assert table.column("complement_of").to_pylist() == [100_000, None]
    assert table.column("cardinality").to_pylist() == [99_997, 10]
    back = bitmap.BitmapCache(io).file("h.parquet")
    assert back[(1, 0)] == BitMap(range(100_000)) - few and back[(1, 1)] == BitMap(range(99_990, 100_000))
    cache = bitmap.BitmapCache(io)
    holes, universe = cache.holes(SegmentState(1, 0, 100_000, 100_000, "h.parquet", 99_997))
    assert (holes, universe) == (few, 100_000)
    holes.add(5)  # a copy the caller may change
    assert cache.holes(SegmentState(1, 0, 100_000, 100_000, "h.parquet", 99_997))[0] == few
    # Stored as valid offsets: the holes below the largest valid one, which bounds the universe.
    assert cache.holes(SegmentState(1, 1, 100_000, 100_000, "h.parquet", 10)) == (BitMap(range(99_990)), 100_000)
    assert cache.holes(SegmentState(1, 2, 7, 7, None, 4)) == (BitMap(), 4)


def test_a_data_file_tries_a_dictionary_on_the_columns_its_first_rows_repeat(tmp_path):
    """Columns whose first row group holds mostly distinct values are written without a dictionary (integers
    DELTA_BINARY_PACKED, the rest plain); the others, and every column of a file too small to judge, with a
    dictionary. Either way the rows read back as written."""
    io = LocalFileIO(str(tmp_path))
    n = 40_000
    schema = pa.schema([("id", pa.int64()), ("kind", pa.string()), ("note", pa.string()), ("_segment_offset", pa.int32())])
    rows = pa.table({"id": np.arange(n), "kind": [f"k{i % 7}" for i in range(n)], "note": [f"n{i}" for i in range(n)],
                     "_segment_offset": np.arange(n, dtype=np.int32)}, schema=schema)
    options = datafile.data_parquet_options(schema)
    for name, table in (("large.parquet", rows), ("small.parquet", rows.slice(0, 100))):
        writer = datafile.FileWriter(io, name, schema, "parquet", options)
        writer.write(table)
        writer.close()
        assert pq.read_table(tmp_path / name).equals(table)
    group = pq.ParquetFile(tmp_path / "large.parquet").metadata.row_group(0)
    dictionary = {group.column(i).path_in_schema: "RLE_DICTIONARY" in group.column(i).encodings for i in range(4)}
    assert dictionary == {"id": False, "kind": True, "note": False, "_segment_offset": False}
    packed = {group.column(i).path_in_schema: "DELTA_BINARY_PACKED" in group.column(i).encodings for i in range(4)}
    assert packed == {"id": True, "kind": False, "note": False, "_segment_offset": True}  # integers without one
    group = pq.ParquetFile(tmp_path / "small.parquet").metadata.row_group(0)
    assert ["RLE_DICTIONARY" in group.column(i).encodings for i in range(3)] == [True, True, True]


def test_a_dictionary_is_left_out_where_the_group_would_fill_its_page():
    """The distinct values of a row group are estimated from a sample of it: 200,000 values of 8 bytes in a 1M-row
    group would pass the writer's 1 MB dictionary page though they repeat 5 times each; 10,000 would not."""
    rng = np.random.default_rng(3)
    n = 1 << 20
    table = pa.table({"many": rng.integers(0, 200_000, n), "some": rng.integers(0, 10_000, n)})
    assert datafile._dictionary_columns(table, ["many", "some"]) == ["some"]
    for values in (50, 10_000, 200_000):
        drawn = len(np.unique(rng.integers(0, values, datafile._SAMPLE_ROWS)))
        assert 2 / 3 < datafile._values_drawn(drawn, datafile._SAMPLE_ROWS) / values < 3 / 2  # a few dozen repeats
    assert datafile._values_drawn(datafile._SAMPLE_ROWS, datafile._SAMPLE_ROWS) == float("inf")


# -- key store -----------------------------------------------------------------------------------


def test_latest_per_key_keeps_the_highest_version():
    t = pa.table({
        "id": [1, 2, 1, 3, 2],
        keystore.DELTA: [1, 1, 5, 2, 0],
        keystore.ROW_ID: [10, 20, 11, 30, 21],
        keystore.DELETED: [False, False, True, False, False],
        keystore.VERSION: [1, 1, 2, 1, 3],
    })
    out = keystore.latest_per_key(t, ["id"]).to_pylist()
    assert [(r["id"], r[keystore.ROW_ID], r[keystore.DELETED]) for r in out] == [(1, 11, True), (2, 21, False), (3, 30, False)]


def test_latest_per_key_with_composite_keys():
    t = pa.table({
        "a": [1, 1, 1], "b": ["x", "y", "x"],
        keystore.DELTA: [1, 1, 2], keystore.ROW_ID: [1, 2, 3], keystore.DELETED: [False] * 3, keystore.VERSION: [1, 1, 2],
    })
    out = keystore.latest_per_key(t, ["a", "b"]).to_pylist()
    assert [(r["a"], r["b"], r[keystore.ROW_ID]) for r in out] == [(1, "x", 3), (1, "y", 2)]


_NAMES = iter(range(1_000_000))


def _bf(rows, base=False):
    return BucketFile(0, f"f{next(_NAMES)}", rows, rows * 10, base)


def test_merge_plan_adds_increments_until_the_limit():
    files = [_bf(1000, base=True), _bf(10), _bf(10)]
    assert keystore.merge_plan(files, 10, max_increments=3, base_ratio=0.25) == []


def test_merge_plan_merges_small_increments_among_themselves():
    files = [_bf(1000, base=True), _bf(10), _bf(10), _bf(10)]
    assert keystore.merge_plan(files, 10, max_increments=3, base_ratio=0.25) == files[1:]


def test_merge_plan_merges_into_the_base_when_increments_are_large():
    files = [_bf(100, base=True), _bf(10), _bf(10), _bf(10)]
    assert keystore.merge_plan(files, 10, max_increments=3, base_ratio=0.25) == files


def test_merge_plan_weighs_increments_against_a_base_of_several_files():
    """A spilled load writes a bucket's base as a file a range of keys: increments of a quarter of one of them are a
    twenty-fourth of the base, merged among themselves (against the first file alone, a TPC-H SF 30 update of one day
    rewrote two whole buckets, 111 MB)."""
    base = [_bf(1000, base=True) for _ in range(6)]
    files = [*base, _bf(100), _bf(100), _bf(100)]
    assert keystore.merge_plan(files, 10, max_increments=3, base_ratio=0.25) == files[6:]
    files = [*base, _bf(600), _bf(600), _bf(600)]
    assert keystore.merge_plan(files, 10, max_increments=3, base_ratio=0.25) == files


def test_merge_plan_leaves_an_increment_larger_than_the_new_rows_gather():
    """Size tiers: the new rows take the newest increments while each holds at most twice what they gathered."""
    files = [_bf(10_000, base=True), _bf(2000), _bf(10), _bf(10)]
    assert keystore.merge_plan(files, 10, max_increments=3, base_ratio=0.25) == files[2:]
    files = [_bf(10_000, base=True), _bf(80), _bf(30), _bf(10)]
    assert keystore.merge_plan(files, 10, max_increments=3, base_ratio=0.25) == files[1:]  # 10 + 10, + 30, + 80


def test_merge_plan_past_the_limit_takes_the_adjacent_increments_cheapest_a_file_merged_away():
    files = [_bf(10_000, base=True), _bf(300), _bf(50), _bf(60), _bf(400)]
    assert keystore.merge_plan(files, 10, max_increments=4, base_ratio=0.25) == files[2:4]  # 120 rows: 60 a file
    assert keystore.merge_plan(files, 10, max_increments=3, base_ratio=0.25) == files[2:4]
    assert keystore.merge_plan(files, 10, max_increments=2, base_ratio=0.25) == files[1:4]


@pytest.mark.parametrize("turns", [True, False])
def test_merge_plan_rewrites_a_row_a_few_times_before_the_base(turns):
    """Many small commits into one bucket, after a large one: merges rewrite 6.5 rows a row added (36 without
    the bucket's turns, which writers always take), where merging every increment rewrote 313."""
    files, added, rewritten = [_bf(1_000_000, base=True), _bf(10_000)], 0, 0
    for version in range(3000):
        due = turns and keystore.merge_due(0, version, 8)
        merge = keystore.merge_plan(files, 10, max_increments=8, base_ratio=0.25, due=due)
        assert merge != files  # never reaches the base's ratio here
        rewritten += sum(f.rows for f in merge)
        added += 10
        files = [f for f in files if f not in merge] + [_bf(10 + sum(f.rows for f in merge))]
        assert len(files) <= 9
    assert rewritten <= (8 if turns else 40) * added


def test_merge_plan_merges_increments_early_when_the_buckets_turn_is_due():
    files = [_bf(1000, base=True), _bf(10), _bf(10)]
    assert keystore.merge_plan(files, 10, max_increments=4, base_ratio=0.25) == []
    assert keystore.merge_plan(files, 10, max_increments=4, base_ratio=0.25, due=True) == files[1:]
    assert keystore.merge_plan(files[:2], 10, max_increments=4, base_ratio=0.25, due=True) == []  # under half


def test_the_buckets_of_a_commit_take_turns_to_merge(tmp_path):
    """Commits writing to every bucket: a bucket merges once in max_increments commits, never all in one."""
    io = LocalFileIO(str(tmp_path))
    m = meta(properties={"keystore.max_increments": "4"})
    files: dict[int, list[BucketFile]] = {}
    merged_per_commit = []
    for version in range(1, 20):
        ids = list(range(8))
        rows = pa.table({"id": ids, keystore.DELTA: [version] * 8, keystore.ROW_ID: [version * 100 + i for i in ids],
                         keystore.DELETED: [False] * 8, keystore.VERSION: [version] * 8, keystore.BUCKET: ids})
        added, replaced = keystore.write_bucket_files(io, m, files, rows)
        merged_per_commit.append(sorted(b for b, fs in files.items() if any(f.path in replaced for f in fs)))
        for f in added:
            files[f.bucket] = [g for g in files.get(f.bucket, []) if g.path not in replaced] + [f]
        assert all(len(fs) <= 5 for fs in files.values())  # a base and at most max_increments increments
    for b, fs in files.items():
        entries = keystore.read_bucket(io, fs, m).to_pylist()
        assert [(e["id"], e[keystore.VERSION], e[keystore.ROW_ID]) for e in entries] == [(b, 19, 1900 + b)]
    # Never more than half the buckets in one commit (two reach the limit as two others' turn comes), and once
    # settled, the two buckets whose turn it is.
    assert max(len(m) for m in merged_per_commit) <= 4
    assert merged_per_commit[7:] == [[b for b in range(8) if (v + b) % 4 == 0] for v in range(8, 20)]


def test_bucket_files_are_written_as_base_then_increments_and_read_as_the_latest_entry(tmp_path):
    io = LocalFileIO(str(tmp_path))
    m = meta(properties={"keystore.max_increments": "1"})

    def rows(ids, version):
        return pa.table({"id": ids, keystore.DELTA: [version] * len(ids), keystore.ROW_ID: [i * 10 + version for i in ids],
                         keystore.DELETED: [False] * len(ids), keystore.VERSION: [version] * len(ids),
                         keystore.BUCKET: [0] * len(ids)})

    files: dict[int, list[BucketFile]] = {}
    for version, ids in [(1, [1, 2, 3]), (2, [2]), (3, [3, 4])]:
        added, replaced = keystore.write_bucket_files(io, m, files, rows(ids, version))
        files[0] = [f for f in files.get(0, []) if f.path not in replaced] + added
        if version == 1:
            assert [f.base for f in added] == [True] and replaced == []
        if version == 2:
            assert [f.base for f in added] == [False] and replaced == []
        if version == 3:  # a second increment exceeds max_increments=1; 2 + 1 rows >= 0.25 * 3: into the base
            assert [f.base for f in added] == [True] and len(replaced) == 2
    entries = keystore.read_bucket(io, files[0], m).to_pylist()
    assert [(e["id"], e[keystore.VERSION]) for e in entries] == [(1, 1), (2, 2), (3, 3), (4, 3)]


@pytest.mark.parametrize("at_once", [True, False])
def test_a_commits_rows_land_in_their_buckets_files_in_key_order(tmp_path, monkeypatch, at_once):
    """Small commits sort their rows by bucket at once, large ones find each bucket's rows on its thread and
    repeat a column of one value instead of gathering it: the same files either way."""
    if not at_once:
        monkeypatch.setattr(keystore, "AT_ONCE_ROWS", 0)
    io = LocalFileIO(str(tmp_path))
    m = meta()
    ids = np.random.default_rng(7).permutation(200)
    bucket_of = ids % 3 * 2  # buckets 0, 2 and 4; none in 1 and 3
    rows = pa.table({"id": ids, keystore.DELTA: np.zeros(200, np.int64), keystore.ROW_ID: ids * 10,
                     keystore.DELETED: ids % 7 == 0, keystore.VERSION: np.full(200, 5, np.int64),
                     keystore.BUCKET: bucket_of.astype(np.int32)})
    added, replaced = keystore.write_bucket_files(io, m, {}, rows)
    assert sorted(f.bucket for f in added) == [0, 2, 4] and replaced == []
    for f in added:
        got = keystore.read_bucket(io, [f], m).to_pylist()
        want = sorted(i for i in ids.tolist() if i % 3 * 2 == f.bucket)
        assert [e["id"] for e in got] == want and f.rows == len(want)
        assert all(e[keystore.ROW_ID] == e["id"] * 10 and e[keystore.DELETED] == (e["id"] % 7 == 0)
                   and e[keystore.DELTA] == 0 and e[keystore.VERSION] == 5 for e in got)


# -- the bucket hash: bitlake/format/bucket.py against the spec in its module docstring ---------------


def _spec_decimal_text(value: decimal.Decimal, scale: int) -> str:
    """Digits with exactly ``scale`` digits after the point, ``-`` for negatives (never an exponent)."""
    with decimal.localcontext() as ctx:
        ctx.prec = 100
        return format(value.quantize(decimal.Decimal(1).scaleb(-scale)), "f")


def _spec_encoding(value, t: pa.DataType) -> bytes:
    """One key column's value, encoded as the spec says, written independently of bitlake's numpy code."""
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_decimal(t):
        if pa.types.is_string(t):
            raw = value.encode("utf-8")
        elif pa.types.is_decimal(t):
            raw = _spec_decimal_text(value, t.scale).encode("ascii")
        else:
            raw = bytes(value)
        return struct.pack(">I", len(raw)) + raw
    if pa.types.is_boolean(t):
        n = 1 if value else 0
    elif pa.types.is_date(t):
        n = (value - dt.date(1970, 1, 1)).days
    elif pa.types.is_timestamp(t):
        d = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        n = (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds
    else:
        n = value
    return struct.pack(">q", n)


def _fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return h


def _fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) % 2**64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) % 2**64
    h ^= h >> 33
    return h


def _spec_bucket(values, types, num_buckets: int) -> int:
    encoding = b"".join(_spec_encoding(v, t) for v, t in zip(values, types, strict=True))
    return _fmix64(_fnv1a64(encoding)) % num_buckets


def _check_buckets(rows: list[tuple], types: list[pa.DataType], num_buckets: int) -> None:
    table = pa.table({f"c{i}": pa.array([r[i] for r in rows], t) for i, t in enumerate(types)})
    got = bucket.buckets(table, list(table.column_names), num_buckets).tolist()
    assert got == [_spec_bucket(r, types, num_buckets) for r in rows]


KEY_TYPES = {
    "int8": (pa.int8(), st.integers(-128, 127)),
    "int16": (pa.int16(), st.integers(-(2**15), 2**15 - 1)),
    "int32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "bool": (pa.bool_(), st.booleans()),
    "date": (pa.date32(), st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31))),
    "timestamp": (pa.timestamp("us", tz="UTC"), st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30),
                                                             timezones=st.just(dt.UTC))),
    "string": (pa.string(), st.one_of(st.text(max_size=40), st.sampled_from(["", "é", "日本語", "😀", "a\x00b"]))),
    "binary": (pa.binary(), st.binary(max_size=40)),
    "decimal": (pa.decimal128(10, 2), st.decimals(-(10**8) + 1, 10**8 - 1, places=2, allow_nan=False,
                                                  allow_infinity=False)),
}


@pytest.mark.parametrize("kinds", [[k] for k in KEY_TYPES] + [
    ["int64", "string"], ["string", "binary"], ["date", "decimal"], ["bool", "timestamp"], ["int8", "int32"]])
def test_the_bucket_hash_is_the_specified_one(kinds):
    types = [KEY_TYPES[k][0] for k in kinds]

    @settings(max_examples=40, deadline=None)
    @given(st.lists(st.tuples(*[KEY_TYPES[k][1] for k in kinds]), min_size=1, max_size=30), st.integers(1, 65536))
    def check(rows, num_buckets):
        _check_buckets(rows, types, num_buckets)

    check()


def test_the_bucket_hash_of_unicode_empty_and_prefix_sharing_values():
    strings = ["", "é", "e\u0301", "日本語", "😀", "a\x00b", "x" * 300]
    _check_buckets([(s,) for s in strings], [pa.string()], 1 << 16)
    _check_buckets([(b"",), (b"\x00",), (b"\xff" * 40,)], [pa.binary()], 1 << 16)
    # The length prefix keeps ("ab", "c") and ("a", "bc") apart.
    pairs = [("ab", "c"), ("a", "bc"), ("", "abc"), ("abc", "")]
    _check_buckets(pairs, [pa.string(), pa.string()], 1 << 16)
    table = pa.table({"a": [p[0] for p in pairs], "b": [p[1] for p in pairs]})
    assert len(set(bucket.key_hash(table, ["a", "b"]).tolist())) == len(pairs)


def test_the_bucket_hash_does_not_depend_on_chunking_or_slicing():
    t = pa.table({"s": pa.array(["a", "bb", "", "é", "xyz"] * 3), "i": pa.array(range(15), pa.int64())})
    full = bucket.buckets(t, ["s", "i"], 97)
    assert full.tolist() == [_spec_bucket(r, [pa.string(), pa.int64()], 97)
                             for r in zip(t.column("s").to_pylist(), t.column("i").to_pylist(), strict=True)]
    assert bucket.buckets(t.slice(5), ["s", "i"], 97).tolist() == full[5:].tolist()
    assert bucket.buckets(pa.concat_tables([t.slice(0, 4), t.slice(4)]), ["s", "i"], 97).tolist() == full.tolist()
    assert bucket.buckets(t.to_batches()[0].slice(3, 7), ["s", "i"], 97).tolist() == full[3:10].tolist()


def test_the_bucket_hash_of_decimals_with_a_large_scale_is_the_specified_one():
    values = ["0", "1E-10", "-5E-10", "0.0000001", "0.000001", "1.5", "-12345.0000000001"]
    _check_buckets([(decimal.Decimal(v),) for v in values], [pa.decimal128(20, 10)], 1 << 16)


def test_the_spec_example_and_the_spread_of_buckets():
    one = pa.table({"k": pa.array([1], pa.int64())})
    assert _spec_encoding(1, pa.int64()) == bytes.fromhex("0000000000000001")
    assert bucket.key_hash(one, ["k"]).tolist() == [_fmix64(_fnv1a64(bytes.fromhex("0000000000000001")))]
    assert bucket.buckets(one, ["k"], 16).tolist() == [7]  # golden: fmix64(FNV-1a-64(00..01)) mod 16
    n, num_buckets = 10_000, 16
    for keys in (pa.array(range(n), pa.int64()), pa.array([f"key-{i}" for i in range(n)])):
        counts = np.bincount(bucket.buckets(pa.table({"k": keys}), ["k"], num_buckets), minlength=num_buckets)
        assert counts.sum() == n and counts.max() <= 2 * n / num_buckets


# -- partition folders ---------------------------------------------------------------------------


def test_partition_folders_escape_as_specified():
    assert layout.partition_dir({"c": "a/b"}) == "c=a%2Fb"
    assert layout.partition_dir({"c": "é"}) == "c=%C3%A9"
    assert layout.partition_dir({"c": "x y"}) == "c=x y"
    assert layout.partition_dir({"c": None}) == "c=__HIVE_DEFAULT_PARTITION__"
    assert layout.partition_dir({"a/b": "x y/é", "n": None}) == "a%2Fb=x y%2F%C3%A9/n=__HIVE_DEFAULT_PARTITION__"
    assert layout.partition_dir({"c": "k=v%"}) == "c=k%3Dv%25"
    assert layout.escape("A-z_0.9~") == "A-z_0.9~"
    assert layout.data_file_path("00000001-00000-x", {"c": "a/b"}, "parquet") == "data/c=a%2Fb/00000001-00000-x.parquet"
    assert layout.data_file_path("00000001-00000-x", None, "orc") == "data/00000001-00000-x.orc"


def test_partition_values_render_as_specified():
    assert layout.partition_text(None) is None
    assert layout.partition_text(True) == "true" and layout.partition_text(False) == "false"
    assert layout.partition_text(dt.date(2024, 1, 2)) == "2024-01-02"
    assert layout.partition_text(dt.datetime(2024, 1, 2, 3, 4, 5)) == "2024-01-02 03:04:05"
    assert layout.partition_text(dt.datetime(2024, 1, 2, 3, 4, 5, 6)) == "2024-01-02 03:04:05.000006"
    assert layout.partition_text(dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)) == "2024-01-02 03:04:05+00:00"
    plus2 = dt.timezone(dt.timedelta(hours=2))
    assert layout.partition_text(dt.datetime(2024, 1, 2, 3, 4, 5, 60, tzinfo=plus2)) == "2024-01-02 03:04:05.000060+02:00"
    assert layout.partition_text(decimal.Decimal("1.10")) == "1.10"
    assert layout.partition_text(decimal.Decimal("-0.05")) == "-0.05"
    assert layout.partition_text(decimal.Decimal("12")) == "12"
    assert layout.partition_text(decimal.Decimal("1E-10")) == "0.0000000001"
    assert layout.partition_text(7) == "7" and layout.partition_text("x") == "x"
    with pytest.raises(TypeError):
        layout.partition_text(b"x")


# -- commit files ----------------------------------------------------------------------------------


def _create(io, m: TableMetadata | None = None, protocol: Protocol | None = None) -> Commit:
    c = Commit(0, CREATE, 1, protocol=protocol or Protocol(), metadata=(m or meta()).to_json())
    commitlog.write(io, c)
    return c


def _data(part: int, rows: int = 3) -> DataFile:
    return DataFile(f"data/{part:08d}-00000-x.parquet", rows, 100, None, (SegmentRows(part, 0, rows),))


def _keys(part: int) -> tuple[KeysFile, ...]:
    return (KeysFile(f"_bitlake/keys/{part:08d}-00000-x.parquet", 0, 3, 9),)


def _land(version: int, batch_id: str, part: int) -> Commit:
    record = BatchRecord(batch_id, part, "pending", 3, _keys(part))
    return Commit(version, LAND, version + 1, batches=(record,), add_files=(_data(part),))


def _full_commit(version: int) -> Commit:
    """A commit with every action."""
    return Commit(
        version, INGEST, 1_700_000_000_000 + version, parameters={"batch_id": "a", "note": "naïve ☃", "ratio": 0.25},
        protocol=Protocol().with_features(TOMBSTONES),
        metadata=meta(name="café").evolve(properties={"checkpoint.interval": "5"}).to_json(),
        batches=(BatchRecord("a", 1, "replaced"), BatchRecord("a", 2, "live", 3, _keys(2))),
        add_files=(DataFile("data/v=x/00000002-00000-x.parquet", 3, 100, {"v": "x"}, (SegmentRows(2, 0, 2), SegmentRows(2, 1, 1))),),
        remove_files=(_data(1).path,),
        segments=(SegmentState(2, 0, 3, 2, "_bitlake/bitmaps/b.parquet", 1), SegmentState(2, 1, 1, 1, None, 1)),
        logs=(LogFile("_bitlake/logs/l.parquet", 4, 99, -5, DELTA_INFINITY, resets=True),
              LogFile("_bitlake/logs/m.parquet", 1, 10, 3, 3)),
        keystore_add=(BucketFile(3, "_bitlake/keystore/bucket-00003/k.parquet", 1, 2, True),),
        keystore_remove=("_bitlake/keystore/bucket-00003/old.parquet",),
        tombstones=(Tombstone("v", "_bitlake/tombstones/t.parquet", 2),),
        counts={"inserted": 2, "updated": 1}, batch_counts={"a": {"inserted": 2, "updated": 1}},
        events=({"table": "café", "partition": ["x"], "snapshot_id": str(version), "prev_snapshot_id": None},),
    )


def test_commit_version_is_taken_once(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    commitlog.write(io, _land(1, "a", 1))
    with pytest.raises(FileExistsError):
        commitlog.write(io, _land(1, "b", 2))
    assert commitlog.read(io, 1).batches[0].batch_id == "a"
    assert commitlog.list_versions(io) == [0, 1] and commitlog.exists(io, 1) and not commitlog.exists(io, 2)


def test_commit_round_trips(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    c = Commit(1, METAGEN, 5, batches=(BatchRecord("a", 1, "live"),),
               segments=(SegmentState(1, 0, 3, 3, "_bitlake/bitmaps/x", 2),), keystore_add=(BucketFile(3, "k", 1, 2, True),),
               counts={"inserted": 2}, batch_counts={"a": {"inserted": 2}})
    commitlog.write(io, c)
    assert commitlog.read(io, 1) == c
    full = _full_commit(2)
    commitlog.write(io, full)
    assert commitlog.read(io, 2) == full
    assert Commit.from_json(json.loads(json.dumps(full.to_json()))) == full


def test_the_commit_file_is_the_envelope_around_the_body_bytes(tmp_path):
    io = LocalFileIO(str(tmp_path))
    for c in (_create(io), _full_commit(1)):
        if c.version:
            commitlog.write(io, c)
        data = (tmp_path / layout.commit_path(c.version)).read_bytes()
        body = json.dumps(c.to_json(), sort_keys=True, separators=(",", ":")).encode()  # what bitlake writes
        assert data == b'{"crc32":%d,"body":%s}' % (zlib.crc32(body), body)
        assert data.isascii() and json.loads(body)["format_version"] == 2


def test_flipping_a_byte_of_the_body_is_a_corrupt_commit(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    path = tmp_path / layout.commit_path(0)
    data = path.read_bytes()
    start = data.index(b',"body":') + len(b',"body":')
    for i in (start, start + 1, (start + len(data)) // 2, len(data) - 2):  # B is data[start:-1]
        flipped = bytearray(data)
        flipped[i] ^= 0x01
        path.write_bytes(bytes(flipped))
        with pytest.raises(CorruptTableError, match="checksum"):
            commitlog.read(io, 0)
    # Any single-byte change anywhere in the file is refused as corrupt, never parsed as a commit.
    for i in range(len(data)):
        for mask in (0x01, 0x20, 0x80):
            flipped = bytearray(data)
            flipped[i] ^= mask
            with pytest.raises(CorruptTableError):
                commitlog.decode(bytes(flipped), "commit 0")
    with pytest.raises(CorruptTableError):
        commitlog.decode(data[:-1], "commit 0")  # truncated


@pytest.mark.parametrize("format_version", [3, 0, None, "2"])
def test_a_body_of_another_format_version_is_refused(tmp_path, format_version):
    io = LocalFileIO(str(tmp_path))
    body = Commit(0, CREATE, 1, protocol=Protocol(), metadata=meta().to_json()).to_json()
    body["format_version"] = format_version
    io.put_if_absent(layout.commit_path(0), commitlog.encode(body))
    with pytest.raises(UnsupportedFormatVersionError, match=f"format version {format_version!r}"):
        commitlog.read(io, 0)
    with pytest.raises(UnsupportedFormatVersionError):
        load(io)


def _reversed_keys(value):
    if isinstance(value, dict):
        return {k: _reversed_keys(value[k]) for k in sorted(value, reverse=True)}
    if isinstance(value, list):
        return [_reversed_keys(v) for v in value]
    return value


def test_a_body_serialised_by_another_json_writer_is_accepted(tmp_path):
    """The checksum is over the bytes B as written, not over a canonical form: any JSON writer will do."""
    io = LocalFileIO(str(tmp_path))
    m = meta(name="tablé ☃")
    c0 = Commit(0, CREATE, 1, protocol=Protocol(), metadata=m.to_json())
    c1 = _full_commit(1)
    for c in (c0, c1):
        body = json.dumps(_reversed_keys(c.to_json()), indent=2, ensure_ascii=False).encode("utf-8")
        assert not body.isascii() and body != json.dumps(c.to_json(), sort_keys=True, separators=(",", ":")).encode()
        io.put_if_absent(layout.commit_path(c.version), b'{"crc32":%d,"body":%s}' % (zlib.crc32(body), body))
        assert commitlog.read(io, c.version) == c
    assert load(io, 0).metadata == m and load(io).version == 1


class _V1Reader:
    """What bitlake 0.1.0 (format v1) did with a commit file (its commitlog.decode and Commit.from_json)."""

    FORMAT_VERSION = 1

    @classmethod
    def read(cls, data: bytes) -> dict:
        doc = json.loads(data)
        body = doc["body"]
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        if zlib.crc32(canonical.encode()) != doc["crc32"]:
            raise CorruptTableError("fails its checksum")
        if body.get("format_version", 0) > cls.FORMAT_VERSION:
            raise UnsupportedFormatVersionError(f"format version {body['format_version']}: upgrade bitlake")
        return body


def test_a_format_v1_reader_verifies_a_v2_commit_and_refuses_it_by_version(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io, meta(name="café ☃"))
    commitlog.write(io, _full_commit(1))
    for version in (0, 1):
        data = (tmp_path / layout.commit_path(version)).read_bytes()
        doc = json.loads(data)
        canonical = json.dumps(doc["body"], sort_keys=True, separators=(",", ":"))
        assert zlib.crc32(canonical.encode()) == doc["crc32"]  # the checksum passes in bitlake 0.1
        assert doc["body"]["format_version"] == 2
        with pytest.raises(UnsupportedFormatVersionError, match="format version 2"):
            _V1Reader.read(data)
    # The reproduction is faithful: it reads the v1 files bitlake 0.1 wrote.
    for path in sorted((FIXTURES / "keyed" / "_bitlake" / "commits").iterdir()):
        assert _V1Reader.read(path.read_bytes())["format_version"] == 1


# -- protocol ------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol, message", [
    (Protocol(reader_features=("deletionVectors",)), "read features \\['deletionVectors'\\]"),
    (Protocol(reader_features=(TOMBSTONES, "deletionVectors", "rowTracking")),
     "read features \\['deletionVectors', 'rowTracking'\\]"),
    (Protocol(reader_version=3), "to read, format version 3"),
    (Protocol(reader_version=3, reader_features=("rowTracking",)),
     "to read, format version 3 .* and the read features \\['rowTracking'\\]"),
])
def test_a_reader_refuses_exactly_what_it_lacks(tmp_path, protocol, message):
    io = LocalFileIO(str(tmp_path))
    _create(io, protocol=protocol)
    with pytest.raises(UnsupportedFormatVersionError, match=message):
        load(io)


def test_a_protocol_raised_by_a_later_commit_is_refused(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    commitlog.write(io, Commit(1, SET_METADATA, 2, protocol=Protocol(reader_features=("deletionVectors",))))
    assert load(io, 0).version == 0
    with pytest.raises(UnsupportedFormatVersionError, match="deletionVectors"):
        load(io)


def test_an_unknown_writer_feature_leaves_the_table_readable_but_not_writable(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io, protocol=Protocol(writer_features=("clustering",)))
    state = load(io)
    state.protocol.check_read(io.uri())
    with pytest.raises(UnsupportedFormatVersionError, match="write features \\['clustering'\\]"):
        state.protocol.check_write(io.uri())
    with pytest.raises(UnsupportedFormatVersionError, match="to write, format version 3"):
        Protocol(writer_version=3).check_write("t")
    Protocol().with_features(TOMBSTONES).check_write("t")
    Protocol().with_features(TOMBSTONES).check_read("t")


def test_an_unknown_reader_feature_is_refused_before_the_commits_that_use_it_are_parsed(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io, protocol=Protocol(reader_features=("rowLineage",)))
    body = Commit(1, METAGEN, 2, segments=(SegmentState(1, 0, 3, 3),)).to_json()
    body["segments"][0]["lineage"] = "_bitlake/lineage/x.parquet"  # what the unknown feature adds
    io.put_if_absent(layout.commit_path(1), commitlog.encode(body))
    with pytest.raises(UnsupportedFormatVersionError, match="rowLineage"):
        load(io)


# -- state and replay ----------------------------------------------------------------------------


def test_state_replays_land_then_metagen(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    commitlog.write(io, _land(1, "a", 1))
    commitlog.write(io, _land(2, "b", 2))
    s = load(io)
    assert [b.batch_id for b in s.pending] == ["a", "b"] and s.max_part == 2
    assert [(s.batch(b).status, s.batch(b).landed_version, s.batch(b).live_version) for b in "ab"] == [
        ("pending", 1, None), ("pending", 2, None)]
    assert s.batch("a").keys_files == _keys(1) and s.batch("a").records == 3
    assert s.segments == {}  # pending: no segment state, so no view reads their files
    commitlog.write(io, Commit(3, METAGEN, 9, batches=(BatchRecord("a", 1, "live"), BatchRecord("b", 2, "live"))))
    s = load(io)
    assert s.pending == [] and len(s.data_files()) == 2
    assert [(s.batch(b).status, s.batch(b).landed_version, s.batch(b).live_version) for b in "ab"] == [
        ("live", 1, 3), ("live", 2, 3)]
    assert load(io, 1).version == 1 and [b.batch_id for b in load(io, 1).pending] == ["a"]
    assert s.batch("never") is None


def test_batch_statuses_replay_through_ingest_metagen_and_revert(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    commitlog.write(io, _land(1, "a", 1))
    commitlog.write(io, _land(2, "b", 2))
    commitlog.write(io, Commit(3, METAGEN, 4, batches=(BatchRecord("b", 2, "live"),)))
    s = load(io)
    assert [b.batch_id for b in s.pending] == ["a"] and (s.batch("b").status, s.batch("b").live_version) == ("live", 3)
    commitlog.write(io, Commit(4, INGEST, 5, batches=(BatchRecord("c", 3, "live", 3, _keys(3)),), add_files=(_data(3),)))
    commitlog.write(io, Commit(5, METAGEN, 6, batches=(BatchRecord("a", 1, "reverted"),)))
    s = load(io)
    assert s.pending == [] and s.max_part == 3
    assert {b: (s.batch(b).status, s.batch(b).landed_version, s.batch(b).live_version) for b in "abc"} == {
        "a": ("reverted", 1, None), "b": ("live", 2, 3), "c": ("live", 4, 4)}
    assert s.batches == {"a": 1, "b": 2, "c": 3}


def test_a_replaced_incarnation_leaves_the_new_one_current_and_files_can_be_removed(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    commitlog.write(io, Commit(1, INGEST, 2, batches=(BatchRecord("a", 1, "live", 3, ()),), add_files=(_data(1),)))
    commitlog.write(io, Commit(2, INGEST, 3, batches=(BatchRecord("a", 1, "replaced"), BatchRecord("a", 2, "live", 3, ())),
                               add_files=(_data(2),), remove_files=(_data(1).path,)))
    s = load(io)
    assert s.batch("a").part == 2 and s.batch("a").live_version == 2 and s.parts[1].status == "replaced"
    assert [f.path for f in s.data_files()] == [_data(2).path]
    assert [f.path for f in load(io, 1).data_files()] == [_data(1).path]
    # The order of the two records in the commit does not matter: a "replaced" record never becomes current.
    commitlog.write(io, Commit(3, INGEST, 4, batches=(BatchRecord("a", 3, "live", 3, ()), BatchRecord("a", 2, "replaced"))))
    s = load(io)
    assert s.batch("a").part == 3 and s.parts[2].status == "replaced" and s.max_part == 3


def test_metadata_changes_in_a_later_commit(tmp_path):
    io = LocalFileIO(str(tmp_path))
    m = meta()
    _create(io, m)
    evolved = m.evolve(properties={"checkpoint.interval": "5"}, add_columns=pa.schema([("x", pa.float64())]))
    commitlog.write(io, Commit(1, SET_METADATA, 2, metadata=evolved.to_json()))
    assert load(io).metadata == evolved and load(io, 0).metadata == m
    assert load(io).metadata.column_names == ["id", "v", "mod", "x"]


def _history(io) -> None:
    """A table with every kind of action across versions 0 to 6."""
    m = meta()
    _create(io, m)
    commitlog.write(io, _land(1, "a", 1))
    commitlog.write(io, Commit(2, METAGEN, 3, batches=(BatchRecord("a", 1, "live"),),
                               segments=(SegmentState(1, 0, 3, 3, None, 3),),
                               keystore_add=(BucketFile(0, "ks/0a", 2, 9, True), BucketFile(1, "ks/1a", 1, 9, True)),
                               counts={"inserted": 3}, events=({"snapshot_id": "2"},)))
    commitlog.write(io, Commit(3, INGEST, 4, batches=(BatchRecord("b", 2, "live", 3, _keys(2)),), add_files=(_data(2),),
                               segments=(SegmentState(1, 0, 3, 3, "bm/1", 2), SegmentState(2, 0, 3, 3, None, 3)),
                               logs=(LogFile("logs/1", 1, 9, 5, 5),), keystore_add=(BucketFile(0, "ks/0b", 1, 9, False),)))
    commitlog.write(io, Commit(4, SET_METADATA, 5, metadata=m.evolve(properties={"checkpoint.interval": "3"}).to_json()))
    commitlog.write(io, Commit(5, INGEST, 6, protocol=Protocol().with_features(TOMBSTONES),
                               batches=(BatchRecord("c", 3, "live", 3, _keys(3)),), add_files=(_data(3),),
                               keystore_remove=("ks/0a", "ks/0b"), tombstones=(Tombstone("v", "tomb/1", 1),),
                               events=({"snapshot_id": "5"},)))
    commitlog.write(io, Commit(6, INGEST, 7, batches=(BatchRecord("a", 1, "replaced"), BatchRecord("a", 4, "live", 3, ())),
                               add_files=(_data(4),), remove_files=(_data(1).path,),
                               logs=(LogFile("logs/2", 2, 9, 1, DELTA_INFINITY, resets=True),),
                               keystore_add=(BucketFile(0, "ks/0c", 3, 9, True),)))


def _semantic(state: TableState) -> dict:
    """A state's JSON with the key-store files grouped by bucket: the order of files within a bucket is part of
    the state, the order of the buckets is not (a bucket emptied by keystore_remove stays in a replayed
    state's dict but is absent from one loaded from a checkpoint, so a file added to it later lists elsewhere)."""
    d = state.to_json()
    d["keystore"] = sorted(d["keystore"], key=lambda f: f["bucket"])
    return d


def test_checkpoint_gives_the_same_state_as_replay(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _history(io)
    replayed = [_semantic(load(io, v)) for v in range(7)]
    assert replayed[6]["last_event_version"] == 5 and replayed[6]["current"]["a"] == 4
    assert [f["path"] for f in replayed[5]["keystore"]] == ["ks/1a"]
    assert [f["path"] for f in replayed[6]["keystore"]] == ["ks/0c", "ks/1a"]
    for k in range(1, 7):
        for name in io.listdir(layout.CHECKPOINTS_DIR):
            io.delete(f"{layout.CHECKPOINTS_DIR}/{name}")
        write_checkpoint(io, load(io, k))
        assert _semantic(TableState.from_json(
            commitlog.decode(io.read_bytes(layout.checkpoint_path(k)), "checkpoint"))) == replayed[k]
        for v in range(7):  # versions before the checkpoint replay from commit 0, later ones from it
            assert _semantic(load(io, v)) == replayed[v]
    state = load(io)
    assert TableState.from_json(json.loads(json.dumps(state.to_json()))).to_json() == state.to_json()


def test_a_checkpoint_is_used_instead_of_the_commits_before_it(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _history(io)
    write_checkpoint(io, load(io, 4))
    io.delete(layout.commit_path(2))  # not needed to load versions >= 4 any more
    assert load(io).version == 6 and load(io, 4).version == 4
    with pytest.raises(FileNotFoundError):
        load(io, 3)


def test_missing_versions_and_paths_are_clear_errors(tmp_path):
    with pytest.raises(TableNotFoundError):
        load(LocalFileIO(str(tmp_path / "nope")))
    with pytest.raises(NotATableError):
        load(LocalFileIO(str(tmp_path)))
    io = LocalFileIO(str(tmp_path))
    _create(io)
    with pytest.raises(VersionNotFoundError, match="versions 0 to 0"):
        load(io, 3)
    with pytest.raises(VersionNotFoundError):
        load(io, -1)
    with pytest.raises(NotATableError):
        from bitlake.format.state import initial

        initial(io, Commit(0, CREATE, 1))


def test_unsupported_scheme_is_refused(tmp_path):
    with pytest.raises(bitlake.InvalidInputError, match="unsupported storage scheme"):
        file_io("hdfs://namenode/table")
    assert file_io(str(tmp_path)) == LocalFileIO(str(tmp_path)) == file_io("file://" + str(tmp_path))


def test_state_does_not_skip_versions():
    s = TableState(Protocol(), meta())
    with pytest.raises(VersionNotFoundError):
        s.applied(_land(2, "a", 1))
    s = s.applied(_land(1, "a", 1))
    with pytest.raises(VersionNotFoundError):
        s.applied(_land(1, "b", 2))


# -- metadata ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(primary_key=("nope",)), "primary key column 'nope'"),
        (dict(delta_column="nope"), "delta column 'nope'"),
        (dict(delta_column="v"), "delta column 'v' has type string"),
        (dict(delta_column=None), "needs both"),
        (dict(primary_key=()), "needs both"),
        (dict(file_format="csv"), "file_format"),
        (dict(num_buckets=0), "num_buckets"),
        (dict(num_buckets=65537), "num_buckets"),
        (dict(partition_by=("x",)), "partition column 'x'"),
        (dict(schema=SCHEMA.append(pa.field("f", pa.float64())), partition_by=("f",)), "cannot partition"),
        (dict(partition_by=("mod",)), "delta column 'mod' cannot partition"),
        (dict(primary_key=(), delta_column=None, partition_by=tuple(SCHEMA.names)), "leaves no column"),
        (dict(properties={"nope": "1"}), "unknown table property"),
        (dict(properties={"checkpoint.interval": "often"}), "must be a whole number"),
        (dict(name=""), "non-empty name"),
        (dict(name="  "), "non-empty name"),
        (dict(schema=pa.schema([("id", pa.int64()), ("_segment_part", pa.int32()), ("mod", pa.int64())])), "reserved"),
        (dict(schema=pa.schema([("id", pa.int64()), ("_change_type", pa.string()), ("mod", pa.int64())])), "reserved"),
        (dict(schema=pa.schema([("id", pa.int64()), ("ID", pa.int32()), ("mod", pa.int64())])), "more than once"),
        (dict(schema=pa.schema([("id", pa.float64()), ("mod", pa.int64())])), "cannot be a key"),
    ],
)
def test_bad_table_definitions_are_refused(kw, message):
    with pytest.raises(InvalidInputError, match=message):
        meta(**kw).validate()


def test_good_table_definitions_validate():
    meta().validate()
    TableMetadata(SCHEMA, (), None, name="unkeyed").validate()
    schema = pa.schema([("d", pa.decimal128(10, 2)), ("t", pa.timestamp("us", tz="UTC")), ("b", pa.binary()),
                        ("day", pa.date32()), ("flag", pa.bool_())])
    TableMetadata(schema, ("d", "b", "flag"), "t", partition_by=("day",), name="k").validate()


def test_metadata_round_trips():
    m = meta(partition_by=("v",), num_buckets=7, properties={"keystore.max_increments": "3"}, name="café ☃")
    assert TableMetadata.from_json(json.loads(json.dumps(m.to_json()))) == m
    assert TableMetadata.from_json(commitlog.decode(commitlog.encode(m.to_json()), "m")) == m
    typed = TableMetadata(pa.schema([("d", pa.decimal128(10, 2)), ("t", pa.timestamp("us", tz="UTC")),
                                     pa.field("n", pa.int32(), nullable=False), ("day", pa.date32())]),
                          ("d",), "t", name="typed")
    back = TableMetadata.from_json(json.loads(json.dumps(typed.to_json())))
    assert back == typed and back.schema.field("n").nullable is False
    assert [c["name"] for c in typed.to_json()["columns"]] == ["d", "t", "n", "day"]


def test_metadata_evolves_by_properties_and_nullable_columns_only():
    base = meta()
    m = base.evolve(add_columns=pa.schema([("x", pa.float64())]), properties={"checkpoint.interval": "7"})
    assert m.column_names == ["id", "v", "mod", "x"] and m.properties == {"checkpoint.interval": "7"}
    assert (m.table_id, m.name, m.primary_key, m.delta_column) == (base.table_id, base.name, base.primary_key, base.delta_column)
    assert base.column_names == ["id", "v", "mod"]  # evolve returns a new metadata
    assert m.evolve(properties={"checkpoint.interval": ""}).properties == {}
    # Added columns are normalised to what both engines store.
    ns = m.evolve(add_columns=pa.schema([("ts", pa.timestamp("ns")), ("s", pa.large_string())]))
    assert ns.schema.field("ts").type == pa.timestamp("us") and ns.schema.field("s").type == pa.string()
    with pytest.raises(SchemaMismatchError, match="must be nullable"):
        m.evolve(add_columns=pa.schema([pa.field("y", pa.int64(), nullable=False)]))
    with pytest.raises(SchemaMismatchError, match="already exists"):
        m.evolve(add_columns=pa.schema([("ID", pa.int64())]))
    with pytest.raises(SchemaMismatchError, match="already exists"):
        m.evolve(add_columns=pa.schema([("x", pa.float64())]))
    with pytest.raises(InvalidInputError, match="unknown table property"):
        m.evolve(properties={"nope": "1"})


def test_delta_values_normalise_to_int64():
    ts = pa.timestamp("us", tz="UTC")
    assert delta_to_int(42, pa.int64()) == 42
    assert delta_to_int("1970-01-01T00:00:01Z", ts) == 1_000_000
    assert delta_to_int(dt.datetime(1970, 1, 1, 0, 0, 2, tzinfo=dt.UTC), ts) == 2_000_000
    assert delta_to_int(dt.datetime(1970, 1, 1, 0, 0, 2), pa.timestamp("us")) == 2_000_000  # naive reads as UTC
    assert delta_to_int(dt.datetime(1970, 1, 1, 2, tzinfo=dt.timezone(dt.timedelta(hours=2))), ts) == 0
    assert delta_to_int(dt.datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=dt.UTC), ts) == -1
    assert delta_to_int(dt.date(1970, 1, 2), pa.date32()) == 86_400_000_000
    assert delta_to_int(1.5, ts) == 1_500_000
    with pytest.raises(InvalidInputError):
        delta_to_int("x", pa.int64())
    with pytest.raises(InvalidInputError):
        delta_to_int(True, pa.int64())
    with pytest.raises(InvalidInputError):
        delta_to_int("not a time", ts)


# -- change events ---------------------------------------------------------------------------------


def test_change_events_name_the_partitions_whose_rows_changed(tmp_path, monkeypatch):
    """One event per partition holding a row the commit made valid or invalidated: a batch's segment spans
    partitions, and an update of one partition's row, a stale record or a compacted file of another partition
    is no reason for an event there."""
    import bitlake
    from bitlake import changeevent
    from bitlake.format import commitlog

    schema = pa.schema([("id", pa.int64()), ("region", pa.string()), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id"], delta_column="mod",
                             partition_by=["region"], name="shop.t", properties={"compact.min_input_files": "2"})

    def ingest(ids, regions, mods) -> list:
        before = t.version
        t.ingest(pa.table({"id": ids, "region": regions, "mod": mods}, schema=schema))
        assert t.version == before + 1
        return [e["partition"] for e in commitlog.read(t.io, t.version).events]

    assert ingest([1, 2, 3], ["eu", "us", "ap"], [1, 1, 1]) == [["ap"], ["eu"], ["us"]]  # one segment, three files
    assert ingest([1, 3], ["eu", "ap"], [2, 0]) == [["eu"]]  # 3's record is stale
    assert ingest([2], ["ap"], [3]) == [["ap"], ["us"]]  # a row moving partitions touches both
    assert ingest([3], ["ap"], [0]) == []  # only a stale record: no event
    monkeypatch.setattr(changeevent, "READ_BUDGET_ROWS", 0)  # no file read: more events, never fewer
    assert ingest([3], ["ap"], [5]) == [["ap"], ["eu"], ["us"]]
    monkeypatch.undo()
    assert ingest([4], ["eu"], [1]) == [["eu"]]  # a third file in eu: compacting it leaves fewer files
    t.compact()
    assert len({f.partition["region"] for f in t.state().data_files() if f.offsets}) >= 2
    assert ingest([1], ["eu"], [4]) == [["eu"]]  # compacted files: their offsets files say which rows they hold
    events = commitlog.read(t.io, t.version).events
    assert {e["operation_type"] for e in events} == {"UPDATE"} and {e["table"] for e in events} == {"shop.t"}
    assert {e["table_format"] for e in events} == {"BITLAKE"} and set(events[0]["tags"]) == {"batch_ids"}
    assert events[0]["snapshot_id"] == str(t.version) and events[0]["prev_snapshot_id"] == str(t.version - 2)  # the compaction: none
    assert changeevent.operation_type({"inserted": 3}) == "APPEND"
    assert changeevent.operation_type({"deleted": 1}) == "DELETE"
    unpartitioned = changeevent.commit_events(t.io, "t", TableState(Protocol(), meta()), 1, 0, [], [],
                                              {"inserted": 1})
    assert [e["partition"] for e in unpartitioned] == [None] and unpartitioned[0]["prev_snapshot_id"] is None
    assert changeevent.commit_events(t.io, "t", TableState(Protocol(), meta()), 1, 0, [], [],
                                     {"inserted": 0, "stale": 2, "ignored_deletes": 1}) == []  # no row changed


def test_the_previous_snapshot_of_an_event_is_the_last_commit_with_events():
    state = TableState(Protocol(), meta()).applied(Commit(1, INGEST, 1, events=({"snapshot_id": "1"},)),
                                                   Commit(2, INGEST, 2))  # the second touched no partition
    assert (state.last_event_version, state.version) == (1, 2)
    assert TableState.from_json(json.loads(json.dumps(state.to_json()))).last_event_version == 1


# -- segment logs ----------------------------------------------------------------------------------


def _events(n: int, kinds: np.ndarray, t=5) -> pa.Table:
    offsets = np.arange(n, dtype=np.int32)
    return pa.table({rowid.PART_COLUMN: np.zeros(n, np.int32), rowid.SEQ_COLUMN: (offsets % 2).astype(np.int32),
                     rowid.OFFSET_COLUMN: offsets[::-1].copy(), "event": kinds.astype(np.int8),
                     "t": np.broadcast_to(np.asarray(t, np.int64), n).copy(), "cause": np.arange(n, dtype=np.int64),
                     "batch_index": np.zeros(n, np.int32)})


def test_a_segment_log_file_has_one_row_group_per_event_kind(tmp_path):
    """An event-time read filters the UNTIL events; the row groups' statistics must let it skip the rest."""
    io = LocalFileIO(str(tmp_path))
    n = 1000
    kinds = np.where(np.arange(n) % 3 == 0, segmentlog.SET_VALID_UNTIL, segmentlog.SET_VALID_FROM)
    f = segmentlog.write_file(io, "_bitlake/logs/x.parquet", _events(n, kinds, t=np.arange(n) - 10))
    assert (f.path, f.events, f.bytes, f.min_t, f.max_t) == ("_bitlake/logs/x.parquet", n, io.size(f.path), -10, n - 11)
    file = pq.ParquetFile(tmp_path / f.path)
    assert file.schema_arrow == segmentlog.FILE_SCHEMA
    event = file.schema_arrow.names.index("event")
    groups = [file.metadata.row_group(g) for g in range(file.metadata.num_row_groups)]
    assert [(g.column(event).statistics.min, g.column(event).statistics.max) for g in groups] == [
        (segmentlog.SET_VALID_UNTIL, segmentlog.SET_VALID_UNTIL), (segmentlog.SET_VALID_FROM, segmentlog.SET_VALID_FROM)]
    assert [g.num_rows for g in groups] == [int(np.count_nonzero(kinds == segmentlog.SET_VALID_UNTIL)),
                                            int(np.count_nonzero(kinds == segmentlog.SET_VALID_FROM))]
    table = file.read()
    assert table.num_rows == n and sorted(table.column("cause").to_pylist()) == list(range(n))
    for kind in (segmentlog.SET_VALID_UNTIL, segmentlog.SET_VALID_FROM):  # each sorted by segment and offset
        part = table.filter(pc.equal(table.column("event"), kind))
        keys = list(zip(part.column(rowid.SEQ_COLUMN).to_pylist(), part.column(rowid.OFFSET_COLUMN).to_pylist(),
                        strict=True))
        assert keys == sorted(keys)
    until = segmentlog.read_until(io, f.path)
    assert set(until.column("event").to_pylist()) == {segmentlog.SET_VALID_UNTIL} and until.num_rows == groups[0].num_rows
    assert min(segmentlog.read_until(io, f.path, after=500).column("t").to_pylist()) > 500


def test_a_segment_log_written_in_a_given_order_a_row_group_at_a_time(tmp_path, monkeypatch):
    """The inline MetaGen hands its UNTIL events unsorted with the permutation that sorts them: the file holds
    them in that order, a row group of _ROW_GROUP_ROWS at a time, as if they had been sorted first."""
    monkeypatch.setattr(segmentlog, "_ROW_GROUP_ROWS", 64)
    io = LocalFileIO(str(tmp_path))
    n = 1000
    events = _events(n, np.full(n, segmentlog.SET_VALID_UNTIL), t=np.arange(n))
    order = np.lexsort((events.column(rowid.OFFSET_COLUMN).to_numpy(), events.column(rowid.SEQ_COLUMN).to_numpy()))
    given = segmentlog.write_file(io, "_bitlake/logs/given.parquet", events, order)
    sorted_here = segmentlog.write_file(io, "_bitlake/logs/sorted.parquet", events)
    assert (given.events, given.min_t, given.max_t) == (n, 0, n - 1)
    file = pq.ParquetFile(tmp_path / given.path)
    assert [file.metadata.row_group(g).num_rows for g in range(file.metadata.num_row_groups)] == [64] * 15 + [40]
    assert file.read().equals(pq.read_table(tmp_path / sorted_here.path))
    assert file.read().column("cause").to_pylist() == events.column("cause").take(pa.array(order)).to_pylist()


def test_metagen_writes_only_until_events_and_the_new_bitmaps(tmp_path):
    from bitlake.engine.write import segments

    io = LocalFileIO(str(tmp_path))
    n = 1000
    kinds = np.where(np.arange(n) % 3 == 0, segmentlog.SET_VALID_UNTIL, segments.BECOMES_VALID)
    events = _events(n, kinds)
    rows = segments.write_segments(io, {}, events)
    [log] = [r for r in rows if r["kind"] == "log"]
    table = pq.read_table(tmp_path / log["path"])
    assert set(table.column("event").to_pylist()) == {segmentlog.SET_VALID_UNTIL}
    assert table.num_rows == log["count"] == np.count_nonzero(kinds == segmentlog.SET_VALID_UNTIL)
    keys = list(zip(table.column(rowid.SEQ_COLUMN).to_pylist(), table.column(rowid.OFFSET_COLUMN).to_pylist(),
                    strict=True))
    assert keys == sorted(keys)
    # The new bitmaps: the rows that became valid, without those the same commit ended.
    states = {(r["part"], r["seq"]): r for r in rows if r["kind"] == "bitmap"}
    assert set(states) == {(0, 0), (0, 1)}
    cache = bitmap.BitmapCache(io)
    offsets = events.column(rowid.OFFSET_COLUMN).to_numpy()
    seqs = events.column(rowid.SEQ_COLUMN).to_numpy()
    for (part, seq), r in states.items():
        valid = cache.valid(SegmentState(part, seq, n, n, r["path"], r["count"]))
        expected = {int(o) for o, k, s in zip(offsets, kinds, seqs, strict=True) if s == seq and k == segments.BECOMES_VALID}
        assert set(valid) == expected


def test_the_latest_until_event_of_a_row_wins(tmp_path):
    io = LocalFileIO(str(tmp_path))

    def log(name, offsets, ts):
        n = len(offsets)
        table = pa.table({rowid.PART_COLUMN: np.ones(n, np.int32), rowid.SEQ_COLUMN: np.zeros(n, np.int32),
                          rowid.OFFSET_COLUMN: np.array(offsets, np.int32),
                          "event": np.full(n, segmentlog.SET_VALID_UNTIL, np.int8), "t": np.array(ts, np.int64),
                          "cause": np.zeros(n, np.int64), "batch_index": np.zeros(n, np.int32)})
        return segmentlog.write_file(io, f"_bitlake/logs/{name}.parquet", table)

    files = [(3, log("a", [0, 1], [10, 20])), (5, log("b", [1], [DELTA_INFINITY]))]
    for order in (files, files[::-1]):  # the version decides, not the order of the files
        latest = segmentlog.latest_until(io, order)
        assert dict(zip(latest.column("_row_id").to_pylist(), latest.column("t").to_pylist(), strict=True)) == {
            rowid.pack(1, 0, 0): 10, rowid.pack(1, 0, 1): DELTA_INFINITY}
    assert segmentlog.latest_until(io, files, after=15).column("_row_id").to_pylist() == [rowid.pack(1, 0, 1)]
    assert segmentlog.latest_until(io, []).num_rows == 0


# -- format v1 tables --------------------------------------------------------------------------------


def _copy_fixture(tmp_path, name: str) -> pathlib.Path:
    """A copy of a golden v1 table: reading may write caches, and tests/fixtures must stay as committed."""
    copy = tmp_path / name
    shutil.copytree(FIXTURES / name, copy)
    return copy


def test_the_v1_keyed_table_replays_into_a_v2_state(tmp_path):
    io = LocalFileIO(str(_copy_fixture(tmp_path, "keyed")))
    state = load(io)
    assert state.version == 5
    assert state.protocol == Protocol(reader_version=1, writer_version=1) and state.pending == []
    m = state.metadata
    assert (m.name, m.primary_key, m.delta_column, m.partition_by) == ("keyed", ("k",), "mod", ("grp",))
    assert m.properties == {"keystore.max_increments": "2"}  # v1's keystore.max_deltas
    assert {b.part: (b.batch_id, b.status, b.landed_version, b.live_version) for b in state.parts.values()} == {
        1: ("base", "live", 1, 1), 2: ("changes-1", "live", 2, 2), 3: ("pending", "live", 3, 4),
        4: ("changes-2", "live", 5, 5)}
    assert state.batches == {"base": 1, "changes-1": 2, "pending": 3, "changes-2": 4} and state.max_part == 4
    assert all(b.keys_files and b.records == sum(f.rows for f in b.keys_files) for b in state.parts.values())
    files = state.data_files()
    assert files and all(len(f.segments) == 1 and f.segments[0].rows == f.rows for f in files)
    assert all(f.path.startswith(f"data/grp={f.partition['grp']}/{f.segments[0].part:08d}-{f.segments[0].seq:05d}-")
               for f in files)
    assert {s for f in files for s in [f.segments[0].segment]} <= set(state.segments)
    assert state.keystore and state.logs
    at3 = load(io, 3)  # the batch landed by a LAND commit is pending until the METAGEN commit
    assert [b.batch_id for b in at3.pending] == ["pending"] and at3.batch("pending").live_version is None
    with pytest.raises(UnsupportedFormatVersionError, match="bitlake upgrade"):
        state.protocol.check_write("the table")


def test_the_v1_unkeyed_table_replays_into_a_v2_state(tmp_path):
    path = _copy_fixture(tmp_path, "unkeyed")
    io = LocalFileIO(str(path))
    state = load(io)
    assert state.version == 2
    assert state.protocol.reader_version == 1 and state.protocol.writer_version == 1 and state.pending == []
    assert (state.metadata.name, state.metadata.primary_key, state.metadata.delta_column) == ("unkeyed", (), None)
    assert {b.part: (b.batch_id, b.status, b.live_version, b.keys_files) for b in state.parts.values()} == {
        1: ("u1", "live", 1, ()), 2: ("u2", "live", 2, ())}
    files = state.data_files()
    assert files and all(len(f.segments) == 1 and f.segments[0].rows == f.rows and f.partition is None for f in files)
    assert [b.records for b in state.parts.values()] == [
        sum(f.rows for f in files if f.segments[0].part == part) for part in (1, 2)]
    assert state.keystore == {} and state.logs == []
    t = bitlake.open_table(str(path))
    for v in range(state.version + 1):
        assert t.to_arrow(version=v).num_rows == sum(f.rows for f in load(io, v).data_files())


def _rows(table: pa.Table) -> list[dict]:
    return sorted(table.to_pylist(), key=lambda r: json.dumps(r, sort_keys=True, default=str))


def test_the_v1_keyed_table_reads_as_bitlake_0_1_read_it(tmp_path):
    path = _copy_fixture(tmp_path, "keyed")
    expected = json.loads((FIXTURES / "keyed" / "expected.json").read_text())
    t = bitlake.open_table(str(path))
    assert sorted(expected["views"], key=int) == [str(v) for v in range(t.version + 1)]
    for v in range(t.version + 1):
        assert _rows(t.to_arrow(version=v)) == sorted(expected["views"][str(v)], key=lambda r: json.dumps(r, sort_keys=True))
        assert _rows(t.to_arrow(version=v, valid_at=25)) == sorted(expected["views_at_25"][str(v)],
                                                                   key=lambda r: json.dumps(r, sort_keys=True))
