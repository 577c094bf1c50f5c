"""MetaGen, the second of Opal's two steps: the metadata that makes landed batches visible, and the
inline MetaGen that computes it on the driver.

MetaGen applies the semantics contract (docs/semantics.md) to the landed records and writes segment-log
events, new segment states (bitmaps) and key-store increments, and counts. Two implementations:

* the Spark MetaGen (:mod:`bitlake.spark.metagen`) folds a set of buckets per Spark task, with
  :func:`fold_records`, the inline MetaGen's own fold of a group of buckets;
* the inline MetaGen (:func:`run_inline`, Opal's "inline metadata update") runs on the driver: it reads the
  batches' records (keys, delta values and row ids of their data files, and their keys files' deletes),
  looks their keys up in the key index (:mod:`bitlake.engine.keys.keyindex`), or for large batches semi-joins
  them with the key store, and folds them in order with :func:`fold`.

Both write their files with :func:`bitlake.engine.write.segments.write_segments` and
:func:`bitlake.format.keystore.write_bucket_files`, which the Spark MetaGen calls inside its tasks.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap

from bitlake import memory
from bitlake.engine.keys import keycache
from bitlake.engine.keys.keyencoding import fixed_type, fixed_width, int64_values, key_codes
from bitlake.engine.keys.keyindex import index_order, stages
from bitlake.engine.write import spill
from bitlake.engine.write.fold import Fold, fold
from bitlake.engine.write.landing import Landed
from bitlake.engine.write.segments import segment_runs, sorted_ids, write_segments
from bitlake.engine.write.spill import Spill
from bitlake.format import bitmap, datafile, keystore, prior, rowid, segmentlog, stats
from bitlake.format.commit import BucketFile, DataFile, LogFile, PriorFile, SegmentState
from bitlake.format.order import latest, lexsort, strictly_increasing
from bitlake.format.protocol import PRIOR_ENTRIES
from bitlake.format.state import TableState
from bitlake.fs import FileIO
from bitlake.pool import ordered_map, thread_map

COUNTS = ("inserted", "updated", "deleted", "stale", "ignored_deletes")


def pending_batches(state: TableState) -> list[Landed]:
    """The pending batches with their files (a pending batch's data files hold its segments only)."""
    pending = state.pending
    by_part: dict[int, list[DataFile]] = {b.part: [] for b in pending}
    for f in state.data_files():
        if f.segments[0].part in by_part:
            by_part[f.segments[0].part].append(f)
    return [Landed(b.batch_id, b.part, b.records, tuple(by_part[b.part]), b.keys_files) for b in pending]


@dataclasses.dataclass
class MetaGenOutput:
    segments: list[SegmentState]
    logs: list[LogFile]
    keystore_add: list[BucketFile]
    keystore_remove: list[str]
    batch_counts: dict[int, dict[str, int]]  # batch index -> counts
    # The key-store rows this commit writes, when MetaGen ran on the driver: the key index takes them from
    # here after the commit instead of reading them back.
    keystore_rows: pa.Table | None = None
    prior_entries: list[PriorFile] = dataclasses.field(default_factory=list)  # its keys' entries before it

    def counts(self) -> dict[str, int]:
        return {k: sum(c[k] for c in self.batch_counts.values()) for k in COUNTS}

    def features(self) -> tuple[str, ...]:
        """The protocol features a commit of this output needs."""
        return (*keystore.features(self.keystore_add), *bitmap.features(self.segments),
                *((PRIOR_ENTRIES,) if self.prior_entries else ()))

    def written(self) -> list[str]:
        # A keys file listed as a key-store file (``version``) is the landing's, not this output's.
        paths = [f.path for f in self.logs] + [f.path for f in self.keystore_add if f.version is None]
        paths += [f.path for f in self.prior_entries]
        # A segment state with a delta names the bitmap of an earlier commit, and the delta this one wrote.
        return paths + sorted({s.delta or s.bitmap for s in self.segments if s.bitmap})


def new_segments(batches: list[Landed]) -> dict[tuple[int, int], SegmentState]:
    """The segments the batches landed: offsets handed out (one a record: the upserts in data files, the
    deletes in keys files) and rows in data files."""
    out: dict[tuple[int, int], SegmentState] = {}
    for b in batches:
        for k in b.keys_files:
            s = out.get((b.part, k.seq)) or SegmentState(b.part, k.seq, 0, 0)
            out[(b.part, k.seq)] = dataclasses.replace(s, offsets=s.offsets + k.rows)
        for f in b.data_files:
            for r in f.segments:
                s = out.get(r.segment) or SegmentState(r.part, r.seq, 0, 0)
                out[r.segment] = dataclasses.replace(s, offsets=s.offsets + r.rows, data_rows=s.data_rows + r.rows)
    return out


def unkeyed_output(batches: list[Landed]) -> MetaGenOutput:
    """Append-only: every landed row is valid, which the segment states say without a bitmap."""
    segments = [dataclasses.replace(s, cardinality=s.data_rows) for s in new_segments(batches).values()]
    counts = {i: {**dict.fromkeys(COUNTS, 0), "inserted": b.records} for i, b in enumerate(batches)}
    return MetaGenOutput(segments, [], [], [], counts)


SEGMENT_ARROW = pa.schema([
    ("kind", pa.string()), ("path", pa.string()), ("part", pa.int32()), ("seq", pa.int32()),
    ("count", pa.int64()), ("bytes", pa.int64()), ("min_t", pa.int64()), ("max_t", pa.int64()),
])
SEGMENT_DDL = "kind string, path string, part int, seq int, count long, bytes long, min_t long, max_t long"


def assemble(state: TableState, batches: list[Landed], seg_out: list[dict], added: list[BucketFile],
             replaced: list[str], batch_counts: dict) -> MetaGenOutput:
    """The output from what the writers reported (rows of :data:`SEGMENT_ARROW`, key-store files)."""
    segments = new_segments(batches)
    logs = []
    for r in seg_out:
        if r["kind"] == "log":
            logs.append(LogFile(r["path"], r["count"], r["bytes"], r["min_t"], r["max_t"]))
            continue
        key = (r["part"], r["seq"])
        current = segments.get(key) or state.segments[key]
        segments[key] = (current.with_delta if r["kind"] == "delta" else current.with_bitmap)(r["path"], r["count"])
    return MetaGenOutput(
        sorted(segments.values(), key=lambda s: (s.part, s.seq)), sorted(logs, key=lambda f: f.path),
        sorted(added, key=lambda f: (f.bucket, f.path)), replaced, batch_counts,
    )


# A point lookup of a key's own entry in the key index costs about as much as scanning this many key-store rows, and
# one in a block (an index whose keys a load wrote as blocks) twice that: the inline MetaGen looks a batch's keys up
# when that costs less than reading their buckets' files, else scans the files. The ratio depends on the index's
# format, so a new format measures it again (docs/benchmarks.md, "Design measurements", "MetaGen: lookups or a scan
# of the key store").
LOOKUP_COST_IN_ROWS = 130
_BLOCK_LOOKUP_FACTOR = 2
# Matching a key with the key-store files this process holds in memory (bitlake.engine.keys.keycache) costs about as
# much as scanning this many rows of files it must read: a binary search in each of its bucket's files, dearer for
# sparse keys, which miss the CPU's caches (measured with benchmarks/probes/upsert.py ... warm: same section).
CACHED_KEY_COST_IN_ROWS = 20
# Fewer keys than this, all in key-store files this process holds, are matched on the calling thread: numpy's small
# steps hold the GIL, so threads share little of the work and add their hand-offs; only large batches gain from a
# second thread (docs/benchmarks.md, "Design measurements", same section).
_FEW_KEYS = 262_144


# A commit of at most a PRIOR_SHARE-th of the key store's rows in records writes what they found in it (a revert of
# its batch starts from that instead of searching the key store of the version before it). A larger commit's revert
# searches it at about the cost of the commit's own MetaGen, which the file's sort by row id would only add to.
PRIOR_SHARE = 16

# The inline MetaGen folds at most this many records at once: larger commits are folded in groups, a key's
# records all in one group, so its memory is bounded by a group, not by the commit (the key-store rows it keeps,
# far fewer bytes a record than the fold's, are written once at the end; docs/benchmarks.md, "Design measurements").
GROUP_RECORDS = 20_000_000


# A commit of more records than this is folded from a spill (:func:`_run_spilled`), in groups of about
# SPILL_GROUP_RECORDS: its memory is a group's, not the commit's.
SPILL_RECORDS = 16_000_000
SPILL_GROUP_RECORDS = 4_000_000
_FOLDS_AT_ONCE = 2
# A load whose buckets each hold more than SPILL_GROUP_RECORDS is folded by ranges of keys of about half that
# many records, one at a time: the key cache has grown to most of its size by the last ranges (TPC-H SF 30, 180 M
# records in 16 buckets: 6 ranges a bucket, peak 1.75 GB and 97 s, against 2.74 GB and 108 s for a bucket at a
# time; 3 ranges a bucket, 2.18 GB; two ranges of 2 M at once, 2.02 GB and 86 s; docs/ingestion.md, "Memory").
_RANGES_A_GROUP = 2


def run_inline(io: FileIO, state: TableState, batches: list[Landed], version: int, index=None) -> MetaGenOutput:
    """The inline MetaGen. ``index`` (an open :class:`bitlake.engine.keys.keyindex.KeyIndex` at ``state``, or None)
    answers the batch's keys by point lookups when they are few against the key-store rows of their
    buckets; otherwise, or without an index, the driver semi-joins them with those buckets' files."""
    meta = state.metadata
    unread = [b for b in batches if b.rows is None and b.spilled is None]
    reads = [(datafile.read_upserts, f.path) for b in unread for f in b.data_files]
    reads += [(datafile.read_deletes, f.path) for b in unread for f in b.keys_files]
    # A batch the landing spilled (of more than SPILL_RECORDS records, in several buckets) folds from its spill.
    spilled = any(b.spilled is not None for b in batches)
    if meta.num_buckets > 1 and (sum(b.records for b in batches) > SPILL_RECORDS or spilled):
        return _run_spilled(io, state, batches, version, index, reads)
    tables = [b.rows for b in batches if b.rows is not None] + thread_map(lambda r: r[0](io, r[1], meta), reads)
    records = pa.concat_tables(tables) if tables else None
    if records is None or records.num_rows == 0:
        return MetaGenOutput(list(new_segments(batches).values()), [], [], [], {})
    counts = np.zeros((len(batches), len(COUNTS)), dtype=np.int64)
    until, valid, rows, priors = [], [], [], []
    with_prior = records.num_rows * PRIOR_SHARE <= sum(f.rows for files in state.keystore.values() for f in files)
    for piece in _groups(records, meta):
        g = fold_records(io, state, batches, piece, version, index, with_prior)
        counts += g.counts
        until.append(g.until)
        valid.append(g.valid)
        rows.append(g.keystore_rows)
        if g.prior is not None:
            priors.append(g.prior)
    keystore_rows = pa.concat_tables(rows)
    # Each group's rows are in row-id order; several groups' are sorted again.
    prior_rows = pa.concat_tables(priors).sort_by(prior.ROW_ID) if len(priors) > 1 else priors[0] if priors else None
    events = pa.concat_tables(until)

    def stage() -> None:
        # A group is a run of buckets, a range of the index's order (its keys start with the bucket), so the
        # files of the groups never overlap.
        for group_rows in rows:
            if group_rows.num_rows:
                index.stage(group_rows, version)

    listed = _listed_keys_file(state, batches, records, keystore_rows)

    def keystore_files() -> tuple[list[BucketFile], list[str]]:
        if listed is not None:  # the batch's keys file is the commit's shared key-store file
            batch, in_file_order = listed
            keys_file = (batch.writing()[1] if batch.writing is not None else batch.keys_files)[0]
            keycache.CACHE.written(io, keys_file.path, in_file_order, meta)
            return [BucketFile(keystore.SHARED, keys_file.path, keys_file.rows, keys_file.bytes, False, version)], []
        if not keystore_rows.num_rows:
            return [], []
        return keystore.write_bucket_files(io, meta, state.keystore, keystore_rows,
                                           lambda path, rows: keycache.CACHE.written(io, path, rows, meta),
                                           lambda f: keycache.CACHE.rows(io, f, meta), shared=True)

    # The key-store files, the segment log with its bitmaps and the key index's staged files are independent:
    # written at once, on threads (a load's blocks took as long as its key-store files).
    writes = [
        keystore_files,
        lambda: write_segments(io, state.segments, events, valid, meta.prop("bitmap.deltas")),
        lambda: [prior.write(io, prior_rows)] if prior_rows is not None and prior_rows.num_rows else [],
    ]
    if index is not None and stages(records.num_rows):
        writes.insert(0, stage)
    *_, (added, replaced), seg_out, prior_entries = thread_map(lambda write: write(), writes)
    keycache.CACHE.forget(io, replaced)
    batch_counts = {i: dict(zip(COUNTS, map(int, counts[i]), strict=True)) for i in range(len(batches))}
    out = assemble(state, batches, seg_out, added, replaced, batch_counts)
    return dataclasses.replace(out, keystore_rows=keystore_rows, prior_entries=prior_entries)


def _listed_keys_file(state: TableState, batches: list[Landed], records: pa.Table, keystore_rows: pa.Table
                      ) -> tuple[Landed, pa.Table] | None:
    """The batch whose keys file holds exactly the commit's key-store rows, when one does: a batch of deletes alone
    in one keys file, in key order, one a key, each accepted, of at most ``keystore.LISTED_ROWS``. That file is
    then listed in the key store (at the commit's version) instead of a copy of its rows, near half a small delete's
    bytes (docs/FORMAT.md, "Key store", "Keys files as entries"). Returns the batch and the key-store rows in the
    file's order (a large commit has them in the key index's order)."""
    batch = batches[0]
    if len(batches) != 1 or batch.data_files or len(batch.keys_files) != 1:
        return None
    n = keystore_rows.num_rows
    if n != records.num_rows or n != batch.keys_files[0].rows or \
            not keystore.shares(state.keystore, n, state.metadata, keystore.LISTED_ROWS):
        return None
    # The rows are the records themselves (every record its key's one, accepted), the records in the order the file
    # has them (the landing kept them, or they were read from it): in key order, and numbered in that order.
    rids, in_file = keystore_rows.column(keystore.ROW_ID).to_numpy(), records.column(keystore.ROW_ID).to_numpy()
    if not strictly_increasing(in_file) or not keystore.in_key_order(records, list(state.metadata.primary_key)):
        return None
    if np.array_equal(rids, in_file):
        return batch, keystore_rows
    by_row = np.argsort(rids)
    return (batch, keystore_rows.take(pa.array(by_row))) if np.array_equal(rids[by_row], in_file) else None


def _run_spilled(io: FileIO, state: TableState, batches: list[Landed], version: int, index, reads: list
                 ) -> MetaGenOutput:
    """:func:`run_inline` of a large commit in bounded memory. One pass parts its records by sets of buckets (a
    load whose buckets are too large for a group: by bucket and range of keys, :func:`_key_ranges`) into local
    scratch files (:class:`~bitlake.engine.write.spill.Spill`), reading two of its files at a time; then each
    group is folded alone and its key-store files are written, which hold all of its keys' rows:
    only the offsets that become valid (a bitmap a segment) and the events of every group are kept until the
    segments are written."""
    meta = state.metadata
    records = sum(b.records for b in batches)
    group_of_bucket = spill.group_of_bucket(meta.num_buckets)
    buckets_groups = spill.groups(meta.num_buckets)
    edges = _key_ranges(state, batches, records, buckets_groups)
    ranges = len(edges) + 1 if edges is not None else 1
    groups = buckets_groups * ranges

    def key_range(table: pa.Table) -> np.ndarray:
        return np.searchsorted(edges, int64_values(table.column(meta.primary_key[0])), side="right")

    def group_of(table: pa.Table) -> np.ndarray:
        of_bucket = group_of_bucket[table.column(keystore.BUCKET).to_numpy()]
        return of_bucket if edges is None else of_bucket * ranges + key_range(table)

    spilled = [b.spilled for b in batches if b.spilled is not None]

    def group_rows(g: int) -> pa.Table | None:
        """The records of group ``g``: those the spill below parted, then those the landings spilled (a group of
        buckets, each file read for each of its ranges)."""
        tables = [parts.take(g)] if parts.holds(g) else []
        for kept in spilled:
            for t in kept.group(g // ranges):
                tables.append(t if edges is None else t.filter(pa.array(key_range(t) == g % ranges)))
        return pa.concat_tables(tables) if tables else None

    sources = [lambda b=b: b.rows for b in batches if b.rows is not None]
    sources += [lambda r=r: r[0](io, r[1], meta) for r in reads]
    # Each group stages its key-index entries while the next one folds, as in run_inline: runs of buckets, whose
    # files overlap no other group's.
    stage = index is not None and stages(records)
    counts = np.zeros((len(batches), len(COUNTS)), dtype=np.int64)
    until, added, replaced = [], [], []
    valid: dict[int, BitMap] = {}  # the offsets that become valid, by segment

    def write(rows: pa.Table) -> tuple[list, list]:
        return keystore.write_bucket_files(io, meta, state.keystore, rows,
                                           lambda path, rows: keycache.CACHE.written(io, path, rows, meta),
                                           lambda f: keycache.CACHE.rows(io, f, meta))

    def take_written(write_done: Future) -> None:
        a, r = write_done.result()
        added.extend(a)
        replaced.extend(r)

    def fold_group(g: int) -> Folded | None:
        # The records go to the fold unnamed (handed over from a list): it drops their mapped files once it has them in
        # one piece. Its garbage is given back before the next group's (docs/ingestion.md, "Memory").
        rows = [group_rows(g)]
        folded = fold_records(io, state, batches, rows.pop(), version, index) if rows[0] is not None else None
        memory.release_unused()
        return folded

    # Groups fold on threads (each group's keys are its own; numpy and Arrow release the GIL), and a group's
    # key-store files are written on a thread of their own: one after the other, the steps took one of the
    # machine's cores (docs/benchmarks.md, "Design measurements", "MetaGen").
    with Spill(groups) as parts, ThreadPoolExecutor(1, thread_name_prefix="bitlake-keystore") as writer:
        for table in ordered_map(lambda source: source(), sources, ahead=2):
            parts.add(table, group_of(table))
        # Groups of the planned size fold two at a time and a group's files are written while the next ones fold;
        # groups larger than planned (the buckets too few for it) one after the other, in the memory of one, as
        # are a load's ranges of keys.
        at_once = _FOLDS_AT_ONCE if records <= groups * SPILL_GROUP_RECORDS and edges is None else 1
        writes: deque[Future] = deque()
        for folded in ordered_map(fold_group, range(groups), ahead=at_once):
            if folded is None:
                continue
            counts += folded.counts
            until.append(folded.until)
            for seg, run in segment_runs(sorted_ids(folded.valid)).items():
                offsets = bitmap.of(run & rowid.MAX_OFFSET)
                valid[seg] = valid[seg] | offsets if seg in valid else offsets
            if stage and folded.keystore_rows.num_rows:
                index.stage(folded.keystore_rows, version)
            if folded.keystore_rows.num_rows:
                writes.append(writer.submit(write, folded.keystore_rows))
            del folded
            while len(writes) >= at_once or (writes and writes[0].done()):
                take_written(writes.popleft())
        while writes:
            take_written(writes.popleft())
    seg_out = write_segments(io, state.segments, pa.concat_tables(until), (), meta.prop("bitmap.deltas"), valid)
    keycache.CACHE.forget(io, replaced)
    batch_counts = {i: dict(zip(COUNTS, map(int, counts[i]), strict=True)) for i in range(len(batches))}
    return assemble(state, batches, seg_out, added, replaced, batch_counts)


def _key_ranges(state: TableState, batches: list[Landed], records: int, groups: int) -> np.ndarray | None:
    """Where a spilled load cuts the keys of each of its ``groups`` of buckets into ranges of about half a group,
    when they hold more records than a group should (more than ``groups`` of :data:`SPILL_GROUP_RECORDS`): the
    values of the first key column (as :func:`~bitlake.engine.keys.keyencoding.int64_values` gives them) that
    start the second range, the third, and so on, cutting the span of its values in the data files' statistics
    into equal parts. None: no cut (a commit of fewer records, a table with key-store files, whose buckets' files a
    commit may merge with its rows only once, a first key column not of fixed width, or files without statistics).

    A key's records all fall in one range, and a range holds keys above the range before it, in the key index's
    order as in the key store's (a key's encoding starts with its first column's 8 bytes, ordered as these values):
    each range folds alone, in less memory than its bucket, writes a key-store file of its own, a base file of its
    bucket beside the other ranges', and stages its index entries after those of the range before it
    (docs/ingestion.md, "Memory")."""
    meta = state.metadata
    first = meta.schema.field(meta.primary_key[0])
    if records <= groups * SPILL_GROUP_RECORDS or any(state.keystore.values()) \
            or not fixed_type(first.type):
        return None
    bounds: list[pa.Scalar | None] = []
    for b in batches:
        if b.rows is not None:  # the records kept by the landing
            bounds.extend(pc.min_max(b.rows.column(first.name)).values())
        elif b.spilled is not None:
            bounds.extend(b.spilled.bounds)
        else:
            sides = ((f.stats or {}).get(side, {}).get(first.name) for f in b.data_files for side in ("min", "max"))
            bounds.extend(None if v is None else stats.decode(v, first.type) for v in sides)
    ranges = -(-records // (groups * SPILL_GROUP_RECORDS // _RANGES_A_GROUP))
    if not bounds or any(v is None or not v.is_valid for v in bounds) or ranges < 2:
        return None
    values = int64_values(pa.array(bounds, first.type))
    low, high = int(values.min()), int(values.max())
    return np.array(sorted({low + (high - low + 1) * i // ranges for i in range(1, ranges)}), dtype=np.int64)


def _groups(records: pa.Table, meta) -> Iterable[pa.Table]:
    """``records`` cut into groups of about :data:`GROUP_RECORDS` (at most one a bucket), each a run of buckets:
    a key's records all in one group, and each group a range of the key index's order (its keys start with the
    bucket)."""
    groups = min(-(-records.num_rows // GROUP_RECORDS), meta.num_buckets)
    if groups <= 1:
        return [records]
    group_of_bucket = np.arange(meta.num_buckets) * groups // meta.num_buckets
    group_of = group_of_bucket[records.column(keystore.BUCKET).to_numpy()]
    return (records.filter(pa.array(group_of == g)) for g in np.unique(group_of).tolist())


@dataclasses.dataclass
class Folded:
    counts: np.ndarray  # per batch index, per COUNTS
    until: pa.Table  # SET_VALID_UNTIL events
    valid: np.ndarray  # the row ids that become valid
    keystore_rows: pa.Table  # in key order when the key has a fixed width
    prior: pa.Table | None  # with_prior: what each record found in the key store (bitlake.format.prior)


def fold_records(io: FileIO, state: TableState, batches: list[Landed], records: pa.Table, version: int,
                 index, with_prior: bool = False) -> Folded:
    """Folds ``records`` (keys-file rows of whole keys) against the stored entries of their keys; returns the
    events, the row ids that become valid and the key-store rows they leave (and ``with_prior``, the entries)."""
    pk = list(state.metadata.primary_key)
    records = records.combine_chunks()  # a group at a time: the commit's records are never copied at once
    rids = records.column(keystore.ROW_ID).to_numpy()
    bidx = _batch_indices(batches, rids)
    deltas = records.column(keystore.DELTA).to_numpy()
    deleted = records.column(keystore.DELETED).to_numpy(zero_copy_only=False)
    # Codes number the distinct keys; ``first`` holds a record of each, and the index answers in code order.
    codes, first = key_codes(records, pk)
    (found, prior_d, prior_rid, prior_deleted), distinct = _stored_entries(io, state, records, first, index)
    f = fold(codes, deltas, rids, deleted, bidx, found, prior_d, prior_rid, prior_deleted)
    accepted_upsert = f.accepted & ~f.deleted
    counts = _fold_counts(f, accepted_upsert, len(batches))
    until = _until_events(f)
    ks_rows = _in_index_order(_keystore_rows(records, pk, codes, first, distinct, f, version), pk)
    return Folded(counts, until, f.rid if accepted_upsert.all() else f.rid[accepted_upsert], ks_rows,
                  _prior(f, codes, found, prior_d, prior_rid, prior_deleted) if with_prior else None)


def _prior(f: Fold, codes: np.ndarray, found: np.ndarray, delta: np.ndarray, rid: np.ndarray, deleted: np.ndarray
           ) -> pa.Table:
    """Each record's row of a prior-entries file: its key's stored entry, and whether the commit's log holds the
    entry's row id (a visible row that a record of the key and of the same batch ended)."""
    c = codes[f.order]
    visible = found & ~deleted
    ends = f.until & visible[c] & (f.last_rid == rid[c])  # the record that ended its key's stored row
    ender = np.full(len(found), -1, np.int64)
    ender[c[ends]] = f.batch[ends]
    return prior.table(f.rid, found[c], delta[c], rid[c], deleted[c], visible[c] & (ender[c] == f.batch))


def _stored_entries(io: FileIO, state: TableState, records: pa.Table, first: np.ndarray, index):
    """The stored entry of each key of ``records`` (``first`` holds a record of each, in code order): found, delta,
    row id, deleted, in code order; and those records (None when the key store holds no row of the keys' buckets:
    a load, where nothing is looked up)."""
    meta = state.metadata
    pk = list(meta.primary_key)
    if any(state.keystore.values()):
        buckets = np.flatnonzero(np.bincount(records.column(keystore.BUCKET).to_numpy(), minlength=meta.num_buckets))
        stored = [f for b in [*buckets.tolist(), keystore.SHARED] for f in state.keystore.get(b, [])]
        stored_rows = sum(f.rows for f in stored)
        unread_rows = sum(f.rows for f in stored if not keycache.CACHE.holds(io, f.path))
    else:  # an empty key store (a load)
        stored_rows = 0
    if stored_rows == 0:  # a load: nothing to look up
        k = len(first)
        return (np.zeros(k, bool), np.zeros(k, np.int64), np.zeros(k, np.int64), np.zeros(k, bool)), None
    distinct = records.take(pa.array(first))  # a record of each key, in code order
    # Lookups, or a scan of the buckets' files: those this process holds cost a binary search a key. Once
    # this process's lookups on the table have cost as much as reading the files it lacks, it reads them
    # (a writer of many small batches then finds every later batch's keys in memory): never more than
    # twice what the best choice in hindsight would have cost.
    lookup_cost = len(first) * LOOKUP_COST_IN_ROWS * (_BLOCK_LOOKUP_FACTOR if index is not None and index.blocked
                                                      else 1)
    scan_cost = unread_rows + (len(first) * CACHED_KEY_COST_IN_ROWS if unread_rows < stored_rows else 0)
    buy = keycache.CACHE.spent(io) + lookup_cost > unread_rows and keycache.CACHE.can_hold(unread_rows)
    if index is not None and lookup_cost <= scan_cost and not buy:
        keycache.CACHE.spend(io, lookup_cost)
        return index.lookup(distinct, in_key_order=fixed_width(records, pk)), distinct
    return scan_keystore(io, state, distinct, buckets.tolist()), distinct


def _fold_counts(f: Fold, accepted_upsert: np.ndarray, batches: int) -> np.ndarray:
    """The fold's records counted by kind (:data:`COUNTS`), per batch index."""
    accepted_delete = f.accepted & f.deleted
    kinds = {  # per record of the fold, in COUNTS order
        "inserted": accepted_upsert & ~f.until,
        "updated": accepted_upsert & f.until,
        "deleted": accepted_delete & f.until,
        "stale": ~f.accepted,
        "ignored_deletes": accepted_delete & ~f.until,
    }
    if batches == 1:
        return np.array([[np.count_nonzero(kinds[k]) for k in COUNTS]], dtype=np.int64)
    return np.stack([np.bincount(f.batch[kinds[k]], minlength=batches) for k in COUNTS], axis=1)


def _until_events(f: Fold) -> pa.Table:
    """The fold's SET_VALID_UNTIL events in row-id order, which the segment log and the bitmaps take them in
    (records come in key order; a row is superseded once, so the ids are distinct)."""
    ended, t, cause, batch = f.last_rid[f.until], f.delta[f.until], f.rid[f.until], f.batch[f.until]
    if not strictly_increasing(ended):
        by_row = lexsort([ended])
        ended, t, cause, batch = ended[by_row], t[by_row], cause[by_row], batch[by_row]
    t_parts, t_seqs, t_offsets = rowid.unpack_arrays(ended)
    return pa.table({
        rowid.PART_COLUMN: t_parts, rowid.SEQ_COLUMN: t_seqs, rowid.OFFSET_COLUMN: t_offsets,
        "event": np.full(len(t_parts), segmentlog.SET_VALID_UNTIL, np.int8),
        "t": t, "cause": cause, "batch_index": batch.astype(np.int32),
    })


def _keystore_rows(records: pa.Table, pk: list[str], codes: np.ndarray, first: np.ndarray,
                   distinct: pa.Table | None, f: Fold, version: int) -> pa.Table:
    """The key-store rows the fold leaves, each key's last accepted record, in code order, which is key order for
    keys of fixed width: the key index and the key-store files take them sorted (a load of a dump in key order is
    taken as it is). ``distinct``, when not None, holds the records ``first`` names, already taken."""
    n = records.num_rows
    if len(first) == n and len(f.final) == n:
        final = first  # one record a key, each accepted (a load, most batches): ``first`` is that record
    else:
        slot = np.full(len(first), -1, dtype=np.int64)
        slot[codes[f.final]] = f.final
        final = slot[slot >= 0]
    # Strictly increasing row numbers from 0 to n - 1 are all of them, in order.
    in_place = len(final) == n and (n == 0 or (final[0] == 0 and final[-1] == n - 1 and
                                               strictly_increasing(final)))
    if in_place:
        latest = records
    elif final is first and distinct is not None:
        latest = distinct
    else:
        latest = records.take(pa.array(final, pa.int64()))
    return latest.select([*pk, keystore.DELTA, keystore.ROW_ID, keystore.DELETED, keystore.BUCKET]).append_column(
        keystore.VERSION, pa.repeat(pa.scalar(version, pa.int64()), latest.num_rows)
    )


def _in_index_order(rows: pa.Table, pk: list[str]) -> pa.Table:
    """Many key-store rows in the key index's order, by bucket, then by key: the index's entries and each bucket's
    key-store file are then runs of them, where both took their rows from across the commit's, each as many gathers
    a column (docs/benchmarks.md, "Design measurements", "Key store"). The columns are taken on threads."""
    if rows.num_rows <= keystore.AT_ONCE_ROWS:  # a small commit: its files take its rows by bucket at once
        return rows
    order = index_order(rows, pk, rows.column(keystore.BUCKET).to_numpy().astype(np.uint16))
    if strictly_increasing(order):
        return rows
    taken = pa.array(order)
    return pa.table(thread_map(lambda column: column.take(taken), rows.columns), schema=rows.schema)


def _batch_indices(batches: list[Landed], rids: np.ndarray) -> np.ndarray:
    """Each record's batch index (its place in ``batches``), from its row id's segment part."""
    if len(batches) == 1:
        return np.zeros(len(rids), dtype=np.int64)
    parts = np.array([b.part for b in batches], dtype=np.int64)
    by_part = np.argsort(parts)
    return by_part[np.searchsorted(parts[by_part], rids >> rowid.PART_SHIFT)]


def scan_keystore(io: FileIO, state: TableState, distinct: pa.Table, buckets: list[int], keep: bool = True):
    """The stored entries of ``distinct`` keys (key columns and ``_bucket``), from the files of their buckets and
    the shared files: found, delta, row id, deleted, in ``distinct``'s order. Each bucket's files are matched with
    the keys wanted there on a thread of their own, then each shared file with all of them, from this process's
    memory (:mod:`bitlake.engine.keys.keycache`), which keeps those it reads as far as its budget allows.
    ``keep=False``: the files this process does not hold, of at least ``keycache.FEW_OF_FILE`` times the rows of
    the keys wanted in them, are read for those keys only and not kept (a restatement's look-up at a past version)."""
    pk = list(state.metadata.primary_key)
    n = distinct.num_rows
    codes = np.arange(n, dtype=np.int64)
    keys = distinct.select(pk).append_column("_code", pa.array(codes))
    # The keys grouped by bucket with one stable sort (a bucket's keys keep their order), each bucket a slice.
    of_key = distinct.column(keystore.BUCKET).to_numpy()
    by_bucket = np.argsort(of_key.astype(np.uint16), kind="stable")
    wanted = keys.take(pa.array(by_bucket))
    sorted_buckets = of_key[by_bucket]
    starts = np.searchsorted(sorted_buckets, buckets, side="left")
    ends = np.searchsorted(sorted_buckets, buckets, side="right")
    slices = {b: (int(a), int(e)) for b, a, e in zip(buckets, starts.tolist(), ends.tolist(), strict=True)}

    found = np.zeros(n, dtype=bool)
    delta, rid, deleted = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, dtype=bool)
    version = np.full(n, -1, np.int64)
    fixed = fixed_width(distinct, pk)
    # keep=False: the files of at least FEW_OF_FILE times the rows of the keys wanted in them, read at once for the
    # first key column values of all the keys (a few more rows than each file's keys).
    wanted_in = {b: e - a for b, (a, e) in slices.items()} | {keystore.SHARED: n}
    few = [] if keep else [f for b in [*buckets, keystore.SHARED] for f in state.keystore.get(b, [])
                           if wanted_in[b] * keycache.FEW_OF_FILE <= f.rows]
    read = keycache.CACHE.entries_for(io, few, state.metadata, pc.unique(distinct.column(pk[0]))) if few else {}

    def of_file(f: BucketFile) -> keycache.Entries:
        return read[f.path] if f.path in read else keycache.CACHE.entries(io, f, state.metadata)

    # Fixed-width keys as int64, converted once: the shared files take them all, a bucket a slice of them in bucket
    # order, whose codes are by_bucket's (codes number distinct's rows).
    columns = [int64_values(distinct.column(c)) for c in pk] if fixed else None
    wanted_columns = [c[by_bucket] for c in columns] if columns is not None else None

    def entries(bucket: int) -> None:
        files = state.keystore.get(bucket, [])
        if not files:
            return
        a, e = slices[bucket]
        of_bucket = [c[a:e] for c in wanted_columns] if wanted_columns is not None else None
        matches = [of_file(f).match(wanted.slice(a, e - a), pk, of_bucket, by_bucket[a:e]) for f in files]
        code = np.concatenate([c for c, _ in matches])
        values = [np.concatenate(v) for v in zip(*(v for _, v in matches), strict=True)]
        if len(files) > 1:  # a key may have a row in several of the bucket's files: its highest _ks_version
            pick = latest(code, values[3])
            code, values = code[pick], [v[pick] for v in values]
        # Each bucket's codes are its own keys': the threads write disjoint places.
        found[code] = True
        delta[code], rid[code], deleted[code], version[code] = values

    shared = state.keystore.get(keystore.SHARED, [])
    held = all(keycache.CACHE.holds(io, f.path) for b in [*buckets, keystore.SHARED] for f in state.keystore.get(b, []))
    if n < _FEW_KEYS and held:
        for bucket in buckets:  # searches in memory: threads would cost more than they share
            entries(bucket)
    else:
        thread_map(entries, buckets)
    if shared:  # rows of every bucket: all the keys at once, a row taken where its version is higher
        for f in shared:
            code, values = of_file(f).match(keys, pk, columns, codes)
            newer = values[3] > version[code]
            code = code[newer]
            found[code] = True
            delta[code], rid[code], deleted[code], version[code] = (v[newer] for v in values)
    return found, delta, rid, deleted
