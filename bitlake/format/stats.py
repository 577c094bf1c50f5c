"""Per-file column statistics (docs/FORMAT.md, "File statistics"): the least and greatest value and the null
count of each number, date and timestamp column of a data file, recorded in the file's ``add_files`` entry, so
that a reader skips the files a filter rules out before it opens any.

:class:`Collector` gathers them while a file is written (floats from the Arrow data, as Parquet footers leave
out NaN; the rest from the footers the Parquet writer computes anyway); :func:`pruned` keeps the files a filter
may match. A file without statistics, or a column without them, is always read.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs


def covered(t: pa.DataType) -> bool:
    """Whether a column of type ``t`` gets statistics: numbers, dates and timestamps. Strings get none: a
    commit is never rewritten, and a vacuum must leave no byte of a purged row (a name, an e-mail address) in
    the table, where a string bound is often a whole value of one row."""
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) or pa.types.is_date32(t)
            or pa.types.is_timestamp(t))


# A column chunk of fewer uncompressed bytes than this, dictionary page included, holds no value written after its
# dictionary filled: Parquet writers (pyarrow's, parquet-java's) drop a dictionary for plain values once it reaches
# their limit, 1 MB by default, so such a chunk is dictionary-encoded throughout.
_WHOLLY_DICTIONARY_BYTES = 1 << 20


def dictionary_columns(files: list, columns: list[str]) -> list[str]:
    """Those of ``columns`` every one of ``files`` (``DataFile``s) holds dictionary-encoded throughout (their
    statistics' ``dictionary``): a reader decodes them as dictionaries faster than as values."""
    hinted = [set((f.stats or {}).get("dictionary", {})) for f in files]
    every = set.intersection(*hinted) if hinted else set()
    return [c for c in columns if c in every]


_UNITS_PER_SECOND = {"s": 1, "ms": 1000, "us": 10**6, "ns": 10**9,
                     "milliseconds": 1000, "microseconds": 10**6, "nanoseconds": 10**9}


class Collector:
    """The statistics of the rows of one file, gathered as it is written. Floating-point bounds come from the
    values (numpy: NaN and infinities must be seen); with ``footer`` (a Parquet file) the other bounds come from
    its row groups' statistics, which the Parquet writer computes anyway, else from the values (an ORC file)."""

    def __init__(self, schema: pa.Schema, columns: list[str], footer: bool):
        self._fields = {c: schema.field(c).type for c in columns}
        self._from_values = {c for c, t in self._fields.items() if pa.types.is_floating(t) or not footer}
        self._min: dict[str, Any] = {}
        self._max: dict[str, Any] = {}
        self._nulls = dict.fromkeys(columns, 0)
        self._unbounded: set[str] = set()  # NaN or an infinity seen, or a row group without bounds
        # Top-level string and binary columns: those of the footer's chunks all dictionary-encoded throughout.
        self._strings = {f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
                         or pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)} if footer else set()
        self._dictionary: set[str] = set()

    def add(self, table: pa.Table) -> None:
        for name in self._fields:
            if name not in table.column_names:
                self._nulls[name] += table.num_rows
                continue
            column = table.column(name)
            self._nulls[name] += column.null_count
            if name in self._from_values and name not in self._unbounded and column.null_count < len(column):
                self._bound(name, *_min_max(column))

    def footer(self, metadata: Any) -> None:
        """Takes the bounds of the columns not taken from the values from a Parquet file's metadata, and the
        string columns all of whose chunks are dictionary-encoded throughout (``_WHOLLY_DICTIONARY_BYTES``)."""
        plain: set[str] = set()
        for i in range(metadata.num_row_groups):
            rg = metadata.row_group(i)
            for j in range(rg.num_columns):
                chunk = rg.column(j)
                name = chunk.path_in_schema
                if name in self._strings and not (
                        chunk.has_dictionary_page and chunk.total_uncompressed_size < _WHOLLY_DICTIONARY_BYTES):
                    plain.add(name)
                if name not in self._fields or name in self._from_values or name in self._unbounded:
                    continue
                st = chunk.statistics
                if st is not None and not st.has_min_max and st.null_count == chunk.num_values:
                    continue  # a row group of nulls only
                if st is None or not st.has_min_max:
                    self._unbounded.add(name)
                    continue
                t = self._fields[name]
                if pa.types.is_timestamp(t):  # as counts of the column's unit (Parquet stores seconds as ms)
                    unit = _UNITS_PER_SECOND[json.loads(st.logical_type.to_json())["timeUnit"]]
                    factor = unit // _UNITS_PER_SECOND[t.unit]
                    self._bound(name, st.min_raw // factor, st.max_raw // factor)
                else:
                    self._bound(name, st.min, st.max)
        if metadata.num_row_groups:
            self._dictionary = self._strings - plain

    def _bound(self, name: str, lo: Any, hi: Any) -> None:
        if lo is None:
            self._unbounded.add(name)
            return
        if name not in self._min or lo < self._min[name]:
            self._min[name] = lo
        if name not in self._max or hi > self._max[name]:
            self._max[name] = hi

    def to_json(self) -> dict:
        """``{"min": {column: value}, "max": {...}, "nulls": {column: count}}`` (values as :func:`encode`), and
        ``"dictionary": {column: true}`` for the string columns dictionary-encoded throughout, when there are."""
        bounded = [c for c in self._min if c not in self._unbounded]
        out = {"min": {c: encode(self._min[c], self._fields[c]) for c in bounded},
               "max": {c: encode(self._max[c], self._fields[c]) for c in bounded},
               "nulls": dict(self._nulls)}
        if self._dictionary:
            out["dictionary"] = dict.fromkeys(sorted(self._dictionary), True)
        return out


def _min_max(column: pa.ChunkedArray) -> tuple[Any, Any]:
    """The least and greatest non-null value; (None, None) for a float column holding NaN or an infinity."""
    if pa.types.is_floating(column.type):
        values = column.drop_null().to_numpy()
        lo, hi = values.min(), values.max()  # NaN propagates
        return (float(lo), float(hi)) if np.isfinite(lo) and np.isfinite(hi) else (None, None)
    if pa.types.is_timestamp(column.type):  # as counts of its unit: exact for every unit
        column = column.cast(pa.int64())
    lo, hi = pc.min_max(column).values()
    return lo.as_py(), hi.as_py()


def encode(value: Any, t: pa.DataType) -> Any:
    """A bound as JSON: integers and floats as numbers, a decimal as its digits with exactly ``scale`` decimals, a
    date as ``YYYY-MM-DD``, a timestamp as an integer count of its unit since the epoch (UTC)."""
    if pa.types.is_timestamp(t):
        return value if isinstance(value, int) else pa.scalar(value, t).cast(pa.int64()).as_py()
    if isinstance(value, decimal.Decimal):
        return format(value.quantize(decimal.Decimal(1).scaleb(-t.scale)), "f")
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def decode(value: Any, t: pa.DataType) -> pa.Scalar:
    """The Arrow scalar of a bound :func:`encode` wrote for a column of type ``t``."""
    if pa.types.is_timestamp(t):
        return pa.scalar(int(value), pa.int64()).cast(t)
    if pa.types.is_decimal(t):
        return pa.scalar(decimal.Decimal(value), t)
    if pa.types.is_date32(t):
        return pa.scalar(dt.date.fromisoformat(value), t)
    return pa.scalar(value, t)


def guarantee(stats: dict, rows: int, schema: pa.Schema) -> pc.Expression:
    """What every row of a file with ``stats`` satisfies, as a pyarrow expression: a column's value is within its
    bounds (or null, when the file holds nulls of it); a column all of whose values are null is null."""
    out = pc.scalar(True)
    nulls = stats.get("nulls", {})
    for name, n in nulls.items():
        if name not in schema.names or not covered(schema.field(name).type):
            continue
        field, t = pc.field(name), schema.field(name).type
        if n == rows:
            out &= field.is_null()
            continue
        if name not in stats.get("min", {}) or name not in stats.get("max", {}):
            continue
        lo, hi = field >= decode(stats["min"][name], t), field <= decode(stats["max"][name], t)
        if n:
            lo, hi = lo | field.is_null(), hi | field.is_null()
        out &= lo & hi
    return out


def prunes_safely(where: pc.Expression) -> bool:
    """Whether pyarrow's pruning by bounds (of files here, of row groups in its Parquet scan) keeps every file
    ``where`` may match: not when ``where`` compares with a NaN literal, where pyarrow 26 prunes wrongly
    (``~(x < nan)`` holds for every number, yet a scan of a file of numbers with it returns no row). The text
    of the expression tells, so a column named ``nan`` also turns pruning off: never wrong, only slower."""
    return re.search(r"\bnan\b", str(where), re.IGNORECASE) is None


def pruned(files: list, where: pc.Expression | None, schema: pa.Schema) -> list:
    """The data files of ``files`` (``DataFile``s) whose statistics do not rule ``where`` out, in order. pyarrow
    decides, as it does for partitions: each file is a fragment whose guarantee is :func:`guarantee`."""
    if where is None or not any(f.stats for f in files) or not prunes_safely(where):
        return files
    guarantees = [guarantee(f.stats, f.rows, schema) if f.stats else pc.scalar(True) for f in files]
    # The fragments are never opened: their paths only number them.
    dataset = ds.FileSystemDataset.from_paths([str(i) for i in range(len(files))], schema=schema,
                                              format=ds.ParquetFileFormat(), filesystem=pafs.LocalFileSystem(),
                                              partitions=guarantees)
    return [files[int(fragment.path)] for fragment in dataset.get_fragments(filter=where)]
