"""The key index: a RocksDB copy of the key store for point lookups (Opal's inline mode).

The key store (:mod:`bitlake.keystore`) is the truth: versioned Parquet files that every commit
names. The index is a cache of its latest entries, key -> (delta, row id, deleted), kept in a
RocksDB database (rocksdict) on the writer's machine, with the table id and the commit version it
reflects stored in the same atomic write batch as the entries. It is brought up to a version by
replaying the key-store rows of later commits, never from uncommitted work, so it cannot be ahead of
the commit log; a missing, foreign or unreadable index is rebuilt from the key-store files.

One writer holds the index at a time: an exclusive ``flock`` on ``_bitlake/index.lock``, taken before
RocksDB opens the database and released after it closes. RocksDB's own lock would not do, since a
rebuild closes the database and opens a fresh one: in between, another writer could open the old one
while the rebuild deletes it. A writer that finds the index held by another
(:class:`~bitlake.errors.IndexUnavailableError`) has the inline MetaGen scan the key store instead,
which is slower for small batches, never wrong.

Keys are the bytes of :mod:`bitlake.engine.keys.keyencoding` with the key's bucket before the key columns, so
that a bucket's entries are one range of the index: the entries of a set of buckets (a group of a spilled
MetaGen, whose groups are runs of buckets) go in as SST files that overlap no other group's, which RocksDB puts
at the bottom as one sorted run, with nothing to compact (overlapping files, as a key order alone gave, were
merged by a compaction that the next batches paid for). Tables whose key types it cannot encode as fixed-width or
length-prefixed values (decimals) have no index: their inline MetaGen scans the key store.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from bitlake import faults
from bitlake.engine.keys import keyblocks
from bitlake.engine.keys.keyencoding import (
    ascending,
    decode_values,
    encodable,
    encode_keys,
    encode_values,
    fixed_width,
    int64_order,
    int64_values,
    key_order,
)
from bitlake.engine.keys.sstwrite import PUT_CHUNK, put_each, write_blocks, write_sst
from bitlake.errors import IndexUnavailableError
from bitlake.format import bucket, commitlog, keystore, layout
from bitlake.format.metadata import TableMetadata
from bitlake.format.order import non_decreasing
from bitlake.format.state import TableState
from bitlake.fs import FileIO
from bitlake.pool import thread_map, threads

# The index's own entries start with byte 0; encoded keys with byte 1.
_VERSION_KEY = b"\x00bitlake:version"
_TABLE_KEY = b"\x00bitlake:table_id"
# The encoding of the keys and values (encode_keys, encode_values): an index written in another is rebuilt.
_FORMAT_KEY = b"\x00bitlake:format"
_FORMAT = b"4"  # 3: the bucket before the key; 4: the bottom run of fixed-width keys in blocks
# At least this many entries go in as SST files rather than as puts; from _PROCESS_SST_ROWS entries, the SST
# files are written by one process per core (fewer entries cost less than a process's start-up), and a commit of
# that many records stages its entries, written by those processes while it commits (KeyIndex.stage).
_SST_MIN_ROWS = 200_000
# Entries taken in at once, as one sorted run: a load's or a rebuild's larger set goes in as several runs (which
# RocksDB's compaction merges later), so that its memory is a run's, not the table's.
RUN_ROWS = 8_000_000
_PROCESS_SST_ROWS = 2_000_000
# Two kinds of files. The bottom run, which holds most keys (the SST files of a load into an empty index, and
# what a full compaction makes of it), is made for lookups: LZ4 in small blocks and no bloom filter, since most
# lookups read one of its blocks, so decompressing it is much of their cost, and a filter there spares nothing to a
# lookup that finds its key (RocksDB's optimize_filters_for_hits) while it takes room. Everything else (a commit's
# memtable flush, its staged SST files, compactions above the bottom run) is made for writing fast, as the next
# commit may wait for a flush: zstd at its default level 3 in blocks of 16 KB, with filters. Larger blocks cost a lookup
# that finds its key above the bottom more to decompress; most keys are in the bottom.
# Measured (benchmarks/probes/index_options.py): docs/benchmarks.md, "Design measurements", "Key index format".
_UPPER_LEVEL = 3
_UPPER_BLOCK_BYTES = 16384
_BOTTOM_BLOCK_BYTES = 2048
# Lookups of fewer keys than this run on one thread.
_LOOKUP_CHUNK = 4096


# The files waiting in RocksDB's first level past which it slows writes (twice as many: stops them).
_STALL_FILES = 256


def stages(records: int) -> bool:
    """Whether a commit of ``records`` records gains by staging its key-index entries (:meth:`KeyIndex.stage`):
    writing SST files costs time per entry, which processes started while the commit finishes take off its path.
    A thread would not: it holds the GIL for each entry, and the commit's own threads, which write its files,
    then wait for it. Smaller commits' entries go in after the commit
    (:meth:`bitlake.engine.keys.indexsession.IndexSession.after_commit`): for them a process's start-up costs more
    than staging saves (docs/benchmarks.md, "Design measurements", "Key index: staging and the GIL")."""
    return records >= _PROCESS_SST_ROWS


def location(io: FileIO, meta: TableMetadata) -> tuple[str, str]:
    """The index's folder and lock file: beside the table when it is local, else in the user's cache
    folder (``$BITLAKE_CACHE`` or ``~/.cache/bitlake``), keyed by the table id and its URI (a copy of a table
    keeps its id, and goes its own way)."""
    local, lock = io.local_path(layout.INDEX_DIR), io.local_path(layout.INDEX_LOCK)
    if local is not None and lock is not None:
        return local, lock
    root = os.environ.get("BITLAKE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "bitlake")
    where = hashlib.sha256(io.uri().encode()).hexdigest()[:16]
    folder = os.path.join(root, "index", f"{meta.table_id}-{where}")
    return folder, folder + ".lock"


def supported(meta: TableMetadata) -> bool:
    """Whether this table's key types can be encoded, so that it can have an index."""
    return meta.keyed and meta.prop("keystore.index") == "rocksdb" and all(
        encodable(meta.schema.field(c).type) for c in meta.primary_key
    )


class IndexAheadError(IndexUnavailableError):
    """Another writer committed (and updated the index) after this writer read the table's state:
    whatever it builds on that state would lose the commit race, so it should refresh first."""


class KeyIndex:
    """An open index; use as a context manager so that the RocksDB lock is released."""

    def __init__(self, io: FileIO, meta: TableMetadata):
        try:
            import rocksdict  # noqa: F401
        except ImportError as e:  # pragma: no cover - rocksdict is a dependency
            raise IndexUnavailableError("rocksdict is not installed") from e
        if not supported(meta):
            raise IndexUnavailableError("the table's key types or its keystore.index property allow no index")
        self.meta = meta
        self.io = io
        self.path, lock = location(io, meta)
        self.db: Any = None  # a rocksdict.Rdict while open
        self.folder: int | None = None  # a descriptor of the open database's folder
        self._staged: tuple[int, list[_SstWriting]] | None = None  # a version and its SST files (see stage)
        self._directory: tuple[keyblocks.Blocks | None] | None = None  # the blocks, once read (see _blocks)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._lock = open(lock, "ab")  # noqa: SIM115 - held until close()
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise IndexUnavailableError(f"the key index at {self.path} is in use by another writer") from None
        try:
            try:
                self.db = self._open()
            except Exception as e:
                if "lock" in str(e).lower():  # a writer of a bitlake from before index.lock
                    raise IndexUnavailableError(f"the key index at {self.path} is in use by another writer") from e
                # A corrupt or half-created folder is repaired by starting afresh: the index is only a cache.
                shutil.rmtree(self.path, ignore_errors=True)
                self.db = self._open()
        except BaseException:
            self._close_folder()
            self._lock.close()
            raise

    def _open(self):
        from rocksdict import Rdict, ReadOptions, WriteOptions

        # The folder is held open, so that one deleted or replaced meanwhile can never show this one's inode,
        # and RocksDB reaches it through that descriptor where the system allows: a table deleted and created
        # again at its path while this process keeps its index idle gets a folder this database never writes
        # to (closing it would otherwise flush into, and purge files of, the new table's index).
        os.makedirs(self.path, exist_ok=True)
        self._close_folder()
        self.folder = os.open(self.path, os.O_RDONLY)
        held = f"/proc/self/fd/{self.folder}"
        # The options go to the default column family too: rocksdict would otherwise open an existing database
        # with the column family's options read back from its OPTIONS file, which lose the bloom filter (every
        # file a reopened index flushed had none, and every lookup read a block of each of them).
        options = self._options()
        db = Rdict(held if os.path.isdir(held) else self.path, options, column_families={"default": options})
        for name in os.listdir(self.path):  # SST files a killed writer left (RocksDB never reads them)
            if name.startswith(("stage-", "ingest-")):
                os.remove(os.path.join(self.path, name))
        # No write-ahead log: memtables reach disk in write order, so after a crash the index holds
        # a prefix of its writes, and the version is written last (see put). close() flushes.
        write = WriteOptions()
        write.disable_wal = True
        db.set_write_options(write)
        # Lookups of a batch's keys hit blocks all over the index, seldom one another's: putting each block
        # in RocksDB's block cache, and evicting one for it, costs more than the lookup itself
        # (docs/benchmarks.md, "Design measurements"). The system's page cache keeps the files' blocks.
        read = ReadOptions()
        read.fill_cache(False)
        db.set_read_options(read)
        return db

    @staticmethod
    def _options(sst: str | None = None):
        """The database's options, or (``sst``: ``"bottom"`` or ``"upper"``) those of an SST file this index writes
        for its bottom run or above it (see _BOTTOM_BLOCK_BYTES)."""
        from rocksdict import BlockBasedOptions, DBCompactionStyle, DBCompressionType, Options, UniversalCompactOptions

        options = Options(raw_mode=True)
        options.set_compression_type(DBCompressionType.lz4() if sst == "bottom" else DBCompressionType.zstd())
        options.set_compression_options(-14, _UPPER_LEVEL, 0, 0)  # window bits and strategy: RocksDB's defaults
        if sst is None:  # (an SST file writer would take the bottom's compression for every file)
            options.set_bottommost_compression_type(DBCompressionType.lz4())
            options.set_optimize_filters_for_hits(True)
        # Universal (tiered) compaction merges new files with files of similar size, so a small
        # commit does not rewrite the whole index, as leveled compaction does for random keys. It
        # leaves several sorted runs; bloom filters spare a lookup the runs above the bottom that lack its key.
        options.set_compaction_style(DBCompactionStyle.universal())
        # Defaults merged everything on the first few commits after a large load, so a small commit wrote much of
        # the index (docs/benchmarks.md, "Design measurements"); allowing more runs and more space amplification
        # keeps a small commit's writes small, and a full merge rare.
        universal = UniversalCompactOptions()
        universal.max_size_amplification_percent = 400
        options.set_universal_compaction_options(universal)
        options.set_level_zero_file_num_compaction_trigger(8)
        # A large commit stages its entries as many files (two per group of a spilled MetaGen). When they overlapped
        # (index format 2), RocksDB's default triggers (20 and 36 files) stalled the flush after the commit, which
        # the next writer waits for, until a compaction had merged them (docs/benchmarks.md, "Design measurements",
        # "Key index: staging and the GIL"); files that overlap go to the first level still (a commit's staged
        # entries over an index that holds keys of their buckets), and a compaction of them runs after the commit.
        options.set_level_zero_slowdown_writes_trigger(_STALL_FILES)
        options.set_level_zero_stop_writes_trigger(2 * _STALL_FILES)
        options.set_keep_log_file_num(1)  # RocksDB's own info log: keep no old ones
        table = BlockBasedOptions()
        if sst == "bottom":
            table.set_block_size(_BOTTOM_BLOCK_BYTES)
        else:
            table.set_block_size(_UPPER_BLOCK_BYTES)
            table.set_bloom_filter(10, False)
        options.set_block_based_table_factory(table)
        return options

    def _close_folder(self) -> None:
        folder, self.folder = self.folder, None
        if folder is not None:
            os.close(folder)

    def __enter__(self) -> KeyIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Flushes and closes the database, then lets other writers in; closing again does nothing."""
        db, self.db = self.db, None
        try:
            self.discard_staged()
            if db is not None:
                db.flush()
                db.close()
        finally:
            self._close_folder()
            self._lock.close()  # releases the flock

    @property
    def version(self) -> int:
        """The commit version the entries reflect; -1 for an empty or foreign index."""
        if self.db.get(_TABLE_KEY) != self.meta.table_id.encode() or self.db.get(_FORMAT_KEY) != _FORMAT:
            return -1
        v = self.db.get(_VERSION_KEY)
        return -1 if v is None else int(v)

    def catch_up(self, state: TableState) -> None:
        """Brings the index to ``state.version`` from the commit log (the key-store rows of later commits)."""
        # Staged files are this writer's own uncommitted attempt: a catch-up puts what the log holds instead.
        self.discard_staged()
        have = self.version
        if have > state.version:
            raise IndexAheadError(f"the key index is at version {have}, past the state read ({state.version})")
        if have < 0:
            self._rebuild(state)
            return
        try:
            for v in range(have + 1, state.version + 1):
                commit = commitlog.read(self.io, v)
                # A merged file also repeats older rows; only rows this commit wrote are new to the index.
                tables = (keystore.read_file(self.io, f, self.meta, filters=[(keystore.VERSION, "=", v)])
                          for f in commit.keystore_add)
                self.put(tables, v, rows=sum(f.rows for f in commit.keystore_add))
        except FileNotFoundError:  # commits before the retention window, or their key-store files, gone with cleanup
            self._rebuild(state)

    def _rebuild(self, state: TableState) -> None:
        db, self.db = self.db, None
        db.close()  # safe under the index lock: no other writer can open the folder meanwhile
        shutil.rmtree(self.path, ignore_errors=True)
        self.db = self._open()
        self._directory = None
        files = state.keystore
        if keystore.SHARED in files:  # a small table's shared files hold rows of every bucket: read at once
            tables = iter(keystore.read_entries(self.io, files, self.meta))
        else:  # a bucket at a time
            tables = (t for b in sorted(files) for t in keystore.read_entries(self.io, {b: files[b]}, self.meta))
        self.put(tables, state.version, rows=sum(f.rows for fs in files.values() for f in fs))

    def put(self, tables: Iterable[pa.Table], version: int, rows: int | None = None) -> None:
        """Writes the entries of ``tables`` (key-store rows, one per key), then the version. Many entries (``rows``,
        when given, says how many ``tables`` hold at most, before they are read) go in as sorted runs of at most
        :data:`RUN_ROWS` each, so that the tables are read a run at a time."""
        from rocksdict import WriteBatch

        pk = list(self.meta.primary_key)
        if rows is None:
            tables = [t for t in tables if t.num_rows]
            rows = sum(t.num_rows for t in tables)
        if rows >= _SST_MIN_ROWS:
            bottom, after = self._empty(), None
            for run in _runs(tables, RUN_ROWS):
                after = self._ingest_sorted(run, bottom, after)
            tables = []
        for table in tables:
            for start in range(0, table.num_rows, PUT_CHUNK):
                chunk = table.slice(start, PUT_CHUNK)
                buckets = self._buckets(chunk)
                if fixed_width(chunk, pk):  # RocksDB takes entries in its order 5x as fast as in random order
                    order = index_order(chunk, pk, buckets)
                    chunk, buckets = chunk.take(pa.array(order)), buckets[order]
                batch = WriteBatch(raw_mode=True)
                put_each(batch.put, encode_keys(chunk, pk, buckets), encode_values(chunk))
                self.db.write(batch)
        self._put_version(version)

    def _put_version(self, version: int) -> None:
        from rocksdict import WriteBatch

        # The version goes last: after a crash the index claims the older version, and replaying
        # from there puts the same entries again (puts are idempotent and applied in commit order).
        faults.point("in_index_update")
        batch = WriteBatch(raw_mode=True)
        batch.put(_TABLE_KEY, self.meta.table_id.encode())
        batch.put(_FORMAT_KEY, _FORMAT)
        batch.put(_VERSION_KEY, str(version).encode())
        self.db.write(batch)

    def stage(self, rows: pa.Table, version: int) -> None:
        """Starts writing key-store rows ``rows`` of the commit that will be ``version`` as SST files, in
        processes of their own, while the writer finishes and commits it (rows staged again for the same
        version add files); :meth:`commit_staged` takes them in after that commit. Nothing reaches the
        database before, so the index is never ahead of the commit log."""
        if self._staged is not None and self._staged[0] != version:
            self.discard_staged()
        if self._staged is None:
            self._staged = (version, [])
        if self._staged[1]:  # one staging's processes at a time: each holds its rows, and they share the cores
            self._staged[1][-1].wait()
        self._staged[1].append(self._start_ssts(rows, f"stage-{version}-{len(self._staged[1])}"))

    def commit_staged(self, version: int) -> bool:
        """Takes in the files staged for ``version``, which this writer has just committed with the index at
        the version before; False when nothing was staged for it."""
        staged, self._staged = self._staged, None
        if staged is None or staged[0] != version or self.version != version - 1:
            self._discard(staged)
            return False
        blocks = sorted((w for w in staged[1] if w.blocks is not None), key=lambda w: w.blocks[0])
        if any(a.last >= bytes(b.blocks[0]) for a, b in zip(blocks, blocks[1:], strict=False)):  # their ranges overlap
            self._discard(staged)
            return False
        try:
            for writing in staged[1]:
                writing.wait()
                self.db.ingest_external_file(writing.paths)
                writing.remove()
        finally:
            self._discard(staged)
        self._add_to_directory([w.blocks for w in blocks])
        self._put_version(version)
        return True

    def discard_staged(self) -> None:
        staged, self._staged = self._staged, None
        self._discard(staged)

    @staticmethod
    def _discard(staged: tuple[int, list[_SstWriting]] | None) -> None:
        for writing in staged[1] if staged is not None else []:
            writing.wait(check=False)
            writing.remove()

    def _ingest_sorted(self, table: pa.Table, bottom: bool, after: bytes | None) -> bytes | None:
        """Many entries at once: written in the index's order as SST files that RocksDB takes in whole, sorted runs,
        instead of puts whose memtable flushes a compaction must merge later, the dearer way for a load
        (docs/benchmarks.md, "Design measurements", "Key index: staging and the GIL"). ``bottom``: the index held no
        entries before this put, whose runs are of distinct keys, so a run goes in as blocks when its keys all come
        after ``after``, the last key of the blocks before. Returns the last key in blocks now."""
        writing = self._start_ssts(table, "ingest", bottom, after)
        try:
            writing.wait()
            self.db.ingest_external_file(writing.paths)
        finally:
            writing.remove()
        if writing.blocks is None:
            return after
        self._add_to_directory([writing.blocks])
        return writing.last

    def _empty(self) -> bool:
        """Whether the database holds no entries (keys start with byte 1, blocks with byte 2; its own entries with
        byte 0). An empty one has no blocks: its directory is then known without a read."""
        it = self.db.iter()
        it.seek(b"\x01")
        if it.valid():
            return False
        self._directory = (None,)
        return True

    @property
    def blocked(self) -> bool:
        """Whether the index holds blocks (:mod:`keyblocks`), whose lookups cost more than those of keys' own
        entries: one directory entry read, not the directory (a writer whose key cache answers reads no more)."""
        if self._directory is not None:
            return self._directory[0] is not None
        it = self.db.iter()
        it.seek(keyblocks.DIRECTORY_PREFIX)
        return it.valid() and it.key().startswith(keyblocks.DIRECTORY_PREFIX)

    def _blocks(self) -> keyblocks.Blocks | None:
        """The index's blocks (read once an open: they change only when blocks go into an empty index)."""
        if self._directory is None:
            pieces, it = [], self.db.iter()
            it.seek(keyblocks.DIRECTORY_PREFIX)
            while it.valid() and it.key().startswith(keyblocks.DIRECTORY_PREFIX):
                pieces.append(it.value())
                it.next()
            try:
                self._directory = (keyblocks.Blocks.of(pieces, len(self.meta.primary_key)),)
            except ValueError as e:
                raise IndexUnavailableError(f"the key index at {self.path} is damaged: {e}") from None
        return self._directory[0]

    def _add_to_directory(self, blocks: list[np.ndarray]) -> None:
        """Writes the directory entries of blocks just taken in: each run's blocks' first keys (all its SST files')."""
        from rocksdict import WriteBatch

        batch = WriteBatch(raw_mode=True)
        for first in blocks:
            batch.put(keyblocks.DIRECTORY_PREFIX + bytes(first[0]), first.tobytes())
        self.db.write(batch)
        if self._directory is not None and blocks:  # known before: known after, without a read (a load's next commit)
            known = self._directory[0]
            firsts = np.sort(np.concatenate([*([known.directory] if known is not None else []), *blocks]))
            self._directory = (keyblocks.Blocks(firsts, len(self.meta.primary_key)),)

    def _start_ssts(self, table: pa.Table, name: str, bottom: bool | None = None, after: bytes | None = None
                    ) -> _SstWriting:
        """Starts writing ``table``'s entries, in the index's order, as SST files. Into an empty index (``bottom``,
        by default whether it is) the entries of fixed-width keys go as blocks (:mod:`keyblocks`), built here and now,
        unless some key is at most ``after``. Otherwise an entry a key: rocksdict takes an entry per call, holding
        the GIL, so a large table is cut into key ranges written by processes of their own, one per core; a smaller
        one is written here and now."""
        pk = list(self.meta.primary_key)
        buckets = self._buckets(table)
        table = table.select([*pk, keystore.DELTA, keystore.ROW_ID, keystore.DELETED]).append_column(
            keystore.BUCKET, pa.array(buckets.astype(np.int32)))
        order = index_order(table, pk, buckets)
        bottom = self._empty() if bottom is None else bottom  # the files will be the bottom run: below nothing
        if bottom and table.num_rows and fixed_width(table, pk):

            def key_at(i: int) -> bytes:  # the encoded key of the ``i``-th row in the index's order
                row = int(order[i])
                return encode_keys(table.slice(row, 1), pk, buckets[row:row + 1])[0]

            if after is None or key_at(0) > after:
                # Ranges of the order, whole blocks each, encoded and written on threads as an SST file each: a load's
                # blocks took a core alone while its key-store files took the other. NumPy's gathers and copies let go
                # of the GIL, the puts into rocksdict do not (docs/benchmarks.md, "Design measurements", "Key index
                # blocks").
                step = -(-len(order) // (threads() * keyblocks.BLOCK_ENTRIES)) * keyblocks.BLOCK_ENTRIES
                pieces = [order[start:start + step] for start in range(0, len(order), step)]
                writing = _SstWriting([os.path.join(self.path, f"{name}-{i}.sst") for i in range(len(pieces))])

                def write(i: int) -> np.ndarray:
                    return write_blocks(keyblocks.chunks(table, pk, buckets, pieces[i]), writing.paths[i])

                try:
                    writing.blocks = np.concatenate(thread_map(write, range(len(pieces))))
                except BaseException:
                    writing.remove()
                    raise
                writing.last = key_at(-1)
                return writing
        table = table.take(pa.array(order))
        large = table.num_rows >= _PROCESS_SST_ROWS
        ranges = threads() if large else 1
        step = -(-table.num_rows // ranges)
        slices = [table.slice(start, step) for start in range(0, table.num_rows, step)]
        writing = _SstWriting([os.path.join(self.path, f"{name}-{i}.sst") for i in range(len(slices))])
        try:
            if large:
                writing.start_processes(slices, pk, bottom)
            else:
                write_sst(slices[0], pk, writing.paths[0], bottom)
        except BaseException:
            writing.wait(check=False)
            writing.remove()
            raise
        return writing

    def _buckets(self, rows: pa.Table) -> np.ndarray:
        """Each row's bucket: its ``_bucket`` column (MetaGen's records), else from its key (key-store files)."""
        if keystore.BUCKET in rows.column_names:
            return rows.column(keystore.BUCKET).to_numpy().astype(np.uint16)
        return bucket.buckets(rows, list(self.meta.primary_key), self.meta.num_buckets).astype(np.uint16)

    def lookup(self, rows: pa.Table, in_key_order: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                          np.ndarray]:
        """For each row's key (the key columns, and ``_bucket`` when known): found, delta, packed row id, deleted.
        ``in_key_order``: the keys are distinct and in key order (fixed-width keys as :func:`key_codes` numbers
        them), so a stable sort of their buckets puts them in the index's order."""
        # In the index's order the lookups walk the files' blocks forwards, which halves their cost; RocksDB reads
        # and decompresses blocks without the GIL, so runs of the sorted keys go to threads of their own.
        # (numpy's bytes order ignores trailing zero bytes: keys that differ only there tie, in no given order)
        buckets = self._buckets(rows)
        keys = encode_keys(rows, list(self.meta.primary_key), buckets)
        if in_key_order:
            order = np.argsort(buckets, kind="stable")
        else:
            order = np.argsort(np.array(keys, dtype=bytes), kind="stable")
        ordered = np.array(keys, dtype=object)[order].tolist()
        stored = self._get_many(ordered)
        found_sorted = np.fromiter((v is not None for v in stored), dtype=bool, count=len(keys))
        delta, rid, deleted = np.zeros(len(keys), np.int64), np.zeros(len(keys), np.int64), np.zeros(len(keys), bool)
        at = order[found_sorted]
        delta[at], rid[at], deleted[at] = decode_values([v for v in stored if v is not None])
        found = np.zeros(len(keys), dtype=bool)
        found[at] = True
        blocks = self._blocks() if not found.all() else None
        if blocks is not None:  # the keys without an entry of their own: in a block, if anywhere
            missing = order[~found_sorted]
            wanted = np.array(ordered, dtype=bytes)[~found_sorted]
            try:
                hit, delta_in, rid_in, deleted_in = blocks.find(self._get_many, wanted)
            except ValueError as e:
                raise IndexUnavailableError(f"the key index at {self.path} is damaged: {e}") from None
            at = missing[hit]
            found[at], delta[at], rid[at], deleted[at] = True, delta_in[hit], rid_in[hit], deleted_in[hit]
        return found, delta, rid, deleted

    def _get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of ``keys``, read on threads (RocksDB reads without the GIL), in runs of equal length: 6,000 keys
        as runs of 4,096 and 1,904 took as long as the longer run."""
        step = len(keys) if len(keys) < _LOOKUP_CHUNK else -(-len(keys) // threads())
        return [v for run in thread_map(lambda start: self.db[keys[start:start + step]], range(0, len(keys), step))
                for v in run]


def index_order(table: pa.Table, primary_key: list[str], buckets: np.ndarray) -> np.ndarray:
    """The rows of ``table`` (of buckets ``buckets``, as 16-bit values: numpy sorts them by radix) in the index's
    order: by bucket, then by key."""
    if fixed_width(table, primary_key):
        columns = [int64_values(table.column(c)) for c in primary_key]
        if ascending([buckets.astype(np.int64), *columns]):  # in it already (a large commit's key-store rows)
            return np.arange(table.num_rows)
        order = int64_order(columns)
    else:
        order = key_order(table, primary_key)
    if order is None:  # in key order already (a load of a dump in key order, rows MetaGen sorted)
        return np.arange(table.num_rows) if non_decreasing(buckets) else np.argsort(buckets, kind="stable")
    in_key_order = buckets[order]
    if non_decreasing(in_key_order):  # one bucket (a group of a spilled MetaGen): no sort
        return order
    return order[np.argsort(in_key_order, kind="stable")]


class _SstWriting:
    """SST files being written: by processes of their own (``python -m bitlake.engine.keys.sstwrite``), each handed
    its slice as an Arrow IPC file beside its SST file, or already written."""

    def __init__(self, paths: list[str]):
        self.paths = paths
        self.inputs: list[str] = []
        self.workers: list = []
        # Of blocks: their first keys (the directory's entry) and the last key they hold.
        self.blocks: np.ndarray | None = None
        self.last = b""

    def start_processes(self, slices: list[pa.Table], primary_key: list[str], bottom: bool) -> None:
        import subprocess
        import sys

        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds bitlake/
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env["OPENBLAS_NUM_THREADS"] = "1"  # numpy's BLAS threads, idle here, spun at each process's start
        self.inputs = [path + ".arrow" for path in self.paths]

        def hand_over(item: tuple[pa.Table, str]) -> None:  # on threads: pyarrow copies without the GIL
            with pa.OSFile(item[1], "wb") as sink, pa.ipc.new_file(sink, item[0].schema) as out:
                out.write_table(item[0])

        thread_map(hand_over, zip(slices, self.inputs, strict=True))
        for ipc, path in zip(self.inputs, self.paths, strict=True):
            self.workers.append(subprocess.Popen([sys.executable, "-m", "bitlake.engine.keys.sstwrite", ipc, path,
                                                  "bottom" if bottom else "upper", *primary_key], env=env,
                                                 stderr=subprocess.PIPE))

    def wait(self, check: bool = True) -> None:
        """Waits for the processes; with ``check``, raises when one failed."""
        workers, self.workers = self.workers, []
        if not check:
            for w in workers:
                w.kill()
        results = [(w.communicate()[1], w.returncode) for w in workers]
        failed = [err.decode(errors="replace") for err, code in results if code != 0]
        if check and failed:
            raise RuntimeError(f"writing the key index's SST files failed: {failed[0][-2000:]}")

    def remove(self) -> None:
        for path in self.paths + self.inputs:
            if os.path.exists(path):
                os.remove(path)


def _runs(tables: Iterable[pa.Table], rows: int) -> Iterator[pa.Table]:
    """``tables`` concatenated, in order, into runs of about ``rows`` rows (a table is not split), read one run at
    a time."""
    run: list[pa.Table] = []
    n = 0
    for t in tables:
        if not t.num_rows:
            continue
        if run and n + t.num_rows > rows:
            yield pa.concat_tables(run)
            run, n = [], 0
        run.append(t)
        n += t.num_rows
    if run:
        yield pa.concat_tables(run)
