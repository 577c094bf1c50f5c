"""Run by tests/test_connect.py in its own process: a Spark Connect client session (no JVM in this process)
reads and writes bitlake tables through the data source, ``Table.to_spark``, ``Table.ingest`` of a Spark
DataFrame (a Spark landing job and a Spark MetaGen) and ``Table.changes``; the Arrow reads agree.

Usage: check.py sc://host:port FOLDER [S3_URI]. Prints "ok"."""

from __future__ import annotations

import sys

import pyarrow as pa
from pyspark.sql import SparkSession

import bitlake

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("ts", pa.int64())])


def rows(df) -> list[tuple]:
    return sorted((r["id"], r["v"], r["ts"]) for r in df.collect())


def arrow_rows(t) -> list[tuple]:
    return sorted((r["id"], r["v"], r["ts"]) for r in t.to_arrow().to_pylist())


def check(spark, path: str, storage: dict) -> None:
    t = bitlake.create_table(path, SCHEMA, primary_key=["id"], delta_column="ts", storage_options=storage or None)
    t.ingest(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"], "ts": [1, 1, 1]}))
    read = spark.read.format("bitlake").options(**{f"storage.{k}": v for k, v in storage.items()})
    assert rows(read.load(path)) == arrow_rows(t)
    assert rows(t.to_spark(spark)) == arrow_rows(t)
    df = spark.createDataFrame([(4, "d", 2), (1, "A", 2)], "id long, v string, ts long")
    df.write.format("bitlake").mode("append").options(**{f"storage.{k}": v for k, v in storage.items()}).option(
        "batchId", "connect-write").save(path)
    assert t.history()[0]["batch_id"] == "connect-write" and (1, "A", 2) in arrow_rows(t)
    big = spark.range(10, 500).selectExpr("id", "concat('x', id) AS v", "3L AS ts")
    r = t.ingest(big, inline=False, spark=spark)  # a Spark landing job and a Spark MetaGen, from a client
    assert r.counts["inserted"] == 490, r
    deletes = spark.createDataFrame([(10, None, 4, "delete"), (2, "B", 4, "upsert")], "id long, v string, ts long, op string")
    assert t.ingest(deletes, op_column="op", inline=False, spark=spark).counts["deleted"] == 1
    assert rows(t.to_spark(spark)) == arrow_rows(t)
    assert rows(read.option("versionAsOf", 2).load(path)) == sorted(
        (r["id"], r["v"], r["ts"]) for r in t.to_arrow(version=2).to_pylist())
    feed = sorted((r["_change_type"], r["_commit_version"], r["id"]) for r in t.changes(spark, starting_version=2).collect())
    assert feed == sorted((r["_change_type"], r["_commit_version"], r["id"])
                          for r in t.changes_to_arrow(starting_version=2).to_pylist())


def main(url: str, folder: str, s3_uri: str | None = None) -> None:
    spark = SparkSession.builder.remote(url).getOrCreate()
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    bitlake.register_data_source(spark)
    check(spark, f"{folder}/t", {})
    if s3_uri:
        import os

        keys = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION", "AWS_ALLOW_HTTP")
        check(spark, s3_uri, {k: os.environ[k] for k in keys})
    spark.stop()
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:])
