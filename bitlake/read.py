"""Reads: which view a call asks for, and the readers that return it (docs/timetravel.md)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from bitlake import sql
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


class View:
    """A view of a table (a version, an event time, columns and a condition) that Arrow consumers scan: each
    scan streams the view anew from the files in bounded memory. DuckDB (``duckdb.sql("... FROM v")``),
    Polars (``polars.DataFrame(v)``) and pyarrow take it through the Arrow C stream interface."""

    def __init__(self, io: FileIO, state: TableState, valid_at: int | None, columns: list[str] | None,
                 where: Any, include_row_ids: bool):
        if isinstance(where, str):
            where = sql.to_expression(where, state.metadata.schema)
        elif where is not None and not isinstance(where, pc.Expression):
            raise InvalidInputError(f"filter must be a SQL condition (\"bal > 2\") or a pyarrow compute expression "
                                    f"(pyarrow.compute.field('bal') > 2), not {type(where).__name__}")
        if where is not None:
            _check_filter(where, state.metadata.schema)
        self._io, self._columns, self._where, self._ids = io, columns, where, include_row_ids
        self._plan = plan.plan(io, state, valid_at)
        self.version = state.version
        self.schema = reader.output_schema(self._plan, columns, include_row_ids)

    def __repr__(self) -> str:
        return f"View(version={self.version}, columns={self.schema.names})"

    def to_reader(self, batch_rows: int = reader.BATCH_ROWS) -> pa.RecordBatchReader:
        return reader.reader(self._io, self._plan, self._ids, self._where, self._columns, batch_rows)

    def to_table(self) -> pa.Table:
        return reader.read(self._io, self._plan, self._ids, self._where, self._columns)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self.to_reader().__arrow_c_stream__(requested_schema)


def to_spark(spark, io: FileIO, state: TableState, valid_at: int | None, include_row_ids: bool):
    return spark_reader.read(spark, io, plan.plan(io, state, valid_at), include_row_ids)


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


def _older(io: FileIO, latest: TableState, version: int) -> TableState:
    """The state at an older ``version``, reading what a later vacuum left of the files it names."""
    return state_mod.load(io, version).read_through(latest.rewritten)


def _check_filter(where: pc.Expression, schema: pa.Schema) -> None:
    """Refuses a filter that names no column of the table or compares values of types that do not compare,
    before any file is read (on an empty table of the table's schema, so nothing but the types is checked)."""
    try:
        schema.empty_table().filter(where)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise InvalidInputError(f"filter {where} does not apply to the table's columns {schema.names}: "
                                f"{str(e).splitlines()[0]}") from None
