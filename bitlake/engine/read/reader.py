"""Reading a view without Spark: the plan of :mod:`bitlake.engine.read.plan`, executed with pyarrow.

:func:`batches` streams the view in bounded memory (pyarrow's dataset scanner reads a few files at once through
the table's FileIO, a chunk at a time; the rows a view drops are filtered out of each chunk by position or by
their row ids); :func:`read` collects it. A
condition ``where`` (a pyarrow compute expression) prunes files by their column statistics in the commit
(:mod:`bitlake.format.stats`), row groups by their Parquet statistics (a partition column is in every file, so
partitions prune the same way), and only the columns wanted and those the condition names are decoded. String
columns every file scanned holds dictionary-encoded throughout (the statistics' ``dictionary`` hint) are decoded as
dictionaries and cast to strings by the scanner.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from bitlake.engine.read import prefiltered
from bitlake.engine.read.plan import ReadPlan
from bitlake.errors import InvalidInputError
from bitlake.format import datafile, rowid, stats
from bitlake.format.commit import DataFile
from bitlake.format.metadata import deltas_as_int
from bitlake.fs import FileIO, calls_python

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
    """:func:`batches` as one table (a chunk per chunk the scanner read)."""
    schema = output_schema(p, columns, include_row_ids)
    scan = _native(io, p, schema, where, BATCH_ROWS)
    if scan is not None:
        return scan.to_table()
    tables = _tables(io, p, schema, where)
    if not schema.names:  # concat_tables drops the rows of tables of no column; batches keep them
        return pa.Table.from_batches([b for t in tables for b in t.to_batches()], schema=schema)
    return pa.concat_tables([schema.empty_table(), *tables])


def _tables(io: FileIO, p: ReadPlan, schema: pa.Schema, where: pc.Expression | None) -> Iterator[pa.Table]:
    """The rows of :func:`batches`, as tables of the chunks :func:`_chunks` reads; files whose column statistics
    rule ``where`` out are never opened. Each chunk is filtered here by the plan."""
    meta = p.state.metadata
    data = datafile.data_schema(meta)
    files = ([(f, False) for f in stats.pruned(p.whole, where, data)]
             + [(f, True) for f in stats.pruned(p.filtered, where, data)])
    if not files:
        return
    ways = {f.path: _Way.of(p, f, filtered, where is not None) for f, filtered in files}
    needed = set(schema.names) | {c for _, c, _ in p.hidden} | {c for w in ways.values() for c in w.ids}
    if p.hidden:
        needed.add(rowid.PART_COLUMN)
    if p.event_time:
        needed.add(str(meta.delta_column))
    at: dict[str, int] = {}  # each file's position of its next chunk's first row
    for path, table in _chunks(io, meta, [f for f, _ in files], needed, where):
        way = ways[path]
        start = at.get(way.path, 0)
        at[way.path] = start + table.num_rows
        table = _kept(p, way, table, start, schema)
        if table.num_rows:
            yield table


def _chunks(io: FileIO, meta, files: list[DataFile], needed: set[str], where: pc.Expression | None
            ) -> Iterator[tuple[str, pa.Table]]:
    """(path, chunk) of the rows of ``files`` (in order) where ``where`` holds, with at least the columns
    ``needed``. With a condition Polars translates (:func:`_wide`), Polars reads a file at a time, decoding only
    the rows its predicate keeps, and ``where`` is applied here; otherwise pyarrow's scanner reads up to
    :data:`READERS` files at once, each a chunk ahead at most, by pyarrow's threads (through the table's FileIO)."""
    data = datafile.data_schema(meta)
    wide = _wide(io, meta, files, data, where)
    if wide is not None:
        paths, translated = wide
        columns = [c for c in data.names if c in needed or c in translated.names]
        for i, table in prefiltered.chunks(paths, pa.schema([data.field(c) for c in columns]), translated.predicate,
                                           BATCH_ROWS):
            yield files[i].path, table.filter(where)
        return
    # A filter pyarrow would prune row groups by wrongly is applied here, after the read of every column.
    late = where is not None and not stats.prunes_safely(where)
    columns = data.names if late else [c for c in data.names if c in needed]
    for tagged in _scanner(io, meta, files, columns, None if late else where).scan_batches():
        table = pa.Table.from_batches([tagged.record_batch])
        yield tagged.fragment.path, table.filter(where) if late else table


def _wide(io: FileIO, meta, files: list[DataFile], data: pa.Schema, where: pc.Expression | None
          ) -> tuple[list[str], prefiltered.Translated] | None:
    """The Polars read of ``files`` for condition ``where`` (their local paths, the predicate), when they are local
    Parquet files of types Polars reads back and part of ``where`` translates; None otherwise (pyarrow's scanner
    reads them)."""
    if where is None or meta.file_format != "parquet" or not prefiltered.readable(data):
        return None
    paths = [io.local_path(f.path) for f in files]
    if any(p is None for p in paths):
        return None
    translated = prefiltered.predicate(where, data)
    return None if translated is None else (paths, translated)  # type: ignore[return-value]


def reader(io: FileIO, p: ReadPlan, include_row_ids: bool = False, where: pc.Expression | None = None,
           columns: list[str] | None = None, batch_rows: int = BATCH_ROWS) -> pa.RecordBatchReader:
    """:func:`batches` as a ``pyarrow.RecordBatchReader`` (what DuckDB, Polars and Arrow consumers take)."""
    schema = output_schema(p, columns, include_row_ids)
    scan = _native(io, p, schema, where, batch_rows)
    if scan is not None and not calls_python(io.arrow_filesystem()):
        return scan.to_reader()  # a C++ stream: DuckDB and Polars take its batches without the GIL
    if scan is not None:  # to_reader would start it holding the GIL its threads wait for: a deadlock
        return pa.RecordBatchReader.from_batches(scan.projected_schema, scan.to_batches())
    return pa.RecordBatchReader.from_batches(schema, batches(io, p, include_row_ids, where, columns, batch_rows))


def _native(io: FileIO, p: ReadPlan, schema: pa.Schema, where: pc.Expression | None, batch_rows: int
            ) -> ds.Scanner | None:
    """pyarrow's own scanner of the plan's files, when it reads what the plan keeps: every row of every file is
    kept (a compacted table, a table without updates) and no tombstone or event time filters rows. Its C++
    stream then serves engines (DuckDB takes its batches without the GIL) as it serves plain Parquet. None
    otherwise, for a ``where`` pyarrow would prune by wrongly, and for one Polars reads with (:func:`_wide`)."""
    meta = p.state.metadata
    if p.filtered or p.hidden or p.event_time or (where is not None and not stats.prunes_safely(where)):
        return None
    files = stats.pruned(p.whole, where, datafile.data_schema(meta))
    if _wide(io, meta, files, datafile.data_schema(meta), where) is not None:
        return None  # Polars decodes fewer rows
    return _scanner(io, meta, files, schema.names, where, batch_rows)


@dataclasses.dataclass(frozen=True)
class _Way:
    """How the rows of one data file are filtered by the plan: not at all (every row kept), by position, by the
    offsets of its one segment, or by its row ids; ``ids``: the row-id columns that needs."""

    path: str
    filtered: bool
    segment: tuple[int, int] | None  # the file's one segment
    positional: bool

    @classmethod
    def of(cls, p: ReadPlan, f: DataFile, filtered: bool, where: bool) -> _Way:
        one = (f.segments[0].part, f.segments[0].seq) if len(f.segments) == 1 else None
        state = p.segments.get(one) if one is not None else None
        # A landed file that holds every offset of its one segment holds them in order (docs/FORMAT.md, "Data
        # files"): its n-th row is offset n, so a read of all its rows (no ``where``) needs no row-id column.
        positional = filtered and state is not None and not where and f.offsets is None and f.rows == state.offsets
        return cls(f.path, filtered, one, positional)

    @property
    def ids(self) -> tuple[str, ...]:
        if not self.filtered or self.positional:
            return ()
        return (rowid.OFFSET_COLUMN,) if self.segment is not None else rowid.ROW_ID_COLUMNS


def _kept(p: ReadPlan, way: _Way, table: pa.Table, start: int, schema: pa.Schema) -> pa.Table:
    """The rows of ``table`` (a chunk of file ``way.path`` from its row ``start``) that the plan keeps, as
    ``schema``: the rows its bitmaps keep, then those its event time and tombstones keep."""
    meta = p.state.metadata
    if way.filtered:
        if way.positional:
            mask = _positions(p.kept_array(way.segment), start, table.num_rows)
        elif way.segment is not None:
            mask = _lookup(p.kept_array(way.segment), table.column(rowid.OFFSET_COLUMN))
        else:
            mask = kept_mask(p, table)
        if not mask.all():
            keep = [c for c in table.column_names if c in schema.names or c == rowid.PART_COLUMN
                    or c == meta.delta_column or any(c == h for _, h, _ in p.hidden)]
            table = _filtered(table.select(keep), pa.array(mask))
    if table.num_rows and p.event_time:
        deltas = deltas_as_int(table.column(meta.delta_column), meta.delta_type)
        table = _filtered(table, pa.array(deltas <= p.valid_at))
    if table.num_rows and p.hidden:
        table = _filtered(table, pa.array(~p.tombstoned(table)))
    table = table.select(schema.names)
    return table.cast(schema) if schema.names else table  # cast drops a table of no column's rows


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
CHUNK_BYTES = 32 << 20  # a chunk of a file the scanner reads, in Arrow bytes (an estimate)


def _scanner(io: FileIO, meta, files: list[DataFile], columns: list[str], where: pc.Expression | None,
             batch_rows: int | None = None) -> ds.Scanner:
    """pyarrow's scanner of ``columns`` of ``files`` (in order) where ``where`` holds, reading through the table's
    FileIO, :data:`READERS` files at once, one chunk ahead. The table's schema: a column added after a file was
    written reads as null there (and fails ``where``). A chunk: ``batch_rows``, or about :data:`CHUNK_BYTES`
    of the ``columns`` (estimated from the files' sizes, as four times their stored bytes), at least
    65,536 rows (a chunk pays a fixed cost in Python), at most a row group."""
    data = datafile.data_schema(meta)
    if batch_rows is None:
        stored = 4 * sum(f.bytes for f in files) / max(1, sum(f.rows for f in files))  # Arrow bytes a row
        per_row = stored * max(1, len(columns)) / len(data)
        batch_rows = int(min(datafile.ROW_GROUP_ROWS, max(65_536, CHUNK_BYTES / max(per_row, 1e-9))))
    # Columns every file holds dictionary-encoded throughout are decoded as dictionaries, then cast to the
    # table's type by the scanner: cheaper than decoding their values (docs/benchmarks.md, "Design measurements").
    dictionary = stats.dictionary_columns(files, columns)
    file_format = ds.ParquetFileFormat(read_options=ds.ParquetReadOptions(dictionary_columns=dictionary)) \
        if meta.file_format == "parquet" else ds.OrcFileFormat()
    dataset = ds.FileSystemDataset.from_paths([f.path for f in files], schema=data, format=file_format,
                                              filesystem=io.arrow_filesystem())
    return dataset.scanner(columns=columns, filter=where, batch_size=batch_rows, batch_readahead=1,
                           fragment_readahead=READERS)
