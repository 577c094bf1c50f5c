"""A Spark DataFrame that scans Parquet files lands from the files: which DataFrames qualify, how the row groups
are cut among the tasks, and that the table holds what landing from the rows would give."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import bitlake
from bitlake.spark.landing import ParquetScan

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("mod", pa.int64())])


def rows(n, mod=1, start=0):
    ids = list(range(start, start + n))
    return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids], "mod": [mod] * n})


def new_table(tmp_path, name):
    t = bitlake.create_table(str(tmp_path / name), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.set_properties({"ingest.driver_max_bytes": "0"})  # no DataFrame is collected to the driver
    return t


def snapshot(t):
    return sorted(tuple(r.values()) for r in t.to_arrow().to_pylist())


def test_a_file_of_many_row_groups_lands_in_parallel_tasks(tmp_path, spark):
    file = tmp_path / "in.parquet"
    pq.write_table(rows(4000), file, row_group_size=500)
    t = new_table(tmp_path, "t")
    df = spark.read.parquet(str(file))
    scan = ParquetScan.of(df, t.state().metadata, None)
    assert scan is not None and len(scan.splits) >= 2  # the 2 cores of the test session's Spark
    assert [g for split in scan.splits for _, groups in split for g in groups] == list(range(8))
    r = t.ingest(df, batch_id="b", spark=spark)
    assert r.counts["inserted"] == 4000
    assert len(t.state().data_files()) == len(scan.splits)  # a task, a segment, a file
    assert snapshot(t) == sorted(tuple(r.values()) for r in rows(4000).to_pylist())


def test_the_files_land_as_the_rows_would(tmp_path, spark):
    """Duplicate keys of equal delta across row groups and files: the later row in the files' order wins, as it
    does when the same rows land in that order from a DataFrame of rows."""
    folder = tmp_path / "in"
    folder.mkdir()
    first = pa.concat_tables([rows(300), rows(100, mod=2)])
    second = rows(50, mod=2, start=50).set_column(1, "name", pa.array([f"late{i}" for i in range(50)]))
    pq.write_table(first, folder / "part-0.parquet", row_group_size=64)
    pq.write_table(second, folder / "part-1.parquet", row_group_size=16)
    from_files = new_table(tmp_path, "files")
    assert ParquetScan.of(spark.read.parquet(str(folder)), from_files.state().metadata, None) is not None
    r = from_files.ingest(spark.read.parquet(str(folder)), batch_id="b", spark=spark)
    from_rows = new_table(tmp_path, "rows")
    expected = from_rows.ingest(pa.concat_tables([first, second]), batch_id="b", spark=spark)
    assert r.counts == expected.counts == {"inserted": 300, "updated": 150, "deleted": 0, "stale": 0,
                                           "ignored_deletes": 0}
    assert snapshot(from_files) == snapshot(from_rows)
    assert ("late0", 2) in {(n, m) for _, n, m in snapshot(from_files)}


def test_files_land_in_sparks_order_not_by_name(tmp_path, spark):
    """Spark reads the larger file first: a tie between a small file named first and a large one goes to the
    small file's row, whether the DataFrame lands from the files or from Spark's rows."""
    folder = tmp_path / "in"
    folder.mkdir()
    pq.write_table(rows(1).set_column(1, "name", pa.array(["small"])), folder / "a.parquet")
    pq.write_table(rows(3000), folder / "b.parquet")
    assert [r.name for r in spark.read.parquet(str(folder)).filter("id = 0").collect()] == ["n0", "small"]
    winners = []
    for name, df in [("files", spark.read.parquet(str(folder))),
                     ("rows", spark.read.parquet(str(folder)).filter("id > -1"))]:
        t = new_table(tmp_path, name)
        assert (ParquetScan.of(df, t.state().metadata, None) is None) == (name == "rows")
        t.ingest(df, batch_id="b", spark=spark)
        winners.append([r["name"] for r in t.to_arrow().to_pylist() if r["id"] == 0])
    assert winners == [["small"], ["small"]]


def test_a_projection_of_the_columns_lands_from_the_files(tmp_path, spark):
    file = tmp_path / "in.parquet"
    pq.write_table(rows(10).append_column("extra", pa.array(range(10))), file)
    t = new_table(tmp_path, "t")
    df = spark.read.parquet(str(file)).select("mod", "id", "name")
    scan = ParquetScan.of(df, t.state().metadata, None)
    assert scan is not None and [name for name, _, _ in scan.outputs] == ["mod", "id", "name"]
    t.ingest(df, batch_id="b", spark=spark)
    assert snapshot(t) == sorted(tuple(r.values()) for r in rows(10).to_pylist())


def test_renamed_columns_and_constants_land_from_the_files(tmp_path, spark):
    """A dump without the delta column, its key renamed, deletes marked by a constant op column."""
    from pyspark.sql import functions as F

    file = tmp_path / "dump.parquet"
    pq.write_table(rows(20).drop_columns(["mod"]).rename_columns(["key", "name"]), file, row_group_size=5)
    t = new_table(tmp_path, "t")
    t.ingest(rows(30), batch_id="base", spark=spark)
    df = (spark.read.parquet(str(file)).withColumnRenamed("key", "id").withColumn("mod", F.lit(7))
          .withColumn("op", F.lit("delete")))
    scan = ParquetScan.of(df, t.state().metadata, "op")
    assert scan is not None and scan.outputs[-2:] == (("mod", None, 7), ("op", None, "delete"))
    r = t.ingest(df, op_column="op", batch_id="deletes", spark=spark)
    assert r.counts["deleted"] == 20
    assert snapshot(t) == sorted(tuple(r.values()) for r in rows(10, start=20).to_pylist())


def test_other_dataframes_land_from_their_rows(tmp_path, spark):
    file, renamed = tmp_path / "in.parquet", tmp_path / "renamed.parquet"
    pq.write_table(rows(10), file)
    pq.write_table(rows(10).rename_columns(["id", "nm", "mod"]), renamed)
    t = new_table(tmp_path, "t")
    meta = t.state().metadata
    read = spark.read.parquet(str(file))
    from pyspark.sql import functions as F

    others = {
        "filter": read.where("id > 3"),
        "expression": read.withColumn("mod", F.col("mod") + 1),
        "computed": spark.read.parquet(str(renamed)).withColumn("name", F.upper("nm")).drop("nm"),
        "option": spark.read.option("mergeSchema", "true").parquet(str(file)),
        "local rows": spark.createDataFrame(rows(3)),
        "wrong type": spark.read.parquet(str(file)).withColumn("id", F.col("id").cast("string")),
    }
    for name, df in others.items():
        assert ParquetScan.of(df, meta, None) is None, name
    # Spark may rebase INT96 times and times without a zone: such files land from Spark's rows.
    stamped = tmp_path / "stamped.parquet"
    pq.write_table(rows(3).append_column("at", pa.array([dt.datetime(2026, 1, 1)] * 3, pa.timestamp("us"))), stamped)
    with_time = bitlake.create_table(str(tmp_path / "tt"), pa.schema([*SCHEMA, ("at", pa.timestamp("us", "UTC"))]),
                                     primary_key=["id"], delta_column="mod")
    assert ParquetScan.of(spark.read.parquet(str(stamped)), with_time.state().metadata, None) is None
    int96 = tmp_path / "int96.parquet"
    pq.write_table(rows(3).append_column("at", pa.array([dt.datetime(2026, 1, 1)] * 3, pa.timestamp("us", "UTC"))),
                   int96, use_deprecated_int96_timestamps=True)
    assert ParquetScan.of(spark.read.parquet(str(int96)), with_time.state().metadata, None) is None
    # The filter still lands, from its rows.
    assert t.ingest(others["filter"], batch_id="f", spark=spark).counts["inserted"] == 6


def test_a_small_scan_is_read_by_the_driver(tmp_path, spark, monkeypatch):
    """Files of at most ingest.driver_max_bytes: pyarrow reads them on the driver, with no Spark job and nothing
    collected through the JVM."""
    file = tmp_path / "in.parquet"
    pq.write_table(rows(100), file, row_group_size=30)
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod")
    df = spark.read.parquet(str(file))

    def refused(*args, **kwargs):
        raise AssertionError("a small scan went through Spark")

    monkeypatch.setattr(ParquetScan, "land", refused)
    monkeypatch.setattr(type(df), "toArrow", refused)
    assert t.ingest(df, batch_id="b", spark=spark).counts["inserted"] == 100
    assert snapshot(t) == sorted(tuple(r.values()) for r in rows(100).to_pylist())
