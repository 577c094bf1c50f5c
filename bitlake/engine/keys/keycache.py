"""Key-store files decoded in this process's memory, by file: what a writer wrote or read, kept for its next
commits' MetaGen.

A key-store file never changes once written (a merge writes a new file), so its decoded rows stay right for as long
as anything names it: no commit, no other writer can make them stale. A writer's inline MetaGen finds the stored
entries of a batch's keys by matching them against the files of their buckets
(:func:`bitlake.engine.write.metagen.scan_keystore`); from memory that costs a binary search a key, where reading
the files costs their every row and the key index a point lookup a key, both far dearer (docs/benchmarks.md, "Design
measurements", "Key cache"). The inline MetaGen puts in what it writes, and a scan what it reads (the inline MetaGen
of a process that has spent on lookups what reading the files costs scans, so that it reads them); the least
recently used files go when the cache passes its budget: ``BITLAKE_KEYSTORE_CACHE_BYTES`` (environment), by default
a quarter of the memory the process may use (the machine's, or its container's limit:
:func:`bitlake.memory.usable_bytes`); ``0`` turns it off.

Keys of integer-like columns (the key index's fixed width) are held packed into one integer a row, in the file's
key order, searched by :class:`SortedSearch` (which holds each packed key's bits below its top ones, 2 bytes a
key for TPC-H lineitem, and a table of where each value of the top ones starts, half a byte to a byte a key), with
the deltas, row ids, delete flags and versions beside them (a column of one value as a broadcast scalar: a load's
deltas and versions cost nothing; integers as offsets in the narrowest type that holds them: a file's row ids in 4
bytes): 6.5 bytes a key after a load, at most 34. Other keys are held as the file's Arrow table and matched by a
hash join.
"""

from __future__ import annotations

import collections
import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bitlake import memory
from bitlake.engine.keys.keyencoding import fixed_width, int64_values
from bitlake.engine.read import prefiltered
from bitlake.format import keystore
from bitlake.format.commit import BucketFile
from bitlake.format.metadata import TableMetadata
from bitlake.format.order import SortedSearch, key_spans, pack, strictly_increasing
from bitlake.fs import FileIO

_VALUES = [keystore.DELTA, keystore.ROW_ID, keystore.DELETED, keystore.VERSION]
_MOST_BYTES_A_KEY = 34  # packed key, delta, row id, deleted, version, the search's table
# Files of at most this many rows are also held as their Arrow rows, which a merge of the bucket's increments
# takes instead of reading the file again: a small commit merges many small files, and reading them back would be
# much of its time (docs/benchmarks.md, "Design measurements", "Key cache").
_KEEP_TABLE_ROWS = 65_536
# A restatement's look-up (``scan_keystore(keep=False)``) reads a file it does not hold for the keys wanted in it
# when it holds at least this many times their rows (:meth:`KeyStoreCache.entries_for`), else whole: see
# docs/benchmarks.md, "Design measurements", "Spark MetaGen and restatement reads".
FEW_OF_FILE = 16


class Entries:
    """One key-store file's rows, ready to be matched with wanted keys (:meth:`match`)."""

    def __init__(self, table: pa.Table, primary_key: list[str]):

        self.rows = table.num_rows
        self.search: SortedSearch | None = None
        self.spans: list[tuple[int, int]] = []
        self.highs: list[int] = []
        self.table: pa.Table | None = None
        if self.rows and fixed_width(table, primary_key):
            columns = [int64_values(table.column(c)) for c in primary_key]
            spans = key_spans(columns)
            if spans is not None:
                packed = pack(columns, spans)
                if strictly_increasing(packed):  # writers keep a file in key order, one row a key
                    self.spans, self.highs = spans, [int(c.max()) for c in columns]
                    self.search = SortedSearch(packed)
        if self.search is None or self.rows <= _KEEP_TABLE_ROWS:
            self.table = table.select([*primary_key, *_VALUES])
        self.nbytes = self.table.nbytes if self.table is not None else 0
        self.values: list[_Held] = []
        if self.search is None:
            return
        self.values = [_Held(table.column(c).to_numpy(zero_copy_only=False)) for c in _VALUES]
        self.nbytes += self.search.nbytes + sum(v.nbytes for v in self.values)

    def match(self, keys: pa.Table, primary_key: list[str], columns: list[np.ndarray] | None = None,
              codes: np.ndarray | None = None) -> tuple[np.ndarray, list[np.ndarray]]:
        """The rows of ``keys`` (key columns and ``_code``) found here: their codes, and the delta, row id,
        deleted and version of each. ``columns`` and ``codes``: the key columns as
        :func:`~bitlake.engine.keys.keyencoding.int64_values` gives them and the ``_code`` column as numpy, when
        the caller has them (a bucket's keys are matched against each of its files)."""
        codes = keys.column("_code").to_numpy() if codes is None else codes
        if self.search is None:
            assert self.table is not None
            m = self.table.join(keys, keys=primary_key, join_type="inner", use_threads=False)
            return m.column("_code").to_numpy(), [m.column(c).to_numpy(zero_copy_only=False) for c in _VALUES]
        if columns is None:

            columns = [int64_values(keys.column(c)) for c in primary_key]
        inside = np.ones(len(codes), dtype=bool)  # a key beyond a column's values here is none of this file's
        for c, (low, _), high in zip(columns, self.spans, self.highs, strict=True):
            inside &= (c >= low) & (c <= high)
        if not inside.all():
            columns, codes = [c[inside] for c in columns], codes[inside]
        packed = pack(columns, self.spans)
        if 4 * len(packed) >= self.rows and strictly_increasing(packed):  # many keys, in key order
            mine, at = self.search.find_sorted(packed)
            return codes[mine], [v.take(at) for v in self.values]
        at = self.search.find(packed)
        hit = at >= 0
        at = at[hit]
        return codes[hit], [v.take(at) for v in self.values]


class _Held:
    """A column of a file's entries in as little memory as gives its values back (:meth:`take`): one value
    broadcast to the column's length (no memory: a load's deltas and versions), integers as offsets from their
    lowest in the narrowest unsigned type that holds them (a file's row ids in 4 bytes each), else as they are."""

    def __init__(self, values: np.ndarray):
        self.dtype, self.low, self.values = values.dtype, None, values
        if len(values) and (values == values[0]).all():
            # A copy of the one value: a view would keep the whole column alive.
            self.values = np.broadcast_to(values[:1].copy(), values.shape)
        elif len(values) and values.dtype.kind in "iu":
            low = int(values.min())
            narrow = _narrow(int(values.max()) - low)
            if narrow is not None:
                self.low = low
                self.values = np.subtract(values, values.dtype.type(low), dtype=narrow, casting="unsafe")
        self.nbytes = self.values.nbytes if self.values.strides[0] else 0

    def take(self, at: np.ndarray) -> np.ndarray:
        values = self.values[at]
        return values if self.low is None else np.add(values, self.dtype.type(self.low), dtype=self.dtype)


def _narrow(span: int) -> type | None:
    """The narrowest unsigned integer type that holds ``span``, if narrower than 8 bytes."""
    return next((t for t in (np.uint8, np.uint16, np.uint32) if span <= np.iinfo(t).max), None)


class KeyStoreCache:
    """Decoded key-store files by (table URI, path), least recently used first, within ``budget`` bytes."""

    def __init__(self, budget: int):
        self.budget = budget
        self.held = 0
        self._files: collections.OrderedDict[tuple[str, str], Entries] = collections.OrderedDict()
        self._spent: dict[str, int] = {}  # by table URI: the cost of the key-index lookups made, in key-store rows
        self._lock = threading.Lock()

    def spend(self, io: FileIO, rows: int) -> None:
        """Counts key-index lookups this process made on the table, at their cost in key-store rows read."""
        with self._lock:
            self._spent[io.uri()] = self._spent.get(io.uri(), 0) + rows

    def spent(self, io: FileIO) -> int:
        with self._lock:
            return self._spent.get(io.uri(), 0)

    def can_hold(self, rows: int) -> bool:
        """Whether key-store files of ``rows`` rows would fit in the budget (at the most a key can take)."""
        return rows * _MOST_BYTES_A_KEY <= self.budget

    def get(self, io: FileIO, path: str) -> Entries | None:
        with self._lock:
            entries = self._files.get((io.uri(), path))
            if entries is not None:
                self._files.move_to_end((io.uri(), path))
            return entries

    def holds(self, io: FileIO, path: str) -> bool:
        with self._lock:
            return (io.uri(), path) in self._files

    def put(self, io: FileIO, path: str, entries: Entries) -> None:
        if entries.nbytes > self.budget:
            return
        with self._lock:
            old = self._files.pop((io.uri(), path), None)
            self.held += entries.nbytes - (old.nbytes if old is not None else 0)
            self._files[(io.uri(), path)] = entries
            while self.held > self.budget:
                _, gone = self._files.popitem(last=False)
                self.held -= gone.nbytes

    def forget(self, io: FileIO, paths: list[str]) -> None:
        """Drops the files ``paths`` (a merge replaced them)."""
        with self._lock:
            for path in paths:
                gone = self._files.pop((io.uri(), path), None)
                if gone is not None:
                    self.held -= gone.nbytes

    def entries(self, io: FileIO, f: BucketFile, meta: TableMetadata) -> Entries:
        """The file's entries, read and kept when this process holds none."""
        entries = self.get(io, f.path)
        if entries is None:
            table = keystore.read_file(io, f, meta, columns=[*meta.primary_key, *_VALUES])
            entries = Entries(table, list(meta.primary_key))
            self.put(io, f.path, entries)
        return entries

    def entries_for(self, io: FileIO, files: list[BucketFile], meta: TableMetadata, firsts: pa.Array
                    ) -> dict[str, Entries]:
        """Each file's entries of at least the keys whose first key column holds one of ``firsts``: all of them for
        a file this process holds, else those read, and not kept (a few keys looked up in files this process has
        not read: a restatement's at a past version, where decoding the files whole costs several times more, most
        of it in memory touched for the first time)."""
        held = {f.path: e for f in files if (e := self.get(io, f.path)) is not None}
        rest = [f for f in files if f.path not in held]
        return {**held, **{f.path: Entries(rows, list(meta.primary_key))
                           for f, rows in zip(rest, _rows_for(io, rest, meta, firsts), strict=True)}}

    def rows(self, io: FileIO, f: BucketFile, meta: TableMetadata) -> pa.Table:
        """The file's rows (:func:`bitlake.format.keystore.read_file`), from memory when this process holds them."""
        entries = self.get(io, f.path)
        if entries is not None and entries.table is not None:
            return entries.table
        return keystore.read_file(io, f, meta)

    def written(self, io: FileIO, path: str, table: pa.Table, meta: TableMetadata) -> None:
        """Keeps a file this process has just written (``table``: its rows)."""
        if self.budget:
            self.put(io, path, Entries(table, list(meta.primary_key)))


def _rows_for(io: FileIO, files: list[BucketFile], meta: TableMetadata, firsts: pa.Array) -> list[pa.Table]:
    """The rows of each of key-store ``files`` whose first key column holds one of ``firsts``, in file order:
    local files by Polars queries run at once, which decode the other columns at those rows only, others (and keys
    files listed as key-store files, whose columns are not the key store's) read and filtered."""
    pk = list(meta.primary_key)
    stored = keystore.file_schema(meta)
    schema = pa.schema([stored.field(c) for c in [*pk, *_VALUES]])
    prefilter = prefiltered.readable(schema) and prefiltered.matches_exactly(schema.field(pk[0]).type)
    by_path = {f.path: f for f in files}

    def filtered(path: str) -> pa.Table:
        table = keystore.read_file(io, by_path[path], meta, columns=schema.names)
        return table.filter(pc.is_in(table.column(pk[0]), firsts))

    plain = [f.path for f in files if f.version is None]
    read = dict(zip(plain, prefiltered.rows_in_files(io, plain, schema, {pk[0]: firsts}, None, filtered, prefilter),
                    strict=True))
    return [read[f.path] if f.version is None else filtered(f.path) for f in files]


def _budget() -> int:
    value = os.environ.get("BITLAKE_KEYSTORE_CACHE_BYTES")
    if value is not None:
        if not value.strip().isdigit():
            raise ValueError(f"BITLAKE_KEYSTORE_CACHE_BYTES must be a number of bytes (0 turns the key-store cache "
                             f"off), not {value!r}")
        return int(value)
    usable = memory.usable_bytes()
    return usable // 4 if usable is not None else 1 << 30


CACHE = KeyStoreCache(_budget())
