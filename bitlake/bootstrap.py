"""Bootstrap a table from an existing dataset (Opal's migration tool, seed 004): a Parquet file or folder, a
Hive-partitioned folder, a Delta table, an Iceberg table or a lance dataset, streamed into one batch of a new
table by the driver path, so a conversion runs at the load's speed in bounded memory (docs/convert.md)."""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import Any

import pyarrow as pa

from bitlake.engine.write import conform
from bitlake.errors import InvalidInputError, MissingDependencyError, TableExistsError
from bitlake.format.metadata import normalize_schema
from bitlake.fs import file_io
from bitlake.table import Table, create_table

SOURCE_KINDS = ("parquet", "delta", "iceberg", "lance")


@dataclasses.dataclass(frozen=True)
class Source:
    """A dataset to convert: its kind, its schema, its Hive partition columns, and its rows as a stream."""

    kind: str
    location: str
    schema: pa.Schema
    partition_columns: tuple[str, ...]
    open: Any  # () -> pa.RecordBatchReader


@dataclasses.dataclass(frozen=True)
class ConvertResult:
    """What ``convert`` did: the new table, the source rows read and how the contract resolved them.

    ``duplicates`` counts the source records that did not survive as their key's row, for keys the source
    holds more than once (``updated`` + ``stale`` in ``counts``: one batch applies a key's records in delta
    order, so a record superseded by a later delta is counted as updated, docs/semantics.md rule 2)."""

    table: Table
    source_kind: str
    rows: int
    duplicates: int
    counts: dict[str, int]


def detect(location: str) -> str:
    """The kind of dataset at a local ``location`` (a path)."""
    path = location
    if not os.path.exists(path):
        raise InvalidInputError(f"no such source: {location}")
    if os.path.isdir(os.path.join(path, "_delta_log")):
        return "delta"
    if os.path.isdir(os.path.join(path, "_versions")) or path.rstrip("/").endswith(".lance"):
        return "lance"
    if glob.glob(os.path.join(path, "metadata", "*.metadata.json")) or path.endswith(".metadata.json"):
        return "iceberg"
    return "parquet"


def open_source(location: Any, kind: str | None = None) -> Source:
    """The dataset at ``location``, a local path or ``file://`` URI (kind detected when not given), or Arrow
    records: anything :meth:`Table.ingest` takes without Spark (a polars DataFrame, a DuckDB relation...)."""
    if not isinstance(location, str | os.PathLike):
        return _arrow(location)
    location = os.fspath(location).removeprefix("file://")  # one form for detection and every reader
    kind = kind or detect(location)
    if kind not in SOURCE_KINDS:
        raise InvalidInputError(f"unknown source kind {kind!r}; known: {list(SOURCE_KINDS)}")
    return _OPENERS[kind](location)


def _parquet(location: str) -> Source:
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    folder = os.path.isdir(location)
    try:
        dataset = ds.dataset(location, format="parquet", partitioning="hive" if folder else None,
                             exclude_invalid_files=False)
        if not dataset.files:
            raise InvalidInputError(f"{location} holds no Parquet files")
        schemas = [pq.read_schema(f) for f in dataset.files]
    except (pa.ArrowInvalid, OSError) as e:
        raise InvalidInputError(f"{location} is not a Parquet file or folder: {e}") from None
    try:  # every file's columns (pyarrow's dataset takes the first file's schema and drops the others' columns)
        in_files = pa.unify_schemas(schemas)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise InvalidInputError(f"the Parquet files of {location} disagree on a column's type: {e}") from None
    # pyarrow's Hive partitioning reports every column when no folder names one: the partition columns are the
    # dataset's columns that the files themselves do not hold.
    partition_columns = tuple(n for n in dataset.schema.names if n not in in_files.names) if folder else ()
    if len(schemas) > 1:
        schema = pa.schema([*in_files, *(dataset.schema.field(c) for c in partition_columns)])
        dataset = ds.dataset(location, schema=schema, format="parquet", partitioning="hive" if folder else None,
                             exclude_invalid_files=False)
    return Source("parquet", location, dataset.schema, partition_columns, lambda: dataset.scanner().to_reader())


def _delta(location: str) -> Source:
    try:
        from deltalake import DeltaTable
    except ImportError:
        raise MissingDependencyError("reading a Delta table needs deltalake: pip install 'bitlake[formats]'",
                                     name="deltalake") from None
    table = DeltaTable(location)
    partition_columns = tuple(table.metadata().partition_columns)
    if "deletionVectors" in (table.protocol().reader_features or []):
        # deltalake's pyarrow dataset does not apply deletion vectors; its query engine (DataFusion) does.
        from deltalake import QueryBuilder

        reader = pa.RecordBatchReader.from_stream(QueryBuilder().register("t", table).execute("SELECT * FROM t"))
        return Source("delta", location, reader.schema, partition_columns, lambda: reader)
    dataset = table.to_pyarrow_dataset()
    return Source("delta", location, dataset.schema, partition_columns, lambda: dataset.scanner().to_reader())


def _iceberg(location: str) -> Source:
    try:
        from pyiceberg.table import StaticTable
    except ImportError:
        raise MissingDependencyError("reading an Iceberg table needs pyiceberg: pip install 'bitlake[formats]'",
                                     name="pyiceberg") from None
    metadata = location
    if not location.endswith(".metadata.json"):
        found = sorted(glob.glob(os.path.join(location, "metadata", "*.metadata.json")), key=_metadata_order)
        if not found:
            raise InvalidInputError(f"{location} has no Iceberg metadata file under metadata/")
        metadata = found[-1]
    table = StaticTable.from_metadata(metadata)
    scan = table.scan()
    schema = scan.projection().as_arrow()
    identity = [table.schema().find_field(f.source_id).name for f in table.spec().fields
                if str(f.transform) == "identity"]
    return Source("iceberg", location, schema, tuple(identity), lambda: scan.to_arrow_batch_reader())


def _metadata_order(path: str) -> tuple[int, str]:
    """Iceberg metadata files are numbered ``<version>-<uuid>.metadata.json`` (or ``v<version>.metadata.json``)."""
    head = os.path.basename(path).split("-", 1)[0].lstrip("v").split(".", 1)[0]
    return (int(head) if head.isdigit() else -1, path)


def _arrow(data: Any) -> Source:
    reader = conform.arrow_input(data)
    if reader is None:
        raise InvalidInputError(f"cannot convert a {type(data).__name__}: pass the path of a Parquet, Delta, Iceberg "
                                f"or lance dataset, or {conform.ACCEPTED.removesuffix(', or a Spark DataFrame')}"
                                f"{conform.not_arrow_hint(data)}")
    return Source("arrow", type(data).__name__, reader.schema, (), lambda: reader)


def _lance(location: str) -> Source:
    try:
        import lance
    except ImportError:
        raise MissingDependencyError("reading a lance dataset needs pylance: pip install 'bitlake[formats]'",
                                     name="lance") from None
    dataset = lance.dataset(location)
    return Source("lance", location, dataset.schema, (), lambda: dataset.scanner().to_reader())


_OPENERS = {"parquet": _parquet, "delta": _delta, "iceberg": _iceberg, "lance": _lance}


def convert(source: Any, path: str, *, primary_key: str | list[str] | None = None, delta_column: str | None = None,
            partition_by: str | list[str] | None = None, source_kind: str | None = None, name: str | None = None,
            num_buckets: int = 16, properties: dict[str, str] | None = None,
            batch_id: str = "convert", storage_options: dict[str, str] | None = None) -> ConvertResult:
    """Creates a table at ``path`` holding the dataset at ``source`` as its first batch.

    ``source`` is the path of a Parquet file or folder, a Delta table, an Iceberg table or a lance dataset, or
    Arrow records in memory or as a stream (a pyarrow Table or RecordBatchReader, a polars DataFrame, a DuckDB
    relation, a bitlake view: anything exporting the Arrow PyCapsule interface; ``source_kind`` "arrow").

    The table takes the source's schema; ``partition_by`` defaults to the source's Hive (or identity)
    partition columns. A keyed table (``primary_key`` and ``delta_column``) resolves keys the source holds
    more than once by the contract: the record with the highest delta value survives, the later one read on
    a tie (docs/semantics.md rule 2). On any error nothing is left at ``path``.
    """
    src = open_source(source, source_kind)
    io = file_io(path, storage_options)
    if io.exists("_bitlake"):
        raise TableExistsError(f"{io.uri()} already holds a bitlake table")
    if io.walk():
        raise InvalidInputError(f"{io.uri()} is not empty: convert into a new or empty folder")
    existed = io.exists()
    schema = normalize_schema(src.schema)  # dictionary, large and nested types as a table stores them
    if isinstance(primary_key, str):
        primary_key = [primary_key]
    missing = [c for c in [*(primary_key or []), *([delta_column] if delta_column else [])] if c not in schema.names]
    if missing:
        raise InvalidInputError(f"columns {missing} are not in the source's schema {schema.names}")
    partitions = list(src.partition_columns) if partition_by is None else partition_by
    table = create_table(io, schema, name=name, primary_key=primary_key, delta_column=delta_column,
                         partition_by=partitions or None, num_buckets=num_buckets, properties=properties)
    try:
        reader = src.open()
        result = table.ingest(reader, batch_id=batch_id)
    except BaseException:
        _remove_table(io, existed)
        raise
    counts = result.counts
    rows = sum(counts.values()) if table.metadata.keyed else counts.get("inserted", 0)
    duplicates = counts.get("updated", 0) + counts.get("stale", 0)
    return ConvertResult(table, src.kind, rows, duplicates, counts)


def _remove_table(io, existed: bool) -> None:
    for rel in io.walk():
        io.delete(rel)
    io.remove_empty_dirs("")
    if not existed and io.local_path() is not None and os.path.isdir(io.local_path()):
        os.rmdir(io.local_path())
