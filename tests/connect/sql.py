"""Run by tests/test_spark_sql.py in its own process: a Spark Connect client (no JVM in this process) names a bitlake
table in Spark SQL on a server started with bitlake's session extension and catalog, reads it by name and at a
version, writes it by name, and finds the rows ``Table.to_arrow`` returns. The column pruning shows in the plan
the server explains.

Usage: sql.py sc://host:port FOLDER. Prints "ok"."""

from __future__ import annotations

import sys

import pyarrow as pa
from pyspark.sql import SparkSession

import bitlake

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("ts", pa.int64())])


def rows(records) -> list[tuple]:
    return sorted((r["id"], r["v"], r["ts"]) for r in records)


def main(url: str, folder: str) -> None:
    spark = SparkSession.builder.remote(url).getOrCreate()
    assert type(spark).__module__.startswith("pyspark.sql.connect"), type(spark)
    bitlake.register_data_source(spark)  # CREATE TABLE ... USING bitlake looks the provider up
    t = bitlake.create_table(f"{folder}/t", SCHEMA, primary_key=["id"], delta_column="ts")
    t.ingest(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"], "ts": [1, 1, 1]}, schema=SCHEMA))
    t.ingest(pa.table({"id": [2], "v": ["B"], "ts": [2]}, schema=SCHEMA))
    spark.sql(f"CREATE TABLE accounts USING bitlake LOCATION '{t.path}'")
    assert rows(spark.sql("SELECT * FROM accounts").collect()) == rows(t.to_arrow().to_pylist())
    assert rows(spark.sql("SELECT * FROM accounts VERSION AS OF 1").collect()) == rows(
        t.to_arrow(version=1).to_pylist())
    plan = spark.sql("SELECT v FROM accounts WHERE id > 1")._explain_string()
    assert "ReadSchema: struct<id:bigint,v:string" in plan and "GreaterThan(id,1)" in plan, plan
    spark.sql("INSERT INTO accounts VALUES (4, 'd', 3)").collect()
    spark.sql("DELETE FROM accounts WHERE id = 1").collect()
    assert t.version == 4, t.history()
    assert rows(spark.sql("SELECT * FROM accounts").collect()) == rows(t.to_arrow().to_pylist()) == [
        (2, "B", 2), (3, "c", 1), (4, "d", 3)]
    spark.stop()
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:])
