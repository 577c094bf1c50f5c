"""Polars lazy scans of a table: :func:`scan` returns a ``polars.LazyFrame`` whose projection, filter and row limit
reach bitlake's reader (docs/reading.md).

Polars is optional and imported only when a scan is made or run. The scan is a Polars IO plugin
(``polars.io.plugins.register_io_source``): Polars hands it the columns a query needs, its predicate (a Polars
expression) and its row limit. The parts of the predicate that translate to a pyarrow expression (comparisons of
a column with a literal, ``is_between``, ``is_null``, ``&``, ``|``, ``~``) are pushed into the Parquet reads;
the whole predicate is then applied to each batch, so a predicate that does not translate is still exact.
"""

from __future__ import annotations

import datetime as dt
import json
import operator
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bitlake.errors import InvalidInputError, MissingDependencyError
from bitlake.read import View
from bitlake.table import Table, open_table


def scan(table_or_path: Table | str, *, version: int | None = None, as_of: Any = None, valid_at: Any = None,
         storage_options: dict[str, str] | None = None) -> Any:
    """A ``polars.LazyFrame`` of the view of a table (a :class:`~bitlake.table.Table` or its path), planned now:
    collecting it twice reads the same version.

    Args:
        version: the table as committed at this version (default: the latest).
        as_of: the latest version committed at or before this time (datetime or ISO string).
        valid_at: the rows valid at this value of the delta column (event time).
        storage_options: for a path, as for :func:`bitlake.open_table`.
    """
    try:
        import polars as pl
        from polars.io.plugins import register_io_source
    except ImportError:
        raise MissingDependencyError("bitlake.polars.scan needs polars: pip install polars") from None
    table = table_or_path if isinstance(table_or_path, Table) else open_table(table_or_path, storage_options)
    view = table.view(version=version, as_of=as_of, valid_at=valid_at)
    schema = pl.from_arrow(view.schema.empty_table()).schema  # type: ignore[union-attr]

    def source(with_columns: list[str] | None, predicate: Any, n_rows: int | None, batch_size: int | None
               ) -> Iterator[Any]:
        return _batches(view, with_columns, predicate, n_rows, batch_size)

    return register_io_source(source, schema=schema, is_pure=True, explain_name="bitlake",
                              explain_detail=f"version {view.version}")


def _batches(view: View, with_columns: list[str] | None, predicate: Any, n_rows: int | None,
             batch_size: int | None) -> Iterator[Any]:
    import polars as pl

    names = view.schema.names if with_columns is None else list(with_columns)
    read = names
    if predicate is not None:  # the predicate's columns too, to filter on before the projection
        needed = set(names) | set(predicate.meta.root_names())
        read = [c for c in view.schema.names if c in needed]
    try:
        stream = view.scanner(columns=read, filter=to_arrow_expression(predicate, view.schema),
                              batch_size=batch_size).to_reader()
    except InvalidInputError:  # a pushed filter pyarrow cannot apply (types Polars compares and pyarrow does not)
        stream = view.scanner(columns=read, batch_size=batch_size).to_reader()
    left = n_rows
    for rb in stream:
        df = pl.from_arrow(rb)
        if predicate is not None:
            df = df.filter(predicate)  # type: ignore[union-attr]
        df = df.select(names)  # type: ignore[union-attr]
        if left is not None:
            df = df.head(left)
            left -= df.height
        if df.height:
            yield df
        if left is not None and left <= 0:
            return


def to_arrow_expression(predicate: Any, schema: pa.Schema) -> pc.Expression | None:
    """The part of a Polars predicate over columns of ``schema`` that translates to a pyarrow expression with
    the same rows (a superset of them, for an ``&`` of which only some terms translate), or None."""
    if predicate is None:
        return None
    try:
        node = json.loads(predicate.meta.serialize(format="json"))
    except Exception:  # noqa: BLE001 - a Polars that serializes otherwise: nothing is pushed
        return None
    # Polars orders NaN above every number and equal to itself, pyarrow's comparisons are false on NaN: a
    # comparison on a floating-point column stays with Polars.
    floats = {f.name for f in schema if pa.types.is_floating(f.type)}
    return _convert(node, floats, exact=False)


_COMPARE = {"Eq": operator.eq, "NotEq": operator.ne, "Lt": operator.lt, "LtEq": operator.le, "Gt": operator.gt,
            "GtEq": operator.ge}


def _convert(node: Any, floats: set[str], exact: bool) -> pc.Expression | None:
    """``node`` (Polars' JSON of an expression) as a pyarrow expression; None where it does not translate.
    Not ``exact``: a conjunction may drop the terms that do not translate (a superset of the rows)."""
    if not isinstance(node, dict) or len(node) != 1:
        return None
    (kind, body), = node.items()
    if kind == "Column" and isinstance(body, str):
        return pc.field(body)
    if kind == "Literal":
        return _literal(body)
    if kind == "BinaryExpr" and isinstance(body, dict):
        op = body.get("op")
        if op in ("And", "LogicalAnd"):
            left, right = _convert(body["left"], floats, exact), _convert(body["right"], floats, exact)
            if left is None or right is None:
                return None if exact else left if right is None else right
            return left & right
        if op in _COMPARE and _on_floats([body["left"], body["right"]], floats):
            return None
        left, right = _convert(body["left"], floats, True), _convert(body["right"], floats, True)
        if left is None or right is None:
            return None
        if op in ("Or", "LogicalOr"):
            return left | right
        return _COMPARE[op](left, right) if op in _COMPARE else None
    if kind == "Function" and isinstance(body, dict):
        function, inputs = body.get("function"), body.get("input", [])
        args = [_convert(a, floats, True) for a in inputs]
        if not isinstance(function, dict) or any(a is None for a in args) or not args:
            return None
        boolean, first = function.get("Boolean"), args[0]
        assert first is not None
        if boolean == "IsNull" and len(args) == 1:
            return first.is_null()
        if boolean == "IsNotNull" and len(args) == 1:
            return first.is_valid()
        if boolean == "Not" and len(args) == 1:
            return ~first
        if isinstance(boolean, dict) and "IsBetween" in boolean and len(args) == 3 and not _on_floats(inputs, floats):
            closed = boolean["IsBetween"].get("closed")
            low = first >= args[1] if closed in ("Both", "Left") else first > args[1]
            high = first <= args[2] if closed in ("Both", "Right") else first < args[2]
            return low & high
    return None


def _on_floats(nodes: list[Any], floats: set[str]) -> bool:
    return any(isinstance(n, dict) and n.get("Column") in floats for n in nodes)


def _literal(body: Any) -> pc.Expression | None:
    """A literal of a type whose comparison means the same in pyarrow; None for the others."""
    if not isinstance(body, dict) or len(body) != 1:
        return None
    (kind, value), = body.items()
    if not isinstance(value, dict) or len(value) != 1:
        return None
    (dtype, v), = value.items()
    if dtype in ("Int", "Float", "String", "Boolean") or dtype.startswith(("Int", "UInt", "Float")):
        return pc.scalar(v) if isinstance(v, int | float | str | bool) else None
    if dtype == "Date" and isinstance(v, int):
        return pc.scalar(pa.scalar(dt.date(1970, 1, 1) + dt.timedelta(days=v), pa.date32()))
    return None
