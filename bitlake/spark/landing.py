"""The Spark landing job: every task runs :class:`bitlake.engine.landing.LandTask` on its partition
(``mapInArrow``) and reports the files it wrote; the driver collects the reports."""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from bitlake.engine.landing import REPORT_DDL, REPORT_SCHEMA, LandTask, collect, remove_part_files
from bitlake.format.commit import DataFile, KeysFile
from bitlake.format.metadata import TableMetadata


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
    task = LandTask(io, meta.to_json(), part, max(df.rdd.getNumPartitions(), 1), has_op)
    try:
        reports = [r.asDict() for r in df.mapInArrow(_SparkLandTask(task), REPORT_DDL).collect()]
    except Exception:
        remove_part_files(io, part)
        raise
    return collect(io, meta, part, iter(reports))
