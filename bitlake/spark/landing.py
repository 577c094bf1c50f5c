"""The Spark landing job: every task runs :class:`bitlake.engine.landing.LandTask` on its partition
(``mapInArrow``) and reports the files it wrote; the driver collects the reports."""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from bitlake.engine.landing import REPORT_DDL, REPORT_SCHEMA, LandTask, collect, remove_part_files
from bitlake.format.commit import DataFile, KeysFile
from bitlake.format.metadata import TableMetadata
from bitlake.spark.files import num_partitions, parallelism, require_shared


@dataclasses.dataclass
class _SparkLandTask:
    task: LandTask

    def __call__(self, batches):
        from pyspark import TaskContext

        rows = self.task.run(TaskContext.get().partitionId(), batches)
        yield pa.RecordBatch.from_pylist(rows, schema=REPORT_SCHEMA)


def land(df, io, meta: TableMetadata, part: int, has_op: bool) -> tuple[list[DataFile], list[KeysFile]]:
    """Writes ``df`` (conformed to the table schema) as the files of segment part ``part``.

    Raises NullValueError / UnknownOperationError after removing every file the job wrote.
    """
    require_shared(io)
    df = spread(df)
    tasks = num_partitions(df)
    if tasks is None:  # Spark Connect does not say: a known number of tasks, each numbering its own segments
        tasks = parallelism(df.sparkSession)
        df = by_position(df, tasks)
    task = LandTask(io, meta.to_json(), part, max(tasks, 1), has_op)
    try:
        reports = [r.asDict() for r in df.mapInArrow(_SparkLandTask(task), REPORT_DDL).collect()]
    except Exception:
        remove_part_files(io, part)
        raise
    return collect(io, meta, part, iter(reports))


_POSITION = "_bitlake_position"


def spread(df):
    """``df`` over every core when it has fewer partitions than cores but would fill them: a large file of one
    row group is one Spark partition, which would land in one task. The rows are range-partitioned by their
    position (``monotonically_increasing_id`` grows with partition and row order), so partition ``i`` holds
    rows before those of partition ``i + 1`` and row ids keep following the input order (:func:`by_position`)."""

    spark = df.sparkSession
    cores = parallelism(spark)
    partitions = num_partitions(df)
    if partitions is None or partitions >= cores:
        return df
    split_bytes = _bytes(spark.conf.get("spark.sql.files.maxPartitionBytes", "134217728"))
    size = estimated_bytes(df)
    if size is None:
        return df
    wanted = min(cores, size // max(split_bytes, 1))
    if wanted <= partitions:
        return df
    return by_position(df, int(wanted))


def by_position(df, partitions: int):
    """``df`` in ``partitions`` partitions that keep its row order: partition ``i`` holds rows before those of
    partition ``i + 1`` (``monotonically_increasing_id`` grows with partition and row order)."""
    from pyspark.sql import functions as F

    columns = df.columns
    return (df.withColumn(_POSITION, F.monotonically_increasing_id())
            .repartitionByRange(partitions, _POSITION).sortWithinPartitions(_POSITION).select(*columns))


def estimated_bytes(df) -> int | None:
    """Spark's estimate of ``df``'s size (exact for local data, the files' size for a scan); None without one
    (a Spark Connect session has no JVM handle)."""
    try:
        size = df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes()  # a Scala BigInt
    except Exception:  # noqa: BLE001
        return None
    return size if isinstance(size, int) else int(size.toString())


def _bytes(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().rstrip("b")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1:] in units else int(text)
