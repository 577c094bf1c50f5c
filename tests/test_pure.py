"""Fast tests of the format layer (bitlake.format): row ids, bitmaps, the key store, the bucket hash, partition
folders, commit files, protocol, state replay and checkpoints, metadata, v1 tables. No Spark."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import pathlib
import shutil
import struct
import zlib

import pyarrow as pa
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
from bitlake.format import bitmap, bucket, commitlog, keystore, layout, rowid, segmentlog
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
    SegmentRows,
    SegmentState,
)
from bitlake.format.metadata import TableMetadata, delta_to_int
from bitlake.format.protocol import Protocol
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
    assert rowid.unpack(packed) == rid


def test_packing_preserves_row_id_order():
    ids = [(1, 0, 5), (1, 1, 0), (2, 0, 0), (1, 0, 6)]
    assert sorted(ids) == sorted(ids, key=lambda r: rowid.pack(*r))


def test_row_id_out_of_range_is_refused():
    with pytest.raises(ValueError):
        rowid.pack(rowid.MAX_PART + 1, 0, 0)
    with pytest.raises(ValueError):
        rowid.pack(0, 0, rowid.MAX_OFFSET + 1)


# -- bitmaps -------------------------------------------------------------------------------------


def test_invalid_offsets_is_the_complement():
    assert bitmap.invalid_offsets(BitMap([0, 2, 3]), 6).tolist() == [1, 4, 5]
    assert bitmap.invalid_offsets(BitMap(), 3).tolist() == [0, 1, 2]


def test_a_segment_without_a_bitmap_file_has_the_offsets_below_its_cardinality(tmp_path):
    cache = bitmap.BitmapCache(LocalFileIO(str(tmp_path)))
    assert list(cache.valid(SegmentState(1, 0, 5, 5, None, 5))) == [0, 1, 2, 3, 4]
    assert list(cache.valid(SegmentState(1, 0, 5, 5, None, 0))) == []
    assert bitmap.is_prefix(BitMap([0, 1, 2])) and bitmap.is_prefix(BitMap())
    assert not bitmap.is_prefix(BitMap([0, 2]))


def test_bitmap_file_round_trip_uses_portable_serialization(tmp_path):
    io = LocalFileIO(str(tmp_path))
    bm = BitMap(range(0, 100_000, 3))
    bitmap.write_file(io, "b.parquet", [(1, 2, bm), (1, 3, BitMap())])
    back = bitmap.read_file(io, "b.parquet")
    assert back[(1, 2)] == bm and len(back[(1, 3)]) == 0
    blob = pq.read_table(tmp_path / "b.parquet").column("bitmap")[0].as_py()
    assert BitMap.deserialize(blob) == bm  # the portable format, readable by any roaring library


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


# -- the bucket hash: bitlake/format/bucket.py against the spec (docs/FORMAT.md, "Bucket hash") --------


def _spec_encoding(value, t: pa.DataType) -> bytes:
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_decimal(t):
        raw = value.encode() if isinstance(value, str) else (f"{value:.{t.scale}f}".encode()
                                                              if pa.types.is_decimal(t) else value)
        return struct.pack(">I", len(raw)) + raw
    if pa.types.is_boolean(t):
        n = int(value)
    elif pa.types.is_date(t):
        n = (value - dt.date(1970, 1, 1)).days
    elif pa.types.is_timestamp(t):
        d = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        n = (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds
    else:
        n = value
    return struct.pack(">q", n)


def _spec_bucket(values, types, num_buckets: int) -> int:
    h = 0xCBF29CE484222325
    for b in b"".join(_spec_encoding(v, t) for v, t in zip(values, types, strict=True)):
        h = ((h ^ b) * 0x100000001B3) % 2**64
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) % 2**64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) % 2**64
    h ^= h >> 33
    return h % num_buckets


KEY_TYPES = {
    "int8": (pa.int8(), st.integers(-128, 127)),
    "int32": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "int64": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "bool": (pa.bool_(), st.booleans()),
    "date": (pa.date32(), st.dates(dt.date(1900, 1, 1), dt.date(2200, 1, 1))),
    "timestamp": (pa.timestamp("us", tz="UTC"), st.datetimes(dt.datetime(1900, 1, 1), dt.datetime(2200, 1, 1),
                                                             timezones=st.just(dt.UTC))),
    "string": (pa.string(), st.text(max_size=40)),
    "binary": (pa.binary(), st.binary(max_size=40)),
    "decimal": (pa.decimal128(10, 2), st.decimals(-(10**7), 10**7, places=2, allow_nan=False, allow_infinity=False)),
}


@pytest.mark.parametrize("kinds", [[k] for k in KEY_TYPES] + [["int64", "string"], ["date", "decimal"]])
def test_the_bucket_hash_is_the_specified_one(kinds):
    types = [KEY_TYPES[k][0] for k in kinds]

    @settings(max_examples=40, deadline=None)
    @given(st.lists(st.tuples(*[KEY_TYPES[k][1] for k in kinds]), min_size=1, max_size=30), st.integers(1, 1000))
    def check(rows, num_buckets):
        table = pa.table({f"c{i}": pa.array([r[i] for r in rows], t) for i, t in enumerate(types)})
        got = bucket.buckets(table, list(table.column_names), num_buckets).tolist()
        assert got == [_spec_bucket(r, types, num_buckets) for r in rows]

    check()


def test_the_spec_example_and_the_spread_of_buckets():
    one = pa.table({"k": pa.array([1], pa.int64())})
    assert bucket.buckets(one, ["k"], 16).tolist() == [_spec_bucket([1], [pa.int64()], 16)]
    counts = [0] * 16
    for b in bucket.buckets(pa.table({"k": pa.array(range(10_000), pa.int64())}), ["k"], 16).tolist():
        counts[b] += 1
    assert max(counts) < 2 * 10_000 / 16


# -- partition folders ---------------------------------------------------------------------------


def test_partition_folders_escape_as_specified():
    assert layout.partition_dir({"a/b": "x y/é", "n": None}) == "a%2Fb=x y%2F%C3%A9/n=__HIVE_DEFAULT_PARTITION__"
    assert layout.escape("A-z_0.9~") == "A-z_0.9~"
    assert layout.partition_text(True) == "true"
    assert layout.partition_text(dt.date(2024, 1, 2)) == "2024-01-02"
    assert layout.partition_text(dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC)) == "2024-01-02 03:04:05+00:00"
    assert layout.partition_text(dt.datetime(2024, 1, 2, 3, 4, 5, 6)) == "2024-01-02 03:04:05.000006"
    assert layout.partition_text(decimal.Decimal("1.10")) == "1.10"
    assert layout.partition_text(7) == "7"


# -- commit files ----------------------------------------------------------------------------------


def _create(io, m: TableMetadata | None = None) -> None:
    commitlog.write(io, Commit(0, CREATE, 1, protocol=Protocol(), metadata=(m or meta()).to_json()))


def _data(part: int, rows: int = 3) -> DataFile:
    return DataFile(f"data/{part:08d}-00000-x.parquet", rows, 100, None, (SegmentRows(part, 0, rows),))


def _land(version: int, batch_id: str, part: int) -> Commit:
    record = BatchRecord(batch_id, part, "pending", 3, (KeysFile(f"_bitlake/keys/{part:08d}-00000-x.parquet", 0, 3, 9),))
    return Commit(version, LAND, version + 1, batches=(record,), add_files=(_data(part),))


def test_commit_version_is_taken_once(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    commitlog.write(io, _land(1, "a", 1))
    with pytest.raises(FileExistsError):
        commitlog.write(io, _land(1, "b", 2))
    assert commitlog.read(io, 1).batches[0].batch_id == "a"


def test_commit_round_trips(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    c = Commit(1, METAGEN, 5, batches=(BatchRecord("a", 1, "live"),),
               segments=(SegmentState(1, 0, 3, 3, "_bitlake/bitmaps/x", 2),), keystore_add=(BucketFile(3, "k", 1, 2, True),),
               counts={"inserted": 2}, batch_counts={"a": {"inserted": 2}})
    commitlog.write(io, c)
    assert commitlog.read(io, 1) == c


def test_the_checksum_covers_the_body_bytes_as_written(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    data = (tmp_path / layout.commit_path(0)).read_bytes()
    body = data[len(b'{"crc32":'):].split(b',"body":', 1)[1][:-1]
    assert data == b'{"crc32":%d,"body":%s}' % (zlib.crc32(body), body)
    # Another writer may serialise the body differently: the checksum is over its bytes, not a canonical form.
    pretty = json.dumps(json.loads(body), indent=2).encode()
    (tmp_path / layout.commit_path(0)).write_bytes(b'{"crc32":%d,"body":%s}' % (zlib.crc32(pretty), pretty))
    assert commitlog.read(io, 0).metadata == json.loads(body)["metadata"]


def test_a_corrupt_commit_is_reported(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    path = tmp_path / layout.commit_path(0)
    path.write_bytes(path.read_bytes().replace(b'"timestamp_ms":1', b'"timestamp_ms":2'))
    with pytest.raises(CorruptTableError, match="checksum"):
        commitlog.read(io, 0)


def test_a_newer_format_version_is_refused(tmp_path):
    io = LocalFileIO(str(tmp_path))
    body = Commit(0, CREATE, 1, protocol=Protocol(), metadata=meta().to_json()).to_json()
    body["format_version"] = 3
    io.put_if_absent(layout.commit_path(0), commitlog.encode(body))
    with pytest.raises(UnsupportedFormatVersionError, match="format version 3"):
        load(io)


def test_a_format_v1_reader_verifies_a_v2_commit_and_refuses_it_by_version(tmp_path):
    """What bitlake 0.1 (format v1) did with a commit file: its checksum must pass, then the version refuses."""
    io = LocalFileIO(str(tmp_path))
    _create(io)
    doc = json.loads((tmp_path / layout.commit_path(0)).read_bytes())
    canonical = json.dumps(doc["body"], sort_keys=True, separators=(",", ":"))
    assert zlib.crc32(canonical.encode()) == doc["crc32"]
    assert doc["body"]["format_version"] == 2  # > 1: UnsupportedFormatVersionError in bitlake 0.1


@pytest.mark.parametrize("protocol, message", [
    (Protocol(reader_features=("deletionVectors",)), "read features \\['deletionVectors'\\]"),
    (Protocol(reader_version=3), "format version 3 to read"),
])
def test_a_reader_refuses_exactly_what_it_lacks(tmp_path, protocol, message):
    io = LocalFileIO(str(tmp_path))
    commitlog.write(io, Commit(0, CREATE, 1, protocol=protocol, metadata=meta().to_json()))
    with pytest.raises(UnsupportedFormatVersionError, match=message):
        load(io)


def test_an_unknown_writer_feature_leaves_the_table_readable_but_not_writable(tmp_path):
    io = LocalFileIO(str(tmp_path))
    commitlog.write(io, Commit(0, CREATE, 1, protocol=Protocol(writer_features=("clustering",)), metadata=meta().to_json()))
    state = load(io)
    with pytest.raises(UnsupportedFormatVersionError, match="write features \\['clustering'\\]"):
        state.protocol.check_write(io.uri())


# -- state and replay ----------------------------------------------------------------------------


def test_state_replays_land_then_metagen(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    commitlog.write(io, _land(1, "a", 1))
    commitlog.write(io, _land(2, "b", 2))
    s = load(io)
    assert [b.batch_id for b in s.pending] == ["a", "b"] and s.max_part == 2
    assert s.segments == {}  # pending: no segment state, so no view reads their files
    commitlog.write(io, Commit(3, METAGEN, 9, batches=(BatchRecord("a", 1, "live"), BatchRecord("b", 2, "live"))))
    s = load(io)
    assert s.pending == [] and len(s.data_files()) == 2
    assert [(s.batch(b).status, s.batch(b).landed_version, s.batch(b).live_version) for b in "ab"] == [
        ("live", 1, 3), ("live", 2, 3)]
    assert load(io, 1).version == 1


def test_a_replaced_incarnation_leaves_the_new_one_current_and_files_can_be_removed(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    commitlog.write(io, Commit(1, INGEST, 2, batches=(BatchRecord("a", 1, "live", 3, ()),), add_files=(_data(1),)))
    commitlog.write(io, Commit(2, INGEST, 3, batches=(BatchRecord("a", 1, "replaced"), BatchRecord("a", 2, "live", 3, ())),
                               add_files=(_data(2),), remove_files=(_data(1).path,)))
    s = load(io)
    assert s.batch("a").part == 2 and s.parts[1].status == "replaced"
    assert [f.path for f in s.data_files()] == [_data(2).path]


def test_metadata_changes_in_a_later_commit(tmp_path):
    io = LocalFileIO(str(tmp_path))
    m = meta()
    _create(io, m)
    evolved = m.evolve(properties={"checkpoint.interval": "5"}, add_columns=pa.schema([("x", pa.float64())]))
    commitlog.write(io, Commit(1, SET_METADATA, 2, metadata=evolved.to_json()))
    assert load(io).metadata == evolved and load(io, 0).metadata == m


def test_checkpoint_gives_the_same_state_as_replay(tmp_path):
    io = LocalFileIO(str(tmp_path))
    _create(io)
    commitlog.write(io, _land(1, "a", 1))
    commitlog.write(io, Commit(2, METAGEN, 9, batches=(BatchRecord("a", 1, "live"),),
                               keystore_add=(BucketFile(0, "k0", 1, 1, True),)))
    write_checkpoint(io, load(io))
    commitlog.write(io, _land(3, "b", 2))
    from_checkpoint = load(io)
    io.delete(layout.checkpoint_path(2))
    assert load(io).to_json() == from_checkpoint.to_json()


def test_missing_versions_and_paths_are_clear_errors(tmp_path):
    with pytest.raises(TableNotFoundError):
        load(LocalFileIO(str(tmp_path / "nope")))
    with pytest.raises(NotATableError):
        load(LocalFileIO(str(tmp_path)))
    io = LocalFileIO(str(tmp_path))
    _create(io)
    with pytest.raises(VersionNotFoundError, match="versions 0 to 0"):
        load(io, 3)


def test_unsupported_scheme_is_refused():
    with pytest.raises(ValueError, match="unsupported storage scheme"):
        file_io("s3://bucket/table")


def test_state_does_not_skip_versions():
    s = TableState(Protocol(), meta())
    with pytest.raises(VersionNotFoundError):
        s.apply(_land(2, "a", 1))


# -- metadata ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(primary_key=("nope",)), "primary key column 'nope'"),
        (dict(delta_column="nope"), "delta column 'nope'"),
        (dict(delta_column="v"), "delta column 'v' has type string"),
        (dict(delta_column=None), "needs both"),
        (dict(file_format="csv"), "file_format"),
        (dict(num_buckets=0), "num_buckets"),
        (dict(partition_by=("x",)), "partition column 'x'"),
        (dict(properties={"nope": "1"}), "unknown table property"),
        (dict(name=""), "non-empty name"),
        (dict(schema=pa.schema([("id", pa.int64()), ("_segment_part", pa.int32()), ("mod", pa.int64())])), "reserved"),
        (dict(schema=pa.schema([("id", pa.int64()), ("ID", pa.int32()), ("mod", pa.int64())])), "more than once"),
        (dict(schema=pa.schema([("id", pa.float64()), ("mod", pa.int64())])), "cannot be a key"),
    ],
)
def test_bad_table_definitions_are_refused(kw, message):
    with pytest.raises(InvalidInputError, match=message):
        meta(**kw).validate()


def test_metadata_round_trips():
    m = meta(partition_by=("v",), num_buckets=7, properties={"keystore.max_increments": "3"})
    assert TableMetadata.from_json(json.loads(json.dumps(m.to_json()))) == m


def test_metadata_evolves_by_properties_and_nullable_columns_only():
    m = meta().evolve(add_columns=pa.schema([("x", pa.float64())]), properties={"checkpoint.interval": "7"})
    assert m.column_names == ["id", "v", "mod", "x"] and m.properties == {"checkpoint.interval": "7"}
    assert m.evolve(properties={"checkpoint.interval": ""}).properties == {}
    with pytest.raises(SchemaMismatchError, match="must be nullable"):
        m.evolve(add_columns=pa.schema([pa.field("y", pa.int64(), nullable=False)]))
    with pytest.raises(SchemaMismatchError, match="already exists"):
        m.evolve(add_columns=pa.schema([("ID", pa.int64())]))
    with pytest.raises(InvalidInputError, match="unknown table property"):
        m.evolve(properties={"nope": "1"})


def test_delta_values_normalise_to_int64():
    ts = pa.timestamp("us", tz="UTC")
    assert delta_to_int(42, pa.int64()) == 42
    assert delta_to_int("1970-01-01T00:00:01Z", ts) == 1_000_000
    assert delta_to_int(dt.datetime(1970, 1, 1, 0, 0, 2, tzinfo=dt.UTC), ts) == 2_000_000
    assert delta_to_int(dt.date(1970, 1, 2), pa.date32()) == 86_400_000_000
    with pytest.raises(InvalidInputError):
        delta_to_int("x", pa.int64())


# -- change events ---------------------------------------------------------------------------------


def test_change_events_name_every_partition_touched():
    from bitlake import changeevent
    from bitlake.engine.metagen import Landed

    m = meta(schema=pa.schema([("id", pa.int64()), ("region", pa.string()), ("mod", pa.int64())]),
             partition_by=("region",))
    state = TableState(Protocol(), m, version=4, last_event_version=3)
    old = DataFile("data/region=eu/a.parquet", 5, 10, {"region": "eu"}, (SegmentRows(1, 0, 5),))
    state.files[old.path] = old
    state.segments[(1, 0)] = SegmentState(1, 0, 5, 5, "b", 5)
    new = DataFile("data/region=us/b.parquet", 2, 10, {"region": "us"}, (SegmentRows(2, 0, 2),))
    batch = Landed("x", 2, 2, (new,), ())
    touched = [SegmentState(1, 0, 5, 5, "b2", 4), SegmentState(2, 0, 2, 2, None, 2)]
    events = changeevent.commit_events("shop.t", state, 5, 0, [batch], touched, {"inserted": 1, "updated": 1})
    assert [e["partition"] for e in events] == [["eu"], ["us"]]
    assert {e["operation_type"] for e in events} == {"UPDATE"} and {e["table"] for e in events} == {"shop.t"}
    assert events[0]["snapshot_id"] == "5" and events[0]["prev_snapshot_id"] == "3"
    assert changeevent.operation_type({"inserted": 3}) == "APPEND"
    assert changeevent.operation_type({"deleted": 1}) == "DELETE"


def test_the_previous_snapshot_of_an_event_is_the_last_commit_with_events():
    state = TableState(Protocol(), meta())
    state.apply(Commit(1, INGEST, 1, events=({"snapshot_id": "1"},)))
    state.apply(Commit(2, INGEST, 2))  # touched no partition: no event
    assert (state.last_event_version, state.version) == (1, 2)
    assert TableState.from_json(json.loads(json.dumps(state.to_json()))).last_event_version == 1


# -- segment logs ----------------------------------------------------------------------------------


def test_a_segment_log_holds_until_events_sorted_and_metagen_writes_no_from_events(tmp_path):
    import numpy as np

    from bitlake.engine import metagen

    io = LocalFileIO(str(tmp_path))
    n = 1000
    offsets = np.arange(n, dtype=np.int32)
    kinds = np.where(offsets % 3 == 0, segmentlog.SET_VALID_UNTIL, metagen.BECOMES_VALID).astype(np.int8)
    events = pa.table({rowid.PART_COLUMN: np.zeros(n, np.int32), rowid.SEQ_COLUMN: (offsets % 2).astype(np.int32),
                       rowid.OFFSET_COLUMN: offsets[::-1].copy(), "event": kinds, "t": np.full(n, 5, np.int64),
                       "cause": np.arange(n, dtype=np.int64), "batch_index": np.zeros(n, np.int32)})
    rows = metagen.write_segments(io, {}, events)
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
    for (part, seq), r in states.items():
        valid = cache.valid(SegmentState(part, seq, n, n, r["path"], r["count"]))
        expected = {int(o) for o, k, s in zip(offsets[::-1], kinds, offsets % 2, strict=True)
                    if s == seq and k == metagen.BECOMES_VALID}
        assert set(valid) == expected


def test_the_latest_until_event_of_a_row_wins(tmp_path):
    import numpy as np

    io = LocalFileIO(str(tmp_path))

    def log(name, offsets, ts):
        n = len(offsets)
        table = pa.table({rowid.PART_COLUMN: np.ones(n, np.int32), rowid.SEQ_COLUMN: np.zeros(n, np.int32),
                          rowid.OFFSET_COLUMN: np.array(offsets, np.int32),
                          "event": np.full(n, segmentlog.SET_VALID_UNTIL, np.int8), "t": np.array(ts, np.int64),
                          "cause": np.zeros(n, np.int64), "batch_index": np.zeros(n, np.int32)})
        return segmentlog.write_file(io, f"_bitlake/logs/{name}.parquet", table)

    files = [(3, log("a", [0, 1], [10, 20])), (5, log("b", [1], [2**63 - 1]))]
    latest = segmentlog.latest_until(io, files)
    assert dict(zip(latest.column("_row_id").to_pylist(), latest.column("t").to_pylist(), strict=True)) == {
        rowid.pack(1, 0, 0): 10, rowid.pack(1, 0, 1): 2**63 - 1}
    assert segmentlog.latest_until(io, files, after=15).column("_row_id").to_pylist() == [rowid.pack(1, 0, 1)]


# -- format v1 tables --------------------------------------------------------------------------------


def test_v1_fixture_tables_replay_into_v2_states(tmp_path):
    shutil.copytree(FIXTURES / "keyed", tmp_path / "keyed")
    state = load(LocalFileIO(str(tmp_path / "keyed")))
    assert state.protocol.reader_version == 1 and state.pending == []
    assert state.metadata.name == "keyed" and state.metadata.properties == {"keystore.max_increments": "2"}
    assert {b.batch_id: b.status for b in state.parts.values()} == {
        "base": "live", "changes-1": "live", "pending": "live", "changes-2": "live"}
    assert all(len(f.segments) == 1 for f in state.data_files())
    with pytest.raises(UnsupportedFormatVersionError, match="bitlake upgrade"):
        state.protocol.check_write("the table")


def test_v1_fixture_views_read_as_bitlake_0_1_read_them(tmp_path):
    shutil.copytree(FIXTURES / "keyed", tmp_path / "keyed")
    expected = json.loads((FIXTURES / "keyed" / "expected.json").read_text())
    t = bitlake.open_table(str(tmp_path / "keyed"))
    for v in range(t.version + 1):
        assert sorted(t.to_arrow(version=v).to_pylist(), key=lambda r: r["k"]) == expected["views"][str(v)]
        assert sorted(t.to_arrow(version=v, valid_at=25).to_pylist(), key=lambda r: r["k"]) == expected["views_at_25"][str(v)]
