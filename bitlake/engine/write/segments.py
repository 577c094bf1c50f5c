"""The segment log and bitmaps a commit writes: its SET_VALID_UNTIL events as one log file, and the new valid
offsets of the segments they and its accepted upserts touch as one bitmap file (docs/FORMAT.md, "Segment log" and
"Bitmaps"). The inline MetaGen, the Spark MetaGen's tasks and a restatement write them here."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from bitlake.format import bitmap, layout, rowid, segmentlog
from bitlake.format.commit import SegmentState
from bitlake.format.order import non_decreasing
from bitlake.fs import FileIO

# Rows of MetaGen's event tables with this kind are the accepted upserts: they become valid, which the data
# implies, so they are never written to a log (only SET_VALID_UNTIL events are).
BECOMES_VALID = segmentlog.SET_VALID_FROM


def write_segments(io: FileIO, prior: dict[tuple[int, int], SegmentState], events: pa.Table,
                   valid: Sequence[np.ndarray] = (), deltas: str = "true",
                   valid_offsets: dict[int, BitMap] | None = None) -> list[dict]:
    """Writes the SET_VALID_UNTIL rows of ``events`` as one log file, and the new valid offsets of the
    segments the events name as one bitmap file (segments whose valid offsets are a prefix need none).

    ``events`` has the columns of :data:`segmentlog.FILE_SCHEMA`; its :data:`BECOMES_VALID` rows, and the
    packed row ids in the arrays ``valid``, are the accepted upserts (the inline MetaGen passes them as row ids
    alone, an array a group: a load's are every row). ``prior`` holds the segments' states before the commit.
    ``deltas``: the table property ``bitmap.deltas`` (whether a segment's new bitmap may be a delta to its bitmap).
    ``valid_offsets``: more accepted upserts, as the offsets of each segment (``part << SEQ_BITS | seq``) in a
    bitmap (the spilled MetaGen's: 8 bytes a row id would grow with the commit). Returns rows of
    :data:`bitlake.engine.write.metagen.SEGMENT_ARROW`: one ``log`` row, and a ``bitmap`` row per segment (path
    null: no bitmap file).
    """
    table = events.cast(segmentlog.FILE_SCHEMA)
    kinds = table.column("event").to_numpy()
    is_until = kinds == segmentlog.SET_VALID_UNTIL
    until = table if is_until.all() else table.filter(pa.array(is_until))  # the inline MetaGen's are all UNTIL

    def packed(t: pa.Table) -> np.ndarray:
        return rowid.pack_arrays(*(t.column(c).to_numpy() for c in rowid.ROW_ID_COLUMNS))

    # Sorted once, for the log file and the bitmaps (a spilled MetaGen's groups come in sorted runs, which a stable
    # sort merges), and the log file written while the bitmaps are made.
    until_ids = packed(until)
    order = None
    if not non_decreasing(until_ids):
        order = np.argsort(until_ids, kind="stable")
        until_ids = until_ids[order]
    becomes = [ids for ids in (packed(table.filter(pa.array(kinds == BECOMES_VALID))), *valid) if len(ids)]
    valid_runs = segment_runs(sorted_ids(becomes[0] if len(becomes) == 1 else np.concatenate(becomes or [_NO_IDS])))
    with ThreadPoolExecutor(1, thread_name_prefix="bitlake-log") as writer:
        log = writer.submit(segmentlog.write_file, io, layout.log_path(), until, order) if until.num_rows else None
        bitmaps = _write_bitmaps(io, prior, valid_runs, segment_runs(until_ids), valid_offsets or {}, deltas)
    f = log.result() if log is not None else None
    return ([{"kind": "log", "path": f.path, "part": None, "seq": None, "count": f.events, "bytes": f.bytes,
              "min_t": f.min_t, "max_t": f.max_t}] if f is not None else []) + bitmaps


def _write_bitmaps(io: FileIO, prior: dict[tuple[int, int], SegmentState], valid_runs: dict[int, np.ndarray],
                   until_runs: dict[int, np.ndarray], offsets_of: dict[int, BitMap], deltas: str) -> list[dict]:
    """:func:`write_segments`'s bitmap file and rows: each segment's valid offsets after its runs of row ids that
    become valid (and its ``offsets_of``) and of those superseded."""
    cache = bitmap.BitmapCache(io)
    new = bitmap.NewBitmaps(cache, deltas)
    for seg in sorted(valid_runs.keys() | until_runs.keys() | offsets_of.keys()):
        part, seq = seg >> rowid.SEQ_BITS, seg & rowid.MAX_SEQ
        before = prior.get((part, seq))
        run, gone = valid_runs.get(seg, _NO_IDS), until_runs.get(seg, _NO_IDS)
        more = offsets_of.get(seg)
        if more is not None and len(run):
            more = more | bitmap.of(run & rowid.MAX_OFFSET)
        count = len(more) if more is not None else len(run)
        top = (more.max() + 1 if count else 0) if more is not None else \
            (int(run[-1] & rowid.MAX_OFFSET) + 1 if count else 0)  # run is sorted: its last offset is its largest
        if before is None and count and top == count and not len(gone):
            # A new segment whose rows are all valid (a load): a prefix, known without a bitmap.
            new.add(None, part, seq, BitMap(), count, count)
            continue
        gone = gone & rowid.MAX_OFFSET
        if not count and before is not None and before.bitmap is not None and len(gone) and \
                new.add_ended(before, part, seq, bitmap.of(gone)):
            continue  # rows ended, none added: a delta from the commit's offsets alone
        # The segment's holes in [0, universe) change, not its valid offsets: a commit costs what it changes.
        holes, universe = cache.holes(before) if before is not None else (BitMap(), 0)
        if count:
            if top > universe:  # rows past the universe become valid: the ones between them are holes
                holes.add_range(universe, top)
                universe = top
            holes.difference_update(more if more is not None else bitmap.of(run & rowid.MAX_OFFSET))
        holes |= bitmap.of(gone[gone < universe])  # an offset past the universe is not valid already
        new.add(before, part, seq, holes, universe, count + len(gone))
    return [_bitmap_row(*r) for r in new.write(layout.bitmap_path())]


def _bitmap_row(kind: str, path: str | None, part: int, seq: int, count: int) -> dict:
    """A row of :data:`bitlake.engine.write.metagen.SEGMENT_ARROW`: segment ``(part, seq)`` has ``count`` valid
    offsets, in the bitmap (kind ``bitmap``; None: ``0 .. count - 1``) or in the delta to its bitmap (``delta``) of
    file ``path``."""
    return {"kind": kind, "path": path, "part": part, "seq": seq, "count": count, "bytes": 0, "min_t": None,
            "max_t": None}


def sorted_ids(ids: np.ndarray) -> np.ndarray:
    """``ids`` sorted (themselves when they are already)."""
    return ids if non_decreasing(ids) else np.sort(ids)


_NO_IDS = np.empty(0, np.int64)


def segment_runs(ids: np.ndarray) -> dict[int, np.ndarray]:
    """The packed row ids ``ids`` (sorted) cut by segment (``part << SEQ_BITS | seq``), by binary search: a
    segment costs one, and the ids are never copied."""
    runs: dict[int, np.ndarray] = {}
    lo = 0
    while lo < len(ids):
        seg = int(ids[lo]) >> rowid.OFFSET_BITS
        end = (seg + 1) << rowid.OFFSET_BITS  # the next segment's first id; past int64 after the last one
        hi = len(ids) if end > np.iinfo(np.int64).max else int(np.searchsorted(ids, end))
        runs[seg], lo = ids[lo:hi], hi
    return runs
