"""Per-segment roaring bitmaps of valid offsets, and the files that hold them.

A bitmap file is a Parquet file with one row per segment: ``_segment_part``, ``_segment_seq``,
``bitmap`` (the portable roaring serialization, readable by every roaring implementation),
``cardinality``. One MetaGen task writes one file for all the segments it updated.
"""

from __future__ import annotations

import array
import os
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap

from bitlake.rowid import PART_COLUMN, SEQ_COLUMN

FILE_SCHEMA = pa.schema(
    [
        pa.field(PART_COLUMN, pa.int32(), False),
        pa.field(SEQ_COLUMN, pa.int32(), False),
        pa.field("bitmap", pa.binary(), False),
        pa.field("cardinality", pa.int64(), False),
    ]
)


def serialize(bm: BitMap) -> bytes:
    bm.run_optimize()
    return bm.serialize()


def deserialize(data: bytes) -> BitMap:
    return BitMap.deserialize(data)


def of(offsets: Iterable[int] | np.ndarray) -> BitMap:
    """A bitmap of offsets; numpy arrays go through the buffer protocol (no Python loop)."""
    if isinstance(offsets, np.ndarray):
        return BitMap(array.array("I", offsets.astype(np.uint32).tobytes()))
    return BitMap(offsets)


def apply_events(base: BitMap | None, valid_from, valid_until) -> BitMap:
    """The bitmap after one commit's events: ``(base | from) - until``.

    A row gets SET_VALID_FROM once, when it is accepted, and SET_VALID_UNTIL at most once, when a
    later record supersedes it, so within one commit the order of the two kinds does not matter.
    """
    bm = of(valid_from)
    if base is not None:
        bm |= base
    bm.difference_update(of(valid_until))
    return bm


def invalid_offsets(bm: BitMap | None, offsets: int) -> np.ndarray:
    """Offsets in ``[0, offsets)`` that are not valid, as a sorted uint32 array."""
    everything = BitMap(range(offsets))
    if bm is not None:
        everything.difference_update(bm)
    return np.asarray(everything.to_array(), dtype=np.uint32) if len(everything) else np.empty(0, np.uint32)


def valid_mask(bm: BitMap | None, offsets: np.ndarray) -> np.ndarray:
    """A boolean mask: which of ``offsets`` are set in ``bm``."""
    if bm is None or len(bm) == 0:
        return np.zeros(len(offsets), dtype=bool)
    return np.isin(offsets, np.asarray(bm.to_array(), dtype=np.int64))


def write_file(path: str, rows: list[tuple[int, int, BitMap]]) -> int:
    """Writes bitmaps of several segments into one file; returns its size in bytes."""
    table = pa.table(
        {
            PART_COLUMN: pa.array([r[0] for r in rows], pa.int32()),
            SEQ_COLUMN: pa.array([r[1] for r in rows], pa.int32()),
            "bitmap": pa.array([serialize(r[2]) for r in rows], pa.binary()),
            "cardinality": pa.array([len(r[2]) for r in rows], pa.int64()),
        },
        schema=FILE_SCHEMA,
    )
    pq.write_table(table, path, compression="zstd")
    return os.path.getsize(path)


def read_file(path: str) -> dict[tuple[int, int], BitMap]:
    table = pq.read_table(path)
    parts = table.column(PART_COLUMN).to_pylist()
    seqs = table.column(SEQ_COLUMN).to_pylist()
    blobs = table.column("bitmap").to_pylist()
    return {(p, s): deserialize(b) for p, s, b in zip(parts, seqs, blobs, strict=True)}


class BitmapCache:
    """Reads bitmap files once each; a reader usually needs many segments from one file."""

    def __init__(self, resolve):
        self._resolve = resolve
        self._files: dict[str, dict[tuple[int, int], BitMap]] = {}

    def get(self, path: str | None, part: int, seq: int) -> BitMap | None:
        if path is None:
            return None
        if path not in self._files:
            self._files[path] = read_file(self._resolve(path))
        return self._files[path][(part, seq)]

