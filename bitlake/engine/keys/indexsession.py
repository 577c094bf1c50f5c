"""The key index across a writer's commits: :class:`IndexSession` for one commit, and the indexes this process
keeps open between commits.

Opening RocksDB costs a writer time, and each opening writes an ``OPTIONS`` file and RocksDB's info ``LOG`` again, a
fair share of what a small batch writes (docs/benchmarks.md, "Design measurements", "Index session"). So after a
commit has put its entries the index stays open in this process, idle, for ``keystore.index_idle_seconds``
(table property, default 10 s): the process's next commit on the table takes it as it is, without a reopen. An idle
index still holds its lock, so a writer in another process that comes meanwhile scans the key store for its commit,
as it does while a commit uses the index; a table written by several processes in turn sets the property to 0. An
idle index is closed when its time is up, when this process exits or forks, and by :func:`close_idle`; not while
RocksDB compacts it in the background (after a large commit whose SST files overlap newer entries): closing would
stop the compaction midway, and the next opening would start it again. The timer then waits on, and an exit waits
for the compaction, which every later writer would otherwise pay for again.

A commit's own entries go into the index after the commit, on a thread of this process (``bitlake-index``),
while the writer returns: the index serves only later commits, and writing its entries holds the GIL for each
one, a large part of a large upsert's time. The index stays busy until the thread ends; this process's next
commit on the table waits for it, as do :func:`join_updates`, :func:`flush_idle`, :func:`close_idle`, an exit and
a fork.

The entries a commit puts stay in RocksDB's memtable until it fills (64 MB), until a commit's SST files whose keys
overlap them go in, or until the index closes: one file on disk for many small commits, where a flush after each
commit made a file each, which the index's compactions then merged again and again (100 commits of 600 records on
the TPC-H SF 1 index: 9.3 MB of SST files written in 100 flushes and 45 compactions, against 0.8 MB in one flush;
docs/benchmarks.md, "Design measurements", "Index session"). There is no write-ahead log: a process killed before
they reach disk loses them with the versions they carry, and the next writer replays those commits from the key
store (the index is a cache).
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 - its exit hook registered before this module's (below)
import logging
import os
import threading
import time

import pyarrow as pa

from bitlake.engine.keys.keyindex import IndexAheadError, KeyIndex, location, supported
from bitlake.errors import IndexUnavailableError
from bitlake.format.metadata import TableMetadata
from bitlake.format.state import TableState
from bitlake.fs import FileIO

log = logging.getLogger(__name__)

# An exit waits at most this long for the compactions of the indexes this process keeps.
_EXIT_WAIT_SECONDS = 120.0


class _Kept:
    """An index this process opened: in use by a commit (``busy``), or idle until its timer closes it."""

    def __init__(self, index: KeyIndex):
        self.index = index
        self.busy = True
        self.timer: threading.Timer | None = None
        self.update: threading.Thread | None = None  # the update after a commit, while it runs

    def still_there(self) -> bool:
        """Whether the folder and lock file are still the ones it opened (a deleted table's are not)."""
        index = self.index
        try:
            return index.folder is not None and \
                os.path.samestat(os.stat(index.path), os.fstat(index.folder)) and \
                os.path.samestat(os.stat(index._lock.name), os.fstat(index._lock.fileno()))
        except OSError:
            return False

    def stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


_kept: dict[str, _Kept] = {}  # by index folder
_lock = threading.RLock()
_forked: list[KeyIndex] = []  # a forked child's copies of indexes its parent was using: never closed by it


def _borrow(io: FileIO, meta: TableMetadata) -> KeyIndex:
    """The table's index for one commit: the one this process keeps idle (once its update after the last commit
    has ended), else a newly opened one."""
    path, _ = location(io, meta)
    join_updates(path)
    with _lock:
        kept = _kept.get(path)
        if kept is not None and kept.busy:  # another thread's commit
            raise IndexUnavailableError(f"the key index at {path} is in use by another writer")
        if kept is not None and kept.still_there():
            kept.stop_timer()
            kept.busy = True
            kept.index.io, kept.index.meta = io, meta
            return kept.index
        _close(path)
        index = KeyIndex(io, meta)
        _kept[path] = _Kept(index)
        return index


def _give_back(index: KeyIndex, idle_seconds: float) -> None:
    """Ends a commit's use of ``index``: it stays open ``idle_seconds`` (its entries in the memtable, see the
    module's doc), or closes now, which writes them."""
    index.discard_staged()
    with _lock:
        kept = _kept_for(index)
        if kept is None or index.db is None:  # or left closed by a rebuild that failed midway
            if kept is not None:
                del _kept[index.path]
            index.close()
            return
        kept.busy = False
        if idle_seconds <= 0:
            _close(index.path)
            return
        _arm(kept, idle_seconds)


def _arm(kept: _Kept, idle_seconds: float) -> None:
    """Starts ``kept``'s idle timer: when it is up, the index closes, unless RocksDB still compacts it; then the timer
    starts again. Closing stops a compaction midway, and the next opening starts it again from the start (a 10 %
    upsert at TPC-H SF 30 left one of 10 s, which the idle close cut short, and the next commit waited 10 s more
    for all of it again)."""
    def up() -> None:
        with _lock:
            if _kept.get(kept.index.path) is not kept or kept.busy:
                return
            if _compacting(kept.index.db):
                _arm(kept, idle_seconds)
                return
        close_idle(kept.index.path)

    kept.timer = threading.Timer(idle_seconds, up)
    kept.timer.daemon = True
    kept.timer.start()


def _compacting(db) -> bool:
    """Whether RocksDB runs or has pending a compaction of the open database ``db`` (False: closed meanwhile)."""
    try:
        return db is not None and bool(db.property_int_value("rocksdb.num-running-compactions") or
                                       db.property_int_value("rocksdb.compaction-pending"))
    except Exception:  # noqa: BLE001 - closed meanwhile: a closed index runs no compaction
        return False


def _kept_for(index: KeyIndex) -> _Kept | None:
    """What this process keeps of ``index`` (None when the index it keeps at that folder is another one)."""
    kept = _kept.get(index.path)
    return kept if kept is not None and kept.index is index else None


def join_updates(path: str | None = None) -> None:
    """Waits for the updates after a commit that run on this process's threads (of the index at ``path``): the
    work a commit leaves behind (a benchmark counts it as the commit's)."""
    with _lock:
        running = [k.update for p, k in _kept.items() if k.update is not None and path in (None, p)]
    for thread in running:
        if thread is not threading.current_thread():
            thread.join()


def join_compactions(path: str | None = None, timeout: float | None = None, poll_seconds: float = 0.05) -> None:
    """Waits for the updates after a commit (:func:`join_updates`), then for the compactions RocksDB runs in the
    background of the indexes this process keeps (of the one at ``path``): all the work the commits left behind. A
    large commit's SST files that overlap the index's newer entries go to its first level, which a compaction merges
    after the commit; a benchmark counts its time and bytes as that commit's, not the next operation's. ``timeout``:
    seconds after which it returns all the same."""
    join_updates(path)
    deadline = None if timeout is None else time.monotonic() + timeout
    while deadline is None or time.monotonic() < deadline:
        with _lock:
            dbs = [k.index.db for p, k in _kept.items() if path in (None, p)]
        if not any(_compacting(db) for db in dbs):
            return
        time.sleep(poll_seconds)


def _close(path: str) -> None:
    """Closes and forgets the index at ``path`` unless a commit is using it."""
    kept = _kept.get(path)
    if kept is None or kept.busy:
        return
    kept.stop_timer()
    del _kept[path]
    try:
        kept.index.close()
    except Exception:  # noqa: BLE001 - a cache whose folder went (a deleted table): nothing of the table is lost
        pass


def close_idle(path: str | None = None) -> None:
    """Closes the idle indexes this process keeps (the one at ``path`` only, when given), once their updates after
    a commit have ended."""
    join_updates(path)
    with _lock:
        for p in [path] if path is not None else list(_kept):
            _close(p)


def flush_idle() -> None:
    """Waits for the updates after a commit (:func:`join_updates`), then writes the entries the idle indexes this
    process keeps hold in memory to disk: before copying an index's files."""
    join_updates()
    with _lock:
        for path, kept in list(_kept.items()):
            if not kept.busy and kept.index.db is not None:
                try:
                    kept.index.db.flush()
                except Exception:  # noqa: BLE001 - a cache whose folder went (a deleted table): closed, as it is
                    _close(path)


def _after_fork_in_child() -> None:
    """A forked child must not use or close its parent's open RocksDB: it forgets the indexes that were in use
    (idle ones were closed before the fork) and closes its copy of their lock files."""
    global _lock
    _lock = threading.RLock()
    for kept in _kept.values():
        kept.index._lock.close()
        if kept.index.folder is not None:
            os.close(kept.index.folder)
            kept.index.folder = None
        _forked.append(kept.index)
    _kept.clear()


# At exit, the updates after a commit finish before concurrent.futures stops taking work: an update (a rebuild, a
# catch-up) reads and writes on pools of threads, which refuse new work once its exit hook ran (the index would be
# left behind, with a traceback on the way out). threading runs these hooks in the reverse order of their
# registration, so this one, registered after concurrent.futures' own, runs first; atexit's run after both. (A
# Python without the hook, private to threading since 3.9, leaves the updates to close_idle as before.)
getattr(threading, "_register_atexit", lambda hook: None)(join_updates)
atexit.register(lambda: (join_compactions(timeout=_EXIT_WAIT_SECONDS), close_idle()))
os.register_at_fork(before=close_idle, after_in_child=_after_fork_in_child)


class IndexSession:
    """The key index across one commit's attempts: taken at most once, caught up to each attempt's state,
    brought to the committed version afterwards (so the next inline MetaGen starts warm), then given back."""

    def __init__(self, io: FileIO):
        self.io = io
        self.index: KeyIndex | None = None
        self._idle_seconds = 0.0
        self._unavailable = False

    def _take(self, meta: TableMetadata) -> KeyIndex:
        if self.index is None:
            self.index = _borrow(self.io, meta)
            self._idle_seconds = float(meta.prop("keystore.index_idle_seconds"))
        return self.index

    def at(self, state: TableState) -> KeyIndex | None:
        """The index at ``state``, or None when the table has none or another writer holds it.

        Raises IndexAheadError when the index is past ``state``: the state is stale, rebuild on a fresh one.
        """
        if self._unavailable or not supported(state.metadata):
            return None
        try:
            self._take(state.metadata).catch_up(state)
        except IndexAheadError:
            raise
        except IndexUnavailableError:
            self._unavailable = True  # busy: the inline MetaGen reads the key store instead
            return None
        return self.index

    def after_commit(self, state: TableState, version: int, rows: pa.Table | None = None) -> None:
        """Starts bringing the index to ``state`` after this writer committed ``version``, whose key-store rows are
        ``rows`` when the writer has them (else they are read back from the key store), on a thread that gives
        the index back when it ends. Best effort: the commit has landed, and an index that is busy, behind or
        left by a failed update only costs the next writer a catch-up (or a rebuild)."""
        if not supported(state.metadata):
            return
        try:
            index = self._take(state.metadata)
        except IndexUnavailableError:
            return
        self.index, idle_seconds = None, self._idle_seconds  # the thread gives it back

        def update() -> None:
            try:
                if not index.commit_staged(version) and rows is not None and index.version == version - 1:
                    index.put([rows], version)
                index.catch_up(state)
            except Exception:  # noqa: BLE001 - a cache: the commit stands whatever befalls its index
                log.warning("updating the key index at %s after commit %d failed; the next writer catches it up",
                            index.path, version, exc_info=True)
            finally:
                with _lock:
                    if (kept := _kept_for(index)) is not None:
                        kept.update = None
                _give_back(index, idle_seconds)

        thread = threading.Thread(target=update, name="bitlake-index", daemon=True)
        with _lock:
            if (kept := _kept_for(index)) is not None:
                kept.update = thread
        thread.start()

    def close(self) -> None:
        if self.index is not None:
            _give_back(self.index, self._idle_seconds)
            self.index = None
