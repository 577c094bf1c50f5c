"""Row ids: ``(segment_part, segment_seq, segment_offset)``, unique in a table forever.

``segment_part`` is claimed once per landing job from the table (see :mod:`bitlake.fs` claims),
``segment_seq`` is the Spark task's partition index within that job, ``segment_offset`` the row's
position within the task. A retried task recomputes the same ids for the same input partition, and
only the successful attempt's files are ever committed, so ids stay unique under retries.

For joins the three parts pack into one non-negative 64-bit integer (a single-column join key is far
cheaper in Spark than a three-column one): ``part << 39 | seq << 23 | offset``.
"""

from __future__ import annotations

PART_COLUMN = "_segment_part"
SEQ_COLUMN = "_segment_seq"
OFFSET_COLUMN = "_segment_offset"
ROW_ID_COLUMNS = (PART_COLUMN, SEQ_COLUMN, OFFSET_COLUMN)

PART_BITS = 24
SEQ_BITS = 16
OFFSET_BITS = 23
MAX_PART = (1 << PART_BITS) - 1
MAX_SEQ = (1 << SEQ_BITS) - 1
MAX_OFFSET = (1 << OFFSET_BITS) - 1


def pack(part: int, seq: int, offset: int) -> int:
    """Packs a row id into one int64 (see the module docstring for the layout)."""
    if not (0 <= part <= MAX_PART and 0 <= seq <= MAX_SEQ and 0 <= offset <= MAX_OFFSET):
        raise ValueError(f"row id out of range: ({part}, {seq}, {offset})")
    return (part << (SEQ_BITS + OFFSET_BITS)) | (seq << OFFSET_BITS) | offset


def unpack(packed: int) -> tuple[int, int, int]:
    return (
        packed >> (SEQ_BITS + OFFSET_BITS),
        (packed >> OFFSET_BITS) & MAX_SEQ,
        packed & MAX_OFFSET,
    )


def segment_key(part: int, seq: int) -> int:
    """The segment's part of a packed row id: ``pack(part, seq, 0)``."""
    return pack(part, seq, 0)


def spark_packed(prefix: str = ""):
    """A Spark Column computing the packed row id from the three row-id columns."""
    from pyspark.sql import functions as F

    return (
        F.shiftleft(F.col(prefix + PART_COLUMN).cast("long"), SEQ_BITS + OFFSET_BITS)
        .bitwiseOR(F.shiftleft(F.col(prefix + SEQ_COLUMN).cast("long"), OFFSET_BITS))
        .bitwiseOR(F.col(prefix + OFFSET_COLUMN).cast("long"))
    )
