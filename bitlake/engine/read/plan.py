"""The read planner: which rows of which data files a view keeps. Every reader (the Arrow reader on the
driver, the Spark reader) executes the same plan.

A view is a version's state and an optional event time ``valid_at``. A row of a live segment is kept iff
(docs/FORMAT.md, "Views"):

* it is valid now, i.e. in its segment's valid offsets at that version, and, for an event-time view, its
  delta value is at most ``valid_at``; or
* for an event-time view, its latest SET_VALID_UNTIL event up to that version has ``t > valid_at`` (it was
  superseded after that time: "revived") and its delta value is at most ``valid_at``.

The revived rows come from the log files that can hold an event after ``valid_at`` (their ``max_t``), so a
read of a recent time opens only the recent logs. Tombstones hide, in addition, the rows of batches made live
before them whose column holds one of their values (docs/FORMAT.md, "Tombstones").
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap

from bitlake.format import bitmap, rowid, segmentlog
from bitlake.format.commit import DataFile, SegmentState
from bitlake.format.state import TableState
from bitlake.fs import FileIO


@dataclasses.dataclass
class ReadPlan:
    """``whole``: files every row of which is valid (an event-time view still filters by delta);
    ``filtered``: files read with a row filter; ``segments``: the states of the filtered files' segments;
    ``revived``: per segment, offsets valid at ``valid_at`` though not now; ``cache``: the bitmap files read
    while planning, which readers of the plan reuse; ``hidden``: the tombstones, as (version, column, values);
    ``live_version``: the version each segment part was made live at."""

    state: TableState
    valid_at: int | None
    whole: list[DataFile]
    filtered: list[DataFile]
    segments: dict[tuple[int, int], SegmentState]
    revived: dict[tuple[int, int], np.ndarray]
    cache: bitmap.BitmapCache = dataclasses.field(repr=False, compare=False)
    hidden: list[tuple[int, str, pa.Array]] = dataclasses.field(default_factory=list)
    live_version: dict[int, int] = dataclasses.field(default_factory=dict)
    _kept_arrays: dict[tuple[int, int], np.ndarray] = dataclasses.field(default_factory=dict, repr=False,
                                                                        compare=False)

    def tombstoned(self, table: pa.Table) -> np.ndarray:
        """A mask of the rows of ``table`` (with ``_segment_part``) that a tombstone hides."""
        out = np.zeros(table.num_rows, dtype=bool)
        if not self.hidden or not table.num_rows:
            return out
        parts = table.column(rowid.PART_COLUMN).to_numpy()
        made_live = np.array([self.live_version.get(int(p), -1) for p in np.unique(parts)])
        live = made_live[np.searchsorted(np.unique(parts), parts)]
        for version, column, values in self.hidden:
            # A null value never matches (skip_nulls): a null in the values file hides no row.
            hit = pc.fill_null(pc.is_in(table.column(column), value_set=values, skip_nulls=True), False).to_numpy(
                zero_copy_only=False)
            out |= hit & (live < version)
        return out

    def kept(self, segment: tuple[int, int]) -> BitMap:
        """The offsets of ``segment`` the view keeps (before the delta filter of an event-time view)."""
        s = self.segments.get(segment)
        bm = self.cache.valid(s) if s is not None else BitMap()
        if segment in self.revived:
            bm |= bitmap.of(self.revived[segment])
        return bm

    @property
    def event_time(self) -> bool:
        """Whether the view also filters rows by their delta value (an event-time view of a keyed table)."""
        return self.valid_at is not None and self.state.metadata.keyed

    def kept_array(self, segment: tuple[int, int]) -> np.ndarray:
        """:meth:`kept` as a boolean array over the segment's offsets (True: kept), what readers look each row's
        offset up in; computed once a plan (a byte an offset, while the plan lives)."""
        kept = self._kept_arrays.get(segment)
        if kept is None:
            offsets = bitmap.to_array(self.kept(segment))
            kept = np.zeros(int(offsets.max()) + 1 if len(offsets) else 1, dtype=bool)  # never empty: 0 indexes
            kept[offsets] = True
            self._kept_arrays[segment] = kept
        return kept

    def dropped(self) -> dict[tuple[int, int], BitMap]:
        """Per segment, the offsets of the rows the filtered files hold and the view drops: for a compacted
        file the offsets it holds that are not kept (its offsets file says which), for a landed one every
        offset of its segment not kept. A filter on these reads what filtering on the kept offsets reads."""
        out: dict[tuple[int, int], BitMap] = {}
        for f in self.filtered:
            for r in f.segments:
                s = self.segments.get(r.segment)
                if s is None:
                    continue
                if f.offsets is not None:
                    drop = self.cache.file(f.offsets)[r.segment] - self.kept(r.segment)
                else:
                    drop = BitMap(range(s.offsets)) - self.kept(r.segment)
                out[r.segment] = out[r.segment] | drop if r.segment in out else drop
        return out

    def invalid_rows(self) -> int:
        """An upper bound of the rows the filter drops."""
        return sum(s.offsets - s.cardinality for s in self.segments.values())


def revived(io: FileIO, state: TableState, valid_at: int) -> dict[tuple[int, int], np.ndarray]:
    # A file whose events all end at or before valid_at brings no row back, and may be skipped, unless an older
    # event of one of its rows says otherwise: only a restatement makes such older events (in its ``resets``
    # files), or makes a row valid again without an event (a revert of the batch that ended it), so every file
    # from the first restatement on is read.
    restated = [b.restated_version for b in state.parts.values() if b.restated_version is not None]
    first_reset = min([*(f.version_range(v)[0] for v, f in state.logs if f.resets), *restated], default=None)
    files = [(v, f) for v, f in state.logs if f.max_t > valid_at or f.resets
             or (first_reset is not None and f.version_range(v)[1] >= first_reset)]
    events = segmentlog.latest_until(io, files, after=valid_at)
    ids = np.sort(events.column("_row_id").to_numpy())
    if not len(ids):
        return {}
    segment = ids >> rowid.OFFSET_BITS
    cuts = np.flatnonzero(segment[1:] != segment[:-1]) + 1
    out = {}
    for chunk in np.split(ids, cuts):
        part, seq, _ = rowid.unpack(int(chunk[0]))
        out[(part, seq)] = (chunk & rowid.MAX_OFFSET).astype(np.int64)
    return out


def _kind(cache: bitmap.BitmapCache, state: TableState, f: DataFile, r, back) -> str:
    """Whether the view keeps ``all``, ``none`` or ``some`` of the rows file ``f`` holds of segment ``r``."""
    s = state.segments.get(r.segment)
    if s is None or (s.cardinality == 0 and r.segment not in back):
        return "none"  # pending, or nothing valid
    if f.offsets is None:  # the file holds the segment's data rows (of its partition value)
        return "all" if s.cardinality >= s.data_rows and r.segment not in back else "some"
    held = cache.file(f.offsets)[r.segment]  # a compacted file: the offsets it holds, against the kept ones
    kept = cache.valid(s)
    if r.segment in back:
        kept |= bitmap.of(back[r.segment])
    return "all" if held <= kept else "none" if not held.intersection_cardinality(kept) else "some"


def plan(io: FileIO, state: TableState, valid_at: int | None = None) -> ReadPlan:
    """The plan of the view of ``state`` (current, or at event time ``valid_at``)."""
    back = revived(io, state, valid_at) if valid_at is not None and state.metadata.keyed else {}
    whole, filtered, segments = [], [], {}
    cache = bitmap.BitmapCache(io)
    for f in state.data_files():
        kinds = {_kind(cache, state, f, r, back) for r in f.segments}
        if kinds == {"none"}:
            continue
        if kinds == {"all"}:
            whole.append(f)
            continue
        filtered.append(f)
        for r in f.segments:
            if r.segment in state.segments:
                segments[r.segment] = state.segments[r.segment]
    hidden = tombstones(io, state)
    live = {b.part: b.live_version for b in state.parts.values() if b.live_version is not None} if hidden else {}
    return ReadPlan(state, valid_at, whole, filtered, segments, back, cache, hidden, live)


def tombstones(io: FileIO, state: TableState) -> list[tuple[int, str, pa.Array]]:
    """The state's tombstones as (version, column, values)."""
    return [(version, t.column, pq.read_table(io.open_input(t.path)).column(0).combine_chunks())
            for version, t in state.tombstones]
