"""The retention window of a major compaction (docs/maintenance.md): where it starts, its watermark, which
superseded rows no view inside it can see, and the segment-log events it folds.

The window keeps every version from its start ``W`` and every event time from its **watermark** ``M``, the
largest delta value committed by version ``W``. A row no view inside it can see is one that is not valid now
and either never had a SET_VALID_UNTIL event (a stale row, or one superseded in the commit that landed it) or
whose latest event was committed at or before ``W`` with an event time at or below ``M``: a view at a version
``v >= W`` and a time ``t >= M`` (or now) sees the same latest event, and ``t < u <= M`` never holds.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bitlake.engine.read import timetravel
from bitlake.errors import InvalidInputError, VersionNotFoundError
from bitlake.format import bitmap, datafile, keystore, layout, order, rowid, segmentlog
from bitlake.format.commit import LogFile
from bitlake.format.metadata import AGE, deltas_as_int
from bitlake.format.state import TableState
from bitlake.fs import FileIO

NO_WATERMARK = -(1 << 63)  # nothing committed yet: every event time is inside the window
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def start(io: FileIO, state: TableState, look_back: Any) -> int:
    """The version a ``look_back`` names: a version (int), an age (``"7d"``, ``"12h"``, ``"30m"``, ``"90s"``:
    the latest version committed at least that long ago), or a commit time (datetime or ISO string: the
    latest version committed at or before it). Never before the table's current window."""
    current = state.window.version if state.window else 0
    if isinstance(look_back, bool) or look_back is None:
        raise InvalidInputError(f"look_back must be a version, an age such as '7d' or a time, not {look_back!r}")
    if isinstance(look_back, str) and look_back.strip().isdigit():  # a version, as a property holds it
        look_back = int(look_back)
    if isinstance(look_back, int):
        if not 0 <= look_back <= state.version:
            raise InvalidInputError(f"look_back version {look_back} is not one of the table's 0 to {state.version}")
        return max(look_back, current)
    as_of = look_back
    if isinstance(look_back, str) and AGE.match(look_back.strip()):
        ms = dt.datetime.now(dt.UTC).timestamp() * 1000 - age_ms(look_back)
        as_of = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    try:
        v = timetravel.resolve_version(io, state.version, as_of=as_of)
    except VersionNotFoundError:  # every version is younger: the window cannot start yet
        v = 0
    return max(v, current)


def age_ms(text: str) -> float:
    """An age (``"7d"``, ``"12h"``, ``"30m"``, ``"90s"``) in milliseconds."""
    age = AGE.match(text.strip())
    if not age:
        raise InvalidInputError(f"{text!r} is not an age such as '7d', '12h', '30m' or '90s'")
    return float(age.group(1)) * _UNIT_MS[age.group(2)]


def watermark(io: FileIO, state: TableState, at: TableState) -> int | None:
    """The largest delta value committed by the version of ``at`` (records of the batches live in it), read
    from the data and keys files of ``state`` (the latest); None for an unkeyed table."""
    meta = state.metadata
    if not meta.keyed:
        return None
    best = state.window.watermark if state.window and state.window.watermark is not None else NO_WATERMARK
    # Batches live by the previous window's start are within its watermark (and their keys files may be gone).
    after = state.window.version if state.window else -1
    batches = [b for b in at.parts.values() if b.live_version is not None and b.live_version > after]
    parts = np.array(sorted(b.part for b in batches), dtype=np.int64)
    for f in state.data_files():
        if not np.isin([r.part for r in f.segments], parts).any():
            continue
        t = datafile.read_data(io, f.path, meta, [str(meta.delta_column), rowid.PART_COLUMN])
        mine = order.isin(t.column(rowid.PART_COLUMN).to_numpy(), parts)
        if mine.any():
            best = max(best, int(deltas_as_int(t.column(str(meta.delta_column)), meta.delta_type)[mine].max()))
    for kf in (kf for b in batches for kf in b.keys_files):
        deletes = datafile.read_deletes(io, kf.path, meta)
        if deletes.num_rows:
            best = max(best, int(pc.max(deletes.column(keystore.DELTA)).as_py()))
    for _, pf in state.purged:  # the records of the rows vacuums erased
        purged = datafile.read_keys(io, pf.path, meta)
        mine = order.isin(purged.column(keystore.ROW_ID).to_numpy() >> rowid.PART_SHIFT, parts)
        if mine.any():
            best = max(best, int(purged.column(keystore.DELTA).to_numpy()[mine].max()))
    return best


@dataclasses.dataclass
class Purge:
    """Which rows of a major compaction's window no view can see; ``dropped`` collects the ids it drops.
    Rows of batches made live after the window's start are kept whatever their validity: a revert of a batch
    inside the window may make a stale one accepted (docs/restatement.md)."""

    start: int
    watermark: int | None
    rid: np.ndarray  # rows with a SET_VALID_UNTIL event, sorted; their latest event's version and time
    version: np.ndarray
    t: np.ndarray
    recent: np.ndarray  # the segment parts made live after ``start``, sorted
    # An unkeyed table's rows leave the view by their bitmaps alone (a revert, a delete), with no log event to
    # date it: the state at ``start``, whose valid rows a view or change range inside the window still reads.
    at_start: TableState | None = None
    cache: bitmap.BitmapCache | None = None
    dropped: list[np.ndarray] = dataclasses.field(default_factory=list)

    def gone(self, ids: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """A mask of the rows ``ids`` (with their validity now) that no view inside the window can see."""
        old = ~order.isin(ids >> rowid.PART_SHIFT, self.recent)
        if self.at_start is not None:
            return ~valid & old & ~self._valid_at_start(ids)
        if not len(self.rid):
            return ~valid & old
        pos, has = order.places(self.rid, ids)
        mark = NO_WATERMARK if self.watermark is None else self.watermark
        late = (self.version[pos] > self.start) | (self.t[pos] > mark)
        return ~valid & ~(has & late) & old

    def _valid_at_start(self, ids: np.ndarray) -> np.ndarray:
        assert self.at_start is not None and self.cache is not None
        out = np.zeros(len(ids), dtype=bool)
        segment = ids >> rowid.OFFSET_BITS
        for seg in np.unique(segment).tolist():
            s = self.at_start.segments.get((seg >> rowid.SEQ_BITS, seg & rowid.MAX_SEQ))
            if s is not None:
                mine = segment == seg
                out[mine] = bitmap.valid_mask(self.cache.valid(s), ids[mine] & rowid.MAX_OFFSET)
        return out

    def drop(self, ids: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """:meth:`gone`, remembering the rows it drops (their log events are folded away)."""
        out = self.gone(ids, valid)
        self.dropped.append(ids[out])
        return out

    def dropped_ids(self) -> np.ndarray:
        return np.sort(np.concatenate(self.dropped)) if self.dropped else np.empty(0, np.int64)


def purge(io: FileIO, state: TableState, at_start: TableState, mark: int | None) -> Purge:
    """What the window starting at the version of ``at_start`` (the state then) lets a major compaction purge."""
    start_version = at_start.version
    events = segmentlog.latest_until(io, state.logs, with_version=True)
    recent = np.array(sorted(b.part for b in state.parts.values()
                             if b.live_version is not None and b.live_version > start_version), dtype=np.int64)
    unkeyed = not state.metadata.keyed
    return Purge(start_version, mark, events.column("_row_id").to_numpy(), events.column("version").to_numpy(),
                 events.column("t").to_numpy(), recent, at_start if unkeyed else None,
                 bitmap.BitmapCache(io) if unkeyed else None)


def fold(io: FileIO, state: TableState, start_version: int, dropped: np.ndarray
         ) -> tuple[LogFile | None, list[str]]:
    """Folds the log files whose events all are of versions at or before the window's start into one
    ``folded`` file: each row's latest event among them, with its version, without the rows dropped. (A row
    with a later event elsewhere keeps its folded one: the versions still order them, and no change range
    inside the window reads a folded file.) Returns the new file (None: no event is left) and the files it
    replaces."""
    old = [(v, f) for v, f in state.logs if f.version_range(v)[1] <= start_version]
    if not old:
        return None, []
    pieces = []
    for v, f in old:
        e, versions = segmentlog.read_events(io, v, f)
        pieces.append(e.append_column(segmentlog.VERSION, pa.array(versions)))
    events = pa.concat_tables(pieces)
    rid = segmentlog.row_ids(events)
    pick = order.latest(rid, events.column(segmentlog.VERSION).to_numpy())
    pick = pick[~order.isin(rid[pick], dropped)]
    replaced = [f.path for _, f in old]
    if not len(pick):
        return None, replaced
    written = segmentlog.write_file(io, layout.log_path(), events.take(pa.array(pick)))
    return dataclasses.replace(written, folded=True, resets=any(f.resets for _, f in old)), replaced
