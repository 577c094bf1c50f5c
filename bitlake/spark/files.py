"""Spark DataFrames of a table's files, wherever the table lives.

Spark's JVM reads local and HDFS paths with its own Parquet and ORC readers. Object stores it cannot reach
without extra jars (s3a needs hadoop-aws): there the executors read the files through the table's
:class:`~bitlake.fs.FileIO` (obstore), in a Python task per group of files that yields Arrow batches
(``mapInArrow``). Both give the same columns; docs/benchmarks.md compares them.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from bitlake.errors import InvalidInputError
from bitlake.format import datafile
from bitlake.fs import FileIO
from bitlake.spark.schema import spark_schema, spark_typed


def require_shared(io: FileIO) -> None:
    """Refuses a Spark job on a table other processes cannot see (a ``memory://`` store)."""
    if io.process_local:
        raise InvalidInputError(f"{io.uri()} lives in this process's memory: Spark's workers cannot reach it; "
                                "use the Arrow paths (inline MetaGen, to_arrow) or a shared store")


@dataclasses.dataclass
class _ReadFiles:
    io: FileIO
    schema: pa.Schema
    file_format: str

    def __call__(self, batches):
        for rb in batches:
            for path in rb.column(0).to_pylist():
                yield from spark_typed(datafile.read_batches(self.io, path, self.schema, self.file_format))


def read(spark, io: FileIO, paths: list[str], schema: pa.Schema, file_format: str = "parquet"):
    """The rows of the files at ``paths`` (relative to the table) as a DataFrame of ``schema``. A partition
    column's values come from the files, which hold them, never from the partition folders' names: Spark would
    decode a folder's escaped UTF-8 bytes one character each, and refuses an empty value."""
    require_shared(io)
    if io.spark_readable:
        return spark.read.format(file_format).schema(spark_schema(schema)).load([io.uri(p) for p in paths])
    tasks = max(1, min(len(paths), parallelism(spark) * 2))
    listing = spark.createDataFrame([(p,) for p in paths], "path string").repartition(tasks)
    return listing.mapInArrow(_ReadFiles(io, schema, file_format), spark_schema(schema))


def parallelism(spark) -> int:
    """The cores Spark runs tasks on (a Spark Connect session has no SparkContext: its shuffle partitions)."""
    try:
        return spark.sparkContext.defaultParallelism
    except Exception:  # noqa: BLE001 - pyspark.errors.PySparkNotImplementedError on Spark Connect
        return int(spark.conf.get("spark.sql.shuffle.partitions"))


@dataclasses.dataclass
class _Value:
    value: object


def shared(spark, value):
    """``value`` for the tasks of a job, as ``.value``: a broadcast variable, or on Spark Connect (which has
    none) the value itself, shipped with each task."""
    try:
        return spark.sparkContext.broadcast(value)
    except Exception:  # noqa: BLE001 - pyspark.errors.PySparkNotImplementedError on Spark Connect
        return _Value(value)


def num_partitions(df) -> int | None:
    """``df``'s number of partitions; None on Spark Connect, which does not say."""
    try:
        return df.rdd.getNumPartitions()
    except Exception:  # noqa: BLE001
        return None
