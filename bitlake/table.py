"""The public API: create and open tables; a :class:`Table` is a thin facade over ingestion
(:mod:`bitlake.ingest`), reads (:mod:`bitlake.read`), commits and upkeep (:mod:`bitlake.maintenance`)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import posixpath
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc

from bitlake import dml, faults, ingest, maintenance, read, restatement, transaction
from bitlake.batches import IngestResult
from bitlake.engine.maintain import upkeep
from bitlake.engine.write.landing import Landed
from bitlake.errors import InvalidInputError, NotATableError, TableExistsError, TableNotFoundError
from bitlake.format import commitlog, datafile
from bitlake.format import state as state_mod
from bitlake.format.commit import CREATE, SET_METADATA, Commit
from bitlake.format.metadata import TableMetadata, normalize_schema
from bitlake.format.protocol import Protocol
from bitlake.format.state import TableState
from bitlake.fs import FileIO, file_io
from bitlake.spark.schema import to_arrow_schema
from bitlake.spark.session import spark_session

__all__ = ["CommitResult", "IngestResult", "Table", "create_table", "open_table"]


def create_table(
    path: str | FileIO,
    schema: Any,
    *,
    name: str | None = None,
    primary_key: str | list[str] | None = None,
    delta_column: str | None = None,
    partition_by: str | list[str] | None = None,
    file_format: str = "parquet",
    num_buckets: int = 16,
    properties: dict[str, str] | None = None,
    storage_options: dict[str, str] | None = None,
) -> Table:
    """Creates a table at ``path`` and returns it.

    Args:
        path: the table's base: a local folder, or a ``file://``, ``s3://``, ``gs://``, ``az://`` or
            ``memory://`` URI (docs/storage.md); it must not hold a table yet.
        schema: a pyarrow.Schema or a Spark StructType.
        name: the table's logical name, which its Data Change Events carry (default: the folder's name).
        primary_key: key columns (or one column's name); with ``delta_column`` makes the table keyed (upserts,
            deletes).
        delta_column: the column that orders a key's records (a timestamp, date or integer).
        partition_by: columns whose values become Hive-style folders; the key store stays global.
        file_format: ``parquet`` or ``orc``.
        num_buckets: the key store's fixed number of hash buckets.
        properties: table properties (``bitlake.format.metadata.DEFAULT_PROPERTIES``).
        storage_options: an object store's credentials, endpoint, region... (delta-rs's names, such as
            ``AWS_ENDPOINT_URL``); the environment's ``AWS_*`` / ``GOOGLE_*`` / ``AZURE_*`` variables otherwise.
    """
    io = file_io(path, storage_options)
    local = io.local_path()
    if local is not None and _under_a_file(local):
        raise InvalidInputError(f"cannot create a table at {io.uri()}: it is, or is under, a file")
    if isinstance(schema, pa.Schema):
        arrow_schema = normalize_schema(schema)
    else:
        arrow_schema = to_arrow_schema(schema)
    meta = TableMetadata(
        schema=arrow_schema,
        primary_key=_columns(primary_key),
        delta_column=delta_column,
        partition_by=_columns(partition_by),
        file_format=file_format,
        num_buckets=num_buckets,
        properties={k: str(v) for k, v in (properties or {}).items()},
        name=name if name is not None else _default_name(io),
    )
    meta.validate()
    datafile.check_storable(meta.schema, meta.file_format)
    if commitlog.list_versions(io):
        raise TableExistsError(f"{io.uri()} already holds a bitlake table")
    commit = Commit(0, CREATE, commitlog.now_ms(0), protocol=Protocol(), metadata=meta.to_json())
    try:
        commitlog.write(io, commit)
    except FileExistsError:
        raise TableExistsError(f"{io.uri()} already holds a bitlake table") from None
    return Table(io)


def _columns(names: str | list[str] | None) -> tuple[str, ...]:
    """Column names given as a list, or one name as a string (``primary_key="id"``, lance's habit)."""
    return (names,) if isinstance(names, str) else tuple(names or ())


def _default_name(io: FileIO) -> str:
    return posixpath.basename(urlparse(io.uri()).path.rstrip("/")) or "table"


def open_table(path: str | FileIO, storage_options: dict[str, str] | None = None, *, version: int | None = None,
               as_of: Any = None) -> Table:
    """Opens an existing table (``path`` and ``storage_options`` as for :func:`create_table`);
    TableNotFoundError / NotATableError otherwise.

    Args:
        version: pins the table to this version (delta-rs's ``DeltaTable(path, version=)``): its reads, its
            ``version`` and ``describe()`` default to it, and every write raises ``InvalidInputError`` (open the
            table without ``version=`` to write). VersionNotFoundError if there is no such version.
        as_of: pins the table to the latest version committed at or before this time (datetime or ISO string).
    """
    io = file_io(path, storage_options)
    if not io.exists():
        raise TableNotFoundError(f"no such table: {io.uri()} does not exist")
    local = io.local_path()
    if local is not None and not _is_dir(local):
        raise NotATableError(f"{io.uri()} is a file, not a bitlake table")
    table = Table(io)
    latest = table.refresh()
    if version is not None or as_of is not None:
        table._pinned = read.view(io, latest, version, as_of, None)[0].version
    return table


def _is_dir(path: str) -> bool:
    import os

    return os.path.isdir(path)


def _under_a_file(path: str) -> bool:
    """Whether ``path`` or one of its ancestors is a file (no folder can be made there)."""
    import os

    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return False
        path = parent
    return not os.path.isdir(path)


def _reopened(io: FileIO, pinned: int | None) -> Table:
    table = Table(io)
    table._pinned = pinned
    return table


class Table(read.TableDataset):
    """A bitlake table. Cheap to create; every call reads the commit log as needed. It is also a
    ``pyarrow.dataset.Dataset`` (:class:`bitlake.read.TableDataset`): DuckDB scans it by name."""

    def __init__(self, io: FileIO):
        self.io = io
        self._state: TableState | None = None
        self._pinned: int | None = None  # open_table(version=): reads default to it, writes are refused

    def __reduce__(self) -> tuple:
        return _reopened, (self.io, self._pinned)  # pyarrow's Dataset has no pickling of its own to offer

    def __repr__(self) -> str:
        return f"Table({self.io.uri()!r}, version={self.version})"

    @property
    def path(self) -> str:
        """The base path (local tables) or URI."""
        return self.io.local_path() or self.io.uri()

    @property
    def name(self) -> str:
        """The table's logical name, carried by its Data Change Events."""
        return self.metadata.name

    @property
    def metadata(self) -> TableMetadata:
        return self.state().metadata

    @property
    def version(self) -> int:
        """The latest version, or the one the table was opened at (``open_table(version=)``)."""
        return self._pinned if self._pinned is not None else self.refresh().version

    def refresh(self) -> TableState:
        """The snapshot of the latest commit, which every write starts from: the one returned before if the table
        did not move, else a new one (a snapshot is a value: one a caller holds never changes). A table opened at
        a version is read-only: this is where its writes are refused."""
        if self._pinned is not None:
            raise InvalidInputError(f"table opened at version {self._pinned} is read-only: open it without version= "
                                    "to write")
        return self._latest()

    def _latest(self) -> TableState:
        """The snapshot of the latest commit, pinned or not (reads resolve their version against it)."""
        state = self._state if self._state is not None else state_mod.load(self.io)
        # Probing the next version costs one request per new commit, where listing costs one entry per
        # commit ever made; a commit file that exists is complete (it appears by atomic put-if-absent).
        new: list[Commit] = []
        while commitlog.exists(self.io, state.version + len(new) + 1):
            new.append(commitlog.read(self.io, state.version + len(new) + 1))
        state = state.applied(*new)
        state.protocol.check_read(self.io.uri())
        self._state = state
        return state

    def state(self, version: int | None = None) -> TableState:
        """The table's snapshot at ``version`` (default: latest, or the version the table was opened at, as its
        reads see it)."""
        if version is not None:
            return state_mod.load(self.io, version)
        return self.refresh() if self._pinned is None else self._view(None, None, None)[0]

    def _view(self, version: int | None, as_of: Any, valid_at: Any) -> tuple[TableState, int | None]:
        """The state and event time a read asks for; with neither ``version`` nor ``as_of``, the pinned version."""
        if version is None and as_of is None:
            version = self._pinned
        return read.view(self.io, self._latest(), version, as_of, valid_at)

    # ----------------------------------------------------------------------------------- writes

    def ingest(self, data: Any, *, op_column: str | None = None, batch_id: str | None = None, metagen: bool = True,
               inline: bool | None = None, spark: Any = None) -> IngestResult:
        """Ingests one batch: lands its records and (by default) runs MetaGen and commits.

        Args:
            data: the records, with the table's columns: a pyarrow Table, RecordBatch or RecordBatchReader
                (streamed in bounded memory), a pandas DataFrame or anything exporting the Arrow PyCapsule
                interface (a polars DataFrame, a DuckDB relation, another table's ``view()``; streamed) lands
                on this machine without Spark; a
                Spark DataFrame lands in a Spark job unless Spark estimates it at most
                ``ingest.driver_max_bytes``, when it is collected and lands here.
            op_column: a string column saying what each record does: ``"upsert"`` or ``"delete"``.
                Without it every record is an upsert. It is not stored.
            batch_id: the batch's id; a batch id that already committed makes this a no-op.
            metagen: False lands the data only (pending); ``metagen()`` makes it visible later.
            inline: how MetaGen runs (docs/ingestion.md). None (default) chooses: inline (on the driver: key
                lookups in the RocksDB key index, or a scan of the touched key-store buckets for larger
                batches), or a Spark job when a session is at hand (``spark``, or a Spark DataFrame's) and the
                pending records are more than ``metagen.inline_max_rows``. False: a Spark job.
            spark: the SparkSession for a Spark MetaGen; with ``inline=False`` and none given,
                ``bitlake.spark_session()``. Spark never starts unless asked for.
        """
        return self._upkeep(ingest.ingest(self.io, self.refresh, data, op_column=op_column, batch_id=batch_id,
                                          metagen=metagen, inline=inline, spark=spark))

    def metagen(self, *, inline: bool | None = None, spark: Any = None) -> IngestResult:
        """Runs MetaGen over every pending (landed, not yet visible) batch and commits them at once."""
        return self._upkeep(ingest.metagen(self.io, self.refresh, inline=inline, spark=spark))

    def commit_landed(self, batch: Landed) -> IngestResult:
        """Commits, with its MetaGen (inline), a batch landed by a Spark write's tasks in a segment part claimed
        with :func:`bitlake.transaction.claim_part` (docs/spark.md); its files go if no commit takes it."""
        return self._upkeep(ingest.commit_landed(self.io, self.refresh, batch))

    def _upkeep(self, result: IngestResult) -> IngestResult:
        if result.committed and result.visible:
            faults.point("after_commit_steps")
            maintenance.after_commit(self.io, self.refresh, result.version)
        return result

    def set_properties(self, properties: dict[str, str]) -> CommitResult:
        """Sets table properties (an empty value resets one to its default) in one commit."""
        return self._set_metadata(lambda m: m.evolve(properties=properties), {"properties": properties})

    def add_columns(self, columns: pa.Schema | list[pa.Field]) -> CommitResult:
        """Adds nullable columns at the end of the schema in one commit; earlier rows read them as null."""
        schema = columns if isinstance(columns, pa.Schema) else pa.schema(columns)
        if not len(schema):
            raise InvalidInputError("add_columns needs at least one column")
        datafile.check_storable(schema, self.metadata.file_format)
        return self._set_metadata(lambda m: m.evolve(add_columns=schema), {"add_columns": schema.names})

    def _set_metadata(self, change, parameters: dict) -> CommitResult:
        def build(state: TableState):
            state.protocol.check_write(self.io.uri())
            meta = change(state.metadata)
            return transaction.Attempt(Commit(state.version + 1, SET_METADATA, commitlog.now_ms(state.timestamp_ms),
                                              parameters=parameters, metadata=meta.to_json()))

        c = transaction.run(self.io, self.refresh, build)
        assert c is not None
        return CommitResult.of(c)

    def tombstone(self, column: str, values: Any) -> CommitResult:
        """Hides, in every view at versions from this commit on, the rows committed before it whose ``column``
        holds one of ``values`` (an erased user id, a bad source's id); rows committed later with those values
        are visible as usual, and views at earlier versions are unchanged. Costs metadata only: no data file
        is read or written (docs/restatement.md). ``counts`` holds the commit's tombstone metrics."""
        return CommitResult.of(restatement.tombstone(self.io, self.refresh, column, values))

    def vacuum(self, *, dry_run: bool = False) -> restatement.VacuumResult:
        """Removes the rows the table's tombstones hide from every data file that holds them, in any version
        of the retention window, and retires those tombstones, in one commit; the rewritten files are deleted
        at once, so from then on no file under the table holds those rows and no view, at any version,
        returns them. Only files whose statistics admit a tombstoned value are read (docs/restatement.md).
        ``dry_run``: the files it would read and rewrite and the rows it would purge now (``version`` None),
        writing nothing: it reads the files the vacuum would read, their tombstoned columns and row ids only."""
        if dry_run:
            return restatement.vacuum_dry_run(self.io, self.refresh)
        return restatement.vacuum(self.io, self.refresh)

    def revert_batch(self, batch_id: str, *, dry_run: bool = False) -> IngestResult:
        """Reverts a batch in one commit: every view from it on is as if the batch had never been ingested
        (keys it inserted disappear, keys it updated or deleted show their previous record, records of later
        batches that were stale only because of it are accepted); views at earlier versions are unchanged.
        No data file is rewritten. A batch reverted already is a no-op (``committed`` False); an unknown or
        pending batch id is an ``InvalidInputError``. ``counts`` are the change rows' (docs/restatement.md).
        ``dry_run``: the counts the revert would have now, committing nothing (``committed`` False)."""
        if dry_run:
            return restatement.revert_dry_run(self.io, self.refresh, batch_id)
        return restatement.revert_batch(self.io, self.refresh, batch_id)

    def replace_batch(self, batch_id: str, data: Any, *, op_column: str | None = None) -> IngestResult:
        """Reverts ``batch_id`` and ingests ``data`` under the same id in one atomic commit (its records arrive at
        that commit); a reader never sees one without the other. ``data`` is what :meth:`ingest` takes."""
        return restatement.replace_batch(self.io, self.refresh, batch_id, data, op_column)

    def delete(self, where: Any = None, *, predicate: Any = None, spark: Any = None) -> dml.DmlResult:
        """Deletes the current view's rows ``where`` holds for (``predicate``: delta-rs's name for it; neither:
        every row): a SQL condition (``"region = 'EU' and amount < 0"``, run on Arrow without Spark, or in Spark
        SQL when ``spark`` is given) or a pyarrow compute expression. A keyed table ingests a delete record per
        row; an unkeyed one invalidates the rows' ids. No data file is rewritten (docs/dml.md)."""
        return dml.delete(self.io, self.refresh, _one("where", where, "predicate", predicate), spark)

    def merge(self, source: Any, predicate: str | None = None, *, source_alias: str = "source",
              target_alias: str = "target", on: str | list[str] | None = None, spark: Any = None) -> dml.Merge:
        """A merge of ``source`` (a pyarrow Table, a pandas DataFrame, or anything that exports an Arrow stream:
        polars, DuckDB, a view) into the table, built as in delta-rs (docs/dml.md#merge)::

            t.merge(src, "target.id = source.id").when_matched_update_all().when_not_matched_insert_all().execute()

        ``predicate`` pairs source and target rows (a keyed table's default: its key; ``on=["id"]`` says the same
        for columns both sides name alike). Clauses: ``when_matched_update(updates=, predicate=)``,
        ``when_matched_update_all``, ``when_matched_delete``, ``when_not_matched_insert(updates=)``,
        ``when_not_matched_insert_all``, ``when_not_matched_by_source_update(updates=)``,
        ``when_not_matched_by_source_delete``; predicates and values are SQL over ``source.<column>`` and
        ``target.<column>`` (or pyarrow expressions); ``.execute()`` returns a :class:`~bitlake.dml.MergeResult`."""
        return dml.Merge(self.io, self.refresh, source, predicate, source_alias, target_alias, on, spark)

    def update(self, where: Any = None, set: dict[str, Any] | None = None, *,  # noqa: A002
               predicate: Any = None, updates: dict[str, Any] | None = None, new_values: dict[str, Any] | None = None,
               spark: Any = None) -> dml.DmlResult:
        """Sets, in the current view's rows ``where`` holds for (``predicate``: delta-rs's name; neither: every row),
        each column of ``set`` (``updates``: delta-rs's name) to its value: a SQL expression (``"amount * 2"``,
        ``"'fixed'"``) or a pyarrow expression; ``new_values`` takes plain Python values instead (a string there is
        the string). Conditions and values run on Arrow without Spark, or in Spark SQL when ``spark`` is given.
        Keys cannot be set. The updated rows are ingested as new records (docs/dml.md)."""
        if isinstance(where, dict) and set is None and updates is None:  # delta-rs's update({"a": "..."}, ...)
            where, updates = None, where
        assignments = _one("set", set, "updates", updates)
        if new_values is not None:
            if assignments is not None:
                raise InvalidInputError("update: pass set= (SQL expressions) or new_values= (values), not both")
            if not isinstance(new_values, dict):
                raise InvalidInputError("update: new_values must be a dict {column: value}")
            assignments = {c: v if isinstance(v, pc.Expression) else pc.scalar(v) for c, v in new_values.items()}
        return dml.update(self.io, self.refresh, _one("where", where, "predicate", predicate), assignments, spark)

    # ------------------------------------------------------------------------------------ reads

    def to_spark(self, spark: Any = None, *, version: int | None = None, as_of: Any = None, valid_at: Any = None,
                 include_row_ids: bool = False):
        """A view of the table as a Spark DataFrame (system columns hidden unless ``include_row_ids``).

        Args:
            version: the table as committed at this version (default: the latest).
            as_of: the latest version committed at or before this time (datetime or ISO string).
            valid_at: the rows valid at this value of the delta column (event time), as the chosen
                version knew them; for a timestamp column a datetime or ISO string.
        """
        state, t = self._view(version, as_of, valid_at)
        return read.to_spark(spark or _session(), self.io, state, t, include_row_ids)

    def to_arrow(self, *, version: int | None = None, as_of: Any = None, valid_at: Any = None,
                 columns: list[str] | None = None, filter: Any = None,  # noqa: A002 - pyarrow's and delta-rs's name
                 include_row_ids: bool = False) -> pa.Table:
        """The same view as :meth:`to_spark`, read on this machine with pyarrow (no Spark). ``columns``: the
        columns wanted (default all); ``filter``: a pyarrow compute expression, pushed down to the files (row
        groups its statistics rule out are skipped; partition columns prune the same way)."""
        return self.view(version=version, as_of=as_of, valid_at=valid_at, columns=columns, filter=filter,
                         include_row_ids=include_row_ids).to_table()

    def to_batches(self, *, version: int | None = None, as_of: Any = None, valid_at: Any = None,
                   columns: list[str] | None = None, filter: Any = None,  # noqa: A002
                   include_row_ids: bool = False, batch_size: int = 131_072) -> pa.RecordBatchReader:
        """:meth:`to_arrow` as a ``pyarrow.RecordBatchReader`` that streams the view in bounded memory."""
        return self.view(version=version, as_of=as_of, valid_at=valid_at, columns=columns, filter=filter,
                         include_row_ids=include_row_ids).to_reader(batch_size)

    def view(self, *, version: int | None = None, as_of: Any = None, valid_at: Any = None,
             columns: list[str] | None = None, filter: Any = None,  # noqa: A002
             include_row_ids: bool = False) -> read.View:
        """A view that DuckDB, Polars and other Arrow consumers scan, as often as they like, without Spark:
        ``duckdb.sql("SELECT count(*) FROM v")``, ``polars.DataFrame(v)`` (docs/reading.md)."""
        state, t = self._view(version, as_of, valid_at)
        return read.View(self.io, state, t, columns, filter, include_row_ids)

    def changes(self, spark: Any = None, *, starting_version: int | None = None, ending_version: int | None = None,
                starting_timestamp: Any = None, ending_timestamp: Any = None, change_types: list[str] | None = None):
        """What changed in commits ``starting_version`` to ``ending_version``, both included (Delta's
        ``table_changes``), as a Spark DataFrame.

        The rows carry the table's columns plus ``_change_type`` (insert, update_preimage,
        update_postimage, delete), ``_commit_version`` and ``_commit_timestamp``, in commit order.

        Args:
            starting_version: the first commit read (default: the first whose changes are still readable: 0, or
                just after the start of a major compaction's retention window; before that ``VersionExpiredError``).
            ending_version: the last commit read (default: the latest, or the version the table was opened at).
            starting_timestamp: instead of ``starting_version``: the first version committed at or after this
                time (datetime or ISO string).
            ending_timestamp: instead of ``ending_version``: the last version committed at or before this time.
            change_types: only these of the four change types.
        """
        p = self._change_plan(starting_version, ending_version, starting_timestamp, ending_timestamp, change_types)
        return read.changes(spark or _session(), self.io, p)

    def changes_to_arrow(self, *, starting_version: int | None = None, ending_version: int | None = None,
                         starting_timestamp: Any = None, ending_timestamp: Any = None,
                         change_types: list[str] | None = None) -> pa.Table:
        """:meth:`changes` as a pyarrow Table, read on this machine without Spark (the same rows, in the same
        order; ``_commit_timestamp`` is a UTC timestamp)."""
        p = self._change_plan(starting_version, ending_version, starting_timestamp, ending_timestamp, change_types)
        return read.changes_to_arrow(self.io, p)

    def _change_plan(self, starting_version, ending_version, starting_timestamp, ending_timestamp, change_types):
        if ending_version is None and ending_timestamp is None:
            ending_version = self._pinned
        return read.change_plan(self.io, self._latest(), starting_version=starting_version,
                                ending_version=ending_version, starting_timestamp=starting_timestamp,
                                ending_timestamp=ending_timestamp, change_types=change_types)

    def history(self, limit: int | None = None) -> list[dict[str, Any]]:
        """One entry per commit, newest first (from the retention window's start, once cleanup dropped the
        commits before it); with ``limit`` (delta-rs's name), the newest ``limit`` only, reading only their
        commit files."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidInputError(f"limit must be a count of commits (an int of at least 0), not {limit!r}")
        out: list[dict[str, Any]] = []
        last = self.version
        first = state_mod.earliest_version(self.io) if limit is None else max(0, last - limit + 1)
        for v in range(last, first - 1, -1):
            if limit is not None and not commitlog.exists(self.io, v):
                break  # before the retention window's start
            c = commitlog.read(self.io, v)
            out.append({
                "version": c.version,
                "timestamp": dt.datetime.fromtimestamp(c.timestamp_ms / 1000, dt.UTC).isoformat(),
                "operation": c.operation,
                "batch_id": c.parameters.get("batch_id") or next((b.batch_id for b in c.landed), None),
                "processed": list(c.made_live),
                "counts": dict(c.counts),
                "user": c.info.get("user"),
                "duration_ms": c.info.get("duration_ms"),
            })
        return out

    def describe(self) -> dict[str, Any]:
        state = self.state()
        meta = state.metadata
        files = state.data_files()
        return {
            "path": self.path,
            "name": meta.name,
            "table_id": meta.table_id,
            "protocol": state.protocol.to_json(),
            "version": state.version,
            "columns": meta.to_json()["columns"],
            "primary_key": list(meta.primary_key),
            "delta_column": meta.delta_column,
            "partition_by": list(meta.partition_by),
            "file_format": meta.file_format,
            "num_buckets": meta.num_buckets,
            "properties": dict(meta.properties),
            "data_files": len(files),
            "data_bytes": sum(f.bytes for f in files),
            "stored_rows": sum(f.rows for f in files),
            "valid_rows": sum(s.cardinality for s in state.segments.values()),
            "segments": len(state.segments),
            "pending_batches": [b.batch_id for b in state.pending],
            "keystore_files": sum(len(v) for v in state.keystore.values()),
            "keystore_bytes": sum(f.bytes for v in state.keystore.values() for f in v),
            "log_files": len(state.logs),
            "window": state.window.to_json() if state.window else None,
            "tombstones": [{"version": v, "column": t.column, "values": t.count} for v, t in state.tombstones],
            "maintenance": upkeep.metrics(self.io, state).to_json(),
        }

    # ------------------------------------------------------------------------------ maintenance

    def cleanup(self, *, min_age_seconds: float = 3600.0, dry_run: bool = False) -> list[str]:
        """Removes files no version of the retention window names: the leftovers of jobs that never committed,
        and what only expired versions read.

        Only files older than ``min_age_seconds`` go, so a writer that is still landing or running MetaGen keeps
        its files; and the files of every version that was the latest within ``min_age_seconds`` stay, so a
        reader that planned on one keeps reading it (docs/maintenance.md). Returns the removed (or, with
        ``dry_run``, removable) paths.
        """
        return maintenance.cleanup(self.io, self.refresh(), min_age_seconds=min_age_seconds, dry_run=dry_run)

    def compact(self, *, major: bool = False, look_back: Any = None, target_file_bytes: int | None = None,
                cluster_by: str | None = None, dry_run: bool = False, progress=None) -> Any:
        """Compaction (docs/maintenance.md). Minor: rewrites the small data files and those with many superseded
        rows into files of about ``target_file_bytes`` (default: the ``compact.target_file_bytes`` property),
        current rows apart from superseded ones, every row keeping its row id: no view, at any version or
        event time, and no change range changes.

        ``major=True`` also sets the retention window from ``look_back`` (a version, an age such as ``"7d"``,
        or a commit time; default the ``compact.look_back`` property): reads before it raise
        ``VersionExpiredError``, every read inside it stays as it was, and the superseded rows no view inside
        it can see are left out of the rewritten files; ``cleanup()`` then removes what only expired versions
        named. ``cluster_by`` (a number, date, timestamp or string column) rewrites every file of each partition
        into files that each hold one range of that column's values, so that a vacuum of a few of its values, or a
        filter on it, reads few files; a partition whose files already hold disjoint ranges is left as it is
        (docs/maintenance.md, "Clustering"). Returns a :class:`~bitlake.engine.maintain.compaction.CompactResult`
        (``version`` None: nothing was worth it); with ``dry_run``, a dict of what it would rewrite.
        ``progress(rows, total)`` is called once with the total rows it will rewrite (``rows`` 0), then with the
        rows of each file as it is rewritten."""
        if look_back is not None and not major:
            raise InvalidInputError("look_back sets the retention window of a major compaction: pass major=True")
        if target_file_bytes is not None and (isinstance(target_file_bytes, bool) or
                                              not isinstance(target_file_bytes, int) or target_file_bytes < 1):
            raise InvalidInputError(f"target_file_bytes must be a positive number of bytes, not {target_file_bytes!r}")
        if cluster_by is not None and not isinstance(cluster_by, str):
            raise InvalidInputError(f"cluster_by must be a column name, not {cluster_by!r}")
        return maintenance.compact(self.io, self.refresh, target_file_bytes=target_file_bytes, dry_run=dry_run,
                                   progress=progress, major=major, look_back=look_back, cluster_by=cluster_by)

    def maintain(self, *, dry_run: bool = False, min_age_seconds: float = 3600.0,
                 progress=None) -> maintenance.MaintainResult:
        """Automatic upkeep (docs/maintenance.md): reads the table's metrics (file sizes, superseded rows per
        file, log files, the age of the oldest version) and runs what is due under the ``maintain.*`` and
        ``compact.*`` properties: a major compaction when the ``compact.look_back`` window has moved by
        ``maintain.major_interval``, else a minor one when files are worth rewriting; then :meth:`cleanup`.
        With ``dry_run`` it only returns the plan (each task's reason and expected gain) and the files cleanup
        would remove. ``progress`` as for :meth:`compact`."""
        return maintenance.maintain(self.io, self.refresh, dry_run=dry_run, min_age_seconds=min_age_seconds,
                                    progress=progress)

    def analyze(self) -> CommitResult:
        """Records the column statistics of the data files that have none (written before bitlake recorded them, or
        by format v1), so that filters prune them too; one ``ANALYZE`` commit (``version`` None: every file had
        them). No view changes (docs/reading.md)."""
        c = maintenance.analyze(self.io, self.refresh)
        return CommitResult.of(c) if c is not None else CommitResult(None, "ANALYZE", {})

    def upgrade(self) -> CommitResult:
        """Upgrades a format v1 table to format v2 in one commit (``version`` None: it was v2 already)."""
        c = maintenance.upgrade(self.io, self.refresh)
        return CommitResult.of(c) if c is not None else CommitResult(None, "UPGRADE", {})


@dataclasses.dataclass(frozen=True)
class CommitResult:
    """What a write that is neither an ingestion nor DML did: the version it committed (None: nothing to do), its
    operation, and its counts or metrics."""

    version: int | None
    operation: str
    counts: dict[str, Any]

    @classmethod
    def of(cls, commit: Commit) -> CommitResult:
        return cls(commit.version, commit.operation, {**dict(commit.counts), **{
            k: v for k, v in commit.parameters.items() if isinstance(v, int) and not isinstance(v, bool)}})


def _one(name: str, value: Any, other: str, other_value: Any) -> Any:
    """The argument given under one of two names (ours and delta-rs's)."""
    if value is not None and other_value is not None:
        raise InvalidInputError(f"pass {name}= or {other}= (the same thing), not both")
    return value if value is not None else other_value


def _session():
    return spark_session()
