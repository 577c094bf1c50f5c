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
