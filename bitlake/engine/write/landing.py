"""Data landing, the first of Opal's two steps: a task writes its share of a batch as data files that carry
the row-id columns, and keys files, and reports what it wrote; nothing becomes visible here.

A task numbered ``task`` assigns ``segment_seq = task`` and ``segment_offset`` = the record's position in
the task, so a batch's row-id order is its input order (the contract's "position in the batch"); a task
holding more than one segment's worth of rows continues with ``seq + num_tasks``. Upserts go to data files
(under partition folders when the table is partitioned; partition columns also stay in the file), delete
records of a keyed table to the task's keys file (none when it has none). File names start with the batch's
segment part, so a failed landing can remove everything it wrote. The same task runs in a Spark executor
(:mod:`bitlake.spark.landing`) or on the driver.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bitlake.engine.write.spill import KeptRows
from bitlake.errors import InvalidInputError, NullValueError, UnknownOperationError
from bitlake.format import datafile, keystore, layout, rowid
from bitlake.format.commit import DataFile, KeysFile, SegmentRows
from bitlake.format.metadata import DELTA_INFINITY, OP_COLUMN, OPERATIONS, TableMetadata, deltas_as_int
from bitlake.fs import FileIO
from bitlake.pool import threads as pool_threads

# A task flushes every writer once their buffers hold this much together (many partition folders).
TASK_BUFFER_BYTES = 512 << 20

REPORT_SCHEMA = pa.schema([
    ("kind", pa.string()), ("path", pa.string()), ("seq", pa.int32()), ("rows", pa.int64()),
    ("bytes", pa.int64()), ("partition", pa.string()), ("nulls", pa.string()), ("bad_ops", pa.int64()),
    ("bad_op_sample", pa.string()), ("infinite_deltas", pa.int64()), ("bad_values", pa.string()),
    ("stats", pa.string()),
])
REPORT_DDL = (
    "kind string, path string, seq int, rows long, bytes long, partition string, nulls string, bad_ops long, "
    "bad_op_sample string, infinite_deltas long, bad_values string, stats string"
)


@dataclasses.dataclass
class LandTask:
    """What every landing task of one batch shares; picklable (Spark tasks receive it)."""

    io: FileIO
    metadata: dict
    part: int
    num_tasks: int
    has_op: bool
    # On the driver, each task also keeps its records' keys-file rows (the upserts' and the deletes'), so that the
    # inline MetaGen need not read them back from the files.
    kept: KeptRows | None = None

    def run(self, task: int, batches: Iterable[pa.RecordBatch]) -> list[dict]:
        """Lands ``batches`` (the table's columns, conformed, and the op column when ``has_op``) as task
        ``task``; returns its report rows (:data:`REPORT_SCHEMA`)."""
        return self.cut(task, batches).close()

    def cut(self, task: int, batches: Iterable[pa.RecordBatch]) -> _Cut:
        """Takes ``batches`` into task ``task``'s files, checked and with their row ids, and keeps their keys-file
        rows (``keep``); what is still buffered is encoded when the result is closed."""
        meta = TableMetadata.from_json(self.metadata)
        cutter = _Cutter(self, meta, task)
        for table in _takes(batches, gather_deletes=self.has_op and meta.keyed):
            cutter.take(table)
            cutter.flush_if_full()
        if self.kept is not None:
            self.kept.end(task)
        return cutter.result()


def _takes(batches: Iterable[pa.RecordBatch], gather_deletes: bool) -> Iterator[pa.Table]:
    """``batches`` as the tables a cutter takes: a record batch a table, but consecutive batches of deletes alone
    (when ``gather_deletes``) as one table of up to ``keystore.LISTED_ROWS`` rows. The cutter sorts a table of
    deletes alone by key, so a delete batch that comes in several chunks (a stream, a file of keys read a row group
    a chunk) gets one keys file in key order, which the key store lists as it is (docs/FORMAT.md, "Keys files as
    entries"), and a log whose causes compress as sorted runs."""
    held: list[pa.RecordBatch] = []
    rows = 0
    for rb in batches:
        deletes = gather_deletes and _deletes_alone(rb)
        if held and (not deletes or rows + rb.num_rows > keystore.LISTED_ROWS):
            yield pa.Table.from_batches(held)
            held, rows = [], 0
        if deletes:
            held.append(rb)
            rows += rb.num_rows
        else:
            yield pa.Table.from_batches([rb])
    if held:
        yield pa.Table.from_batches(held)


def _deletes_alone(rb: pa.RecordBatch) -> bool:
    op = rb.column(OP_COLUMN)
    return rb.num_rows > 0 and op.null_count == 0 and bool(pc.all(pc.equal(op, "delete")).as_py())


class _Cutter:
    """One task's input on its way into the task's files: their writers, the next row id, and what the checks
    counted so far. A check does not raise here: the task reports its counts, and :func:`collect` refuses the
    batch on the reports of all its tasks."""

    def __init__(self, task: LandTask, meta: TableMetadata, number: int):
        self.task, self.meta, self.number = task, meta, number
        self.checked = list(meta.primary_key) + ([meta.delta_column] if meta.delta_column else [])
        # Columns the schema declares non-nullable: checked in the rows that are stored (a delete stores none).
        self.required = [f.name for f in meta.schema if not f.nullable and f.name not in self.checked]
        self.nulls = dict.fromkeys(self.checked + self.required, 0)
        self.bad_ops, self.bad_sample, self.infinite = 0, None, 0
        self.bad_values: str | None = None
        self.writers: dict[tuple, tuple[datafile.FileWriter, dict | None, int]] = {}
        self.seq, self.offset = number, 0

    def take(self, table: pa.Table) -> None:
        """Lands ``table``'s records in order, each slice of them as many as the current segment has room for."""
        start = 0
        while start < table.num_rows:
            if self.offset > rowid.MAX_OFFSET:
                self._next_segment()
            n = min(table.num_rows - start, rowid.MAX_OFFSET + 1 - self.offset)
            chunk = table.slice(start, n)
            start += n
            for c in self.checked:
                self.nulls[c] += chunk.column(c).null_count
            offsets = np.arange(self.offset, self.offset + n, dtype=np.int32)
            self.offset += n
            self._land(chunk, offsets)

    def _next_segment(self) -> None:
        """Moves on to the task's next segment: the tasks take the segment numbers in turns, so a task's numbers
        never meet another's."""
        self.seq += self.task.num_tasks
        self.offset = 0
        if self.seq > rowid.MAX_SEQ:
            raise InvalidInputError("batch too large: more segments than segment_seq can number")

    def _with_row_ids(self, chunk: pa.Table, offsets: np.ndarray) -> pa.Table:
        n = chunk.num_rows
        chunk = chunk.append_column(rowid.PART_COLUMN, pa.array(np.full(n, self.task.part, np.int32)))
        chunk = chunk.append_column(rowid.SEQ_COLUMN, pa.array(np.full(n, self.seq, np.int32)))
        return chunk.append_column(rowid.OFFSET_COLUMN, pa.array(offsets))

    def _land(self, chunk: pa.Table, offsets: np.ndarray) -> None:
        """Writes the deletes among ``chunk``'s records (at ``offsets``) to the keys file, and its upserts, if they
        pass the checks, to data files: a delete takes an offset of the segment too, though no data file holds it."""
        is_delete = self._delete_mask(chunk) if self.task.has_op else None
        positions = offsets  # each record's offset in input order
        if is_delete is not None and self.meta.keyed and pc.all(is_delete).as_py():
            # Deletes alone (a delete batch) take their offsets in key order: the keys file, the key-store rows and
            # the log's causes then compress as sorted runs, near half the bytes of input order. The sort is
            # stable, so a key's deletes keep their order of arrival (ties: the later arrival wins); the keys file's
            # _position keeps each one's offset in input order, which orders the change feed.
            by_key = pc.sort_indices(chunk, [(k, "ascending") for k in self.meta.primary_key]).to_numpy()
            chunk, positions = chunk.take(pa.array(by_key)), offsets[by_key]
        chunk = self._with_row_ids(chunk, offsets)
        if self.meta.keyed:
            deltas = deltas_as_int(chunk.column(self.meta.delta_column), self.meta.delta_type)
            self.infinite += int(np.count_nonzero(deltas == DELTA_INFINITY))
            if is_delete is not None and pc.any(is_delete).as_py():
                mask = is_delete.to_numpy(zero_copy_only=False)
                deletes = _deletes(chunk.filter(is_delete), offsets[mask], deltas[mask], self.task.part, self.seq,
                                   self.meta)
                self._writer("keys", None).write(deletes.append_column(
                    pa.field(datafile.POSITION, pa.int32(), False), pa.array(positions[mask], pa.int32())))
                self._keep(deletes)
        if is_delete is not None:
            chunk = chunk.filter(pc.invert(is_delete))
        upserts = self._stored_rows(chunk)
        if upserts is not None and upserts.num_rows:
            self._write_upserts(upserts)

    def _keep(self, rows: pa.Table) -> None:
        if self.task.kept is not None:
            self.task.kept.add(self.number, rows)

    def _delete_mask(self, chunk: pa.Table) -> pa.ChunkedArray:
        """Which of ``chunk``'s records are deletes, by its op column; counts the values that are no operation."""
        op = chunk.column(OP_COLUMN)
        known = pc.fill_null(pc.is_in(op, pa.array(OPERATIONS)), False)
        if not pc.all(known).as_py():
            unknown = chunk.filter(pc.invert(known)).column(OP_COLUMN)
            self.bad_ops += len(unknown)
            if self.bad_sample is None:
                self.bad_sample = repr(unknown[0].as_py())
        return pc.fill_null(pc.equal(op, "delete"), False)

    def _stored_rows(self, upserts: pa.Table) -> pa.Table | None:
        """``upserts`` as the data files store them, or None when they break the contract: counted, and not
        written, since the batch will be refused."""
        missing = {c: upserts.column(c).null_count for c in self.required}
        if any(missing.values()):  # the batch is refused: nothing of it is written
            for c, n in missing.items():
                self.nulls[c] += n
            return None
        if any(upserts.column(c).null_count for c in self.checked):
            return None  # counted in take: the batch is refused (a non-nullable key field would fail the cast)
        try:
            return upserts.select(datafile.data_schema(self.meta).names).cast(datafile.data_schema(self.meta))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:  # a value the table's type cannot hold
            self.bad_values = self.bad_values or str(e).splitlines()[0]
            return None

    def _write_upserts(self, chunk: pa.Table) -> None:
        """Writes stored rows ``chunk`` to data files, one per partition its rows fall in, and keeps their keys-file
        rows (``kept``)."""
        if self.task.kept is not None and self.task.kept.complete:
            self._keep(datafile.keys_of(chunk.select(datafile.upsert_columns(self.meta)), self.meta))
        if not self.meta.partition_by:
            self._writer("data", None).write(chunk)
            return
        groups = chunk.group_by(list(self.meta.partition_by), use_threads=False).aggregate([])
        for values in groups.to_pylist():
            mask = None
            for col, value in values.items():
                m = pc.is_null(chunk.column(col)) if value is None else pc.equal(chunk.column(col), value)
                m = pc.fill_null(m, False)
                mask = m if mask is None else pc.and_(mask, m)
            texts = {c: layout.partition_text(v) for c, v in values.items()}
            self._writer("data", texts).write(chunk.filter(mask))

    def _writer(self, kind: str, partition: dict | None) -> datafile.FileWriter:
        """The writer of the current segment's ``kind`` file ("data" of ``partition``, or "keys"), opened on first
        use."""
        key = (kind, json.dumps(partition), self.seq)
        if key not in self.writers:
            stem = layout.file_stem(self.task.part, self.seq)
            if kind == "data":
                path = layout.data_file_path(stem, partition, self.meta.file_format)
                w = datafile.data_writer(self.task.io, path, self.meta, background=True)
            else:
                w = datafile.keys_writer(self.task.io, layout.keys_file_path(stem), self.meta)
            self.writers[key] = (w, partition, self.seq)
        return self.writers[key][0]

    def flush_if_full(self) -> None:
        """Flushes every writer once their buffers together pass :data:`TASK_BUFFER_BYTES`."""
        if sum(w.buffered_bytes for w, _, _ in self.writers.values()) > TASK_BUFFER_BYTES:
            for w, _, _ in self.writers.values():
                w.flush()

    def result(self) -> _Cut:
        """The writers, and the task's check report."""
        check = _report(kind="check", seq=self.number, nulls=json.dumps(self.nulls), bad_ops=self.bad_ops,
                        bad_op_sample=self.bad_sample, infinite_deltas=self.infinite, bad_values=self.bad_values)
        return _Cut([(kind, *w) for (kind, _, _), w in self.writers.items()], check)


@dataclasses.dataclass
class _Cut:
    """A task's input taken into its files' writers, which may still buffer rows: :meth:`reports` as they will be
    but for the files' sizes (0), :meth:`close` once they are written."""

    writers: list[tuple[str, datafile.FileWriter, dict | None, int]]  # kind ("data", "keys"), writer, partition, seq
    check: dict

    def reports(self, sizes: list[int] | None = None) -> list[dict]:
        rows = [_report(kind=kind, path=w.path, seq=seq, rows=w.rows, bytes=sizes[i] if sizes else 0,
                        partition=json.dumps(partition) if partition is not None else None,
                        stats=json.dumps(w.stats()) if sizes and w.stats() is not None else None)
                for i, (kind, w, partition, seq) in enumerate(self.writers)]
        return rows + [self.check]

    def close(self) -> list[dict]:
        return self.reports([w.close() for _, w, _, _ in self.writers])


# Driver landing: a segment per task, of at least this many rows when the input's size is known (so that a
# batch's files are not split finer than its threads need), and of this many rows from a stream. Smaller segments
# would land a batch on more threads, sooner, but write more bytes for the same rows, against the target of a
# write amplification of at most 1.5 (docs/benchmarks.md, "Targets" and "Design measurements", "Landing file split").
MIN_TASK_ROWS = 1 << 20
STREAM_TASK_ROWS = 1 << 22
# A stream's segment also ends at this many bytes of Arrow data, so that a stream of wide rows is still written
# as files of a few row groups each, on every thread.
STREAM_TASK_BYTES = 192 << 20


@dataclasses.dataclass(frozen=True)
class Landed:
    """A batch MetaGen makes visible: a pending one, or the one being ingested."""

    batch_id: str
    part: int
    records: int
    data_files: tuple[DataFile, ...]
    keys_files: tuple[KeysFile, ...]
    # The records' keys-file rows when the landing kept them in memory, or spilled them (else MetaGen reads them
    # from the files).
    rows: pa.Table | None = dataclasses.field(default=None, compare=False, repr=False)
    spilled: KeptRows | None = dataclasses.field(default=None, compare=False, repr=False)
    # While the landing still writes the files (their sizes 0 here until then): what waits for them and returns
    # them written, as (data files, keys files).
    writing: Callable[[], tuple[list[DataFile], list[KeysFile]]] | None = dataclasses.field(
        default=None, compare=False, repr=False)
    digest: str | None = None  # of its records (:mod:`bitlake.engine.write.digest`), when they came as Arrow input
    # While the digest is still being taken: what waits for it and returns it.
    digesting: Callable[[], str] | None = dataclasses.field(default=None, compare=False, repr=False)

    def settled(self) -> Landed:
        """This batch once its files are written and its digest taken (the same batch when they were)."""
        if self.writing is None and self.digesting is None:
            return self
        data, keys = self.writing() if self.writing is not None else (self.data_files, self.keys_files)
        digest = self.digesting() if self.digesting is not None else self.digest
        return dataclasses.replace(self, data_files=tuple(data), keys_files=tuple(keys), writing=None, digest=digest,
                                   digesting=None)



def land_local(io: FileIO, meta: TableMetadata, part: int, has_op: bool, batches: Iterable[pa.RecordBatch],
               rows: int | None = None, threads: int | None = None, kept: KeptRows | None = None) -> LocalLanding:
    """Lands conformed ``batches`` on this machine, without Spark: the input is cut, in order, into segments
    that a pool of threads writes at once (Parquet encoding releases the GIL), each task taking its segment's
    batches as they are read (:class:`_Feed`), so a stream lands in bounded memory. ``rows`` (the input's size,
    when known) picks the segment size that gives every thread work. Same files and checks as the Spark landing.
    Returns once every segment has been taken in and checked: the files of the last ones are still being written then
    (:class:`LocalLanding`), while the caller goes on, with the records' keys-file rows that ``kept`` kept."""
    threads = threads or pool_threads()
    if rows is None:
        per_task, max_bytes = STREAM_TASK_ROWS, STREAM_TASK_BYTES
    else:  # a table already in memory: its segments are slices of it
        per_task, max_bytes = min(max(-(-rows // threads), MIN_TASK_ROWS), rowid.MAX_OFFSET + 1), None
    # Each task is one segment, never more: a task's seq is its place in the input, so row ids follow it.
    task = LandTask(io, meta.to_json(), part, 1, has_op, kept)
    workers = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="bitlake-land")
    landing = LocalLanding(io, meta, part, workers)
    started = -1
    try:
        for seq, piece in _pieces(batches, per_task, max_bytes):
            if seq > rowid.MAX_SEQ:
                raise InvalidInputError("batch too large: more segments than segment_seq can number")
            if seq != started:
                landing.start(task, seq, threads)
                started = seq
            landing.feed(piece)
        landing.taken_in()
    except BaseException:
        landing.abandon()
        if kept is not None:
            kept.remove()
        raise
    if kept is not None and kept.complete:
        # In memory, in one chunk, and the pieces let go: the inline MetaGen takes the rows as they are, where a copy
        # of its own would hold them twice (193 MB for a 6 M-record batch; docs/ingestion.md, "Memory").
        landing.rows = kept.table(datafile.keys_schema(meta))
        landing.spilled = kept if kept.spilled else None
    return landing


# A segment's input goes to its task in lists of batches of at least this many bytes (fewer hand-offs between
# threads), at most _FEED_LISTS of them waiting: the task encodes its row groups while the rest of its input is
# still being read, and a stream lands in the memory of a few lists a segment.
_FEED_BYTES = 16 << 20
_FEED_LISTS = 4


class _Feed:
    """A segment's batches on their way from the thread that cuts the input to the task that lands them (whose
    future is :attr:`run`, once submitted)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[list[pa.RecordBatch] | None] = queue.Queue(maxsize=_FEED_LISTS)
        self._held: list[pa.RecordBatch] = []
        self._held_bytes = 0
        self.run: Future | None = None

    def add(self, batch: pa.RecordBatch) -> None:
        """Gives ``batch`` to the task; raises what the task failed with, if it did."""
        self._held.append(batch)
        self._held_bytes += batch.nbytes
        if self._held_bytes >= _FEED_BYTES:
            self._put_or_raise(self._held)
            self._held, self._held_bytes = [], 0

    def end(self) -> None:
        """No more batches: the task takes those held and ends its input."""
        if self._held:
            self._put_or_raise(self._held)
            self._held = []
        self._put_or_raise(None)

    def stop(self) -> None:
        """Ends the task's input without the batches still waiting (the landing is abandoned); never raises."""
        self._held = []
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()
        self._put(None)

    def _put_or_raise(self, item: list[pa.RecordBatch] | None) -> None:
        if not self._put(item):
            self.run.result()  # a task that ended before its input did failed: this raises why
            raise RuntimeError("a landing task ended before its input did")

    def _put(self, item: list[pa.RecordBatch] | None) -> bool:
        """Puts ``item`` once the queue has room; False when the task ended first."""
        while not self.run.done():
            with contextlib.suppress(queue.Full):
                self._queue.put(item, timeout=0.1)
                return True
        return False

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while (batches := self._queue.get()) is not None:
            yield from batches


class LocalLanding:
    """A landing on this machine once every segment is taken in and checked: :attr:`data` and :attr:`keys` are its
    files as they will be, but for their sizes (0), and :attr:`rows` the records' keys-file rows when kept; the
    last segments' files are still being written on the pool, which :meth:`files` waits for (then the sizes are
    known). Until then the caller can do what needs only the rows (a batch's MetaGen) beside the writes."""

    def __init__(self, io: FileIO, meta: TableMetadata, part: int, workers: ThreadPoolExecutor):
        self.io, self.meta, self.part = io, meta, part
        self.workers = workers
        self.data: list[DataFile] = []
        self.keys: list[KeysFile] = []
        self.rows: pa.Table | None = None
        self.spilled: KeptRows | None = None
        self._running: list[tuple[Future, Future]] = []  # per segment under way: its cut, its whole run
        self._feed: _Feed | None = None  # the input of the segment started last, until it has all of it
        self._reports: list[dict] = []  # of the segments that have ended
        self._files: tuple[list[DataFile], list[KeysFile]] | None = None

    def start(self, task: LandTask, seq: int, threads: int) -> None:
        """Starts landing segment ``seq``, whose batches :meth:`feed` then gives it, once the segment before has
        all of its input and fewer than ``threads`` segments are under way."""
        self._end_input()
        if len(self._running) >= threads:
            self._reports.extend(self._running.pop(0)[1].result())
        cut: Future = Future()
        feed = _Feed()

        def run() -> list[dict]:
            try:
                result = task.cut(seq, feed)
            except BaseException as e:
                cut.set_exception(e)
                raise
            cut.set_result(result.reports())
            return result.close()

        feed.run = self.workers.submit(run)
        self._running.append((cut, feed.run))
        self._feed = feed

    def feed(self, batch: pa.RecordBatch) -> None:
        """Gives ``batch`` to the segment started last."""
        self._feed.add(batch)

    def _end_input(self) -> None:
        if self._feed is not None:
            self._feed.end()
            self._feed = None

    def taken_in(self) -> None:
        """Waits until every segment is taken in; raises the contract's errors (null keys, unknown operations)
        when the input breaks it (the caller then abandons the landing)."""
        self._end_input()
        reports = self._reports + [r for cut, _ in self._running for r in cut.result()]
        self.data, self.keys = collect(self.io, self.meta, self.part, iter(reports), remove=False)

    def files(self) -> tuple[list[DataFile], list[KeysFile]]:
        """The landed files, once written (the same every call); raises what failed, after removing every file."""
        if self._files is None:
            try:
                reports = self._reports + [r for _, run in self._running for r in run.result()]
            except BaseException:
                self.abandon()
                raise
            self.workers.shutdown()
            self._files = collect(self.io, self.meta, self.part, iter(reports))
        return self._files

    def abandon(self) -> None:
        """Stops the landing and removes every file it wrote."""
        if self._feed is not None:
            self._feed.stop()
            self._feed = None
        for _, run in self._running:
            run.cancel()
        self.workers.shutdown(wait=True)
        remove_part_files(self.io, self.part)


def _pieces(batches: Iterable[pa.RecordBatch], rows: int, max_bytes: int | None = None
            ) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``batches`` (sliced where needed) with the segment each goes to: consecutive segments of ``rows`` rows each,
    the last one less; with ``max_bytes``, a segment also ends once its batches hold that many bytes (a batch is not
    sliced for it)."""
    seq = n = size = 0
    for b in batches:
        while b.num_rows:
            take = min(rows - n, b.num_rows)
            piece = b.slice(0, take)
            yield seq, piece
            size += piece.nbytes if max_bytes is not None else 0
            b, n = b.slice(take), n + take
            if n == rows or (max_bytes is not None and size >= max_bytes):
                seq, n, size = seq + 1, 0, 0


def _report(**values) -> dict:
    row = dict.fromkeys(REPORT_SCHEMA.names)
    row.update(rows=0, bytes=0, bad_ops=0, infinite_deltas=0)
    row.update(values)
    return row


def _deletes(rows: pa.Table, offsets: np.ndarray, deltas: np.ndarray, part: int, seq: int, meta: TableMetadata
             ) -> pa.Table:
    """The keys-file rows of delete records ``rows`` of one segment, at ``offsets``, with delta values ``deltas``."""
    packed = offsets.astype(np.int64) | np.int64(rowid.segment_key(part, seq))
    return datafile.keys_rows(rows, meta, deltas, packed, True)


def collect(io: FileIO, meta: TableMetadata, part: int, reports: Iterator[dict], remove: bool = True
            ) -> tuple[list[DataFile], list[KeysFile]]:
    """The files the tasks of segment part ``part`` wrote, from their reports; raises NullValueError /
    UnknownOperationError / InvalidInputError, after removing every file they wrote (unless not ``remove``),
    when the input breaks the contract (docs/semantics.md, rule 3)."""
    nulls: dict[str, int] = {}
    bad_ops, bad_sample, infinite, bad_values = 0, None, 0, None
    data, keys = [], []
    for r in reports:
        if r["kind"] == "check":
            for c, n in json.loads(r["nulls"]).items():
                nulls[c] = nulls.get(c, 0) + n
            bad_ops += r["bad_ops"]
            bad_sample = bad_sample or r["bad_op_sample"]
            infinite += r["infinite_deltas"]
            bad_values = bad_values or r.get("bad_values")
        elif r["kind"] == "keys":
            keys.append((r["seq"], KeysFile(r["path"], r["seq"], r["rows"], r["bytes"])))
        else:
            partition = json.loads(r["partition"]) if r["partition"] else None
            segments = (SegmentRows(part, r["seq"], r["rows"]),)
            stats = json.loads(r["stats"]) if r.get("stats") else None
            data.append(DataFile(r["path"], r["rows"], r["bytes"], partition, segments, None, stats))
    error: Exception | None = None
    for c, n in nulls.items():
        if n:
            role = ("delta column" if c == meta.delta_column else "primary key column" if c in meta.primary_key
                    else "non-nullable column")
            error = NullValueError(f"{role} {c!r} holds {n} null value(s); nothing of this batch was written")
            break
    if error is None and bad_ops:
        error = UnknownOperationError(
            f"op column holds {bad_ops} value(s) other than {list(OPERATIONS)}, e.g. {bad_sample}; "
            "nothing of this batch was written"
        )
    if error is None and infinite:
        error = InvalidInputError(
            f"delta column {meta.delta_column!r} holds {infinite} value(s) at or above the largest int64 "
            f"({DELTA_INFINITY}), which bitlake reserves for +infinity; nothing of this batch was written"
        )
    if error is None and bad_values:
        error = InvalidInputError(f"the batch holds a value its column's type in the table cannot hold: {bad_values}; "
                                  "nothing of this batch was written")
    if error is not None:
        if remove:
            remove_part_files(io, part)
        raise error
    data.sort(key=lambda f: (f.segments[0].seq, f.path))
    keys.sort(key=lambda k: (k[0], k[1].path))
    return data, [k for _, k in keys]


def remove_part_files(io: FileIO, part: int) -> None:
    """Removes every file a landing of segment part ``part`` wrote (committed ones never qualify: a part is
    claimed by exactly one landing, and this runs only when that landing failed)."""
    prefix = f"{part:08d}-"
    for folder in (layout.DATA_DIR, layout.KEYS_DIR):
        for rel in io.walk(folder):
            if rel.rsplit("/", 1)[-1].startswith(prefix):
                io.delete(rel)
