"""Per-segment roaring bitmaps of valid offsets, and the files that hold them (docs/FORMAT.md, "Bitmaps").

A bitmap file is a Parquet file with one row per segment: ``_segment_part``, ``_segment_seq``, ``bitmap``
(the portable roaring serialization, readable by every roaring implementation), ``cardinality``, and
``complement_of``: null when ``bitmap`` holds the valid offsets, ``n`` when it holds the offsets of ``[0, n)``
that are not valid (a segment with a few holes: half the bytes of its valid offsets' runs). A segment state
may also name a file as its ``delta``: that file's row for the segment holds the offsets whose validity differs
from the state's bitmap (``complement_of`` null, ``cardinality`` their number).
"""

from __future__ import annotations

import array
import collections
import threading
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap

from bitlake.errors import CorruptTableError
from bitlake.format.commit import SegmentState
from bitlake.format.order import isin
from bitlake.format.protocol import BITMAP_DELTAS
from bitlake.format.rowid import PART_COLUMN, SEQ_COLUMN
from bitlake.fs import FileIO

FILE_SCHEMA = pa.schema(
    [
        pa.field(PART_COLUMN, pa.int32(), False),
        pa.field(SEQ_COLUMN, pa.int32(), False),
        pa.field("bitmap", pa.binary(), False),
        pa.field("cardinality", pa.int64(), False),
        pa.field("complement_of", pa.int64(), True),
    ]
)


def serialize(bm: BitMap) -> bytes:
    bm.run_optimize()
    return bm.serialize()


def deserialize(data: bytes) -> BitMap:
    return BitMap.deserialize(data)


def of(offsets) -> BitMap:
    """A bitmap of offsets; numpy arrays go through the buffer protocol (no Python loop)."""
    if isinstance(offsets, np.ndarray):
        return BitMap(array.array("I", offsets.astype(np.uint32).tobytes()))
    return BitMap(offsets)


def to_array(bm: BitMap) -> np.ndarray:
    return np.asarray(bm.to_array(), dtype=np.int64) if len(bm) else np.empty(0, np.int64)


def valid_mask(bm: BitMap, offsets: np.ndarray) -> np.ndarray:
    """A boolean mask: which of ``offsets`` are set in ``bm``."""
    if len(bm) == 0 or not len(offsets):
        return np.zeros(len(offsets), dtype=bool)
    if len(offsets) * 8 < len(bm):  # few offsets against a large bitmap: intersect first
        return isin(np.asarray(offsets, np.int64), to_array(bm & of(offsets)))
    return isin(np.asarray(offsets, np.int64), to_array(bm))


def invalid_offsets(bm: BitMap, offsets: int) -> np.ndarray:
    """Offsets in ``[0, offsets)`` that are not set in ``bm``, sorted, as int64."""
    everything = BitMap(range(offsets))
    everything.difference_update(bm)
    return to_array(everything)


def _smaller(bm: BitMap) -> tuple[bytes, int | None]:
    """``bm`` serialized as it is, or as its complement in ``[0, max + 1)`` when that is smaller."""
    valid = serialize(bm)
    if len(bm) == 0:
        return valid, None
    universe = bm.max() + 1
    holes = bm.flip(0, universe)
    if len(holes) * 2 >= len(valid):  # an array container costs two bytes an offset
        return valid, None
    complement = serialize(holes)
    return (complement, universe) if len(complement) < len(valid) else (valid, None)


class Stored(NamedTuple):
    """A segment's row of a bitmap file: its bitmap as stored, ``complement_of`` (see the module), and the size of
    the bitmap's serialization in bytes."""

    bitmap: BitMap
    complement_of: int | None
    nbytes: int

    def valid(self) -> BitMap:
        """The valid offsets (shared when stored as such: do not change them)."""
        return self.bitmap if self.complement_of is None else self.bitmap.flip(0, self.complement_of)

    def holes(self) -> tuple[BitMap, int]:
        """The offsets of ``[0, universe)`` that are not valid, and that universe, beyond which no offset is valid
        (a fresh bitmap the caller may change)."""
        if self.complement_of is not None:
            return BitMap(self.bitmap), self.complement_of
        top = self.bitmap.max() + 1 if len(self.bitmap) else 0
        return self.bitmap.flip(0, top), top


def write_holes(io: FileIO, path: str, rows: list[tuple[int, int, BitMap, int]],
                deltas: Sequence[tuple[int, int, BitMap]] = ()) -> int:
    """Writes bitmaps of several segments, each given by its holes, the offsets of ``[0, universe)`` that are not
    valid (``(part, seq, holes, universe)``), and deltas of others (``(part, seq, offsets)``: the offsets whose
    validity differs from the segment's bitmap), into one file; returns its size in bytes. A segment is stored as
    its holes (``complement_of``), or as its valid offsets when they are fewer; a delta as it is."""
    kept: dict[tuple[int, int], Stored] = {}
    cardinalities = []
    for part, seq, holes, universe in rows:
        if universe - len(holes) < len(holes):
            valid = holes.flip(0, universe)
            kept[(part, seq)] = Stored(valid, None, 0)
        else:
            kept[(part, seq)] = Stored(BitMap(holes), universe, 0)
        cardinalities.append(universe - len(holes))
    for part, seq, offsets in deltas:
        kept[(part, seq)] = Stored(offsets, None, 0)
        cardinalities.append(len(offsets))
    blobs = [serialize(st.bitmap) for st in kept.values()]
    kept = {seg: st._replace(nbytes=len(b)) for (seg, st), b in zip(kept.items(), blobs, strict=True)}
    size = _write(io, path, list(kept), blobs, cardinalities, [st.complement_of for st in kept.values()])
    _HELD.put((io.uri(), path), kept)
    return size


def write_file(io: FileIO, path: str, rows: list[tuple[int, int, BitMap]]) -> int:
    """Writes bitmaps of several segments into one file; returns its size in bytes."""
    stored = [_smaller(r[2]) for r in rows]
    return _write(io, path, [(r[0], r[1]) for r in rows], [b for b, _ in stored], [len(r[2]) for r in rows],
                  [n for _, n in stored])


def _write(io: FileIO, path: str, segments: list[tuple[int, int]], blobs: list[bytes], cardinalities: list[int],
           complements: list[int | None]) -> int:
    table = pa.table(
        {
            PART_COLUMN: pa.array([p for p, _ in segments], pa.int32()),
            SEQ_COLUMN: pa.array([s for _, s in segments], pa.int32()),
            "bitmap": pa.array(blobs, pa.binary()),
            "cardinality": pa.array(cardinalities, pa.int64()),
            "complement_of": pa.array(complements, pa.int64()),
        },
        schema=FILE_SCHEMA,
    )
    with io.open_output(path) as out:
        # No statistics nor dictionary: Parquet would repeat each small bitmap in them, several times.
        pq.write_table(table, out, compression="zstd", write_statistics=False, use_dictionary=False,
                       store_schema=False)
    return io.size(path)


class _Recent:
    """The bitmaps of the files this process wrote or read, as :func:`read_stored` gives them (shared: never
    changed), up to ``max_bytes`` of serialized bitmaps, the least recently used dropped first: a writer's next
    commit starts from the holes, and the bitmaps its deltas are to, that it wrote or read for the commit before,
    which after churn are megabytes to read back each commit (docs/benchmarks.md, "Design measurements", "Bitmaps").
    Files never change, so they stay right for as long as they are kept."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._held: collections.OrderedDict[tuple[str, str], tuple[dict, int]] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, key: tuple[str, str], stored: dict[tuple[int, int], Stored]) -> None:
        size = sum(st.nbytes for st in stored.values())
        if size > self.max_bytes:  # it would push everything else out, and itself
            return
        with self._lock:
            if key in self._held:
                self._bytes -= self._held.pop(key)[1]
            self._held[key] = (stored, size)
            self._bytes += size
            while self._held and self._bytes > self.max_bytes:
                self._bytes -= self._held.popitem(last=False)[1][1]

    def get(self, key: tuple[str, str]) -> dict[tuple[int, int], Stored] | None:
        with self._lock:
            held = self._held.get(key)
            if held is None:
                return None
            self._held.move_to_end(key)
            return held[0]


_HELD = _Recent(64 << 20)


def read_stored(io: FileIO, path: str) -> dict[tuple[int, int], Stored]:
    """The rows of a bitmap file as stored, by segment (shared with other callers: do not change them)."""
    held = _HELD.get((io.uri(), path))
    if held is not None:
        return held
    table = pq.read_table(io.open_input(path))
    parts = table.column(PART_COLUMN).to_pylist()
    seqs = table.column(SEQ_COLUMN).to_pylist()
    blobs = table.column("bitmap").to_pylist()
    universes = table.column("complement_of").to_pylist() if "complement_of" in table.column_names else [None] * len(
        blobs)
    stored = {(p, s): Stored(deserialize(b), n, len(b)) for p, s, b, n in zip(parts, seqs, blobs, universes,
                                                                              strict=True)}
    _HELD.put((io.uri(), path), stored)
    return stored


def features(segments) -> tuple[str, ...]:
    """The protocol features commits of segment states ``segments`` need."""
    return (BITMAP_DELTAS,) if any(s.delta for s in segments) else ()


class BitmapCache:
    """The valid offsets of segments; reads each bitmap file once (a reader needs many segments of one file)."""

    def __init__(self, io: FileIO):
        self.io = io
        self._files: dict[str, dict[tuple[int, int], BitMap]] = {}
        self._stored: dict[str, dict[tuple[int, int], Stored]] = {}

    def __getstate__(self) -> dict:
        """Shipped to a task (with a read plan) empty: the task reads what it needs."""
        return {"io": self.io, "_files": {}, "_stored": {}}

    def valid(self, s: SegmentState) -> BitMap:
        """The valid offsets of segment state ``s`` (a fresh bitmap the caller may change)."""
        if s.bitmap is None:
            return BitMap(range(s.cardinality))
        out = BitMap(self.file(s.bitmap)[s.segment])
        if s.delta is not None:
            out ^= self._flips(s)
        return out

    def holes(self, s: SegmentState) -> tuple[BitMap, int]:
        """The offsets of ``[0, universe)`` that are not valid in segment state ``s``, and that universe, beyond
        which no offset is valid (a fresh bitmap the caller may change). A commit changes a segment's few holes,
        not its millions of valid offsets, so working on the holes costs a fraction of working on the offsets."""
        if s.bitmap is None:
            return BitMap(), s.cardinality
        holes, universe = self.stored(s.bitmap)[s.segment].holes()
        if s.delta is not None:
            flips = self._flips(s)
            if len(flips) and flips.max() >= universe:  # offsets past the bitmap's universe that became valid
                holes.add_range(universe, flips.max() + 1)
                universe = flips.max() + 1
            holes ^= flips
        return holes, universe

    def delta(self, s: SegmentState | None, holes: BitMap, universe: int, changed: int,
              always: bool = False) -> BitMap | None:
        """For a commit that leaves the segment of state ``s`` with ``holes`` in ``[0, universe)``, having changed
        the validity of at most ``changed`` of its offsets: the offsets whose validity then differs from ``s``'s
        bitmap, when writing them is worth more than writing the segment's bitmap again; else None.

        A delta holds every change since its bitmap was written: it grows with each commit, and each commit writes
        it whole, while writing the bitmap again costs its size ``b`` once and starts the next delta empty. Writing
        the bitmap when the delta reaches ``sqrt(2 c b)`` bytes, ``c`` a commit's own change, makes the bytes of a
        run of commits the least: on average ``sqrt(2 c b)`` a commit, against ``b`` with no deltas
        (docs/benchmarks.md, "Design measurements", "Bitmaps"). A delta is never more than half its bitmap's size,
        so that reading the two costs at most 1.5x reading one. ``always``: a delta
        whatever it costs (the table property ``bitmap.deltas`` set to ``always``)."""
        if s is None or s.bitmap is None:
            return None
        base = self.stored(s.bitmap)[s.segment]
        before, top = base.holes()
        flips = before ^ holes
        if top != universe:  # offsets between the two universes are holes on the side of the smaller one
            flips.flip_inplace(min(top, universe), max(top, universe))
        if not len(flips):  # valid as in its bitmap again: that bitmap is written again, as no delta names it
            return None
        if always or self.worth(s, flips, changed):
            return flips
        return None

    def worth(self, s: SegmentState, flips: BitMap, changed: int) -> bool:
        """Whether a delta of ``flips`` to segment state ``s``'s bitmap costs less than the bitmap written again,
        for a commit that changed the validity of at most ``changed`` offsets (the rule of :meth:`delta`)."""
        nbytes = self.stored(s.bitmap)[s.segment].nbytes
        size = len(serialize(flips))
        return size * 2 <= nbytes and size * size <= 2 * _OFFSET_BYTES * max(changed, 1) * nbytes

    def ended(self, s: SegmentState, gone: BitMap) -> tuple[BitMap, int]:
        """For a commit that only ends rows of segment state ``s`` (which has a bitmap), at offsets ``gone``: the
        offsets whose validity then differs from ``s``'s bitmap, and how many are valid. Worked out from the delta
        and ``gone`` alone, where :meth:`holes` copies and changes the segment's every hole (after churn, hundreds
        of thousands for a commit's few): an offset of ``gone`` that is valid before flips."""
        base = self.stored(s.bitmap)[s.segment]
        before = self._flips(s) if s.delta is not None else BitMap()
        if base.complement_of is None:
            in_bitmap = gone & base.bitmap
        else:  # the bitmap holds the holes of [0, complement_of)
            in_bitmap = gone - base.bitmap
            if len(in_bitmap) and in_bitmap.max() >= base.complement_of:
                in_bitmap.remove_range(base.complement_of, in_bitmap.max() + 1)
        valid = in_bitmap ^ (gone & before)  # valid in the bitmap, or made valid by the delta (not both)
        return before ^ valid, s.cardinality - len(valid)

    def _flips(self, s: SegmentState) -> BitMap:
        """The offsets segment state ``s``'s delta flips (shared: do not change them)."""
        assert s.delta is not None
        row = self.stored(s.delta)[s.segment]
        if row.complement_of is not None:
            raise CorruptTableError(f"bitmap file {s.delta}: the delta of segment {s.segment} has complement_of set")
        return row.bitmap

    def stored(self, path: str) -> dict[tuple[int, int], Stored]:
        """The rows of a bitmap file as stored, by segment (shared: do not change them)."""
        if path not in self._stored:
            self._stored[path] = read_stored(self.io, path)
        return self._stored[path]

    def file(self, path: str) -> dict[tuple[int, int], BitMap]:
        """The valid offsets of a bitmap file's segments (not of a delta's rows: they are offsets to flip), by
        segment (shared: do not change them)."""
        if path not in self._files:
            self._files[path] = {seg: st.valid() for seg, st in self.stored(path).items()}
        return self._files[path]


class NewBitmaps:
    """A commit's new segment bitmaps, given by each segment's holes (or, for a segment that only loses rows, by
    the offsets it loses: :meth:`add_ended`), written into one file: none for a segment whose valid offsets are a
    prefix, a delta to its bitmap when :meth:`BitmapCache.delta` says it is worth it
    (``deltas``, the table property ``bitmap.deltas``: ``true``, ``false`` or ``always``), else its whole bitmap."""

    def __init__(self, cache: BitmapCache, deltas: str):
        self.cache, self.deltas = cache, deltas.lower()
        self._none: list[tuple[int, int, int]] = []
        self._whole: list[tuple[int, int, BitMap, int]] = []
        self._flips: list[tuple[int, int, BitMap, int]] = []

    def add(self, before: SegmentState | None, part: int, seq: int, holes: BitMap, universe: int,
            changed: int) -> None:
        """Segment ``(part, seq)``, whose state was ``before``, has ``holes`` in ``[0, universe)`` after the commit,
        which changed the validity of at most ``changed`` of its offsets."""
        count = universe - len(holes)
        if not len(holes) or holes.min() == count:  # valid offsets 0 .. count - 1
            self._none.append((part, seq, count))
        elif self.deltas != "false" and (flips := self.cache.delta(before, holes, universe, changed,
                                                                    self.deltas == "always")) is not None:
            self._flips.append((part, seq, flips, count))
        else:
            self._whole.append((part, seq, holes, universe))

    def add_ended(self, before: SegmentState, part: int, seq: int, gone: BitMap) -> bool:
        """Segment ``(part, seq)``, whose state ``before`` has a bitmap, loses the rows at offsets ``gone`` and
        gains none: its delta, if one is worth writing (:meth:`BitmapCache.ended`); False when the caller is to
        give its holes to :meth:`add` instead (a whole bitmap is due)."""
        if self.deltas == "false":
            return False
        flips, count = self.cache.ended(before, gone)
        if not len(flips) or not (self.deltas == "always" or self.cache.worth(before, flips, len(gone))):
            return False
        self._flips.append((part, seq, flips, count))
        return True

    def write(self, path: str) -> list[tuple[str, str | None, int, int, int]]:
        """Writes the bitmaps and deltas into ``path`` (when there are any); returns each segment's new state as
        ``(kind, path, part, seq, valid offsets)``, kind ``bitmap`` (path None: no file) or ``delta``."""
        out: list[tuple[str, str | None, int, int, int]] = [("bitmap", None, part, seq, count)
                                                             for part, seq, count in self._none]
        if self._whole or self._flips:
            write_holes(self.cache.io, path, self._whole, [f[:3] for f in self._flips])
            out += [("bitmap", path, part, seq, top - len(holes)) for part, seq, holes, top in self._whole]
            out += [("delta", path, part, seq, count) for part, seq, _, count in self._flips]
        return out


# What an offset costs in a bitmap whose offsets are sparse (roaring's array containers): a commit's change.
_OFFSET_BYTES = 2
