"""Reading a view on the driver with pyarrow: the plan of :mod:`bitlake.engine.plan`, executed file by file."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bitlake.engine.plan import ReadPlan
from bitlake.format import bitmap, datafile, rowid
from bitlake.format.metadata import deltas_as_int
from bitlake.fs import FileIO


def read(io: FileIO, p: ReadPlan, include_row_ids: bool = False, where: pc.Expression | None = None) -> pa.Table:
    """The rows of the plan (and, with ``where``, those of them it holds true for)."""
    meta = p.state.metadata
    columns = meta.column_names + (list(rowid.ROW_ID_COLUMNS) if include_row_ids else [])
    read_columns = meta.column_names + list(rowid.ROW_ID_COLUMNS)
    cache = bitmap.BitmapCache(io)
    pieces = []
    filtered = {f.path for f in p.filtered}
    for f in p.whole + p.filtered:
        table = datafile.read_data(io, f.path, meta, read_columns)
        if f.path in filtered:
            packed = rowid.pack_arrays(*(table.column(c).to_numpy() for c in rowid.ROW_ID_COLUMNS))
            kept = np.concatenate([
                bitmap.to_array(p.kept(cache, r.segment)) | np.int64(rowid.segment_key(r.part, r.seq))
                for r in f.segments
            ])
            table = table.filter(pa.array(np.isin(packed, kept)))
        if p.valid_at is not None and meta.keyed:
            deltas = deltas_as_int(table.column(meta.delta_column), meta.delta_type)
            table = table.filter(pa.array(deltas <= p.valid_at))
        if p.hidden:
            table = table.filter(pa.array(~p.tombstoned(table)))
        if where is not None:
            table = table.filter(where)
        pieces.append(table.select(columns))
    if not pieces:
        return datafile.data_schema(meta).empty_table().select(columns)
    return pa.concat_tables(pieces)
