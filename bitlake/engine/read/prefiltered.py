"""Reads that decode only the rows a condition may keep: Polars' Parquet reader, for a scan with a condition.

pyarrow's Parquet reader decodes every value of every column it reads, then filters; Polars' decodes the columns
its predicate names first and the other columns only at the rows that pass (late materialization), which makes a
selective scan several times cheaper. The reader (:mod:`bitlake.engine.read.reader`) asks :func:`predicate` for a
Polars predicate that keeps at least every row the scan's pyarrow condition keeps, and, when there is one and
every file is a local Parquet file Polars reads, takes its chunks from :func:`chunks`. It then applies the pyarrow
condition itself to each chunk, so the result is exactly pyarrow's: the Polars predicate only has to be wide
enough, never exact.

The condition is read from its Substrait form (``pyarrow.compute.Expression.to_substrait``, a public format):
comparisons of a column of integers, dates, strings, decimals or timestamps (of microseconds, as pyarrow writes
them) with a literal of its kind, ``is_in`` over literals, ``is_null``, ``is_valid``, ``and``, ``or`` and the
negation of an exact part translate; any other part of an ``and`` is left out (which only widens it), any other
part of an ``or`` leaves the whole ``or`` out. Floating-point columns are never compared (NaN and signed zero
compare differently in Polars).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import functools
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bitlake.fs import FileIO
from bitlake.pool import thread_map

_COMPARISONS = {"equal": "__eq__", "not_equal": "__ne__", "lt": "__lt__", "lte": "__le__", "gt": "__gt__",
                "gte": "__ge__"}
_FLIPPED = {"lt": "gt", "lte": "gte", "gt": "lt", "gte": "lte", "equal": "equal", "not_equal": "not_equal"}


@functools.cache
def _modules() -> tuple[Any, Any]:
    """(polars, Substrait's ExtendedExpression message), imported on first use: Polars takes a while to load."""
    import polars
    from substrait.extended_expression_pb2 import ExtendedExpression

    return polars, ExtendedExpression


@dataclasses.dataclass(frozen=True)
class Translated:
    """A Polars ``predicate`` at least as wide as a pyarrow condition, and ``names``: every column the condition
    names (the reader reads them to apply the condition itself)."""

    predicate: Any
    names: frozenset[str]


def predicate(where: pc.Expression, schema: pa.Schema) -> Translated | None:
    """A Polars predicate that holds for at least every row of ``schema`` ``where`` holds for, or None when no
    part of ``where`` translates."""
    pl, message_type = _modules()
    from google.protobuf.message import DecodeError

    try:
        message = message_type.FromString(bytes(where.to_substrait(schema)))
    except (pa.ArrowException, ValueError, TypeError, ImportError, DecodeError):
        return None  # a cast Substrait cannot represent, for one: pyarrow's reader then reads the files
    names = {e.extension_function.function_anchor: e.extension_function.name for e in message.extensions
             if e.HasField("extension_function")}
    expression = message.referred_expr[0].expression
    wide = _Translation(pl, schema, names).wide(expression)
    if wide is None:
        return None
    return Translated(wide[0], frozenset(schema.field(i).name for i in _fields(expression) if i < len(schema)))


def _fields(message: Any) -> Iterator[int]:
    """The top-level field of every direct field reference in Substrait ``message``, and in its submessages."""
    for descriptor, value in message.ListFields():
        if descriptor.message_type is None:
            continue
        repeated = getattr(descriptor, "is_repeated", None)  # protobuf 5.28 on; before, its label tells
        if repeated is None:
            repeated = descriptor.label == descriptor.LABEL_REPEATED
        for item in value if repeated else [value]:
            if descriptor.message_type.name == "StructField" and descriptor.name == "struct_field":
                yield item.field
            else:
                yield from _fields(item)


class _Translation:
    """Substrait expressions as Polars predicates: :meth:`wide` returns (predicate, exact) or None (no
    restriction); an exact predicate holds where the expression holds and is null where it is null, so that its
    negation is exact too."""

    def __init__(self, pl: Any, schema: pa.Schema, functions: dict[int, str]):
        self.pl, self.schema, self.functions = pl, schema, functions

    def wide(self, e: Any) -> tuple[Any, bool] | None:
        rex = e.WhichOneof("rex_type")
        if rex == "singular_or_list":
            return self._is_in(e.singular_or_list)
        if rex != "scalar_function":
            return None
        name = self.functions.get(e.scalar_function.function_reference)
        args = [a.value for a in e.scalar_function.arguments]
        parts = [self.wide(a) for a in args]
        if name == "and":
            kept = [p for p in parts if p is not None]
            if not kept:
                return None
            return functools.reduce(lambda a, b: a & b, [p for p, _ in kept]), \
                len(kept) == len(parts) and all(x for _, x in kept)
        if name == "or":
            if any(p is None for p in parts):
                return None
            return functools.reduce(lambda a, b: a | b, [p for p, _ in parts]), all(x for _, x in parts)  # type: ignore[misc]
        if name == "not" and len(parts) == 1 and parts[0] is not None and parts[0][1]:
            return ~parts[0][0], True
        if name in ("is_null", "is_not_null") and len(args) == 1:
            column = self._column(args[0], any_type=True)
            if column is None:
                return None
            c = self.pl.col(column)
            return (c.is_null() if name == "is_null" else c.is_not_null()), True
        if name in _COMPARISONS and len(args) == 2:
            return self._comparison(name, *args)
        return None

    def _comparison(self, name: str, left: Any, right: Any) -> tuple[Any, bool] | None:
        if left.WhichOneof("rex_type") == "literal":
            left, right, name = right, left, _FLIPPED[name]
        column = self._column(left)
        if column is None or right.WhichOneof("rex_type") != "literal":
            return None
        value = self._value(right.literal, self.schema.field(column).type)
        if value is None:
            return None
        return getattr(self.pl.col(column), _COMPARISONS[name])(value), True

    def _is_in(self, e: Any) -> tuple[Any, bool] | None:
        """``is_in`` of literals: wide, not exact (pyarrow's is false for a null, Polars' null)."""
        column = self._column(e.value)
        if column is None or not all(o.WhichOneof("rex_type") == "literal" for o in e.options):
            return None
        values = [self._value(o.literal, self.schema.field(column).type) for o in e.options]
        if not values or any(v is None for v in values):
            return None
        return self.pl.col(column).is_in(values), False

    def _column(self, e: Any, any_type: bool = False) -> str | None:
        """The name of the top-level column ``e`` selects, when its type compares the same in Polars (any
        type Polars reads, with ``any_type``)."""
        if e.WhichOneof("rex_type") != "selection" or not e.selection.HasField("direct_reference"):
            return None
        ref = e.selection.direct_reference.struct_field
        if ref.HasField("child") or ref.field >= len(self.schema):
            return None
        field = self.schema.field(ref.field)
        return field.name if kind(field.type) is not None or (any_type and readable(pa.schema([field]))) else None

    def _value(self, literal: Any, column_type: pa.DataType) -> Any | None:
        """The Polars value of a Substrait literal compared with a column of ``column_type``, or None when it is
        null, of another kind, or of a form not read here."""
        family, form = kind(column_type), literal.WhichOneof("literal_type")
        if family == "integer" and form in ("i8", "i16", "i32", "i64"):
            return int(getattr(literal, form))
        if family == "date" and form == "date":
            return dt.date(1970, 1, 1) + dt.timedelta(days=literal.date)
        if family == "string" and form == "string":
            return literal.string
        if family == "decimal" and form == "decimal":
            unscaled = int.from_bytes(literal.decimal.value, "little", signed=True)
            return decimal.Decimal(unscaled).scaleb(-literal.decimal.scale)
        if family == "timestamp" and form is None:
            # pyarrow writes microseconds in Substrait's deprecated fields, which newer Substrait packages keep
            # as unknown fields: 14, a timestamp without zone; 27, one with a zone (an instant).
            from google.protobuf import unknown_fields

            field = 27 if column_type.tz is not None else 14  # type: ignore[attr-defined]
            micros = [f.data for f in unknown_fields.UnknownFieldSet(literal) if f.field_number == field]
            if len(micros) == 1 and column_type.unit == "us":  # type: ignore[attr-defined]
                return self.pl.lit(micros[0], dtype=self.pl.Int64).cast(
                    self.pl.Datetime("us", time_zone=column_type.tz))  # type: ignore[attr-defined]
        return None


def kind(t: pa.DataType) -> str | None:
    """How a column of type ``t`` compares with literals here: integer, date, string, decimal, timestamp, or None."""
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_decimal128(t):
        return "decimal"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return None


_READ_TYPES = (pa.types.is_integer, pa.types.is_float32, pa.types.is_float64, pa.types.is_boolean, pa.types.is_string,
               pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary, pa.types.is_date32,
               pa.types.is_timestamp, pa.types.is_decimal128)


def readable(schema: pa.Schema) -> bool:
    """Whether Polars reads every column of ``schema`` back as its Arrow type (numbers, strings, binaries, dates,
    timestamps and decimals; nested, dictionary and extension types are left to pyarrow)."""
    return all(any(test(f.type) for test in _READ_TYPES) for f in schema)


def chunks(paths: list[str], schema: pa.Schema, wide: Any, batch_rows: int) -> Iterator[tuple[int, pa.Table]]:
    """(index of its file in ``paths``, chunk) of the rows of local Parquet files ``paths`` where Polars predicate
    ``wide`` holds, as tables of ``schema`` (its columns, a column a file lacks read as nulls), in file order, at
    most ``batch_rows`` rows each; Polars' streaming engine reads a file at a time. A file that is gone raises
    ``FileNotFoundError``, one Polars cannot read ``pyarrow.ArrowInvalid`` naming it, as pyarrow's reader does."""
    pl, _ = _modules()
    for i, (path, frame) in enumerate(zip(paths, _scans(paths, schema, wide), strict=True)):
        try:
            for df in frame.collect_batches(chunk_size=batch_rows, maintain_order=True):
                if df.height:
                    yield i, _as(df.to_arrow(), schema)
        except pl.exceptions.PolarsError as e:
            raise pa.ArrowInvalid(f"could not read Parquet file {path}: {e}") from e


def _scans(paths: list[str], schema: pa.Schema, wide: Any) -> list[Any]:
    """Polars' lazy reads of local Parquet files ``paths`` as ``schema`` (a column a file lacks as nulls), of the
    rows where Polars predicate ``wide`` holds."""
    pl, _ = _modules()
    polars_schema = pl.from_arrow(schema.empty_table()).schema
    return [pl.scan_parquet(path, schema=polars_schema, glob=False, hive_partitioning=False,
                            missing_columns="insert", extra_columns="ignore").select(schema.names).filter(wide)
            for path in paths]


def matches_exactly(t: pa.DataType) -> bool:
    """Whether Polars finds a value of a column of type ``t`` among others as pyarrow does: integers, dates and
    strings (what :func:`rows_in` takes)."""
    return kind(t) in ("integer", "date", "string")


def rows_in(paths: list[str], schema: pa.Schema, values: dict[str, pa.Array],
            ranges: dict[str, list[tuple[int, int]]] | None = None) -> list[pa.Table]:
    """The rows of each of local Parquet files ``paths`` (as ``schema``, with its columns) whose column ``c`` holds
    one of ``values[c]``, and whose integer column ``r`` holds a value of one of the half-open ranges ``ranges[r]``,
    for every ``c`` and ``r``, in file order: Polars queries, run in parallel, which decode the other columns only at
    those rows. The columns of ``values`` must be of types Polars :func:`matches_exactly`."""
    pl, _ = _modules()
    assert all(matches_exactly(schema.field(c).type) for c in values)
    assert all(pa.types.is_integer(schema.field(c).type) for c in ranges or {})
    conditions = [pl.col(c).is_in(pl.Series(v).implode()) for c, v in values.items()] + [
        functools.reduce(lambda a, b: a | b, [(pl.col(c) >= lo) & (pl.col(c) < hi) for lo, hi in spans], pl.lit(False))
        for c, spans in (ranges or {}).items()]
    wide = functools.reduce(lambda a, b: a & b, conditions, pl.lit(True))
    try:
        read = pl.collect_all(_scans(paths, schema, wide))  # the files' queries run in parallel
    except pl.exceptions.PolarsError as e:
        raise pa.ArrowInvalid(f"could not read Parquet files {paths}: {e}") from e
    return [_as(df.to_arrow(), schema) if df.height else schema.empty_table() for df in read]


def rows_in_files(io: FileIO, paths: list[str], schema: pa.Schema, values: dict[str, pa.Array],
                  ranges: dict[str, list[tuple[int, int]]] | None, whole: Callable[[str], pa.Table],
                  prefilter: bool = True) -> list[pa.Table]:
    """The rows of each of ``paths`` (files of ``io``): of the local ones, when ``prefilter``, what :func:`rows_in`
    keeps (one batch of Polars queries); of the others what ``whole`` reads of them, on threads."""
    local = {p: io.local_path(p) if prefilter else None for p in paths}
    near = [p for p in paths if local[p] is not None]
    read = dict(zip(near, rows_in([local[p] for p in near], schema, values, ranges), strict=True)) if near else {}
    far = [p for p in paths if local[p] is None]
    read.update(zip(far, thread_map(whole, far), strict=True))
    return [read[p] for p in paths]


def _as(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` (Polars' Arrow, with its large and view types) as ``schema``."""
    return pa.Table.from_arrays([table.column(i).cast(f.type) for i, f in enumerate(schema)], schema=schema)

