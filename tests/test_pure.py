"""Fast tests of the pure layer: row ids, bitmaps, key-store merging, commit log, state, schema."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest
from pyroaring import BitMap

from bitlake import bitmap, commitlog, keystore, rowid
from bitlake.commitlog import Batch, Commit, DataFile, SegmentState
from bitlake.errors import (
    CorruptTableError,
    InvalidInputError,
    NotATableError,
    TableNotFoundError,
    UnsupportedFormatVersionError,
    VersionNotFoundError,
)
from bitlake.fs import FileIO, file_io
from bitlake.keystore import BucketFile
from bitlake.schema import TableMetadata, delta_to_int
from bitlake.state import TableState, load, write_checkpoint

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("mod", pa.int64())])


def meta(**kw) -> TableMetadata:
    base = dict(schema=SCHEMA, primary_key=("id",), delta_column="mod")
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


def test_apply_events_adds_from_and_removes_until():
    bm = bitmap.apply_events(BitMap([0, 1, 2]), valid_from=[5, 6], valid_until=[1, 6])
    assert list(bm) == [0, 2, 5]


def test_apply_events_does_not_modify_the_base():
    base = BitMap([1])
    bitmap.apply_events(base, [2], [1])
    assert list(base) == [1]


def test_invalid_offsets_is_the_complement():
    assert bitmap.invalid_offsets(BitMap([0, 2, 3]), 6).tolist() == [1, 4, 5]
    assert bitmap.invalid_offsets(None, 3).tolist() == [0, 1, 2]


def test_bitmap_file_round_trip_uses_portable_serialization(tmp_path):
    path = str(tmp_path / "b.parquet")
    bm = BitMap(range(0, 100_000, 3))
    bitmap.write_file(path, [(1, 2, bm), (1, 3, BitMap())])
    back = bitmap.read_file(path)
    assert back[(1, 2)] == bm and len(back[(1, 3)]) == 0
    import pyarrow.parquet as pq

    blob = pq.read_table(path).column("bitmap")[0].as_py()
    assert BitMap.deserialize(blob) == bm  # the portable format, readable by any roaring library


# -- key store -----------------------------------------------------------------------------------


def test_latest_per_key_keeps_highest_sequence():
    t = pa.table({
        "id": [1, 2, 1, 3, 2],
        keystore.DELTA: [1, 1, 5, 2, 0],
        keystore.ROW_ID: [10, 20, 11, 30, 21],
        keystore.DELETED: [False, False, True, False, False],
        keystore.SEQ: [1, 1, 2, 1, 3],
    })
    out = keystore.latest_per_key(t, ["id"]).to_pylist()
    assert [(r["id"], r[keystore.ROW_ID], r[keystore.DELETED]) for r in out] == [(1, 11, True), (2, 21, False), (3, 30, False)]


def test_latest_per_key_with_composite_keys():
    t = pa.table({
        "a": [1, 1, 1], "b": ["x", "y", "x"],
        keystore.DELTA: [1, 1, 2], keystore.ROW_ID: [1, 2, 3], keystore.DELETED: [False] * 3, keystore.SEQ: [1, 1, 2],
    })
    out = keystore.latest_per_key(t, ["a", "b"]).to_pylist()
    assert [(r["a"], r["b"], r[keystore.ROW_ID]) for r in out] == [(1, "x", 3), (1, "y", 2)]


_NAMES = iter(range(1_000_000))


def _bf(rows, base=False):
    return BucketFile(0, f"f{next(_NAMES)}", rows, rows * 10, base)


def test_merge_plan_adds_deltas_until_the_limit():
    files = [_bf(1000, base=True), _bf(10), _bf(10)]
    assert keystore.merge_plan(files, 10, max_deltas=3, base_ratio=0.25) == []


def test_merge_plan_merges_small_deltas_among_themselves():
    files = [_bf(1000, base=True), _bf(10), _bf(10), _bf(10)]
    assert keystore.merge_plan(files, 10, max_deltas=3, base_ratio=0.25) == files[1:]


def test_merge_plan_merges_into_the_base_when_deltas_are_large():
    files = [_bf(100, base=True), _bf(10), _bf(10), _bf(10)]
    assert keystore.merge_plan(files, 10, max_deltas=3, base_ratio=0.25) == files


# -- commit log and state --------------------------------------------------------------------------


def _create(io: FileIO, m: TableMetadata | None = None) -> None:
    commitlog.write(io, Commit(0, commitlog.CREATE, 1, metadata=(m or meta()).to_json()))


def _land(version: int, batch_id: str, part: int) -> Commit:
    f = DataFile(f"data/{part:08d}-00000-x.parquet", "data", part, 0, 3, 100)
    return Commit(version, commitlog.LAND, version + 1, batch_id=batch_id, landed=Batch(batch_id, part, (f,)))


def test_commit_version_is_taken_once(tmp_path):
    io = FileIO(str(tmp_path))
    _create(io)
    commitlog.write(io, _land(1, "a", 1))
    with pytest.raises(FileExistsError):
        commitlog.write(io, _land(1, "b", 2))
    assert commitlog.read(io, 1).batch_id == "a"


def test_commit_round_trips(tmp_path):
    io = FileIO(str(tmp_path))
    _create(io)
    c = Commit(
        1, commitlog.METAGEN, 5, processed=("a",), segments=(SegmentState(1, 0, 3, 3, "_bitlake/bitmaps/x", 2),),
        keystore_add=(BucketFile(3, "k", 1, 2, True),), counts={"inserted": 2}, batch_counts={"a": {"inserted": 2}},
    )
    commitlog.write(io, c)
    assert commitlog.read(io, 1) == c


def test_a_corrupt_commit_is_reported(tmp_path):
    io = FileIO(str(tmp_path))
    _create(io)
    path = tmp_path / commitlog.commit_path(0)
    doc = json.loads(path.read_text())
    doc["body"]["timestamp_ms"] += 1
    path.write_text(json.dumps(doc))
    with pytest.raises(CorruptTableError, match="checksum"):
        commitlog.read(io, 0)


def test_a_newer_format_version_is_refused(tmp_path):
    io = FileIO(str(tmp_path))
    body = Commit(0, commitlog.CREATE, 1, metadata=meta().to_json()).to_json()
    body["format_version"] = 99
    io.put_if_absent(commitlog.commit_path(0), commitlog.encode(body))
    with pytest.raises(UnsupportedFormatVersionError, match="format version 99"):
        load(io)


def test_state_replays_land_then_metagen(tmp_path):
    io = FileIO(str(tmp_path))
    _create(io)
    commitlog.write(io, _land(1, "a", 1))
    commitlog.write(io, _land(2, "b", 2))
    s = load(io)
    assert [b.batch_id for b in s.pending] == ["a", "b"] and s.data_files() == [] and s.max_part == 2
    commitlog.write(io, Commit(3, commitlog.METAGEN, 9, processed=("a", "b")))
    s = load(io)
    assert s.pending == [] and len(s.data_files()) == 2 and s.visible == {"a": 3, "b": 3}
    assert load(io, 1).version == 1


def test_checkpoint_gives_the_same_state_as_replay(tmp_path):
    io = FileIO(str(tmp_path))
    _create(io)
    commitlog.write(io, _land(1, "a", 1))
    commitlog.write(io, Commit(2, commitlog.METAGEN, 9, processed=("a",), keystore_add=(BucketFile(0, "k0", 1, 1, True),)))
    replayed = load(io)
    write_checkpoint(io, replayed)
    commitlog.write(io, _land(3, "b", 2))
    from_checkpoint = load(io)
    io.delete("_bitlake/checkpoints/" + f"{2:020d}.json")
    assert load(io).to_json() == from_checkpoint.to_json()


def test_missing_versions_and_paths_are_clear_errors(tmp_path):
    with pytest.raises(TableNotFoundError):
        load(FileIO(str(tmp_path / "nope")))
    with pytest.raises(NotATableError):
        load(FileIO(str(tmp_path)))
    io = FileIO(str(tmp_path))
    _create(io)
    with pytest.raises(VersionNotFoundError, match="versions 0 to 0"):
        load(io, 3)


def test_unsupported_scheme_is_refused():
    with pytest.raises(ValueError, match="unsupported storage scheme"):
        file_io("s3://bucket/table")


def test_state_does_not_depend_on_commit_timestamps():
    s = TableState(metadata=meta())
    with pytest.raises(VersionNotFoundError):
        s.apply(_land(2, "a", 1))


# -- schema ----------------------------------------------------------------------------------------


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
        (dict(schema=pa.schema([("id", pa.int64()), ("_segment_part", pa.int32()), ("mod", pa.int64())])), "reserved"),
        (dict(schema=pa.schema([("id", pa.int64()), ("ID", pa.int32()), ("mod", pa.int64())])), "more than once"),
        (dict(schema=pa.schema([("id", pa.float64()), ("mod", pa.int64())])), "cannot be a key"),
    ],
)
def test_bad_table_definitions_are_refused(kw, message):
    with pytest.raises(InvalidInputError, match=message):
        meta(**kw).validate()


def test_metadata_round_trips():
    m = meta(partition_by=("v",), num_buckets=7, properties={"keystore.max_deltas": "3"})
    assert TableMetadata.from_json(json.loads(json.dumps(m.to_json()))) == m


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

    m = meta(schema=pa.schema([("id", pa.int64()), ("region", pa.string()), ("mod", pa.int64())]),
             partition_by=("region",))
    state = TableState(metadata=m, version=4, last_visible_version=3, last_event_version=3)
    old = DataFile("data/region=eu/a.parquet", "data", 1, 0, 5, 10, {"region": "eu"})
    state.files.append(old)
    state.segments[(1, 0)] = SegmentState(1, 0, 5, 5, "b", 5)
    new = DataFile("data/region=us/b.parquet", "data", 2, 0, 2, 10, {"region": "us"})
    batch = Batch("x", 2, (new,))
    touched = [SegmentState(1, 0, 5, 5, "b2", 4), SegmentState(2, 0, 2, 2, "b3", 2)]
    events = changeevent.commit_events("t", state, 5, 0, [batch], touched, {"inserted": 1, "updated": 1})
    assert [e["partition"] for e in events] == [["eu"], ["us"]]
    assert {e["operation_type"] for e in events} == {"UPDATE"}
    assert events[0]["snapshot_id"] == "5" and events[0]["prev_snapshot_id"] == "3"
    assert changeevent.operation_type({"inserted": 3}) == "APPEND"
    assert changeevent.operation_type({"deleted": 1}) == "DELETE"


def test_the_previous_snapshot_of_an_event_is_the_last_commit_with_events():
    m = meta()
    state = TableState(metadata=m)
    state.apply(Commit(1, "INGEST", 1, processed=(), events=({"snapshot_id": "1"},)))
    state.apply(Commit(2, "INGEST", 2, processed=(), events=()))  # touched no partition: no event
    assert (state.last_event_version, state.version) == (1, 2)
    again = TableState.from_json(json.loads(json.dumps(state.to_json())))
    assert again.last_event_version == 1
    old = state.to_json()
    del old["last_event_version"]  # a checkpoint written before the field existed
    old["last_visible_version"] = 2
    assert TableState.from_json(old).last_event_version == 2


def test_a_segment_log_file_has_one_row_group_per_event_kind(tmp_path):
    """An event-time read filters the UNTIL events; the row groups' statistics must let it skip the rest."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from bitlake import metagen, segmentlog

    n = 1000
    offsets = np.arange(n, dtype=np.int32)
    kinds = np.where(offsets % 3 == 0, segmentlog.SET_VALID_UNTIL, segmentlog.SET_VALID_FROM).astype(np.int8)
    events = pa.table({rowid.PART_COLUMN: np.zeros(n, np.int32), rowid.SEQ_COLUMN: (offsets % 2).astype(np.int32),
                       rowid.OFFSET_COLUMN: offsets[::-1].copy(), "event": kinds, "t": np.full(n, 5, np.int64),
                       "cause": np.arange(n, dtype=np.int64), "batch_index": np.zeros(n, np.int32)})
    rows = metagen.write_segments(str(tmp_path), {}, events)
    log = next(r for r in rows if r["kind"] == "log")
    file = pq.ParquetFile(tmp_path / log["path"])
    event = file.schema_arrow.names.index("event")
    groups = [file.metadata.row_group(g) for g in range(file.metadata.num_row_groups)]
    assert [(g.column(event).statistics.min, g.column(event).statistics.max) for g in groups] == [
        (segmentlog.SET_VALID_UNTIL, segmentlog.SET_VALID_UNTIL), (segmentlog.SET_VALID_FROM, segmentlog.SET_VALID_FROM)]
    table = file.read()
    assert table.num_rows == n and sorted(table.column("cause").to_pylist()) == list(range(n))
    for kind in (segmentlog.SET_VALID_UNTIL, segmentlog.SET_VALID_FROM):  # each sorted by segment and offset
        part = table.filter(pc.equal(table.column("event"), kind))
        keys = list(zip(part.column(rowid.SEQ_COLUMN).to_pylist(), part.column(rowid.OFFSET_COLUMN).to_pylist(),
                        strict=True))
        assert keys == sorted(keys)
    # The bitmaps still come from every event: UNTIL rows invalid, FROM rows valid.
    assert {(r["part"], r["seq"]) for r in rows if r["kind"] == "bitmap"} == {(0, 0), (0, 1)}
