"""Row ids: ``(segment_part, segment_seq, segment_offset)``, unique in a table forever.

``segment_part`` is claimed once per landing (see :mod:`bitlake.transaction`), ``segment_seq`` is the
landing task's number within it, ``segment_offset`` the record's position within the task. A retried task
recomputes the same ids for the same input, and only the successful attempt's files are ever committed, so
ids stay unique under retries.

For joins the three parts pack into one non-negative 64-bit integer (a single-column join key is far
cheaper than a three-column one): ``part << 39 | seq << 23 | offset``. Packing preserves row-id order.
"""

from __future__ import annotations

import numpy as np

PART_COLUMN = "_segment_part"
SEQ_COLUMN = "_segment_seq"
OFFSET_COLUMN = "_segment_offset"
ROW_ID_COLUMNS = (PART_COLUMN, SEQ_COLUMN, OFFSET_COLUMN)

PART_BITS = 24
SEQ_BITS = 16
OFFSET_BITS = 23
PART_SHIFT = SEQ_BITS + OFFSET_BITS
MAX_PART = (1 << PART_BITS) - 1
MAX_SEQ = (1 << SEQ_BITS) - 1
MAX_OFFSET = (1 << OFFSET_BITS) - 1


def pack(part: int, seq: int, offset: int) -> int:
    """Packs a row id into one int64 (see the module docstring for the layout)."""
    if not (0 <= part <= MAX_PART and 0 <= seq <= MAX_SEQ and 0 <= offset <= MAX_OFFSET):
        raise ValueError(f"row id out of range: ({part}, {seq}, {offset})")
    return (part << PART_SHIFT) | (seq << OFFSET_BITS) | offset


def unpack(packed: int) -> tuple[int, int, int]:
    return packed >> PART_SHIFT, (packed >> OFFSET_BITS) & MAX_SEQ, packed & MAX_OFFSET


def segment_key(part: int, seq: int) -> int:
    """The segment's part of a packed row id: ``pack(part, seq, 0)``."""
    return pack(part, seq, 0)


def unpack_arrays(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Vectorised :func:`unpack`: int32 arrays of parts, seqs and offsets."""
    return (
        (packed >> PART_SHIFT).astype(np.int32),
        ((packed >> OFFSET_BITS) & MAX_SEQ).astype(np.int32),
        (packed & MAX_OFFSET).astype(np.int32),
    )


def pack_arrays(parts: np.ndarray, seqs: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    return (parts.astype(np.int64) << PART_SHIFT) | (seqs.astype(np.int64) << OFFSET_BITS) | offsets.astype(np.int64)
