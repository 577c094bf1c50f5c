"""Arrow input conformance: a pyarrow table, record batch, batch reader, pandas DataFrame or any producer of the
Arrow PyCapsule interface checked against the table schema and cast to it, batch by batch, without Spark (the
rules of :func:`bitlake.spark.schema.conform_spark_input`, with Arrow's own representations accepted)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from bitlake.errors import InvalidInputError, SchemaMismatchError
from bitlake.format.metadata import OP_COLUMN, TableMetadata

ACCEPTED = ("a pyarrow Table, RecordBatch, RecordBatchReader, Dataset (a folder of Parquet files: "
            "pyarrow.dataset.dataset(path)) or Scanner, a pandas DataFrame, anything that exports the Arrow "
            "PyCapsule interface (__arrow_c_stream__: a polars DataFrame, a DuckDB relation, a bitlake view; or "
            "__arrow_c_array__: a struct array), or a Spark DataFrame")


def arrow_input(data: Any) -> pa.RecordBatchReader | None:
    """``data`` as a stream of record batches, or None when it is neither Arrow nor pandas input (a Spark
    DataFrame, which lands by its own path, or something no Arrow producer made).

    A producer of the Arrow C stream interface is read as a stream (never whole), so a DuckDB query or a
    view of another table lands in bounded memory."""
    if isinstance(data, pa.RecordBatchReader):
        return data
    if isinstance(data, ds.Dataset):  # a folder of files (a Hive-partitioned one too): read as a stream
        return data.scanner().to_reader()
    if isinstance(data, ds.Scanner):  # a dataset with a projection or a filter
        return data.to_reader()
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        return data.to_reader()
    if _is_pandas(data):
        try:
            return pa.Table.from_pandas(data, preserve_index=False).to_reader()
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as e:  # ValueError: a column name twice
            raise SchemaMismatchError(f"the pandas DataFrame does not convert to Arrow: {e}") from None
    if type(data).__module__.startswith("pyspark."):  # a Spark DataFrame exports a stream too, but lands in Spark
        return None
    try:
        if hasattr(data, "__arrow_c_stream__"):
            return pa.RecordBatchReader.from_stream(data)
        if hasattr(data, "__arrow_c_array__"):
            return pa.Table.from_batches([pa.record_batch(data)]).to_reader()
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
        raise InvalidInputError(f"the {type(data).__name__} does not export Arrow records (a stream or an array "
                                f"of structs, one field per column): {e}") from None
    return None


def not_arrow_hint(data: Any) -> str:
    """Why ``data`` is not accepted, when its type tells (a lazy frame to collect first), else ""."""
    if hasattr(data, "collect") and hasattr(data, "lazy"):  # polars' LazyFrame exports no Arrow interface
        return f"; collect() the {type(data).__name__} first"
    return ""


def row_count(data: Any) -> int | None:
    """The number of rows of in-memory Arrow, pandas or polars input; None for a stream or other input."""
    if isinstance(data, pa.Table | pa.RecordBatch):
        return data.num_rows
    if _is_pandas(data):
        return len(data)
    if type(data).__name__ == "DataFrame" and type(data).__module__.startswith("polars"):
        return data.height
    return None


def _is_pandas(data: Any) -> bool:
    return type(data).__name__ == "DataFrame" and type(data).__module__.startswith("pandas")


class Conformer:
    """Casts each batch of an input whose schema is ``given`` to the table's columns (and the op column)."""

    def __init__(self, given: pa.Schema, meta: TableMetadata, op_column: str | None):
        by_name = {f.name.lower(): f for f in given}
        if len(by_name) != len(given):
            raise SchemaMismatchError(f"input columns {given.names} repeat a name (names are case-insensitive)")
        if op_column is not None and op_column.lower() not in by_name:
            raise SchemaMismatchError(f"op_column {op_column!r} is not a column of the input")
        known = {n.lower() for n in meta.column_names} | ({op_column.lower()} if op_column else set())
        for f in given:
            if f.name.lower() not in known:
                raise SchemaMismatchError(f"input column {f.name!r} is not in the table schema {meta.column_names}")
        required = set(meta.primary_key) | ({meta.delta_column} if meta.delta_column else set())
        # (input column or None, target field)
        self.plan: list[tuple[str | None, pa.Field]] = []
        for target in meta.schema:
            source = by_name.get(target.name.lower())
            if source is None:
                if target.name in required or not target.nullable:
                    raise SchemaMismatchError(f"input is missing column {target.name!r} ({target.type})")
                self.plan.append((None, target))
                continue
            _check_cast(target.name, source.type, target.type)
            self.plan.append((source.name, target))
        fields = [target for _, target in self.plan]
        if op_column is not None:
            op = by_name[op_column.lower()]
            if pa.types.is_null(op.type) or not _allowed(op.type, pa.string()):
                raise SchemaMismatchError(f"op_column {op_column!r} must be a string column, not {op.type}")
            self.plan.append((op.name, pa.field(OP_COLUMN, pa.string())))
            fields.append(pa.field(OP_COLUMN, pa.string()))
        self.schema = pa.schema(fields)

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        arrays = []
        for source, target in self.plan:
            if source is None:
                arrays.append(pa.nulls(batch.num_rows, target.type))
                continue
            column = batch.column(source)
            if column.type != target.type:
                column = _cast(target.name, column, target.type)
            arrays.append(column)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def conformed(reader: pa.RecordBatchReader, meta: TableMetadata, op_column: str | None) -> Iterator[pa.RecordBatch]:
    """The batches of ``reader`` conformed to the table; schema errors are raised before the first batch."""
    conform = Conformer(reader.schema, meta, op_column)
    return (conform(b) for b in reader if b.num_rows)


def _allowed(given: pa.DataType, target: pa.DataType) -> bool:
    """Whether ``given`` values are stored as ``target`` ones without loss of meaning (values that do not fit,
    such as nanoseconds in a microsecond column, are refused when cast)."""
    if given == target or pa.types.is_null(given):
        return True
    if pa.types.is_dictionary(given):
        return _allowed(given.value_type, target)
    if pa.types.is_integer(given) and pa.types.is_integer(target):
        # Widening only: a signed type into a wider signed one, an unsigned one into a wider signed one; and the
        # signed type Spark gives an unsigned column (twice its width) back into it, each value checked.
        if pa.types.is_unsigned_integer(target):
            return given.bit_width <= target.bit_width if pa.types.is_unsigned_integer(given) else \
                given.bit_width == 2 * target.bit_width
        return given.bit_width < target.bit_width or (
            pa.types.is_signed_integer(given) and given.bit_width == target.bit_width)
    if pa.types.is_floating(given) and pa.types.is_floating(target):
        return given.bit_width <= target.bit_width
    if pa.types.is_string(target):
        return pa.types.is_large_string(given) or pa.types.is_string_view(given)
    if pa.types.is_binary(target):
        return pa.types.is_large_binary(given) or pa.types.is_binary_view(given)
    if pa.types.is_date(target):
        return pa.types.is_date(given)
    if pa.types.is_timestamp(target) and pa.types.is_timestamp(given):
        # Any unit; an instant into a zoned column whatever its zone, a wall-clock time into a column
        # without a zone, or into a zoned one as UTC (how bitlake reads a time without a zone).
        return target.tz is not None or given.tz is None
    if pa.types.is_decimal(target) and pa.types.is_decimal(given):
        return given.scale <= target.scale and given.precision - given.scale <= target.precision - target.scale
    # Nested types: each part allowed into the target's (a large list into a list, a struct field by field).
    if pa.types.is_list(target) and (pa.types.is_list(given) or pa.types.is_large_list(given)
                                     or pa.types.is_list_view(given) or pa.types.is_large_list_view(given)
                                     or pa.types.is_fixed_size_list(given)):
        return _allowed(given.value_type, target.value_type)
    if pa.types.is_map(target) and pa.types.is_map(given):
        return _allowed(given.key_type, target.key_type) and _allowed(given.item_type, target.item_type)
    if pa.types.is_struct(target) and pa.types.is_struct(given):
        return [f.name for f in given] == [f.name for f in target] and all(
            _allowed(g.type, t.type) for g, t in zip(given, target, strict=True))
    return False


def _check_cast(name: str, given: pa.DataType, target: pa.DataType) -> None:
    if not _allowed(given, target):
        raise SchemaMismatchError(f"column {name!r} has type {given} in the input but {target} in the table")


def _cast(name: str, column: pa.Array, target: pa.DataType) -> pa.Array:
    if pa.types.is_timestamp(column.type) and column.type.tz is None and pa.types.is_timestamp(target) and target.tz:
        column = column.cast(pa.timestamp(column.type.unit, tz=target.tz))  # a wall-clock time read as UTC
    try:
        return pc.cast(column, target, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        hint = ""
        if pa.types.is_timestamp(column.type) and pa.types.is_timestamp(target):
            hint = (f"; truncate them to the table's unit first (pyarrow.compute.floor_temporal(column, "
                    f"unit={_UNIT_NAMES.get(target.unit, target.unit)!r}), or pandas' .dt.floor())")
        raise InvalidInputError(f"column {name!r}: its {column.type} values do not fit the table's {target}: {e}"
                                f"{hint}") from None


_UNIT_NAMES = {"s": "second", "ms": "millisecond", "us": "microsecond", "ns": "nanosecond"}
