"""Run by tests/test_cluster.py in its own process: a SparkSession on a standalone cluster (a master and two
workers, each its own JVM and working folder) ingests into and reads a table on moto's S3 server, so no
step can rely on this process's disk or a shared folder. The Arrow reads on this process agree.

Usage: check.py spark://host:port S3_URI. Prints "ok"."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

import bitlake

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repository's root

from tests.sparkservers import wait_executors  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("g", pa.string()), ("v", pa.int64()), ("ts", pa.int64())])


def rows(df) -> list[tuple]:
    return sorted(tuple(r) for r in df.select("id", "g", "v", "ts").collect())


def arrow_rows(table: pa.Table) -> list[tuple]:
    return sorted((r["id"], r["g"], r["v"], r["ts"]) for r in table.to_pylist())


def main(master: str, uri: str) -> None:
    spark = (SparkSession.builder.master(master).appName("bitlake-cluster-test")
             .config("spark.executor.memory", "512m").config("spark.executor.cores", "1")
             .config("spark.sql.session.timeZone", "UTC").config("spark.sql.shuffle.partitions", "4")
             .config("spark.jars", bitlake.spark_jar())  # the row filter, shipped to the workers
             .getOrCreate())
    bitlake.register_data_source(spark)
    assert wait_executors(spark, 2) == 2, "not every worker gave an executor within 120 s"
    t = bitlake.create_table(uri, SCHEMA, primary_key=["id"], delta_column="ts", partition_by=["g"])
    base = spark.range(0, 20000, numPartitions=4).selectExpr("id", "concat('g', id % 3) AS g", "id AS v", "1L AS ts")
    r = t.ingest(base, inline=False, spark=spark)  # lands on the workers; MetaGen as a Spark job on the workers
    assert r.counts["inserted"] == 20000, r
    changes = spark.range(0, 20000, 7, numPartitions=3).selectExpr(
        "id", "concat('g', id % 3) AS g", "-id AS v", "2L AS ts", "if(id % 5 = 0, 'delete', 'upsert') AS op")
    r = t.ingest(changes, op_column="op", inline=False, spark=spark)
    assert r.counts["deleted"] + r.counts["updated"] == 2858, r
    current = t.to_spark(spark)
    assert "bitlake_keep" in current._jdf.queryExecution().executedPlan().toString()  # runs on the workers
    assert rows(current) == arrow_rows(t.to_arrow())
    assert rows(spark.read.format("bitlake").load(uri)) == arrow_rows(t.to_arrow())
    assert rows(t.to_spark(spark, version=1)) == arrow_rows(t.to_arrow(version=1))
    feed = t.changes(spark, starting_version=2).groupBy("_change_type").count().collect()
    assert {x["_change_type"]: x["count"] for x in feed} == {"update_preimage": 2286, "update_postimage": 2286,
                                                            "delete": 572}
    # A Parquet file Spark reads lands from its row groups, which the workers' tasks read themselves (the file is
    # on this host, which the workers share, as Spark needs of any file: path).
    folder = tempfile.mkdtemp(prefix="bitlake-cluster-input-")
    ids = pa.array(range(20000, 25000), pa.int64())
    more = pa.table({"id": ids, "g": pa.array([f"g{i % 3}" for i in range(20000, 25000)]), "v": ids,
                     "ts": pa.array([3] * 5000, pa.int64())})
    pq.write_table(more, f"{folder}/more.parquet", row_group_size=500)
    t.set_properties({"ingest.driver_max_bytes": "0"})
    before = len(t.state().data_files())
    r = t.ingest(spark.read.parquet(f"file://{folder}/more.parquet"), spark=spark)
    assert r.counts["inserted"] == 5000, r
    # Several tasks, each writing a file per partition folder (Spark's one partition of the file: one task).
    assert len(t.state().data_files()) - before > 3
    assert rows(t.to_spark(spark)) == arrow_rows(t.to_arrow())
    shutil.rmtree(folder, ignore_errors=True)
    spark.stop()
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:])
