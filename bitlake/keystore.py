"""The key store: a partition-agnostic record-level index, key -> latest accepted record (Hudi RFC-08).

Keys hash into ``num_buckets`` fixed buckets (Spark's ``xxhash64`` of the key columns, seed 42,
``pmod`` the bucket count). A bucket is an ordered list of Parquet files, a base and deltas; each row
holds the key columns and:

* ``_delta``: the accepted record's delta value as int64;
* ``_row_id``: its packed row id (see :mod:`bitlake.rowid`);
* ``_deleted``: true for a delete marker, which keeps a late, older record from resurrecting the key;
* ``_ks_seq``: the commit version that wrote the row. The latest row of a key is the one with the
  highest ``_ks_seq``; merging files keeps each row's ``_ks_seq``.

A MetaGen commit writes one delta file per bucket it touches. When a bucket piles up more than
``keystore.max_deltas`` deltas, the commit merges them: into one delta while they are small against the
base, into a new base once they hold ``keystore.base_merge_ratio`` of its rows.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bitlake.schema import TableMetadata

DELTA = "_delta"
ROW_ID = "_row_id"
DELETED = "_deleted"
SEQ = "_ks_seq"
BUCKET = "_bucket"
HASH_SEED = 42


def file_schema(meta: TableMetadata) -> pa.Schema:
    return pa.schema(
        [pa.field(c, meta.schema.field(c).type, False) for c in meta.primary_key]
        + [
            pa.field(DELTA, pa.int64(), False),
            pa.field(ROW_ID, pa.int64(), False),
            pa.field(DELETED, pa.bool_(), False),
            pa.field(SEQ, pa.int64(), False),
        ]
    )


def bucket_dir(bucket: int) -> str:
    return f"_bitlake/keystore/bucket-{bucket:05d}"


def spark_bucket(meta: TableMetadata):
    from pyspark.sql import functions as F

    return F.pmod(F.xxhash64(*[F.col(c) for c in meta.primary_key]), F.lit(meta.num_buckets)).cast("int")


def latest_per_key(table: pa.Table, primary_key: list[str]) -> pa.Table:
    """Keeps, for each key, the row with the highest ``_ks_seq``; sorted by key."""
    if table.num_rows == 0:
        return table
    order = [(c, "ascending") for c in primary_key] + [(SEQ, "descending")]
    table = table.take(pc.sort_indices(table, sort_keys=order))
    first = np.zeros(table.num_rows, dtype=bool)
    first[0] = True
    for c in primary_key:
        values = table.column(c).to_numpy(zero_copy_only=False)
        first[1:] |= values[1:] != values[:-1]
    return table.filter(pa.array(first))


@dataclasses.dataclass(frozen=True)
class BucketFile:
    bucket: int
    path: str
    rows: int
    bytes: int
    base: bool

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> BucketFile:
        return cls(**d)


def merge_plan(files: list[BucketFile], new_rows: int, max_deltas: int, base_ratio: float) -> list[BucketFile]:
    """Which of a bucket's files the next delta should be merged with (empty: just add a delta).

    Tiering keeps the bytes a commit writes proportional to its batch: deltas are merged among
    themselves until together they are a sizeable fraction of the base, and only then into it.
    """
    deltas = [f for f in files if not f.base]
    if len(deltas) + 1 <= max_deltas:
        return []
    base = [f for f in files if f.base]
    delta_rows = sum(f.rows for f in deltas) + new_rows
    if not base or delta_rows >= base_ratio * base[0].rows:
        return list(files)
    return deltas
