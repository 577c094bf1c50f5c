"""Spark's side of the table schema: Arrow <-> Spark types, input conformance, and Spark columns of values
the format defines (the int64 delta value, the packed row id)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from bitlake.errors import InvalidInputError, SchemaMismatchError
from bitlake.format import rowid
from bitlake.format.metadata import OP_COLUMN, TableMetadata, normalize_schema


def to_arrow_schema(schema: Any) -> pa.Schema:
    """Accepts a pyarrow.Schema or a Spark StructType."""
    if isinstance(schema, pa.Schema):
        return normalize_schema(schema)
    if type(schema).__name__ == "StructType" and type(schema).__module__.startswith("pyspark."):
        from pyspark.sql.pandas.types import to_arrow_schema as spark_to_arrow

        return normalize_schema(spark_to_arrow(schema, timezone="UTC", prefers_large_types=False))
    raise InvalidInputError(f"schema must be a pyarrow.Schema or a Spark StructType, not {type(schema).__name__}")


# Unsigned integers as the Spark types Spark's Parquet reader gives them: the next wider signed type.
_SIGNED = {8: pa.int16(), 16: pa.int32(), 32: pa.int64()}


def spark_schema(schema: pa.Schema):
    """``schema`` as a Spark StructType (of :func:`spark_arrow_schema`)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(spark_arrow_schema(schema))


def spark_arrow_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the Arrow types Spark takes: unsigned integers of up to 32 bits become the next wider signed
    type, as Spark reads them from Parquet (Arrow batches a Spark task yields are cast to it). An unsigned 64-bit
    column has no Spark type that keeps its values as integers (Spark reads it as a decimal), so a table with
    one is read and written without Spark."""
    fields = []
    for f in schema:
        if pa.types.is_unsigned_integer(f.type) and f.type.bit_width <= 32:
            f = f.with_type(_SIGNED[f.type.bit_width])
        elif _has_unsigned(f.type):
            raise SchemaMismatchError(
                f"column {f.name!r} has type {f.type}, which Spark cannot take as it is: read this table without "
                "Spark (Table.to_arrow, Table.view) and write it with Arrow input, or store the column as int64 "
                "or a decimal")
        fields.append(f)
    return pa.schema(fields, metadata=schema.metadata)


def spark_typed(batches):
    """Arrow batches of table types as a Spark task yields them (:func:`spark_arrow_schema`)."""
    for b in batches:
        out = spark_arrow_schema(b.schema)
        yield b if out == b.schema else b.cast(out)


def _has_unsigned(t: pa.DataType) -> bool:
    if pa.types.is_unsigned_integer(t):
        return True
    if pa.types.is_dictionary(t):
        return _has_unsigned(t.value_type)
    return any(_has_unsigned(t.field(i).type) for i in range(t.num_fields))


_WIDENINGS = {
    ("ByteType", "ShortType"), ("ByteType", "IntegerType"), ("ByteType", "LongType"),
    ("ShortType", "IntegerType"), ("ShortType", "LongType"), ("IntegerType", "LongType"),
    ("FloatType", "DoubleType"),
}


def conform_spark_input(df, meta: TableMetadata, op_column: str | None):
    """Checks a Spark DataFrame against the table schema and returns it with the table's column order.

    Missing nullable columns are filled with nulls (a delete batch may carry only key and delta);
    a missing key, delta or non-nullable column, an unknown column, or a type that does not widen
    safely to the table's type raises :class:`SchemaMismatchError` naming the column.
    """
    from pyspark.sql import functions as F

    target = spark_schema(meta.schema)
    given = {f.name.lower(): f for f in df.schema.fields}
    if op_column is not None and op_column.lower() not in given:
        raise SchemaMismatchError(f"op_column {op_column!r} is not a column of the input")
    known = {n.lower() for n in meta.column_names} | ({op_column.lower()} if op_column else set())
    for f in df.schema.fields:
        if f.name.lower() not in known:
            raise SchemaMismatchError(f"input column {f.name!r} is not in the table schema {meta.column_names}")
    required = set(meta.primary_key) | ({meta.delta_column} if meta.delta_column else set())
    cols = []
    for tf in target.fields:
        gf = given.get(tf.name.lower())
        if gf is None:
            if tf.name in required or not tf.nullable:
                raise SchemaMismatchError(f"input is missing column {tf.name!r} ({tf.dataType.simpleString()})")
            cols.append(F.lit(None).cast(tf.dataType).alias(tf.name))
            continue
        if gf.dataType != tf.dataType:
            pair = (type(gf.dataType).__name__, type(tf.dataType).__name__)
            if pair not in _WIDENINGS:
                raise SchemaMismatchError(
                    f"column {tf.name!r} has type {gf.dataType.simpleString()} in the input but "
                    f"{tf.dataType.simpleString()} in the table"
                )
            cols.append(F.col(gf.name).cast(tf.dataType).alias(tf.name))
        else:
            cols.append(F.col(gf.name).alias(tf.name))
    if op_column is not None:
        op = given[op_column.lower()]
        if type(op.dataType).__name__ != "StringType":
            raise SchemaMismatchError(
                f"op_column {op_column!r} must be a string column, not {op.dataType.simpleString()}"
            )
        cols.append(F.col(op.name).alias(OP_COLUMN))
    return df.select(*cols)


# The op column travels under this name from input to landing; it is never stored in data files.


def spark_delta_as_long(meta: TableMetadata):
    """The delta column as a Spark Column of the int64 that metadata holds (``format.metadata.delta_to_int``)."""
    from pyspark.sql import functions as F

    assert meta.delta_column is not None
    column = F.col(meta.delta_column)
    t = meta.delta_type
    if pa.types.is_integer(t):
        return column.cast("long")
    if pa.types.is_date(t):
        return F.unix_date(column).cast("long") * F.lit(86_400_000_000)
    return F.unix_micros(column.cast("timestamp"))


def spark_packed(prefix: str = ""):
    """A Spark Column computing the packed row id from the three row-id columns."""
    from pyspark.sql import functions as F

    return (
        F.shiftleft(F.col(prefix + rowid.PART_COLUMN).cast("long"), rowid.PART_SHIFT)
        .bitwiseOR(F.shiftleft(F.col(prefix + rowid.SEQ_COLUMN).cast("long"), rowid.OFFSET_BITS))
        .bitwiseOR(F.col(prefix + rowid.OFFSET_COLUMN).cast("long"))
    )
