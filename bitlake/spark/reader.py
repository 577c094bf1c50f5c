"""The Spark reader: executes a read plan (:mod:`bitlake.engine.read.plan`) as a Spark DataFrame. What Spark
executes of a plan (:func:`describe`) is also what the JVM's reader of tables named in Spark SQL executes
(bitlake.cli.planner hands it over).

Files of the plan whose rows are all kept are scanned as they are. The others are scanned and filtered by
bitlake's row filter (:mod:`bitlake.spark.jar`): the dropped offsets' bitmaps, per segment, go to the tasks as one
literal, and each row's packed row id is looked up in its segment's bitmap. Without that filter on the session's
classpath, or with bitmaps over :data:`FILTER_MAX_BYTES`, the files are left-anti joined, on the packed row id,
with the ids of the rows the plan drops: broadcast while there are fewer than ``read.broadcast_invalid_rows``,
shuffled beyond. Up to :data:`DRIVER_EXPANSION_ROWS` dropped rows the driver expands them from the bitmaps and
hands them to Spark as Arrow; beyond, executors expand them, so the driver never holds a huge list. The row filter
is preferred because after churn it reads about as fast as a plain scan, where the join costs half as much again
(docs/ingestion.md; docs/benchmarks.md, "Design measurements", "Spark reads").
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import decimal
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from bitlake.engine.read.plan import ReadPlan
from bitlake.errors import InvalidInputError
from bitlake.format import bitmap, datafile, rowid
from bitlake.format.commit import DataFile, SegmentState
from bitlake.format.metadata import TableMetadata
from bitlake.fs import FileIO
from bitlake.spark import files as spark_files
from bitlake.spark import jar
from bitlake.spark.schema import spark_packed, spark_schema

DRIVER_EXPANSION_ROWS = 2_000_000
# The row filter's literal at most this big (it holds a bit a row of the files it filters).
FILTER_MAX_BYTES = 64 << 20
_DROP_IN = "segment string, revived binary"


def filter_literal(dropped: dict[tuple[int, int], BitMap]) -> bytes:
    """The row filter's argument (bitlake/spark/jvm/KeepRow.java): a big-endian int32 count, then per segment its
    packed row-id prefix (int64), the length (int32) and the portable Roaring bitmap of its dropped offsets."""
    out = [struct.pack(">i", len(dropped))]
    for (part, seq), bm in sorted(dropped.items()):
        data = bitmap.serialize(bm)
        out.append(struct.pack(">qi", rowid.segment_key(part, seq), len(data)))
        out.append(data)
    return b"".join(out)


@dataclasses.dataclass(frozen=True)
class SparkRead:
    """A read plan as Spark executes it, shared by this module's reader and the JVM's (bitlake.cli.planner):
    the files scanned as they are (``whole``) and those filtered by the row filter (``filtered``, with its
    literal ``keep``), then ``conditions``, Spark SQL conditions on the rows (the event-time bound, the
    tombstones), and the view's ``columns``."""

    io: FileIO
    file_format: str
    schema: pa.Schema  # the data files' columns, the row-id columns among them
    columns: list[str]
    whole: list[str]
    filtered: list[str]
    keep: bytes | None
    conditions: list[str]

    def to_json(self) -> dict[str, Any]:
        """The description as the JVM takes it: the files as Spark addresses them, the schema as Spark's JSON."""
        return {"format": self.file_format, "schema": spark_schema(self.schema).json(), "columns": self.columns,
                "whole": [self.io.uri(f) for f in self.whole], "filtered": [self.io.uri(f) for f in self.filtered],
                "keep": base64.b64encode(self.keep).decode() if self.keep is not None else None,
                "conditions": self.conditions, "spark_readable": self.io.spark_readable}


def describe(io: FileIO, p: ReadPlan, include_row_ids: bool = False) -> SparkRead:
    """The Spark execution of ``p`` (:class:`SparkRead`)."""
    meta = p.state.metadata
    keep = filter_literal({k: bm for k, bm in p.dropped().items() if len(bm)}) if p.filtered else None
    return SparkRead(io, meta.file_format, datafile.data_schema(meta),
                     meta.column_names + (list(rowid.ROW_ID_COLUMNS) if include_row_ids else []),
                     [f.path for f in p.whole], [f.path for f in p.filtered], keep, conditions(p))


def conditions(p: ReadPlan) -> list[str]:
    """The plan's conditions on rows as Spark SQL: an event-time view keeps the rows whose delta value is at most
    its time; a tombstone hides the rows of parts made live before it whose column holds one of its values."""
    meta = p.state.metadata
    out = []
    if p.event_time:
        out.append(f"{delta_as_long(meta)} <= {int(p.valid_at)}")
    for version, column, values in p.hidden:
        parts = sorted(part for part, v in p.live_version.items() if v < version)
        shown = [sql_literal(x, values.type) for x in values.to_pylist() if x is not None]
        if parts and shown:
            hit = f"{quote(column)} IN ({', '.join(shown)}) AND {quote(rowid.PART_COLUMN)} IN " \
                  f"({', '.join(map(str, parts))})"
            out.append(f"NOT coalesce({hit}, false)")
    return out


def packed_sql() -> str:
    """The packed row id as Spark SQL (as :func:`bitlake.spark.schema.spark_packed`)."""
    part, seq, offset = (quote(c) for c in rowid.ROW_ID_COLUMNS)
    return (f"(shiftleft(CAST({part} AS BIGINT), {rowid.PART_SHIFT}) | shiftleft(CAST({seq} AS BIGINT), "
            f"{rowid.OFFSET_BITS}) | CAST({offset} AS BIGINT))")


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def delta_as_long(meta: TableMetadata) -> str:
    """The delta column as Spark SQL of the int64 that metadata holds (``format.metadata.delta_to_int``)."""
    assert meta.delta_column is not None
    column, t = quote(meta.delta_column), meta.delta_type
    if pa.types.is_integer(t):
        return f"CAST({column} AS BIGINT)"
    if pa.types.is_date(t):
        return f"(CAST(unix_date({column}) AS BIGINT) * 86400000000)"
    return f"unix_micros(CAST({column} AS TIMESTAMP))"


def sql_literal(value: Any, t: pa.DataType) -> str:
    """``value`` (of Arrow type ``t``) as a Spark SQL literal of the same value; strings as their UTF-8 bytes,
    so no character needs escaping."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"CAST('{value!r}' AS DOUBLE)" if pa.types.is_float64(t) else f"CAST('{value!r}' AS FLOAT)"
    if isinstance(value, decimal.Decimal):
        return f"CAST('{value}' AS DECIMAL({t.precision}, {t.scale}))"
    if isinstance(value, str):
        return f"CAST(X'{value.encode().hex()}' AS STRING)"
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            return f"TIMESTAMP_NTZ'{value.isoformat(sep=' ')}'"
        micros = (value - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)) // datetime.timedelta(microseconds=1)
        return f"timestamp_micros({micros})"
    if isinstance(value, datetime.date):
        return f"DATE'{value.isoformat()}'"
    raise InvalidInputError(f"a tombstone value {value!r} of type {t} has no Spark SQL literal here")


def _filtered(spark, d: SparkRead):
    """The description's filtered files, scanned and filtered by bitlake's row filter; None when the session
    lacks it or the dropped offsets' bitmaps are too big for a literal."""
    from pyspark.sql import functions as F

    if d.keep is None or not jar.register(spark) or len(d.keep) > FILTER_MAX_BYTES:
        return None
    keep = F.call_udf("bitlake_keep", F.lit(d.keep), spark_packed())
    return spark_files.read(spark, d.io, d.filtered, d.schema, d.file_format).filter(keep)


def _dropped(p: ReadPlan) -> Iterator[pa.RecordBatch]:
    """Packed row ids of the rows the plan drops from its filtered files (a compacted file's own, not its
    segments': the rows compaction moved to history files are not in the join)."""
    for key, offsets in sorted(p.dropped().items()):
        if len(offsets):
            ids = bitmap.to_array(offsets) | np.int64(rowid.segment_key(*key))
            yield pa.RecordBatch.from_arrays([pa.array(ids, pa.int64())], ["_invalid"])


@dataclasses.dataclass
class _ExpandDropped:
    """Executor side of :func:`_dropped`, for segments given as rows of (segment state JSON, revived bitmap)."""

    io: FileIO

    def __call__(self, batches):
        import json

        from pyroaring import BitMap

        cache = bitmap.BitmapCache(self.io)
        for rb in batches:
            for r in rb.to_pylist():
                s = SegmentState.from_json(json.loads(r["segment"]))
                kept = cache.valid(s) | BitMap.deserialize(r["revived"])
                ids = bitmap.invalid_offsets(kept, s.offsets) | np.int64(rowid.segment_key(s.part, s.seq))
                if len(ids):
                    yield pa.RecordBatch.from_arrays([pa.array(ids, pa.int64())], ["_invalid"])


def scan(spark, io: FileIO, meta, files: list[DataFile]):
    return spark_files.read(spark, io, [f.path for f in files], datafile.data_schema(meta), meta.file_format)


def read(spark, io: FileIO, p: ReadPlan, include_row_ids: bool = False):
    """The view ``p`` plans, as a Spark DataFrame."""
    from pyspark.sql import functions as F

    meta = p.state.metadata
    d = describe(io, p, include_row_ids)
    parts = []
    if p.whole:
        parts.append(scan(spark, io, meta, p.whole))
    filtered = _filtered(spark, d) if p.filtered else None
    if filtered is not None:
        parts.append(filtered)
    elif p.filtered:
        segments = sorted(p.segments)
        invalid = p.invalid_rows()
        if invalid <= DRIVER_EXPANSION_ROWS:
            # One Arrow transfer instead of a Spark job with a Python worker: at a few MB it is the cheaper
            # way, and this fixed cost is most of what a read of a small table pays.
            batches = list(_dropped(p))
            ids = spark.createDataFrame(pa.Table.from_batches(batches, schema=pa.schema([("_invalid", pa.int64())])))
        else:
            import json

            rows = [(json.dumps(p.segments[k].to_json()), bitmap.serialize(bitmap.of(p.revived.get(k, np.empty(0)))))
                    for k in segments]
            ids = (
                spark.createDataFrame(rows, _DROP_IN)
                .repartition(max(1, min(len(rows), spark_files.parallelism(spark))))
                .mapInArrow(_ExpandDropped(io), "_invalid long")
            )
        if invalid <= meta.int_prop("read.broadcast_invalid_rows"):
            ids = F.broadcast(ids)
        parts.append(scan(spark, io, meta, p.filtered).join(ids, spark_packed() == F.col("_invalid"), "left_anti"))
    if not parts:
        return spark.createDataFrame([], spark_schema(d.schema)).select(d.columns)
    out = parts[0]
    for df in parts[1:]:
        out = out.unionByName(df)
    for condition in d.conditions:
        out = out.filter(F.expr(condition))
    return out.select(d.columns)
