"""Table metadata: the schema, the key, the delta column and the layout options, as stored in commit 0."""

from __future__ import annotations

import base64
import dataclasses
import uuid
from typing import Any

import pyarrow as pa

from bitlake.errors import InvalidInputError, SchemaMismatchError
from bitlake.rowid import ROW_ID_COLUMNS

FORMAT_VERSION = 1
FILE_FORMATS = ("parquet", "orc")
CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
RESERVED_COLUMNS = frozenset(ROW_ID_COLUMNS + CHANGE_COLUMNS)

DEFAULT_PROPERTIES = {
    # A key-store bucket whose delta files exceed this count is merged in the next MetaGen commit.
    "keystore.max_deltas": "8",
    # Delta files are merged into the bucket's base only once they hold this fraction of its rows;
    # before that they are merged among themselves (tiering keeps a commit's bytes ∝ its batch).
    "keystore.base_merge_ratio": "0.25",
    # "rocksdb": keep a RocksDB copy of the key store next to the table for inline MetaGen (point
    # lookups on the driver instead of a Spark join); "none": always use the Spark MetaGen.
    "keystore.index": "rocksdb",
    # Inline MetaGen (driver, key index) runs when the pending batches hold at most this many records;
    # larger commits use the Spark MetaGen.
    "metagen.inline_max_rows": "2000000",
    # Anti-join lists longer than this are shuffled instead of broadcast at read time.
    "read.broadcast_invalid_rows": "20000000",
    # A full-state checkpoint is written every this many commits, so opening a table reads at most
    # one checkpoint plus this many commit files.
    "checkpoint.interval": "20",
    # The table's name in Data Change Events; empty means its base URI.
    "table.name": "",
}


def _is_integer(t: pa.DataType) -> bool:
    return pa.types.is_integer(t)


def _is_temporal_delta(t: pa.DataType) -> bool:
    return pa.types.is_timestamp(t) or pa.types.is_date(t)


@dataclasses.dataclass(frozen=True)
class TableMetadata:
    """What a table is; written once into commit 0 and never changed by later commits (yet)."""

    schema: pa.Schema
    primary_key: tuple[str, ...]
    delta_column: str | None
    partition_by: tuple[str, ...] = ()
    file_format: str = "parquet"
    num_buckets: int = 16
    properties: dict[str, str] = dataclasses.field(default_factory=dict)
    table_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
    format_version: int = FORMAT_VERSION

    @property
    def keyed(self) -> bool:
        return bool(self.primary_key)

    @property
    def column_names(self) -> list[str]:
        return list(self.schema.names)

    def prop(self, name: str) -> str:
        return self.properties.get(name, DEFAULT_PROPERTIES[name])

    def int_prop(self, name: str) -> int:
        return int(self.prop(name))

    @property
    def delta_type(self) -> pa.DataType:
        assert self.delta_column is not None
        return self.schema.field(self.delta_column).type

    def validate(self) -> None:
        names = self.schema.names
        lower = [n.lower() for n in names]
        for name in names:
            if lower.count(name.lower()) > 1:
                raise InvalidInputError(f"column {name!r} appears more than once (names are case-insensitive)")
            if name in RESERVED_COLUMNS or name.startswith("_bitlake"):
                raise InvalidInputError(f"column {name!r} uses a name reserved by bitlake")
        if self.file_format not in FILE_FORMATS:
            raise InvalidInputError(f"file_format must be one of {FILE_FORMATS}, not {self.file_format!r}")
        if not 1 <= self.num_buckets <= 65536:
            raise InvalidInputError(f"num_buckets must be between 1 and 65536, not {self.num_buckets}")
        for name in self.properties:
            if name not in DEFAULT_PROPERTIES:
                raise InvalidInputError(f"unknown table property {name!r}; known: {sorted(DEFAULT_PROPERTIES)}")
        if bool(self.primary_key) != bool(self.delta_column):
            raise InvalidInputError("a keyed table needs both primary_key and delta_column; an unkeyed one neither")
        for col in self.primary_key:
            if col not in names:
                raise InvalidInputError(f"primary key column {col!r} is not in the schema")
            t = self.schema.field(col).type
            if pa.types.is_nested(t) or pa.types.is_floating(t):
                raise InvalidInputError(f"primary key column {col!r} has type {t}, which cannot be a key")
        if self.delta_column is not None:
            if self.delta_column not in names:
                raise InvalidInputError(f"delta column {self.delta_column!r} is not in the schema")
            t = self.delta_type
            if not (_is_integer(t) or _is_temporal_delta(t)):
                raise InvalidInputError(
                    f"delta column {self.delta_column!r} has type {t}; it must be an integer, a date or a timestamp"
                )
        for col in self.partition_by:
            if col not in names:
                raise InvalidInputError(f"partition column {col!r} is not in the schema")
            t = self.schema.field(col).type
            if pa.types.is_nested(t) or pa.types.is_floating(t) or pa.types.is_binary(t):
                raise InvalidInputError(f"partition column {col!r} has type {t}, which cannot partition a table")

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "table_id": self.table_id,
            "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
            "columns": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in self.schema],
            "primary_key": list(self.primary_key),
            "delta_column": self.delta_column,
            "partition_by": list(self.partition_by),
            "file_format": self.file_format,
            "num_buckets": self.num_buckets,
            "properties": dict(self.properties),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TableMetadata:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(d["schema"])))
        return cls(
            schema=schema,
            primary_key=tuple(d["primary_key"]),
            delta_column=d["delta_column"],
            partition_by=tuple(d["partition_by"]),
            file_format=d["file_format"],
            num_buckets=d["num_buckets"],
            properties=dict(d["properties"]),
            table_id=d["table_id"],
            format_version=d["format_version"],
        )


def to_arrow_schema(schema: Any) -> pa.Schema:
    """Accepts a pyarrow.Schema or a Spark StructType."""
    if isinstance(schema, pa.Schema):
        return _normalize_arrow(schema)
    from pyspark.sql.types import StructType

    if isinstance(schema, StructType):
        from pyspark.sql.pandas.types import to_arrow_schema as spark_to_arrow

        return _normalize_arrow(spark_to_arrow(schema, timezone="UTC", prefers_large_types=False))
    raise InvalidInputError(f"schema must be a pyarrow.Schema or a Spark StructType, not {type(schema).__name__}")


def _normalize_arrow(schema: pa.Schema) -> pa.Schema:
    """Spark stores timestamps in microseconds; an Arrow schema in other units is normalised to that."""
    fields = []
    for f in schema:
        t = f.type
        if pa.types.is_timestamp(t) and t.unit != "us":
            t = pa.timestamp("us", tz=t.tz)
        elif pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_large_binary(t):
            t = pa.binary()
        elif pa.types.is_date64(t):
            t = pa.date32()
        fields.append(pa.field(f.name, t, f.nullable))
    return pa.schema(fields)


def spark_schema(schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


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
OP_COLUMN = "_bitlake_op"
OPERATIONS = ("upsert", "delete")


def delta_to_int(value: Any, delta_type: pa.DataType) -> int:
    """Converts a delta-column value (or a ``valid_at`` argument) to the int64 stored in metadata.

    Integers stay as they are; dates and timestamps become microseconds since the epoch (UTC).
    """
    import datetime as dt

    if pa.types.is_integer(delta_type):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInputError(f"expected an integer delta value, got {value!r}")
        return value
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        delta = value - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(value, dt.date):
        return (value - dt.date(1970, 1, 1)).days * 86_400_000_000
    if isinstance(value, int | float):
        # A number for a timestamp column is read as seconds since the epoch.
        return int(value * 1_000_000)
    raise InvalidInputError(f"cannot use {value!r} as a value of a {delta_type} delta column")


def spark_delta_as_long(meta: TableMetadata):
    """The delta column as a Spark Column of the int64 that logs and the key store hold (see delta_to_int)."""
    from pyspark.sql import functions as F

    assert meta.delta_column is not None
    column = F.col(meta.delta_column)
    t = meta.delta_type
    if pa.types.is_integer(t):
        return column.cast("long")
    if pa.types.is_date(t):
        return F.unix_date(column).cast("long") * F.lit(86_400_000_000)
    return F.unix_micros(column.cast("timestamp"))
