"""Current-view reads in Spark: the committed data files, rows filtered by the bitmaps.

The plan is chosen per file from the segment counts in the commit log: a file whose segments are
fully valid is scanned plainly; a file whose segments have no valid row is skipped; the rest are
scanned and left-anti-joined on the packed 64-bit row id with the invalid row ids, which the driver
expands from the bitmap files up to ``DRIVER_EXPANSION_ROWS`` and executors beyond. That list is
broadcast while it is shorter than ``read.broadcast_invalid_rows`` and shuffled beyond.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from bitlake import bitmap, rowid
from bitlake.commitlog import DataFile
from bitlake.fs import FileIO
from bitlake.spark.landing import DATA_DIR, data_schema
from bitlake.state import TableState

_INVALID_IN = "path string, part int, seq int, offsets long"


# Up to this many invalid rows the driver expands them from the bitmaps itself and hands them to
# Spark as Arrow (a few MB); beyond, executors expand them, so the driver never holds a huge list.
DRIVER_EXPANSION_ROWS = 2_000_000


def _invalid_ids(cache: bitmap.BitmapCache, rows) -> Iterator[pa.RecordBatch]:
    """Packed row ids of the invalid rows of segments given as dicts of path, part, seq, offsets."""
    for r in rows:
        bm = cache.get(r["path"], r["part"], r["seq"])
        offsets = bitmap.invalid_offsets(bm, r["offsets"]).astype(np.int64)
        if len(offsets):
            ids = offsets | np.int64(rowid.segment_key(r["part"], r["seq"]))
            yield pa.RecordBatch.from_arrays([pa.array(ids, pa.int64())], ["_invalid"])


@dataclasses.dataclass
class _InvalidIds:
    base: str

    def __call__(self, batches):
        import os

        cache = bitmap.BitmapCache(lambda p: os.path.join(self.base, p))
        for rb in batches:
            yield from _invalid_ids(cache, rb.to_pylist())


def plan_files(state: TableState, past_events: bool = False) -> tuple[list[DataFile], list[DataFile], int]:
    """Splits the visible data files into (clean, dirty) and returns the invalid-row count of dirty ones.

    With ``past_events`` (an event-time read) a segment with no valid row now may still hold rows
    valid at that time, so it is read as dirty instead of skipped.
    """
    clean, dirty, invalid = [], [], 0
    dirty_segments = set()
    for f in state.data_files():
        s = state.segments.get(f.segment)
        if s is None or (s.cardinality == 0 and not past_events):
            continue
        if s.cardinality >= s.data_rows:
            clean.append(f)
        else:
            dirty.append(f)
            if f.segment not in dirty_segments:
                dirty_segments.add(f.segment)
                invalid += s.offsets - s.cardinality
    return clean, dirty, invalid


def scan(spark, io: FileIO, state: TableState, files: list[DataFile]):
    from bitlake.schema import spark_schema

    meta = state.metadata
    reader = spark.read.format(meta.file_format).schema(spark_schema(data_schema(meta)))
    if meta.partition_by:
        reader = reader.option("basePath", io.path(DATA_DIR))
    return reader.load([io.path(f.path) for f in files])


def read(spark, io: FileIO, state: TableState, include_row_ids: bool = False, valid_at: int | None = None):
    """The view of ``state`` as a Spark DataFrame: current, or at event time ``valid_at`` (see timetravel)."""
    from pyspark.sql import functions as F

    from bitlake.schema import spark_delta_as_long, spark_schema

    meta = state.metadata
    columns = meta.column_names + (list(rowid.ROW_ID_COLUMNS) if include_row_ids else [])
    clean, dirty, invalid = plan_files(state, past_events=valid_at is not None)
    parts = []
    if clean:
        parts.append(scan(spark, io, state, clean))
    if dirty:
        segments = sorted({f.segment for f in dirty})
        rows = [(state.segments[k].bitmap, k[0], k[1], state.segments[k].offsets) for k in segments]
        if invalid <= DRIVER_EXPANSION_ROWS:
            # One Arrow transfer instead of a Spark job with a Python worker: at a few MB it is the
            # cheaper way, and this fixed cost is most of what a read of a small table pays.
            cache = bitmap.BitmapCache(io.path)
            named = [dict(zip(("path", "part", "seq", "offsets"), r, strict=True)) for r in rows]
            batches = list(_invalid_ids(cache, named))
            ids_table = pa.Table.from_batches(batches, schema=pa.schema([("_invalid", pa.int64())]))
            ids = spark.createDataFrame(ids_table)
        else:
            ids = (
                spark.createDataFrame(rows, _INVALID_IN)
                .repartition(max(1, min(len(rows), spark.sparkContext.defaultParallelism)))
                .mapInArrow(_InvalidIds(io.base), "_invalid long")
            )
        if valid_at is not None:
            ids = ids.join(_revived(spark, io, state, valid_at), F.col("_invalid") == F.col("_revived"), "left_anti")
        if invalid <= meta.int_prop("read.broadcast_invalid_rows"):
            ids = F.broadcast(ids)
        df = scan(spark, io, state, dirty)
        parts.append(df.join(ids, rowid.spark_packed() == F.col("_invalid"), "left_anti"))
    if not parts:
        schema = spark_schema(data_schema(meta))
        return spark.createDataFrame([], schema).select(columns)
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    if valid_at is not None and meta.keyed:
        out = out.filter(spark_delta_as_long(meta) <= F.lit(valid_at))
    return out.select(columns)


def _revived(spark, io: FileIO, state: TableState, valid_at: int):
    """Row ids superseded only after ``valid_at``: valid at that event time though invalid now."""
    from pyspark.sql import functions as F

    from bitlake import segmentlog, timetravel

    paths = timetravel.log_files_after(state, valid_at)
    if not paths:
        return spark.createDataFrame([], "_revived long")
    events = spark.read.schema(segmentlog.FILE_SCHEMA_DDL).parquet(*[io.path(p) for p in paths])
    events = events.filter((F.col("event") == segmentlog.SET_VALID_UNTIL) & (F.col("t") > F.lit(valid_at)))
    return events.select(rowid.spark_packed().alias("_revived"))
