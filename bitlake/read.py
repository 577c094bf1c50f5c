"""Reads: which view a call asks for, and the readers that return it (docs/timetravel.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from bitlake.engine.read import changes as changes_mod
from bitlake.engine.read import plan, reader, timetravel
from bitlake.errors import InvalidInputError, VersionExpiredError
from bitlake.format import commitlog
from bitlake.format import state as state_mod
from bitlake.format.commit import Window
from bitlake.format.metadata import delta_to_int
from bitlake.format.state import TableState
from bitlake.fs import FileIO
from bitlake.spark import changes as spark_changes
from bitlake.spark import reader as spark_reader


def view(io: FileIO, latest: TableState, version: int | None, as_of: Any, valid_at: Any
         ) -> tuple[TableState, int | None]:
    """The state of the version a read asks for, and its event time as an int64 (None: current)."""
    v = timetravel.inside_window(io, latest.window, timetravel.resolve_version(io, latest.version, version, as_of))
    state = latest if v == latest.version else _older(io, latest, v)
    t = None
    if valid_at is not None:
        if not state.metadata.keyed:
            raise InvalidInputError("valid_at needs a keyed table: an append-only table has no delta column")
        t = delta_to_int(valid_at, state.metadata.delta_type)
    timetravel.check_window(latest.window, v, t)
    return state, t


class View(ds.Dataset):
    """A view of a table (a version, an event time, columns and a condition) that engines scan: each scan streams
    the view anew from the files in bounded memory.

    A view is a ``pyarrow.dataset.Dataset``, as lance's ``LanceDataset`` is: DuckDB (``duckdb.sql("... FROM
    v")``) calls its :meth:`scanner` with the columns and the filter of the query, which the view's reader pushes
    into each Parquet file. Polars scans a table lazily with :func:`bitlake.polars.scan`; ``polars.DataFrame(v)``
    and ``pyarrow.table(v)`` take the whole view through the Arrow C stream interface."""

    # Dataset's constructor is not called: its C++ dataset stays unset (as LanceDataset's), so every method of
    # Dataset that a reader reaches is overridden here and the others refuse (see _refused below).
    def __init__(self, io: FileIO, state: TableState, valid_at: int | None, columns: list[str] | None,
                 where: Any, include_row_ids: bool):
        self._where = _expression(where, state.metadata.schema)
        self._io, self._columns, self._ids = io, columns, include_row_ids
        self._plan = plan_of(io, state, valid_at)
        self.version = state.version
        self._schema = reader.output_schema(self._plan, columns, include_row_ids)

    @property
    def schema(self) -> pa.Schema:
        return self._schema

    def __repr__(self) -> str:
        return f"View(version={self.version}, columns={self.schema.names})"

    def to_reader(self, batch_size: int = reader.BATCH_ROWS) -> pa.RecordBatchReader:
        return reader.reader(self._io, self._plan, self._ids, self._where, self._columns, batch_size)

    def scanner(self, columns: list[str] | None = None, filter: Any = None,  # noqa: A002 - pyarrow's name
                batch_size: int | None = None, **_: Any) -> Scan:
        """A one-shot scan of ``columns`` of the view (default all) where ``filter`` (a pyarrow expression or
        a SQL condition) holds, on top of the view's own condition: DuckDB's hook. Both go to the view's reader,
        so only those columns are decoded and row groups the filter rules out are skipped. Other options of
        ``Dataset.scanner`` (threads, readahead) do not apply to the view's reader and are ignored."""
        return Scan(self._reader(columns, filter, batch_size))

    def to_table(self, columns: list[str] | None = None, filter: Any = None, **_: Any  # noqa: A002
                 ) -> pa.Table:
        if columns is None and filter is None:
            return reader.read(self._io, self._plan, self._ids, self._where, self._columns)
        return self._reader(columns, filter).read_all()

    def to_batches(self, columns: list[str] | None = None, filter: Any = None,  # noqa: A002
                   batch_size: int | None = None, **_: Any) -> Iterator[pa.RecordBatch]:
        return iter(self._reader(columns, filter, batch_size))

    def count_rows(self, filter: Any = None, **_: Any) -> int:  # noqa: A002
        return sum(rb.num_rows for rb in self._reader([], filter))

    def head(self, num_rows: int, columns: list[str] | None = None, filter: Any = None,  # noqa: A002
             **_: Any) -> pa.Table:
        return Scan(self._reader(columns, filter)).head(num_rows)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.to_reader().__arrow_c_stream__(requested_schema)

    def _reader(self, columns: list[str] | None, where: Any, batch_rows: int | None = None
                ) -> pa.RecordBatchReader:
        """The view's reader for ``columns`` of its schema (its row-id columns among them when it has them),
        with ``where`` and the view's own condition pushed into the files."""
        names = self.schema.names if columns is None else list(columns)
        unknown = [c for c in names if c not in self.schema.names]
        if unknown:
            raise InvalidInputError(f"columns {unknown} are not in the view; it has {self.schema.names}")
        where = _expression(where, reader.output_schema(self._plan, None, True))
        both = where if self._where is None else self._where if where is None else self._where & where
        # The row-id columns are columns of the data files: named like the others, no include_row_ids needed.
        return reader.reader(self._io, self._plan, False, both, names, batch_rows or reader.BATCH_ROWS)


class Scan:
    """A one-shot scan of a view, with the methods of ``pyarrow.dataset.Scanner`` that consumers call. Not a
    ``Scanner.from_batches``: its ``to_reader`` starts pyarrow's threads on the view's reader holding the GIL,
    and a reader fed from Python waits for that GIL (a deadlock)."""

    def __init__(self, stream: pa.RecordBatchReader):
        self._stream = stream

    @property
    def projected_schema(self) -> pa.Schema:
        return self._stream.schema

    def to_reader(self) -> pa.RecordBatchReader:
        return self._stream

    def to_batches(self) -> Iterator[pa.RecordBatch]:
        return iter(self._stream)

    def to_table(self) -> pa.Table:
        return self._stream.read_all()

    def count_rows(self) -> int:
        return sum(rb.num_rows for rb in self._stream)

    def head(self, num_rows: int) -> pa.Table:
        out, n = [], 0
        for rb in self._stream:
            if n >= num_rows:
                break
            out.append(rb.slice(0, num_rows - n))
            n += out[-1].num_rows
        return pa.Table.from_batches(out, schema=self._stream.schema)


class TableDataset(ds.Dataset):
    """The ``pyarrow.dataset.Dataset`` side of :class:`bitlake.Table`: ``duckdb.sql("SELECT ... FROM t")`` on a
    table scans its latest version (or the one it was opened at) with the query's columns and filters pushed
    down, as on a :class:`View` (each scan takes a new view: a table's scans follow its commits)."""

    def view(self, **kwargs: Any) -> View:
        raise NotImplementedError

    @property
    def schema(self) -> pa.Schema:
        return self.view().schema

    def scanner(self, columns: list[str] | None = None, filter: Any = None,  # noqa: A002 - pyarrow's name
                batch_size: int | None = None, **kwargs: Any) -> Scan:
        return self.view().scanner(columns, filter, batch_size, **kwargs)

    def to_table(self, columns: list[str] | None = None, filter: Any = None, **kwargs: Any  # noqa: A002
                 ) -> pa.Table:
        return self.view().to_table(columns, filter, **kwargs)

    def count_rows(self, filter: Any = None, **kwargs: Any) -> int:  # noqa: A002
        return self.view().count_rows(filter, **kwargs)

    def head(self, num_rows: int, columns: list[str] | None = None, filter: Any = None,  # noqa: A002
             **kwargs: Any) -> pa.Table:
        return self.view().head(num_rows, columns, filter, **kwargs)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.view().__arrow_c_stream__(requested_schema)


def _refused(name: str) -> Any:
    def refuse(self: ds.Dataset, *args: Any, **kwargs: Any) -> Any:
        raise InvalidInputError(f"a bitlake {type(self).__name__.lower()} has no {name}(): read it (to_table, "
                                "scanner) and use pyarrow's")
    refuse.__name__ = name
    return refuse


for _cls in (View, TableDataset):
    for _name in ("get_fragments", "filter", "sort_by", "join", "join_asof", "replace_schema", "take"):
        setattr(_cls, _name, _refused(_name))
    _cls.partition_expression = property(_refused("partition_expression"))  # type: ignore[assignment]


def _expression(where: Any, schema: pa.Schema) -> pc.Expression | None:
    """A filter as a checked pyarrow expression: a SQL condition is compiled, an expression kept."""
    if isinstance(where, str):
        from bitlake import sql  # sqlglot loads on the first SQL string, not with bitlake

        where = sql.to_expression(where, schema)
    elif where is not None and not isinstance(where, pc.Expression):
        raise InvalidInputError(f"filter must be a SQL condition (\"bal > 2\") or a pyarrow compute expression "
                                f"(pyarrow.compute.field('bal') > 2), not {type(where).__name__}")
    if where is not None:
        _check_filter(where, schema)
    return where


def to_spark(spark, io: FileIO, state: TableState, valid_at: int | None, include_row_ids: bool):
    return spark_reader.read(spark, io, plan_of(io, state, valid_at), include_row_ids)


def change_plan(io: FileIO, latest: TableState, *, starting_version: int | None = None,
                ending_version: int | None = None, starting_timestamp: Any = None, ending_timestamp: Any = None,
                change_types: list[str] | None = None) -> changes_mod.ChangePlan:
    """The plan of the changes of commits ``starting_version`` to ``ending_version``, both included (Delta's
    ``table_changes``). A timestamp instead of a version: ``starting_timestamp`` is the first version committed
    at or after it, ``ending_timestamp`` the last one committed at or before it. Defaults: from the first
    commit whose changes are still readable (:func:`first_readable_change`) to the latest."""
    start, end = change_range(io, latest, starting_version, ending_version, starting_timestamp, ending_timestamp)
    unknown = set(change_types or []) - set(changes_mod.CHANGE_TYPES)
    if unknown:
        raise InvalidInputError(f"unknown change types {sorted(unknown)}; known: {list(changes_mod.CHANGE_TYPES)}")
    state = latest if end == latest.version else _older(io, latest, end)
    commits = {v: commitlog.read(io, v) for v in range(start + 1, end + 1)}
    return changes_mod.plan(io, state, start, end, commits, change_types)


def change_range(io: FileIO, latest: TableState, starting_version: int | None = None,
                 ending_version: int | None = None, starting_timestamp: Any = None, ending_timestamp: Any = None
                 ) -> tuple[int, int]:
    """The range :func:`change_plan` reads, as the engine takes it: ``(start, end]``, start exclusive."""
    if starting_version is not None and starting_timestamp is not None:
        raise InvalidInputError("give starting_version or starting_timestamp, not both")
    end = timetravel.resolve_version(io, latest.version, ending_version, ending_timestamp,
                                     names=("ending_version", "ending_timestamp"))
    ending = f"ending_version {end}" if ending_timestamp is None else \
        f"ending_timestamp {ending_timestamp} (version {end})"
    earliest = first_readable_change(io, latest.window)
    if starting_timestamp is not None:
        first = timetravel.first_at_or_after(io, latest.version, starting_timestamp)
        starting = f"starting_timestamp {starting_timestamp} (version {first})"
    elif starting_version is not None:
        first = timetravel.resolve_version(io, latest.version, starting_version, names=("starting_version", "as_of"))
        starting = f"starting_version {first}"
    else:
        first, starting = earliest, f"the first readable version {earliest}"
    if min(first, end) < earliest:
        span = f"the change feed keeps the commits from version {earliest} on"
        if latest.window is not None:
            span += (f" (the table keeps versions from {latest.window.version}, and a commit's changes need the "
                     "version before it)")
        raise VersionExpiredError(f"{starting if first < earliest else ending} is before the retention window: "
                                  f"{span}; a major compaction purged the rest")
    if first > end:
        if starting_timestamp is None or ending_timestamp is None or _after(starting_timestamp, ending_timestamp):
            raise InvalidInputError(f"{starting} is after {ending}")
        first = end + 1  # two ordered times with no commit between them: an empty range, as in Delta
    # The engine's start is exclusive; commit 0 creates the table and changes nothing.
    return min(timetravel.inside_window(io, latest.window, max(first - 1, 0)), end), end


def first_readable_change(io: FileIO, window: Window | None) -> int:
    """The first commit whose changes a change feed can read: 0, or once a major compaction set a retention
    window at version ``w``, ``w + 1`` (the changes of commit ``w`` need version ``w - 1``, which it purged) —
    ``w`` when the window starts at the compaction's own commit, which reads as ``w - 1`` and changes nothing."""
    if window is None or window.version == 0:
        return 0
    return window.version if timetravel.inside_window(io, window, window.version - 1) == window.version \
        else window.version + 1


def _after(start: Any, end: Any) -> bool:
    """Whether the time ``start`` is after the time ``end``."""
    return timetravel.timestamp_ms(start, "starting_timestamp") > timetravel.timestamp_ms(end, "ending_timestamp")


def changes_to_arrow(io: FileIO, p: changes_mod.ChangePlan) -> pa.Table:
    return changes_mod.read_arrow(io, p)


def changes(spark, io: FileIO, p: changes_mod.ChangePlan):
    return spark_changes.read_changes(spark, io, p)


def plan_of(io: FileIO, state: TableState, valid_at: int | None) -> plan.ReadPlan:
    """The read plan of a view, made once per snapshot and event time: reads of one version plan once."""
    return _derived(state, ("plan", valid_at), lambda: plan.plan(io, state, valid_at))


def _older(io: FileIO, latest: TableState, version: int) -> TableState:
    """The state at an older ``version``, reading what a later vacuum left of the files it names (kept with the
    latest snapshot, so repeated reads of a past version replay its commits once)."""
    return _derived(latest, ("older", version), lambda: state_mod.load(io, version).read_through(latest.rewritten))


DERIVED_PER_SNAPSHOT = 8


def _derived(state: TableState, key: tuple, make: Any) -> Any:
    """``state.derived[key]``, made by ``make()`` when missing; the least recently used of more than
    :data:`DERIVED_PER_SNAPSHOT` go."""
    memo = state.derived
    value = memo.pop(key, None)
    if value is None:
        value = make()
    memo[key] = value
    while len(memo) > DERIVED_PER_SNAPSHOT:
        memo.pop(next(iter(memo)))
    return value


def _check_filter(where: pc.Expression, schema: pa.Schema) -> None:
    """Refuses a filter that names no column of the table or compares values of types that do not compare,
    before any file is read (on an empty table of the table's schema, so nothing but the types is checked)."""
    try:
        schema.empty_table().filter(where)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise InvalidInputError(f"filter {where} does not apply to the table's columns {schema.names}: "
                                f"{str(e).splitlines()[0]}") from None
