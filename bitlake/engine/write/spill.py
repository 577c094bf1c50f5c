"""Scratch files of the inline MetaGen of a large commit: its records parted by group on local disk (by the landing
that kept them for it, or by the MetaGen from the batches' files), so that a group at a time is in memory
(docs/ingestion.md, "Memory"). They hold no table bytes: they live in the system's temporary folder (``TMPDIR``),
outside the table's storage, and are removed when the commit ends, also when it fails."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import weakref

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from bitlake.format import keystore

# A large commit is folded a group of buckets at a time, at most this many groups: a stream's landing parts its
# records' keys by group while it lands them (:class:`KeptRows`), before their number is known.
MAX_GROUPS = 16


def groups(num_buckets: int) -> int:
    """How many groups of buckets a table of ``num_buckets`` buckets is folded in (:func:`group_of_bucket`)."""
    return min(num_buckets, MAX_GROUPS)


def group_of_bucket(num_buckets: int) -> np.ndarray:
    """Each bucket's group: :data:`MAX_GROUPS` runs of buckets at most, so that a group's keys are a range of the key
    index's order (its keys start with the bucket)."""
    return np.arange(num_buckets) * groups(num_buckets) // num_buckets


class Spill:
    """Tables parted into ``groups`` Arrow IPC files; a context manager that removes them."""

    def __init__(self, groups: int):
        self.groups = groups
        self._folder = tempfile.mkdtemp(prefix="bitlake-metagen-")
        self._writers: dict[int, ipc.RecordBatchFileWriter] = {}
        self._sinks: dict[int, pa.NativeFile] = {}
        self._held: set[int] = set()  # the groups rows were added to, whose files are still there
        # Removed once unreachable too (a landing whose batch never reaches a MetaGen).
        self._remove = weakref.finalize(self, shutil.rmtree, self._folder, ignore_errors=True)

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def remove(self) -> None:
        """Closes and removes every file."""
        self.end()
        self._held.clear()
        self._remove()

    def _path(self, group: int) -> str:
        return os.path.join(self._folder, f"{group}.arrow")

    def add(self, table: pa.Table, group_of: np.ndarray) -> None:
        """Appends each row of ``table`` to the file of its group (``group_of``, one a row), in order."""
        counts = np.bincount(group_of, minlength=self.groups)
        if np.count_nonzero(counts) > 1:  # one stable sort and take, each group a slice (not a filter a group)
            table = table.take(pa.array(np.argsort(group_of.astype(np.uint16), kind="stable")))
        ends = np.cumsum(counts)
        for g in np.flatnonzero(counts).tolist():
            part = table.slice(int(ends[g] - counts[g]), int(counts[g]))
            if g not in self._writers:
                if g in self._held:
                    raise RuntimeError(f"rows added to spill group {g} after its file was closed")
                self._sinks[g] = pa.OSFile(self._path(g), "wb")
                self._writers[g] = ipc.new_file(self._sinks[g], table.schema)
                self._held.add(g)
            self._writers[g].write_table(part)

    def end(self) -> None:
        """No more rows: closes the files (a landing task's, which would hold a file handle a group otherwise)."""
        for g in list(self._writers):
            self._close(g)

    def holds(self, group: int) -> bool:
        """Whether rows were added to ``group`` (and not taken)."""
        return group in self._held

    def read(self, group: int) -> pa.Table | None:
        """The rows added to ``group``, in the order added (None: none), its file kept (:meth:`take` removes it).
        The table's buffers map the file: its pages are the file system's, which it can drop and read again, but
        they count as the process's while it maps them."""
        if group not in self._held:
            return None
        if group in self._writers:
            self._close(group)
        return ipc.open_file(pa.memory_map(self._path(group))).read_all()

    def take(self, group: int) -> pa.Table | None:
        """:meth:`read`, then the file goes (the mapping keeps the pages until the table goes)."""
        table = self.read(group)
        if table is not None:
            self._held.discard(group)
            os.unlink(self._path(group))
        return table

    def _close(self, group: int) -> None:
        self._writers.pop(group).close()
        self._sinks.pop(group).close()


class KeptRows:
    """The keys-file rows of a landing's records, kept for its inline MetaGen, which then need not read them back
    from the data files: in memory while they are at most ``in_memory`` records; past that, when the table has more
    than one bucket, in a :class:`Spill` a segment, by group of buckets (:func:`group_of_bucket`), which a MetaGen
    folding a group at a time reads in segment order (so that rows in key order stay in it); none once they are more
    than ``at_most`` (a MetaGen on Spark, or one that reads the files). The landing's tasks add rows on threads of
    their own, each its segment's, in order; :attr:`bounds` holds the lowest and highest value of the first key
    column ``first_key`` of each table added (a spilled load's ranges of keys are cut by them)."""

    def __init__(self, in_memory: int, at_most: int, num_buckets: int, first_key: str):
        self._lock = threading.Lock()
        self._in_memory, self._at_most = in_memory, at_most
        self._groups = groups(num_buckets)
        self._group_of_bucket = group_of_bucket(num_buckets) if num_buckets > 1 else None
        self._held: dict[int, list[pa.Table]] = {}
        self._spills: dict[int, Spill] = {}
        self._ended: set[int] = set()
        self._first_key = first_key
        self.bounds: list[pa.Scalar] = []
        self.records = 0

    @property
    def complete(self) -> bool:
        """Whether the rows of every record added are kept."""
        return self.records <= self._at_most and (self.records <= self._in_memory or self._group_of_bucket is not None)

    @property
    def spilled(self) -> bool:
        return bool(self._spills)

    def add(self, seq: int, table: pa.Table) -> None:
        """Keeps the rows ``table`` of segment ``seq``."""
        bounds = pc.min_max(table.column(self._first_key)).values() if table.num_rows else []
        with self._lock:
            self.bounds.extend(bounds)
            self.records += table.num_rows
            if not self.complete:
                self._drop()
            elif self.records <= self._in_memory:
                self._held.setdefault(seq, []).append(table)
            else:
                for held_seq, tables in self._held.items():  # past what is held in memory: every row goes to a spill
                    for t in tables:
                        self._spill(held_seq, t)
                    if held_seq in self._ended:
                        self._spills[held_seq].end()
                self._held.clear()
                self._spill(seq, table)

    def end(self, seq: int) -> None:
        """Segment ``seq`` has no more rows."""
        with self._lock:
            self._ended.add(seq)
            if seq in self._spills:
                self._spills[seq].end()

    def _spill(self, seq: int, table: pa.Table) -> None:
        if seq not in self._spills:
            self._spills[seq] = Spill(self._groups)
        self._spills[seq].add(table, self._group_of_bucket[table.column(keystore.BUCKET).to_numpy()])

    def _drop(self) -> None:
        self._held.clear()
        for spill in self._spills.values():
            spill.remove()
        self._spills.clear()

    def table(self, schema: pa.Schema) -> pa.Table | None:
        """The rows held in memory, in segment order, in one chunk; None when they were spilled or dropped."""
        if not self.complete or self._spills:
            return None
        tables = [t for seq in sorted(self._held) for t in self._held[seq]]
        self._held.clear()  # in one chunk, the pieces let go: a copy of its own would hold them twice
        return pa.concat_tables(tables).combine_chunks() if tables else schema.empty_table()

    def group(self, group: int) -> list[pa.Table]:
        """The spilled rows of ``group`` (:func:`group_of_bucket`), a table a segment, in segment order. Their files
        stay until :meth:`remove`: a MetaGen planned again (another writer committed first) reads them again, and a
        load folding by ranges of keys reads them once a range."""
        return [self._spills[seq].read(group) for seq in sorted(self._spills) if self._spills[seq].holds(group)]

    def remove(self) -> None:
        """Removes the spilled files."""
        with self._lock:
            self._drop()
