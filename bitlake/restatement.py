"""Restatement (docs/restatement.md): value tombstones, which hide rows committed before them by the value of a
column (an erased user id, a bad source), at the cost of metadata only."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bitlake import transaction
from bitlake.errors import InvalidInputError
from bitlake.format import commitlog, layout
from bitlake.format.commit import TOMBSTONE, Commit, Tombstone
from bitlake.format.protocol import TOMBSTONES
from bitlake.format.state import TableState
from bitlake.fs import FileIO


def tombstone_values(state: TableState, column: str, values: Any) -> pa.Array:
    """``values`` as the distinct non-null values of ``column``'s type; InvalidInputError names what is wrong."""
    meta = state.metadata
    if column not in meta.schema.names:
        raise InvalidInputError(f"tombstone: the table has no column {column!r}; its columns are {meta.schema.names}")
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise InvalidInputError(f"tombstone: values must be a list or an array of {column!r} values, not {values!r}")
    target = meta.schema.field(column).type
    try:
        arr = values if isinstance(values, pa.Array | pa.ChunkedArray) else pa.array(list(values))
        arr = pc.cast(arr, target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as e:
        raise InvalidInputError(f"tombstone: the values are not {column!r} values ({target}): {e}") from None
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = pc.unique(arr.drop_null())
    if not len(arr):
        raise InvalidInputError("tombstone: give at least one non-null value")
    return arr


def tombstone(io: FileIO, refresh, column: str, values: Any) -> Commit:
    """One ``TOMBSTONE`` commit hiding, from its version on, the rows of batches made live before it whose
    ``column`` holds one of ``values`` (docs/FORMAT.md, "Tombstones"). No data file is read or written: the
    commit names a small Parquet file of the values; readers filter by it. The commit's parameters carry the
    table's tombstone metrics (values added, removed, total), as Iceberg's snapshot summaries do."""
    arr = tombstone_values(refresh(), column, values)

    def build(state: TableState):
        state.protocol.check_write(io.uri())
        path = layout.tombstone_path()
        with io.open_output(path) as out:
            pq.write_table(pa.table({column: arr}), out, compression="zstd")
        total = sum(t.count for _, t in state.tombstones) + len(arr)
        protocol = None if TOMBSTONES in state.protocol.reader_features else state.protocol.with_features(TOMBSTONES)
        c = Commit(state.version + 1, TOMBSTONE, commitlog.now_ms(state.timestamp_ms),
                   parameters={"column": column, "tombstones_added": len(arr), "tombstones_removed": 0,
                               "tombstones_total": total},
                   protocol=protocol, tombstones=(Tombstone(column, path, len(arr)),))
        return c, [path]

    c, _ = transaction.commit(io, refresh, build)
    assert c is not None
    return c
