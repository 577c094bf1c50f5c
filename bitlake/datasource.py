"""``spark.read.format("bitlake")`` and ``df.write.format("bitlake")``: a Spark Python Data Source (Spark 4)
over the same read planner and ingestion as the rest of bitlake (docs/spark.md).

Reads take Delta's option names: ``versionAsOf``, ``timestampAsOf``, ``validAt`` (bitlake's event time),
``readChangeFeed`` with ``startingVersion`` / ``endingVersion`` or ``startingTimestamp`` / ``endingTimestamp``
(both ends included, as :meth:`bitlake.Table.changes` takes them). A task reads a group of the view's files
through the table's :class:`~bitlake.fs.FileIO` (any store, no Hadoop connector) and yields Arrow batches;
filters are Spark's alone (docs/spark.md says why). Writes (mode ``append``) are one batch, with
``batchId`` and ``opColumn``: the tasks land the rows, the commit runs MetaGen on the driver; a ``batchId``
that committed already is a no-op.
``storage.<key>`` options are the table's ``storage_options``.

Registered by :func:`bitlake.spark_session`; any other session: ``bitlake.register_data_source(spark)``.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)

from bitlake import read
from bitlake.batches import already_committed, check_batch_id
from bitlake.engine.read import changes as changes_mod
from bitlake.engine.read import plan, reader
from bitlake.engine.write import landing
from bitlake.engine.write.conform import Conformer, conformed
from bitlake.engine.write.landing import Landed
from bitlake.errors import BitlakeError, InvalidInputError
from bitlake.format.layout import STAGING_DIR
from bitlake.format.metadata import OP_COLUMN
from bitlake.spark.schema import spark_schema, spark_typed, to_arrow_schema
from bitlake.table import Table, open_table
from bitlake.transaction import claim_part

NAME = "bitlake"
# Files of a view are read in groups of about this many bytes, one task each.
PARTITION_BYTES = 128 << 20
# A write task numbers its segments seq = task, task + STRIDE, ...: up to this many tasks per write.
STRIDE = 4096
# The data source's names (Delta's) of a change range's ends.
CHANGE_OPTIONS = {"starting_version": "startingVersion", "ending_version": "endingVersion",
                  "starting_timestamp": "startingTimestamp", "ending_timestamp": "endingTimestamp"}
CHANGE_COLUMNS = [pa.field("_change_type", pa.string()), pa.field("_commit_version", pa.int64()),
                  pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC"))]


def register(spark) -> None:
    """Makes ``format("bitlake")`` known to ``spark``."""
    spark.dataSource.register(BitlakeDataSource)


def _table(options):
    path = options.get("path")
    if not path:
        raise InvalidInputError('a bitlake read or write needs the table: .load("<uri>") or .save("<uri>")')
    storage = {k[len("storage."):]: v for k, v in options.items() if k.lower().startswith("storage.")}
    return open_table(path, storage or None)


def _flag(options, name: str) -> bool:
    value = str(options.get(name, "false")).strip().lower()
    if value not in ("true", "false"):
        raise InvalidInputError(f"option {name} must be true or false, not {value!r}")
    return value == "true"


def _int(options, name: str) -> int | None:
    value = options.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidInputError(f"option {name} must be an integer, not {value!r}") from None


class BitlakeDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        return spark_schema(self._arrow_schema())

    def _arrow_schema(self) -> pa.Schema:
        t = _table(self.options)
        meta = t.metadata
        if _flag(self.options, "readChangeFeed"):
            return pa.schema([*(meta.schema.field(c) for c in meta.column_names), *CHANGE_COLUMNS])
        if "versionAsOf" in self.options or "timestampAsOf" in self.options:  # a version reads its own schema
            state, _ = read.view(t.io, t.refresh(), _int(self.options, "versionAsOf"),
                                 self.options.get("timestampAsOf"), None)
            meta = state.metadata
        return pa.schema([meta.schema.field(c) for c in meta.column_names])

    def reader(self, schema) -> DataSourceReader:
        if _flag(self.options, "readChangeFeed"):
            return ChangeFeedReader(self.options)
        return ViewReader(self.options)

    def streamReader(self, schema) -> ChangeStreamReader:  # noqa: N802 - Spark's name
        return ChangeStreamReader(self.options)

    def streamWriter(self, schema, overwrite: bool) -> StreamWriter:  # noqa: N802
        return StreamWriter(self.options, schema)

    def writer(self, schema, overwrite: bool) -> BatchWriter:
        if overwrite:
            raise InvalidInputError(
                "bitlake writes are upserts (mode 'append'): mode 'overwrite' would need a table-wide delete, which "
                "bitlake does not do implicitly; delete rows with Table.delete(...), or write a new table")
        return BatchWriter(self.options, schema)


@dataclasses.dataclass
class _Files(InputPartition):
    paths: list[str]


class ViewReader(DataSourceReader):
    """A view (version, time or event time): the planner's files in groups, each a task."""

    def __init__(self, options):
        t = _table(options)
        version = _int(options, "versionAsOf")
        state, valid_at = read.view(t.io, t.refresh(), version, options.get("timestampAsOf"), options.get("validAt"))

        self.io = t.io
        self.plan = plan.plan(t.io, state, valid_at)

    def partitions(self):
        groups: list[list[str]] = []
        size = PARTITION_BYTES
        for f in sorted(self.plan.whole + self.plan.filtered, key=lambda f: f.path):
            if size + f.bytes > PARTITION_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(f.path)
            size += f.bytes
        return [_Files(g) for g in groups] or [_Files([])]

    def read(self, partition: InputPartition):
        assert isinstance(partition, _Files)
        wanted = set(partition.paths)
        p = dataclasses.replace(self.plan, whole=[f for f in self.plan.whole if f.path in wanted],
                                filtered=[f for f in self.plan.filtered if f.path in wanted])
        yield from spark_typed(reader.batches(self.io, p))


class ChangeFeedReader(DataSourceReader):
    """The change feed of commits ``startingVersion`` (or ``startingTimestamp``) to ``endingVersion`` (or
    ``endingTimestamp``, default the latest), both included as in Delta, read in one task through the planner
    :meth:`bitlake.Table.changes` uses. As in Delta, a batch read names its start."""

    def __init__(self, options):
        t = _table(options)
        if options.get("startingVersion") is None and options.get("startingTimestamp") is None:
            raise InvalidInputError("readChangeFeed needs startingVersion or startingTimestamp (the first commit "
                                    "whose changes are read)")
        self.io = t.io
        with _option_names():
            self.plan = read.change_plan(t.io, t.refresh(), **_range(options))

    def read(self, partition):
        yield from spark_typed(changes_mod.read_arrow(self.io, self.plan).to_batches())


@contextlib.contextmanager
def _option_names():
    """Errors of a change range name the options it came from (``startingVersion``, not ``starting_version``)."""
    try:
        yield
    except BitlakeError as e:
        message = str(e)
        for name, option in CHANGE_OPTIONS.items():
            message = message.replace(name, option)
        raise type(e)(message) from None


def _range(options) -> dict:
    """The change range the options name, as :func:`bitlake.read.change_plan` takes it."""
    return {"starting_version": _int(options, "startingVersion"), "ending_version": _int(options, "endingVersion"),
            "starting_timestamp": options.get("startingTimestamp"), "ending_timestamp": options.get("endingTimestamp")}


class ChangeStreamReader(DataSourceStreamReader):
    """``spark.readStream.format("bitlake")``: the change feed as a stream whose offsets are versions. Each
    micro-batch reads the changes of the commits since the last one (``startingVersion``, or
    ``startingTimestamp``: the first commit read; default ``latest``, the commits after the query starts)."""

    def __init__(self, options):
        if not _flag(options, "readChangeFeed"):
            raise InvalidInputError('a bitlake stream is its change feed: set option("readChangeFeed", "true")')
        self.options = dict(options)
        t = _table(options)
        latest = t.refresh()
        version, when = options.get("startingVersion", "latest"), options.get("startingTimestamp")
        if when is not None and "startingVersion" in options:
            raise InvalidInputError("give startingVersion or startingTimestamp, not both")
        if when is None and str(version).lower() == "latest":
            self.first = latest.version
        else:
            # An offset is the last version read: the start of the range, which the engine takes exclusive.
            with _option_names():
                self.first, _ = read.change_range(t.io, latest, None if when else _int(options, "startingVersion"),
                                                  starting_timestamp=when)

    def initialOffset(self) -> dict:  # noqa: N802
        return {"version": self.first}

    def latestOffset(self, start=None, limit=None) -> dict:  # noqa: N802
        return {"version": _table(self.options).version}

    def partitions(self, start: dict, end: dict):
        return [InputPartition((int(start["version"]), int(end["version"])))]

    def read(self, partition):
        start, end = partition.value
        if end <= start:
            return
        t = _table(self.options)
        p = read.change_plan(t.io, t.refresh(), starting_version=start + 1, ending_version=end)
        yield from spark_typed(changes_mod.read_arrow(t.io, p).to_batches())


@dataclasses.dataclass
class _Staged(WriterCommitMessage):
    query: str | None
    epoch: str | None
    paths: list[str]


class StreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("bitlake")``: each micro-batch is one batch whose id is the query's id and the
    epoch (``<batchIdPrefix or query id>-<epoch>``), so a query restarted from its checkpoint never applies an
    epoch twice. Tasks stage their rows as Arrow files under ``_bitlake/staging/``; the driver's commit
    ingests them (inline MetaGen) and removes them."""

    def __init__(self, options, schema):
        t = _table(options)
        self.io, self.meta = t.io, t.metadata
        self.op_column = options.get("opColumn")
        self.prefix = options.get("batchIdPrefix")
        Conformer(to_arrow_schema(schema), self.meta, self.op_column)

    def write(self, iterator):
        import uuid

        from pyspark import TaskContext

        ctx = TaskContext.get()
        query, epoch = ctx.getLocalProperty("sql.streaming.queryId"), ctx.getLocalProperty("streaming.sql.batchId")
        rows = _conformed(iterator, self.meta, self.op_column)
        if rows is None:
            return _Staged(query, epoch, [])
        path = f"{STAGING_DIR}/{epoch}-{ctx.partitionId()}-{uuid.uuid4().hex}.arrow"
        with self.io.open_output(path) as out:
            writer = None
            for rb in rows:
                if writer is None:
                    writer = pa.ipc.new_stream(out, rb.schema)
                writer.write_batch(rb)
            if writer is not None:
                writer.close()
        return _Staged(query, epoch, [path])

    def commit(self, messages, batchId) -> None:  # noqa: N803 - Spark's name
        staged = [m for m in messages if m is not None]
        paths = [p for m in staged for p in m.paths]
        query = next((m.query for m in staged if m.query), None)
        try:
            if not paths:
                return
            if not (self.prefix or query):
                raise InvalidInputError("the streaming query's id is unknown here: set option batchIdPrefix to a "
                                        "name that stays the same across restarts of this query")
            batch_id = f"{self.prefix or query}-{batchId}"
            t = Table(self.io)
            t.ingest(_staged_reader(self.io, paths), op_column=OP_COLUMN if self.op_column else None,
                     batch_id=batch_id, inline=True)
        finally:
            for p in paths:
                self.io.delete(p)

    def abort(self, messages, batchId) -> None:  # noqa: N803
        for m in messages:
            for p in (m.paths if m is not None else []):
                self.io.delete(p)


def foreach_batch(path: str, *, op_column: str | None = None, batch_id_prefix: str | None = None,
                  storage_options: dict | None = None):
    """A ``foreachBatch`` function that ingests each micro-batch into the table at ``path`` as batch
    ``<prefix>-<epoch>`` (prefix: ``batch_id_prefix``, else the query's id, which its checkpoint keeps), so a
    restarted query re-running an epoch applies nothing twice::

        stream.writeStream.foreachBatch(bitlake.foreach_batch("lake/t", op_column="op")).start()

    The batch lands as any ingestion of a Spark DataFrame does (collected when small, else a Spark job)."""
    def apply(df, epoch_id: int) -> None:
        prefix = batch_id_prefix or df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
        if not prefix:
            raise InvalidInputError("the streaming query's id is unknown here: pass batch_id_prefix")
        open_table(path, storage_options).ingest(df, op_column=op_column, batch_id=f"{prefix}-{epoch_id}",
                                                 spark=df.sparkSession)

    return apply


def _staged_reader(io, paths: list[str]) -> pa.RecordBatchReader:
    """The staged rows (conformed: the table's columns, and the op column as OP_COLUMN)."""
    first = pa.ipc.open_stream(io.open_input(paths[0]))

    def batches():
        yield from first
        for p in paths[1:]:
            yield from pa.ipc.open_stream(io.open_input(p))

    return pa.RecordBatchReader.from_batches(first.schema, batches())


@dataclasses.dataclass
class _Landed(WriterCommitMessage):
    reports: list[dict]


class BatchWriter(DataSourceArrowWriter):
    """One write is one batch: a segment part claimed here, landed by the tasks, committed by :meth:`commit`."""

    def __init__(self, options, schema):
        t = _table(options)
        state = t.refresh()
        state.protocol.check_write(t.io.uri())
        self.io, self.meta = t.io, state.metadata
        self.op_column = options.get("opColumn")
        if self.op_column is not None and not self.meta.keyed:
            raise InvalidInputError("an unkeyed (append-only) table takes no opColumn: it has no deletes")
        Conformer(to_arrow_schema(schema), self.meta, self.op_column)  # a schema error before any task runs
        self.batch_id = check_batch_id(options.get("batchId"))
        self.done = already_committed(t.io, state, self.batch_id) is not None
        self.part = None if self.done else claim_part(t.io, t.refresh)

    def write(self, iterator):
        from pyspark import TaskContext

        if self.done:  # the batch id committed before: a retried write applies nothing
            for _ in iterator:
                pass
            return _Landed([])
        task = TaskContext.get().partitionId()
        if task >= STRIDE:
            raise InvalidInputError(f"a bitlake write takes at most {STRIDE} partitions; coalesce the DataFrame")
        rows = _conformed(iterator, self.meta, self.op_column)
        if rows is None:
            return _Landed([])
        run = landing.LandTask(self.io, self.meta.to_json(), self.part, STRIDE, self.op_column is not None)
        return _Landed(run.run(task, rows))

    def commit(self, messages) -> None:
        if self.done:
            return
        reports = [r for m in messages if m is not None for r in m.reports]
        data, keys = landing.collect(self.io, self.meta, self.part, iter(reports))
        records = sum(f.rows for f in data) + sum(f.rows for f in keys)
        batch = Landed(self.batch_id, self.part, records, tuple(data), tuple(keys))
        # The commit runs in a Python worker of the driver, which has no SparkSession: MetaGen runs inline.
        Table(self.io).commit_landed(batch)

    def abort(self, messages) -> None:
        """Spark's call when a task or :meth:`commit` failed: the part's files go unless a commit took the part
        (commit may fail after its commit landed) or the log cannot be read to tell."""
        if self.part is None:
            return
        try:
            taken = Table(self.io).refresh().parts.get(self.part) is not None
        except Exception:  # noqa: BLE001 - cannot tell: keep the files, cleanup() removes them if unnamed
            return
        if not taken:
            landing.remove_part_files(self.io, self.part)


def _conformed(iterator, meta, op_column: str | None):
    """A write task's Arrow batches conformed to the table (:func:`bitlake.engine.write.conform.conformed`); None when
    the task has none."""
    first = next(iterator, None)
    if first is None:
        return None
    return conformed(pa.RecordBatchReader.from_batches(first.schema, _chain(first, iterator)), meta, op_column)


def _chain(first, rest):
    yield first
    yield from rest

