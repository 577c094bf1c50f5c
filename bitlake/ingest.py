"""Ingestion: land a batch and make it visible (MetaGen), as one commit or two (docs/ingestion.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import uuid
from typing import Any

from bitlake import changeevent, faults, memory, transaction
from bitlake.engine import conform, indexsession, keyindex, landing
from bitlake.engine import metagen as engine_metagen
from bitlake.engine.metagen import COUNTS, Landed, MetaGenOutput
from bitlake.errors import InvalidInputError
from bitlake.format.commit import INGEST, LAND, LIVE, METAGEN, PENDING, BatchRecord, Commit
from bitlake.format.commitlog import now_ms
from bitlake.format.metadata import TableMetadata
from bitlake.format.state import TableState
from bitlake.fs import FileIO

MAX_BATCH_ID_LENGTH = 256


@dataclasses.dataclass(frozen=True)
class IngestResult:
    """What an ``ingest`` or ``metagen`` call did.

    ``committed`` is False when the batch id had already been committed (an idempotent retry), or when
    ``metagen()`` found nothing pending: then ``version`` is the version that committed it (the latest)
    and nothing was written. ``counts`` holds inserted, updated, deleted, stale and ignored_deletes for
    this batch (for ``metagen()``: for all batches it processed; empty while a batch is only landed).
    """

    batch_id: str | None
    version: int
    committed: bool
    visible: bool
    counts: dict[str, int]
    processed: tuple[str, ...] = ()  # the batch ids the commit made visible, in the order applied


class _Done(Exception):
    def __init__(self, result: IngestResult):
        self.result = result


def check_batch_id(batch_id: str | None) -> str:
    if batch_id is None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
        return f"{stamp}-{uuid.uuid4().hex[:12]}"
    if not isinstance(batch_id, str) or not batch_id or len(batch_id) > MAX_BATCH_ID_LENGTH:
        raise InvalidInputError(f"batch_id must be a non-empty string of at most {MAX_BATCH_ID_LENGTH} characters")
    return batch_id


def already_committed(io: FileIO, state: TableState, batch_id: str) -> IngestResult | None:
    """The result of the commit that took ``batch_id``, if one did (any status: a reverted id stays taken)."""
    from bitlake.format import commitlog

    b = state.batch(batch_id)
    if b is None:
        return None
    version = b.live_version if b.live_version is not None else b.landed_version
    if state.window is not None and version < state.window.version:  # its commit may be gone with the window
        return IngestResult(batch_id, version, False, b.status != PENDING, {}, ())
    c = commitlog.read(io, version)
    return IngestResult(batch_id, version, False, b.status != PENDING, c.batch_counts.get(batch_id, {}), c.made_live)


def land_batch(io: FileIO, state: TableState, land, batch_id: str, settle: bool = True) -> Landed:
    """Claims a segment part and lands a batch in it (``land``: what :func:`landing_of` returns); unless
    ``settle``, returns while the last of its files are still being written (:meth:`Landed.settled`)."""
    part = transaction.claim_part(io, state)
    faults.point("after_claim")
    data_files, keys_files, rows, writing = land(io, part)
    faults.point("after_landing")
    records = sum(f.rows for f in data_files) + sum(f.rows for f in keys_files)
    batch = Landed(batch_id, part, records, tuple(data_files), tuple(keys_files), rows, writing)
    return batch.settled() if settle else batch


@contextlib.contextmanager
def dropped_unless_committed(io: FileIO, refresh, part: int):
    """Removes the files landed in ``part`` when what runs inside fails and no commit took the part."""
    try:
        yield
    except BaseException:
        if refresh().parts.get(part) is None:
            landing.remove_part_files(io, part)
        raise


class Ingestion:
    """One table's writes: :meth:`ingest` and :meth:`metagen`. ``refresh`` returns the latest state."""

    def __init__(self, io: FileIO, refresh):
        self.io = io
        self.refresh = refresh

    def ingest(self, data: Any, *, op_column: str | None, batch_id: str | None, metagen: bool,
               inline: bool | None, spark: Any, operation: str = INGEST) -> IngestResult:
        state = self.refresh()
        state.protocol.check_write(self.io.uri())
        meta = state.metadata
        batch_id = check_batch_id(batch_id)
        if op_column is not None and not meta.keyed:
            raise InvalidInputError("an unkeyed (append-only) table takes no op_column: it has no deletes")
        done = already_committed(self.io, state, batch_id)
        if done is not None:
            return done
        land = landing_of(data, meta, op_column)  # checks the input before anything is written
        # The batch's MetaGen needs its records' keys, not its files: it runs while the files are written.
        batch = land_batch(self.io, state, land, batch_id, settle=False)
        return self.finish(batch, metagen=metagen, inline=inline, spark=spark, operation=operation)

    def finish(self, batch: Landed, *, metagen: bool, inline: bool | None, spark: Any,
               operation: str = INGEST) -> IngestResult:
        """Commits a landed batch: its landing (LAND), or its MetaGen with it (``operation``). Its files go when
        that fails and no commit took its part; a batch id another writer committed first is a no-op."""
        with dropped_unless_committed(self.io, self.refresh, batch.part):
            try:
                if metagen:
                    return self._metagen(spark, batch, inline, operation)
                return self._land(batch.settled())
            except Exception:
                with contextlib.suppress(Exception):
                    batch.settled()  # its files are written before they go
                raise

    def metagen(self, *, inline: bool | None, spark: Any) -> IngestResult:
        self.refresh().protocol.check_write(self.io.uri())
        return self._metagen(spark, None, inline)

    def _check_not_taken(self, state: TableState, batch: Landed) -> None:
        done = already_committed(self.io, state, batch.batch_id)
        if done is not None:
            batch.settled()  # its files are written before they go
            landing.remove_part_files(self.io, batch.part)
            raise _Done(done)

    def _land(self, batch: Landed) -> IngestResult:
        def build(state: TableState):
            self._check_not_taken(state, batch)
            record = BatchRecord(batch.batch_id, batch.part, PENDING, batch.records, batch.keys_files)
            c = Commit(state.version + 1, LAND, now_ms(state.timestamp_ms), parameters={"batch_id": batch.batch_id},
                       batches=(record,), add_files=batch.data_files)
            return c, []

        try:
            c, _ = transaction.commit(self.io, self.refresh, build)
        except _Done as done:
            return done.result
        assert c is not None
        return IngestResult(batch.batch_id, c.version, True, False, {})

    def _metagen(self, spark, batch: Landed | None, inline: bool | None, operation: str = INGEST) -> IngestResult:
        index = indexsession.IndexSession(self.io)
        outputs: dict[int, MetaGenOutput] = {}  # by version: the attempt that commits is the last of its version

        def build(state: TableState):
            nonlocal batch
            if batch is not None:
                self._check_not_taken(state, batch)
            batches = engine_metagen.pending_batches(state) + ([batch] if batch else [])
            if not batches:
                return None, []
            version = state.version + 1
            try:
                out = self._run(spark, state, batches, version, inline, index)
            except keyindex.IndexAheadError:
                raise transaction.Rebuild from None
            outputs[version] = out
            if batch is not None and batch.writing is not None:
                try:
                    batch = batches[-1] = batch.settled()  # the commit names its files with their sizes
                except BaseException:
                    for path in out.written():  # no commit can name them
                        self.io.delete(path)
                    raise
            timestamp_ms = now_ms(state.timestamp_ms)
            # Status changes of the pending batches, then the landing of the batch being ingested.
            records = [BatchRecord(b.batch_id, b.part, LIVE) for b in batches if b is not batch]
            if batch is not None:
                records.append(BatchRecord(batch.batch_id, batch.part, LIVE, batch.records, batch.keys_files))
            c = Commit(
                version=version,
                operation=operation if batch else METAGEN,
                timestamp_ms=timestamp_ms,
                parameters={"batch_id": batch.batch_id} if batch else {},
                protocol=state.protocol.needing(*out.features()),
                batches=tuple(records),
                add_files=batch.data_files if batch else (),
                segments=tuple(out.segments),
                logs=tuple(out.logs),
                keystore_add=tuple(out.keystore_add),
                keystore_remove=tuple(out.keystore_remove),
                counts=out.counts(),
                batch_counts={b.batch_id: out.batch_counts.get(i, dict.fromkeys(COUNTS, 0))
                              for i, b in enumerate(batches)},
                events=tuple(changeevent.commit_events(self.io, state.metadata.name, state, version, timestamp_ms,
                                                       batches, out.segments, out.counts())),
            )
            return c, out.written()

        try:
            try:
                c, _ = transaction.commit(self.io, self.refresh, build)
            except _Done as done:
                return done.result
            if c is None:
                return IngestResult(None, self.refresh().version, False, True, {})
            index.after_commit(self.refresh(), c.version, outputs[c.version].keystore_rows)
        finally:
            index.close()
        if sum(b.records or 0 for b in c.batches) >= memory.RELEASE_AFTER_RECORDS:
            memory.release_unused()
        counts = c.batch_counts.get(batch.batch_id, {}) if batch else dict(c.counts)
        return IngestResult(batch.batch_id if batch else None, c.version, True, True, counts, c.made_live)

    def _run(self, spark, state: TableState, batches: list[Landed], version: int, inline: bool | None,
             index: indexsession.IndexSession) -> MetaGenOutput:
        from bitlake.spark import metagen as spark_metagen

        meta = state.metadata
        rows = sum(b.records for b in batches)
        if not meta.keyed:
            return engine_metagen.unkeyed_output(batches)
        if inline is False or (inline is None and rows > meta.int_prop("metagen.inline_max_rows")):
            batches = [b.settled() for b in batches]  # Spark reads their files
            return spark_metagen.run(spark or _session(), self.io, state, batches, version)
        # The inline MetaGen reads the files of a batch whose records' rows the landing did not keep.
        batches = [b if b.rows is not None else b.settled() for b in batches]
        return engine_metagen.run_inline(self.io, state, batches, version, index.at(state))


def _session():
    from bitlake.spark.session import spark_session

    return spark_session()


def landing_of(data: Any, meta: TableMetadata, op_column: str | None):
    """How ``data`` lands: Arrow and pandas input (and a Spark DataFrame small enough for the driver) on this
    machine without Spark, any other Spark DataFrame by a Spark job (:func:`bitlake.spark.landing.landing`).
    Returns ``land(io, part)``."""
    reader = conform.arrow_input(data)
    rows = conform.row_count(data)
    if reader is None and _is_spark_dataframe(data):
        from bitlake.spark import landing as spark_landing

        reader, rows, land = spark_landing.landing(data, meta, op_column, meta.int_prop("ingest.driver_max_bytes"))
        if land is not None:
            return lambda io, part: (*land(io, part), None, None)
    if reader is None:
        raise InvalidInputError(
            f"cannot ingest a {type(data).__name__}: pass a pyarrow Table, RecordBatch or RecordBatchReader, a "
            "pandas DataFrame or a Spark DataFrame"
        )
    batches = conform.conformed(reader, meta, op_column)
    # A batch of known size that the inline MetaGen will take keeps its records for it.
    keep = meta.keyed and rows is not None and rows <= meta.int_prop("metagen.inline_max_rows")

    def land_here(io: FileIO, part: int):
        landed = landing.land_local(io, meta, part, op_column is not None, batches, rows, keep=keep)
        return landed.data, landed.keys, landed.rows, landed.files

    return land_here


def _is_spark_dataframe(data: Any) -> bool:
    return type(data).__name__ == "DataFrame" and type(data).__module__.startswith("pyspark.")
