"""What every writer of records shares — ingestion, restatement and DML: a batch's id, its landing, and the
commit that makes batches live (MetaGen's, or a restatement's), built in one place on the one commit path
(:mod:`bitlake.transaction`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

import pyarrow as pa

from bitlake import changeevent, faults, memory
from bitlake.engine.keys import keyindex
from bitlake.engine.write import conform, digest, landing
from bitlake.engine.write import metagen as engine_metagen
from bitlake.engine.write.landing import Landed
from bitlake.engine.write.metagen import COUNTS, MetaGenOutput
from bitlake.engine.write.restate import Restatement
from bitlake.engine.write.spill import KeptRows
from bitlake.errors import BatchIdReusedError, InvalidInputError
from bitlake.format import changefile, commitlog
from bitlake.format.commit import INGEST, LAND, LIVE, METAGEN, PENDING, BatchRecord, Commit, DataFile, KeysFile
from bitlake.format.metadata import TableMetadata
from bitlake.format.protocol import DELETE_POSITIONS, RESTATEMENTS
from bitlake.format.state import TableState
from bitlake.fs import FileIO
from bitlake.transaction import Attempt, Finished, Replan, Transaction

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


class LandedFiles(NamedTuple):
    """What a landing wrote: the data files and keys files, the records' keys-file rows when the landing kept them
    in memory, while the last files are still being written, what waits for them (:attr:`Landed.writing`), what
    takes the records' digest when they came as Arrow input, and the rows it spilled to scratch files instead."""

    data: list[DataFile]
    keys: list[KeysFile]
    rows: pa.Table | None = None
    writing: Callable[[], tuple[list[DataFile], list[KeysFile]]] | None = None
    digesting: Callable[[], str] | None = None  # what waits for the records' digest and returns it
    spilled: KeptRows | None = None


@dataclasses.dataclass(frozen=True)
class ChangePlan:
    """What a change with change rows of its own plans on a snapshot (:func:`commit_changes`): its fold
    (segments, logs, key-store files and the change rows), the status records of the batches it restates, and
    the commit's parameters."""

    restatement: Restatement
    statuses: list[BatchRecord]
    parameters: dict[str, Any]


def check_batch_id(batch_id: str | None) -> str:
    if batch_id is None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
        return f"{stamp}-{uuid.uuid4().hex[:12]}"
    if not isinstance(batch_id, str) or not batch_id or len(batch_id) > MAX_BATCH_ID_LENGTH:
        raise InvalidInputError(f"batch_id must be a non-empty string of at most {MAX_BATCH_ID_LENGTH} characters")
    return batch_id


def check_same_records(state: TableState, batch_id: str, records_digest: str | None) -> None:
    """Raises :class:`BatchIdReusedError` when ``batch_id`` committed with records whose digest differs from
    ``records_digest`` (nothing is checked when either is unknown: a Spark DataFrame's batch, a table before
    digests; nor when they were taken by different algorithms: :func:`input_digest` takes the committed one's)."""
    b = state.batch(batch_id)
    if b is None or b.digest is None or records_digest is None or b.digest == records_digest \
            or digest.algorithm_of(b.digest) != digest.algorithm_of(records_digest):
        return
    raise BatchIdReusedError(
        f"batch {batch_id!r} was committed at version {b.landed_version} with other records: a committed batch "
        f"is not changed by ingesting its id again (that is a no-op for the same records, an idempotent retry); "
        f"replace it with replace_batch({batch_id!r}, data), or revert it with revert_batch({batch_id!r}), or "
        f"ingest the new records under a new batch id")


def input_digest(data: Any, meta: TableMetadata, op_column: str | None, algorithm: str = digest.ALGORITHM
                 ) -> str | None:
    """The digest of ``data``'s records by ``algorithm`` (:func:`landing_of` lands them with the newest), read from
    it; None for a Spark DataFrame, input that is not Arrow's (which landing refuses) or an unknown algorithm."""
    reader = conform.arrow_input(data)
    if reader is None or algorithm not in digest.STREAM_HASHES:
        return None
    d = digest.Digest(algorithm)
    for b in conform.conformed(reader, meta, op_column):
        d.update(b)
    return d.hexdigest()


def already_committed(io: FileIO, state: TableState, batch_id: str) -> IngestResult | None:
    """The result of the commit that took ``batch_id``, if one did (any status: a reverted id stays taken)."""
    b = state.batch(batch_id)
    if b is None:
        return None
    version = b.live_version if b.live_version is not None else b.landed_version
    if state.window is not None and version < state.window.version:  # its commit may be gone with the window
        return IngestResult(batch_id, version, False, b.status != PENDING, {}, ())
    c = commitlog.read(io, version)
    return IngestResult(batch_id, version, False, b.status != PENDING, c.batch_counts.get(batch_id, {}), c.made_live)


def landing_of(data: Any, meta: TableMetadata, op_column: str | None, keep: bool = True):
    """How ``data`` lands: Arrow input (anything exporting the Arrow PyCapsule interface) and pandas input (and a
    Spark DataFrame small enough for the driver) on this machine without Spark, any other Spark DataFrame by a
    Spark job (:func:`bitlake.spark.landing.landing`). Unless ``keep`` is False (no inline MetaGen takes the batch
    with its landing), a landing on this machine keeps its records' keys for the MetaGen.
    Returns ``land(io, part) -> LandedFiles``. Checks the input before anything is written."""
    reader = conform.arrow_input(data)
    rows = conform.row_count(data)
    if reader is None and _is_spark_dataframe(data):
        from bitlake.spark import landing as spark_landing  # Spark is optional: imported when the input is Spark's

        reader, rows, land = spark_landing.landing(data, meta, op_column, meta.int_prop("ingest.driver_max_bytes"))
        if land is not None:
            return lambda io, part: LandedFiles(*land(io, part))
    if reader is None:
        raise InvalidInputError(f"cannot ingest a {type(data).__name__}: pass {conform.ACCEPTED}"
                                f"{conform.not_arrow_hint(data)}")
    batches = conform.conformed(reader, meta, op_column)
    # A Spark DataFrame collected to the driver takes no digest: comparing a retry's records would run its query
    # again (docs/ingestion.md).
    records = None if _is_spark_dataframe(data) else digest.Digest()
    if records is not None:
        batches = records.over(batches)
    # A batch the inline MetaGen will take keeps its records' keys-file rows for it, up to its limit (past that,
    # a MetaGen on Spark or one reading the files takes it): in memory up to the records the MetaGen folds at once,
    # beyond in scratch files, by the groups it folds then.
    limit = meta.int_prop("metagen.inline_max_rows")

    def land_here(io: FileIO, part: int) -> LandedFiles:
        kept = KeptRows(min(limit, engine_metagen.SPILL_RECORDS), limit, meta.num_buckets,
                         meta.primary_key[0]) \
            if keep and meta.keyed and (rows is None or rows <= limit) else None
        landed = landing.land_local(io, meta, part, op_column is not None, batches, rows, kept=kept)
        return LandedFiles(landed.data, landed.keys, landed.rows, landed.files,
                           records.hexdigest if records is not None else None, landed.spilled)

    return land_here


def _is_spark_dataframe(data: Any) -> bool:
    return type(data).__name__ == "DataFrame" and type(data).__module__.startswith("pyspark.")


def land(tx: Transaction, state: TableState, land_fn, batch_id: str, settle: bool = True) -> Landed:
    """Claims a segment part for ``tx`` and lands a batch in it (``land_fn``: what :func:`landing_of` returns);
    unless ``settle``, returns while the last of its files are still being written (:meth:`Landed.settled`)."""
    part = tx.claim_part()
    faults.point("after_claim")
    files = land_fn(tx.io, part)
    faults.point("after_landing")
    records = sum(f.rows for f in files.data) + sum(f.rows for f in files.keys)
    batch = Landed(batch_id, part, records, tuple(files.data), tuple(files.keys), files.rows, files.spilled,
                   files.writing, digesting=files.digesting)
    return batch.settled() if settle else batch


def output_commit(io: FileIO, state: TableState, operation: str, output: MetaGenOutput, *, live: list[Landed],
                  new: Landed | None, statuses: list[BatchRecord], counts: dict[str, int],
                  batch_counts: dict[str, dict[str, int]], parameters: dict, features: tuple[str, ...] = (),
                  change_files: tuple = (), tags: dict[str, str] | None = None) -> Commit:
    """The commit at the next version that publishes a MetaGen-like ``output`` (segments, logs, key-store files):
    the batches whose status it changes (``statuses``), ``new``'s landing with its data files, and the Data
    Change Events of making ``live`` live (tagged with ``tags``)."""
    version = state.version + 1
    timestamp_ms = commitlog.now_ms(state.timestamp_ms)
    events = changeevent.commit_events(io, state.metadata.name, state, version, timestamp_ms, live,
                                       output.segments, counts)
    if tags:
        events = [{**e, "tags": {**e["tags"], **tags}} for e in events]
    records = list(statuses)
    if new is not None:
        records.append(BatchRecord(new.batch_id, new.part, LIVE, new.records, new.keys_files, new.digest))
    return Commit(
        version, operation, timestamp_ms, parameters=parameters,
        protocol=state.protocol.needing(*features, *output.features(), *_landing_features(new)),
        batches=tuple(records),
        add_files=new.data_files if new is not None else (), segments=tuple(output.segments),
        logs=tuple(output.logs), keystore_add=tuple(output.keystore_add),
        keystore_remove=tuple(output.keystore_remove), prior_entries=tuple(output.prior_entries),
        change_files=change_files, counts=counts,
        batch_counts=batch_counts, events=tuple(events),
    )


def _check_not_taken(io: FileIO, state: TableState, batch: Landed | None) -> None:
    if batch is None:
        return
    done = already_committed(io, state, batch.batch_id)
    if done is not None:
        settled = batch.settled()  # its files are written before they go, and its digest taken
        check_same_records(state, batch.batch_id, settled.digest)  # another writer committed the id meanwhile
        raise Finished(done)


def _landing_features(batch: Landed | None) -> tuple[str, ...]:
    """The protocol features a commit that lands ``batch`` needs: its keys files have delete positions."""
    return (DELETE_POSITIONS,) if batch is not None and batch.keys_files else ()


def commit_landing(tx: Transaction, batch: Landed) -> IngestResult:
    """The ``LAND`` commit of a batch landed pending (MetaGen makes it visible later)."""
    def plan(state: TableState) -> Attempt:
        _check_not_taken(tx.io, state, batch)
        record = BatchRecord(batch.batch_id, batch.part, PENDING, batch.records, batch.keys_files, batch.digest)
        return Attempt(Commit(state.version + 1, LAND, commitlog.now_ms(state.timestamp_ms),
                              parameters={"batch_id": batch.batch_id}, protocol=state.protocol.needing(
                                  *_landing_features(batch)), batches=(record,), add_files=batch.data_files))

    try:
        c = tx.commit(plan)
    except Finished as done:
        return done.result
    assert c is not None
    return IngestResult(batch.batch_id, c.version, True, False, {})


def make_live(tx: Transaction, batch: Landed | None, *, inline: bool | None, spark: Any,
              operation: str = INGEST) -> IngestResult:
    """The MetaGen commit that makes every pending batch live, and ``batch`` (landed for it, not committed) with
    them; a batch id another writer committed first is a no-op that returns that commit's result."""
    io = tx.io

    def plan(state: TableState) -> Attempt:
        nonlocal batch
        _check_not_taken(io, state, batch)
        batches = engine_metagen.pending_batches(state) + ([batch] if batch else [])
        if not batches:
            raise Finished(IngestResult(None, state.version, False, True, {}))
        try:
            out = _run(tx, spark, state, batches, state.version + 1, inline)
        except keyindex.IndexAheadError:
            raise Replan from None
        if batch is not None and (batch.writing is not None or batch.digesting is not None):
            try:
                batch = batches[-1] = batch.settled()  # the commit names its files with their sizes, and the digest
            except BaseException:
                for path in out.written():  # no commit can name them
                    io.delete(path)
                raise
        statuses = [BatchRecord(b.batch_id, b.part, LIVE) for b in batches if b is not batch]
        c = output_commit(io, state, operation if batch else METAGEN, out, live=batches, new=batch,
                          statuses=statuses, counts=out.counts(), parameters={"batch_id": batch.batch_id} if batch
                          else {}, batch_counts={b.batch_id: out.batch_counts.get(i, dict.fromkeys(COUNTS, 0))
                                                 for i, b in enumerate(batches)})
        return Attempt(c, tuple(out.written()),
                       lambda latest: tx.index.after_commit(latest, c.version, out.keystore_rows))

    try:
        c = tx.commit(plan)
    except Finished as done:
        return done.result
    assert c is not None
    if sum(b.records or 0 for b in c.batches) >= memory.RELEASE_AFTER_RECORDS:
        memory.release_unused()
    counts = c.batch_counts.get(batch.batch_id, {}) if batch else dict(c.counts)
    return IngestResult(batch.batch_id if batch else None, c.version, True, True, counts, c.made_live)


def _run(tx: Transaction, spark, state: TableState, batches: list[Landed], version: int,
         inline: bool | None) -> MetaGenOutput:
    meta = state.metadata
    rows = sum(b.records for b in batches)
    if not meta.keyed:
        return engine_metagen.unkeyed_output(batches)
    # Spark runs MetaGen only where it is asked for: inline=False, or a batch past the limit with a session given
    # (spark=, or the Spark DataFrame's own).
    if inline is False or (inline is None and spark is not None and rows > meta.int_prop("metagen.inline_max_rows")):
        from bitlake.spark import metagen as spark_metagen  # Spark is optional: imported when a Spark MetaGen runs
        from bitlake.spark.session import spark_session

        batches = [b.settled() for b in batches]  # Spark reads their files
        return spark_metagen.run(spark or spark_session(), tx.io, state, batches, version)
    # The inline MetaGen reads the files of a batch whose records' rows the landing did not keep.
    batches = [b if b.rows is not None or b.spilled is not None else b.settled() for b in batches]
    return engine_metagen.run_inline(tx.io, state, batches, version, tx.index.at(state))


def write(tx: Transaction, data: Any, *, op_column: str | None, batch_id: str | None, metagen: bool,
          inline: bool | None, spark: Any, operation: str = INGEST) -> IngestResult:
    """Ingests one batch in ``tx``: checks it, lands it and commits it (its MetaGen, or its landing alone)."""
    state = tx.refresh()
    state.protocol.check_write(tx.io.uri())
    meta = state.metadata
    batch_id = check_batch_id(batch_id)
    if op_column is not None and not meta.keyed:
        raise InvalidInputError("an unkeyed (append-only) table takes no op_column: it has no deletes")
    done = already_committed(tx.io, state, batch_id)
    if done is not None:
        b = state.batch(batch_id)
        if b is not None and b.digest is not None and not _is_spark_dataframe(data):
            check_same_records(state, batch_id, input_digest(data, meta, op_column, digest.algorithm_of(b.digest)))
        return done
    # checks the input before anything is written
    land_fn = landing_of(data, meta, op_column, keep=metagen and inline is not False)
    # The batch's MetaGen needs its records' keys, not its files: it runs while the files are written.
    batch = land(tx, state, land_fn, batch_id, settle=False)
    if spark is None and _is_spark_dataframe(data):
        spark = data.sparkSession  # the session a Spark MetaGen of a Spark input runs in
    return commit_landed(tx, batch, metagen=metagen, inline=inline, operation=operation, spark=spark)


def commit_landed(tx: Transaction, batch: Landed, *, metagen: bool, inline: bool | None, spark: Any,
                  operation: str = INGEST) -> IngestResult:
    """Commits a landed batch: its landing (LAND), or its MetaGen with it (``operation``)."""
    try:
        if metagen:
            return make_live(tx, batch, inline=inline, spark=spark, operation=operation)
        return commit_landing(tx, batch.settled())
    except BaseException:
        if tx.committed is None:
            try:
                batch.settled()  # its files are written before they go
            except Exception:  # noqa: BLE001 - the first failure is the one to raise
                pass
        raise
    finally:
        if batch.spilled is not None:
            batch.spilled.remove()


def commit_changes(tx: Transaction, operation: str, new: Landed | None, plan, more=None) -> Commit:
    """Commits a change that writes its own change rows (a revert, a replace, a vacuum's deletes, an unkeyed
    table's DML): ``plan(state, version)`` returns its :class:`ChangePlan`, or raises :class:`Finished`; ``new`` is
    the batch it makes live;
    ``more(state)`` gives further fields of the commit (a vacuum's)."""
    io = tx.io

    def attempt(state: TableState) -> Attempt:
        state.protocol.check_write(io.uri())
        planned = plan(state, state.version + 1)
        r, parameters = planned.restatement, planned.parameters
        changes = changefile.write(io, r.changes)
        c = output_commit(io, state, operation, r.output, live=[new] if new is not None else [], new=new,
                          statuses=planned.statuses, counts=r.counts, parameters=parameters, features=(RESTATEMENTS,),
                          batch_counts={new.batch_id: r.counts} if new is not None else {},
                          change_files=(changes,),
                          tags={**{k: str(v) for k, v in parameters.items()}, "operation": operation})
        if more is not None:
            c = dataclasses.replace(c, **more(state))
        rows = r.output.keystore_rows
        after = None if rows is None else lambda latest: tx.index.after_commit(latest, c.version, rows)
        return Attempt(c, (*r.output.written(), changes.path), after)

    c = tx.commit(attempt)
    assert c is not None
    return c
