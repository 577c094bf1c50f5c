"""Clustering by a column at compaction (docs/maintenance.md, "Clustering"): ``compact(cluster_by=column)``
rewrites each partition's files into files that each hold one range of the column's values, so that whatever
selects a few values (a vacuum of tombstoned ids, a filter) reads the few files whose range holds them: their
statistics rule the other files out.

The ranges are cut where a sample of the partition's values (every file's column, read alone) puts equal shares
of its rows: one range a target-sized file of its current rows, and, with coarser cuts from the same sample, of
its history rows. A file's rows are sorted by the column and cut at the ranges' bounds; each range's rows go to
its own output files. Nulls (and NaN) go to the last range. The bounds are never stored (a string bound would be
one row's value, which a vacuum must be able to remove from the table).
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bitlake.errors import InvalidInputError
from bitlake.format import datafile, stats
from bitlake.format.commit import DataFile
from bitlake.format.metadata import TableMetadata
from bitlake.fs import FileIO

# The sample the bounds come from: at most this many values of a partition, drawn evenly from every file.
SAMPLE_VALUES = 1 << 20


def check_column(meta: TableMetadata, column: str) -> None:
    """Refuses a ``cluster_by`` column the table lacks or whose values have no order that ranges can follow."""
    if column not in meta.schema.names:
        raise InvalidInputError(f"cluster_by: {column!r} is not a column of the table ({meta.schema.names})")
    t = meta.schema.field(column).type
    if not (stats.covered(t) or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        raise InvalidInputError(f"cluster_by: column {column!r} has type {t}; clustering takes a number, date, "
                                "timestamp, string or binary column")


def clustered(files: list[DataFile], column: str, t: pa.DataType) -> bool:
    """Whether ``files`` (one kind of one partition's) already hold disjoint ranges of ``column``, by their
    statistics: all compacted (a landed file is a batch's rows, whatever their values), their bounds disjoint, at
    most one without bounds (the last range, holding NaN or an infinity). A string column has no statistics: its
    files are never taken as clustered."""
    if len(files) < 2:
        return True
    if not stats.covered(t) or any(f.offsets is None for f in files):
        return False
    spans, unbounded = [], 0
    for f in files:
        s = f.stats or {}
        lo, hi = s.get("min", {}).get(column), s.get("max", {}).get(column)
        if lo is None or hi is None:
            if s.get("nulls", {}).get(column) != f.rows:  # nulls only: the last range's
                unbounded += 1
            continue
        spans.append((stats.decode(lo, t).as_py(), stats.decode(hi, t).as_py()))
    spans.sort(key=lambda span: span[0])
    return unbounded <= 1 and all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))


@dataclasses.dataclass(frozen=True)
class Ranges:
    """Ranges of a column's values: range ``i`` holds the values above ``bounds[i - 1]`` and up to ``bounds[i]``,
    the last one the values above the last bound, nulls and NaN."""

    column: str
    bounds: tuple

    @property
    def count(self) -> int:
        return len(self.bounds) + 1

    def split(self, table: pa.Table, ids: np.ndarray, rows: np.ndarray) -> Iterator[tuple[int, pa.Table, np.ndarray]]:
        """The rows ``rows`` of ``table`` (with their row ids, of ``ids``) sorted by the column, taken at once, and
        cut by range: (range, rows, ids) for each range that holds any."""
        if not len(rows):
            return
        # nulls (and NaN) last
        order = rows[pc.sort_indices(table.column(self.column).take(pa.array(rows))).to_numpy()]
        table, ids = table.take(pa.array(order)), ids[order]
        values = table.column(self.column)
        ordered = len(values) - values.null_count - _nan_count(values)  # the comparable prefix
        column = _Sorted(values, ordered)
        ends = [bisect.bisect_right(column, b) for b in self.bounds] + [table.num_rows]
        start = 0
        for i, end in enumerate(ends):
            if end > start:
                yield i, table.slice(start, end - start), ids[start:end]
            start = max(start, end)


def ranges(io: FileIO, meta: TableMetadata, files: list[DataFile], column: str, parts: list[int]) -> list[Ranges]:
    """For each count in ``parts``, ranges of ``column`` that cut the rows of ``files`` into that many shares of
    about equal rows, from a sample of their values."""
    total = sum(f.rows for f in files)
    step = max(1, -(-total // SAMPLE_VALUES))
    sample = []
    for f in files:
        values = datafile.read_data(io, f.path, meta, columns=[column]).column(column)
        sample.append(values.take(pa.array(np.arange(0, len(values), step, dtype=np.int64))))
    drawn = pa.chunked_array([c for s in sample for c in s.chunks], meta.schema.field(column).type)
    drawn = drawn.filter(pc.invert(pc.fill_null(_unordered(drawn), True)))  # nulls and NaN take no share
    drawn = drawn.take(pc.sort_indices(drawn))
    out = []
    for n in parts:
        cuts = [drawn[len(drawn) * i // n].as_py() for i in range(1, n)] if len(drawn) else []
        out.append(Ranges(column, tuple(sorted(set(cuts)))))  # repeated values: a range of one value, once
    return out


def _unordered(values: pa.ChunkedArray) -> pa.ChunkedArray:
    """Which ``values`` ranges do not order: NaN, and nulls (null or true)."""
    if pa.types.is_floating(values.type):
        return pc.is_nan(values)  # null where the value is null
    return pc.is_null(values)


def _nan_count(values: pa.ChunkedArray) -> int:
    if not pa.types.is_floating(values.type):
        return 0
    return pc.sum(pc.is_nan(values)).as_py() or 0


class _Sorted:
    """The first ``n`` values of a sorted column as a sequence of Python values, for :mod:`bisect`."""

    def __init__(self, values: pa.ChunkedArray, n: int):
        self.values, self.n = values, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.values[i].as_py()
