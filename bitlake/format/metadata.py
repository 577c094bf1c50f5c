"""Table metadata: name, id, schema, key, delta column and layout options (docs/FORMAT.md, "Metadata").

Commit 0 states it; a later commit may state it again with changed properties or added nullable columns
(:meth:`TableMetadata.evolve`). The key, delta column, partitioning, file format and bucket count never change.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import re
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bitlake.errors import InvalidInputError, SchemaMismatchError
from bitlake.format.frozen import FrozenDict
from bitlake.format.rowid import ROW_ID_COLUMNS

FILE_FORMATS = ("parquet", "orc")
CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
RESERVED_COLUMNS = frozenset(ROW_ID_COLUMNS + CHANGE_COLUMNS)
# The largest int64 is +infinity in validity events (a row valid without end), so no delta value may be it.
DELTA_INFINITY = (1 << 63) - 1
# A table's name is what its Data Change Events carry: the trigger service's limits (bitlake.triggers.event).
MAX_NAME_BYTES = 512
_NAME_REFUSED = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")  # control characters, lone surrogates

DEFAULT_PROPERTIES = {
    # A key-store bucket whose increments exceed this count is merged in the next MetaGen commit.
    "keystore.max_increments": "8",
    # Increments are merged into the bucket's base only once they hold this fraction of its rows;
    # before that they are merged among themselves (tiering keeps a commit's bytes ∝ its batch).
    "keystore.base_merge_ratio": "0.25",
    # "rocksdb": keep a RocksDB copy of the key store beside the writer for inline MetaGen (point
    # lookups on the driver instead of a scan); "none": no index.
    "keystore.index": "rocksdb",
    # A writer keeps the index open this many seconds after a commit, for its next commit (no reopen); other
    # processes scan the key store meanwhile (docs/ingestion.md, "Two steps, as in Opal"). 0: closed after each commit.
    "keystore.index_idle_seconds": "10",
    # A Spark DataFrame that Spark's plan estimates at most this many bytes is collected as Arrow and lands on
    # the driver, as Arrow input always does; a larger one lands in a Spark job.
    "ingest.driver_max_bytes": "67108864",
    # Inline MetaGen (driver) runs when the pending batches hold at most this many records; larger commits
    # use the Spark MetaGen. Inline is the faster at every size measured; it folds in groups of 20M records, so its
    # memory grows with the commit up to a bound, which this limit keeps within a driver's (docs/benchmarks.md,
    # "Design measurements", "MetaGen: inline or on Spark").
    "metagen.inline_max_rows": "100000000",
    # Anti-join lists longer than this are shuffled instead of broadcast at read time.
    "read.broadcast_invalid_rows": "20000000",
    # Minor compaction (docs/maintenance.md) writes data files of about this size; it rewrites files whose
    # superseded rows are at least compact.invalid_fraction of theirs, and merges files smaller than
    # compact.small_file_bytes by size tiers of at least compact.min_input_files files.
    "compact.target_file_bytes": "134217728",
    "compact.small_file_bytes": "33554432",
    "compact.invalid_fraction": "0.1",
    "compact.min_input_files": "4",
    # ... and regroups segment-log files (other than folded ones) by size tiers of at least this many files.
    "compact.min_log_files": "16",
    # Major compaction's default window (docs/maintenance.md): a version, an age ("7d", "12h") or a time.
    "compact.look_back": "7d",
    # Upkeep (docs/maintenance.md, "Automatic upkeep"): maintain() runs a major compaction when the look-back
    # moves the window by at least this much commit time (an age), else a minor one when files are due.
    "maintain.major_interval": "1d",
    # "true": every ingest or MetaGen commit is followed by a minor compaction bounded to rewrite at most
    # maintain.auto_budget times the bytes that commit added (a small batch never pays for a large one).
    "maintain.auto": "false",
    "maintain.auto_budget": "10",
    # "true": a commit that changes a few offsets of a segment with a large bitmap writes a delta to it (table
    # feature bitmapDeltas, docs/FORMAT.md "Bitmaps"); "false": whole bitmaps only, for readers without that feature;
    # "always": a delta for every change to a segment that has a bitmap, whatever it costs (tests use it).
    "bitmap.deltas": "true",
    # A state checkpoint is written every this many commits, so opening a table reads at most one
    # checkpoint plus this many commit files.
    "checkpoint.interval": "20",
}


def key_type_supported(t: pa.DataType) -> bool:
    """Types a key column may have: those the bucket hash encodes (docs/FORMAT.md, "Key encoding")."""
    return (pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_date32(t) or pa.types.is_timestamp(t)
            or pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_decimal(t))


@dataclasses.dataclass(frozen=True)
class TableMetadata:
    """What a table is. ``name`` is its logical name (Data Change Events carry it), ``table_id`` a UUID fixed at
    creation; neither is a path, so a table keeps both when its files move."""

    schema: pa.Schema
    primary_key: tuple[str, ...]
    delta_column: str | None
    partition_by: tuple[str, ...] = ()
    file_format: str = "parquet"
    num_buckets: int = 16
    properties: dict[str, str] = dataclasses.field(default_factory=dict)
    name: str = ""
    table_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)

    def __post_init__(self):
        if type(self.properties) is not FrozenDict:  # a snapshot holds the metadata: a value too
            object.__setattr__(self, "properties", FrozenDict(self.properties))

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

    def float_prop(self, name: str) -> float:
        return float(self.prop(name))

    def bool_prop(self, name: str) -> bool:
        return self.prop(name).lower() == "true"

    @property
    def delta_type(self) -> pa.DataType:
        assert self.delta_column is not None
        return self.schema.field(self.delta_column).type

    def validate(self) -> None:
        names = self.schema.names
        lower = [n.lower() for n in names]
        if not isinstance(self.name, str) or not self.name.strip():
            raise InvalidInputError("a table needs a non-empty name")
        if _NAME_REFUSED.search(self.name) or len(self.name.encode()) > MAX_NAME_BYTES:
            raise InvalidInputError(
                f"table name {self.name[:80]!r}: a name (by default the folder's) is at most {MAX_NAME_BYTES} bytes "
                "of UTF-8 without control characters (its Data Change Events carry it); give another with name=")
        for name in names:
            if not name.strip():
                raise InvalidInputError(f"column names must not be empty: {names}")
            if lower.count(name.lower()) > 1:
                raise InvalidInputError(f"column {name!r} appears more than once (names are case-insensitive)")
            if name in RESERVED_COLUMNS or name.startswith("_bitlake"):
                raise InvalidInputError(f"column {name!r} uses a name reserved by bitlake")
        if self.file_format not in FILE_FORMATS:
            raise InvalidInputError(f"file_format must be one of {FILE_FORMATS}, not {self.file_format!r}")
        if not 1 <= self.num_buckets <= 65536:
            raise InvalidInputError(f"num_buckets must be between 1 and 65536, not {self.num_buckets}")
        _check_properties(self.properties)
        if bool(self.primary_key) != bool(self.delta_column):
            raise InvalidInputError("a keyed table needs both primary_key and delta_column; an unkeyed one neither")
        if len(set(self.primary_key)) != len(self.primary_key):
            raise InvalidInputError(f"primary_key {list(self.primary_key)} names a column twice")
        if self.delta_column is not None and self.delta_column in self.primary_key:
            raise InvalidInputError(f"the delta column {self.delta_column!r} cannot be a key column: it orders the "
                                    "records of a key, so each of its values would make another key")
        for col in self.primary_key:
            if col not in names:
                raise InvalidInputError(f"primary key column {col!r} is not in the schema")
            t = self.schema.field(col).type
            if not key_type_supported(t):
                raise InvalidInputError(f"primary key column {col!r} has type {t}, which cannot be a key")
        if self.delta_column is not None:
            if self.delta_column not in names:
                raise InvalidInputError(f"delta column {self.delta_column!r} is not in the schema")
            t = self.delta_type
            if not (pa.types.is_integer(t) or pa.types.is_timestamp(t) or pa.types.is_date(t)):
                raise InvalidInputError(
                    f"delta column {self.delta_column!r} has type {t}; it must be an integer, a date or a timestamp"
                )
        if len(set(self.partition_by)) != len(self.partition_by):
            raise InvalidInputError(f"partition_by {list(self.partition_by)} names a column twice")
        if self.partition_by and len(set(self.partition_by)) >= len(names):
            raise InvalidInputError(f"partition_by {list(self.partition_by)} leaves no column in the data files")
        for col in self.partition_by:
            if col == self.delta_column:
                raise InvalidInputError(f"the delta column {col!r} cannot partition the table: a key's records "
                                        "would move between partitions")
            if col not in names:
                raise InvalidInputError(f"partition column {col!r} is not in the schema")
            t = self.schema.field(col).type
            if pa.types.is_nested(t) or pa.types.is_floating(t) or pa.types.is_binary(t):
                raise InvalidInputError(f"partition column {col!r} has type {t}, which cannot partition a table")

    def evolve(self, *, properties: dict[str, str] | None = None, add_columns: pa.Schema | None = None
               ) -> TableMetadata:
        """The metadata with properties set (an empty value removes one) and nullable columns appended."""
        props = dict(self.properties)
        for k, v in (properties or {}).items():
            if v == "" or v is None:
                props.pop(k, None)
            else:
                props[k] = str(v)
        _check_properties(props)
        schema = self.schema
        for f in normalize_schema(add_columns) if add_columns is not None else []:
            if f.name.lower() in {n.lower() for n in schema.names}:
                raise SchemaMismatchError(f"column {f.name!r} already exists")
            if not f.nullable:
                raise SchemaMismatchError(f"an added column must be nullable: {f.name!r} is not")
            schema = schema.append(f)
        evolved = dataclasses.replace(self, properties=props, schema=schema)
        evolved.validate()
        return evolved

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
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
            name=d["name"],
            table_id=d["table_id"],
        )


# Properties that take one of a few words.
PROPERTY_CHOICES = {"bitmap.deltas": ("true", "false", "always"), "keystore.index": ("rocksdb", "none")}
# Counts and sizes that must be at least 1 (an interval of 0 divides by zero, a file target of 0 never fills).
_POSITIVE = ("checkpoint.interval", "keystore.max_increments", "compact.min_input_files", "compact.min_log_files",
             "compact.target_file_bytes")
_SECONDS = ("keystore.index_idle_seconds",)  # a number of seconds, whole or not
AGE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")  # an age: "7d", "12h", "30m", "90s"
_AGES = ("maintain.major_interval",)
_LOOK_BACKS = ("compact.look_back",)  # a version, an age or an ISO-8601 commit time


def _check_properties(properties: dict[str, str]) -> None:
    for name, value in properties.items():
        if name not in DEFAULT_PROPERTIES:
            raise InvalidInputError(f"unknown table property {name!r}; known: {sorted(DEFAULT_PROPERTIES)}")
        if name in PROPERTY_CHOICES:
            if str(value).lower() not in PROPERTY_CHOICES[name]:
                raise InvalidInputError(f"table property {name!r} must be one of {PROPERTY_CHOICES[name]}, not "
                                        f"{value!r}")
        elif DEFAULT_PROPERTIES[name].isdigit() and name not in _SECONDS:  # an integer property
            text = str(value).strip()
            if not text.isdigit() or (name in _POSITIVE and int(text) < 1):
                raise InvalidInputError(f"table property {name!r} must be a whole number of at least "
                                        f"{1 if name in _POSITIVE else 0}, not {value!r}")
        elif DEFAULT_PROPERTIES[name].replace(".", "", 1).isdigit():
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = float("nan")
            if not 0 <= number < float("inf"):
                raise InvalidInputError(f"table property {name!r} must be a number of at least 0, not {value!r}")
        elif DEFAULT_PROPERTIES[name] in ("true", "false") and str(value).lower() not in ("true", "false"):
            raise InvalidInputError(f"table property {name!r} must be true or false, not {value!r}")
        elif name in _AGES and not AGE.match(str(value).strip()):
            raise InvalidInputError(f"table property {name!r} must be an age such as '7d', '12h', '30m' or '90s', "
                                    f"not {value!r}")
        elif name in _LOOK_BACKS and not (str(value).strip().isdigit() or AGE.match(str(value).strip())
                                          or _iso_time(str(value))):
            raise InvalidInputError(f"table property {name!r} must be a version, an age such as '7d' or an ISO-8601 "
                                    f"commit time, not {value!r}")


def _iso_time(text: str) -> bool:
    try:
        dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def normalize_schema(schema: pa.Schema) -> pa.Schema:
    """Spark stores timestamps in microseconds and has no large, view, dictionary or 64-bit-date types: an Arrow
    schema is normalised, nested types included, to what both engines store the same way (field metadata, such
    as Iceberg's field ids, is dropped)."""
    return pa.schema([pa.field(f.name, normal_type(f.type), f.nullable) for f in schema])


def normal_type(t: pa.DataType) -> pa.DataType:
    """:func:`normalize_schema` of one type."""
    if pa.types.is_dictionary(t):
        return normal_type(t.value_type)
    if pa.types.is_timestamp(t) and t.unit != "us":
        return pa.timestamp("us", tz=t.tz)
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_map(t):
        return pa.map_(normal_type(t.key_type), pa.field(t.item_field.name, normal_type(t.item_type),
                                                         t.item_field.nullable), t.keys_sorted)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t) \
            or pa.types.is_large_list_view(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(pa.field(t.value_field.name, normal_type(t.value_type), t.value_field.nullable))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, normal_type(f.type), f.nullable) for f in t])
    return t


# The op column travels under this name from input to landing; it is never stored in data files.
OP_COLUMN = "_bitlake_op"
OPERATIONS = ("upsert", "delete")

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MICROS_PER_DAY = 86_400_000_000


def delta_to_int(value: Any, delta_type: pa.DataType) -> int:
    """A delta-column value (or a ``valid_at`` argument) as the int64 that metadata stores.

    Integers stay as they are (one above the int64 range as +infinity, which is past every stored delta value);
    dates and timestamps become microseconds since 1970-01-01 UTC (a date is its midnight UTC, a
    timestamp without a time zone is read as UTC).
    """
    if pa.types.is_integer(delta_type):
        if isinstance(value, str) and value.strip().lstrip("+-").isdigit():  # a data source option is text
            value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidInputError(f"expected an integer delta value, got {value!r}")
        if value < -DELTA_INFINITY - 1:
            raise InvalidInputError(f"delta value {value} is below the int64 range that delta values take")
        return min(value, DELTA_INFINITY)
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInputError(f"{value!r} is not an ISO-8601 time") from None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        delta = value - _EPOCH
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    if isinstance(value, dt.date):
        return (value - dt.date(1970, 1, 1)).days * MICROS_PER_DAY
    if isinstance(value, int | float):
        # A number for a timestamp column is read as seconds since the epoch.
        if value != value or value in (float("inf"), float("-inf")):
            raise InvalidInputError(f"cannot use {value!r} as a time: give a finite number of seconds since 1970")
        return int(value * 1_000_000)
    raise InvalidInputError(f"cannot use {value!r} as a value of a {delta_type} delta column")


def delta_text(value: int, delta_type: pa.DataType | None) -> str:
    """A stored delta value (an event time) as a reader writes it: ISO-8601 for a timestamp or date delta column,
    the number for an integer one (or when the type is not known), ``+infinity`` for the largest int64."""
    if value >= DELTA_INFINITY:
        return "+infinity"
    if delta_type is None or pa.types.is_integer(delta_type):
        return str(value)
    try:
        when = _EPOCH + dt.timedelta(microseconds=value)
    except OverflowError:
        return str(value)
    if pa.types.is_date(delta_type) and value % MICROS_PER_DAY == 0:
        return when.date().isoformat()
    return when.isoformat()


def deltas_as_int(column: pa.ChunkedArray | pa.Array, delta_type: pa.DataType) -> np.ndarray:
    """Vectorised :func:`delta_to_int` of a delta column (a null becomes 0: the caller refuses nulls; an unsigned
    value beyond the int64 range becomes DELTA_INFINITY, which the landing refuses)."""
    if pa.types.is_unsigned_integer(delta_type) and delta_type.bit_width == 64:
        values = column.cast(pa.uint64()).fill_null(0).to_numpy(zero_copy_only=False)
        return np.minimum(values, np.uint64(DELTA_INFINITY)).astype(np.int64)
    if pa.types.is_integer(delta_type):
        ints = column.cast(pa.int64())
    elif pa.types.is_date(delta_type):
        ints = pc.multiply(column.cast(pa.date32()).cast(pa.int32()).cast(pa.int64()), MICROS_PER_DAY)
    else:
        ints = column.cast(pa.timestamp("us", tz=delta_type.tz)).cast(pa.int64())
    return ints.fill_null(0).to_numpy(zero_copy_only=False)
