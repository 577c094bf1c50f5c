"""DML (docs/dml.md): ``delete(where)`` and ``update(where, set)`` on the current view, and ``merge`` of source
rows by the primary key.

A condition or value is a SQL string (compiled to a pyarrow expression by :mod:`bitlake.sql`, no Spark) or a
pyarrow compute expression; with ``spark=`` a SQL condition runs in Spark SQL instead. The rows a condition
selects are read from the current view with the condition pushed into the files (row groups and partitions its
statistics rule out are skipped). Then:

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
from typing import TYPE_CHECKING, Any

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
from bitlake.transaction import Finished, Transaction

if TYPE_CHECKING:
    from bitlake import sql


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
        raise InvalidInputError("update: set= must be a non-empty dict {column: SQL expression}")
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
                return _unkeyed(tx, _rids(rows), new, UPDATE, paired=rows.num_rows)
        except _Removed:
            state = refresh()  # another commit removed rows it matched: match again, rewrite what is left
    raise CommitConflictError(f"update gave up after {UPDATE_ATTEMPTS} attempts: other writers kept removing the "
                              f"rows it matched in {io.uri()}")


UPDATE_ATTEMPTS = 5


class _Removed(Exception):
    """Rows an unkeyed update rewrote were removed by another commit before it committed."""


def _unkeyed(tx: Transaction, rids: np.ndarray, new: Landed | None, operation: str, paired: int = 0) -> DmlResult:
    """One commit invalidating rows ``rids`` of an unkeyed table (those still valid when it commits) and making
    ``new`` live; the first ``paired`` of ``rids`` are rewritten by ``new``'s first rows (an update)."""
    def plan_(state: TableState, version: int):
        valid = engine_restate.valid_now(tx.io, state, rids)
        if new is not None and not valid.all():
            raise _Removed  # its rewrites of those rows would bring them back
        still = rids[valid]
        if not len(still) and new is None:
            raise Finished(DmlResult(len(rids), None, {}))
        r = engine_restate.remove_rows(tx.io, state, still, new, paired=paired)
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
    if isinstance(where, str) and spark is not None:
        if assignments and not all(isinstance(e, str) for e in assignments.values()):
            raise InvalidInputError("update: with spark=, set the columns to Spark SQL expressions (strings)")
        return _spark_matched(io, state, where, assignments, spark, columns)
    from bitlake import sql  # sqlglot loads on the first SQL string, not with bitlake

    condition = condition_of(where, sql.Scope.of(meta.schema), "where")
    try:
        rows = reader.read(io, plan.plan(io, state), include_row_ids=True, where=condition, columns=columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise InvalidInputError(f"where: {e}") from None
    if not assignments or not rows.num_rows:
        return rows
    scope = sql.Scope(rows.schema, {"": {n: n for n in meta.column_names}})
    projection = {name: value_of(assignments[name], scope, meta.schema.field(name).type) if name in assignments
                  else pc.field(name) for name in rows.column_names}
    return evaluate(rows, projection, "update")


def condition_of(where: Any, scope: sql.Scope, what: str) -> pc.Expression | None:
    """A condition given as a SQL string or a pyarrow expression (None: none, every row)."""
    if where is None:
        return None
    if isinstance(where, str):
        from bitlake import sql

        return sql.to_expression(where, scope)
    if not isinstance(where, pc.Expression):
        raise InvalidInputError(f"{what} must be a SQL condition (a string such as \"id = 3\") or a pyarrow compute "
                                f"expression, not {where!r}")
    return where


def value_of(value: Any, scope: sql.Scope, to: pa.DataType) -> pc.Expression:
    """A value given as a SQL expression (a string: ``"amount * 2"``, ``"'fixed'"``), a pyarrow expression or a
    constant, cast to the column's type ``to`` (a decimal of more places rounded half up to the column's, as Spark
    stores it)."""
    from bitlake import sql

    if isinstance(value, str):
        value = sql.to_expression(value, scope, what="value")
    elif not isinstance(value, pc.Expression):
        try:
            value = pc.scalar(value)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as e:
            raise InvalidInputError(f"{value!r} is not a value Arrow can hold: {e}") from None
    if pa.types.is_decimal(to):
        given = sql.type_of(value, scope)
        if pa.types.is_decimal(given) and given.scale > to.scale:
            value = pc.round(value, to.scale, round_mode="half_up")
    return value.cast(to)


def evaluate(table: pa.Table, projection: dict[str, pc.Expression], what: str) -> pa.Table:
    try:
        return ds.dataset(table).to_table(columns=projection)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        message = str(e).splitlines()[0]
        if what.startswith("merge") and "No match for FieldRef" in message:
            message += " (a pyarrow expression in a merge names its columns with their alias: " \
                       "pc.field('source.balance'), pc.field('target.balance'))"
        raise InvalidInputError(f"{what}: {message}") from None


def _spark_matched(io: FileIO, state: TableState, where: str, assignments: dict[str, Any] | None, spark: Any,
                   columns: list[str] | None) -> pa.Table:
    from pyspark.errors import AnalysisException, ParseException
    from pyspark.sql import functions as F

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


@dataclasses.dataclass(frozen=True)
class MergeResult:
    """What a merge did: source rows that matched a target row and that did not, the rows its commit updated,
    deleted and inserted (as the commit counted them: on a keyed table a record older than its key's current one
    is ``stale`` and changes nothing), and its commit (None: nothing to write)."""

    matched: int
    not_matched: int
    updated: int
    deleted: int
    inserted: int
    stale: int
    version: int | None
    counts: dict[str, int]


@dataclasses.dataclass(frozen=True)
class _Clause:
    side: str  # "matched", "not_matched" (a source row no target row matched), "by_source" (the converse)
    kind: str  # "update", "delete", "insert"
    predicate: Any  # a SQL string, a pyarrow expression or None
    updates: dict[str, Any] | None  # column -> value; None: every column from the source (_all)
    except_cols: tuple[str, ...] = ()


class Merge:
    """A merge of ``source`` rows into the table, built clause by clause as in delta-rs (docs/dml.md#merge):

        t.merge(src, predicate="target.id = source.id")
         .when_matched_update(updates={"bal": "source.bal"}, predicate="source.bal > 0")
         .when_not_matched_insert_all()
         .execute()

    A source row **matches** a target row (a row of the current view) when ``predicate`` holds for the pair; on a
    keyed table the predicate is the key's equality (the default), on an append-only table it needs at least one
    equality between a source and a target column and may add conditions. Each row takes the first clause of its
    side whose predicate holds: matched pairs the ``when_matched_*`` clauses, source rows no target row matched the
    ``when_not_matched_*`` ones, target rows no source row matched the ``when_not_matched_by_source_*`` ones; a row no
    clause takes is left alone. Predicates and values are SQL expressions over ``source.<column>`` and
    ``target.<column>`` (the aliases), or pyarrow expressions over fields of those names; a column name only one side
    has needs no alias. Values are cast to the column's type; a string is a SQL expression (``"'fixed'"`` is the
    string fixed).

    On a keyed table the merge is one ingestion (``MERGE``): an update keeps the target's delta value unless it sets
    the delta column (``update_all`` takes the source's, so an older source record is stale by the contract), a
    delete takes the target's, an insert the source's; records keep the source's order, which breaks ties of one
    key's equal delta values as for any batch. On an append-only table the matched rows' ids become invalid and the
    updated and inserted rows are appended, in one commit; a target row that more than one source row would update
    or delete is refused, as in Delta, unless the first matched clause is an unconditional delete (deleted once)."""

    def __init__(self, io: FileIO, refresh, source: Any, predicate: Any, source_alias: str, target_alias: str,
                 on: Any, spark: Any):
        for alias in (source_alias, target_alias):
            if not isinstance(alias, str) or not alias.isidentifier():
                raise InvalidInputError(f"merge: an alias must be a name such as 'source', not {alias!r}")
        if source_alias.lower() == target_alias.lower():
            raise InvalidInputError(f"merge: source_alias and target_alias are both {source_alias!r}")
        if predicate is not None and on is not None:
            raise InvalidInputError("merge: pass predicate= or on=, not both")
        self.io, self.refresh, self.spark = io, refresh, spark
        self.source, self.predicate, self.on = source, predicate, ([on] if isinstance(on, str) else on)
        self.s, self.t = source_alias, target_alias
        self.clauses: list[_Clause] = []

    def _add(self, side: str, kind: str, predicate: Any, updates: Any = None, set: Any = None,  # noqa: A002
             except_cols: Any = None, needs_updates: bool = False) -> Merge:
        if updates is not None and set is not None:
            raise InvalidInputError("merge: pass updates= or set= (its other name), not both")
        updates = updates if updates is not None else set
        if needs_updates and (not isinstance(updates, dict) or not updates):
            raise InvalidInputError(f"merge: when_{side}_{kind} needs updates={{column: SQL expression}}")
        self.clauses.append(_Clause(side, kind, predicate, dict(updates) if updates is not None else None,
                                    tuple([except_cols] if isinstance(except_cols, str) else except_cols or ())))
        return self

    def when_matched_update(self, updates: dict[str, Any] | None = None, predicate: Any = None, *,
                            set: dict[str, Any] | None = None) -> Merge:  # noqa: A002 - Delta's Python name
        """Sets the matched target row's columns ``updates`` (``set``: Delta's name for it) to their values."""
        return self._add("matched", "update", predicate, updates, set, needs_updates=True)

    def when_matched_update_all(self, predicate: Any = None, except_cols: list[str] | None = None) -> Merge:
        """Sets every column of the matched target row the source has (but ``except_cols``) to the source's."""
        return self._add("matched", "update", predicate, except_cols=except_cols)

    def when_matched_delete(self, predicate: Any = None) -> Merge:
        return self._add("matched", "delete", predicate)

    def when_not_matched_insert(self, updates: dict[str, Any] | None = None, predicate: Any = None) -> Merge:
        """Inserts a row of ``updates`` ({column: value}; columns left out are null) for the source row."""
        return self._add("not_matched", "insert", predicate, updates, needs_updates=True)

    def when_not_matched_insert_all(self, predicate: Any = None, except_cols: list[str] | None = None) -> Merge:
        return self._add("not_matched", "insert", predicate, except_cols=except_cols)

    def when_not_matched_by_source_update(self, updates: dict[str, Any] | None = None, predicate: Any = None, *,
                                          set: dict[str, Any] | None = None) -> Merge:  # noqa: A002
        """Sets columns of a target row no source row matched (reads the whole current view)."""
        return self._add("by_source", "update", predicate, updates, set, needs_updates=True)

    def when_not_matched_by_source_delete(self, predicate: Any = None) -> Merge:
        """Deletes a target row no source row matched (reads the whole current view)."""
        return self._add("by_source", "delete", predicate)

    # ------------------------------------------------------------------------------------------- execute

    def execute(self) -> MergeResult:
        if not self.clauses:
            raise InvalidInputError("merge: add at least one when_... clause before execute()")
        for _ in range(UPDATE_ATTEMPTS):
            state = self.refresh()
            state.protocol.check_write(self.io.uri())
            try:
                return self._execute(state)
            except _Removed:
                continue  # another commit removed target rows this merge rewrites: match again
        raise CommitConflictError(f"merge gave up after {UPDATE_ATTEMPTS} attempts: other writers kept removing the "
                                  f"rows it matched in {self.io.uri()}")

    def _execute(self, state: TableState) -> MergeResult:
        meta = state.metadata
        source = _source_table(self.source, meta)
        scope = self._scope(source.schema, meta.schema)
        on, residual = self._join(meta, source, scope)
        for clause in self.clauses:
            self._check(clause, meta, scope)
        by_source = any(c.side == "by_source" for c in self.clauses)
        # The target rows the source's values of the first join column admit (pushed to the files); all of them
        # when a clause acts on target rows no source row matched.
        s0, t0 = on[0]
        where = None if by_source else _admitted(t0, source.column(s0).cast(meta.schema.field(t0).type))
        target = reader.read(self.io, plan.plan(self.io, state), include_row_ids=True, where=where)
        pairs = _pairs(source, target, on)
        joined = self._joined(source, target, pairs)
        if residual is not None:
            holds = evaluate(joined, {"_": residual}, "merge predicate").column(0)
            joined = joined.filter(pc.fill_null(holds, False))
        hit_sources = np.unique(joined.column("_source_row").to_numpy())
        lone_sources = np.setdiff1d(np.arange(source.num_rows), hit_sources)
        groups = {"matched": joined,
                  "not_matched": self._joined(source, target, (lone_sources, None)),
                  "by_source": self._joined(source, target, (None, np.setdiff1d(
                      np.arange(target.num_rows), joined.column("_target_row").to_numpy())))}
        pieces: dict[tuple[str, str], pa.Table] = {}
        for side, rows in groups.items():
            taken = np.zeros(rows.num_rows, dtype=bool)
            for i, clause in enumerate(c for c in self.clauses if c.side == side):
                mine = ~taken
                if clause.predicate is not None:
                    condition = condition_of(clause.predicate, scope, "a merge clause's predicate")
                    holds = evaluate(rows, {"_": condition}, "merge").column(0)
                    mine &= pc.fill_null(holds, False).to_numpy(zero_copy_only=False)
                taken |= mine
                if mine.any():
                    pieces[(side, f"{clause.kind}{i}")] = self._records(rows.filter(pa.array(mine)), clause, meta,
                                                                         scope)
        matched, not_matched = len(hit_sources), len(lone_sources)
        if not pieces:
            return MergeResult(matched, not_matched, 0, 0, 0, 0, None, {})
        if meta.keyed:
            return self._ingest(pieces, matched, not_matched)
        return self._rewrite(state, pieces, matched, not_matched)

    def _scope(self, source: pa.Schema, target: pa.Schema) -> sql.Scope:
        from bitlake import sql

        fields = {self.s: {c: f"{self.s}.{c}" for c in source.names},
                  self.t: {c: f"{self.t}.{c}" for c in target.names}}
        schema = pa.schema([*(f.with_name(f"{self.s}.{f.name}") for f in source),
                            *(f.with_name(f"{self.t}.{f.name}") for f in target),
                            pa.field("_source_row", pa.int64()), pa.field("_target_row", pa.int64())])
        return sql.Scope(schema, fields)

    def _join(self, meta, source: pa.Table, scope: sql.Scope) -> tuple[list[tuple[str, str]], pc.Expression | None]:
        """The equalities a source row and a target row match by (source column, target column), and the rest of
        the predicate over the pair."""
        from bitlake import sql

        if self.predicate is None:
            if not meta.keyed and not self.on:
                raise InvalidInputError("merge into an append-only table needs predicate= (such as "
                                        f"\"{self.t}.id = {self.s}.id\") or on=[columns]")
            on = list(self.on or meta.primary_key)
            if meta.keyed and sorted(on) != sorted(meta.primary_key):
                raise InvalidInputError(f"merge matches a keyed table by its primary key {list(meta.primary_key)}, "
                                        f"not {on}")
            missing = [c for c in on if c not in source.column_names]
            if missing:
                raise InvalidInputError(f"merge: the source lacks the columns {missing}")
            return [(c, c) for c in on], None
        if not isinstance(self.predicate, str):
            raise InvalidInputError(f"merge: predicate= is a SQL condition such as \"{self.t}.id = {self.s}.id\", "
                                    f"not {type(self.predicate).__name__} (pyarrow expressions go in the clauses)")
        tree = sql.parse(self.predicate)
        on, rest = [], []
        for part in sql.conjuncts(tree):
            sides = None
            if isinstance(part, sql.exp.EQ):
                a, b = sql.column_of(part.this), sql.column_of(part.expression)
                if a and b:
                    names = [scope.resolve(q, n, self.predicate) for q, n in (a, b)]
                    sides = {name.split(".", 1)[0]: name.split(".", 1)[1] for name in names}
            if sides is not None and set(sides) == {self.s, self.t}:
                on.append((sides[self.s], sides[self.t]))
            else:
                rest.append(part)
        if not on:
            raise InvalidInputError(f"merge: the predicate {self.predicate!r} has no equality between a source and a "
                                    f"target column ({self.t}.id = {self.s}.id); a merge matches by one")
        if meta.keyed and (rest or sorted(t for _, t in on) != sorted(meta.primary_key)):
            raise InvalidInputError(
                f"merge: on a keyed table the predicate is the primary key's equality "
                f"({' and '.join(f'{self.t}.{k} = {self.s}.{k}' for k in meta.primary_key)}, the default): one "
                f"target row per key, so put other conditions in the when_... clauses' predicates")
        residual = None
        if rest:
            text = " AND ".join(p.sql(dialect="spark") for p in rest)
            residual = sql.to_expression(text, scope)
        return on, residual

    def _joined(self, source: pa.Table, target: pa.Table, pairs) -> pa.Table:
        """Source and target rows side by side (``pairs``: their row numbers, or None for a side's nulls)."""
        s_rows, t_rows = pairs
        n = len(s_rows) if s_rows is not None else len(t_rows)
        columns, names = [], []
        for side, table, rows in ((self.s, source, s_rows), (self.t, target, t_rows)):
            for name in table.column_names:
                if name in rowid.ROW_ID_COLUMNS:
                    continue
                column = table.column(name)
                columns.append(column.take(pa.array(rows)) if rows is not None else pa.nulls(n, column.type))
                names.append(f"{side}.{name}")
        for name, rows in (("_source_row", s_rows), ("_target_row", t_rows)):
            columns.append(pa.array(rows, pa.int64()) if rows is not None else pa.nulls(n, pa.int64()))
            names.append(name)
        for c in rowid.ROW_ID_COLUMNS:
            columns.append(target.column(c).take(pa.array(t_rows)) if t_rows is not None
                           else pa.nulls(n, target.schema.field(c).type))
            names.append(c)
        return pa.Table.from_arrays(columns, names=names)

    def _check(self, clause: _Clause, meta, scope: sql.Scope) -> None:
        """Refuses a clause that names what is not there, before any row is read."""
        names = meta.column_names
        if clause.predicate is not None:
            condition_of(clause.predicate, scope, "a merge clause's predicate")
        unknown = sorted((set(clause.updates or ()) | set(clause.except_cols)) - set(names))
        if unknown:
            raise InvalidInputError(f"merge: the table has no columns {unknown}; its columns are {names}")
        keys = sorted(set(clause.updates or ()) & set(meta.primary_key))
        if keys and clause.kind == "update":
            raise InvalidInputError(f"merge: cannot set the primary key columns {keys}")
        if clause.kind == "insert" and clause.updates is not None:
            required = [c for c in [*meta.primary_key, *([meta.delta_column] if meta.keyed else [])]
                        if c not in clause.updates]
            if required:
                raise InvalidInputError(f"merge: when_not_matched_insert must set the key and delta columns {required}")
        for c, value in (clause.updates or {}).items():
            value_of(value, scope, meta.schema.field(c).type)

    def _records(self, rows: pa.Table, clause: _Clause, meta, scope: sql.Scope) -> pa.Table:
        """The clause's rows as the table's columns, with the op, the source row (for order) and the row ids of the
        target row they replace."""
        s, t = f"{self.s}.", f"{self.t}."
        names = meta.column_names
        if clause.kind == "delete":
            projection = {c: pc.field(t + c) for c in names}
        elif clause.kind == "insert" and clause.updates is not None:
            projection = {c: value_of(clause.updates[c], scope, meta.schema.field(c).type) if c in clause.updates
                          else pc.scalar(None).cast(meta.schema.field(c).type) for c in names}
        elif clause.updates is None:  # update_all, insert_all
            fallback = t if clause.kind == "update" else None
            projection = {c: pc.field(s + c) if s + c in rows.column_names and c not in clause.except_cols
                          else pc.field(fallback + c) if fallback else pc.scalar(None).cast(meta.schema.field(c).type)
                          for c in names}
        else:
            projection = {c: value_of(clause.updates[c], scope, meta.schema.field(c).type) if c in clause.updates
                          else pc.field(t + c) for c in names}
        projection = {c: e.cast(meta.schema.field(c).type) for c, e in projection.items()}
        extra = {"_source_row": pc.field("_source_row"), **{c: pc.field(c) for c in rowid.ROW_ID_COLUMNS}}
        out = evaluate(rows, {**projection, **extra}, "merge")
        op = "delete" if clause.kind == "delete" else "upsert"
        return out.append_column(OP_COLUMN, pa.array([op] * out.num_rows, pa.string()))

    def _ingest(self, pieces: dict, matched: int, not_matched: int) -> MergeResult:
        # In the source's order (a key's records of equal delta values apply in it), then the by-source records.
        data = (pa.concat_tables(pieces.values()).sort_by("_source_row")
                .drop_columns(["_source_row", *rowid.ROW_ID_COLUMNS]))
        r = _ingest(self.io, self.refresh, data, OP_COLUMN, self.spark, MERGE)
        c = r.counts
        return MergeResult(matched, not_matched, c.get("updated", 0), c.get("deleted", 0), c.get("inserted", 0),
                           c.get("stale", 0), r.version, r.counts)

    def _rewrite(self, state: TableState, pieces: dict, matched: int, not_matched: int) -> MergeResult:
        """An append-only table's merge: the updated and deleted target rows' ids become invalid, the updated and
        inserted rows are appended; each update's preimage pairs with its postimage in the change feed."""
        def of(kind: str) -> pa.Table | None:
            tables = [p for (_, k), p in pieces.items() if k.startswith(kind)]
            return pa.concat_tables(tables) if tables else None

        updated, deleted, inserted = of("update"), of("delete"), of("insert")
        first = next((c for c in self.clauses if c.side == "matched"), None)
        if deleted is not None and first is not None and first.kind == "delete" and first.predicate is None:
            # Every matched pair takes an unconditional delete: a target row that several source rows match is
            # deleted once, as Delta allows (deleting it twice could not disagree).
            _, once = np.unique(_rids(deleted), return_index=True)
            deleted = deleted.take(pa.array(np.sort(once)))
        touched = [x for x in (updated, deleted) if x is not None]
        rids = np.concatenate([_rids(x) for x in touched]) if touched else np.empty(0, np.int64)
        if len(np.unique(rids)) < len(rids):
            raise InvalidInputError("merge: more than one source row matched the same target row for an update or "
                                    "delete; make the predicate match one source row per target row")
        new_rows = [x for x in (updated, inserted) if x is not None]
        new = None
        with Transaction(self.io, self.refresh) as tx:
            if new_rows:
                data = pa.concat_tables(new_rows).drop_columns(["_source_row", OP_COLUMN, *rowid.ROW_ID_COLUMNS])
                new = batches.land(tx, state, batches.landing_of(data, state.metadata, None),
                                   batches.check_batch_id(None))
            n_updated = updated.num_rows if updated is not None else 0
            r = _unkeyed(tx, rids, new, MERGE, paired=n_updated)
        c = r.counts
        return MergeResult(matched, not_matched, c.get("updated", 0), c.get("deleted", 0), c.get("inserted", 0), 0,
                           r.version, r.counts)


def _admitted(column: str, values: pa.ChunkedArray) -> pc.Expression:
    """The target rows whose ``column`` may equal one of the source's ``values`` (pushed to the files). ``isin``
    tells -0.0 from 0.0 where SQL's equality (and the join) does not: a zero admits both."""
    admitted = pc.field(column).isin(pc.unique(values))
    if pa.types.is_floating(values.type) and pc.any(pc.equal(values, 0)).as_py():
        admitted = admitted | (pc.field(column) == pa.scalar(0, values.type))
    return admitted


def _pairs(source: pa.Table, target: pa.Table, on: list[tuple[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """The row numbers of source and target rows whose ``on`` columns are equal (nulls equal nothing, -0.0 equals
    0.0, NaN equals NaN, as in Spark and DataFusion), in the source's order. The join carries row numbers only
    (pyarrow's join takes no nested column)."""
    keys = [f"_k{i}" for i in range(len(on))]

    def key(column):  # the join hashes a float's bits: -0.0 + 0.0 is 0.0, which SQL's equality takes it for
        return pc.add(column, pa.scalar(0, column.type)) if pa.types.is_floating(column.type) else column

    left = pa.table([*(key(source.column(s).cast(target.schema.field(t).type)) for s, t in on),
                     pa.array(np.arange(source.num_rows, dtype=np.int64))], names=[*keys, "_source_row"])
    right = pa.table([*(key(target.column(t)) for _, t in on), pa.array(np.arange(target.num_rows, dtype=np.int64))],
                     names=[*keys, "_target_row"])
    joined = left.join(right, keys=keys, join_type="inner").sort_by([("_source_row", "ascending"),
                                                                    ("_target_row", "ascending")])
    return joined.column("_source_row").to_numpy(), joined.column("_target_row").to_numpy()


def _source_table(source: Any, meta) -> pa.Table:
    """The source rows as an Arrow table, the columns the table has cast to its types (the source may lack some,
    and may have others, such as a change feed's op, for the predicates: they are written nowhere)."""
    reader_ = conform.arrow_input(source)
    if reader_ is None:
        raise InvalidInputError(f"merge: the source must be a pyarrow Table, a pandas DataFrame or anything that "
                                f"exports an Arrow stream (polars, DuckDB, a view), not {type(source).__name__}")
    table = reader_.read_all()
    try:
        return table.cast(pa.schema([meta.schema.field(c) if c in meta.column_names else table.schema.field(c)
                                     for c in table.column_names]))
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise InvalidInputError(f"merge: the source does not cast to the table's types: {e}") from None
