"""Minor compaction (docs/maintenance.md): data files rewritten into files of a target size, every row kept
with its row id, so that no view, at any version or event time, and no change range reads anything else.

Which files: per partition, the files whose superseded rows are at least ``compact.invalid_fraction`` of
their rows (a file that holds superseded rows only is history, not waste) with the partition's small files, or
else the files smaller than ``compact.small_file_bytes`` merged by size tiers of at least
``compact.min_input_files`` files; never a group that would not leave fewer files than it takes (one file would
become a current and a history file).

How: the rows valid in the current view go to **current** files, the others to **history** files, so that
the current view reads the current files whole and skips the history files (time travel and the change feed
still read them). Each new file's commit entry names a bitmap file of the offsets it holds per segment; the
read planner compares those with the valid offsets (docs/FORMAT.md, "Data files"). Files of pending batches
are never taken.

The commit (``COMPACT``, built by :meth:`Prepared.commit`, committed by :func:`bitlake.maintenance.compact`)
removes the old files and adds the new ones. It conflicts only with another compaction of the same files:
then this one gives up and removes what it wrote. An ingest committing
meanwhile does not conflict, since validity is by row id, whichever file holds the row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from bitlake import faults
from bitlake.engine.maintain import cluster, window
from bitlake.format import bitmap, commitlog, datafile, layout, rowid, segmentlog
from bitlake.format import state as state_mod
from bitlake.format.commit import COMPACT, Commit, DataFile, LogFile, SegmentRows, Window
from bitlake.format.metadata import TableMetadata
from bitlake.format.order import strictly_increasing
from bitlake.format.state import TableState
from bitlake.fs import FileIO

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class CompactResult:
    """What a compaction did: its version (None: nothing worth doing, or another compaction took the files
    first), the files it replaced and wrote, and the rows it wrote as current and as history."""

    version: int | None
    removed_files: int = 0
    added_files: int = 0
    bytes_removed: int = 0
    bytes_written: int = 0
    current_rows: int = 0
    history_rows: int = 0
    purged_rows: int = 0
    log_files_removed: int = 0  # regrouped or folded into one


@dataclasses.dataclass
class FileMetrics:
    """A data file as compaction judges it: its valid rows (exact for compacted files, estimated from the
    segments' cardinality for landed ones) and why it is worth rewriting, if it is."""

    file: DataFile
    valid_rows: float
    small: bool
    wasteful: bool


def metrics(cache: bitmap.BitmapCache, state: TableState) -> list[FileMetrics]:
    """Every live data file (all its segments have a state) with its metrics; reads bitmaps, never data."""
    meta = state.metadata
    small_bytes = meta.int_prop("compact.small_file_bytes")
    fraction = meta.float_prop("compact.invalid_fraction")
    out = []
    for f in state.data_files():
        if any(r.segment not in state.segments for r in f.segments):
            continue  # a pending batch's file
        valid = 0.0
        for r in f.segments:
            s = state.segments[r.segment]
            if f.offsets is not None:
                valid += cache.file(f.offsets)[r.segment].intersection_cardinality(cache.valid(s))
            elif s.data_rows:
                valid += r.rows * min(1.0, s.cardinality / s.data_rows)
        invalid = f.rows - valid
        out.append(FileMetrics(f, valid, f.bytes < small_bytes, valid > 0 and invalid >= fraction * f.rows > 0))
    return out


def choose(files: list[FileMetrics], min_files: int, budget: int | None = None) -> list[list[FileMetrics]]:
    """The groups to rewrite, one per partition: its wasteful files, and its small files of each kind (current
    rows, history rows) tiered by size (:func:`tiered`). A compacted table is left as it is. With a ``budget``
    (bytes to rewrite at most: the upkeep after a commit) only what fits is taken, smallest first."""
    groups = []
    left = float("inf") if budget is None else budget
    for found in _by_partition(files):
        taken = []
        for m in sorted((m for m in found if m.wasteful), key=lambda m: m.file.bytes):
            if m.file.bytes > left:
                break
            taken.append(m)
            left -= m.file.bytes
        for history in (False, True):
            tier = tiered([m for m in found if m.small and not m.wasteful and (m.valid_rows == 0) == history],
                          min_files, _file_bytes, left)
            taken += tier
            left -= sum(m.file.bytes for m in tier)
        if taken:
            groups.append(taken)
    return groups


def tiered(small: list[T], min_files: int, size: Callable[[T], int], budget: float = float("inf")) -> list[T]:
    """Size-tiered merging: from the smallest file up, each file at most twice the size of those taken before
    it together (and all of them within ``budget``), when that makes at least ``min_files``. A big file is
    never rewritten to absorb a few tiny ones, so a row is rewritten about log2(table / batch) times over a
    table's life, not once per batch. ``size`` gives an item's bytes."""
    taken: list[T] = []
    total = 0
    for m in sorted(small, key=size):
        if taken and size(m) > 2 * total or total + size(m) > budget:
            break
        taken.append(m)
        total += size(m)
    return taken if len(taken) >= min_files else []


def regroupable(state: TableState) -> list[tuple[int, LogFile]]:
    """The segment-log files (other than folded ones) a minor compaction regroups: a size tier of at least
    ``compact.min_log_files`` (:func:`tiered`)."""
    logs = [(v, f) for v, f in state.logs if not f.folded]
    return tiered(logs, state.metadata.int_prop("compact.min_log_files"), lambda vf: vf[1].bytes)


def regroup(io: FileIO, taken: list[tuple[int, LogFile]]) -> LogFile:
    """One log file of the events of ``taken`` (``(listing version, file)`` pairs), sorted by row id, so the
    events of a segment that many commits wrote are read together; each event keeps its commit version in the
    new file's ``version`` column (docs/FORMAT.md, "Segment logs")."""
    pieces = []
    for v, f in taken:
        events, versions = segmentlog.read_events(io, v, f)
        pieces.append(events.append_column(segmentlog.VERSION, pa.array(versions)))
    written = segmentlog.write_file(io, layout.log_path(), pa.concat_tables(pieces))
    return dataclasses.replace(written, resets=any(f.resets for _, f in taken))


class _Output:
    """The files of one kind (current or history) of one partition: ``expected_rows`` rows split into files of
    equal size, as many as the target size needs. Sizes are measured on the row groups written (a source
    file's bytes per row misjudge the output: a file of many small batches compresses worse than their
    sorted union), so a file never passes the target by much, and a table of 1.5 targets becomes two files
    of 0.75 rather than 1 + 0.5, which a scan on two cores reads in half the time."""

    def __init__(self, io: FileIO, meta: TableMetadata, partition, target_bytes: int, expected_rows: float):
        self.io, self.meta, self.partition, self.target = io, meta, partition, target_bytes
        self.expected_rows = expected_rows
        self.done: list[DataFile] = []
        self.written: list[str] = []
        self._writer: datafile.FileWriter | None = None
        self._ids: list[np.ndarray] = []
        self._closed_rows = 0  # rows and bytes of the files closed so far: the measured bytes per row
        self._closed_bytes = 0

    def write(self, rows: pa.Table, ids: np.ndarray, bytes_per_row: float) -> None:
        if not rows.num_rows:
            return
        if self._writer is None:
            path = layout.data_file_path(layout.compacted_stem(), self.partition, self.meta.file_format)
            self.written.append(path)
            self._writer = datafile.data_writer(self.io, path, self.meta, background=True)
        self._writer.write(rows)
        self._ids.append(ids)
        if self.target >= ONE_FILE:
            return  # one file, closed by the caller
        w = self._writer
        measured_rows = self._closed_rows + w.flushed_rows
        if measured_rows:
            bytes_per_row = (self._closed_bytes + w.flushed_bytes()) / measured_rows
        total = max(self.expected_rows, self._closed_rows + w.rows) * bytes_per_row
        goal = total / max(1, -(-total // self.target))
        if w.flushed_bytes() + (w.rows - w.flushed_rows) * bytes_per_row >= goal:
            self.close()

    def buffered_bytes(self) -> int:
        return self._writer.buffered_bytes if self._writer is not None else 0

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is None:
            return
        writer, self._writer = self._writer, None
        size = writer.close()
        self._closed_rows += writer.rows
        self._closed_bytes += size
        ids = np.sort(np.concatenate(self._ids))  # the files it was fed from hold segments in any order
        self._ids = []
        segment = ids >> rowid.OFFSET_BITS
        keys, starts = np.unique(segment, return_index=True)
        rows, offsets = [], []
        for key, chunk in zip(keys.tolist(), np.split(ids, starts[1:]), strict=True):
            part, seq = key >> rowid.SEQ_BITS, key & rowid.MAX_SEQ
            rows.append(SegmentRows(part, seq, len(chunk)))
            offsets.append((part, seq, bitmap.of(chunk & rowid.MAX_OFFSET)))
        offsets_path = layout.bitmap_path()
        self.written.append(offsets_path)
        bitmap.write_file(self.io, offsets_path, offsets)
        self.done.append(DataFile(writer.path, writer.rows, size, self.partition, tuple(rows), offsets_path,
                                  writer.stats()))


def _valid(state: TableState, f: DataFile, cache: bitmap.BitmapCache, ids: np.ndarray) -> np.ndarray:
    """Which rows of file ``f`` (row ids ``ids``, ascending) are valid now."""
    valid = np.zeros(len(ids), dtype=bool)
    for r in f.segments:
        key = rowid.segment_key(r.part, r.seq)
        lo, hi = np.searchsorted(ids, [key, key + rowid.MAX_OFFSET + 1])
        valid[lo:hi] = bitmap.valid_mask(cache.valid(state.segments[r.segment]), ids[lo:hi] & rowid.MAX_OFFSET)
    return valid


Drop = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (row ids, valid now) -> rows to leave out
Progress = Callable[[int, int], None]  # (rows rewritten since the last call, total rows: given once, first)


def rewrite(io: FileIO, state: TableState, group: list[FileMetrics], target_bytes: int, cache: bitmap.BitmapCache,
            progress: Progress, drop: Drop | None = None, cluster_by: str | None = None
            ) -> tuple[list[DataFile], list[str], int, int]:
    """Writes the rows of ``group`` (one partition) into current and history files, leaving out the rows
    ``drop`` names (a major compaction's), each kind cut into ranges of column ``cluster_by`` when given
    (:mod:`bitlake.engine.maintain.cluster`); returns the new files, every path written, and the current and
    history row counts."""
    meta = state.metadata
    partition = group[0].file.partition
    expected = sum(m.valid_rows for m in group)
    kinds = [_Kind(io, meta, partition, target_bytes, expected), _Kind(io, meta, partition, target_bytes,
                                                                      sum(m.file.rows for m in group) - expected)]
    if cluster_by is not None:
        per_row = sum(m.file.bytes for m in group) / max(1, sum(m.file.rows for m in group))
        parts = [max(1, -(-int(k.expected_rows * per_row) // target_bytes)) for k in kinds]
        for k, r in zip(kinds, cluster.ranges(io, meta, [m.file for m in group], cluster_by, parts), strict=True):
            k.cut(r)
    counts = [0, 0]
    try:
        for f in sorted((m.file for m in group), key=lambda f: (f.segments[0].part, f.segments[0].seq, f.path)):
            table = datafile.read_data(io, f.path, meta)
            ids = rowid.pack_arrays(*(table.column(c).to_numpy() for c in rowid.ROW_ID_COLUMNS))
            # Outputs in row-id order (a batch's rows are then a few row groups), or in a clustering's order: a
            # landed file is in row-id order already, and a clustering sorts its rows its own way.
            by_id = None if strictly_increasing(ids) else np.argsort(ids, kind="stable")
            if by_id is not None and cluster_by is None:
                table, ids, by_id = table.take(pa.array(by_id)), ids[by_id], None
            valid = _valid(state, f, cache, ids if by_id is None else ids[by_id])
            if by_id is not None:
                valid[by_id] = valid.copy()  # back to the file's order
            per_row = f.bytes / max(1, f.rows)
            old = ~valid & ~drop(ids, valid) if drop is not None else ~valid
            for kind, mask in zip(kinds, (valid, old), strict=True):
                kind.write(table, mask, ids, per_row)
            del table
            counts[0] += int(valid.sum())
            counts[1] += int(old.sum())
            progress(f.rows, 0)
        for kind in kinds:
            kind.close()
    except BaseException:
        for path in kinds[0].written() + kinds[1].written():
            io.delete(path)
        raise
    return kinds[0].done() + kinds[1].done(), kinds[0].written() + kinds[1].written(), counts[0], counts[1]


ONE_FILE = 1 << 62  # an output's target size that makes it one file, whatever its size

# A clustering compaction's outputs flush their buffered rows once they hold this many bytes together: each
# range's writer would otherwise buffer a row group, and a partition of many ranges the whole partition.
CLUSTER_BUFFER_BYTES = 256 << 20


class _Kind:
    """The outputs of one kind of rows (current or history) of a partition: one :class:`_Output`, or one per
    range of the clustering column once :meth:`cut`."""

    def __init__(self, io: FileIO, meta: TableMetadata, partition, target_bytes: int, expected_rows: float):
        self.io, self.meta, self.partition, self.target = io, meta, partition, target_bytes
        self.expected_rows = expected_rows
        self.ranges: cluster.Ranges | None = None
        self.outputs = [_Output(io, meta, partition, target_bytes, expected_rows)]

    def cut(self, ranges: cluster.Ranges) -> None:
        self.ranges = ranges
        # A range is one file (its rows the target's worth, by the sample): two files of one range would overlap.
        self.outputs = [_Output(self.io, self.meta, self.partition, ONE_FILE, self.expected_rows / ranges.count)
                        for _ in range(ranges.count)]

    def write(self, rows: pa.Table, mask: np.ndarray, ids: np.ndarray, bytes_per_row: float) -> None:
        """Writes the rows of ``rows`` where ``mask`` holds, with their row ids (of ``ids``)."""
        if self.ranges is None:
            self.outputs[0].write(rows.filter(pa.array(mask)), ids[mask], bytes_per_row)
            return
        for i, part, part_ids in self.ranges.split(rows, ids, np.flatnonzero(mask)):
            self.outputs[i].write(part, part_ids, bytes_per_row)
        if sum(o.buffered_bytes() for o in self.outputs) > CLUSTER_BUFFER_BYTES:
            for o in self.outputs:
                o.flush()

    def close(self) -> None:
        for o in self.outputs:
            o.close()

    def done(self) -> list[DataFile]:
        return [f for o in self.outputs for f in o.done]

    def written(self) -> list[str]:
        return [p for o in self.outputs for p in o.written]


@dataclasses.dataclass
class Prepared:
    """A compaction written and not yet committed: the files it replaces and wrote, the log file it wrote
    (folded or regrouped) and the log files that replaces, the window it sets; :meth:`commit` builds its
    commit against the latest state."""

    planned_on: int  # the version it was planned on
    removed: list[DataFile]
    added: list[DataFile]
    written: list[str]
    log: LogFile | None
    unlisted: list[str]
    window: Window | None
    result: CompactResult
    replan: bool = False  # set by :meth:`commit` when the plan no longer holds and planning again may succeed

    def commit(self, latest: TableState) -> Commit | None:
        """The ``COMPACT`` commit on ``latest``, or None when another compaction took its files first, or (with
        ``replan`` set) a major one's purge no longer holds: a revert or replace committed since it was planned
        may have made valid again a row it leaves out."""
        if self.window is not None and any(b.restated_version is not None and b.restated_version > self.planned_on
                                           for b in latest.parts.values()):
            self.replan = True
            return None
        listed = {f.path for _, f in latest.logs}
        if any(f.path not in latest.files for f in self.removed) or any(p not in listed for p in self.unlisted) or (
                self.window is not None and latest.window is not None
                and latest.window.version > self.window.version):
            return None
        w = self.window
        if w is not None and w.version == self.planned_on == latest.version:
            # A window at the latest version starts at this commit, which reads the same: so the files this
            # compaction replaces are needed by no version inside it, and cleanup can release them.
            w = Window(latest.version + 1, w.watermark)
        parameters: dict[str, Any] = {"files_removed": len(self.removed), "files_added": len(self.added),
                                      "logs_removed": len(self.unlisted)}
        if self.window is not None:
            parameters.update(major=True, purged_rows=self.result.purged_rows)
        return Commit(latest.version + 1, COMPACT, commitlog.now_ms(latest.timestamp_ms), parameters=parameters,
                      add_files=tuple(self.added), remove_files=tuple(f.path for f in self.removed),
                      logs=(self.log,) if self.log else (), remove_logs=tuple(self.unlisted), window=w)


def prepare(io: FileIO, state: TableState, *, target_file_bytes: int | None = None,
            progress: Progress | None = None, dry_run: bool = False, major: bool = False,
            look_back: Any = None, budget: int | None = None, cluster_by: str | None = None
            ) -> Prepared | dict[str, Any] | None:
    """Plans a minor compaction of ``state`` (module docstring), or a major one: the window from
    ``look_back`` set, the rows no view inside it can see left out, the older log events folded
    (:mod:`bitlake.engine.maintain.window`); a minor one also regroups small log files (:func:`regroupable`); writes
    its files. ``budget`` bounds a minor compaction's input bytes (:func:`choose`). ``cluster_by``: every file
    of each partition whose files do not already hold disjoint ranges of that column is rewritten into files of
    ranges of it (:mod:`bitlake.engine.maintain.cluster`). Returns None when nothing is due; with ``dry_run``,
    only says what it would rewrite."""
    state.protocol.check_write(io.uri())
    meta = state.metadata
    target = target_file_bytes or meta.int_prop("compact.target_file_bytes")
    cache = bitmap.BitmapCache(io)
    found = metrics(cache, state)
    if cluster_by is not None:
        cluster.check_column(meta, cluster_by)
        groups = _unclustered(found, cluster_by, meta.schema.field(cluster_by).type)
    else:
        groups = choose(found, meta.int_prop("compact.min_input_files"), budget)
    purge: window.Purge | None = None
    if major:
        start = window.start(io, state, meta.prop("compact.look_back") if look_back is None else look_back)
        at_start = state if start == state.version else state_mod.load(io, start)
        purge = window.purge(io, state, at_start, window.watermark(io, state, at_start))
        groups = _with_purgeable(groups, found, purge, cache, state)
    logs = regroupable(state) if purge is None and budget is None else []  # a major compaction folds instead
    if dry_run:
        files = [m.file for g in groups for m in g]
        return {"files": len(files), "bytes": sum(f.bytes for f in files), "rows": sum(f.rows for f in files),
                "partitions": len(groups), "log_files": len(logs)}
    new_window = None if purge is None else Window(purge.start, purge.watermark)
    if not groups and not logs and (new_window is None or new_window == state.window):
        return None
    progress = progress or (lambda rows, total: None)
    progress(0, sum(m.file.rows for g in groups for m in g))  # the rows it is about to rewrite
    added: list[DataFile] = []
    written: list[str] = []
    current_rows = history_rows = 0
    log: LogFile | None = None
    unlisted: list[str] = []
    try:
        for group in groups:
            files, paths, cur, hist = rewrite(io, state, group, target, cache, progress,
                                              purge.drop if purge is not None else None, cluster_by)
            added += files
            written += paths
            current_rows += cur
            history_rows += hist
        if purge is not None:
            log, unlisted = window.fold(io, state, purge.start, purge.dropped_ids())
        elif logs:
            log, unlisted = regroup(io, logs), [f.path for _, f in logs]
        written += [log.path] if log else []
        faults.point("after_compaction_write")
    except BaseException:
        for path in written:
            io.delete(path)
        raise
    removed = [m.file for g in groups for m in g]
    purged = int(len(purge.dropped_ids())) if purge is not None else 0
    result = CompactResult(None, len(removed), len(added), sum(f.bytes for f in removed),
                           sum(f.bytes for f in added), current_rows, history_rows, purged, len(unlisted))
    return Prepared(state.version, removed, added, written, log, unlisted, new_window, result)


def _with_purgeable(groups: list[list[FileMetrics]], found: list[FileMetrics], purge: window.Purge,
                    cache: bitmap.BitmapCache, state: TableState) -> list[list[FileMetrics]]:
    """A major compaction's groups: the minor ones, and the files holding rows the window lets go, by
    partition. A compacted file's offsets say which rows it holds; a landed file is taken when it holds rows
    not valid now (it is one batch's, and the first major compaction turns it into compacted files)."""
    out: dict[tuple, list[FileMetrics]] = {_partition_key(g[0].file): list(g) for g in groups}
    taken = {m.file.path for g in groups for m in g}
    for m in found:
        f = m.file
        if f.path in taken or m.valid_rows >= f.rows:
            continue
        if f.offsets is not None:
            held = cache.file(f.offsets)
            ids = np.concatenate([bitmap.to_array(held[r.segment]) | np.int64(rowid.segment_key(r.part, r.seq))
                                  for r in f.segments])
            valid = np.concatenate([bitmap.valid_mask(cache.valid(state.segments[r.segment]),
                                                      bitmap.to_array(held[r.segment])) for r in f.segments])
            if not purge.gone(ids, valid).any():
                continue
        out.setdefault(_partition_key(f), []).append(m)
    return list(out.values())


def _unclustered(found: list[FileMetrics], column: str, t: pa.DataType) -> list[list[FileMetrics]]:
    """A clustering compaction's groups: each partition's files, unless its current files (those with a row
    valid now) and its history files each already hold disjoint ranges of ``column``."""
    return [g for g in _by_partition(found)
            if not all(cluster.clustered([m.file for m in g if (m.valid_rows == 0) == history], column, t)
                       for history in (False, True))]


def _file_bytes(m: FileMetrics) -> int:
    return m.file.bytes


def _by_partition(files: list[FileMetrics]) -> list[list[FileMetrics]]:
    """``files`` grouped by partition, in the order their partitions first appear."""
    out: dict[tuple, list[FileMetrics]] = {}
    for m in files:
        out.setdefault(_partition_key(m.file), []).append(m)
    return list(out.values())


def _partition_key(f: DataFile) -> tuple:
    return tuple(sorted((f.partition or {}).items(), key=lambda kv: kv[0]))
