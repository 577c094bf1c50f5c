"""DML (docs/dml.md): ``delete(where)`` and ``update(where, set)`` on the current view, and ``merge`` of source
rows by the primary key.

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

from bitlake import batches, read
from bitlake.batches import IngestResult
from bitlake.engine.read import plan, reader
from bitlake.engine.write import conform
from bitlake.engine.write import restate as engine_restate
from bitlake.engine.write.landing import Landed
from bitlake.errors import CommitConflictError, InvalidInputError
from bitlake.format import rowid
from bitlake.format.commit import DELETE, MERGE, UPDATE
from bitlake.format.metadata import OP_COLUMN
from bitlake.format.state import TableState
from bitlake.fs import FileIO
from bitlake.spark.schema import spark_schema
from bitlake.spark.session import spark_session
from bitlake.transaction import Finished, Transaction


@dataclasses.dataclass(frozen=True)
class DmlResult:
    """What a ``delete`` or ``update`` did: the rows its condition matched, the version it committed (None: no
    row matched, nothing committed) and the commit's counts (a keyed table's: as an ingestion's, so a row whose
    key a newer record replaced meanwhile counts as stale)."""

    matched: int
    version: int | None
    counts: dict[str, int]


def _ingest(io: FileIO, refresh, data: pa.Table, op_column: str | None, spark: Any, operation: str) -> IngestResult:
    """A keyed table's DML is an ingestion of its records (module docstring)."""
    with Transaction(io, refresh) as tx:
        return batches.write(tx, data, op_column=op_column, batch_id=None, metagen=True, inline=None, spark=spark,
                             operation=operation)


def delete(io: FileIO, refresh, where: Any, spark: Any) -> DmlResult:
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
        r = _ingest(io, refresh, data, OP_COLUMN, spark, DELETE)
        return DmlResult(rows.num_rows, r.version, r.counts)
    with Transaction(io, refresh) as tx:
        return _unkeyed(tx, _rids(rows), None, DELETE)


def update(io: FileIO, refresh, where: Any, assignments: dict[str, Any], spark: Any) -> DmlResult:
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
    for _ in range(UPDATE_ATTEMPTS):
        rows = _matched(io, state, where, assignments, spark)
        if not rows.num_rows:
            return DmlResult(0, None, {})
        data = rows.drop_columns(list(rowid.ROW_ID_COLUMNS))
        if meta.keyed:
            r = _ingest(io, refresh, data, None, spark, UPDATE)
            return DmlResult(rows.num_rows, r.version, r.counts)
        try:
            with Transaction(io, refresh) as tx:
                new = batches.land(tx, state, batches.landing_of(data, meta, None), batches.check_batch_id(None))
                return _unkeyed(tx, _rids(rows), new, UPDATE)
        except _Removed:
            state = refresh()  # another commit removed rows it matched: match again, rewrite what is left
    raise CommitConflictError(f"update gave up after {UPDATE_ATTEMPTS} attempts: other writers kept removing the "
                              f"rows it matched in {io.uri()}")


UPDATE_ATTEMPTS = 5


class _Removed(Exception):
    """Rows an unkeyed update rewrote were removed by another commit before it committed."""


def _unkeyed(tx: Transaction, rids: np.ndarray, new: Landed | None, operation: str) -> DmlResult:
    """One commit invalidating rows ``rids`` of an unkeyed table (those still valid when it commits) and making
    ``new`` live."""
    def plan_(state: TableState, version: int):
        valid = engine_restate.valid_now(tx.io, state, rids)
        if operation == UPDATE and not valid.all():
            raise _Removed  # its rewrites of those rows would bring them back
        still = rids[valid]
        if not len(still) and new is None:
            raise Finished(DmlResult(len(rids), None, {}))
        r = engine_restate.remove_rows(tx.io, state, still, new, pair=operation == UPDATE)
        return batches.ChangePlan(r, [], {"rows": int(len(rids))})

    try:
        c = batches.commit_changes(tx, operation, new, plan_)
    except Finished as done:
        return done.result
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

    if spark is None:
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


# ---------------------------------------------------------------------------------------------------- merge

SOURCE, TARGET = "source.", "target."


@dataclasses.dataclass(frozen=True)
class MergeResult:
    """What a merge did: source rows matched and not matched, records it wrote by kind, and its commit (None:
    nothing to write)."""

    matched: int
    not_matched: int
    updated: int
    deleted: int
    inserted: int
    version: int | None
    counts: dict[str, int]


@dataclasses.dataclass
class _Clause:
    kind: str  # "update", "delete", "insert"
    predicate: pc.Expression | None
    assignments: dict[str, Any] | None  # update: column -> expression; None: every column from the source


class Merge:
    """A merge of ``source`` rows into a keyed table by its primary key, built clause by clause as in delta-rs:
    ``t.merge(src).when_matched_update_all().when_not_matched_insert_all().execute()``.

    A source row **matches** when its key is in the current view. Each source row takes the first clause of its
    kind (matched or not) whose predicate holds; a row no clause takes is left alone. Predicates and update
    expressions are pyarrow compute expressions over the columns ``source.<name>`` and ``target.<name>``
    (``pc.field("source.amount")``); a constant is taken as it is. The records are ingested as one batch
    (``MERGE``): an update keeps the target's delta value unless it sets the delta column (``update_all`` takes
    the source's, so an older source record is stale by the contract), a delete takes the target's, an insert
    the source's (docs/dml.md). The records keep the source's order, which breaks ties of one key's equal delta
    values as the contract does for any batch."""

    def __init__(self, io: FileIO, refresh, source: Any, on: Any, spark: Any):
        self.io, self.refresh, self.spark = io, refresh, spark
        self.source = source
        self.on = on
        self.clauses: list[_Clause] = []

    def when_matched_update(self, set: dict[str, Any], predicate: pc.Expression | None = None) -> Merge:  # noqa: A002
        if not isinstance(set, dict) or not set:
            raise InvalidInputError("merge: when_matched_update needs set={column: expression}")
        self.clauses.append(_Clause("update", predicate, dict(set)))
        return self

    def when_matched_update_all(self, predicate: pc.Expression | None = None) -> Merge:
        self.clauses.append(_Clause("update", predicate, None))
        return self

    def when_matched_delete(self, predicate: pc.Expression | None = None) -> Merge:
        self.clauses.append(_Clause("delete", predicate, None))
        return self

    def when_not_matched_insert_all(self, predicate: pc.Expression | None = None) -> Merge:
        self.clauses.append(_Clause("insert", predicate, None))
        return self

    def execute(self) -> MergeResult:
        state = self.refresh()
        state.protocol.check_write(self.io.uri())
        meta = state.metadata
        if not meta.keyed:
            raise InvalidInputError("merge needs a keyed table (it matches by the primary key); on an append-only "
                                    "table use delete and ingest")
        pk = list(meta.primary_key)
        on = [self.on] if isinstance(self.on, str) else list(self.on or pk)
        if sorted(on) != sorted(pk):
            raise InvalidInputError(f"merge matches by the table's primary key {pk}, not {on}")
        if not self.clauses:
            raise InvalidInputError("merge: add at least one when_... clause before execute()")
        source = _source_table(self.source, meta)
        names = meta.column_names
        # The target rows of the source's keys: a condition on the first key column pushed to the files, then
        # an exact join on every key column.
        keys = pc.unique(source.column(pk[0]))
        target = reader.read(self.io, plan.plan(self.io, state), where=pc.field(pk[0]).isin(keys))
        # The join pairs row numbers by the keys alone (pyarrow's join carries no nested column); the rows follow.
        left = source.select(pk).append_column("_source_row", pa.array(np.arange(source.num_rows, dtype=np.int64)))
        right = target.select(pk).rename_columns([TARGET + c for c in pk]).append_column(
            "_target_row", pa.array(np.arange(target.num_rows, dtype=np.int64)))
        pairs = left.join(right, keys=pk, right_keys=[TARGET + c for c in pk], join_type="left outer",
                          ).sort_by("_source_row")
        at = pairs.column("_target_row")
        joined = pa.Table.from_arrays(
            [*source.take(pairs.column("_source_row")).columns, *target.take(at).columns, pairs.column("_source_row")],
            names=[*(SOURCE + c for c in source.column_names), *(TARGET + c for c in names), "_source_row"])
        matched = at.is_valid().to_numpy(zero_copy_only=False)
        taken = np.zeros(joined.num_rows, dtype=bool)
        pieces: dict[str, list[pa.Table]] = {"update": [], "delete": [], "insert": []}
        for clause in self.clauses:
            mine = ~taken & (matched if clause.kind != "insert" else ~matched)
            if clause.predicate is not None:
                holds = _evaluate(joined, {"_p": clause.predicate}).column("_p")
                mine &= pc.fill_null(holds, False).to_numpy(zero_copy_only=False)
            taken |= mine
            rows = joined.filter(pa.array(mine))
            if rows.num_rows:
                pieces[clause.kind].append(self._records(rows, clause, meta))
        n = {k: sum(p.num_rows for p in v) for k, v in pieces.items()}
        records = [p for v in pieces.values() for p in v]
        if not records:
            return MergeResult(int(matched.sum()), int((~matched).sum()), 0, 0, 0, None, {})
        # In the source's order: a key's records of equal delta values apply in it (the contract's position).
        data = pa.concat_tables(records).sort_by("_source_row").drop_columns(["_source_row"])
        r = _ingest(self.io, self.refresh, data, OP_COLUMN, self.spark, MERGE)
        return MergeResult(int(matched.sum()), int((~matched).sum()), n["update"], n["delete"], n["insert"],
                           r.version, r.counts)

    def _records(self, rows: pa.Table, clause: _Clause, meta) -> pa.Table:
        """The clause's records as ingest input: the table's columns and the op column."""
        if clause.kind == "delete":
            projection = {c: pc.field(TARGET + c) for c in meta.column_names}
        elif clause.kind == "insert" or clause.assignments is None:
            projection = {c: pc.field(SOURCE + c) if SOURCE + c in rows.column_names else pc.field(TARGET + c)
                          for c in meta.column_names}
        else:
            unknown = sorted(set(clause.assignments) - set(meta.column_names))
            if unknown:
                raise InvalidInputError(f"merge: the table has no columns {unknown}")
            keys = sorted(set(clause.assignments) & set(meta.primary_key))
            if keys:
                raise InvalidInputError(f"merge: cannot set the primary key columns {keys}")
            projection = {}
            for c in meta.column_names:
                value = clause.assignments.get(c, pc.field(TARGET + c))
                projection[c] = value if isinstance(value, pc.Expression) else pc.scalar(value)
        projection = {c: e.cast(meta.schema.field(c).type) for c, e in projection.items()}
        out = _evaluate(rows, {**projection, "_source_row": pc.field("_source_row")})
        op = "delete" if clause.kind == "delete" else "upsert"
        return out.append_column(OP_COLUMN, pa.array([op] * out.num_rows, pa.string()))


def _evaluate(table: pa.Table, projection: dict[str, pc.Expression]) -> pa.Table:
    try:
        return ds.dataset(table).to_table(columns=projection)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise InvalidInputError(f"merge: {e}") from None


def _source_table(source: Any, meta) -> pa.Table:
    """The source rows as an Arrow table (the key and delta columns required; other columns may be left out, and
    an update_all then keeps the target's; columns the table lacks, such as a change feed's op, are there for
    the predicates and written nowhere)."""
    reader_ = conform.arrow_input(source)
    if reader_ is None:
        raise InvalidInputError(f"merge: the source must be a pyarrow Table or a pandas DataFrame, not "
                                f"{type(source).__name__}")
    table = reader_.read_all()
    missing = [c for c in [*meta.primary_key, meta.delta_column] if c not in table.column_names]
    if missing:
        raise InvalidInputError(f"merge: the source lacks the columns {missing}")
    try:
        return table.cast(pa.schema([meta.schema.field(c) if c in meta.column_names else table.schema.field(c)
                                     for c in table.column_names]))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise InvalidInputError(f"merge: the source does not cast to the table's types: {e}") from None
