"""Batch restatement on the driver: the metadata of a commit that reverts a batch, or replaces it with new
records, without rewriting a data file (docs/restatement.md, docs/FORMAT.md "Restatements").

A revert changes the history of the keys the batch touched, and of those only. For each such key the
history is folded again by the semantics contract, without the batch, from the key's key-store entry just
before the **fold start** (the version that made the batch live, or earlier when a restatement committed
since then removed a batch made live before it: that key-store version still holds the removed batch) over
the records of every batch made live since, in the order they were applied, and the records of the
replacement last. The fold says, for every row of those keys, whether it is valid now or until which event
time; the commit writes that as SET_VALID_UNTIL events (``t`` = the row's own delta value for a row no
view may show any more), new bitmaps, and key-store rows. Its change rows, the difference between the
current views before and after, go to a change file (:mod:`bitlake.format.changefile`).

The cost follows the keys the batch touched and the batches made live since the fold start: the key-store
buckets of those keys at one version, and the key columns of those batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bitlake.engine.keys.keyencoding import fixed_width, int64_values, key_codes
from bitlake.engine.read import prefiltered
from bitlake.engine.write import metagen, segments
from bitlake.engine.write.fold import fold
from bitlake.engine.write.landing import Landed
from bitlake.engine.write.metagen import COUNTS, MetaGenOutput
from bitlake.errors import VersionExpiredError
from bitlake.format import bitmap, changefile, commitlog, datafile, keystore, layout, order, rowid, segmentlog
from bitlake.format import prior as prior_file
from bitlake.format import state as state_mod
from bitlake.format.commit import LIVE, REPLACED, REVERTED, VACUUM, Commit, DataFile, KeysFile, PurgedFile
from bitlake.format.metadata import TableMetadata
from bitlake.format.protocol import TOMBSTONES
from bitlake.format.state import BatchState, TableState
from bitlake.fs import FileIO
from bitlake.pool import thread_map

T = TypeVar("T")

# The key-store entry of a key that no batch holds any more: a delete older than any record, so that every
# later record of the key is accepted and none sees a visible row before it.
ABSENT_DELTA = -(1 << 63)
NO_ROW = -1


@dataclasses.dataclass
class Restatement:
    output: MetaGenOutput  # segments, logs, key-store files and rows, as a MetaGen's
    changes: pa.Table  # change rows: _row_id, _change_type, _order (changefile.SCHEMA)
    counts: dict[str, int]


def fold_start(state: TableState, part: int) -> int:
    """The version whose key store the fold of ``part``'s keys starts after: the version that made it live,
    or the earliest one that made live a batch which a restatement committed at or after the start removed."""
    start = state.parts[part].live_version
    assert start is not None
    while True:
        earlier = [b.live_version for b in state.parts.values()
                   if b.status in (REVERTED, REPLACED) and b.live_version is not None and b.live_version < start
                   and (b.restated_version is None or b.restated_version >= start)]
        if not earlier:
            return start
        start = min(earlier)


def restate(io: FileIO, state: TableState, removed: int | None, new: Landed | None, version: int,
            stored: pa.Table | None = None) -> Restatement:
    """The restatement at ``version`` on top of ``state`` that removes the live batch of part ``removed``
    (None: none) and makes ``new`` live (None: a revert). ``stored``: the key-store entries of ``new``'s keys
    when the caller knows them (key columns, ``_delta`` and ``_row_id`` as the key store names them: a vacuum's
    deletes of rows current in ``state``, whose entries are those rows'), then not read from the key store."""
    meta = state.metadata
    if not meta.keyed:
        return _unkeyed(io, state, removed, new)
    start = fold_start(state, removed) if removed is not None else version
    _refuse_outside_window(state, removed, start, version)
    if removed is not None:
        _refuse_after_vacuum(io, state, start)
    later = sorted((b for b in state.parts.values() if b.status == LIVE and b.live_version is not None
                    and b.live_version >= start and b.part != removed),
                   key=lambda b: (b.live_version, b.landed_version, b.part))
    purged = [f for v, f in state.purged if v >= start]  # files of the rows the vacuums from the start on erased
    gone = pa.concat_tables(_both(lambda: _records(io, meta, *_files_of(state, [state.parts[removed]]), [removed]),
                                  lambda: _purged(io, meta, purged, parts=[removed]))) \
        if removed is not None else datafile.keys_schema(meta).empty_table()
    added = _added(io, meta, new)
    touched = pa.concat_tables([gone, added])
    if touched.num_rows == 0:
        return _empty(state, new)
    keys = _touched_keys(io, state, touched, gone, added, later, purged)

    # Each key's entry just before the fold start.
    prior = _known(keys.distinct, stored, meta) if stored is not None and removed is None and not later else None
    if prior is None:
        prior = _entries_before(io, state, keys, removed, start)
    final, events = _refold(keys, prior, later, new)
    # A key whose last record a vacuum purged has no row: its entry is a delete marker at that record's delta
    # value, as the vacuum itself records for the keys whose current row it purges. Only the keys whose entry is
    # not a delete already are looked up (none of a vacuum's own, whose records delete every key they hold).
    live = np.flatnonzero(~final.deleted)
    final.deleted[live] = _purged_rows(io, meta, purged, later, keys.purged, final.rid[live])
    gone_upserts = ~gone.column(keystore.DELETED).to_numpy(zero_copy_only=False)
    gone_rids = gone.column(keystore.ROW_ID).to_numpy()[gone_upserts]
    events.append((gone_rids, gone.column(keystore.DELTA).to_numpy()[gone_upserts], gone_rids))  # never valid
    target, t, cause = (np.concatenate(x) for x in zip(*events, strict=True))
    after = np.where(final.deleted, NO_ROW, final.rid)
    before = _rows_valid_now(io, state, keys, prior, gone_rids, gone_upserts)
    return _write_files(io, state, new, version, keys.distinct, (target, t, cause), final, before, after)


def _known(distinct: pa.Table, stored: pa.Table, meta) -> tuple | None:
    """The entries of ``distinct``'s keys (found, delta, row id, deleted, in its order) from ``stored`` (key
    columns, ``_delta``, ``_row_id``: rows valid now, one a key); None when a key is not there."""
    pk = list(meta.primary_key)
    at = pa.array(np.arange(distinct.num_rows, dtype=np.int64))
    joined = distinct.select(pk).append_column("_at", at).join(
        stored.select([*pk, keystore.DELTA, keystore.ROW_ID]), pk, join_type="inner")
    if joined.num_rows != distinct.num_rows:
        return None
    by_key = np.argsort(joined.column("_at").to_numpy())
    n = distinct.num_rows
    return (np.ones(n, bool), joined.column(keystore.DELTA).to_numpy()[by_key],
            joined.column(keystore.ROW_ID).to_numpy()[by_key], np.zeros(n, bool))


def _entries_before(io: FileIO, state: TableState, keys: _Keys, removed: int | None, start: int) -> tuple:
    """Each key's entry at the version before the fold start ``start`` (found, delta, row id, deleted, in
    ``keys.distinct``'s order). When ``start`` made the removed batch live, the prior-entries files of that commit
    give the entries of the batch's keys (:func:`_prior_entries`); the other keys (a replacement's new ones, or every
    key when the commit wrote no such file) are searched for in the key store of that version."""
    distinct = keys.distinct
    n = distinct.num_rows
    found, delta, rid, deleted = np.zeros(n, bool), np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
    known = np.zeros(n, bool)
    if removed is not None and start == state.parts[removed].live_version:
        known = _prior_entries(io, commitlog.read(io, start), removed, keys, (found, delta, rid, deleted))
    if not known.all():
        at = state if start - 1 == state.version else state_mod.load(io, start - 1)
        wanted = np.flatnonzero(~known)
        search = distinct if len(wanted) == n else distinct.take(pa.array(wanted))
        buckets = np.unique(search.column(keystore.BUCKET).to_numpy()).tolist()
        found[wanted], delta[wanted], rid[wanted], deleted[wanted] = metagen.scan_keystore(
            io, at, search, buckets, keep=False)
    return found, delta, rid, deleted


def _prior_entries(io: FileIO, c: Commit, part: int, keys: _Keys, out: tuple[np.ndarray, ...]) -> np.ndarray:
    """Fills ``out`` (found, delta, row id, deleted by key) with the entries that the records of the batch of ``part``,
    made live by ``c``, found in the key store (``c``'s prior-entries files); returns which keys it filled. A row id
    the files leave to the log is the target of the SET_VALID_UNTIL event of ``c`` that a record of the key in the
    batch caused, whose row is not of a batch ``c`` made live."""
    n = keys.distinct.num_rows
    known = np.zeros(n, bool)
    if not c.prior_entries:
        return known
    found, delta, rid, deleted = out
    gone_rids = rids_of(keys.gone)
    if not len(gone_rids):
        return known
    rows = pa.concat_tables(thread_map(lambda f: prior_file.read(io, f, part), list(c.prior_entries)))
    by_rid = np.argsort(gone_rids)
    gone_rids, gone_codes = gone_rids[by_rid], keys.gone_codes[by_rid]  # the removed batch's records, by row id
    at, mine = order.places(gone_rids, rows.column(prior_file.ROW_ID).to_numpy())
    code = gone_codes[at[mine]]
    rows = rows.filter(pa.array(mine))
    has_entry = rows.column(prior_file.DELTA).is_valid().to_numpy(zero_copy_only=False)
    in_log = has_entry & rows.column(prior_file.PRIOR_ROW_ID).is_null().to_numpy(zero_copy_only=False)
    known[code] = True
    found[code] = has_entry
    delta[code] = rows.column(prior_file.DELTA).fill_null(0).to_numpy()
    rid[code] = rows.column(prior_file.PRIOR_ROW_ID).fill_null(NO_ROW).to_numpy()
    deleted[code] = rows.column(prior_file.DELETED).to_numpy(zero_copy_only=False)
    if in_log.any():
        live = np.array(sorted(b.part for b in c.batches if b.status == LIVE), dtype=np.int64)
        columns = [*rowid.ROW_ID_COLUMNS, "cause"]
        events = pa.concat_tables(thread_map(lambda f: segmentlog.read_until(io, f.path, columns=columns),
                                             list(c.logs)))
        target, cause = segmentlog.row_ids(events), events.column("cause").to_numpy()
        ended = ((cause >> rowid.PART_SHIFT) == part) & ~order.isin(target >> rowid.PART_SHIFT, live)
        target, cause = target[ended], cause[ended]
        at, caused = order.places(gone_rids, cause)
        ended_rid = np.full(n, NO_ROW, np.int64)
        ended_rid[gone_codes[at[caused]]] = target[caused]
        wanted = np.unique(code[in_log])
        rid[wanted] = ended_rid[wanted]
        known[wanted[ended_rid[wanted] == NO_ROW]] = False  # not in the log after all: searched for
    return known


def _refuse_outside_window(state: TableState, removed: int | None, start: int, version: int) -> None:
    """The fold starts from the key store of version ``start - 1``: a restatement is refused when a major
    compaction purged that version (the retention window starts after it)."""
    if state.window is not None and start - 1 < state.window.version:
        made_live = state.parts[removed].live_version if removed is not None else version
        why = "" if start == made_live else (
            f", after a batch made live at version {start} that a restatement removed since")
        raise VersionExpiredError(
            f"the batch was made live at version {made_live}{why}: a revert folds from the key store before "
            f"version {start}, which is not in the retention window (versions from {state.window.version}; "
            "a major compaction purged the history a revert needs)")


@dataclasses.dataclass
class _Keys:
    """The keys a restatement touches and their records, in one numbering: key ``i`` is ``distinct``'s row ``i``."""

    distinct: pa.Table  # a record of each key (its key columns and _bucket)
    history: pa.Table  # the records of these keys in the batches made live since the fold start
    records: pa.Table  # the history's, then the new batch's
    codes: np.ndarray  # the key of each of ``records``
    gone: pa.Table  # the removed batch's records
    gone_codes: np.ndarray  # the key of each of ``gone``
    purged: pa.Table  # the records of these keys' rows of the batches since the fold start that vacuums erased


@dataclasses.dataclass
class _Entries:
    """A key-store entry per key of a :class:`_Keys` numbering."""

    delta: np.ndarray
    rid: np.ndarray
    deleted: np.ndarray


def _touched_keys(io: FileIO, state: TableState, touched: pa.Table, gone: pa.Table, added: pa.Table,
                  later: list[BatchState], purged: list[PurgedFile]) -> _Keys:
    """The keys of ``touched`` (the removed and the new batch's records) with their history: their records in the
    batches ``later`` made live since the fold start, those ``purged`` holds (rows a vacuum erased) included. Only
    these keys' history is read, so the fold costs what the restated batches touch."""
    meta = state.metadata
    pk = list(meta.primary_key)
    distinct = touched.take(pa.array(key_codes(touched, pk)[1]))
    parts = [b.part for b in later]
    erased, records_later = _both(lambda: _purged(io, meta, purged, parts, distinct.select(pk)),
                                  lambda: _records(io, meta, *_files_of(state, later), parts, distinct.select(pk)))
    history = pa.concat_tables([records_later, erased])
    schema = datafile.keys_schema(meta)
    history = history.select(schema.names).cast(schema)  # a join's output may not say which columns have no nulls
    records = pa.concat_tables([history, added]).combine_chunks()

    # One numbering of the keys: key_codes numbers the distinct ones 0..nd-1, which the records and the gone
    # batch's rows share; distinct row i is then put at code i.
    codes, _ = key_codes(pa.concat_tables([distinct.select(pk), records.select(pk), gone.select(pk)]), pk)
    nd = distinct.num_rows
    distinct = distinct.take(pa.array(np.argsort(codes[:nd])))
    return _Keys(distinct, history, records, codes[nd:nd + records.num_rows], gone, codes[nd + records.num_rows:],
                 erased)


def _both(first: Callable[[], T], second: Callable[[], T]) -> list[T]:
    """What two reads give, read at once."""
    return thread_map(lambda read: read(), [first, second])


def _refold(keys: _Keys, prior: tuple, later: list[BatchState], new: Landed | None
            ) -> tuple[_Entries, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """Folds the keys' records from their entries before the fold start (``prior``: found, delta, row id,
    deleted), batch by batch in the order ``later`` were applied, the ``new`` batch last. Returns each key's new
    entry (its last accepted record's, else its prior entry) and the SET_VALID_UNTIL events (row ids, t, cause)
    of the rows the records end."""
    found, prior_d, prior_rid, prior_deleted = prior
    records, r_codes = keys.records, keys.codes
    # Fold the keys that have records; each key's last accepted record, else its entry, is its new entry.
    final_d, final_rid, final_deleted = prior_d.copy(), prior_rid.copy(), prior_deleted | ~found
    final_d[~found], final_rid[~found] = ABSENT_DELTA, NO_ROW
    events = []
    if records.num_rows:
        present, sub = np.unique(r_codes, return_inverse=True)
        order_of = {b.part: i for i, b in enumerate(later)}
        if new is not None:
            order_of[new.part] = len(later)
        rids = records.column(keystore.ROW_ID).to_numpy()
        parts = rids >> rowid.PART_SHIFT
        known = np.array(sorted(order_of), dtype=np.int64)
        batch = np.array([order_of[p] for p in known.tolist()], dtype=np.int64)[np.searchsorted(known, parts)]
        deltas = records.column(keystore.DELTA).to_numpy()
        deleted = records.column(keystore.DELETED).to_numpy(zero_copy_only=False)
        f = fold(sub.reshape(-1), deltas, rids, deleted, batch, found[present], prior_d[present],
                         prior_rid[present], prior_deleted[present])
        events.append((f.last_rid[f.until], f.delta[f.until], f.rid[f.until]))
        last = f.final
        key = r_codes[last]
        final_d[key], final_rid[key], final_deleted[key] = deltas[last], rids[last], deleted[last]
    return _Entries(final_d, final_rid, final_deleted), events


def _rows_valid_now(io: FileIO, state: TableState, keys: _Keys, prior: tuple, gone_rids: np.ndarray,
                    gone_upserts: np.ndarray) -> np.ndarray:
    """The row of each key valid now (``NO_ROW``: none), among its entry's before the fold start, the history's
    and the gone batch's upserts (``gone_rids``, where ``gone_upserts``): the change rows start from it."""
    found, _, prior_rid, prior_deleted = prior
    history = keys.history
    n_hist = history.num_rows
    candidates = np.concatenate([prior_rid[found & ~prior_deleted], rids_of(history)[_upserts(history)],
                                 gone_rids])
    cand_codes = np.concatenate([np.flatnonzero(found & ~prior_deleted), keys.codes[:n_hist][_upserts(history)],
                                 keys.gone_codes[gone_upserts]])
    now = valid_now(io, state, candidates)
    before = np.full(keys.distinct.num_rows, NO_ROW, np.int64)
    before[cand_codes[now]] = candidates[now]
    return before


def _write_files(io: FileIO, state: TableState, new: Landed | None, version: int, distinct: pa.Table,
                 events: tuple[np.ndarray, np.ndarray, np.ndarray], final: _Entries, before: np.ndarray,
                 after: np.ndarray) -> Restatement:
    """Writes the restatement's files: the SET_VALID_UNTIL ``events`` (row ids, t, cause) as a log that resets,
    the bitmaps where the rows ``after`` are valid, and the keys' ``final`` entries in the key store; returns it
    with its change rows, from each key's row ``before`` to its row ``after``."""
    meta = state.metadata
    pk = list(meta.primary_key)
    nd = distinct.num_rows
    target, t, cause = events
    parts, seqs, offsets = rowid.unpack_arrays(target)
    until = pa.table({
        rowid.PART_COLUMN: parts, rowid.SEQ_COLUMN: seqs, rowid.OFFSET_COLUMN: offsets,
        "event": np.full(len(target), segmentlog.SET_VALID_UNTIL, np.int8), "t": t, "cause": cause,
        "batch_index": np.zeros(len(target), np.int32),
    })
    seg_out = segments.write_segments(io, state.segments, until, [after[after != NO_ROW]],
                                     state.metadata.prop("bitmap.deltas"))
    ks_rows = distinct.select(pk).append_column(keystore.DELTA, pa.array(final.delta)).append_column(
        keystore.ROW_ID, pa.array(final.rid)).append_column(keystore.DELETED, pa.array(final.deleted)).append_column(
        keystore.BUCKET, distinct.column(keystore.BUCKET)).append_column(
        keystore.VERSION, pa.array(np.full(nd, version, np.int64)))
    files, replaced = keystore.write_bucket_files(io, meta, state.keystore, ks_rows, shared=True)
    changes, counts = diff(before, after)
    out = metagen.assemble(state, [new] if new is not None else [], seg_out, files, replaced, {0: counts})
    out.logs = [dataclasses.replace(f, resets=True) for f in out.logs]
    out.keystore_rows = ks_rows
    return Restatement(out, changes, counts)


def _refuse_after_vacuum(io: FileIO, state: TableState, start: int) -> None:
    """A restatement re-applies the records of every batch made live from ``start`` on, those of the rows a
    vacuum purged since then included (its purged file keeps their keys and delta values). A vacuum written
    before vacuums kept them may have erased records the fold needs (a stale or superseded row of a later
    batch, a row of the batch itself): such a restatement is refused rather than folded without them
    (docs/restatement.md, "Vacuum")."""
    if TOMBSTONES not in state.protocol.reader_features:
        return  # no tombstone ever: no vacuum purged a row
    versions = list(range(start + 1, state.version + 1))
    commits = thread_map(lambda v: commitlog.read(io, v), versions) if versions else []
    purging = [c.version for c in commits if c.operation == VACUUM and c.parameters.get("rows_purged")
               and not c.purged]
    if purging:
        raise VersionExpiredError(
            f"the batch's history from version {start} on was vacuumed at version {purging[-1]} by a vacuum that "
            "kept no record of the rows it erased, which a revert or replace must apply again, so batches made "
            "live before it can no longer be restated")


def _purged(io: FileIO, meta: TableMetadata, files: list[PurgedFile], parts: list[int],
            of_keys: pa.Table | None = None) -> pa.Table:
    """The records (keys-file rows) in the vacuums' purged ``files`` of the rows of batches ``parts``, of the keys
    ``of_keys`` (key columns; None: of every key): the fold's records. A purged file is in row-id order, a batch's
    rows a few of its row groups, the only ones read."""
    if not files:
        return datafile.keys_schema(meta).empty_table()
    firsts = pc.unique(of_keys.column(meta.primary_key[0])) if of_keys is not None else None
    tables = [_of_keys(t, of_keys) for t in _keys_rows(io, meta, [f.path for f in files], firsts, parts)]
    return pa.concat_tables(tables)  # a table a file: there is one


def _purged_rows(io: FileIO, meta: TableMetadata, files: list[PurgedFile], later: list[BatchState],
                 purged: pa.Table, rids: np.ndarray) -> np.ndarray:
    """A mask of the rows ``rids`` (packed; ``NO_ROW``: none) that the vacuums' purged ``files`` hold: those of the
    batches ``later`` (made live since the fold start) from their records ``purged`` there, the others (rows of
    entries from before the fold start) looked up by row id in the files."""
    out = order.isin(rids, rids_of(purged))
    parts = np.array(sorted(b.part for b in later), dtype=np.int64)
    older = np.unique(rids[(rids != NO_ROW) & ~order.isin(rids >> rowid.PART_SHIFT, parts)])
    if not files or not len(older):
        return out

    def held(f: PurgedFile) -> np.ndarray:  # which of ``older`` the file holds: its row ids are in order
        ids = pq.read_table(io.open_input(f.path), columns=[keystore.ROW_ID]).column(0).to_numpy()
        return order.places(ids if order.non_decreasing(ids) else np.sort(ids), older)[1] if len(ids) else \
            np.zeros(len(older), bool)

    gone = older[np.logical_or.reduce(thread_map(held, files))]
    return out | order.isin(rids, gone)


def _keys_rows(io: FileIO, meta: TableMetadata, paths: list[str], firsts: pa.Array | None = None,
               parts: list[int] | None = None) -> list[pa.Table]:
    """The rows of each of ``paths`` (keys files or vacuums' purged files): with ``parts``, those of rows of these
    batches; with ``firsts`` (values of the first key column), at least those whose first key column holds one of
    them. On local files Polars decodes the other columns only at the rows that may be kept: a vacuum's files hold
    a row for each row it erased, hundreds of thousands where a restatement of a small batch wants a few."""
    schema = datafile.keys_schema(meta)
    first = meta.primary_key[0]
    prefilter = (firsts is not None or parts is not None) and prefiltered.readable(schema) and (
        firsts is None or prefiltered.matches_exactly(schema.field(first).type))
    # A batch's row ids are one range (its part in their top bits): the read keeps exactly its rows.
    spans = {keystore.ROW_ID: _part_ranges(parts)} if parts is not None else None

    def whole(path: str) -> pa.Table:
        rows = datafile.read_keys(io, path, meta)
        return _of_parts(rows, parts) if parts is not None else rows

    return prefiltered.rows_in_files(io, paths, schema, {first: firsts} if firsts is not None else {}, spans, whole,
                                     prefilter)


def _part_ranges(parts: list[int]) -> list[tuple[int, int]]:
    """The half-open row-id ranges of the rows of batches ``parts``, consecutive parts' rows as one range (the
    batches since a fold start are mostly consecutive parts: one condition of a read, not one a batch)."""
    ranges: list[tuple[int, int]] = []
    for p in sorted(set(parts)):
        lo, hi = p << rowid.PART_SHIFT, (p + 1) << rowid.PART_SHIFT
        if ranges and ranges[-1][1] == lo:
            ranges[-1] = (ranges[-1][0], hi)
        else:
            ranges.append((lo, hi))
    return ranges


def _of_parts(records: pa.Table, parts: list[int]) -> pa.Table:
    """``records`` (keys-file rows) of rows of batches ``parts``."""
    mine = order.isin(rids_of(records) >> rowid.PART_SHIFT, np.array(sorted(parts), dtype=np.int64))
    return records.filter(pa.array(mine))


def _of_keys(rows: pa.Table, of_keys: pa.Table | None) -> pa.Table:
    """``rows`` of the keys ``of_keys`` (key columns; None: all), in their order and schema: the places a join keeps,
    taken."""
    if of_keys is None or not rows.num_rows:
        return rows
    pk = of_keys.schema.names
    if fixed_width(rows, pk) and fixed_width(of_keys, pk):  # integer-like keys: packed into one int64 and searched
        mine, theirs = ([int64_values(t.column(c)) for c in pk] for t in (rows, of_keys))
        spans = order.key_spans(mine, theirs)
        if spans is not None:
            return rows.filter(pa.array(order.isin(order.pack(mine, spans), order.pack(theirs, spans))))
    places = rows.select(pk).append_column("_place", pa.array(np.arange(rows.num_rows, dtype=np.int64)))
    kept = places.join(of_keys, keys=pk, join_type="left semi").column("_place").to_numpy()
    return rows.take(pa.array(np.sort(kept)))


def rids_of(records: pa.Table) -> np.ndarray:
    return records.column(keystore.ROW_ID).to_numpy()


def _upserts(records: pa.Table) -> np.ndarray:
    return ~records.column(keystore.DELETED).to_numpy(zero_copy_only=False)


def diff(before: np.ndarray, after: np.ndarray) -> tuple[pa.Table, dict[str, int]]:
    """The change rows between each key's row before and after (``NO_ROW``: none), in key order, and counts."""
    changed = before != after
    has_before, has_after = before != NO_ROW, after != NO_ROW
    both = changed & has_before & has_after
    only_before = changed & has_before & ~has_after
    only_after = changed & ~has_before & has_after
    # Built in place order (key i's rows at 2i and 2i + 1): each changed key's first row (a preimage, a delete or
    # an insert), then the postimage of an update.
    keys = np.flatnonzero(changed)
    update, insert = both[keys], only_after[keys]
    at = np.arange(len(keys)) + np.cumsum(update) - update
    n = len(keys) + int(update.sum())
    rids, kinds, places = np.empty(n, np.int64), np.empty(n, np.int8), np.empty(n, np.int64)
    rids[at] = np.where(insert, after[keys], before[keys])
    kinds[at] = np.where(update, 0, np.where(insert, 3, 2))
    places[at] = keys * 2 + insert
    rids[at[update] + 1], kinds[at[update] + 1], places[at[update] + 1] = after[keys[update]], 1, keys[update] * 2 + 1
    changes = pa.table({changefile.ROW_ID: rids, changefile.CHANGE_TYPE: _CHANGE_TYPES.take(pa.array(kinds)),
                        changefile.ORDER: places}, schema=changefile.SCHEMA)
    counts = {**dict.fromkeys(COUNTS, 0), "updated": int(both.sum()), "deleted": int(only_before.sum()),
              "inserted": int(only_after.sum())}
    return changes, counts


_CHANGE_TYPES = pa.array(["update_preimage", "update_postimage", "delete", "insert"], pa.string())


def valid_now(io: FileIO, state: TableState, rids: np.ndarray) -> np.ndarray:
    """A mask of the rows ``rids`` (packed) valid in ``state``."""
    out = np.zeros(len(rids), dtype=bool)
    if not len(rids):
        return out
    cache = bitmap.BitmapCache(io)
    segment = rids >> rowid.OFFSET_BITS
    for seg in np.unique(segment).tolist():
        s = state.segments.get((seg >> rowid.SEQ_BITS, seg & rowid.MAX_SEQ))
        if s is None:
            continue
        mine = segment == seg
        out[mine] = bitmap.valid_mask(cache.valid(s), rids[mine] & rowid.MAX_OFFSET)
    return out


def _files_of(state: TableState, batches: list[BatchState]) -> tuple[list[DataFile], list[KeysFile]]:
    parts = {b.part for b in batches}
    files = [f for f in state.data_files() if any(r.part in parts for r in f.segments)]
    return files, [k for b in batches for k in b.keys_files]


def _added(io: FileIO, meta: TableMetadata, new: Landed | None) -> pa.Table:
    """The records of the batch ``new`` makes live (keys-file rows): those its landing kept (a vacuum's deletes,
    a replacement of known size), else read from its files."""
    schema = datafile.keys_schema(meta)
    if new is None:
        return schema.empty_table()
    if new.rows is not None:
        return new.rows.select(schema.names).cast(schema)
    return _records(io, meta, list(new.data_files), list(new.keys_files), [new.part])


def _records(io: FileIO, meta: TableMetadata, files: list[DataFile], keys_files: list[KeysFile],
             parts: list[int], of_keys: pa.Table | None = None) -> pa.Table:
    """The records of the batches of ``parts`` (keys-file rows): upserts from the data files holding them, deletes
    from their keys files. ``of_keys`` (key columns): only the records of those keys; the upserts of other keys are
    left out before they are made keys-file rows (their delta values and buckets cost more than a join against a
    few keys)."""
    if not files and not keys_files:  # no batch made live since the fold start (a vacuum's own deletes)
        return datafile.keys_schema(meta).empty_table()
    wanted = np.unique(np.array(parts, dtype=np.int64))
    firsts = pc.unique(of_keys.column(meta.primary_key[0])) if of_keys is not None else None
    upserts, deletes = _both(lambda: _upsert_rows(io, meta, [f.path for f in files], wanted, firsts),
                             lambda: _keys_rows(io, meta, [k.path for k in keys_files], firsts))
    tables = thread_map(lambda finish: finish(),
                        [lambda t=t: datafile.keys_of(_of_keys(t, of_keys), meta) for t in upserts]
                        + [lambda t=t: _of_keys(datafile.deletes_of(t), of_keys) for t in deletes])
    return pa.concat_tables(tables).combine_chunks()  # a table a file: there is one


def _upsert_rows(io: FileIO, meta: TableMetadata, paths: list[str], parts: np.ndarray, firsts: pa.Array | None
                 ) -> list[pa.Table]:
    """The upsert columns of each of data files ``paths``' rows of batches ``parts``; with ``firsts`` (values of the
    first key column), at least those whose first key column holds one of them: on local Parquet files, Polars
    decodes the other columns only at those rows (a restatement of a small batch reads a few rows of the later
    batches' files)."""
    columns = datafile.upsert_columns(meta)
    data = datafile.data_schema(meta)
    schema = pa.schema([data.field(c) for c in columns])
    first = meta.primary_key[0]
    prefilter = firsts is not None and meta.file_format == "parquet" and prefiltered.readable(schema) \
        and prefiltered.matches_exactly(schema.field(first).type)
    values = {first: firsts, rowid.PART_COLUMN: pa.array(parts, pa.int32())} if prefilter else {}
    return prefiltered.rows_in_files(io, paths, schema, values, None,
                                     lambda path: datafile.read_data(io, path, meta, columns=columns, parts=parts),
                                     prefilter)


def _empty(state: TableState, new: Landed | None) -> Restatement:
    """A restatement of batches without a record: only their new segments (empty) change."""
    out = metagen.assemble(state, [new] if new is not None else [], [], [], [], {})
    return Restatement(out, changefile.table(), dict.fromkeys(COUNTS, 0))


def _unkeyed(io: FileIO, state: TableState, removed: int | None, new: Landed | None) -> Restatement:
    """Append-only: the removed batch's rows all become invalid (deletes), the new ones all valid (inserts)."""
    cache = bitmap.BitmapCache(io)
    gone = [bitmap.to_array(cache.valid(s)) | np.int64(rowid.segment_key(s.part, s.seq))
            for s in state.segments.values() if s.part == removed]
    return remove_rows(io, state, np.concatenate(gone) if gone else np.empty(0, np.int64), new)


def remove_rows(io: FileIO, state: TableState, rids: np.ndarray, new: Landed | None,
                paired: int = 0) -> Restatement:
    """An unkeyed table's rows ``rids`` (packed, valid now) become invalid, and ``new``'s rows valid. The first
    ``paired`` of ``rids`` are rewritten by the first ``paired`` rows ``new`` landed, in their order (an update:
    preimage and postimage change rows, ``rids[i]`` with the i-th row); the rest are deletes and inserts."""
    bitmaps = bitmap.NewBitmaps(bitmap.BitmapCache(io), state.metadata.prop("bitmap.deltas"))
    by_row = np.sort(rids)
    segment = by_row >> rowid.OFFSET_BITS
    for seg in np.unique(segment).tolist():
        s = state.segments[(seg >> rowid.SEQ_BITS, seg & rowid.MAX_SEQ)]
        holes, universe = bitmaps.cache.holes(s)
        gone = by_row[segment == seg] & rowid.MAX_OFFSET  # valid now: below the universe
        holes |= bitmap.of(gone)
        bitmaps.add(s, s.part, s.seq, holes, universe, len(gone))
    segments = [(s.with_delta if kind == "delta" else s.with_bitmap)(path, count)
                for kind, path, part, seq, count in bitmaps.write(layout.bitmap_path())
                for s in [state.segments[(part, seq)]]]
    out = metagen.unkeyed_output([new]) if new is not None else MetaGenOutput([], [], [], [], {})
    came = [np.arange(s.data_rows, dtype=np.int64) | np.int64(rowid.segment_key(s.part, s.seq)) for s in out.segments]
    after = np.sort(np.concatenate(came)) if came else np.empty(0, np.int64)
    out.segments = segments + out.segments
    assert paired <= min(len(rids), len(after)), "an update rewrites each of its rows"
    places = np.arange(paired, dtype=np.int64) * 2
    gone, came_in = np.sort(rids[paired:]), after[paired:]
    changes = changefile.table(
        (rids[:paired], "update_preimage", places), (after[:paired], "update_postimage", places + 1),
        (gone, "delete", np.arange(len(gone), dtype=np.int64) + 2 * paired),
        (came_in, "insert", np.arange(len(came_in), dtype=np.int64) + 2 * paired + len(gone)))
    counts = {**dict.fromkeys(COUNTS, 0), "updated": paired, "deleted": len(gone), "inserted": len(came_in)}
    return Restatement(out, changes, counts)
