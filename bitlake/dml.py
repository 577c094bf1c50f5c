"""DML (docs/dml.md): ``delete(where)`` and ``update(where, set)`` on the current view.

The rows a condition selects are read from the current view: by Spark for a Spark SQL condition (its Parquet
reader skips files and row groups by their statistics and partition values), on the driver for a pyarrow
compute expression. Then:

* on a keyed table the change is an ingestion of records, one a row: a delete record, or the updated row as
  an upsert, each with the delta value of the row it changes (or, for an update that sets the delta column,
  the value it sets), so the contract accepts it (a tie goes to the later arrival) unless a newer record of the
  key committed meanwhile; time travel, event-time views and the change feed follow as for any batch;
* on an unkeyed table a delete makes the rows' ids invalid in their bitmaps (a deletion vector), and an update
  does that and appends the updated rows, in one commit whose change rows are in a change file.

Only the new records (or bitmaps) and their metadata are written: no data file is rewritten.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from bitlake import faults, ingest, restatement, transaction
from bitlake.engine import landing, plan, reader
from bitlake.engine import restate as engine_restate
from bitlake.engine.metagen import Landed
from bitlake.errors import InvalidInputError
from bitlake.format import rowid
from bitlake.format.commit import DELETE, UPDATE
from bitlake.format.metadata import OP_COLUMN
from bitlake.format.state import TableState
from bitlake.fs import FileIO


@dataclasses.dataclass(frozen=True)
class DmlResult:
    """What a ``delete`` or ``update`` did: the rows its condition matched, the version it committed (None: no
    row matched, nothing committed) and the commit's counts (a keyed table's: as an ingestion's, so a row whose
    key a newer record replaced meanwhile counts as stale)."""

    matched: int
    version: int | None
    counts: dict[str, int]


def delete(io: FileIO, refresh, writes: ingest.Ingestion, where: Any, spark: Any) -> DmlResult:
    state = refresh()
    state.protocol.check_write(io.uri())
    meta = state.metadata
    # A delete record needs its key and delta value (and any column that takes no null); an unkeyed row its id.
    wanted = [f.name for f in meta.schema if f.name in meta.primary_key or f.name == meta.delta_column
              or not f.nullable] if meta.keyed else []
    rows = _matched(io, state, where, None, spark, wanted)
    if not rows.num_rows:
        return DmlResult(0, None, {})
    if meta.keyed:
        data = rows.drop_columns(list(rowid.ROW_ID_COLUMNS)).append_column(
            OP_COLUMN, pa.array(["delete"] * rows.num_rows, pa.string()))
        r = writes.ingest(data, op_column=OP_COLUMN, batch_id=None, metagen=True, inline=None, spark=spark,
                          operation=DELETE)
        return DmlResult(rows.num_rows, r.version, r.counts)
    return _unkeyed(io, refresh, _rids(rows), None, DELETE)


def update(io: FileIO, refresh, writes: ingest.Ingestion, where: Any, assignments: dict[str, Any],
           spark: Any) -> DmlResult:
    state = refresh()
    state.protocol.check_write(io.uri())
    meta = state.metadata
    if not isinstance(assignments, dict) or not assignments:
        raise InvalidInputError("update: set must be a non-empty dict {column: expression}")
    unknown = sorted(set(assignments) - set(meta.column_names))
    if unknown:
        raise InvalidInputError(f"update: the table has no columns {unknown}; its columns are {meta.column_names}")
    keys = sorted(set(assignments) & set(meta.primary_key))
    if keys:
        raise InvalidInputError(f"update: cannot set the primary key columns {keys}: delete the rows and ingest "
                                "them under their new keys")
    rows = _matched(io, state, where, assignments, spark)
    if not rows.num_rows:
        return DmlResult(0, None, {})
    data = rows.drop_columns(list(rowid.ROW_ID_COLUMNS))
    if meta.keyed:
        r = writes.ingest(data, op_column=None, batch_id=None, metagen=True, inline=None, spark=spark,
                          operation=UPDATE)
        return DmlResult(rows.num_rows, r.version, r.counts)
    land = ingest.landing_of(data, meta, None)
    part = transaction.claim_part(io, state)
    faults.point("after_claim")
    data_files, keys_files = land(io, part)
    faults.point("after_landing")
    new = Landed(ingest.check_batch_id(None), part, sum(f.rows for f in data_files), tuple(data_files),
                 tuple(keys_files))
    try:
        return _unkeyed(io, refresh, _rids(rows), new, UPDATE)
    except BaseException:
        if refresh().parts.get(part) is None:
            landing.remove_part_files(io, part)
        raise


def _unkeyed(io: FileIO, refresh, rids: np.ndarray, new: Landed | None, operation: str) -> DmlResult:
    """One commit invalidating rows ``rids`` of an unkeyed table (those still valid when it commits) and making
    ``new`` live."""
    def plan_(state: TableState, version: int):
        still = rids[engine_restate.valid_now(io, state, rids)]
        if not len(still) and new is None:
            raise restatement.Done(DmlResult(len(rids), None, {}))
        r = engine_restate.remove_rows(io, state, still, new, pair=operation == UPDATE)
        return r, [], {"rows": int(len(rids))}

    c = restatement.commit(io, refresh, operation, new, plan_)
    if isinstance(c, DmlResult):
        return c
    return DmlResult(len(rids), c.version, dict(c.counts))


def _rids(rows: pa.Table) -> np.ndarray:
    return rowid.pack_arrays(*(rows.column(c).to_numpy() for c in rowid.ROW_ID_COLUMNS))


def _matched(io: FileIO, state: TableState, where: Any, assignments: dict[str, Any] | None, spark: Any,
             columns: list[str] | None = None) -> pa.Table:
    """The current view's rows ``where`` holds for (``columns`` of them, default all), with their row ids; with
    ``assignments``, their columns set to the assigned expressions."""
    meta = state.metadata
    if isinstance(where, str):
        if assignments and not all(isinstance(e, str) for e in assignments.values()):
            raise InvalidInputError("update: with a Spark SQL condition, set the columns to Spark SQL expressions")
        return _spark_matched(io, state, where, assignments, spark, columns)
    if not isinstance(where, pc.Expression):
        raise InvalidInputError(f"where must be a Spark SQL condition (a string) or a pyarrow compute expression, "
                                f"not {where!r}")
    try:
        rows = reader.read(io, plan.plan(io, state), include_row_ids=True, where=where, columns=columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise InvalidInputError(f"where: {e}") from None
    if not assignments or not rows.num_rows:
        return rows
    projection = {}
    for name in rows.column_names:
        value = assignments.get(name, pc.field(name))
        expr = value if isinstance(value, pc.Expression) else pc.scalar(value)  # a constant
        projection[name] = expr.cast(meta.schema.field(name).type) if name in meta.schema.names else expr
    try:
        return ds.dataset(rows).to_table(columns=projection)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise InvalidInputError(f"update: {e}") from None


def _spark_matched(io: FileIO, state: TableState, where: str, assignments: dict[str, Any] | None, spark: Any,
                   columns: list[str] | None) -> pa.Table:
    from pyspark.errors import AnalysisException, ParseException
    from pyspark.sql import functions as F

    from bitlake import read
    from bitlake.spark.schema import spark_schema

    if spark is None:
        from bitlake.spark.session import spark_session

        spark = spark_session()
    meta = state.metadata
    try:
        df = read.to_spark(spark, io, state, None, include_row_ids=True).filter(where)
        if columns is not None:
            df = df.select(*columns, *rowid.ROW_ID_COLUMNS)
        if assignments:
            target = spark_schema(meta.schema)
            df = df.select(*[F.expr(assignments[c]).cast(target[c].dataType).alias(c) if c in assignments
                             else F.col(c) for c in df.columns])
        table = df.toArrow()
    except (AnalysisException, ParseException) as e:
        raise InvalidInputError(f"where/set: {str(e).splitlines()[0]}") from None
    return table.cast(pa.schema([meta.schema.field(n) if n in meta.schema.names else table.schema.field(n)
                                 for n in table.column_names]))
