"""The Spark reader's two ways of dropping rows, bitlake's row filter (a Java UDF over the plan's bitmaps) and the
left-anti join it falls back to, read the same rows as the Arrow reader, at every version and event time of a
churned table with compacted files (rows of several segments in one file) and revived rows."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyroaring import BitMap

from bitlake.engine.read import plan
from bitlake.format import rowid
from bitlake.spark import jar
from bitlake.spark import reader as spark_reader
from tests.oracle import rows_key
from tests.test_compaction import COLUMNS, TIMES, batch, churned

pytestmark = pytest.mark.spark


def spark_rows(t, spark, version, at):
    return rows_key([r.asDict() for r in t.to_spark(spark, version=version, valid_at=at).collect()], COLUMNS)


def executed(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    t = churned(str(tmp_path_factory.mktemp("reader") / "t"))
    t.metagen()
    t.compact()
    t.ingest(batch(range(0, 40, 2), 30, 500), op_column="op", batch_id="b5")  # compacted files now hold old rows
    assert any(f.offsets for f in plan.plan(t.io, t.state()).filtered)
    return t


@pytest.mark.parametrize("way", ["row filter", "join"])
def test_both_ways_read_what_the_arrow_reader_reads(table, spark, monkeypatch, way):
    assert jar.register(spark), "the session bitlake.spark_session built has the row filter"
    if way == "join":
        monkeypatch.setattr(spark_reader, "FILTER_MAX_BYTES", -1)
    df = table.to_spark(spark)
    assert ("bitlake_keep" in executed(df)) == (way == "row filter")
    assert ("LeftAnti" in executed(df)) == (way == "join")
    for v in (table.version - 2, table.version - 1, table.version):
        for at in TIMES:
            expected = rows_key(table.to_arrow(version=v, valid_at=at).to_pylist(), COLUMNS)
            assert spark_rows(table, spark, v, at) == expected, (way, v, at)


def test_the_filter_literal_names_each_segment_by_its_row_id_prefix(spark):
    from pyspark.sql import functions as F

    dropped = {(3, 1): BitMap([0, 5, 70000]), (4, 0): BitMap([2])}
    literal = spark_reader.filter_literal(dropped)
    ids = [rowid.pack(3, 1, o) for o in (0, 1, 5, 69999, 70000)] + [rowid.pack(4, 0, o) for o in (1, 2)] + [
        rowid.pack(5, 0, 0)]
    df = spark.createDataFrame(pa.table({"id": pa.array(ids, pa.int64())}))
    kept = df.filter(F.call_udf("bitlake_keep", F.lit(literal), F.col("id"))).collect()
    assert sorted(r.id for r in kept) == sorted(
        [rowid.pack(3, 1, 1), rowid.pack(3, 1, 69999), rowid.pack(4, 0, 1), rowid.pack(5, 0, 0)])


def test_a_session_without_the_jar_reads_by_the_join(table, spark, monkeypatch):
    monkeypatch.setattr(spark, "_bitlake_keep_row", False, raising=False)
    df = table.to_spark(spark)
    assert "LeftAnti" in executed(df) and "bitlake_keep" not in executed(df)
    assert rows_key([r.asDict() for r in df.collect()], COLUMNS) == rows_key(table.to_arrow().to_pylist(), COLUMNS)


def test_building_the_dataframe_of_a_table_of_many_files_runs_no_spark_job(tmp_path, spark):
    import bitlake

    t = bitlake.create_table(str(tmp_path / "many"), pa.schema([("k", pa.int64()), ("mod", pa.int64())]),
                             primary_key=["k"], delta_column="mod")
    for i in range(40):  # more files than Spark's default threshold (32) for listing them in a job
        t.ingest(pa.table({"k": [i, i + 1], "mod": [i, i]}), batch_id=f"b{i}")
    tracker = spark.sparkContext.statusTracker()
    before = set(tracker.getJobIdsForGroup(None))
    df = t.to_spark(spark)
    assert set(tracker.getJobIdsForGroup(None)) == before
    assert sorted(tuple(r) for r in df.collect()) == sorted(tuple(r.values()) for r in t.to_arrow().to_pylist())


def test_unsigned_columns_with_spark(tmp_path, spark):
    """Unsigned integers of up to 32 bits are the next wider signed type in Spark (as Spark reads Parquet), for
    reads, change feeds, Spark input and the Spark MetaGen alike (the bucket of a key is that of its value, so the
    MetaGens agree); a table with an unsigned 64-bit column, which Spark reads as a decimal, is refused by Spark
    with the column named, and stays readable by the Arrow reader."""
    import bitlake

    schema = pa.schema([("k", pa.uint32()), ("d", pa.uint16()), ("v", pa.uint8())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["k"], delta_column="d", num_buckets=4)
    top = 2**32 - 1
    t.ingest(pa.table({"k": pa.array([1, top], pa.uint32()), "d": pa.array([1, 2**16 - 1], pa.uint16()),
                       "v": pa.array([255, 0], pa.uint8())}))
    r = t.ingest(pa.table({"k": pa.array([1, top, 9], pa.uint32()), "d": pa.array([3, 2**16 - 1, 1], pa.uint16()),
                           "v": pa.array([1, 2, 3], pa.uint8())}), inline=False, spark=spark)
    assert r.counts == {"inserted": 1, "updated": 2, "deleted": 0, "stale": 0, "ignored_deletes": 0}
    r = t.ingest(spark.createDataFrame([(1, 4, 9), (9, 0, 9)], "k long, d int, v short"), inline=False, spark=spark)
    assert r.counts == {"inserted": 0, "updated": 1, "deleted": 0, "stale": 1, "ignored_deletes": 0}
    expected = [(1, 4, 9), (9, 1, 3), (top, 2**16 - 1, 2)]
    assert sorted(tuple(x.values()) for x in t.to_arrow().to_pylist()) == expected
    df = t.to_spark(spark)
    assert [f.dataType.simpleString() for f in df.schema.fields] == ["bigint", "int", "smallint"]
    assert sorted(tuple(x) for x in df.collect()) == expected
    feed = t.changes(spark, starting_version=3).select("k", "v", "_change_type").collect()
    assert sorted(tuple(x) for x in feed) == [(1, 1, "update_preimage"), (1, 9, "update_postimage")]
    source = spark.read.format("bitlake").option("validAt", "1").load(t.path)  # an option is text
    assert sorted(tuple(x) for x in source.collect()) == [(1, 1, 255), (9, 1, 3)]
    version = t.version
    for out_of_range in ([(7, 1, 300)], [(-1, 1, 3)]):
        with pytest.raises(bitlake.InvalidInputError, match="cannot hold"):
            t.ingest(spark.createDataFrame(out_of_range, "k long, d int, v short"), inline=False, spark=spark)
    assert t.version == version

    wide = bitlake.create_table(str(tmp_path / "u"), pa.schema([("k", pa.uint64()), ("d", pa.int64())]),
                                primary_key=["k"], delta_column="d")
    wide.ingest(pa.table({"k": pa.array([2**64 - 1], pa.uint64()), "d": [1]}))
    with pytest.raises(bitlake.SchemaMismatchError, match="column 'k' has type uint64.*without Spark"):
        wide.to_spark(spark)
    assert wide.to_arrow().column("k").to_pylist() == [2**64 - 1]


def test_spark_reads_delta_packed_columns_of_every_integer_kind(tmp_path, spark):
    """Columns of distinct integers are written DELTA_BINARY_PACKED (no dictionary): Spark's Parquet reader, with
    its vectorized reader and without, reads every kind stored as INT32 or INT64 (8- to 64-bit and unsigned
    integers, dates, timestamps with and without a zone, decimals stored as integers) with filters on them, as the
    Arrow reader does."""
    import datetime as dt
    import decimal

    import numpy as np
    import pyarrow.parquet as pq

    import bitlake

    n = 20_000  # enough rows for the writer to judge the columns: mostly distinct values take no dictionary
    rng = np.random.default_rng(7)
    k = rng.permutation(n).astype(np.int64) * 1_000_003 - 5_000_000_000
    schema = pa.schema([("k", pa.int64()), ("i8", pa.int8()), ("i16", pa.int16()), ("i32", pa.int32()),
                        ("u16", pa.uint16()), ("day", pa.date32()), ("at", pa.timestamp("us", tz="UTC")),
                        ("local", pa.timestamp("us")), ("d9", pa.decimal128(9, 2)), ("d18", pa.decimal128(18, 3))])
    base = dt.datetime(2001, 2, 3, 4, 5, 6)
    rows = pa.table({
        "k": k, "i8": (k % 251 - 125).astype(np.int8), "i16": (k % 65_521 - 32_000).astype(np.int16),
        "i32": (k // 7).astype(np.int32), "u16": (k % 65_535).astype(np.uint16),
        "day": pa.array([dt.date(1900, 1, 1) + dt.timedelta(days=int(x) % 60_000) for x in k], pa.date32()),
        "at": pa.array([base + dt.timedelta(microseconds=int(x)) for x in k], pa.timestamp("us", tz="UTC")),
        "local": pa.array([base - dt.timedelta(seconds=int(x) % 10**9) for x in k], pa.timestamp("us")),
        "d9": pa.array([decimal.Decimal(int(x) % 10**8).scaleb(-2) for x in k], pa.decimal128(9, 2)),
        "d18": pa.array([decimal.Decimal(int(x)).scaleb(-3) for x in k], pa.decimal128(18, 3)),
    }, schema=schema)
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["k"], delta_column="i32", num_buckets=1)
    t.ingest(rows)
    files = [str(tmp_path / "t" / f.path) for f in t.state().data_files()]
    chunks = pq.ParquetFile(files[0]).metadata.row_group(0)
    packed = {chunks.column(i).path_in_schema for i in range(chunks.num_columns)
              if "DELTA_BINARY_PACKED" in chunks.column(i).encodings}
    assert set(schema.names) - {"i8", "u16"} <= packed  # i8 and u16 repeat enough for a dictionary
    where = "i32 > 0 AND d18 < 3000000 AND day > DATE'1950-01-01' AND at > TIMESTAMP'2001-02-03 04:00:00 UTC'"
    cutoff = dt.datetime(2001, 2, 3, 4, tzinfo=dt.UTC)
    expected = [r for r in t.to_arrow().to_pylist()
                if r["i32"] > 0 and r["d18"] < 3_000_000 and r["day"] > dt.date(1950, 1, 1) and r["at"] > cutoff]
    assert 0 < len(expected) < n
    try:
        for vectorized in ("true", "false"):
            spark.conf.set("spark.sql.parquet.enableVectorizedReader", vectorized)
            got = spark.read.parquet(*files).where(where).select(*schema.names).collect()
            assert sorted(_comparable(r.asDict()) for r in got) == sorted(_comparable(r) for r in expected)
    finally:
        spark.conf.unset("spark.sql.parquet.enableVectorizedReader")


def _comparable(row: dict) -> tuple:
    """A row's values with timestamps as microseconds since the epoch (Spark returns them in the session's zone)."""
    import datetime as dt

    def value(v):
        if isinstance(v, dt.datetime):
            v = v if v.tzinfo is not None else v.replace(tzinfo=dt.UTC)
            return round(v.timestamp() * 1_000_000)
        return v

    return tuple(value(v) for v in row.values())
