"""bitlake's planner for the JVM: ``python -m bitlake.cli.planner``, a process the Spark driver's bitlake
catalog and session extension (bitlake/spark/jvm) keep running, so Spark SQL reads and writes bitlake tables by
name through the one read planner and the public :class:`bitlake.Table` API, never a second implementation.

It reads requests from stdin and writes answers to stdout, one JSON object a line each:

* ``{"op": "plan", "uri", "storage", "version", "timestamp_us", "as_of", "valid_at"}``: the view's
  :class:`bitlake.spark.reader.SparkRead` (files, row filter literal, conditions) and its Spark schema;
* ``{"op": "create", "uri", "schema", "partition_by", "properties"}``: a new table of a SQL statement's columns;
* ``{"op": "staging", "uri"}``: a fresh folder of the table's staging area, where the JVM writes rows as Parquet;
* ``{"op": "insert", "uri", "staged"}``, ``{"op": "delete", "uri", "where"}``,
  ``{"op": "update", "uri", "set", "where"}``, ``{"op": "merge", "uri", "staged", "on", "clauses"}``: one commit
  each (:meth:`Table.ingest`, :meth:`Table.delete`, :meth:`Table.update`, :meth:`Table.merge`), conditions and
  values as Spark SQL text.

An answer is ``{"ok": ...}`` or ``{"error": message, "kind": exception class}``. Anything else the process
prints goes to stderr, so a library's output cannot corrupt the answers.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import uuid
from typing import Any

import pyarrow as pa

from bitlake import read
from bitlake.engine.read import plan as planner
from bitlake.errors import InvalidInputError
from bitlake.format.layout import STAGING_DIR
from bitlake.spark import reader as spark_reader
from bitlake.spark.schema import spark_schema
from bitlake.table import Table, create_table, open_table


def _table(request: dict[str, Any]) -> Table:
    return open_table(request["uri"], request.get("storage") or None)


def plan(request: dict[str, Any]) -> dict[str, Any]:
    """The view a read asks for, as Spark executes it."""
    t = _table(request)
    as_of = request.get("as_of")
    if request.get("timestamp_us") is not None:
        as_of = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(
            microseconds=int(request["timestamp_us"]))
    version = request.get("version")
    state, valid_at = read.view(t.io, t.refresh(), None if version is None else int(version), as_of,
                                request.get("valid_at"))
    d = spark_reader.describe(t.io, planner.plan(t.io, state, valid_at))
    meta = state.metadata
    view = pa.schema([meta.schema.field(c) for c in meta.column_names])
    return {**d.to_json(), "uri": t.io.uri(), "version": state.version, "view_schema": spark_schema(view).json(),
            "row_id": spark_reader.packed_sql()}


def create(request: dict[str, Any]) -> dict[str, Any]:
    """A new table of a SQL statement's columns: ``properties`` ``primary_key`` (comma-separated) and
    ``delta_column`` make it keyed; the others are the table's properties."""
    from pyspark.sql.types import StructType

    properties = dict(request.get("properties") or {})
    key = properties.pop("primary_key", None)
    create_table(request["uri"], StructType.fromJson(json.loads(request["schema"])),
                 primary_key=[k.strip() for k in key.split(",")] if key else None,
                 delta_column=properties.pop("delta_column", None), partition_by=request.get("partition_by") or None,
                 properties=properties or None, storage_options=request.get("storage") or None)
    return {"uri": request["uri"]}


def staging(request: dict[str, Any]) -> dict[str, Any]:
    t = _table(request)
    rel = f"{STAGING_DIR}/sql-{uuid.uuid4().hex}"
    if t.io.local_path(rel) is None:
        raise InvalidInputError(f"SQL writes stage rows on the table's file system; {t.io.uri()} is not local")
    return {"uri": t.io.uri(rel), "rel": rel}


def _staged(t: Table, rel: str) -> pa.Table:
    import pyarrow.dataset as ds

    path = t.io.local_path(rel)
    if path is None:
        raise InvalidInputError(f"SQL writes stage rows on the table's file system; {t.io.uri()} is not local")
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".parquet"))
    meta = t.metadata
    if not files:
        return pa.schema([meta.schema.field(c) for c in meta.column_names]).empty_table()
    return ds.dataset(files, format="parquet").to_table()


def _done(t: Table, result: Any) -> dict[str, Any]:
    counts = getattr(result, "counts", None)
    return {"version": t.refresh().version, "result": {k: v for k, v in (counts or {}).items()} or repr(result)}


def insert(request: dict[str, Any]) -> dict[str, Any]:
    t = _table(request)
    try:
        rows = _staged(t, request["staged"])
        return _done(t, t.ingest(_conformed(rows, t)))
    finally:
        _remove(t, request["staged"])


def _conformed(rows: pa.Table, t: Table) -> pa.Table:
    """Staged rows with the table's types (Spark wrote a uint column as a wider signed one)."""
    meta = t.metadata
    target = pa.schema([meta.schema.field(c) for c in meta.column_names])
    return rows.select(target.names).cast(target) if rows.schema != target else rows


def _remove(t: Table, rel: str) -> None:
    path = t.io.local_path(rel)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def delete(request: dict[str, Any]) -> dict[str, Any]:
    t = _table(request)
    return _done(t, t.delete(request.get("where")))


def update(request: dict[str, Any]) -> dict[str, Any]:
    t = _table(request)
    return _done(t, t.update(request.get("where"), set=request["set"]))


def merge(request: dict[str, Any]) -> dict[str, Any]:
    t = _table(request)
    try:
        builder = t.merge(_staged(t, request["staged"]), request["on"], source_alias="source", target_alias="target")
        for c in request["clauses"]:
            name = {"matched": "when_matched", "not_matched": "when_not_matched",
                    "not_matched_by_source": "when_not_matched_by_source"}[c["when"]] + "_" + c["action"]
            if c["action"] in ("delete", "update_all"):
                builder = getattr(builder, name)(c.get("condition"))
            else:
                builder = getattr(builder, name)(c["set"], c.get("condition"))
        return _done(t, builder.execute())
    finally:
        _remove(t, request["staged"])


OPS = {"plan": plan, "create": create, "staging": staging, "insert": insert, "delete": delete, "update": update,
       "merge": merge}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """The answer to one request; an error of the request is an answer too."""
    try:
        op = OPS.get(request.get("op", ""))
        if op is None:
            raise InvalidInputError(f"unknown planner request {request.get('op')!r}; known: {sorted(OPS)}")
        return {"ok": op(request)}
    except Exception as e:  # noqa: BLE001 - every failure goes back to the JVM, which raises it there
        return {"error": str(e) or type(e).__name__, "kind": type(e).__name__}


def main() -> None:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if line.strip():
            answers.write(json.dumps(answer(json.loads(line))) + "\n")
            answers.flush()


if __name__ == "__main__":
    main()
