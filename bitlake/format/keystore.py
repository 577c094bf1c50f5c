"""The key store: a partition-agnostic record-level index, key -> latest accepted record (Hudi RFC-08;
docs/FORMAT.md, "Key store").

Keys hash into ``num_buckets`` fixed buckets (:mod:`bitlake.format.bucket`). A bucket is an ordered list of
Parquet files, a base and increments; each row holds the key columns and:

* ``_delta``: the accepted record's delta value as int64;
* ``_row_id``: its packed row id;
* ``_deleted``: true for a delete marker, which keeps a late, older record from resurrecting the key;
* ``_ks_version``: the commit version that wrote the row. A key's entry is its row with the highest
  ``_ks_version`` across the bucket's files; merging files keeps each row's ``_ks_version``.

A MetaGen commit writes one increment per bucket it touches. When a bucket piles up more than
``keystore.max_increments`` increments, the commit merges them: into one increment while they are small
against the base, into a new base once they hold ``keystore.base_merge_ratio`` of its rows (a base may be several
files, one a range of keys of a spilled load).

A small commit on the driver writes one **shared** file instead, listed under :data:`SHARED`: its rows of every
bucket, in key order. A key's entry is then its row of the highest ``_ks_version`` across its bucket's files and
the shared files. Once ``keystore.max_increments`` shared files are listed, the next commit that would add one
writes its rows and theirs into the buckets' files (each bucket's increment, merged by its own plan) and removes
them: a small commit writes one file, not one a bucket (each file costs its creation and encoding, more than a
small commit's rows, and a request on an object store), and the buckets take a shared file's rows once every few
commits (docs/benchmarks.md, "Design measurements", "Key store").
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bitlake.format import bucket, layout
from bitlake.format.commit import BucketFile
from bitlake.format.metadata import TableMetadata
from bitlake.format.order import key_spans, non_decreasing, pack, strictly_increasing
from bitlake.format.protocol import KEYS_FILE_ENTRIES, SHARED_KEYSTORE_FILES
from bitlake.fs import FileIO
from bitlake.pool import thread_map

DELTA = "_delta"
ROW_ID = "_row_id"
DELETED = "_deleted"
VERSION = "_ks_version"
BUCKET = "_bucket"
SHARED = -1  # the "bucket" under which the key store lists its shared files
_TIER_RATIO = 2  # merge_plan: an increment joins the new rows while it holds at most this many times the rows gathered
AT_ONCE_ROWS = 65_536  # write_bucket_files: a commit of at most this many rows prepares its buckets' rows at once
# A batch of deletes alone of at most this many rows lists its keys file as a shared file (docs/FORMAT.md, "Keys
# files as entries"): listing writes nothing, where a bucket file a bucket cost a third of what a delete of 180 K keys
# wrote at TPC-H SF 30; the rows reach the buckets' files when the shared files are folded in.
LISTED_ROWS = 1 << 20


def file_schema(meta: TableMetadata) -> pa.Schema:
    return pa.schema(
        [pa.field(c, meta.schema.field(c).type, False) for c in meta.primary_key]
        + [
            pa.field(DELTA, pa.int64(), False),
            pa.field(ROW_ID, pa.int64(), False),
            pa.field(DELETED, pa.bool_(), False),
            pa.field(VERSION, pa.int64(), False),
        ]
    )


def parquet_options(schema: pa.Schema) -> dict:
    """Keys files and key-store files are read only by MetaGen, so they take zstd; they are sorted by row id or
    by key, so row ids, deltas and integer keys are close to their neighbours, which DELTA_BINARY_PACKED
    stores in a few bits, where dictionaries store every distinct value (docs/benchmarks.md, "Design measurements",
    "Key store")."""

    def packed(f: pa.Field) -> bool:
        t = f.type
        return f.name not in (DELETED, BUCKET) and (
            pa.types.is_integer(t) or pa.types.is_date32(t) or pa.types.is_timestamp(t))

    names = [f.name for f in schema if packed(f)]
    return {
        "compression": "zstd",
        "use_dictionary": [n for n in schema.names if n not in names],
        "column_encoding": dict.fromkeys(names, "DELTA_BINARY_PACKED"),
    }


def read_file(io: FileIO, f: BucketFile, meta: TableMetadata, columns: list[str] | None = None,
              filters=None) -> pa.Table:
    """The rows of key-store file ``f`` (``columns`` of them, those that pass ``filters``), as :func:`file_schema`
    has them: a keys file listed as one (``f.version``) gives its records' key columns, delta values, row ids and
    delete flags, each at that version."""
    schema = file_schema(meta)
    if f.version is None:
        return pq.read_table(io.open_input(f.path), schema=schema, columns=columns, filters=filters)
    stored = pa.schema([schema.field(n) for n in schema.names if n != VERSION])
    rows = pq.read_table(io.open_input(f.path), columns=stored.names).cast(stored)
    rows = rows.append_column(schema.field(VERSION), pa.array(np.full(rows.num_rows, f.version, np.int64)))
    if filters is not None:
        rows = rows.filter(pq.filters_to_expression(filters))
    return rows.select(columns) if columns is not None else rows


def _constant_columns(table: pa.Table, names: list[str]) -> tuple[pa.Table, dict[str, pa.Scalar]]:
    """``table`` without those of columns ``names`` that hold one value throughout, and that value by name: a
    large commit's buckets repeat it rather than gather it (a load's deltas, delete flags and versions)."""
    constant = {}
    for name in names:
        values = table.column(name).to_numpy()
        if len(values) and (values == values[0]).all():
            constant[name] = pa.scalar(values[0].item(), table.schema.field(name).type)
    return table.drop_columns(list(constant)), constant


def latest_per_key(table: pa.Table, primary_key: list[str]) -> pa.Table:
    """Keeps, for each key, the row with the highest ``_ks_version``; sorted by key."""
    if table.num_rows == 0 or in_key_order(table, primary_key):
        return table
    order = [(c, "ascending") for c in primary_key] + [(VERSION, "descending")]
    table = table.take(pc.sort_indices(table, sort_keys=order))
    first = np.zeros(table.num_rows, dtype=bool)
    first[0] = True
    for c in primary_key:
        values = table.column(c).to_numpy(zero_copy_only=False)
        first[1:] |= values[1:] != values[:-1]
    return table.filter(pa.array(first))


def in_key_order(table: pa.Table, primary_key: list[str]) -> bool:
    """Whether ``table``'s rows (keys not null) are in strictly ascending key order: one row a key, sorted."""
    return bool(_ascending_pairs(table, primary_key).all())


def _ascending_pairs(table: pa.Table, primary_key: list[str]) -> np.ndarray:
    """For each row but the last, whether the next row's key is above its own (keys compared column by column)."""
    n = table.num_rows
    if n < 2:
        return np.ones(0, dtype=bool)
    above, tied = np.zeros(n - 1, dtype=bool), np.ones(n - 1, dtype=bool)
    for c in primary_key:
        column = table.column(c)
        after, before = column.slice(1), column.slice(0, n - 1)
        above |= tied & pc.greater(after, before).to_numpy(zero_copy_only=False)
        tied &= pc.equal(after, before).to_numpy(zero_copy_only=False)
    return above


def read_bucket(io: FileIO, files: list[BucketFile], meta: TableMetadata, more: tuple[pa.Table, ...] = ()
                ) -> pa.Table:
    """A bucket's entries: the latest row of each key across its files (and the rows ``more``)."""
    rows = [read_file(io, f, meta) for f in files] + [t for t in more if t.num_rows]
    return latest_per_key(pa.concat_tables(rows) if rows else file_schema(meta).empty_table(), list(meta.primary_key))


def read_entries(io: FileIO, bucket_files: dict[int, list[BucketFile]], meta: TableMetadata) -> list[pa.Table]:
    """Every key's entry, a table a bucket: each bucket's files with its rows of the shared files."""
    shared = [read_file(io, f, meta) for f in bucket_files.get(SHARED, [])]
    rows = with_buckets(pa.concat_tables(shared), meta) if shared else None
    of_row = rows.column(BUCKET).to_numpy() if rows is not None else np.zeros(0, np.int32)
    out = []
    for b in sorted(({*bucket_files} - {SHARED}) | set(np.unique(of_row).tolist())):
        more = (rows.filter(pa.array(of_row == b)).drop_columns([BUCKET]),) if rows is not None else ()
        out.append(read_bucket(io, bucket_files.get(b, []), meta, more))
    return [t for t in out if t.num_rows]


def merge_plan(files: list[BucketFile], new_rows: int, max_increments: int, base_ratio: float, due: bool = False
               ) -> list[BucketFile]:
    """Which of a bucket's files the next increment should be merged with (empty: just add it).

    Tiering keeps the bytes a commit writes proportional to its batch: increments are merged among themselves
    by size, as RocksDB's universal compaction merges sorted runs, and into the base once together they hold
    ``base_ratio`` of its rows. The new rows take the newest increments while each holds at most
    ``_TIER_RATIO`` times the rows gathered so far (a larger one waits for others of its size), so a row is
    rewritten a few times before it reaches the base, not at every merge: a 100-key batch after a 10 % batch no
    longer rewrites that batch's increment (simulated: 4-8 rows rewritten a row added, where merging every
    increment rewrote 15-190). They merge when the bucket would pass ``max_increments``, or earlier, from half as
    many, at the commits where its turn is ``due`` (:func:`merge_due`), so that the buckets a commit writes do
    not all merge in that same commit. Past the limit with the newest increments too large to take, the new
    rows take the adjacent increments that cost the fewest rows a file merged away.
    """
    increments = [f for f in files if not f.base]
    if not (len(increments) + 1 > max_increments or (due and len(increments) >= max(1, max_increments // 2))):
        return []
    base = [f for f in files if f.base]
    increment_rows = sum(f.rows for f in increments) + new_rows
    # A bucket's base may be several files (a spilled load writes one a range of keys): their rows together.
    if not base or increment_rows >= base_ratio * sum(f.rows for f in base):
        return list(files)
    take, gathered = 0, new_rows
    for f in reversed(increments):
        if f.rows > _TIER_RATIO * gathered:
            break
        take, gathered = take + 1, gathered + f.rows
    need = len(increments) + 1 - max_increments  # files to merge away to stay within the limit
    if take >= need:
        return increments[len(increments) - take:]
    # The newest increments are too large: the new rows take the run of adjacent increments that costs the fewest
    # rows a file merged away (the longer run on a tie), wherever it is: a key's entry is its row with the highest
    # version in any of the bucket's files.
    rows = np.cumsum([0] + [f.rows for f in increments])
    runs = [(a, b) for a in range(len(increments)) for b in range(a + need, len(increments) + 1)]
    a, b = min(runs, key=lambda r: ((rows[r[1]] - rows[r[0]] + new_rows) / (r[1] - r[0]), r[0] - r[1]))
    return increments[a:b]


def merge_due(bucket: int, version: int, max_increments: int) -> bool:
    """Whether the commit ``version`` is bucket ``bucket``'s turn to merge its increments: one commit in
    ``max_increments``, at a phase that differs between neighbouring buckets. A batch writes to most buckets,
    so without turns every bucket would reach ``max_increments`` in the same commit and merge in it, and every
    ``max_increments``-th commit would take the merges of the whole key store, many times a small batch's usual
    time; with them a commit merges about one bucket in ``max_increments`` (docs/benchmarks.md, "Design
    measurements", "Key store")."""
    return (version + bucket) % max(1, max_increments) == 0


def features(added: list[BucketFile] | tuple[BucketFile, ...]) -> tuple[str, ...]:
    """The protocol features a commit adding the key-store files ``added`` uses."""
    return (*((SHARED_KEYSTORE_FILES,) if any(f.bucket == SHARED for f in added) else ()),
            *((KEYS_FILE_ENTRIES,) if any(f.version is not None for f in added) else ()))


def with_buckets(table: pa.Table, meta: TableMetadata) -> pa.Table:
    """Key-store rows with their ``_bucket`` column, computed from their keys (a shared file's rows)."""
    return table.append_column(BUCKET, pa.array(bucket.buckets(table, list(meta.primary_key), meta.num_buckets)))


def shares(bucket_files: dict[int, list[BucketFile]], rows: int, meta: TableMetadata, limit: int = AT_ONCE_ROWS
           ) -> bool:
    """Whether :func:`write_bucket_files` with ``shared`` writes a commit's ``rows`` key-store rows as one new shared
    file: a commit of at most ``limit`` rows while fewer than ``keystore.max_increments`` are listed (a listed keys
    file: at most :data:`LISTED_ROWS`)."""
    return 0 < rows <= limit and len(bucket_files.get(SHARED, [])) < meta.int_prop("keystore.max_increments")


def write_bucket_files(io: FileIO, meta: TableMetadata, bucket_files: dict[int, list[BucketFile]],
                        rows: pa.Table, written: Callable[[str, pa.Table], None] | None = None,
                        read: Callable[[BucketFile], pa.Table] | None = None, shared: bool = False
                        ) -> tuple[list[BucketFile], list[str]]:
    """Writes the key-store rows ``rows`` of one commit (key-store columns plus ``_bucket``): one file per bucket in
    them, merged with older files of the bucket when its plan says so; or, when ``shared`` and the commit is small,
    one shared file while fewer than ``keystore.max_increments`` are listed, else the shared files' rows with the
    commit's into the buckets' files. ``bucket_files`` holds the key store's files by bucket (every bucket the rows
    may reach, and :data:`SHARED`). Returns the files added and the paths they replace; ``written`` is called with
    each file's path and rows; ``read`` gives a file's rows (by default :func:`read_file`)."""
    schema = file_schema(meta)
    pk = list(meta.primary_key)
    added: list[BucketFile] = []
    replaced: list[str] = []
    max_increments = meta.int_prop("keystore.max_increments")
    version = int(pc.max(rows.column(VERSION)).as_py() or 0) if rows.num_rows else 0  # this commit's version
    pending = bucket_files.get(SHARED, []) if shared else []
    if shared and 0 < rows.num_rows <= AT_ONCE_ROWS:
        if shares(bucket_files, rows.num_rows, meta):
            new = latest_per_key(rows.select(schema.names).cast(schema), pk)
            return [_write_file(io, SHARED, new, False, written)], []
        # The shared files' rows join the commit's, a key's row of the highest version kept: then sorted by bucket
        # and key, each bucket's rows are a slice in key order, as a small commit's.
        stored = [with_buckets(read(f) if read else read_file(io, f, meta), meta) for f in pending]
        rows = _latest_by_bucket(pa.concat_tables([*(t.select(rows.column_names).cast(rows.schema) for t in stored),
                                                   rows]), pk)
        replaced.extend(f.path for f in pending)
    # A small commit's rows (and those taken in from shared files) are sorted by bucket (stable: on 16 bits numpy
    # sorts by radix), taken, cast and checked for key order at once, each bucket a slice: per bucket those steps
    # cost more than the rows (a 100-row commit wrote 16 files). A large commit's buckets find and take their rows
    # on their threads, in parallel, each what it needs in memory: one sort of a load's rows would run alone, and in
    # a process growing to its peak it pays for every new page (docs/benchmarks.md, "Design measurements"); rows
    # already by bucket (a large MetaGen's: it takes them in the key index's order) are a slice a bucket.
    of_row = rows.column(BUCKET).to_numpy().astype(np.uint16)
    counts = np.bincount(of_row)
    buckets = np.flatnonzero(counts)
    ends = np.cumsum(counts)[buckets]
    starts = ends - counts[buckets]
    columns = rows.select(schema.names)
    at_once = rows.num_rows <= AT_ONCE_ROWS or bool(replaced)
    if at_once:
        by_bucket = np.argsort(of_row, kind="stable")
        columns = (columns if strictly_increasing(by_bucket) else columns.take(pa.array(by_bucket))).cast(schema)
        # Where the next row's key is not above this row's: a bucket without one is in key order, one row a key.
        disorder = np.r_[0, np.cumsum(~_ascending_pairs(columns, pk))]
    else:
        columns, constant = _constant_columns(columns.cast(schema), [DELTA, DELETED, VERSION])
    sliced = not at_once and non_decreasing(of_row)

    def write(span: tuple[int, int, int]) -> tuple[BucketFile, list[str]]:
        bucket, start, end = span
        if at_once:
            new, ordered = columns.slice(start, end - start), disorder[end - 1] == disorder[start]
        else:
            if sliced:
                taken = columns.slice(start, end - start)
            else:
                rows_of = np.flatnonzero(of_row == bucket)
                taken = columns if len(rows_of) == columns.num_rows else columns.take(pa.array(rows_of))
            new = pa.table({f.name: taken.column(f.name) if f.name in taken.column_names
                            else pa.repeat(constant[f.name], end - start) for f in schema}, schema=schema)
            ordered = False
        files = bucket_files.get(bucket, [])
        merge = merge_plan(files, new.num_rows, max_increments, float(meta.prop("keystore.base_merge_ratio")),
                           due=merge_due(bucket, version, max_increments))
        if merge:
            new = pa.concat_tables([read(f) if read else read_file(io, f, meta) for f in merge] + [new])
        if merge or not ordered:
            new = latest_per_key(new, pk)
        # A bucket's first file, and a merge of all its files, is its new base.
        return _write_file(io, bucket, new, not files or len(merge) == len(files), written), [f.path for f in merge]

    for file, merged in thread_map(write, zip(buckets.tolist(), starts.tolist(), ends.tolist(), strict=True)):
        added.append(file)
        replaced.extend(merged)
    return added, replaced


def _latest_by_bucket(rows: pa.Table, pk: list[str]) -> pa.Table:
    """``rows`` (key-store rows with ``_bucket``: runs in key order, one a commit, in the order of their versions)
    with each key's row of the highest version, sorted by bucket and key. Integer keys are packed into one int64 a
    row and sorted stably, which keeps a key's rows in run order and merges the runs faster than Arrow's sort of
    several columns (docs/benchmarks.md, "Design measurements", "Key store"); other keys, or runs out of version
    order, take :func:`latest_per_key` by bucket and key."""
    by = [BUCKET, *pk]
    spans = None
    if all(pa.types.is_integer(rows.schema.field(c).type) for c in by):
        columns = [rows.column(c).to_numpy().astype(np.int64) for c in by]
        spans = key_spans(columns)
    if spans is None:
        return latest_per_key(rows, by)
    packed = pack(columns, spans)
    order = np.argsort(packed, kind="stable")
    packed, versions = packed[order], rows.column(VERSION).to_numpy()[order]
    later = packed[1:] == packed[:-1]  # the next row is the same key's
    if np.any(later & (versions[1:] < versions[:-1])):
        return latest_per_key(rows, by)
    last = np.ones(len(order), dtype=bool)  # of a bucket and key's rows, the last: its highest version
    last[:-1] = ~later
    return rows.take(pa.array(order[last]))


def _write_file(io: FileIO, bucket: int, rows: pa.Table, base: bool,
                written: Callable[[str, pa.Table], None] | None) -> BucketFile:
    path = layout.keystore_path(bucket)
    with io.open_output(path) as out:
        # Readers pass the file schema, and filter by version alone: the footer need not repeat the Arrow schema
        # nor carry other statistics (a third of a small increment's bytes).
        pq.write_table(rows, out, **parquet_options(rows.schema), store_schema=False, write_statistics=[VERSION])
    if written is not None:
        written(path, rows)
    return BucketFile(bucket, path, rows.num_rows, io.size(path), base)
