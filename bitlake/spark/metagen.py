"""The Spark MetaGen: the second of Opal's two steps as Spark jobs, for commits too large for the driver.

It folds the batches' records with the inline MetaGen's own code (:func:`bitlake.engine.write.fold.fold`),
a set of buckets per task: the records (key, delta, row id, delete flag, bucket: derived from the data files'
columns for upserts, from the keys files for deletes) are partitioned by bucket, so that every record of a key
is in one task, and each task reads its buckets' key-store files, folds its keys against their entries as the
driver would (:func:`~bitlake.engine.write.metagen.fold_records`), writes its buckets' key-store increments and
returns its events and counts. A second stage, partitioned by segment, writes the segment log and the new
bitmaps; the driver only commits. One fold for both paths: the contract's rules are written once.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa

from bitlake.engine.keys import keycache
from bitlake.engine.write.metagen import (
    COUNTS,
    SEGMENT_ARROW,
    SEGMENT_DDL,
    Landed,
    MetaGenOutput,
    assemble,
    fold_records,
    new_segments,
    unkeyed_output,
)
from bitlake.engine.write.segments import BECOMES_VALID, write_segments
from bitlake.format import datafile, keystore, rowid
from bitlake.format.commit import BucketFile, SegmentState
from bitlake.format.metadata import TableMetadata
from bitlake.format.state import TableState
from bitlake.fs import FileIO
from bitlake.spark import files as spark_files
from bitlake.spark.schema import spark_schema, spark_typed

# A fold task's output: its events (SET_VALID_UNTIL, and BECOMES_VALID for the upserts that become valid), then
# one row whose ``report`` (JSON) holds its counts and the key-store files it wrote and replaced.
_FOLDED = pa.schema([
    (rowid.PART_COLUMN, pa.int32()), (rowid.SEQ_COLUMN, pa.int32()), (rowid.OFFSET_COLUMN, pa.int32()),
    ("event", pa.int8()), ("t", pa.int64()), ("cause", pa.int64()), ("batch_index", pa.int32()),
    ("report", pa.string()),
])
_FOLDED_DDL = (f"{rowid.PART_COLUMN} int, {rowid.SEQ_COLUMN} int, {rowid.OFFSET_COLUMN} int, event byte, t long, "
               "cause long, batch_index int, report string")


def run(spark, io: FileIO, state: TableState, batches: list[Landed], version: int) -> MetaGenOutput:
    """Computes the metadata that makes ``batches`` visible at ``version``; writes files, commits nothing."""
    from pyspark.sql import functions as F

    meta = state.metadata
    if not meta.keyed:
        return unkeyed_output(batches)
    spark_files.require_shared(io)
    records = _records(spark, io, meta, batches)
    if records is None:
        return MetaGenOutput(list(new_segments(batches).values()), [], [], [], {})
    bare = [dataclasses.replace(b, rows=None, writing=None, digesting=None) for b in batches]
    task = _FoldTask(io, spark_files.shared(spark, state), bare, version)
    folded = records.repartition(meta.num_buckets, keystore.BUCKET).mapInArrow(task, _FOLDED_DDL).persist()
    try:
        reports = [json.loads(r[0]) for r in folded.filter(F.col("report").isNotNull()).select("report").collect()]
        events = folded.filter(F.col("report").isNull()).drop("report")
        segments = _SegmentTask(io, spark_files.shared(spark, [s.to_json() for s in state.segments.values()]),
                                meta.prop("bitmap.deltas"))
        seg_out = events.repartition(rowid.PART_COLUMN, rowid.SEQ_COLUMN).mapInArrow(segments, SEGMENT_DDL).collect()
    finally:
        folded.unpersist()
    counts = np.zeros((len(batches), len(COUNTS)), dtype=np.int64)
    added, replaced = [], []
    for r in reports:
        counts += np.array(r["counts"], dtype=np.int64)
        added += [BucketFile.from_json(f) for f in r["added"]]
        replaced += r["replaced"]
    batch_counts = {i: dict(zip(COUNTS, map(int, counts[i]), strict=True)) for i in range(len(batches))}
    return assemble(state, batches, [r.asDict() for r in seg_out], added, replaced, batch_counts)


def _records(spark, io: FileIO, meta: TableMetadata, batches: list[Landed]):
    """The batches' records as keys-file rows: the upserts derived from their data files' columns by the
    driver's own code (:func:`bitlake.format.datafile.keys_of`) in the tasks, and their keys files' deletes.
    None when they have none."""
    from pyspark.sql import functions as F

    keys_schema = spark_schema(datafile.keys_schema(meta))
    parts = []
    data_paths = [f.path for b in batches for f in b.data_files]
    if data_paths:
        metadata = meta.to_json()

        def derive(batches_in):
            m = TableMetadata.from_json(metadata)
            for rb in batches_in:
                yield from spark_typed(datafile.keys_of(rb, m).to_batches())

        columns = datafile.data_schema(meta)
        upserts = pa.schema([columns.field(c) for c in datafile.upsert_columns(meta)])
        parts.append(spark_files.read(spark, io, data_paths, upserts, meta.file_format).mapInArrow(derive, keys_schema))
    key_paths = [f.path for b in batches for f in b.keys_files]
    if key_paths:
        parts.append(spark_files.read(spark, io, key_paths, datafile.keys_schema(meta)).filter(F.col(keystore.DELETED)))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])


@dataclasses.dataclass
class _FoldTask:
    """A task's records (those of a set of buckets, every record of their keys) folded against its buckets'
    key-store files, whose increments it writes: its events, then its report (:data:`_FOLDED`)."""

    io: FileIO
    state: object  # the TableState before the commit, shared with the tasks (spark_files.shared)
    batches: list[Landed]  # without their rows
    version: int

    def __call__(self, batches):
        state: TableState = self.state.value
        meta = state.metadata
        keys = datafile.keys_schema(meta)
        tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
        if not tables:
            return
        records = pa.concat_tables([t.select(keys.names).cast(keys) for t in tables])
        buckets = np.unique(records.column(keystore.BUCKET).to_numpy()).tolist()
        read = [f.path for b in [*buckets, keystore.SHARED] for f in state.keystore.get(b, [])]
        try:
            g = fold_records(self.io, state, self.batches, records, self.version, None)
        finally:
            keycache.CACHE.forget(self.io, read)  # an executor keeps no key store: its next task folds other buckets
        added, replaced = keystore.write_bucket_files(
            self.io, meta, {b: state.keystore.get(b, []) for b in buckets}, g.keystore_rows) \
            if g.keystore_rows.num_rows else ([], [])
        parts, seqs, offsets = rowid.unpack_arrays(g.valid)
        valid = pa.table({
            rowid.PART_COLUMN: parts, rowid.SEQ_COLUMN: seqs, rowid.OFFSET_COLUMN: offsets,
            "event": np.full(len(g.valid), BECOMES_VALID, np.int8), "t": np.zeros(len(g.valid), np.int64),
            "cause": g.valid, "batch_index": np.zeros(len(g.valid), np.int32),
        })
        for events in (g.until, valid):
            if events.num_rows:
                yield from events.append_column("report", pa.nulls(events.num_rows, pa.string())).cast(
                    _FOLDED).to_batches()
        report = {"counts": g.counts.tolist(), "added": [f.to_json() for f in added], "replaced": replaced}
        yield pa.RecordBatch.from_pylist([{"report": json.dumps(report)}], schema=_FOLDED)


@dataclasses.dataclass
class _SegmentTask:
    """A task's events, as one log file and one bitmap file (:func:`bitlake.engine.write.segments.write_segments`)."""

    io: FileIO
    prior: object  # the segment states before the commit, as JSON, shared with the tasks (spark_files.shared)
    deltas: str  # the table property bitmap.deltas

    def __call__(self, batches):
        batches = list(batches)
        if not batches:
            return
        prior = {(s["part"], s["seq"]): SegmentState.from_json(s) for s in self.prior.value}
        rows = write_segments(self.io, prior, pa.Table.from_batches(batches), deltas=self.deltas)
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=SEGMENT_ARROW)


