"""Reads: which view a call asks for, and the readers that return it (docs/timetravel.md)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from bitlake.engine import plan, reader, timetravel
from bitlake.errors import InvalidInputError
from bitlake.format import commitlog
from bitlake.format import state as state_mod
from bitlake.format.metadata import delta_to_int
from bitlake.format.state import TableState
from bitlake.fs import FileIO


def view(io: FileIO, latest: TableState, version: int | None, as_of: Any, valid_at: Any
         ) -> tuple[TableState, int | None]:
    """The state of the version a read asks for, and its event time as an int64 (None: current)."""
    v = timetravel.resolve_version(io, latest.version, version, as_of)
    state = latest if v == latest.version else _older(io, latest, v)
    t = None
    if valid_at is not None:
        if not state.metadata.keyed:
            raise InvalidInputError("valid_at needs a keyed table: an append-only table has no delta column")
        t = delta_to_int(valid_at, state.metadata.delta_type)
    timetravel.check_window(latest.window, v, t)
    return state, t


def to_arrow(io: FileIO, state: TableState, valid_at: int | None, include_row_ids: bool) -> pa.Table:
    return reader.read(io, plan.plan(io, state, valid_at), include_row_ids)


def to_spark(spark, io: FileIO, state: TableState, valid_at: int | None, include_row_ids: bool):
    from bitlake.spark import reader as spark_reader

    return spark_reader.read(spark, io, plan.plan(io, state, valid_at), include_row_ids)


def changes(spark, io: FileIO, latest: TableState, start_version: int, end_version: int | None,
            change_types: list[str] | None):
    from bitlake.spark import changes as spark_changes

    end = latest.version if end_version is None else end_version
    end = timetravel.resolve_version(io, latest.version, end)
    start = timetravel.resolve_version(io, latest.version, start_version)
    if start > end:
        raise InvalidInputError(f"start_version {start} is after end_version {end}")
    timetravel.check_window(latest.window, start, what="start_version")
    unknown = set(change_types or []) - set(spark_changes.CHANGE_TYPES)
    if unknown:
        raise InvalidInputError(f"unknown change types {sorted(unknown)}; known: {list(spark_changes.CHANGE_TYPES)}")
    state = latest if end == latest.version else _older(io, latest, end)
    commits = {v: commitlog.read(io, v) for v in range(start + 1, end + 1)}
    return spark_changes.read_changes(spark, io, state, start, end, commits, change_types)


def _older(io: FileIO, latest: TableState, version: int) -> TableState:
    """The state at an older ``version``, reading what a later vacuum left of the files it names."""
    state = state_mod.load(io, version)
    state.read_through(latest.rewritten)
    return state
