"""Reading a view without Spark: the plan of :mod:`bitlake.engine.read.plan`, executed file by file with pyarrow.

:func:`batches` streams the view in bounded memory (a Parquet file is scanned batch by batch; the rows a view
drops are filtered out of each batch by their row ids); :func:`read` collects it. A condition ``where`` (a
pyarrow compute expression) is pushed down to Parquet: row groups whose statistics rule it out are skipped
(a partition column is in every file, so partitions prune the same way), and only the columns wanted and
those the condition names are decoded.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from bitlake.engine.read.plan import ReadPlan
from bitlake.errors import InvalidInputError
from bitlake.format import bitmap, datafile, rowid
from bitlake.format.commit import DataFile
from bitlake.format.metadata import deltas_as_int
from bitlake.fs import FileIO

BATCH_ROWS = 131_072


def output_schema(p: ReadPlan, columns: list[str] | None = None, include_row_ids: bool = False) -> pa.Schema:
    meta = p.state.metadata
    names = (columns if columns is not None else meta.column_names) + (
        list(rowid.ROW_ID_COLUMNS) if include_row_ids else [])
    schema = datafile.data_schema(meta)
    unknown = [c for c in names if c not in schema.names]
    if unknown:
        raise InvalidInputError(f"columns {unknown} are not in the table; it has {meta.column_names}")
    return pa.schema([schema.field(c) for c in names])


def batches(io: FileIO, p: ReadPlan, include_row_ids: bool = False, where: pc.Expression | None = None,
            columns: list[str] | None = None, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """The rows of the plan (``columns`` of them, default all), and with ``where``, those it holds true for,
    as record batches of :func:`output_schema`, one file after the other."""
    if columns == [] and not include_row_ids:  # no column, but the rows' count: batches of zero columns keep it
        yield from (rb.select([]) for rb in batches(io, p, True, where, columns, batch_rows))
        return
    meta = p.state.metadata
    schema = output_schema(p, columns, include_row_ids)
    needed = set(schema.names) | set(rowid.ROW_ID_COLUMNS) | {c for _, c, _ in p.hidden}
    if p.valid_at is not None and meta.keyed:
        needed.add(str(meta.delta_column))
    read_columns = [c for c in datafile.data_schema(meta).names if c in needed]
    filtered = {f.path for f in p.filtered}
    kept_of: dict = {}
    for f, rb in _prefetched(io, p.whole + p.filtered, meta, read_columns, where, batch_rows):
        if not rb.num_rows:
            continue
        table = pa.Table.from_batches([rb])
        if f.path in filtered:
            mask = _kept_mask(p, f, table, kept_of)
            if not mask.all():
                table = table.filter(pa.array(mask))
        if table.num_rows:
            if p.valid_at is not None and meta.keyed:
                deltas = deltas_as_int(table.column(meta.delta_column), meta.delta_type)
                table = table.filter(pa.array(deltas <= p.valid_at))
            if p.hidden:
                table = table.filter(pa.array(~p.tombstoned(table)))
        if table.num_rows:
            yield from table.select(schema.names).cast(schema).to_batches()


def read(io: FileIO, p: ReadPlan, include_row_ids: bool = False, where: pc.Expression | None = None,
         columns: list[str] | None = None) -> pa.Table:
    """:func:`batches` as one table."""
    schema = output_schema(p, columns, include_row_ids)
    return pa.Table.from_batches(list(batches(io, p, include_row_ids, where, columns)), schema=schema)


def reader(io: FileIO, p: ReadPlan, include_row_ids: bool = False, where: pc.Expression | None = None,
           columns: list[str] | None = None, batch_rows: int = BATCH_ROWS) -> pa.RecordBatchReader:
    """:func:`batches` as a ``pyarrow.RecordBatchReader`` (what DuckDB, Polars and Arrow consumers take)."""
    schema = output_schema(p, columns, include_row_ids)
    return pa.RecordBatchReader.from_batches(schema, batches(io, p, include_row_ids, where, columns, batch_rows))


def _kept_mask(p: ReadPlan, f: DataFile, table: pa.Table, kept_of: dict) -> np.ndarray:
    """Which rows of ``table`` (a batch of file ``f``) the plan keeps: a lookup of each row's offset in its
    segment's kept offsets, as a boolean array per segment."""
    part = table.column(rowid.PART_COLUMN).to_numpy()
    seq = table.column(rowid.SEQ_COLUMN).to_numpy()
    offset = table.column(rowid.OFFSET_COLUMN).to_numpy()
    segments = {(r.part, r.seq) for r in f.segments}
    one = len(segments) == 1 or (part.min() == part.max() and seq.min() == seq.max())
    keys = [(int(part[0]), int(seq[0]))] if one else sorted({(int(a), int(b)) for a, b in zip(part, seq, strict=True)})
    mask = np.zeros(table.num_rows, dtype=bool)
    for key in keys:
        kept = kept_of.get(key)
        if kept is None:
            kept_of.clear()  # a reader moves from file to file: one file's segments at a time
            kept = kept_of[key] = _kept_offsets(p, key)
        rows = slice(None) if one else (part == key[0]) & (seq == key[1])
        at = offset[rows]
        inside = at < len(kept)
        mask[rows] = inside & kept[np.where(inside, at, 0)]
    return mask


def _kept_offsets(p: ReadPlan, segment: tuple[int, int]) -> np.ndarray:
    """A boolean array over a segment's offsets: True where the plan keeps the row."""
    offsets = bitmap.to_array(p.kept(segment))
    kept = np.zeros(int(offsets.max()) + 1 if len(offsets) else 1, dtype=bool)  # never empty: index 0 is valid
    kept[offsets] = True
    return kept


def _prefetched(io: FileIO, files: list[DataFile], meta, columns: list[str], where: pc.Expression | None,
                batch_rows: int, depth: int = 4) -> Iterator[tuple[DataFile, pa.RecordBatch]]:
    """The files' batches, decoded by a background thread up to ``depth`` batches ahead (decoding releases
    the GIL, so it overlaps the row filtering of the batches before)."""
    import queue
    import threading

    out: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for f in files:
                for rb in _file_batches(io, f.path, meta, columns, where, batch_rows):
                    while not stop.is_set():
                        try:
                            out.put((f, rb), timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        return
            out.put(done)
        except BaseException as e:  # noqa: BLE001 - raised in the consumer
            out.put(e)

    worker = threading.Thread(target=produce, daemon=True, name="bitlake-read-ahead")
    worker.start()
    try:
        while True:
            item = out.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()


def _file_batches(io: FileIO, path: str, meta, columns: list[str], where: pc.Expression | None,
                  batch_rows: int) -> Iterator[pa.RecordBatch]:
    schema = datafile.data_schema(meta)
    if meta.file_format == "parquet":
        # The table's schema: a column added after the file was written reads as null (and fails ``where``).
        fragment = ds.ParquetFileFormat().make_fragment(io.open_input(path))
        yield from fragment.to_batches(schema=schema, columns=columns, filter=where, batch_size=batch_rows)
        return
    for rb in datafile.read_batches(io, path, schema, meta.file_format, None if where is not None else columns,
                                    batch_rows):
        yield from (pa.Table.from_batches([rb]).filter(where).select(columns).to_batches() if where is not None
                    else [rb])
