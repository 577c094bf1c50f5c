"""Per-segment roaring bitmaps of valid offsets, and the files that hold them (docs/FORMAT.md, "Bitmaps").

A bitmap file is a Parquet file with one row per segment: ``_segment_part``, ``_segment_seq``, ``bitmap``
(the portable roaring serialization, readable by every roaring implementation), ``cardinality``, and
``complement_of``: null when ``bitmap`` holds the valid offsets, ``n`` when it holds the offsets of ``[0, n)``
that are not valid (a segment with a few holes: half the bytes of its valid offsets' runs).
"""

from __future__ import annotations

import array
import collections
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap

from bitlake.format.commit import SegmentState
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


def is_prefix(bm: BitMap) -> bool:
    """Whether the valid offsets are exactly ``0 .. len - 1``: then the segment needs no bitmap file."""
    return len(bm) == 0 or (bm.min() == 0 and bm.max() == len(bm) - 1)


def to_array(bm: BitMap) -> np.ndarray:
    return np.asarray(bm.to_array(), dtype=np.int64) if len(bm) else np.empty(0, np.int64)


def valid_mask(bm: BitMap, offsets: np.ndarray) -> np.ndarray:
    """A boolean mask: which of ``offsets`` are set in ``bm``."""
    if len(bm) == 0 or not len(offsets):
        return np.zeros(len(offsets), dtype=bool)
    if len(offsets) * 8 < len(bm):  # few offsets against a large bitmap: intersect first
        return np.isin(offsets, to_array(bm & of(offsets)))
    return np.isin(offsets, to_array(bm))


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


def write_holes(io: FileIO, path: str, rows: list[tuple[int, int, BitMap, int]]) -> int:
    """Writes bitmaps of several segments, each given by its holes, the offsets of ``[0, universe)`` that are not
    valid (``(part, seq, holes, universe)``), into one file; returns its size in bytes. A segment is stored as
    its holes (``complement_of``), or as its valid offsets when they are fewer."""
    stored: list[tuple[bytes, int | None]] = []
    kept: dict[tuple[int, int], tuple[BitMap, int | None]] = {}
    for part, seq, holes, universe in rows:
        if universe - len(holes) < len(holes):
            valid = holes.flip(0, universe)
            stored.append((serialize(valid), None))
            kept[(part, seq)] = (valid, None)
        else:
            stored.append((serialize(holes), universe))
            kept[(part, seq)] = (BitMap(holes), universe)
    size = _write(io, path, rows, stored, [universe - len(holes) for _, _, holes, universe in rows])
    _WRITTEN.put((io.uri(), path), kept)
    return size


def write_file(io: FileIO, path: str, rows: list[tuple[int, int, BitMap]]) -> int:
    """Writes bitmaps of several segments into one file; returns its size in bytes."""
    return _write(io, path, rows, [_smaller(r[2]) for r in rows], [len(r[2]) for r in rows])


def _write(io: FileIO, path: str, rows: list, stored: list[tuple[bytes, int | None]], cardinalities: list[int]
           ) -> int:
    table = pa.table(
        {
            PART_COLUMN: pa.array([r[0] for r in rows], pa.int32()),
            SEQ_COLUMN: pa.array([r[1] for r in rows], pa.int32()),
            "bitmap": pa.array([b for b, _ in stored], pa.binary()),
            "cardinality": pa.array(cardinalities, pa.int64()),
            "complement_of": pa.array([n for _, n in stored], pa.int64()),
        },
        schema=FILE_SCHEMA,
    )
    with io.open_output(path) as out:
        # No statistics nor dictionary: Parquet would repeat each small bitmap in them, several times.
        pq.write_table(table, out, compression="zstd", write_statistics=False, use_dictionary=False,
                       store_schema=False)
    return io.size(path)


class _Recent:
    """The bitmaps of the last few files this process wrote, as :func:`read_stored` gives them (shared: never
    changed): a writer's next commit starts from the segments' holes its last one wrote, which after churn are
    megabytes to read back (TPC-H SF 10 after a 10 % batch: 3.7 MB a commit, 15 ms). Files never change, so they
    stay right for as long as they are kept."""

    def __init__(self, files: int):
        self.files = files
        self._held: collections.OrderedDict[tuple[str, str], dict] = collections.OrderedDict()
        self._lock = threading.Lock()

    def put(self, key: tuple[str, str], stored: dict) -> None:
        with self._lock:
            self._held[key] = stored
            while len(self._held) > self.files:
                self._held.popitem(last=False)

    def get(self, key: tuple[str, str]) -> dict | None:
        with self._lock:
            return self._held.get(key)


_WRITTEN = _Recent(4)


def read_stored(io: FileIO, path: str) -> dict[tuple[int, int], tuple[BitMap, int | None]]:
    """The bitmaps of a file as stored, by segment: the valid offsets and None, or the holes and their universe
    (shared with other callers: do not change them)."""
    written = _WRITTEN.get((io.uri(), path))
    if written is not None:
        return written
    table = pq.read_table(io.open_input(path))
    parts = table.column(PART_COLUMN).to_pylist()
    seqs = table.column(SEQ_COLUMN).to_pylist()
    blobs = table.column("bitmap").to_pylist()
    universes = table.column("complement_of").to_pylist() if "complement_of" in table.column_names else [None] * len(
        blobs)
    return {(p, s): (deserialize(b), n) for p, s, b, n in zip(parts, seqs, blobs, universes, strict=True)}


def read_file(io: FileIO, path: str) -> dict[tuple[int, int], BitMap]:
    """The valid offsets of the segments of a bitmap file."""
    return {seg: bm if n is None else bm.flip(0, n) for seg, (bm, n) in read_stored(io, path).items()}


class BitmapCache:
    """The valid offsets of segments; reads each bitmap file once (a reader needs many segments of one file)."""

    def __init__(self, io: FileIO):
        self.io = io
        self._files: dict[str, dict[tuple[int, int], BitMap]] = {}
        self._stored: dict[str, dict[tuple[int, int], tuple[BitMap, int | None]]] = {}

    def __getstate__(self) -> dict:
        """Shipped to a task (with a read plan) empty: the task reads what it needs."""
        return {"io": self.io, "_files": {}, "_stored": {}}

    def valid(self, s: SegmentState) -> BitMap:
        """The valid offsets of segment state ``s`` (a fresh bitmap the caller may change)."""
        if s.bitmap is None:
            return BitMap(range(s.cardinality))
        return BitMap(self.file(s.bitmap)[s.segment])

    def holes(self, s: SegmentState) -> tuple[BitMap, int]:
        """The offsets of ``[0, universe)`` that are not valid in segment state ``s``, and that universe, beyond
        which no offset is valid (a fresh bitmap the caller may change). A commit changes a segment's few holes,
        not its millions of valid offsets: 10x less work on an 8M-row segment with 90,000 holes."""
        if s.bitmap is None:
            return BitMap(), s.cardinality
        if s.bitmap not in self._stored:
            self._stored[s.bitmap] = read_stored(self.io, s.bitmap)
        bm, universe = self._stored[s.bitmap][s.segment]
        if universe is not None:
            return BitMap(bm), universe
        top = bm.max() + 1 if len(bm) else 0
        return bm.flip(0, top), top

    def file(self, path: str) -> dict[tuple[int, int], BitMap]:
        """The bitmaps of a bitmap file, by segment (shared: do not change them)."""
        if path not in self._files:
            self._files[path] = read_file(self.io, path)
        return self._files[path]
