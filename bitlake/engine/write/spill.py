"""Scratch files of the inline MetaGen of a large commit: its records parted by group on local disk, so that a
group at a time is in memory (docs/ingestion.md, "Memory"). They hold no table bytes: they live in the system's
temporary folder (``TMPDIR``), outside the table's storage, and are removed when the MetaGen ends, also when
it fails."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc


class Spill:
    """Tables parted into ``groups`` Arrow IPC files; a context manager that removes them."""

    def __init__(self, groups: int):
        self.groups = groups
        self._folder = tempfile.mkdtemp(prefix="bitlake-metagen-")
        self._writers: dict[int, ipc.RecordBatchFileWriter] = {}
        self._sinks: dict[int, pa.NativeFile] = {}

    def __enter__(self) -> Spill:
        return self

    def __exit__(self, *exc) -> None:
        for g in list(self._writers):
            self._close(g)
        shutil.rmtree(self._folder, ignore_errors=True)

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
                self._sinks[g] = pa.OSFile(self._path(g), "wb")
                self._writers[g] = ipc.new_file(self._sinks[g], table.schema)
            self._writers[g].write_table(part)

    def holds(self, group: int) -> bool:
        """Whether rows were added to ``group`` (and not taken)."""
        return group in self._writers

    def take(self, group: int) -> pa.Table | None:
        """The rows added to ``group``, in the order added (None: none); its file goes once read (the table's
        buffers map it: the pages are the file system's, which it can drop and read again, but they count as the
        process's while it maps them)."""
        if group not in self._writers:
            return None
        self._close(group)
        path = self._path(group)
        table = ipc.open_file(pa.memory_map(path)).read_all()
        os.unlink(path)  # the mapping keeps the pages until the table goes
        return table

    def _close(self, group: int) -> None:
        self._writers.pop(group).close()
        self._sinks.pop(group).close()
