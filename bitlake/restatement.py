"""Restatement (docs/restatement.md): reverting and replacing a batch, and value tombstones, which hide rows
committed before them by the value of a column (an erased user id, a bad source), each one commit of metadata
(no data file is rewritten); and the vacuum, which removes the tombstoned rows from the data files."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bitlake import batches, transaction
from bitlake.batches import IngestResult
from bitlake.engine.maintain import vacuum as engine_vacuum
from bitlake.engine.write import restate as engine_restate
from bitlake.engine.write.landing import Landed
from bitlake.engine.write.metagen import MetaGenOutput
from bitlake.errors import CommitConflictError, InvalidInputError
from bitlake.format import changefile, commitlog, layout
from bitlake.format.commit import (
    COMPACT,
    LIVE,
    PENDING,
    REPLACE,
    REPLACED,
    REVERT,
    REVERTED,
    TOMBSTONE,
    VACUUM,
    BatchRecord,
    Commit,
    Tombstone,
)
from bitlake.format.metadata import OP_COLUMN
from bitlake.format.protocol import TOMBSTONES
from bitlake.format.state import TableState
from bitlake.fs import FileIO
from bitlake.transaction import Attempt, Finished, Transaction


def tombstone_values(state: TableState, column: str, values: Any) -> pa.Array:
    """``values`` as the distinct non-null values of ``column``'s type; InvalidInputError names what is wrong."""
    meta = state.metadata
    if column not in meta.schema.names:
        raise InvalidInputError(f"tombstone: the table has no column {column!r}; its columns are {meta.schema.names}")
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise InvalidInputError(f"tombstone: values must be a list or an array of {column!r} values, not {values!r}")
    target = meta.schema.field(column).type
    if pa.types.is_nested(target):
        raise InvalidInputError(f"tombstone: column {column!r} has type {target}: a tombstone matches values of a "
                                "column of single values (numbers, strings, dates, times, booleans, binaries)")
    try:
        arr = values if isinstance(values, pa.Array | pa.ChunkedArray) else pa.array(list(values))
        arr = pc.cast(arr, target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as e:
        raise InvalidInputError(f"tombstone: the values are not {column!r} values ({target}): {e}") from None
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = pc.unique(arr.drop_null())
    if not len(arr):
        raise InvalidInputError("tombstone: give at least one non-null value")
    return arr


def tombstone(io: FileIO, refresh, column: str, values: Any) -> Commit:
    """One ``TOMBSTONE`` commit hiding, from its version on, the rows of batches made live before it whose
    ``column`` holds one of ``values`` (docs/FORMAT.md, "Tombstones"). No data file is read or written: the
    commit names a small Parquet file of the values; readers filter by it. The commit's parameters carry the
    table's tombstone metrics (values added, removed, total), as Iceberg's snapshot summaries do."""
    arr = tombstone_values(refresh(), column, values)

    def plan(state: TableState) -> Attempt:
        state.protocol.check_write(io.uri())
        path = layout.tombstone_path()
        with io.open_output(path) as out:
            pq.write_table(pa.table({column: arr}), out, compression="zstd")
        total = sum(t.count for _, t in state.tombstones) + len(arr)
        protocol = state.protocol.needing(TOMBSTONES)
        c = Commit(state.version + 1, TOMBSTONE, commitlog.now_ms(state.timestamp_ms),
                   parameters={"column": column, "tombstones_added": len(arr), "tombstones_removed": 0,
                               "tombstones_total": total},
                   protocol=protocol, tombstones=(Tombstone(column, path, len(arr)),))
        return Attempt(c, (path,))

    c = transaction.run(io, refresh, plan)
    assert c is not None
    return c


def revert_batch(io: FileIO, refresh, batch_id: str) -> IngestResult:
    """One ``REVERT`` commit after which every view is as if ``batch_id``'s current incarnation had never been
    ingested; a batch already reverted is a no-op (``committed`` False)."""
    with Transaction(io, refresh) as tx:
        return _restate(tx, batch_id, None)


def revert_dry_run(io: FileIO, refresh, batch_id: str) -> IngestResult:
    """What :func:`revert_batch` would commit now, committing nothing: ``counts`` are the change rows it would
    write (``committed`` False). The restatement is computed in full (the batch's records, the key store
    before it, the later batches' records) and the files it wrote on the way are removed."""
    with Transaction(io, refresh) as tx:  # commits nothing: what it owns goes when it ends
        state = tx.refresh()
        b = _restatable(state, batch_id)
        if b.status != LIVE:
            return IngestResult(batch_id, state.version, False, True, {})
        r = engine_restate.restate(io, state, b.part, None, state.version + 1)
        tx.own(*r.output.written())
        return IngestResult(batch_id, state.version, False, True, dict(r.counts))


def replace_batch(io: FileIO, refresh, batch_id: str, data: Any, op_column: str | None) -> IngestResult:
    """One ``REPLACE`` commit that reverts ``batch_id`` and makes ``data`` live under the same id."""
    with Transaction(io, refresh) as tx:
        state = tx.refresh()
        state.protocol.check_write(io.uri())
        _restatable(state, batch_id)
        if op_column is not None and not state.metadata.keyed:
            raise InvalidInputError("an unkeyed (append-only) table takes no op_column: it has no deletes")
        land = batches.landing_of(data, state.metadata, op_column)  # checks the input before anything is written
        return _restate(tx, batch_id, batches.land(tx, state, land, batch_id))


def _restatable(state: TableState, batch_id: str):
    if not isinstance(batch_id, str) or not batch_id:
        raise InvalidInputError(f"batch_id must be a non-empty string, not {batch_id!r}")
    b = state.batch(batch_id)
    if b is None:
        raise InvalidInputError(f"no batch {batch_id!r} was ever ingested into this table")
    if b.status == PENDING:
        raise InvalidInputError(f"batch {batch_id!r} is landed but pending MetaGen: run metagen() first, then "
                                "restate it")
    return b


def _restate(tx: Transaction, batch_id: str, new: Landed | None) -> IngestResult:
    def plan(state: TableState, version: int):
        b = _restatable(state, batch_id)
        removed = b.part if b.status == LIVE else None
        if new is None and removed is None:  # reverted already: a retry
            raise Finished(IngestResult(batch_id, b.restated_version or state.version, False, True, {}))
        r = engine_restate.restate(tx.io, state, removed, new, version)
        records = [BatchRecord(batch_id, removed, REVERTED if new is None else REPLACED)] if removed is not None else []
        return batches.ChangePlan(r, records, {"batch_id": batch_id})

    try:
        c = batches.commit_changes(tx, REVERT if new is None else REPLACE, new, plan)
    except Finished as done:
        return done.result
    return IngestResult(batch_id, c.version, True, True, dict(c.counts), c.made_live)


@dataclasses.dataclass(frozen=True)
class VacuumResult:
    """What a vacuum did: its version (None: no tombstone to apply), the data files of the retention window it
    considered, read (their statistics admitted a tombstoned value) and rewrote or dropped, the rows it purged
    and the tombstones it retired."""

    version: int | None
    files_considered: int = 0
    files_read: int = 0
    files_rewritten: int = 0
    rows_purged: int = 0
    tombstones_retired: int = 0


VACUUM_ATTEMPTS = 3


def vacuum(io: FileIO, refresh) -> VacuumResult:
    """One ``VACUUM`` commit after which no data file holds a row the table's tombstones hide, and those
    tombstones are retired; the rewritten files are deleted at once. On a keyed table the commit also deletes
    the keys whose current row it purged (a batch of delete records with the rows' delta values), so the key
    store, the views and the change feed (``delete`` rows that carry the keys) agree that they are gone. A
    compaction or vacuum committed while it ran makes it start over (it may have copied tombstoned rows into
    new files)."""
    _delete_rewritten(io, refresh())  # what an earlier vacuum killed after its commit left
    for _ in range(VACUUM_ATTEMPTS):
        try:
            with Transaction(io, refresh) as tx:
                c, prepared = _vacuum_once(tx)
        except _Moved:
            continue  # its files went with its transaction
        if c is None:
            return VacuumResult(None)
        _delete_rewritten(io, refresh())
        return VacuumResult(c.version, prepared.files_considered, prepared.files_read, len(prepared.rewrites),
                            prepared.rows_purged, len(prepared.tombstones))
    raise CommitConflictError(f"vacuum gave up after {VACUUM_ATTEMPTS} attempts: compactions or restatements of "
                              f"{io.uri()} kept committing first")


def vacuum_dry_run(io: FileIO, refresh) -> VacuumResult:
    """What :func:`vacuum` would do now (``version`` None), writing nothing: the files a vacuum would read are read
    as it would, their tombstoned columns and row ids only, so the figures are exact."""
    state = refresh()
    if not state.tombstones:
        return VacuumResult(None)
    prepared = engine_vacuum.prepare(io, state, dry_run=True)
    return VacuumResult(None, prepared.files_considered, prepared.files_read, len(prepared.rewrites),
                        prepared.rows_purged, len(prepared.tombstones))


def _vacuum_once(tx: Transaction):
    io, state = tx.io, tx.refresh()
    state.protocol.check_write(io.uri())
    if not state.tombstones:
        return None, None
    prepared = engine_vacuum.prepare(io, state)
    tx.own(*prepared.written)
    prepared.purged_file = engine_vacuum.write_purged(io, state.metadata, prepared.purged)
    if prepared.purged_file is not None:
        tx.own(prepared.purged_file.path)
    current, prepared.current = _current_purged(io, state, prepared.purged)
    new = None
    if current is not None:
        new = batches.land(tx, state, batches.landing_of(current, state.metadata, OP_COLUMN),
                           batches.check_batch_id(None).replace("-", "-vacuum-", 1))
    c = batches.commit_changes(tx, VACUUM, new, functools.partial(_vacuum_plan, io, prepared, new),
                               functools.partial(_vacuum_fields, prepared))
    return c, prepared


def _current_purged(io: FileIO, state: TableState, purged: pa.Table) -> tuple[pa.Table | None, pa.Table | None]:
    """Delete records (ingest input) of the purged rows that are their keys' current rows, and those rows (as
    ``purged`` holds them); None, None: none."""
    if not state.metadata.keyed or not purged.num_rows:
        return None, None
    now = engine_restate.valid_now(io, state, purged.column(engine_vacuum.ROW_ID).to_numpy())
    if not now.any():
        return None, None
    rows = purged.filter(pa.array(now))
    records = rows.drop_columns([engine_vacuum.ROW_ID, engine_vacuum.DELTA])
    return records.append_column(OP_COLUMN, pa.array(["delete"] * records.num_rows, pa.string())), rows


def _vacuum_plan(io: FileIO, prepared, new: Landed | None, state: TableState, version: int):
    for v in range(prepared.planned_on + 1, state.version + 1):
        # A compaction or vacuum may have copied tombstoned rows into new files; a revert or replace may have
        # changed which rows are current, and with them the keys the vacuum must delete.
        if commitlog.read(io, v).operation in (COMPACT, VACUUM, REVERT, REPLACE):
            raise _Moved
    if state.version > prepared.planned_on and new is not None \
            and not engine_restate.valid_now(io, state, prepared.current.column(engine_vacuum.ROW_ID).to_numpy()).all():
        raise _Moved  # a record ingested meanwhile (of an equal delta value) superseded a row it would delete
    if new is None:
        r = engine_restate.Restatement(MetaGenOutput([], [], [], [], {}), changefile.table(), {})
    else:
        # The rows it deletes are current (checked above): their keys' entries are theirs, not looked up.
        r = engine_restate.restate(io, state, None, new, version, stored=prepared.current)
        # The deleted rows are in no data file any more: their change rows carry the key and delta columns.
        meta = state.metadata
        keys = prepared.purged.select([*meta.primary_key, meta.delta_column, engine_vacuum.ROW_ID]).rename_columns(
            [*meta.primary_key, meta.delta_column, changefile.ROW_ID])
        r.changes = r.changes.join(keys, keys=changefile.ROW_ID, join_type="inner").sort_by(changefile.ORDER)
    return batches.ChangePlan(r, [], {"files_rewritten": len(prepared.rewrites), "rows_purged": prepared.rows_purged})


def _vacuum_fields(prepared, state: TableState) -> dict:
    retired = set(prepared.tombstones)
    removed = sum(t.count for _, t in state.tombstones if t.path in retired)
    total = sum(t.count for _, t in state.tombstones) - removed
    parameters = {"files_rewritten": len(prepared.rewrites), "rows_purged": prepared.rows_purged,
                  "tombstones_added": 0, "tombstones_removed": removed, "tombstones_total": total}
    return {"parameters": parameters, "rewrites": tuple(prepared.rewrites),
            "remove_tombstones": tuple(prepared.tombstones),
            "purged": (prepared.purged_file,) if prepared.purged_file is not None else ()}


def _delete_rewritten(io: FileIO, state: TableState) -> None:
    for path in state.rewritten:
        if io.exists(path):
            io.delete(path)


class _Moved(Exception):
    """Rows moved between files, or other rows became current, since the vacuum was planned."""
