"""Table upkeep: compaction's commit, cleanup of leftovers and expired files, the automatic upkeep that runs
them when due, and upgrading format v1 tables."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import pyarrow as pa

from bitlake import faults, transaction
from bitlake.engine.maintain import compaction, upkeep
from bitlake.errors import CommitConflictError, InvalidInputError
from bitlake.format import bucket, commitlog, datafile, keystore, layout, v1
from bitlake.format import state as state_mod
from bitlake.format.commit import ANALYZE, LIVE, UPGRADE, BucketFile, Commit, FileStats
from bitlake.format.metadata import TableMetadata
from bitlake.format.protocol import FORMAT_VERSION, V1_HISTORY, Protocol
from bitlake.format.state import TableState
from bitlake.fs import FileIO
from bitlake.pool import thread_map
from bitlake.transaction import Attempt, Transaction

log = logging.getLogger(__name__)


def referenced(io: FileIO, latest: TableState, start: int | None = None) -> set[str]:
    """Every file a version from ``start`` on may read (default: the retention window's start, or version 0 when
    no major compaction set one): the state at ``start``, and what each later commit added. Keys files of
    batches made live before ``start`` are not read again (a change range cannot start before it), nor are the
    change files of commits up to it."""
    if start is None:
        start = latest.window.version if latest.window else 0
    base = latest if start == latest.version else state_mod.load(io, start)
    base = base.read_through(latest.rewritten)  # a vacuum's rewritten files are read by no version
    out: set[str] = set()
    out.update(f.path for f in base.files.values())
    out.update(f.offsets for f in base.files.values() if f.offsets)
    out.update(f.path for b in base.parts.values() if b.live_version is None for f in b.keys_files)
    out.update(f.path for _, f in base.logs)
    out.update(p for s in base.segments.values() for p in (s.bitmap, s.delta) if p)
    out.update(f.path for files in base.keystore.values() for f in files)
    out.update(t.path for _, t in base.tombstones)
    out.update(f.path for _, f in base.purged)
    for v in range(start + 1, latest.version + 1):
        c = commitlog.read(io, v)
        out.update(f.path for f in c.add_files)
        out.update(f.offsets for f in c.add_files if f.offsets)
        out.update(f.path for b in c.batches for f in b.keys_files)
        out.update(f.path for f in c.logs)
        out.update(p for s in c.segments for p in (s.bitmap, s.delta) if p)
        out.update(f.path for f in c.keystore_add)
        out.update(f.path for f in c.prior_entries)
        out.update(t.path for t in c.tombstones)
        out.update(f.path for f in c.change_files)
        out.update(f.path for f in c.purged)
        out.update(p for r in c.rewrites if r.to for p in (r.to.path, r.to.offsets) if p)
    out.difference_update(latest.rewritten)
    return out


def cleanup(io: FileIO, state: TableState, *, min_age_seconds: float, dry_run: bool) -> list[str]:
    """Removes files that no version inside the retention window names and that are older than
    ``min_age_seconds``: the leftovers of writers that crashed, lost a race or were refused, and the files
    only expired versions read. A writer still running, or a reader of a version inside the window, keeps its
    files."""
    now = time.time()
    start = protected_start(io, state, now - min_age_seconds)
    named = referenced(io, state, start)

    def old(rel: str) -> bool:
        try:
            return now - io.mtime(rel) >= min_age_seconds
        except FileNotFoundError:  # removed meanwhile (a writer's temporary file)
            return False

    removable = [rel for folder in layout.REFERENCED_DIRS for rel in io.walk(folder) if rel not in named and old(rel)]
    removable += expired_log(io, state, start, old, dry_run)
    for folder in (layout.COMMITS_DIR, layout.CHECKPOINTS_DIR, layout.PARTS_DIR):
        removable += [rel for rel in io.walk(folder)
                      if rel.rsplit("/", 1)[-1].startswith(layout.TMP_PREFIX) and old(rel)]
    # Claims of parts that committed or were given up: the state's max_part keeps new claims above them.
    for name in io.listdir(layout.PARTS_DIR):
        rel = f"{layout.PARTS_DIR}/{name}"
        if name.isdigit() and int(name) <= state.max_part and old(rel):
            removable.append(rel)
    if not dry_run:
        for rel in removable:
            io.delete(rel)
            faults.point("in_cleanup")
        io.remove_empty_dirs(layout.DATA_DIR)
    return sorted(removable)


def protected_start(io: FileIO, state: TableState, since_s: float) -> int:
    """The oldest version cleanup keeps the files of: the retention window's start, or, when earlier, the
    version that was the latest at time ``since_s`` (a reader that planned on any version that was the latest
    since then keeps reading it, as Delta keeps removed files for its retention period), but no version whose
    commit cleanup already dropped."""
    window = state.window.version if state.window else 0
    earliest = state_mod.earliest_version(io)
    if window <= earliest:
        return window
    since_ms = int(since_s * 1000)  # commit times are whole milliseconds: the same comparisons
    if commitlog.read(io, earliest).timestamp_ms > since_ms:
        return earliest
    return commitlog.last_at_or_before(io, earliest, window, since_ms)


def expired_log(io: FileIO, state: TableState, start: int, old, dry_run: bool) -> list[str]:
    """The commits and checkpoints before version ``start`` (at most the retention window's start; old enough by
    ``old``), once a checkpoint holds the state at ``start``: cleanup writes it first, so the log stays loadable
    from ``start`` on."""
    if start == 0:
        return []
    commits = [layout.commit_path(v) for v in commitlog.list_versions(io) if v < start]
    checkpoints = [layout.checkpoint_path(v) for v in state_mod.checkpoint_versions(io) if v < start]
    expired = [rel for rel in commits + checkpoints if old(rel)]
    if expired and start not in state_mod.checkpoint_versions(io) and not dry_run:
        state_mod.write_checkpoint(io, state_mod.load(io, start))
    # Oldest first: a crash part-way leaves a log that still starts at a loadable version.
    return sorted(expired, key=lambda rel: (rel.startswith(layout.CHECKPOINTS_DIR), rel))


def compact(io: FileIO, refresh, **options) -> Any:
    """A compaction (:mod:`bitlake.engine.maintain.compaction`) planned and written on the latest state, then committed;
    a compaction that another one beat to its files removes what it wrote and returns ``version=None``. A major
    one that a revert or replace overtook (its purge may leave out a row they made valid again), or one whose
    input a vacuum deleted meanwhile, plans again (three attempts, then ``CommitConflictError``)."""
    for _ in range(COMPACT_ATTEMPTS):
        state = refresh()
        with Transaction(io, refresh) as tx:
            try:
                prepared = compaction.prepare(io, state, **options)
            except FileNotFoundError:
                if refresh().version == state.version:
                    raise
                continue  # a vacuum committed meanwhile deleted a file it was reading: plan again
            if not isinstance(prepared, compaction.Prepared):
                return prepared if prepared is not None else compaction.CompactResult(None)
            tx.own(*prepared.written)  # they go unless its commit lands
            c = tx.commit(lambda latest, p=prepared: Attempt(p.commit(latest)))
            if c is not None:
                return dataclasses.replace(prepared.result, version=c.version)
        if not prepared.replan:
            return compaction.CompactResult(None)
    raise CommitConflictError(f"compaction gave up after {COMPACT_ATTEMPTS} attempts: restatements or vacuums of "
                              f"{io.uri()} kept committing while it ran")


COMPACT_ATTEMPTS = 3


@dataclasses.dataclass(frozen=True)
class MaintainResult:
    """What ``maintain()`` found and did: the metrics, the jobs due (with their reasons and expected gains),
    the compaction's result (None: none ran) and the files cleanup removed (with ``dry_run``: would remove)."""

    metrics: upkeep.Metrics
    tasks: list[upkeep.Task]
    compaction: Any = None
    removed: list[str] = dataclasses.field(default_factory=list)
    dry_run: bool = False


def maintain(io: FileIO, refresh, *, dry_run: bool = False, min_age_seconds: float = 3600.0,
             progress=None) -> MaintainResult:
    """Runs the upkeep the table's metrics call for (:func:`bitlake.engine.maintain.upkeep.due`): a major or a minor
    compaction, then cleanup. A table that needs nothing costs its metrics: the commit log, the bitmaps and a
    listing, no data."""
    state = refresh()
    found = upkeep.metrics(io, state)
    tasks = upkeep.due(io, state, found)
    if dry_run:
        return MaintainResult(found, tasks, None, cleanup(io, state, min_age_seconds=min_age_seconds, dry_run=True),
                              True)
    result = None
    removed: list[str] = []
    for task in tasks:
        if task.name in (upkeep.MAJOR, upkeep.MINOR):
            result = compact(io, refresh, major=task.name == upkeep.MAJOR, progress=progress)
        else:
            removed = cleanup(io, refresh(), min_age_seconds=min_age_seconds, dry_run=False)
    return MaintainResult(found, tasks, result, removed)


def after_commit(io: FileIO, refresh, version: int) -> Any:
    """The upkeep a table with ``maintain.auto`` runs after an ingest or MetaGen commit: a minor compaction of
    at most ``maintain.auto_budget`` times the bytes of the batches that commit made visible, so a small batch
    never pays for a large compaction (the rest waits for ``maintain()``). The commit it follows stands
    whatever happens here: a failure is logged, not raised. Returns the compaction's result, or None."""
    state = refresh()
    if not state.metadata.bool_prop("maintain.auto"):
        return None
    parts = {b.part for b in commitlog.read(io, version).batches if b.status == LIVE}
    added = sum(f.bytes for f in state.files.values() if any(r.part in parts for r in f.segments))
    budget = int(state.metadata.float_prop("maintain.auto_budget") * added)
    if budget <= 0:
        return None
    try:
        return compact(io, refresh, budget=budget)
    except Exception:
        log.exception("the upkeep after version %d of %s failed; the commit stands", version, io.uri())
        return None


def analyze(io: FileIO, refresh) -> Commit | None:
    """Records the column statistics of the data files of the latest version that have none (written before
    bitlake recorded them, or by format v1), read from their values, in one ``ANALYZE`` commit, so that readers
    prune them by a filter too. Returns None when every file has them. No view changes; a file a concurrent
    compaction or vacuum removed meanwhile is left out (its replacement has its own)."""
    computed: dict[str, FileStats] = {}  # by path, kept across attempts

    def build(state: TableState):
        missing = [f for f in state.data_files() if f.stats is None]
        if not missing:
            return Attempt(None)
        computed.update((fs.path, fs) for fs in _file_stats(io, state.metadata,
                                                             [f for f in missing if f.path not in computed]))
        return Attempt(Commit(state.version + 1, ANALYZE, commitlog.now_ms(state.timestamp_ms),
                              parameters={"files": len(missing)},
                              file_stats=tuple(computed[f.path] for f in missing)))

    return transaction.run(io, refresh, build)


def _file_stats(io: FileIO, meta: TableMetadata, files: list) -> tuple[FileStats, ...]:
    """The column statistics of data files written without them, read from their values (on threads)."""
    return tuple(FileStats(f.path, st) for f, st in zip(
        files, thread_map(lambda f: datafile.file_stats(io, f.path, meta), files), strict=True))


def upgrade(io: FileIO, refresh) -> Commit | None:
    """Upgrades a format v1 table to v2 in one commit: the v2 protocol and metadata, the key store
    re-bucketed by the v2 bucket hash, and the data files' column statistics. History stays readable (the
    ``v1History`` feature). Returns None when the table already is v2."""

    def build(state: TableState):
        if state.protocol.writer_version >= FORMAT_VERSION:
            return Attempt(None)
        if state.pending:
            raise InvalidInputError(
                f"{io.uri()} has pending batches {[b.batch_id for b in state.pending]}: run MetaGen with bitlake "
                "0.1 first (format v1 pending batches carry v1 buckets)"
            )
        meta: TableMetadata = state.metadata
        added: list[BucketFile] = []
        removed: list[str] = []
        if meta.keyed and state.keystore:
            schema = keystore.file_schema(meta)
            stored = [v1.read_keystore_file(io, f.path).select(schema.names).cast(schema)
                      for files in state.keystore.values() for f in files]
            entries = keystore.latest_per_key(pa.concat_tables(stored), list(meta.primary_key))
            rows = entries.append_column(keystore.BUCKET,
                                         pa.array(bucket.buckets(entries, meta.primary_key, meta.num_buckets)))
            added, _ = keystore.write_bucket_files(io, meta, {}, rows)
            removed = [f.path for files in state.keystore.values() for f in files]
        protocol = Protocol().with_features(V1_HISTORY)
        c = Commit(state.version + 1, UPGRADE, commitlog.now_ms(state.timestamp_ms),
                   parameters={"from_format_version": state.protocol.writer_version}, protocol=protocol,
                   metadata=meta.to_json(), keystore_add=tuple(added), keystore_remove=tuple(removed),
                   file_stats=_file_stats(io, meta, state.data_files()))  # which format v1 did not record
        return Attempt(c, tuple(f.path for f in added))

    return transaction.run(io, refresh, build)
