"""The Spark Python Data Source: ``spark.read.format("bitlake")`` returns what the table API returns for every
read option, Spark filters pushed to the scans select what Spark selects, and ``df.write.format("bitlake")``
ingests one batch exactly once, on local folders and on moto's S3 server."""

from __future__ import annotations

import datetime as dt
import time

import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException

import bitlake
from tests.oracle import rows_key

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("k", pa.int64()), ("name", pa.string()), ("day", pa.date32()), ("score", pa.float64()),
                    ("flag", pa.bool_()), ("mod", pa.timestamp("us", tz="UTC"))])
COLUMNS = SCHEMA.names
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _batch(keys, version, deletes=()):
    return pa.table({
        "k": pa.array(keys, pa.int64()),
        "name": pa.array([None if k % 7 == 0 else f"n{k % 5}-{version}" for k in keys], pa.string()),
        "day": pa.array([dt.date(2026, 1, 1 + k % 20) for k in keys], pa.date32()),
        "score": pa.array([k * 0.5 + version for k in keys], pa.float64()),
        "flag": pa.array([(k + version) % 2 == 0 for k in keys], pa.bool_()),
        "mod": pa.array([T0 + dt.timedelta(hours=version * 10 + k % 3) for k in keys], pa.timestamp("us", tz="UTC")),
        "op": pa.array(["delete" if k in deletes else "upsert" for k in keys], pa.string()),
    })


def _build(path, **options):
    t = bitlake.create_table(path, SCHEMA, primary_key=["k"], delta_column="mod", partition_by=["flag"],
                             properties={"compact.min_input_files": "2"}, **options)
    t.ingest(_batch(list(range(60)), 1), op_column="op", batch_id="b1")
    times = [t.history()[0]["timestamp"]]
    time.sleep(0.02)
    t.ingest(_batch(list(range(0, 60, 4)), 2, deletes={8, 16}), op_column="op", batch_id="b2")
    times.append(t.history()[0]["timestamp"])
    t.ingest(_batch(list(range(50, 80)), 3), op_column="op", batch_id="b3")
    t.compact()
    return t, times


def _rows(df) -> list[tuple]:
    return rows_key([_utc(r.asDict()) for r in df.collect()], COLUMNS)


def _leftovers(t) -> list[str]:
    """Files no commit names, but the segment-part claims (which stay until a cleanup)."""
    return [p for p in t.cleanup(min_age_seconds=0, dry_run=True) if not p.startswith("_bitlake/parts/")]


def _utc(row: dict) -> dict:
    return {k: v.replace(tzinfo=dt.UTC) if isinstance(v, dt.datetime) and v.tzinfo is None else v
            for k, v in row.items()}


@pytest.fixture(scope="module")
def table(spark, tmp_path_factory):
    return _build(str(tmp_path_factory.mktemp("ds") / "t"))


def test_every_read_option_returns_what_the_table_api_returns(spark, table):
    t, times = table
    read = spark.read.format("bitlake")
    assert _rows(read.load(t.path)) == rows_key(t.to_arrow().to_pylist(), COLUMNS)
    for v in range(t.version + 1):
        got = _rows(read.option("versionAsOf", v).load(t.path))
        assert got == rows_key(t.to_arrow(version=v).to_pylist(), COLUMNS), v
    for when in times:
        got = _rows(spark.read.format("bitlake").option("timestampAsOf", when).load(t.path))
        assert got == rows_key(t.to_arrow(as_of=when).to_pylist(), COLUMNS), when
    at = (T0 + dt.timedelta(hours=21)).isoformat()
    got = _rows(spark.read.format("bitlake").option("validAt", at).load(t.path))
    assert got == rows_key(t.to_arrow(valid_at=at).to_pylist(), COLUMNS)
    assert got != _rows(spark.read.format("bitlake").load(t.path)), "the event time is not the latest"


def test_the_change_feed_option_reads_delta_style_inclusive_starting_versions(spark, table):
    t, _ = table
    for start in (0, 1, 2, 3):
        for end in (None, 2, 3):
            if end is not None and end < start:
                continue
            reader = spark.read.format("bitlake").option("readChangeFeed", "true").option("startingVersion", start)
            if end is not None:
                reader = reader.option("endingVersion", end)
            got = sorted((r["_change_type"], r["_commit_version"], r["k"]) for r in reader.load(t.path).collect())
            want = sorted((r["_change_type"], r["_commit_version"], r["k"]) for r in t.changes_to_arrow(
                starting_version=start, ending_version=end).to_pylist())
            assert got == want and want, (start, end)
    with pytest.raises(AnalysisException, match="startingVersion"):
        spark.read.format("bitlake").option("readChangeFeed", "true").load(t.path).collect()
    with pytest.raises(AnalysisException, match=f"startingVersion {t.version + 2} does not exist"):
        spark.read.format("bitlake").option("readChangeFeed", "true").option("startingVersion", t.version + 2) \
            .load(t.path).collect()


CONDITIONS = [
    "k = 12", "k > 40", "k >= 40 and k < 55", "k in (1, 2, 3, 58, 77)", "not (k < 70)", "name = 'n1-1'",
    "name is null", "name is not null and k < 10", "name like 'n2%'", "day = date'2026-01-05'",
    "day > date'2026-01-15'", "score <= 10.5", "flag = true", "flag", "k = 12 or k = 13",
    "mod > timestamp'2026-01-02 06:00:00'", "k = 12 and flag = false",
]


@pytest.mark.parametrize("condition", CONDITIONS)
def test_pushed_filters_select_what_spark_selects(spark, table, condition):
    t, _ = table
    got = _rows(spark.read.format("bitlake").load(t.path).filter(condition))
    assert got == _rows(t.to_spark(spark).filter(condition)), condition


def test_a_dataframe_queried_again_keeps_every_row(spark, table):
    """Filters are Spark's alone (a reader Spark keeps for the DataFrame sees no query's filters), so the same
    DataFrame filtered, then counted, collected or filtered otherwise, keeps every row; NaN compares as Spark
    compares it."""
    import math

    from pyspark.sql import functions as F

    t, _ = table
    df = spark.read.format("bitlake").load(t.path)
    everything = df.count()
    assert df.filter(F.col("k") > 70).count() < everything
    assert df.count() == everything and len(df.collect()) == everything
    assert df.filter(F.col("k") <= 70).count() == everything - df.filter(F.col("k") > 70).count()
    f = bitlake.create_table(str(t.path) + "-nan", pa.schema([("k", pa.int64()), ("x", pa.float64())]))
    f.ingest(pa.table({"k": [1, 2, 3], "x": [math.nan, 1.0, 5.0]}))
    floats = spark.read.format("bitlake").load(f.path)
    assert sorted(r.k for r in floats.filter(F.col("x") > 2.0).collect()) == [1, 3]  # NaN is above every number


def test_writes_ingest_one_batch_exactly_once(spark, tmp_path):
    t, _ = _build(str(tmp_path / "t"))
    before = rows_key(t.to_arrow().to_pylist(), COLUMNS)
    data = spark.createDataFrame(_batch(list(range(70, 90)), 4, deletes={75, 89}).to_pandas()).repartition(3)
    writer = data.write.format("bitlake").mode("append").option("batchId", "w1").option("opColumn", "op")
    writer.save(t.path)
    version = t.version
    assert t.history()[0]["operation"] == "INGEST" and t.history()[0]["batch_id"] == "w1"
    counts = t.history()[0]["counts"]  # keys 70-79 exist: 75 deleted, 9 updated; 80-88 new; 89's delete ignored
    assert (counts["updated"], counts["deleted"], counts["inserted"], counts["ignored_deletes"]) == (9, 1, 9, 1)
    expected = rows_key(t.to_arrow().to_pylist(), COLUMNS)
    assert expected != before and not any(r["k"] in (75, 89) for r in t.to_arrow().to_pylist())
    writer.save(t.path)  # a retried write (a restarted job) applies nothing
    assert t.version == version and rows_key(t.to_arrow().to_pylist(), COLUMNS) == expected
    assert _leftovers(t) == [], "the retry left no files"


def test_bad_writes_are_refused_and_leave_nothing(spark, tmp_path):
    t, _ = _build(str(tmp_path / "t"))
    version = t.version
    ok = spark.createDataFrame(_batch([1, 2], 5).drop_columns(["op"]).to_pandas())
    with pytest.raises(AnalysisException, match="overwrite"):
        ok.write.format("bitlake").mode("overwrite").save(t.path)
    with pytest.raises(AnalysisException, match="'extra' is not in the table schema"):
        ok.selectExpr("*", "1 as extra").write.format("bitlake").mode("append").save(t.path)
    nulls = spark.createDataFrame(_batch([1, 2], 5).drop_columns(["op"]).to_pandas()).selectExpr(
        "cast(null as long) as k", "name", "day", "score", "flag", "mod")
    with pytest.raises(Exception, match="null"):
        nulls.write.format("bitlake").mode("append").save(t.path)
    with pytest.raises(AnalysisException, match="needs the table"):
        ok.write.format("bitlake").mode("append").save()
    assert t.version == version
    assert _leftovers(t) == [], "nothing half-written"


def test_sql_reads_a_table_through_the_data_source(spark, table):
    t, _ = table
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW ds_sql USING bitlake OPTIONS (path '{t.path}', versionAsOf '2')")
    got = spark.sql("SELECT count(*) AS n, sum(k) AS s FROM ds_sql").collect()[0]
    rows = t.to_arrow(version=2).to_pylist()
    assert (got["n"], got["s"]) == (len(rows), sum(r["k"] for r in rows))


@pytest.mark.s3
def test_the_data_source_on_s3(spark, s3_server):
    """Spark's Python workers started before the store's variables were set: the ``storage.*`` options carry
    the endpoint and credentials."""
    uri = s3_server.uri("ds")
    t, _ = _build(uri)
    storage = {f"storage.{k}": v for k, v in s3_server.options.items()}
    df = spark.read.format("bitlake").options(**storage).load(uri)
    assert _rows(df) == rows_key(t.to_arrow().to_pylist(), COLUMNS)
    assert _rows(df.filter("k > 50")) == _rows(t.to_spark(spark).filter("k > 50"))
    data = spark.createDataFrame(_batch(list(range(100, 110)), 4).to_pandas())
    data.write.format("bitlake").mode("append").options(**storage).option("opColumn", "op").option(
        "batchId", "s3w").save(uri)
    assert sorted(r["k"] for r in t.to_arrow().to_pylist() if r["k"] >= 100) == list(range(100, 110))
    assert t.io.local_path() is None


def test_a_version_reads_with_its_own_schema(spark, tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), pa.schema([("k", pa.int64()), ("d", pa.int64())]),
                             primary_key=["k"], delta_column="d")
    t.ingest(pa.table({"k": [1], "d": [1]}))
    t.add_columns([pa.field("note", pa.string())])
    t.ingest(pa.table({"k": [2], "d": [1], "note": ["n"]}))
    old = spark.read.format("bitlake").option("versionAsOf", 1).load(t.path)
    assert old.columns == ["k", "d"] and [tuple(r) for r in old.collect()] == [(1, 1)]
    now = spark.read.format("bitlake").load(t.path)
    assert sorted(tuple(r) for r in now.collect()) == [(1, 1, None), (2, 1, "n")]


def test_an_abort_after_the_commit_landed_deletes_nothing(tmp_path):
    """Spark calls abort when the writer's commit raised, also when the commit landed and a step after it failed:
    abort must keep the files that commit names (it deleted them: every read failed)."""
    from pyspark.sql.types import LongType, StructField, StructType

    from bitlake import datasource, faults
    from bitlake.engine.write import landing
    from bitlake.engine.write.conform import conformed

    schema = pa.schema([("k", pa.int64()), ("d", pa.int64())])
    path = str(tmp_path / "t")
    bitlake.create_table(path, schema, primary_key="k", delta_column="d").ingest(pa.table({"k": [1], "d": [1]}))
    w = datasource.BatchWriter({"path": path, "batchId": "w1"},
                               StructType([StructField("k", LongType()), StructField("d", LongType())]))
    rows = conformed(pa.RecordBatchReader.from_batches(schema, pa.table({"k": [2, 3], "d": [2, 2]}).to_batches()),
                     w.meta, None)
    messages = [datasource._Landed(landing.LandTask(w.io, w.meta.to_json(), w.part, datasource.STRIDE, False)
                                   .run(0, rows))]
    with faults.inject("after_checkpoint", OSError("a step after the commit failed")), pytest.raises(OSError):
        w.commit(messages)
    w.abort(messages)
    assert sorted(r["k"] for r in bitlake.open_table(path).to_arrow().to_pylist()) == [1, 2, 3]
