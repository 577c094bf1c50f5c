"""The Spark landing job: every task runs :class:`bitlake.engine.write.landing.LandTask` on its share of the batch
and reports the files it wrote; the driver collects the reports.

A task gets its share in one of two ways. A DataFrame that is a plain scan of local Parquet files (what
``spark.read.parquet(path)`` returns, or a projection of it to columns and constants) lands from the files:
each task reads a range of their row groups itself with pyarrow (:class:`ParquetScan`), so a large file lands
in parallel and the rows never pass through the JVM. Any other DataFrame lands from its rows, which Spark
hands each task as Arrow batches (``mapInArrow``); that conversion alone costs about what Spark's whole
Parquet write does (docs/ingestion.md).
"""

from __future__ import annotations

import dataclasses
import itertools
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from bitlake.engine.write import conform
from bitlake.engine.write.landing import REPORT_DDL, REPORT_SCHEMA, LandTask, collect, remove_part_files
from bitlake.errors import SchemaMismatchError
from bitlake.format.commit import DataFile, KeysFile
from bitlake.format.metadata import TableMetadata
from bitlake.pool import thread_map
from bitlake.spark.files import num_partitions, parallelism, require_shared
from bitlake.spark.schema import conform_spark_input


def landing(data, meta: TableMetadata, op_column: str | None, driver_max_bytes: int):
    """How Spark DataFrame ``data`` lands, checked against the table before anything is written.

    Returns ``(reader, rows, None)`` when the driver lands it: a scan of files of at most ``driver_max_bytes``
    read by pyarrow, or a DataFrame Spark's plan estimates that small collected as Arrow (which spares a small
    batch a job's fixed cost). Else ``(None, None, land)``: ``land(io, part)`` runs a landing job, from the
    files of a scan or from the DataFrame's rows, and returns (data files, keys files).
    """
    scan = ParquetScan.of(data, meta, op_column)
    size = scan.bytes if scan is not None else estimated_bytes(data)
    if size is not None and size <= driver_max_bytes:
        if scan is not None:
            return scan.reader(), scan.rows, None
        collected = data.toArrow()
        return collected.to_reader(), collected.num_rows, None
    if scan is not None:
        return None, None, lambda io, part: scan.land(data.sparkSession, io, meta, part, op_column)

    df = conform_spark_input(data, meta, op_column)
    return None, None, lambda io, part: land(df, io, meta, part, op_column is not None)


@dataclasses.dataclass
class _SparkLandTask:
    task: LandTask

    def __call__(self, batches):
        from pyspark import TaskContext

        rows = self.task.run(TaskContext.get().partitionId(), batches)
        yield pa.RecordBatch.from_pylist(rows, schema=REPORT_SCHEMA)


def land(df, io, meta: TableMetadata, part: int, has_op: bool) -> tuple[list[DataFile], list[KeysFile]]:
    """Writes the rows of ``df`` (conformed to the table schema) as the files of segment part ``part``.

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


# Options of a Parquet scan that leave its rows as pyarrow reads them; any other (mergeSchema, a rebase mode)
# makes the batch land from its rows.
_PLAIN_OPTIONS = {"path", "paths"}
# Spark's marks of files whose dates and times it rebases from the hybrid Julian calendar when it reads them.
_LEGACY_KEYS = (b"org.apache.spark.legacyDateTime", b"org.apache.spark.legacyINT96")
_READ_ROWS = 1 << 16


@dataclasses.dataclass(frozen=True)
class ParquetScan:
    """A DataFrame that is a plain scan of local Parquet files, cut into the row-group ranges its landing
    tasks read: ``splits[i]`` lists task ``i``'s (file path, row groups), in the files' order, so row ids follow
    the files' rows. Each of the DataFrame's columns (``outputs``) is a file column, renamed or not, or a
    constant."""

    outputs: tuple[tuple[str, str | None, object], ...]  # (name, the file column or None, else the constant)
    schema: pa.Schema  # the DataFrame's columns as pyarrow reads them
    splits: tuple[tuple[tuple[str, tuple[int, ...]], ...], ...]
    rows: int
    bytes: int  # the files' stored bytes

    @classmethod
    def of(cls, df, meta: TableMetadata, op_column: str | None) -> ParquetScan | None:
        """``df`` as a scan of its files when Spark's optimized plan is a relation of Parquet files (no
        partition folders, filters or read options), or a projection of it to columns, renamed columns and
        constants, whose files pyarrow reads as Spark does and whose columns conform to the table; else None."""
        plain = _plain_scan(df)
        if plain is None:
            return None
        paths, outputs, constant_types = plain
        try:
            footers = thread_map(pq.read_metadata, paths)
        except (OSError, pa.ArrowException):
            return None  # a file pyarrow cannot read: Spark's rows say what is wrong with it
        schemas = {_projected(f.schema.to_arrow_schema(), outputs, constant_types) for f in footers}
        if len(schemas) != 1 or None in schemas or not all(_as_pyarrow_reads(f) for f in footers):
            return None
        schema = schemas.pop()
        try:
            conform.Conformer(schema, meta, op_column)
        except SchemaMismatchError:
            return None  # the rows' landing names the problem as it does for any DataFrame
        order = _spark_order(df, dict(zip(paths, footers, strict=True)))
        if order is None:
            return None  # the rows' landing reads them in Spark's order
        splits = _splits(order, df.sparkSession)
        if not splits:
            return None
        return cls(outputs, schema, splits, sum(f.num_rows for f in footers),
                   sum(_stored_bytes(f.row_group(g)) for f in footers for g in range(f.num_row_groups)))

    def land(self, spark, io, meta: TableMetadata, part: int, op_column: str | None
             ) -> tuple[list[DataFile], list[KeysFile]]:
        """Writes the files' rows as the files of segment part ``part``, a task a split."""
        require_shared(io)
        n = len(self.splits)
        task = _ScanLandTask(LandTask(io, meta.to_json(), part, n, op_column is not None), self, op_column)
        try:
            # spark.range with one partition a split: partition i holds the one id i.
            reports = [r.asDict() for r in spark.range(0, n, 1, n).mapInArrow(task, REPORT_DDL).collect()]
        except Exception:
            remove_part_files(io, part)
            raise
        return collect(io, meta, part, iter(reports))

    def reader(self, split: int | None = None) -> pa.RecordBatchReader:
        """The rows of split ``split`` (of every split when None), as pyarrow reads them."""
        read = list(dict.fromkeys(source for _, source, _ in self.outputs if source is not None))

        def columns(b: pa.RecordBatch) -> pa.RecordBatch:
            arrays = [b.column(source) if source is not None else pa.repeat(pa.scalar(value, field.type), b.num_rows)
                      for (_, source, value), field in zip(self.outputs, self.schema, strict=True)]
            return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

        def batches():
            for path, groups in (p for s in self.splits for p in s) if split is None else self.splits[split]:
                f = pq.ParquetFile(path)
                yield from map(columns, f.iter_batches(_READ_ROWS, row_groups=list(groups), columns=read))

        return pa.RecordBatchReader.from_batches(self.schema, batches())


@dataclasses.dataclass
class _ScanLandTask:
    task: LandTask
    scan: ParquetScan
    op_column: str | None

    def __call__(self, ids):
        meta = TableMetadata.from_json(self.task.metadata)
        for rb in ids:
            for split in rb.column(0).to_pylist():
                batches = conform.conformed(self.scan.reader(split), meta, self.op_column)
                yield pa.RecordBatch.from_pylist(self.task.run(split, batches), schema=REPORT_SCHEMA)


# Spark's types of the constants a scan may add, as Arrow types.
_CONSTANT_TYPES = {"byte": pa.int8(), "short": pa.int16(), "integer": pa.int32(), "long": pa.int64(),
                   "float": pa.float32(), "double": pa.float64(), "boolean": pa.bool_(), "string": pa.string()}


def _plain_scan(df):
    """``(paths, outputs, constant types)`` when ``df``'s optimized plan is a relation of local Parquet files or
    a projection of it whose expressions are columns, renamed columns and constants of simple types (see
    :class:`ParquetScan`); None otherwise (or on Spark Connect, whose plans the client cannot see)."""
    try:
        plan = df._jdf.queryExecution().optimizedPlan()
        outputs, types = [], {}
        if plan.nodeName() == "Project":
            exprs = plan.projectList()
            for i in range(exprs.length()):
                e = exprs.apply(i)
                child = e.child() if e.getClass().getSimpleName() == "Alias" else e
                kind = child.getClass().getSimpleName()
                type_name = child.dataType().typeName()
                if kind == "AttributeReference":
                    outputs.append((e.name(), child.name(), None))
                elif kind == "Literal" and type_name in _CONSTANT_TYPES:
                    value = child.value()  # py4j gives numbers and booleans as Python's; a string as a UTF8String
                    outputs.append((e.name(), None, str(value.toString()) if type_name == "string" and value is not None
                                    else value))
                    types[e.name()] = _CONSTANT_TYPES[type_name]
                else:
                    return None
            plan = plan.child()
        if plan.getClass().getSimpleName() != "LogicalRelation":
            return None
        relation = plan.relation()
        if (relation.getClass().getSimpleName() != "HadoopFsRelation"
                or relation.fileFormat().getClass().getSimpleName() != "ParquetFileFormat"
                or relation.partitionSchema().length() or relation.bucketSpec().isDefined()):
            return None
        keys = relation.options().keys().toSeq()
        if any(str(keys.apply(i)).lower() not in _PLAIN_OPTIONS for i in range(keys.length())):
            return None
        uris = list(df.inputFiles())
        outputs = outputs or [(c, c, None) for c in df.columns]
    except Exception:  # noqa: BLE001 - no JVM (Spark Connect) or a plan of another shape
        return None
    paths = []
    for uri in sorted(uris):
        parsed = urlparse(uri)
        if parsed.scheme != "file":
            return None
        paths.append(unquote(parsed.path))
    return (paths, tuple(outputs), types) if paths else None


def _projected(schema: pa.Schema, outputs, constant_types: dict) -> pa.Schema | None:
    """The scan's columns as pyarrow reads them from a file of ``schema``; None when the file lacks one."""
    names = schema.names
    fields = []
    for name, source, _ in outputs:
        if source is None:
            fields.append(pa.field(name, constant_types[name]))
        elif names.count(source) != 1:
            return None
        else:
            fields.append(schema.field(source).with_name(name))
    return pa.schema(fields)


def _as_pyarrow_reads(footer) -> bool:
    """Whether pyarrow reads the file's values as Spark does: no INT96 times (Spark may rebase them), no
    calendar-rebase marks, no times without a zone (Spark reads them in its session's)."""
    metadata = footer.metadata or {}
    if any(k in metadata for k in _LEGACY_KEYS):
        return False
    schema = footer.schema
    if any(schema.column(i).physical_type == "INT96" for i in range(len(schema))):
        return False
    return not any(pa.types.is_timestamp(f.type) and f.type.tz is None for f in schema.to_arrow_schema())


def _spark_order(df, footers: dict) -> list[tuple[str, int, int]] | None:
    """The files' row groups ``(path, row group, stored bytes)`` in the order Spark reads them, which is the
    batch's row order (its positions break ties of a key's equal delta values): Spark's file partitions in
    order, each split of a file reading the row groups whose midpoint falls in it (Parquet's rule), so a scan
    of several files lands them as Spark would hand them over (largest first, not by name). None when Spark's
    plan does not say (the rows' landing then reads them in Spark's order)."""
    try:
        scan = _file_scan(df._jdf.queryExecution().executedPlan())
        if scan is None:
            return None
        out = []
        for partition in scan.inputRDD().partitions():
            files = partition.files()
            for i in range(len(files)):
                f = files[i]
                path = unquote(urlparse(f.filePath().toString()).path)
                footer = footers.get(path)
                if footer is None:
                    return None
                start, end = f.start(), f.start() + f.length()
                for g in range(footer.num_row_groups):
                    rg = footer.row_group(g)
                    first = rg.column(0)
                    offset = first.data_page_offset
                    if first.has_dictionary_page and 0 < first.dictionary_page_offset < offset:
                        offset = first.dictionary_page_offset
                    if rg.num_rows and start <= offset + _stored_bytes(rg) // 2 < end:
                        out.append((path, g, _stored_bytes(rg)))
    except Exception:  # noqa: BLE001 - a plan of another shape
        return None
    wanted = sum(1 for f in footers.values() for g in range(f.num_row_groups) if f.row_group(g).num_rows)
    return out if len(out) == wanted and len(set((p, g) for p, g, _ in out)) == wanted else None


def _file_scan(plan):
    if plan.getClass().getSimpleName() == "FileSourceScanExec":
        return plan
    children = plan.children()
    for i in range(children.size()):
        found = _file_scan(children.apply(i))
        if found is not None:
            return found
    return None


def _splits(groups: list[tuple[str, int, int]], spark) -> tuple:
    """The row groups ``(path, row group, stored bytes)``, in order, in runs of about their total size / twice
    the cores (at most Spark's ``maxPartitionBytes``): a large file is read by several tasks, and the cores
    finish together (runs of a whole core's share, cut at row groups, would leave one core idle while a third
    run lands)."""
    total = sum(size for _, _, size in groups)
    limit = _bytes(spark.conf.get("spark.sql.files.maxPartitionBytes", "134217728"))
    target = max(1, min(limit, -(-total // (2 * parallelism(spark)))))
    splits: list[list[tuple[str, int]]] = []
    size = target
    for path, g, n in groups:
        if size + n > target and size:
            splits.append([])
            size = 0
        splits[-1].append((path, g))
        size += n
    return tuple(tuple((path, tuple(g for _, g in run)) for path, run in itertools.groupby(split, key=lambda x: x[0]))
                 for split in splits)


def _stored_bytes(row_group) -> int:
    return sum(row_group.column(c).total_compressed_size for c in range(row_group.num_columns))
