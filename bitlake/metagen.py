"""MetaGen without Spark: the writers both MetaGens share, and the inline MetaGen.

MetaGen turns landed batches into the metadata that makes them visible: segment-log events, new
current bitmaps, key-store deltas and counts. Two implementations apply the same semantics contract:

* the Spark MetaGen (:mod:`bitlake.spark.metagen`) joins the batches with the key-store buckets they
  touch and folds each key with window functions; its cost grows with those buckets;
* the inline MetaGen (:func:`run_inline`, Opal's "inline metadata update") runs on the driver: it
  reads the batches' keys files, looks their keys up in the key index (:mod:`bitlake.keyindex`), or
  for large batches semi-joins them with the key store, and folds them in order; with lookups its
  cost grows with the batch only.

Both write their files with :func:`write_segments` and :func:`write_bucket_deltas`, which the Spark
MetaGen calls inside its tasks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bitlake import bitmap, keystore, rowid, segmentlog
from bitlake.commitlog import Batch, LogFile, SegmentState
from bitlake.fs import FileIO
from bitlake.keystore import BucketFile
from bitlake.schema import TableMetadata
from bitlake.state import TableState

LOGS_DIR = "_bitlake/logs"
BITMAPS_DIR = "_bitlake/bitmaps"

COUNTS = ("inserted", "updated", "deleted", "stale", "ignored_deletes")


@dataclasses.dataclass
class MetaGenOutput:
    segments: list[SegmentState]
    logs: list[LogFile]
    keystore_add: list[BucketFile]
    keystore_remove: list[str]
    batch_counts: dict[int, dict[str, int]]  # batch index -> counts

    def counts(self) -> dict[str, int]:
        return {k: sum(c[k] for c in self.batch_counts.values()) for k in COUNTS}

    def written(self) -> list[str]:
        paths = [f.path for f in self.logs] + [f.path for f in self.keystore_add]
        return paths + sorted({s.bitmap for s in self.segments if s.bitmap})


def new_segments(batches: list[Batch]) -> dict[tuple[int, int], SegmentState]:
    """The segments the batches landed: offsets handed out (every record of a keyed table is in its
    keys file; an unkeyed table has data files only) and rows in data files."""
    out: dict[tuple[int, int], SegmentState] = {}
    for b in batches:
        keyed = any(f.kind == "keys" for f in b.files)
        for f in b.files:
            s = out.get(f.segment) or SegmentState(f.segment_part, f.segment_seq, 0, 0)
            data = f.rows if f.kind == "data" else 0
            offsets = f.rows if (f.kind == "keys") == keyed else 0
            out[f.segment] = dataclasses.replace(s, offsets=s.offsets + offsets, data_rows=s.data_rows + data)
    return out


def unkeyed_output(batches: list[Batch]) -> MetaGenOutput:
    """Append-only: every landed row is valid, which the counts say without a bitmap."""
    segments = [dataclasses.replace(s, cardinality=s.data_rows) for s in new_segments(batches).values()]
    counts = {i: {**dict.fromkeys(COUNTS, 0), "inserted": b.records} for i, b in enumerate(batches)}
    return MetaGenOutput(segments, [], [], [], counts)


def assemble(
    state: TableState, batches: list[Batch], seg_out: list[dict], ks_out: list[dict], batch_counts: dict
) -> MetaGenOutput:
    """The output from what the writers reported (rows of :data:`SEGMENT_ARROW` and :data:`KEYSTORE_ARROW`)."""
    segments = new_segments(batches)
    logs = []
    for r in seg_out:
        if r["kind"] == "log":
            logs.append(LogFile(r["path"], r["events"], r["bytes"], r["min_t"], r["max_t"]))
            continue
        key = (r["part"], r["seq"])
        current = segments.get(key) or state.segments[key]
        segments[key] = dataclasses.replace(current, bitmap=r["path"], cardinality=r["events"])
    ks_add, ks_remove = [], []
    for r in ks_out:
        ks_add.append(BucketFile(r["bucket"], r["path"], r["rows"], r["bytes"], r["base"]))
        ks_remove.extend(json.loads(r["replaces"]))
    return MetaGenOutput(
        sorted(segments.values(), key=lambda s: (s.part, s.seq)),
        sorted(logs, key=lambda f: f.path), sorted(ks_add, key=lambda f: (f.bucket, f.path)), ks_remove,
        batch_counts,
    )


SEGMENT_ARROW = pa.schema([
    ("kind", pa.string()), ("path", pa.string()), ("part", pa.int32()), ("seq", pa.int32()),
    ("events", pa.int64()), ("bytes", pa.int64()), ("min_t", pa.int64()), ("max_t", pa.int64()),
])


def write_segments(base: str, prior_bitmaps: dict, events: pa.Table) -> list[dict]:
    """Writes one log file with ``events`` and one bitmap file with the new bitmaps of their segments.

    ``events`` has the columns of :data:`segmentlog.FILE_SCHEMA`; ``prior_bitmaps`` maps
    ``(part, seq)`` to the segment's current bitmap file. Returns rows of :data:`SEGMENT_ARROW`.
    """
    table = events.cast(segmentlog.FILE_SCHEMA)
    if table.num_rows == 0:
        return []
    table = table.take(pc.sort_indices(table, sort_keys=[
        (rowid.PART_COLUMN, "ascending"), (rowid.SEQ_COLUMN, "ascending"), (rowid.OFFSET_COLUMN, "ascending"),
    ]))
    name = f"{uuid.uuid4().hex}.parquet"
    log_path = os.path.join(base, LOGS_DIR, name)
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    # Row groups of one event kind each (UNTIL first), sorted by segment and offset: an event-time read
    # wants only the UNTIL events and skips the others by the row groups' statistics (a log written as one
    # mixed row group had it read the whole file: 1.05M rows instead of 0.57M for a 10 % batch at SF 1).
    with pq.ParquetWriter(log_path, segmentlog.FILE_SCHEMA, compression="zstd") as writer:
        for kind in (segmentlog.SET_VALID_UNTIL, segmentlog.SET_VALID_FROM):
            of_kind = table.filter(pc.equal(table.column("event"), kind))
            if of_kind.num_rows:
                writer.write_table(of_kind)
    t = table.column("t")
    rows = [{"kind": "log", "path": f"{LOGS_DIR}/{name}", "part": None, "seq": None,
             "events": table.num_rows, "bytes": os.path.getsize(log_path),
             "min_t": pc.min(t).as_py(), "max_t": pc.max(t).as_py()}]

    cache = bitmap.BitmapCache(lambda p: os.path.join(base, p))
    parts = table.column(rowid.PART_COLUMN).to_numpy()
    seqs = table.column(rowid.SEQ_COLUMN).to_numpy()
    offsets = table.column(rowid.OFFSET_COLUMN).to_numpy()
    kinds = table.column("event").to_numpy()
    bitmaps = []
    # Segment boundaries of the sorted events, found vectorised (a per-row Python loop took seconds).
    cuts = np.flatnonzero((parts[1:] != parts[:-1]) | (seqs[1:] != seqs[:-1])) + 1
    bounds = [0, *cuts.tolist(), table.num_rows]
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        part, seq = int(parts[start]), int(seqs[start])
        o, k = offsets[start:end], kinds[start:end]
        prior = cache.get(prior_bitmaps.get((part, seq)), part, seq)
        bm = bitmap.apply_events(prior, o[k == segmentlog.SET_VALID_FROM], o[k == segmentlog.SET_VALID_UNTIL])
        bitmaps.append((part, seq, bm))
    name = f"{uuid.uuid4().hex}.parquet"
    bm_path = os.path.join(base, BITMAPS_DIR, name)
    os.makedirs(os.path.dirname(bm_path), exist_ok=True)
    bitmap.write_file(bm_path, bitmaps)
    for part, seq, bm in bitmaps:
        rows.append({"kind": "bitmap", "path": f"{BITMAPS_DIR}/{name}", "part": part, "seq": seq,
                     "events": len(bm), "bytes": 0, "min_t": None, "max_t": None})
    return rows


KEYSTORE_ARROW = pa.schema([
    ("bucket", pa.int32()), ("path", pa.string()), ("rows", pa.int64()), ("bytes", pa.int64()),
    ("base", pa.bool_()), ("replaces", pa.string()),
])


def write_bucket_deltas(base: str, meta: TableMetadata, bucket_files: dict[int, list[BucketFile]],
                        rows: pa.Table) -> list[dict]:
    """Writes one key-store delta per bucket in ``rows`` (key-store columns plus ``_bucket``), merged
    with older files of the bucket when its plan says so. Returns rows of :data:`KEYSTORE_ARROW`."""
    schema = keystore.file_schema(meta)
    pk = list(meta.primary_key)
    out = []
    buckets = rows.column(keystore.BUCKET)
    for bucket in sorted(pc.unique(buckets).to_pylist()):
        delta = rows.filter(pc.equal(buckets, bucket)).select(schema.names).cast(schema)
        files = bucket_files.get(bucket, [])
        merge = keystore.merge_plan(
            files, delta.num_rows, meta.int_prop("keystore.max_deltas"), float(meta.prop("keystore.base_merge_ratio"))
        )
        if merge:
            older = [pq.read_table(os.path.join(base, f.path), schema=schema) for f in merge]
            delta = pa.concat_tables(older + [delta])
        delta = keystore.latest_per_key(delta, pk)
        rel = f"{keystore.bucket_dir(bucket)}/{uuid.uuid4().hex}.parquet"
        path = os.path.join(base, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(delta, path, compression="zstd")
        # A bucket's first file, and a merge of all its files, is its new base.
        is_base = not files or len(merge) == len(files)
        out.append({"bucket": bucket, "path": rel, "rows": delta.num_rows, "bytes": os.path.getsize(path),
                    "base": is_base, "replaces": json.dumps([f.path for f in merge])})
    return out


# A point lookup in the key index costs about as much as scanning this many key-store rows (measured on
# TPC-H lineitem at scale factor 1: ~4 us a lookup with a cold cache, ~0.1 us a scanned row).
LOOKUP_COST_IN_ROWS = 40


def run_inline(io: FileIO, state: TableState, batches: list[Batch], version: int, index=None) -> MetaGenOutput:
    """The inline MetaGen. ``index`` (an open :class:`bitlake.keyindex.KeyIndex` at ``state``, or None)
    answers the batch's keys by point lookups when they are few against the key-store rows of their
    buckets; otherwise, or without an index, the driver semi-joins them with those buckets' files."""
    from bitlake.keyindex import encode_keys
    from bitlake.spark.landing import keys_schema

    meta = state.metadata
    pk = list(meta.primary_key)
    paths = [io.path(f.path) for b in batches for f in b.files if f.kind == "keys"]
    if not paths:
        return MetaGenOutput(list(new_segments(batches).values()), [], [], [], {})
    records = pa.concat_tables([pq.read_table(p, schema=keys_schema(meta)) for p in paths])
    if records.num_rows == 0:
        return MetaGenOutput(list(new_segments(batches).values()), [], [], [], {})
    part_index = {b.segment_part: i for i, b in enumerate(batches)}
    rids = records.column(keystore.ROW_ID).to_numpy()
    bidx = np.array([part_index[p] for p in (rids >> (rowid.SEQ_BITS + rowid.OFFSET_BITS)).tolist()])
    deltas = records.column(keystore.DELTA).to_numpy()
    deleted = records.column(keystore.DELETED).to_numpy(zero_copy_only=False)
    keys = encode_keys(records, pk)
    # Codes number the distinct keys in order of first appearance; the index answers in code order.
    codes = pc.dictionary_encode(pa.array(keys, pa.binary())).indices.to_numpy()
    first = np.unique(codes, return_index=True)[1]
    distinct = records.take(pa.array(first))
    buckets = pc.unique(distinct.column(keystore.BUCKET)).to_pylist()
    stored_rows = sum(f.rows for b in buckets for f in state.keystore.get(b, []))
    if index is not None and len(first) * LOOKUP_COST_IN_ROWS <= stored_rows:
        found, prior_d, prior_rid, prior_deleted = index.lookup([keys[i] for i in first])
    else:
        found, prior_d, prior_rid, prior_deleted = _scan_keystore(io, state, distinct, buckets)

    f = fold(codes, deltas, rids, deleted, bidx, found, prior_d, prior_rid, prior_deleted)
    counts = {}
    for i in range(len(batches)):
        mine = f.batch == i
        acc, upsert, until = f.accepted & mine, ~f.deleted, f.until
        counts[i] = {
            "inserted": int(np.count_nonzero(acc & upsert & ~until)),
            "updated": int(np.count_nonzero(acc & upsert & until)),
            "deleted": int(np.count_nonzero(acc & ~upsert & until)),
            "stale": int(np.count_nonzero(mine & ~f.accepted)),
            "ignored_deletes": int(np.count_nonzero(acc & ~upsert & ~until)),
        }
    becomes_valid = f.accepted & ~f.deleted
    target = np.concatenate([f.last_rid[f.until], f.rid[becomes_valid]])
    kind = np.concatenate([
        np.full(np.count_nonzero(f.until), segmentlog.SET_VALID_UNTIL, np.int8),
        np.full(np.count_nonzero(becomes_valid), segmentlog.SET_VALID_FROM, np.int8),
    ])
    events = pa.table({
        rowid.PART_COLUMN: (target >> (rowid.SEQ_BITS + rowid.OFFSET_BITS)).astype(np.int32),
        rowid.SEQ_COLUMN: ((target >> rowid.OFFSET_BITS) & rowid.MAX_SEQ).astype(np.int32),
        rowid.OFFSET_COLUMN: (target & rowid.MAX_OFFSET).astype(np.int32),
        "event": kind,
        "t": np.concatenate([f.delta[f.until], f.delta[becomes_valid]]),
        "cause": np.concatenate([f.rid[f.until], f.rid[becomes_valid]]),
        "batch_index": np.concatenate([f.batch[f.until], f.batch[becomes_valid]]).astype(np.int32),
    })
    prior_bitmaps = {k: s.bitmap for k, s in state.segments.items() if s.bitmap}
    seg_out = write_segments(io.base, prior_bitmaps, events)

    latest = records.take(pa.array(np.sort(f.final), pa.int64()))
    ks_rows = latest.select([*pk, keystore.DELTA, keystore.ROW_ID, keystore.DELETED, keystore.BUCKET]).append_column(
        keystore.SEQ, pa.array(np.full(latest.num_rows, version, dtype=np.int64))
    )
    buckets = set(pc.unique(ks_rows.column(keystore.BUCKET)).to_pylist())
    ks_out = write_bucket_deltas(
        io.base, meta, {b: state.keystore.get(b, []) for b in buckets}, ks_rows
    ) if ks_rows.num_rows else []
    return assemble(state, batches, seg_out, ks_out, counts)


def _scan_keystore(io: FileIO, state: TableState, distinct: pa.Table, buckets: list[int]):
    """The stored entries of ``distinct`` keys (key columns and ``_bucket``), one bucket at a time: found,
    delta, row id, deleted, in ``distinct``'s order."""
    pk = list(state.metadata.primary_key)
    n = distinct.num_rows
    wanted = distinct.select(pk).append_column("_code", pa.array(np.arange(n, dtype=np.int64)))
    in_bucket = distinct.column(keystore.BUCKET)
    matches = []
    for bucket in buckets:
        files = state.keystore.get(bucket, [])
        if not files:
            continue
        stored = pa.concat_tables([
            pq.read_table(io.path(f.path), columns=[*pk, keystore.DELTA, keystore.ROW_ID, keystore.DELETED,
                                                    keystore.SEQ])
            for f in files
        ])
        mine = wanted.filter(pc.equal(in_bucket, bucket))
        matches.append(stored.join(mine, keys=pk, join_type="inner", use_threads=True).select(
            ["_code", keystore.DELTA, keystore.ROW_ID, keystore.DELETED, keystore.SEQ]))
    found = np.zeros(n, dtype=bool)
    delta, rid, deleted = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, dtype=bool)
    if matches:
        # A key may have a row in several of its bucket's files: the highest _ks_seq is its entry.
        m = pa.concat_tables(matches)
        m = m.take(pc.sort_indices(m, sort_keys=[("_code", "ascending"), (keystore.SEQ, "descending")]))
        latest = np.unique(m.column("_code").to_numpy(), return_index=True)[1]
        m = m.take(pa.array(latest))
        code = m.column("_code").to_numpy()
        found[code] = True
        delta[code] = m.column(keystore.DELTA).to_numpy()
        rid[code] = m.column(keystore.ROW_ID).to_numpy()
        deleted[code] = m.column(keystore.DELETED).to_numpy(zero_copy_only=False)
    return found, delta, rid, deleted


@dataclasses.dataclass
class Fold:
    """The contract applied to a commit's records, in contract order (``order`` maps to input rows).

    Per record: its delta, row id, delete flag and batch; ``accepted``; ``until`` (it supersedes a
    visible row, whose row id is ``last_rid``). ``final``: the input rows that are their key's last
    accepted record, which become the key-store entries.
    """

    order: np.ndarray
    delta: np.ndarray
    rid: np.ndarray
    deleted: np.ndarray
    batch: np.ndarray
    accepted: np.ndarray
    until: np.ndarray
    last_rid: np.ndarray
    final: np.ndarray


def fold(codes, deltas, rids, deleted, batch, found, prior_d, prior_rid, prior_deleted) -> Fold:
    """Applies the semantics contract to records of keys ``codes`` (0..k-1, each present), given each
    key's stored entry (``found[code]``, its delta, row id and delete flag), without a Python loop.

    Records are put in contract order, (key, batch, delta, row id), and each key's stored entry is
    placed before its records as a slot. A record is accepted iff its delta is at least the maximum
    delta before it in its key (accepted deltas never decrease, so that is the last accepted one's);
    group-wise running maxima come from one cumulative maximum over ``key * M + delta rank``, which
    no earlier key can reach. The previous accepted record (or the slot) is a forward fill of
    positions; it is a visible row iff it is an upsert (a missing entry counts as not visible).
    """
    order = np.lexsort((rids, deltas, batch, codes))
    c, d, r, dl, b = codes[order], deltas[order], rids[order], deleted[order], batch[order]
    n, k = len(c), len(found)
    pos = np.arange(n) + c + 1  # record i's place, after the slots of keys 0..c
    slot = np.searchsorted(c, np.arange(k)) + np.arange(k)  # key g's slot, before its first record
    size = n + k
    is_slot = np.zeros(size, dtype=bool)
    is_slot[slot] = True
    all_d = np.empty(size, dtype=np.int64)
    all_d[pos], all_d[slot] = d, prior_d
    ranks = np.unique(all_d, return_inverse=True)[1].reshape(-1) + 1
    ranks[slot[~found]] = 0  # no stored entry: nothing to be older than
    m = int(ranks.max()) + 1
    key_of = np.empty(size, dtype=np.int64)
    key_of[pos], key_of[slot] = c, np.arange(k)
    running = np.maximum.accumulate(key_of * m + ranks)
    accepted = ranks[pos] + c * m >= running[pos - 1]
    marks = np.where(is_slot, np.arange(size), -1)
    marks[pos[accepted]] = pos[accepted]
    last = np.maximum.accumulate(marks)
    all_rid = np.empty(size, dtype=np.int64)
    all_rid[pos], all_rid[slot] = r, prior_rid
    invisible = np.empty(size, dtype=bool)
    invisible[pos], invisible[slot] = dl, prior_deleted | ~found
    before = last[pos - 1]
    until = accepted & ~invisible[before]
    ends = np.append(slot[1:] - 1, size - 1)  # each key's last place
    final_place = last[ends]
    final_place = final_place[~is_slot[final_place]]
    record_of_place = final_place - key_of[final_place] - 1
    return Fold(order, d, r, dl, b, accepted, until, all_rid[before], order[record_of_place])
