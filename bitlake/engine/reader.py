"""Reading a view on the driver with pyarrow: the plan of :mod:`bitlake.engine.plan`, executed file by file."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bitlake.engine.plan import ReadPlan
from bitlake.format import bitmap, datafile, rowid
from bitlake.format.metadata import deltas_as_int
from bitlake.fs import FileIO


def read(io: FileIO, p: ReadPlan, include_row_ids: bool = False, where: pc.Expression | None = None,
         columns: list[str] | None = None) -> pa.Table:
    """The rows of the plan (``columns`` of them, default all), and with ``where``, those it holds true for:
    then a Parquet file is read with the condition pushed down (row groups skipped by their statistics, only
    the columns wanted and those the condition names decoded)."""
    meta = p.state.metadata
    columns = (columns if columns is not None else meta.column_names) + (
        list(rowid.ROW_ID_COLUMNS) if include_row_ids else [])
    needed = set(columns) | set(rowid.ROW_ID_COLUMNS) | {c for _, c, _ in p.hidden}
    if p.valid_at is not None and meta.keyed:
        needed.add(str(meta.delta_column))
    read_columns = [c for c in datafile.data_schema(meta).names if c in needed]
    cache = bitmap.BitmapCache(io)
    pieces = []
    filtered = {f.path for f in p.filtered}
    for f in p.whole + p.filtered:
        table = _read(io, f.path, meta, read_columns, where)
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
        pieces.append(table.select(columns))
    if not pieces:
        return datafile.data_schema(meta).empty_table().select(columns)
    return pa.concat_tables(pieces)


def _read(io: FileIO, path: str, meta, columns: list[str], where: pc.Expression | None) -> pa.Table:
    if where is not None and meta.file_format == "parquet":
        try:  # a file written before a column the condition names was added falls back below
            table = pq.read_table(io.open_input(path), columns=columns, filters=where)
            return table.cast(pa.schema([datafile.data_schema(meta).field(c) for c in columns]))
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError):
            pass
    table = datafile.read_data(io, path, meta)
    if where is not None:
        table = table.filter(where)
    return table.select(columns)
