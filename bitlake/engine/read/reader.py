"""Reading a view without Spark: the plan of :mod:`bitlake.engine.read.plan`, executed with pyarrow.

:func:`batches` streams the view in bounded memory (a few files read at once by threads, each a row group at a
time; the rows a view drops are filtered out of each row group by their row ids); :func:`read` collects it. A
condition ``where`` (a pyarrow compute expression) prunes files by their column statistics in the commit
(:mod:`bitlake.format.stats`), row groups by their Parquet statistics (a partition column is in every file, so
partitions prune the same way), and only the columns wanted and those the condition names are decoded.
"""

from __future__ import annotations

import collections
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from bitlake.engine.read.plan import ReadPlan
from bitlake.errors import InvalidInputError
from bitlake.format import datafile, rowid, stats
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
    as record batches of :func:`output_schema` of at most ``batch_rows`` rows, in the plan's file order."""
    for table in _tables(io, p, output_schema(p, columns, include_row_ids), where):
        yield from table.to_batches(max_chunksize=batch_rows)


def read(io: FileIO, p: ReadPlan, include_row_ids: bool = False, where: pc.Expression | None = None,
         columns: list[str] | None = None) -> pa.Table:
    """:func:`batches` as one table (a chunk per chunk a reader thread read)."""
    schema = output_schema(p, columns, include_row_ids)
    scan = _native(io, p, schema, where, BATCH_ROWS)
    if scan is not None:
        return scan.to_table()
    tables = _tables(io, p, schema, where)
    if not schema.names:  # concat_tables drops the rows of tables of no column; batches keep them
        return pa.Table.from_batches([b for t in tables for b in t.to_batches()], schema=schema)
    return pa.concat_tables([schema.empty_table(), *tables])


def _tables(io: FileIO, p: ReadPlan, schema: pa.Schema, where: pc.Expression | None) -> Iterator[pa.Table]:
    """The rows of :func:`batches`, as tables of the chunks the reader threads read. Up to :data:`READERS` files
    are read at once (decoding releases the GIL), each a chunk ahead at most; files whose column statistics rule
    ``where`` out are never opened."""
    data = datafile.data_schema(p.state.metadata)
    files = ([(f, False) for f in stats.pruned(p.whole, where, data)]
             + [(f, True) for f in stats.pruned(p.filtered, where, data)])

    def read_file(item: tuple[DataFile, bool]) -> Iterator[pa.Table]:
        f, filtered = item
        return _file_tables(io, p, f, filtered, schema, where)

    return _ordered(files, read_file)


def reader(io: FileIO, p: ReadPlan, include_row_ids: bool = False, where: pc.Expression | None = None,
           columns: list[str] | None = None, batch_rows: int = BATCH_ROWS) -> pa.RecordBatchReader:
    """:func:`batches` as a ``pyarrow.RecordBatchReader`` (what DuckDB, Polars and Arrow consumers take)."""
    schema = output_schema(p, columns, include_row_ids)
    scan = _native(io, p, schema, where, batch_rows)
    if scan is not None:
        return scan.to_reader()
    return pa.RecordBatchReader.from_batches(schema, batches(io, p, include_row_ids, where, columns, batch_rows))


def _native(io: FileIO, p: ReadPlan, schema: pa.Schema, where: pc.Expression | None, batch_rows: int
            ) -> ds.Scanner | None:
    """pyarrow's own scanner of the plan's files, when it reads what the plan keeps: every row of every file is
    kept (a compacted table, a table without updates), no tombstone or event time filters rows, and the files
    are local Parquet files. Its threads and C++ stream then serve engines (DuckDB takes its batches without
    the GIL) as they serve plain Parquet. None otherwise, and for a ``where`` pyarrow would prune by wrongly."""
    meta = p.state.metadata
    if (p.filtered or p.hidden or (p.valid_at is not None and meta.keyed) or meta.file_format != "parquet"
            or io.local_path() is None or (where is not None and not stats.prunes_safely(where))):
        return None
    data = datafile.data_schema(meta)
    files = stats.pruned(p.whole, where, data)
    dataset = ds.FileSystemDataset.from_paths([io.local_path(f.path) for f in files], schema=data,
                                              format=ds.ParquetFileFormat(), filesystem=pafs.LocalFileSystem())
    return dataset.scanner(columns=schema.names, filter=where, batch_size=batch_rows)


def _file_tables(io: FileIO, p: ReadPlan, f: DataFile, filtered: bool, schema: pa.Schema,
                 where: pc.Expression | None) -> Iterator[pa.Table]:
    """The rows of data file ``f`` the plan keeps and ``where`` holds for, as tables of ``schema``, a row group
    at a time. Only the row-id columns a filter needs are read: a file whose rows are all kept is read as
    plainly as any Parquet file."""
    meta = p.state.metadata
    needed = set(schema.names) | {c for _, c, _ in p.hidden}
    one = (f.segments[0].part, f.segments[0].seq) if len(f.segments) == 1 else None
    # A landed file that holds every offset of its one segment holds them in order (docs/FORMAT.md, "Data
    # files"): its n-th row is offset n, so a read of all its rows needs no row-id column at all.
    segment = p.segments.get(one) if one is not None else None
    positional = (filtered and segment is not None and where is None and f.offsets is None
                  and f.rows == segment.offsets)
    if filtered and not positional:  # a file of one segment needs only the offsets (its entry names the segment)
        needed |= {rowid.OFFSET_COLUMN} if one else set(rowid.ROW_ID_COLUMNS)
    if p.hidden:
        needed.add(rowid.PART_COLUMN)
    event_time = p.valid_at is not None and meta.keyed
    if event_time:
        needed.add(str(meta.delta_column))
    read_columns = [c for c in datafile.data_schema(meta).names if c in needed]
    at = 0  # the position in the file of the table's first row
    rows = _chunk_rows(f, len(read_columns), len(meta.schema) + len(rowid.ROW_ID_COLUMNS))
    for table in _row_groups(io, f.path, meta, read_columns, where, rows):
        if positional:
            mask = _positions(p.kept_array(one), at, table.num_rows)
        elif filtered:
            mask = _lookup(p.kept_array(one), table.column(rowid.OFFSET_COLUMN)) if one else kept_mask(p, table)
        at += table.num_rows
        if filtered and not mask.all():
            keep = [c for c in table.column_names if c in schema.names or c == rowid.PART_COLUMN
                    or c == meta.delta_column or any(c == h for _, h, _ in p.hidden)]
            table = _filtered(table.select(keep), pa.array(mask))
        if table.num_rows and event_time:
            deltas = deltas_as_int(table.column(meta.delta_column), meta.delta_type)
            table = _filtered(table, pa.array(deltas <= p.valid_at))
        if table.num_rows and p.hidden:
            table = _filtered(table, pa.array(~p.tombstoned(table)))
        if table.num_rows:
            table = table.select(schema.names)
            yield table.cast(schema) if schema.names else table  # cast drops a table of no column's rows


def kept_mask(p: ReadPlan, table: pa.Table) -> np.ndarray:
    """Which rows of ``table`` (rows of data files, with their row-id columns) the plan keeps: each row's offset
    looked up in its segment's kept offsets (:meth:`ReadPlan.kept_array`)."""
    part = table.column(rowid.PART_COLUMN).to_numpy()
    seq = table.column(rowid.SEQ_COLUMN).to_numpy()
    offset = table.column(rowid.OFFSET_COLUMN).to_numpy()
    if not len(part):
        return np.zeros(0, dtype=bool)
    if part.min() == part.max() and seq.min() == seq.max():
        return _lookup(p.kept_array((int(part[0]), int(seq[0]))), offset)
    mask = np.zeros(len(part), dtype=bool)
    keys = np.unique((part.astype(np.int64) << 32) | seq)
    for key in keys.tolist():
        rows = (part == key >> 32) & (seq == key & 0xFFFFFFFF)
        mask[rows] = _lookup(p.kept_array((key >> 32, key & 0xFFFFFFFF)), offset[rows])
    return mask


def _filtered(table: pa.Table, mask: pa.Array) -> pa.Table:
    """The rows of ``table`` where ``mask`` is true, filtered column by column (faster than ``Table.filter``,
    which converts the table to batches first); a table of no column keeps its count of rows."""
    if not table.num_columns:
        return pa.table({"n": pa.nulls(table.num_rows)}).filter(mask).select([])
    return pa.Table.from_arrays([_no_validity(c).filter(mask) for c in table.columns], schema=table.schema)


def _no_validity(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """``column`` without the validity bitmaps of its chunks that hold no null (the Parquet reader allocates one
    for every nullable column), which halves the cost of filtering a chunk of numbers."""
    if (column.null_count or pa.types.is_nested(column.type) or pa.types.is_dictionary(column.type)
            or isinstance(column.type, pa.BaseExtensionType)):
        return column
    return pa.chunked_array([pa.Array.from_buffers(c.type, len(c), [None, *c.buffers()[1:]], 0, c.offset)
                             if c.buffers()[0] is not None else c for c in column.chunks], column.type)


def _positions(kept: np.ndarray, start: int, n: int) -> np.ndarray:
    """``kept[start:start + n]``, False past its end."""
    mask = kept[start:start + n]
    return mask if len(mask) == n else np.concatenate([mask, np.zeros(n - len(mask), dtype=bool)])


def _lookup(kept: np.ndarray, offsets: Any) -> np.ndarray:
    """``kept[offsets]``, False for an offset past its end (a row the plan's bitmaps do not reach)."""
    if not isinstance(offsets, np.ndarray):
        offsets = offsets.to_numpy()
    if not len(offsets) or offsets.max() < len(kept):
        return kept[offsets]
    inside = offsets < len(kept)
    return inside & kept[np.where(inside, offsets, 0)]


READERS = max(2, min(4, os.cpu_count() or 2))


def _ordered(items: list, produce: Callable[[Any], Iterator[pa.Table]], workers: int | None = None,
             depth: int = 1) -> Iterator[pa.Table]:
    """The tables ``produce(item)`` yields for each item, in the items' order, up to ``workers`` items produced
    at once by threads, each at most ``depth`` tables ahead of the reader: memory stays bounded by
    ``workers * (depth + 1)`` tables (row groups) however many files a view has."""
    if not items:
        return
    stop = threading.Event()
    done = object()

    def put(out: queue.Queue, value: Any) -> bool:
        """Hands ``value`` to the reader; False once the reader is gone (the thread then ends, never blocks)."""
        while not stop.is_set():
            try:
                out.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run(item: Any, out: queue.Queue) -> None:
        try:
            for table in produce(item):
                if not put(out, table):
                    return
            put(out, done)
        except BaseException as e:  # noqa: BLE001 - raised in the reader
            put(out, e)

    running: collections.deque[queue.Queue] = collections.deque()
    pending = iter(items)

    def start_next() -> None:
        item = next(pending, done)
        if item is not done:
            out: queue.Queue = queue.Queue(maxsize=depth)
            threading.Thread(target=run, args=(item, out), daemon=True, name="bitlake-read").start()
            running.append(out)

    try:
        for _ in range(workers or READERS):
            start_next()
        while running:
            table = running[0].get()
            if table is done:
                running.popleft()
                start_next()
            elif isinstance(table, BaseException):
                raise table
            else:
                yield table
    finally:
        stop.set()


CHUNK_BYTES = 32 << 20  # a reader thread's chunk of a file, in Arrow bytes (an estimate)


def _chunk_rows(f: DataFile, read: int, stored: int) -> int:
    """How many rows of ``f`` a reader takes at once: about :data:`CHUNK_BYTES` of the ``read`` columns of its
    ``stored`` ones (estimated from the file's size, as four times its stored bytes), at least 65,536 rows (a
    chunk pays a fixed cost in Python), at most a row group."""
    per_row = 4 * f.bytes / max(1, f.rows) * max(1, read) / max(1, stored)
    return int(min(datafile.ROW_GROUP_ROWS, max(65_536, CHUNK_BYTES / max(per_row, 1e-9))))


def _row_groups(io: FileIO, path: str, meta, columns: list[str], where: pc.Expression | None,
                rows: int = datafile.ROW_GROUP_ROWS) -> Iterator[pa.Table]:
    """``columns`` of a data file's rows where ``where`` holds, ``rows`` at a time (a Parquet scan reads one
    such chunk ahead at most; an ORC file comes a stripe at a time)."""
    schema = datafile.data_schema(meta)
    if meta.file_format == "parquet" and where is not None and not stats.prunes_safely(where):
        # Filtered after the read, not pushed into the scan (which would prune row groups by their bounds).
        for table in _row_groups(io, path, meta, schema.names, None, rows):
            yield table.filter(where).select(columns)
        return
    if meta.file_format == "parquet":
        # The table's schema: a column added after the file was written reads as null (and fails ``where``).
        fragment = ds.ParquetFileFormat().make_fragment(io.open_input(path))
        for rb in fragment.to_batches(schema=schema, columns=columns, filter=where,
                                      batch_size=rows, batch_readahead=1):
            yield pa.Table.from_batches([rb])
        return
    for rb in datafile.read_batches(io, path, schema, meta.file_format, None if where is not None else columns,
                                    rows):
        table = pa.Table.from_batches([rb])
        yield table.filter(where).select(columns) if where is not None else table
