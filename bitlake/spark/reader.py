"""The Spark reader: executes a read plan (:mod:`bitlake.engine.read.plan`) as a Spark DataFrame.

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

import dataclasses
import struct
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from pyroaring import BitMap

from bitlake.engine.read.plan import ReadPlan
from bitlake.format import bitmap, datafile, rowid
from bitlake.format.commit import DataFile, SegmentState
from bitlake.fs import FileIO
from bitlake.spark import files as spark_files
from bitlake.spark import jar
from bitlake.spark.schema import spark_delta_as_long, spark_packed, spark_schema

DRIVER_EXPANSION_ROWS = 2_000_000
# The row filter's literal at most this big (a 10 % churn of 60M rows: 7.5 MB, a bit a row of the files).
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


def _filtered(spark, io: FileIO, p: ReadPlan):
    """The plan's filtered files, scanned and filtered by bitlake's row filter; None when the session lacks it
    or the dropped offsets' bitmaps are too big for a literal."""
    from pyspark.sql import functions as F

    if not jar.register(spark):
        return None
    literal = filter_literal({k: bm for k, bm in p.dropped().items() if len(bm)})
    if len(literal) > FILTER_MAX_BYTES:
        return None
    keep = F.call_udf("bitlake_keep", F.lit(literal), spark_packed())
    return scan(spark, io, p.state.metadata, p.filtered).filter(keep)


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
    columns = meta.column_names + (list(rowid.ROW_ID_COLUMNS) if include_row_ids else [])
    parts = []
    if p.whole:
        parts.append(scan(spark, io, meta, p.whole))
    filtered = _filtered(spark, io, p) if p.filtered else None
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
        return spark.createDataFrame([], spark_schema(datafile.data_schema(meta))).select(columns)
    out = parts[0]
    for df in parts[1:]:
        out = out.unionByName(df)
    if p.valid_at is not None and meta.keyed:
        out = out.filter(spark_delta_as_long(meta) <= F.lit(p.valid_at))
    for version, column, values in p.hidden:
        made_live = F.create_map(*[F.lit(x) for part, v in sorted(p.live_version.items()) for x in (part, v)])
        live = F.element_at(made_live, F.col(rowid.PART_COLUMN))
        hit = F.col(column).isin(values.to_pylist()) & (live < F.lit(version))
        out = out.filter(~F.coalesce(hit, F.lit(False)))
    return out.select(columns)
