"""Segment logs: the append-only validity events, in Parquet files shared by many segments.

One row per event; within a file, one row group per event kind (UNTIL first, so that a read of one kind
skips the other by the row groups' statistics), each sorted by segment and offset:

* ``_segment_part``, ``_segment_seq``, ``_segment_offset``: the row the event is about;
* ``event``: :data:`SET_VALID_FROM` or :data:`SET_VALID_UNTIL`;
* ``t``: the delta value of the record that caused the event, as int64 (see ``schema.delta_to_int``);
* ``cause``: the packed row id of that record (the row itself for SET_VALID_FROM). An update is the
  pair of events sharing one cause; a delete is an UNTIL whose cause is a delete record;
* ``batch_index``: the position, among the batches the commit made visible, of the cause's batch.

Which commit an event belongs to is recorded by the commit that lists the file, not in the file.
"""

from __future__ import annotations

import pyarrow as pa

from bitlake.rowid import OFFSET_COLUMN, PART_COLUMN, SEQ_COLUMN

SET_VALID_FROM = 1
SET_VALID_UNTIL = 2

FILE_SCHEMA = pa.schema(
    [
        pa.field(PART_COLUMN, pa.int32(), False),
        pa.field(SEQ_COLUMN, pa.int32(), False),
        pa.field(OFFSET_COLUMN, pa.int32(), False),
        pa.field("event", pa.int8(), False),
        pa.field("t", pa.int64(), False),
        pa.field("cause", pa.int64(), False),
        pa.field("batch_index", pa.int32(), False),
    ]
)

FILE_SCHEMA_DDL = (
    "_segment_part int, _segment_seq int, _segment_offset int, event byte, t long, cause long, batch_index int"
)
