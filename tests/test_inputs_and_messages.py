"""Issue 41: inputs from any Arrow producer, a committed batch id re-ingested with other records, messages a new
user can act on, and compaction of a one-file table. No Spark."""

from __future__ import annotations

import duckdb
import polars as pl
import pyarrow as pa
import pytest

import bitlake
from bitlake.errors import InvalidInputError

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("mod", pa.int64())])


def rows(ids, names, mods):
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string()),
                     "mod": pa.array(mods, pa.int64())})


@pytest.fixture
def table(tmp_path):
    return bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="id", delta_column="mod", num_buckets=2)


def current(t) -> list[tuple]:
    got = t.to_arrow().sort_by("id")
    return list(zip(*(got.column(c).to_pylist() for c in SCHEMA.names), strict=True))


# ------------------------------------------------------------------------------------------ Arrow producers


@pytest.mark.parametrize("make", [
    pytest.param(lambda: pl.DataFrame({"id": [1, 2], "name": ["a", "b"], "mod": [1, 1]}), id="polars"),
    pytest.param(lambda: duckdb.sql("SELECT * FROM (VALUES (1::BIGINT, 'a', 1::BIGINT), (2, 'b', 1)) v(id, name, mod)"),
                 id="duckdb"),
    pytest.param(lambda: rows([1, 2], ["a", "b"], [1, 1]).to_reader(max_chunksize=1), id="reader"),
    pytest.param(lambda: rows([1, 2], ["a", "b"], [1, 1]).to_batches()[0], id="record_batch"),
    pytest.param(lambda: rows([1, 2], ["a", "b"], [1, 1]).to_struct_array().combine_chunks(), id="struct_array"),
])
def test_ingest_takes_arrow_producers(table, make):
    r = table.ingest(make())
    assert r.committed and r.counts["inserted"] == 2
    assert current(table) == [(1, "a", 1), (2, "b", 1)]


def test_ingest_takes_a_folder_of_parquet_files_as_a_dataset_or_a_scanner(tmp_path, table):
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(rows([1, 2], ["a", "b"], [1, 1]), folder / "part-0.parquet")
    pq.write_table(rows([2, 3], ["c", "d"], [2, 1]), folder / "part-1.parquet")
    r = table.ingest(ds.dataset(folder))
    assert r.counts["inserted"] == 3 and r.counts["updated"] == 1
    assert current(table) == [(1, "a", 1), (2, "c", 2), (3, "d", 1)]
    # A scanner's filter and projection: key 3 again at the same delta (a later record wins the tie), its name
    # left out (stored as null).
    r = table.ingest(ds.dataset(folder).scanner(filter=ds.field("id") == 3, columns=["id", "mod"]))
    assert r.counts["updated"] == 1 and current(table)[-1] == (3, None, 1)


def test_ingest_takes_another_tables_view(tmp_path, table):
    table.ingest(rows([1, 2, 3], ["a", "b", "c"], [1, 1, 1]))
    other = bitlake.create_table(str(tmp_path / "o"), SCHEMA, primary_key="id", delta_column="mod")
    assert other.ingest(table.view()).counts["inserted"] == 3
    assert current(other) == current(table)


def test_replace_batch_and_merge_take_polars(table):
    table.ingest(rows([1, 2], ["a", "b"], [1, 1]), batch_id="b1")
    table.replace_batch("b1", pl.DataFrame({"id": [1], "name": ["x"], "mod": [1]}))
    assert current(table) == [(1, "x", 1)]
    table.merge(pl.DataFrame({"id": [1, 5], "name": ["y", "z"], "mod": [2, 2]})) \
        .when_matched_update_all().when_not_matched_insert_all().execute()
    assert current(table) == [(1, "y", 2), (5, "z", 2)]


def test_a_polars_lazy_frame_is_refused_with_what_is_accepted(table):
    with pytest.raises(InvalidInputError, match=r"LazyFrame.*__arrow_c_stream__.*collect\(\)"):
        table.ingest(pl.DataFrame({"id": [1], "name": ["a"], "mod": [1]}).lazy())


def test_an_object_of_no_arrow_producer_names_what_is_accepted(table):
    with pytest.raises(InvalidInputError, match="PyCapsule interface.*polars DataFrame.*DuckDB relation"):
        table.ingest([{"id": 1, "name": "a", "mod": 1}])


def test_convert_takes_a_polars_frame_and_a_duckdb_relation(tmp_path):
    r = bitlake.convert(pl.DataFrame({"id": [1, 2, 2], "name": ["a", "b", "c"], "mod": [1, 1, 2]}),
                        str(tmp_path / "c"), primary_key="id", delta_column="mod")
    assert (r.source_kind, r.rows, r.duplicates) == ("arrow", 3, 1)
    assert sorted(r.table.to_arrow().column("name").to_pylist()) == ["a", "c"]
    r = bitlake.convert(duckdb.sql("SELECT 1 AS x"), str(tmp_path / "d"))
    assert r.table.to_arrow().column("x").to_pylist() == [1]


# ------------------------------------------------------------------------------------------ batch digest


def test_a_committed_batch_id_with_other_records_is_refused(table):
    first = table.ingest(rows([1, 2], ["a", "b"], [1, 1]), batch_id="b1")
    with pytest.raises(bitlake.BatchIdReusedError, match=r"batch 'b1'.*other records.*replace_batch\('b1'"):
        table.ingest(rows([1, 2], ["a", "CHANGED"], [1, 1]), batch_id="b1")
    assert issubclass(bitlake.BatchIdReusedError, InvalidInputError)
    assert current(table) == [(1, "a", 1), (2, "b", 1)] and table.version == first.version


def test_a_retry_with_the_same_records_is_a_no_op_whatever_their_producer_or_chunks(table):
    records = rows([1, 2, 3], ["a", None, "c"], [1, 1, 2])
    first = table.ingest(records, batch_id="b1")
    for same in (records.to_reader(max_chunksize=1), pl.from_arrow(records), records.to_pandas(),
                 records.select(["mod", "id", "name"])):
        again = table.ingest(same, batch_id="b1")
        assert (again.committed, again.version, again.counts) == (False, first.version, first.counts)


def test_a_pending_batch_id_and_a_replaced_one_compare_their_records(table):
    table.ingest(rows([1], ["a"], [1]), batch_id="p", metagen=False)
    with pytest.raises(bitlake.BatchIdReusedError, match="'p'"):
        table.ingest(rows([1], ["b"], [1]), batch_id="p")
    table.ingest(rows([2], ["a"], [1]), batch_id="r")
    table.replace_batch("r", rows([2], ["new"], [1]))
    assert not table.ingest(rows([2], ["new"], [1]), batch_id="r").committed
    with pytest.raises(bitlake.BatchIdReusedError):
        table.ingest(rows([2], ["a"], [1]), batch_id="r")


def test_the_digest_is_recorded_and_a_table_without_one_keeps_the_no_op(table):
    table.ingest(rows([1], ["a"], [1]), batch_id="b1")
    b = table.refresh().batch("b1")
    assert b.digest.startswith("xxh3-128-columns-v2:")
    # A batch committed before digests (or from a Spark DataFrame) has none: its id stays a no-op.
    import dataclasses

    from bitlake.batches import check_same_records
    from bitlake.format.state import TableState

    state = table.refresh()
    old = dataclasses.replace(state, parts={**state.parts, b.part: dataclasses.replace(b, digest=None)})
    assert isinstance(old, TableState)
    check_same_records(old, "b1", "xxh3-128-columns-v2:other")  # no error
    with pytest.raises(bitlake.BatchIdReusedError):
        check_same_records(state, "b1", "xxh3-128-columns-v2:other")


def test_a_batch_digested_by_an_older_writer_is_compared_by_its_algorithm(table, monkeypatch):
    """A batch committed by a writer of ``sha256-columns-v1`` digests: a retry of its records is digested that way,
    a no-op for the same records and refused for others."""
    from bitlake.engine.write import digest

    newest = digest.Digest
    with monkeypatch.context() as m:  # an older writer
        m.setattr(digest, "Digest", lambda algorithm="sha256-columns-v1": newest(algorithm))
        table.ingest(rows([1], ["a"], [1]), batch_id="b1")
    assert table.refresh().batch("b1").digest.startswith("sha256-columns-v1:")
    assert not table.ingest(rows([1], ["a"], [1]), batch_id="b1").committed
    with pytest.raises(bitlake.BatchIdReusedError, match="'b1'"):
        table.ingest(rows([1], ["other"], [1]), batch_id="b1")


def test_the_digest_depends_on_the_records_not_on_their_chunks():
    import decimal

    from bitlake.engine.write.digest import Digest

    t = pa.table({
        "i": [1, None, 3, 4, 5], "s": ["x", None, "yy", "", "z"], "l": [[1], [2, None], None, [], [5]],
        "st": [{"p": 1, "q": "a"}, None, {"p": None, "q": "b"}, {"p": 4, "q": None}, {"p": 5, "q": "e"}],
        "b": [True, False, None, True, True],
        "dec": pa.array([decimal.Decimal(1), None, decimal.Decimal(2), decimal.Decimal(3), decimal.Decimal(4)],
                        pa.decimal128(10, 2)),
        "m": pa.array([[(1, "a")], None, [], [(2, "b")], [(3, "c")]], pa.map_(pa.int64(), pa.string())),
        "n": pa.nulls(5)})

    def digest(batches) -> str:
        d = Digest()
        for b in batches:
            d.update(b)
        return d.hexdigest()

    whole = digest(t.to_batches())
    for size in (1, 2, 3):
        assert digest(t.to_batches(max_chunksize=size)) == whole
    assert digest(t.slice(0, 2).to_batches() + t.slice(2).to_batches()) == whole
    assert digest(t.drop_columns(["n"]).to_batches()) == whole  # a column of nulls only takes no part
    for i, name, values in [(0, "i", [1, 3, None, 4, 5]), (1, "s", ["x", None, "y", "y", "z"]),
                            (2, "l", [[1], [2], [None], [], [5]]), (0, "i", [1, None, 3, 4, 6])]:
        assert digest(t.set_column(i, name, pa.array(values)).to_batches()) != whole


# ------------------------------------------------------------------------------------------ compaction


def test_compacting_a_one_file_table_parts_current_rows_from_superseded_ones(table):
    """A one-file table whose batch superseded its own records (a key twice) becomes two files: its current rows
    and its superseded ones, which event-time views still read (valid_at=1 shows the first records)."""
    table.ingest(rows([*range(100), *range(20)], ["a"] * 120, [1] * 100 + [2] * 20))
    assert len(table.state().data_files()) == 1
    r = table.compact()
    assert (r.removed_files, r.added_files, r.current_rows, r.history_rows) == (1, 2, 100, 20)
    assert table.to_arrow().num_rows == 100 and table.to_arrow(valid_at=1).num_rows == 100
    assert table.compact().version is None  # a compacted table is left as it is


def test_an_expired_event_time_is_written_as_a_time(tmp_path):
    import datetime as dt

    schema = pa.schema([("id", pa.int64()), ("at", pa.timestamp("us", tz="UTC"))])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key="id", delta_column="at")
    for day in range(1, 6):
        t.ingest(pa.table({"id": [1, 2], "at": [dt.datetime(2024, 1, day, tzinfo=dt.UTC)] * 2}, schema=schema))
    t.compact(major=True, look_back=3)
    for table in (t, bitlake.open_table(t.path)):  # the window replayed, and read from a checkpoint
        with pytest.raises(bitlake.VersionExpiredError,
                           match=r"valid_at 2024-01-01T00:00:00\+00:00 is before .* event times from "
                                 r"2024-01-03T00:00:00\+00:00"):
            table.to_arrow(valid_at=dt.datetime(2024, 1, 1))


def test_storage_options_a_store_does_not_know_are_named_with_those_it_takes(tmp_path):
    with pytest.raises(InvalidInputError, match=r"unknown storage option 'AWS_ENDPOINT_URLX' for s3://.*"
                                                r"AWS_ENDPOINT_URL.*allow_http"):
        bitlake.open_table("s3://bucket/t", storage_options={"AWS_ENDPOINT_URLX": "http://127.0.0.1:1"})
    with pytest.raises(InvalidInputError, match=r"memory:// stores take no storage options.*'colour'"):
        bitlake.create_table("memory:///opts", SCHEMA, storage_options={"colour": "red"})
    with pytest.raises(InvalidInputError, match="is a local path, which takes none"):
        bitlake.create_table(str(tmp_path / "t"), SCHEMA, storage_options={"region": "x"})


@pytest.mark.parametrize(("marker", "kind"), [("_delta_log/00000000000000000000.json", "a Delta table"),
                                              ("metadata/v1.metadata.json", "an Iceberg table"),
                                              ("_versions/1.manifest", "a lance dataset")])
def test_opening_another_formats_folder_points_to_convert(tmp_path, marker, kind):
    path = tmp_path / "other"
    (path / marker).parent.mkdir(parents=True)
    (path / marker).write_text("{}")
    with pytest.raises(bitlake.NotATableError, match=rf"is {kind}, not a bitlake table: .*bitlake convert .*"
                                                     r"bitlake\.convert\("):
        bitlake.open_table(str(path))


def test_settings_errors_are_bitlake_errors_and_still_value_errors():
    from bitlake.triggers.database import make_engine

    with pytest.raises(bitlake.InvalidSettingError, match="SQLite or PostgreSQL") as e:
        make_engine("mysql://localhost/x")
    assert isinstance(e.value, bitlake.BitlakeError) and isinstance(e.value, ValueError)


def test_a_call_that_needs_spark_without_pyspark_names_the_extra(table, monkeypatch):
    import sys

    for name in [m for m in sys.modules if m == "pyspark" or m.startswith("pyspark.")] + ["pyspark"]:
        monkeypatch.setitem(sys.modules, name, None)  # import pyspark fails, as on the Arrow-only install
    for call in (bitlake.spark_session, table.to_spark, lambda: bitlake.foreach_batch(table.path),
                 lambda: table.ingest(rows([1], ["a"], [1]), inline=False)):
        with pytest.raises(bitlake.MissingDependencyError) as e:
            call()
        assert str(e.value) == "this needs Spark, and pyspark is not installed: pip install 'bitlake[spark]'"
        assert isinstance(e.value, ImportError) and isinstance(e.value, bitlake.BitlakeError)


@pytest.mark.parametrize("same", [True, False])
def test_a_batch_id_another_writer_commits_meanwhile_compares_the_records(table, monkeypatch, same):
    from bitlake import faults

    point = faults.point
    other = bitlake.open_table(table.path)

    def meanwhile(name: str) -> None:
        if name == "after_landing":  # this writer's batch is landed, not committed: another commits the id
            monkeypatch.setattr(faults, "point", point)
            other.ingest(rows([1], ["a" if same else "other"], [1]), batch_id="b1")
        point(name)

    monkeypatch.setattr(faults, "point", meanwhile)
    if same:
        r = table.ingest(rows([1], ["a"], [1]), batch_id="b1")
        assert not r.committed and r.version == 1
    else:
        with pytest.raises(bitlake.BatchIdReusedError, match="'b1'"):
            table.ingest(rows([1], ["a"], [1]), batch_id="b1")
    assert table.version == 1 and current(table) == [(1, "a" if same else "other", 1)]


def test_the_digest_is_what_docs_format_says():
    """docs/FORMAT.md, "Batch digest", computed from the text for an int64 and a string column with a null."""
    import hashlib
    import struct

    import xxhash

    from bitlake.engine.write.digest import Digest

    t = pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": pa.array(["ab", None, "c"])})
    streams = {
        "id": b"".join(struct.pack("<q", v) for v in (1, 2, 3)),
        "name": b"abc",
        "name\0lengths": struct.pack("<qq", 2, 1),
        "name\0nulls": struct.pack("<q", 1),
    }
    for algorithm, stream_hash in [("xxh3-128-columns-v2", lambda b: xxhash.xxh3_128(b).digest()),
                                   ("sha256-columns-v1", lambda b: hashlib.sha256(b).digest())]:
        top = hashlib.sha256(algorithm.encode())
        for name in sorted(streams, key=lambda n: n.encode()):
            top.update(name.encode() + b"\0" + stream_hash(streams[name]))
        d = Digest(algorithm)
        for b in t.to_batches(max_chunksize=2):
            d.update(b)
        assert d.hexdigest() == f"{algorithm}:{top.hexdigest()}"


def test_converting_a_delta_table_without_deltalake_names_the_extra(tmp_path, monkeypatch):
    import sys

    (tmp_path / "d" / "_delta_log").mkdir(parents=True)
    monkeypatch.setitem(sys.modules, "deltalake", None)
    with pytest.raises(bitlake.MissingDependencyError, match=r"needs deltalake: pip install 'bitlake\[formats\]'"):
        bitlake.convert(str(tmp_path / "d"), str(tmp_path / "t"))
