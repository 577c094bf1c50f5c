"""Data files and keys files: their schemas, writers and readers (docs/FORMAT.md, "Data files", "Keys files").

A data file holds the table's columns in schema order, then the three row-id columns. Rows of a segment are
in offset order; a file may hold rows of several segments, which its entry in the commit lists. A file
written before columns were added lacks them: readers fill them with nulls.

A keys file holds the delete records a landing task wrote, in row-id order: the key columns, ``_delta``
(int64), ``_row_id`` (packed), ``_deleted`` and ``_bucket``. A batch's upserts need no such file: its data
files hold the same facts (key, delta, row id), and :func:`read_upserts` derives the rest. MetaGen reads a
batch's records as :func:`read_upserts` of its data files and :func:`read_deletes` of its keys files.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bitlake.errors import InvalidInputError
from bitlake.format import bucket, keystore, rowid, stats
from bitlake.format.metadata import TableMetadata, deltas_as_int
from bitlake.fs import FileIO

# Row groups hold up to this many rows / bytes of Arrow data: Spark hands a task 10,000-row Arrow batches,
# which as row groups of their own would repeat every column's dictionary (docs/benchmarks.md).
ROW_GROUP_ROWS = 1 << 20
ROW_GROUP_BYTES = 128 << 20


def data_schema(meta: TableMetadata) -> pa.Schema:
    return pa.schema(list(meta.schema) + [pa.field(c, pa.int32(), False) for c in rowid.ROW_ID_COLUMNS])


def keys_schema(meta: TableMetadata) -> pa.Schema:
    return pa.schema(
        [meta.schema.field(c).with_nullable(True) for c in meta.primary_key]
        + [
            pa.field(keystore.DELTA, pa.int64()),
            pa.field(keystore.ROW_ID, pa.int64(), False),
            pa.field(keystore.DELETED, pa.bool_(), False),
            pa.field(keystore.BUCKET, pa.int32()),
        ]
    )


@functools.lru_cache(maxsize=64)
def _parquet_leaves(schema: pa.Schema, decimals_as_integers: bool = False) -> dict[str, str]:
    """The Parquet leaf paths of ``schema``'s columns and their physical types (with ``decimals_as_integers``, as
    ``store_decimal_as_integer`` stores them): an empty file written and read back, so kept by schema: every data
    file of a table asks, and the same schema would pay it again for each."""
    buf = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), buf, store_decimal_as_integer=decimals_as_integers)
    pschema = pq.ParquetFile(pa.BufferReader(buf.getvalue())).schema
    return {pschema.column(i).path: pschema.column(i).physical_type for i in range(len(pschema))}


def data_parquet_options(schema: pa.Schema) -> dict:
    """Snappy and dictionaries as usual, except ``_segment_offset`` (distinct, ascending values), which is never
    tried with a dictionary: it is DELTA_BINARY_PACKED, like every integer column written without one
    (:meth:`FileWriter._parquet`), which stores it in almost nothing. Decimals of precision up to 18 as INT64, as
    Spark writes them: Spark's vectorized reader decodes them faster than fixed-length byte arrays, so bitlake's
    files scan as fast as Spark's own (docs/benchmarks.md, "Design measurements", "Data files")."""
    return {
        "compression": "snappy",
        "use_dictionary": [c for c in _parquet_leaves(schema) if c != rowid.OFFSET_COLUMN],
        "store_decimal_as_integer": True,
    }


# A column of a file's first row group is written without a dictionary when the group would hold more distinct
# values than this share of its rows (a dictionary saves nothing), or more than the writer's dictionary page takes
# (its default 1 MB: the writer would drop the dictionary once it filled, having hashed every value till then), so
# columns of mostly distinct values are written faster and smaller (docs/benchmarks.md, "Design measurements").
_DISTINCT_SHARE = 0.5
_DICTIONARY_PAGE_BYTES = 1 << 20
# ... judged by the distinct values of an evenly spaced sample of this many of its rows: counting them in the whole
# group costs more than writing it, and a sample a small part of that (docs/benchmarks.md, "Design measurements").
_SAMPLE_ROWS = 4_096
_MIN_SAMPLE_ROWS = 16_384  # below, a dictionary costs little, and a sample would cost as much as it saves


def _dictionary_columns(table: pa.Table, columns: list[str]) -> list[str]:
    """Of ``columns`` (Parquet leaf paths), those a dictionary is worth trying on, judged by ``table`` (a file's
    first row group): not the top-level columns whose group would hold too many distinct values (above). A column's
    distinct values in the group are estimated from its sample's as if its values were equally likely
    (:func:`_values_drawn`); the bytes a value takes from the sample's Arrow data."""
    n = table.num_rows
    if n < _MIN_SAMPLE_ROWS:
        return columns
    sample = table.take(pa.array(np.arange(_SAMPLE_ROWS, dtype=np.int64) * n // _SAMPLE_ROWS))
    kept = []
    for name in columns:
        if name in sample.column_names:
            column = sample.column(name)
            try:
                values = _values_drawn(pc.count_distinct(column).as_py(), _SAMPLE_ROWS)
            except pa.ArrowNotImplementedError:  # a type without the kernel: as usual
                kept.append(name)
                continue
            in_group = n if math.isinf(values) else values * -math.expm1(-n / values)
            if in_group > _DISTINCT_SHARE * n or in_group * column.nbytes / _SAMPLE_ROWS > _DICTIONARY_PAGE_BYTES:
                continue
        kept.append(name)
    return kept


def _values_drawn(distinct: int, draws: int) -> float:
    """How many equally likely values ``draws`` draws come from when they hold ``distinct`` distinct ones: the D of
    D * (1 - exp(-draws / D)) = distinct (inf when no value repeats), by bisection."""
    if distinct >= draws:
        return float("inf")
    low, high = float(distinct), float(draws) * draws  # D(1 - exp(-draws/D)) grows with D, from D's own floor
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if mid * -math.expm1(-draws / mid) < distinct else (low, mid)
    return (low + high) / 2


# Writers that encode in the background (``FileWriter(background=True)``) share these threads: a writer has at
# most one row group on them at a time, so its row groups stay in order and its memory is one row group more.
_ENCODERS = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="bitlake-encode")


class FileWriter:
    """One output file; buffers incoming tables into full-size row groups. A Parquet file's writer starts with
    its first row group, which picks the columns tried with a dictionary (:func:`_dictionary_columns`). With
    ``background``, a full row group is encoded on a shared thread while the caller goes on (a compaction reads
    its next rows meanwhile: it wrote on one core)."""

    def __init__(self, io: FileIO, path: str, schema: pa.Schema, file_format: str, options: dict,
                 stats_columns: list[str] | None = None, background: bool = False):
        self.io = io
        self.path = path
        self.rows = 0
        self.flushed_rows = 0  # the rows of the row groups written (encoded), and their bytes
        self._flushed_bytes = 0
        self._background = background
        self._encoding: Future | None = None
        self._buffer: list[pa.Table] = []
        self._buffered_rows = 0
        self.buffered_bytes = 0
        self._schema, self._options = schema, options
        self._out = io.open_output(path)
        self._pq: pq.ParquetWriter | None = None
        self._orc = None
        self._stats = stats.Collector(schema, stats_columns, file_format == "parquet") \
            if stats_columns is not None else None
        if file_format == "orc":
            import pyarrow.orc as orc

            self._orc = orc.ORCWriter(self._out)

    def write(self, table: pa.Table) -> None:
        self.rows += table.num_rows
        self._buffer.append(table)
        self._buffered_rows += table.num_rows
        self.buffered_bytes += table.nbytes
        if self._buffered_rows >= ROW_GROUP_ROWS or self.buffered_bytes >= ROW_GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        """Writes the buffered rows as a row group (in the background: starts it, once the one before is written)."""
        if not self._buffer:
            return
        table = pa.concat_tables(self._buffer)
        self._buffer, self._buffered_rows, self.buffered_bytes = [], 0, 0
        if not self._background:
            self._encode(table)
            return
        self._written()
        self._encoding = _ENCODERS.submit(self._encode, table)

    def _encode(self, table: pa.Table) -> None:
        if self._stats is not None:
            self._stats.add(table)
        if self._orc is not None:
            self._orc.write(table)
        else:
            self._parquet(table).write_table(table, row_group_size=ROW_GROUP_ROWS)
        self._flushed_bytes = self._out.tell()
        self.flushed_rows += table.num_rows

    def _written(self) -> None:
        """Waits for the row group being encoded in the background, if any; raises what failed there."""
        encoding, self._encoding = self._encoding, None
        if encoding is not None:
            encoding.result()

    def _parquet(self, first: pa.Table) -> pq.ParquetWriter:
        """The file's Parquet writer, made for its first row group ``first``. A column of integers (dates, times,
        decimals stored as integers) written without a dictionary is DELTA_BINARY_PACKED: smaller than snappy's
        plain values and faster to write and decode, several times for keys and prices (docs/benchmarks.md, "Design
        measurements", "Data files")."""
        if self._pq is None:
            options = dict(self._options)
            if isinstance(options.get("use_dictionary"), list):
                options["use_dictionary"] = dictionary = _dictionary_columns(first, options["use_dictionary"])
                leaves = _parquet_leaves(self._schema, bool(options.get("store_decimal_as_integer")))
                packed = [c for c, physical in leaves.items()
                          if physical in ("INT32", "INT64") and c not in dictionary]
                options["column_encoding"] = {**dict.fromkeys(packed, "DELTA_BINARY_PACKED"),
                                              **options.get("column_encoding", {})}
            self._pq = pq.ParquetWriter(self._out, self._schema, **options)
        return self._pq

    def flushed_bytes(self) -> int:
        """The bytes of the row groups written so far (those of :attr:`flushed_rows`)."""
        return self._flushed_bytes

    def close(self) -> int:
        """Closes the file; returns its size in bytes."""
        self.flush()
        self._written()
        (self._orc or self._parquet(self._schema.empty_table())).close()
        if self._stats is not None and self._pq is not None:
            self._stats.footer(self._pq.writer.metadata)
        self._out.close()
        return self.io.size(self.path)

    def stats(self) -> dict | None:
        """The file's column statistics (docs/FORMAT.md, "File statistics"), once closed; None for a keys file."""
        return self._stats.to_json() if self._stats is not None else None


def check_storable(schema: pa.Schema, file_format: str) -> None:
    """Refuses a column whose type the table's file format cannot store (ORC has no unsigned integers, times or
    durations; neither format stores Arrow's interval types), before anything is written: each column is
    written as an empty file into memory."""
    import io as _io

    for field in schema:
        empty = pa.schema([field]).empty_table()
        try:
            if file_format == "orc":
                import pyarrow.orc as orc

                orc.write_table(empty, _io.BytesIO())
            else:
                pq.write_table(empty, _io.BytesIO())
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
            raise InvalidInputError(f"column {field.name!r} has type {field.type}, which {file_format} files cannot "
                                    "store") from None


def data_writer(io: FileIO, path: str, meta: TableMetadata, background: bool = False) -> FileWriter:
    schema = data_schema(meta)
    options = data_parquet_options(schema) if meta.file_format == "parquet" else {}
    columns = [f.name for f in meta.schema if stats.covered(f.type)]
    return FileWriter(io, path, schema, meta.file_format, options, columns, background)


# A keys file's column of each record's offset in input order (docs/FORMAT.md, "Keys files"): a writer that numbers
# deletes in key order keeps their order of arrival here, for the change feed.
POSITION = "_position"


def keys_writer(io: FileIO, path: str, meta: TableMetadata) -> FileWriter:
    """A writer of a landing's keys file: :func:`keys_schema` and :data:`POSITION`."""
    schema = keys_schema(meta).append(pa.field(POSITION, pa.int32(), False))
    return FileWriter(io, path, schema, "parquet", keystore.parquet_options(schema))


def delete_positions(io: FileIO, path: str) -> tuple[np.ndarray, np.ndarray]:
    """A keys file's delete records: their packed row ids, and the packed row ids of their places in input order
    (the same when the file has no :data:`POSITION` column)."""
    f = pq.ParquetFile(io.open_input(path))
    has_position = POSITION in f.schema_arrow.names
    rows = f.read(columns=[keystore.ROW_ID, keystore.DELETED, *([POSITION] if has_position else [])])
    rows = rows.filter(rows.column(keystore.DELETED))
    rids = rows.column(keystore.ROW_ID).to_numpy()
    if not has_position:
        return rids, rids
    parts, seqs, _ = rowid.unpack_arrays(rids)
    return rids, rowid.pack_arrays(parts, seqs, rows.column(POSITION).to_numpy())


def read_data(io: FileIO, path: str, meta: TableMetadata, columns: list[str] | None = None,
              parts: np.ndarray | None = None) -> pa.Table:
    """A data file's rows as the table's current data schema (or ``columns`` of it); columns added after
    the file was written are null. ``parts`` (sorted segment parts): only the rows of those batches, read from the
    Parquet row groups whose ``_segment_part`` statistics may hold them (a compacted file holds its rows in row-id
    order, so a batch's rows are a few of its row groups)."""
    schema = data_schema(meta)
    names = columns or schema.names
    groups = None
    if meta.file_format == "orc":
        import pyarrow.orc as orc

        f = orc.ORCFile(io.open_input(path))
        present = set(f.schema.names)
    else:
        f = pq.ParquetFile(io.open_input(path))
        present = set(f.schema_arrow.names)
        groups = _groups_of_parts(f, parts) if parts is not None else None
    wanted = [n for n in names if n in present]
    if parts is not None and rowid.PART_COLUMN not in wanted:
        wanted.append(rowid.PART_COLUMN)
    table = f.read(columns=wanted) if groups is None else f.read_row_groups(groups, columns=wanted)
    if parts is not None:
        mine = pc.is_in(table.column(rowid.PART_COLUMN), value_set=pa.array(parts, pa.int32()))
        if not pc.all(mine).as_py():
            table = table.filter(mine)
    return conform(table, schema, names)


def _groups_of_parts(f: pq.ParquetFile, parts: np.ndarray) -> list[int]:
    """The row groups of ``f`` whose ``_segment_part`` statistics say they may hold a row of ``parts``."""
    md = f.metadata
    column = f.schema_arrow.get_field_index(rowid.PART_COLUMN)
    out = []
    for i in range(md.num_row_groups):
        st = md.row_group(i).column(column).statistics if column >= 0 else None
        if st is None or not st.has_min_max:
            out.append(i)
            continue
        if np.searchsorted(parts, st.max, side="right") > np.searchsorted(parts, st.min, side="left"):
            out.append(i)
    return out


def read_batches(io: FileIO, path: str, schema: pa.Schema, file_format: str = "parquet",
                 columns: list[str] | None = None, batch_rows: int = 65536) -> Iterator[pa.RecordBatch]:
    """A file's rows as record batches of ``schema`` (``columns`` of it) in bounded memory: a Parquet file row
    group by row group, an ORC file stripe by stripe. Columns the file lacks are null."""
    names = columns or schema.names
    if file_format == "orc":
        import pyarrow.orc as orc

        f = orc.ORCFile(io.open_input(path))
        wanted = [n for n in names if n in set(f.schema.names)]
        for i in range(f.nstripes):
            yield from conform(pa.Table.from_batches([f.read_stripe(i, columns=wanted)]), schema, names).to_batches()
        return
    pf = pq.ParquetFile(io.open_input(path))
    wanted = [n for n in names if n in set(pf.schema_arrow.names)]
    for rb in pf.iter_batches(batch_size=batch_rows, columns=wanted):
        yield from conform(pa.Table.from_batches([rb]), schema, names).to_batches()


def file_stats(io: FileIO, path: str, meta: TableMetadata) -> dict:
    """The column statistics (docs/FORMAT.md, "File statistics") of an existing data file, from its values: what
    its writer would have recorded (a file written before bitlake recorded them)."""
    columns = [f.name for f in meta.schema if stats.covered(f.type)]
    collector = stats.Collector(data_schema(meta), columns, footer=False)
    if columns:
        for rb in read_batches(io, path, data_schema(meta), meta.file_format, columns, ROW_GROUP_ROWS):
            collector.add(pa.Table.from_batches([rb]))
    return collector.to_json()


def conform(table: pa.Table, schema: pa.Schema, names: list[str]) -> pa.Table:
    """``table``'s ``names`` columns as ``schema`` types them; those it lacks as nulls."""
    arrays = [table.column(n).cast(schema.field(n).type) if n in table.column_names
              else pa.nulls(table.num_rows, schema.field(n).type) for n in names]
    return pa.Table.from_arrays(arrays, schema=pa.schema([schema.field(n) for n in names]))


def read_keys(io: FileIO, path: str, meta: TableMetadata) -> pa.Table:
    return pq.read_table(io.open_input(path), schema=keys_schema(meta))


def read_deletes(io: FileIO, path: str, meta: TableMetadata) -> pa.Table:
    """A keys file's delete records (format v1 writers put every record in keys files: the upserts among
    them are read from the data files, like every batch's)."""
    return deletes_of(read_keys(io, path, meta))


def deletes_of(records: pa.Table) -> pa.Table:
    """The delete records among keys-file rows ``records``."""
    return records.filter(records.column(keystore.DELETED))


def upsert_columns(meta: TableMetadata) -> list[str]:
    """The data-file columns an upsert's keys-file row is derived from."""
    assert meta.delta_column is not None  # a keyed table has one
    return [*meta.primary_key, meta.delta_column, *rowid.ROW_ID_COLUMNS]


def keys_rows(rows: pa.Table | pa.RecordBatch, meta: TableMetadata, deltas: np.ndarray, packed: np.ndarray,
              deleted: bool) -> pa.Table:
    """Keys-file rows (:func:`keys_schema`) of records ``rows`` (their key columns), with their int64 delta
    values and packed row ids; the bucket is computed from the keys."""
    columns = [rows.column(c) for c in meta.primary_key] + [
        pa.array(deltas), pa.array(packed), pa.array(np.full(rows.num_rows, deleted, dtype=bool)),
        pa.array(bucket.buckets(rows, meta.primary_key, meta.num_buckets)),
    ]
    return pa.Table.from_arrays(columns, schema=keys_schema(meta))


def keys_of(rows: pa.Table | pa.RecordBatch, meta: TableMetadata) -> pa.Table:
    """Keys-file rows of upserts, from their :func:`upsert_columns`."""
    packed = rowid.pack_arrays(*(rows.column(c).to_numpy() for c in rowid.ROW_ID_COLUMNS))
    return keys_rows(rows, meta, deltas_as_int(rows.column(meta.delta_column), meta.delta_type), packed, False)


def read_upserts(io: FileIO, path: str, meta: TableMetadata) -> pa.Table:
    """The upsert records of a data file as keys-file rows."""
    return keys_of(read_data(io, path, meta, columns=upsert_columns(meta)), meta)
