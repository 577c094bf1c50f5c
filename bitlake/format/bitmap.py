"""Per-segment roaring bitmaps of valid offsets, and the files that hold them (docs/FORMAT.md, "Bitmaps").

A bitmap file is a Parquet file with one row per segment: ``_segment_part``, ``_segment_seq``, ``bitmap``
(the portable roaring serialization, readable by every roaring implementation), ``cardinality``, and
``complement_of``: null when ``bitmap`` holds the valid offsets, ``n`` when it holds the offsets of ``[0, n)``
that are not valid (a segment with a few holes: half the bytes of its valid offsets' runs).
"""

from __future__ import annotations

import array

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


def write_file(io: FileIO, path: str, rows: list[tuple[int, int, BitMap]]) -> int:
    """Writes bitmaps of several segments into one file; returns its size in bytes."""
    stored = [_smaller(r[2]) for r in rows]
    table = pa.table(
        {
            PART_COLUMN: pa.array([r[0] for r in rows], pa.int32()),
            SEQ_COLUMN: pa.array([r[1] for r in rows], pa.int32()),
            "bitmap": pa.array([b for b, _ in stored], pa.binary()),
            "cardinality": pa.array([len(r[2]) for r in rows], pa.int64()),
            "complement_of": pa.array([n for _, n in stored], pa.int64()),
        },
        schema=FILE_SCHEMA,
    )
    with io.open_output(path) as out:
        # No statistics nor dictionary: Parquet would repeat each small bitmap in them, several times.
        pq.write_table(table, out, compression="zstd", write_statistics=False, use_dictionary=False,
                       store_schema=False)
    return io.size(path)


def read_file(io: FileIO, path: str) -> dict[tuple[int, int], BitMap]:
    table = pq.read_table(io.open_input(path))
    parts = table.column(PART_COLUMN).to_pylist()
    seqs = table.column(SEQ_COLUMN).to_pylist()
    blobs = table.column("bitmap").to_pylist()
    universes = table.column("complement_of").to_pylist() if "complement_of" in table.column_names else [None] * len(
        blobs)
    out = {}
    for p, s, b, n in zip(parts, seqs, blobs, universes, strict=True):
        bm = deserialize(b)
        out[(p, s)] = bm if n is None else bm.flip(0, n)
    return out


class BitmapCache:
    """The valid offsets of segments; reads each bitmap file once (a reader needs many segments of one file)."""

    def __init__(self, io: FileIO):
        self.io = io
        self._files: dict[str, dict[tuple[int, int], BitMap]] = {}

    def __getstate__(self) -> dict:
        """Shipped to a task (with a read plan) empty: the task reads what it needs."""
        return {"io": self.io, "_files": {}}

    def valid(self, s: SegmentState) -> BitMap:
        """The valid offsets of segment state ``s`` (a fresh bitmap the caller may change)."""
        if s.bitmap is None:
            return BitMap(range(s.cardinality))
        return BitMap(self.file(s.bitmap)[s.segment])

    def file(self, path: str) -> dict[tuple[int, int], BitMap]:
        """The bitmaps of a bitmap file, by segment (shared: do not change them)."""
        if path not in self._files:
            self._files[path] = read_file(self.io, path)
        return self._files[path]
