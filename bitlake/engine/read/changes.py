"""The change feed's planner: every accepted record committed in a version range, as rows with
``_change_type``, ``_commit_version`` and ``_commit_timestamp`` (Delta's change-data-feed names;
docs/semantics.md, "Changes"). The Spark reader (:mod:`bitlake.spark.changes`) and the Arrow one below
execute the same :class:`ChangePlan`.

It is read from what the range's commits added, never from a diff of two views (docs/FORMAT.md, "Change
feed"). For a keyed table:

* the rows of the batches a commit made live are its new records; a new row is accepted unless it is stale,
  i.e. unless it is invalid in the segment state its commit wrote without a SET_VALID_UNTIL event of that
  commit (a row superseded in its own commit was accepted first);
* an accepted new row that is the cause of a SET_VALID_UNTIL event of its commit is an ``update_postimage``,
  any other an ``insert``;
* the target of a SET_VALID_UNTIL event is an ``update_preimage`` when the event's cause is one of those new
  rows, a ``delete`` when it is a delete record;
* a restatement commit (one with change files: a revert, a replace, a vacuum, an unkeyed table's delete or
  update) has its change rows in its change files instead: none of the above applies to it.

Only the range's log files, the data files of its batches and the data files of the segments its events
name are read: the cost follows the change. Rows come out in commit order, then batch, delta value and cause
(:data:`SORT_KEYS`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bitlake.engine.read.plan import ReadPlan
from bitlake.format import bitmap, changefile, datafile, order, rowid, segmentlog
from bitlake.format.commit import Commit, DataFile
from bitlake.format.metadata import deltas_as_int
from bitlake.format.state import BatchState, TableState
from bitlake.fs import FileIO
from bitlake.pool import thread_map

CHANGE_TYPES = ("insert", "update_preimage", "update_postimage", "delete")
# Within one (commit, batch, delta value, cause): the old row before the new one.
ORDER = {"update_preimage": 0, "delete": 0, "insert": 1, "update_postimage": 1}
SORT_KEYS = ["_commit_version", "batch_index", "t", "cause", "_order"]
# The change columns of the rows a plan names by row id (``ChangePlan.wanted``).
WANTED_SCHEMA = pa.schema([("_target", pa.int64()), ("_change_type", pa.string()), ("_commit_version", pa.int64()),
                           ("batch_index", pa.int32()), ("t", pa.int64()), ("cause", pa.int64())])


@dataclasses.dataclass
class ChangePlan:
    """What a change range reads.

    ``new_files`` hold the new rows of the batches ``live`` (part -> batch) made live; their change rows
    exclude ``stale`` row ids and are ``update_postimage`` when their row id is in ``causes``, ``insert``
    otherwise (each with the batch's ``version_of`` and ``index_of``, its delta value as ``t`` and its row
    id as ``cause``). ``wanted`` names old rows by row id with their change columns; ``target_files`` hold
    them. ``carried`` are change rows with their values (a vacuum's deletes: no data file holds them)."""

    state: TableState
    start: int
    end: int
    types: list[str]
    timestamps: dict[int, int]
    live: dict[int, BatchState]
    index_of: dict[int, int]
    new_files: list[DataFile]
    stale: np.ndarray
    causes: np.ndarray
    wanted: pa.Table
    target_files: list[DataFile]
    carried: list[pa.Table]

    @property
    def version_of(self) -> dict[int, int]:
        return {p: int(b.live_version) for p, b in self.live.items() if b.live_version is not None}

    def rows(self) -> int:
        """An upper bound of the change rows (the executors pick a plan by it)."""
        return (sum(b.records for b in self.live.values()) + self.wanted.num_rows
                + sum(t.num_rows for t in self.carried))


def plan(io: FileIO, state: TableState, start: int, end: int, commits: dict[int, Commit],
         change_types: list[str] | None = None) -> ChangePlan:
    """The plan of commits ``(start, end]``; ``state`` is the state at ``end``; ``commits`` holds each commit
    of the range."""
    meta = state.metadata
    types = list(change_types or CHANGE_TYPES)
    restated = {v for v, c in commits.items() if c.change_files}
    live = {b.part: b for b in state.parts.values() if b.live_version is not None and start < b.live_version <= end
            and b.live_version not in restated}
    # A batch's index among the batches its commit made live, in the order they were applied.
    index_of = {}
    for v in sorted({b.live_version for b in live.values() if b.live_version is not None}):
        of_commit = sorted((b for b in live.values() if b.live_version == v), key=lambda b: (b.landed_version, b.part))
        index_of.update({b.part: i for i, b in enumerate(of_commit)})
    # A compacted file may hold rows of other batches beside the range's: those are dropped by part.
    new_files = [f for f in state.data_files() if any(r.part in live for r in f.segments)]
    if not {"insert", "update_postimage"} & set(types) and meta.keyed or not meta.keyed and "insert" not in types:
        new_files = []
    stale = causes = np.empty(0, np.int64)
    wanted = [WANTED_SCHEMA.empty_table()]
    if meta.keyed:
        events = _events(io, state.logs, start, end)
        if restated:
            events = events.filter(pa.array(~np.isin(events.column("_commit_version").to_numpy(), sorted(restated))))
        causes = np.unique(events.column("cause").to_numpy())
        if new_files:
            stale = _stale(io, state, commits, live, new_files, events)
        if events.num_rows and {"update_preimage", "delete"} & set(types):
            wanted.append(_preimages(io, live, events))
    more, carried = _restated(io, state, commits, restated)
    wanted += more
    rows = pa.concat_tables(wanted)
    rows = rows.filter(pc.is_in(rows.column("_change_type"), pa.array(types, pa.string())))
    segments = {(s >> rowid.SEQ_BITS, s & rowid.MAX_SEQ)
                for s in np.unique(rows.column("_target").to_numpy() >> rowid.OFFSET_BITS).tolist()}
    target_files = [f for f in state.data_files() if any(r.segment in segments for r in f.segments)]
    carried = [c.filter(pc.is_in(c.column("_change_type"), pa.array(types, pa.string()))) for c in carried]
    return ChangePlan(state, start, end, types, {v: c.timestamp_ms for v, c in commits.items()}, live, index_of,
                      new_files, stale, causes, rows, target_files, [c for c in carried if c.num_rows])


def _events(io: FileIO, logs, start: int, end: int) -> pa.Table:
    """The SET_VALID_UNTIL events of commits ``(start, end]`` in the ``(listing version, file)`` pairs, read
    on the driver: packed target, t, cause, batch index, version. A folded log (major compaction) holds events
    of versions up to the window's start, which no range reaches; a regrouped one, events of several commits."""
    pieces = []
    for listed, f in logs:
        first, last = f.version_range(listed)
        if f.folded or last <= start or first > end:
            continue
        e, versions = segmentlog.read_events(io, listed, f)
        keep = (versions > start) & (versions <= end)
        if not keep.all():
            e, versions = e.filter(pa.array(keep)), versions[keep]
        pieces.append(pa.table({
            "_target": segmentlog.row_ids(e), "t": e.column("t"), "cause": e.column("cause"),
            "batch_index": e.column("batch_index"), "_commit_version": pa.array(versions),
        }))
    if not pieces:
        return pa.table({"_target": pa.array([], pa.int64()), "t": pa.array([], pa.int64()),
                         "cause": pa.array([], pa.int64()), "batch_index": pa.array([], pa.int32()),
                         "_commit_version": pa.array([], pa.int64())})
    return pa.concat_tables(pieces)


def _stale(io: FileIO, state: TableState, commits: dict[int, Commit], live: dict, new_files: list,
           events: pa.Table) -> np.ndarray:
    """Row ids of new rows that were stale: invalid in the segment state their own commit wrote, and not
    superseded in that commit."""
    targets = events.column("_target").to_numpy()
    of_own = _of_own_commit(events, live)
    new_segments = {r.segment for f in new_files for r in f.segments if r.part in live}
    own = _own_segments(state, commits, live, new_segments)
    p = ReadPlan(state, None, [], [], own, {}, bitmap.BitmapCache(io))
    stale = [
        np.setdiff1d(bitmap.invalid_offsets(p.kept(k), s.offsets) | np.int64(rowid.segment_key(*k)),
                     targets[of_own])
        for k, s in p.segments.items()
    ]
    return np.concatenate(stale) if stale else np.empty(0, np.int64)


def _of_own_commit(events: pa.Table, live: dict) -> np.ndarray:
    """A mask of the events committed with the batch of the row they end (a row superseded in its own commit)."""
    if not events.num_rows or not live:
        return np.zeros(events.num_rows, dtype=bool)
    parts = np.array(sorted(live), dtype=np.int64)
    versions = np.array([live[p].live_version for p in parts.tolist()], dtype=np.int64)
    target_part = events.column("_target").to_numpy() >> rowid.PART_SHIFT
    pos, hit = order.places(parts, target_part)
    return hit & (versions[pos] == events.column("_commit_version").to_numpy())


def _own_segments(state: TableState, commits: dict[int, Commit], live: dict, segments: set) -> dict:
    """The states of ``segments`` as the commits that made their batches live wrote them (a later restatement
    may have changed them since); the state's where a commit does not list one (a translated v1 commit)."""
    out = {}
    for v in sorted({live[k[0]].live_version for k in segments}):
        out.update({s.segment: s for s in commits[v].segments if s.segment in segments
                    and live[s.part].live_version == v})
    return {k: out.get(k) or state.segments[k] for k in segments if k in out or k in state.segments}


def _preimages(io: FileIO, live: dict, events: pa.Table) -> pa.Table:
    """The events' targets as change rows: a delete when the event's cause is a delete record (in the keys
    files of the batches the range made live, a few bytes a record), else an update's preimage. A delete's
    ``cause`` is its place in input order (the keys file's positions): the feed's order, acceptance order, when
    the deletes were numbered in key order."""
    found = thread_map(lambda path: datafile.delete_positions(io, path),
                       [f.path for b in live.values() for f in b.keys_files])
    rids = np.concatenate([r for r, _ in found]) if found else np.empty(0, np.int64)
    positions = np.concatenate([p for _, p in found]) if found else np.empty(0, np.int64)
    by_rid = np.argsort(rids)
    rids, positions = rids[by_rid], positions[by_rid]
    causes = events.column("cause").to_numpy().copy()
    at = np.searchsorted(rids, causes)
    is_delete = at < len(rids)
    is_delete[is_delete] = rids[at[is_delete]] == causes[is_delete]
    causes[is_delete] = positions[at[is_delete]]
    kinds = pa.array(np.where(is_delete, "delete", "update_preimage"), pa.string())
    events = events.set_column(events.schema.get_field_index("cause"), "cause", pa.array(causes, pa.int64()))
    return events.append_column("_change_type", kinds).select(WANTED_SCHEMA.names).cast(WANTED_SCHEMA)


def _restated(io: FileIO, state: TableState, commits: dict[int, Commit], restated: set[int]
              ) -> tuple[list[pa.Table], list[pa.Table]]:
    """The change rows of restatement commits, from their change files: those naming rows by id, and those
    carrying their values (rows no data file holds: a vacuum's deletes)."""
    meta = state.metadata
    wanted, carried = [], []
    schema = pa.schema([*(meta.schema.field(c) for c in meta.column_names),
                        *(f for f in WANTED_SCHEMA if f.name != "_target")])
    for v in sorted(restated):
        for f in commits[v].change_files:
            rows = changefile.read(io, f)
            n = rows.num_rows
            change = {"_change_type": rows.column(changefile.CHANGE_TYPE),
                      "_commit_version": pa.array(np.full(n, v, np.int64)),
                      "batch_index": pa.array(np.zeros(n, np.int32)), "t": rows.column(changefile.ORDER),
                      "cause": pa.array(np.zeros(n, np.int64))}
            if changefile.carries_values(rows):
                columns = {c: rows.column(c) if c in rows.column_names else pa.nulls(n, meta.schema.field(c).type)
                           for c in meta.column_names}
                carried.append(pa.table({**columns, **change}).cast(schema))
            else:
                wanted.append(pa.table({"_target": rows.column(changefile.ROW_ID), **change}).cast(WANTED_SCHEMA))
    return wanted, carried


# ----------------------------------------------------------------------------------- the Arrow executor


def read_arrow(io: FileIO, p: ChangePlan) -> pa.Table:
    """The plan's change rows as one Arrow table, sorted, with ``_commit_timestamp``; no Spark. The files are read
    on threads, a file each; each keeps only its change rows."""
    meta = p.state.metadata
    columns = meta.column_names
    targets = _Targets.of(p)
    jobs = [functools.partial(_new_rows, io, p, f) for f in p.new_files]
    jobs += [functools.partial(_old_rows, io, p, targets, f) for f in p.target_files] if targets else []
    pieces = [*(t for found in thread_map(lambda job: job(), jobs) for t in found), *p.carried]
    schema = pa.schema([*(meta.schema.field(c) for c in columns), *(f for f in WANTED_SCHEMA if f.name != "_target")])
    rows = pa.Table.from_batches([], schema) if not pieces else pa.concat_tables([t.cast(schema) for t in pieces])
    ranks = np.array([ORDER[k] for k in rows.column("_change_type").to_pylist()], np.int8)
    rows = rows.append_column("_order", pa.array(ranks)).sort_by([(k, "ascending") for k in SORT_KEYS])
    versions = rows.column("_commit_version").to_numpy()
    stamps = np.array([p.timestamps[int(v)] for v in versions], np.int64) * 1000
    return rows.select([*columns, "_change_type", "_commit_version"]).append_column(
        "_commit_timestamp", pa.array(stamps, pa.timestamp("us", tz="UTC")))


def _scan(io: FileIO, p: ChangePlan, f: DataFile) -> Iterator[pa.Table]:
    meta = p.state.metadata
    for rb in datafile.read_batches(io, f.path, datafile.data_schema(meta), meta.file_format):
        table = pa.Table.from_batches([rb])
        yield table.append_column("_rid", pa.array(
            rowid.pack_arrays(*(table.column(c).to_numpy() for c in rowid.ROW_ID_COLUMNS))))


def _new_rows(io: FileIO, p: ChangePlan, f: DataFile) -> list[pa.Table]:
    """The change rows of the rows file ``f`` holds that the plan's commits made valid."""
    meta = p.state.metadata
    version_of, index_of = p.version_of, p.index_of
    found = []
    for table in _scan(io, p, f):
        parts = table.column(rowid.PART_COLUMN).to_numpy()
        rid = table.column("_rid").to_numpy()
        keep = np.isin(parts, list(p.live)) & ~order.isin(rid, p.stale)
        table, parts, rid = table.filter(pa.array(keep)), parts[keep], rid[keep]
        if not table.num_rows:
            continue
        n = table.num_rows
        if meta.keyed:
            kinds = np.where(order.isin(rid, p.causes), "update_postimage", "insert")
            t = deltas_as_int(table.column(meta.delta_column), meta.delta_type)
        else:
            kinds, t = np.full(n, "insert"), np.zeros(n, np.int64)
        out = pa.table({
            **{c: table.column(c) for c in meta.column_names}, "_change_type": pa.array(kinds, pa.string()),
            "_commit_version": pa.array([version_of[int(x)] for x in parts], pa.int64()),
            "batch_index": pa.array([index_of[int(x)] for x in parts], pa.int32()),
            "t": pa.array(t, pa.int64()), "cause": pa.array(rid)})
        found.append(out.filter(pc.is_in(out.column("_change_type"), pa.array(p.types, pa.string()))))
    return found


@dataclasses.dataclass
class _Targets:
    """The rows the plan's change rows start from (``wanted``), sorted by row id once for every file's search."""

    order: np.ndarray
    sorted: np.ndarray
    change: pa.Table

    @staticmethod
    def of(p: ChangePlan) -> _Targets | None:
        if not p.wanted.num_rows:
            return None
        targets = p.wanted.column("_target").to_numpy()
        by_target = np.argsort(targets, kind="stable")
        return _Targets(by_target, targets[by_target], p.wanted.drop_columns(["_target"]))


def _old_rows(io: FileIO, p: ChangePlan, targets: _Targets, f: DataFile) -> list[pa.Table]:
    """The change rows that start from rows file ``f`` holds (their values taken from it)."""
    found = []
    for table in _scan(io, p, f):
        rid = table.column("_rid").to_numpy()
        lo = np.searchsorted(targets.sorted, rid, "left")
        counts = np.searchsorted(targets.sorted, rid, "right") - lo
        if not counts.any():
            continue
        # A row may be named more than once (ended in one commit, brought back and ended again in a later one).
        rows = np.repeat(np.arange(len(rid)), counts)
        named = targets.order[np.concatenate([np.arange(a, b) for a, b in zip(lo[counts > 0], lo[counts > 0] +
                                                                             counts[counts > 0], strict=True)])]
        values = table.select(p.state.metadata.column_names).take(pa.array(rows))
        found.append(pa.Table.from_arrays([*values.columns, *targets.change.take(pa.array(named)).columns],
                                          names=[*values.column_names, *targets.change.column_names]))
    return found
