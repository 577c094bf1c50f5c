"""The public API: create, open, ingest, MetaGen, read, history, cleanup."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa

from bitlake import bitmap, changeevent, commitlog, faults, keyindex, metagen, rowid, timetravel
from bitlake import state as state_mod
from bitlake.commitlog import Batch, Commit
from bitlake.errors import (
    CommitConflictError,
    IndexUnavailableError,
    InvalidInputError,
    NotATableError,
    TableExistsError,
    TableNotFoundError,
)
from bitlake.fs import FileIO, file_io
from bitlake.schema import TableMetadata, conform_spark_input, delta_to_int, to_arrow_schema
from bitlake.state import TableState

PARTS_DIR = "_bitlake/parts"
MAX_COMMIT_ATTEMPTS = 30
MAX_BATCH_ID_LENGTH = 256


@dataclasses.dataclass(frozen=True)
class IngestResult:
    """What an ``ingest`` or ``metagen`` call did.

    ``committed`` is False when the batch id had already been committed (an idempotent retry), or
    when ``metagen()`` found nothing pending: then ``version`` is the version that committed it (the
    latest) and nothing was written. ``counts`` holds inserted, updated, deleted, stale and
    ignored_deletes for this batch (for ``metagen()``: for all batches it processed; empty while a
    batch is only landed).
    """

    batch_id: str | None
    version: int
    committed: bool
    visible: bool
    counts: dict[str, int]
    processed: tuple[str, ...] = ()  # the batch ids the commit made visible, in the order applied


def create_table(
    path: str,
    schema: Any,
    *,
    primary_key: list[str] | None = None,
    delta_column: str | None = None,
    partition_by: list[str] | None = None,
    file_format: str = "parquet",
    num_buckets: int = 16,
    properties: dict[str, str] | None = None,
) -> Table:
    """Creates a table at ``path`` (a local folder or ``file://`` URI) and returns it.

    Args:
        path: the table's base path; it must not hold a table yet.
        schema: a pyarrow.Schema or a Spark StructType.
        primary_key: key columns; with ``delta_column`` makes the table keyed (upserts, deletes).
        delta_column: the column that orders a key's records (a timestamp, date or integer).
        partition_by: columns whose values become Hive-style folders; the key store stays global.
        file_format: ``parquet`` or ``orc``.
        num_buckets: the key store's fixed number of hash buckets.
        properties: table properties (see ``schema.DEFAULT_PROPERTIES``).
    """
    io = file_io(path)
    meta = TableMetadata(
        schema=to_arrow_schema(schema),
        primary_key=tuple(primary_key or ()),
        delta_column=delta_column,
        partition_by=tuple(partition_by or ()),
        file_format=file_format,
        num_buckets=num_buckets,
        properties=dict(properties or {}),
    )
    meta.validate()
    if commitlog.list_versions(io):
        raise TableExistsError(f"{io.base} already holds a bitlake table")
    commit = Commit(version=0, operation=commitlog.CREATE, timestamp_ms=commitlog.now_ms(0), metadata=meta.to_json())
    try:
        commitlog.write(io, commit)
    except FileExistsError:
        raise TableExistsError(f"{io.base} already holds a bitlake table") from None
    return Table(io)


def open_table(path: str) -> Table:
    """Opens an existing table; TableNotFoundError / NotATableError otherwise."""
    io = file_io(path)
    if not io.exists():
        raise TableNotFoundError(f"no such table: {io.base} does not exist")
    if not io.is_dir():
        raise NotATableError(f"{io.base} is a file, not a bitlake table")
    table = Table(io)
    table.refresh()
    return table


class Table:
    """A bitlake table. Cheap to create; every call reads the commit log as needed."""

    def __init__(self, io: FileIO):
        self.io = io
        self._state: TableState | None = None

    def __repr__(self) -> str:
        return f"Table({self.io.base!r}, version={self.version})"

    @property
    def path(self) -> str:
        return self.io.base

    @property
    def name(self) -> str:
        """The table's name in Data Change Events: the ``table.name`` property, else its base URI."""
        return self.metadata.prop("table.name") or self.io.uri()

    @property
    def metadata(self) -> TableMetadata:
        return self.refresh().metadata

    @property
    def version(self) -> int:
        return self.refresh().version

    def refresh(self) -> TableState:
        """Brings the cached state up to the latest commit and returns it."""
        if self._state is None:
            self._state = state_mod.load(self.io)
        # Probing the next version costs one stat per new commit, where listing costs one entry per
        # commit ever made; a commit file that exists is complete (it appears by atomic link).
        while self.io.exists(commitlog.commit_path(self._state.version + 1)):
            self._state.apply(commitlog.read(self.io, self._state.version + 1))
        return self._state

    def state(self, version: int | None = None) -> TableState:
        """The table's state at ``version`` (default: latest); a fresh copy the caller may keep."""
        return state_mod.load(self.io, version)

    # ----------------------------------------------------------------------------------- writes

    def ingest(
        self,
        data: Any,
        *,
        op_column: str | None = None,
        batch_id: str | None = None,
        metagen: bool = True,
        inline: bool | None = None,
        spark: Any = None,
    ) -> IngestResult:
        """Ingests one batch: lands its records and (by default) runs MetaGen and commits.

        Args:
            data: a Spark DataFrame, a pyarrow Table or a pandas DataFrame with the table's columns.
            op_column: a string column saying what each record does: ``"upsert"`` or ``"delete"``.
                Without it every record is an upsert. It is not stored.
            batch_id: the batch's id; a batch id that already committed makes this a no-op.
            metagen: False lands the data only (pending); ``metagen()`` makes it visible later.
            inline: how MetaGen runs (docs/ingestion.md). None (default) chooses: inline (on the
                driver: key lookups in the RocksDB key index, or a scan of the touched key-store
                buckets for larger batches) when the pending records are at most
                ``metagen.inline_max_rows``, else a Spark job. True and False force one.
            spark: the SparkSession; default ``bitlake.spark_session()``.
        """
        from bitlake.spark import landing

        meta = self.metadata
        batch_id = _check_batch_id(batch_id)
        if op_column is not None and not meta.keyed:
            raise InvalidInputError("an unkeyed (append-only) table takes no op_column: it has no deletes")
        state = self.refresh()
        done = self._already_committed(state, batch_id)
        if done is not None:
            return done
        spark = spark or _session()
        df = conform_spark_input(_to_spark(spark, data), meta, op_column)
        part = self._claim_part(state)
        faults.point("after_claim")
        files = landing.land(df, meta, self.io.base, part, op_column is not None)
        faults.point("after_landing")
        batch = Batch(batch_id, part, tuple(files))
        try:
            if metagen:
                return self._commit_metagen(spark, batch, inline)
            return self._commit_land(batch)
        except BaseException:
            if self.refresh().batches.get(batch_id) is None:
                landing.remove_part_files(self.io.base, part)
            raise

    def metagen(self, *, inline: bool | None = None, spark: Any = None) -> IngestResult:
        """Runs MetaGen over every pending (landed, not yet visible) batch and commits them at once.

        ``inline`` chooses how, as for :meth:`ingest`.
        """
        return self._commit_metagen(spark, None, inline)

    def _already_committed(self, state: TableState, batch_id: str) -> IngestResult | None:
        if batch_id not in state.batches:
            return None
        visible = state.visible.get(batch_id)
        version = visible if visible is not None else state.batches[batch_id]
        commit = commitlog.read(self.io, version)
        return IngestResult(batch_id, version, False, visible is not None, commit.batch_counts.get(batch_id, {}),
                            commit.processed)

    def _claim_part(self, state: TableState) -> int:
        """Claims a segment part no other job has: an atomic create of ``_bitlake/parts/<n>``."""
        listed = [int(n) for n in self.io.listdir(PARTS_DIR) if n.isdigit()]
        n = max([state.max_part, *listed]) + 1
        while True:
            if n > rowid.MAX_PART:
                raise InvalidInputError("the table has used every segment part; compact it into a new table")
            try:
                self.io.put_if_absent(f"{PARTS_DIR}/{n:08d}", b"")
                return n
            except FileExistsError:
                n += 1

    def _commit_land(self, batch: Batch) -> IngestResult:
        def build(state: TableState):
            c = Commit(state.version + 1, commitlog.LAND, commitlog.now_ms(state.timestamp_ms),
                       batch_id=batch.batch_id, landed=batch)
            return c, []

        result = self._commit(build, batch)
        if isinstance(result, IngestResult):
            return result
        return IngestResult(batch.batch_id, result.version, True, False, {})

    def _commit_metagen(self, spark, batch: Batch | None, inline: bool | None) -> IngestResult:
        # The key index, once an inline attempt has opened it: held until the commit is applied to it,
        # so a commit opens RocksDB once.
        opened: list[keyindex.KeyIndex] = []

        def build(state: TableState):
            batches = list(state.pending) + ([batch] if batch else [])
            if not batches:
                return None, []
            version = state.version + 1
            out = self._run_metagen(spark, state, batches, version, inline, opened)
            batch_counts = {b.batch_id: out.batch_counts.get(i, dict.fromkeys(metagen.COUNTS, 0))
                            for i, b in enumerate(batches)}
            timestamp_ms = commitlog.now_ms(state.timestamp_ms)
            events = changeevent.commit_events(
                self.name, state, version, timestamp_ms, batches, out.segments, out.counts()
            )
            c = Commit(
                version=version,
                operation=commitlog.INGEST if batch else commitlog.METAGEN,
                timestamp_ms=timestamp_ms,
                events=tuple(events),
                batch_id=batch.batch_id if batch else None,
                landed=batch,
                processed=tuple(b.batch_id for b in batches),
                segments=tuple(out.segments),
                logs=tuple(out.logs),
                keystore_add=tuple(out.keystore_add),
                keystore_remove=tuple(out.keystore_remove),
                counts=out.counts(),
                batch_counts=batch_counts,
            )
            return c, out.written()

        try:
            result = self._commit(build, batch)
            if isinstance(result, IngestResult):
                return result
            if result is None:
                return IngestResult(None, self.version, False, True, {})
            self._update_index(opened[0] if opened else None)
        finally:
            for index in opened:
                index.close()
        counts = result.batch_counts.get(batch.batch_id, {}) if batch else dict(result.counts)
        return IngestResult(batch.batch_id if batch else None, result.version, True, True, counts, result.processed)

    def _run_metagen(self, spark, state: TableState, batches: list[Batch], version: int, inline: bool | None,
                     opened: list[keyindex.KeyIndex]):
        from bitlake.spark import metagen as spark_metagen

        meta = state.metadata
        rows = sum(b.records for b in batches)
        if not meta.keyed or inline is False or (inline is None and rows > meta.int_prop("metagen.inline_max_rows")):
            return spark_metagen.run(spark or _session(), self.io, state, batches, version)
        index = None
        if keyindex.supported(meta):
            try:
                if not opened:
                    opened.append(keyindex.KeyIndex(self.io, meta))
                opened[0].catch_up(state)
                index = opened[0]
            except keyindex.IndexAheadError:
                raise  # the state is stale: _commit refreshes and builds again
            except IndexUnavailableError:
                pass  # busy: the inline MetaGen reads the key store instead of the index
        return metagen.run_inline(self.io, state, batches, version, index)

    def _update_index(self, index: keyindex.KeyIndex | None) -> None:
        """Brings the key index up to the latest commit, so the next inline MetaGen starts warm.

        Best effort: the commit has landed, and an index that is busy or behind only costs the
        next writer a catch-up."""
        state = self.refresh()
        if not keyindex.supported(state.metadata):
            return
        try:
            if index is not None:
                index.catch_up(state)
                return
            with keyindex.KeyIndex(self.io, state.metadata) as fresh:
                fresh.catch_up(state)
        except IndexUnavailableError:
            pass

    def _commit(self, build, batch: Batch | None):
        """Optimistic commit: build against the latest state, put-if-absent the next version, rebase on loss.

        A lost race proves our commit did not land, so the metadata files built for it are deleted
        before rebuilding; data files of the batch are kept for the next attempt.
        """
        from bitlake.spark import landing

        for attempt in range(MAX_COMMIT_ATTEMPTS):
            state = self.refresh()
            if batch is not None:
                done = self._already_committed(state, batch.batch_id)
                if done is not None:
                    landing.remove_part_files(self.io.base, batch.segment_part)
                    return done
            try:
                commit, written = build(state)
            except keyindex.IndexAheadError:
                continue  # another writer committed since the state was read: refresh and rebuild
            if commit is None:
                return None
            faults.point("after_metagen")
            try:
                commitlog.write(self.io, commit)
                faults.point("after_commit")
            except FileExistsError:
                for path in written:
                    self.io.delete(path)
                time.sleep(random.uniform(0.05, 0.2) * min(attempt + 1, 10))
                continue
            if commit.version % state.metadata.int_prop("checkpoint.interval") == 0:
                # The state at our own version, not the latest: another writer may already be past it.
                state.apply(commit)
                state_mod.write_checkpoint(self.io, state)
            return commit
        raise CommitConflictError(
            f"gave up after {MAX_COMMIT_ATTEMPTS} attempts: other writers kept committing to {self.io.base} first"
        )

    # ------------------------------------------------------------------------------------ reads

    def to_spark(
        self,
        spark: Any = None,
        *,
        version: int | None = None,
        as_of: Any = None,
        valid_at: Any = None,
        include_row_ids: bool = False,
    ):
        """A view of the table as a Spark DataFrame (system columns hidden unless ``include_row_ids``).

        Args:
            version: the table as committed at this version (default: the latest).
            as_of: the latest version committed at or before this time (datetime or ISO string).
            valid_at: the rows valid at this value of the delta column (event time), as the chosen
                version knew them; for a timestamp column a datetime or ISO string.
        """
        from bitlake.spark import reader

        spark = spark or _session()
        state, t = self._view_state(version, as_of, valid_at)
        return reader.read(spark, self.io, state, include_row_ids, t)

    def to_arrow(
        self,
        *,
        version: int | None = None,
        as_of: Any = None,
        valid_at: Any = None,
        include_row_ids: bool = False,
    ) -> pa.Table:
        """The same view as :meth:`to_spark`, read on the driver with pyarrow (small tables, tests)."""
        from bitlake.spark.landing import data_schema

        state, t = self._view_state(version, as_of, valid_at)
        meta = state.metadata
        schema = data_schema(meta)
        columns = meta.column_names + (list(rowid.ROW_ID_COLUMNS) if include_row_ids else [])
        cache = bitmap.BitmapCache(self.io.path)
        revived = timetravel.revived_offsets(self.io, state, t) if t is not None else {}
        pieces = []
        for f in state.data_files():
            s = state.segments.get(f.segment)
            if s is None or (s.cardinality == 0 and f.segment not in revived):
                continue
            table = _read_file(self.io.path(f.path), meta.file_format, schema)
            if s.cardinality < s.data_rows:
                offsets = table.column(rowid.OFFSET_COLUMN).to_numpy().astype(np.int64)
                mask = bitmap.valid_mask(cache.get(s.bitmap, s.part, s.seq), offsets)
                if f.segment in revived:
                    mask |= np.isin(offsets, revived[f.segment])
                table = table.filter(pa.array(mask))
            if t is not None and meta.keyed:
                deltas = _deltas_as_int(table.column(meta.delta_column), meta.delta_type)
                table = table.filter(pa.array(deltas <= t))
            pieces.append(table.select(columns))
        if not pieces:
            return schema.empty_table().select(columns)
        return pa.concat_tables(pieces)

    def _view_state(self, version, as_of, valid_at) -> tuple[TableState, int | None]:
        latest = self.refresh()
        v = timetravel.resolve_version(self.io, latest.version, version, as_of)
        state = latest if v == latest.version else self.state(v)
        t = None
        if valid_at is not None:
            if not state.metadata.keyed:
                raise InvalidInputError("valid_at needs a keyed table: an append-only table has no delta column")
            t = delta_to_int(valid_at, state.metadata.delta_type)
        return state, t

    def changes(
        self,
        spark: Any = None,
        *,
        start_version: int,
        end_version: int | None = None,
        change_types: list[str] | None = None,
    ):
        """What changed in commits ``(start_version, end_version]`` as a Spark DataFrame.

        The rows carry the table's columns plus ``_change_type`` (insert, update_preimage,
        update_postimage, delete), ``_commit_version`` and ``_commit_timestamp``, in commit order.
        ``start_version`` is exclusive, ``end_version`` inclusive (default: the latest).
        """
        from bitlake.spark import changes

        spark = spark or _session()
        latest = self.refresh()
        end = latest.version if end_version is None else end_version
        end = timetravel.resolve_version(self.io, latest.version, end)
        start = timetravel.resolve_version(self.io, latest.version, start_version)
        if start > end:
            raise InvalidInputError(f"start_version {start} is after end_version {end}")
        unknown = set(change_types or []) - set(changes.CHANGE_TYPES)
        if unknown:
            raise InvalidInputError(f"unknown change types {sorted(unknown)}; known: {list(changes.CHANGE_TYPES)}")
        state = latest if end == latest.version else self.state(end)
        timestamps = {v: commitlog.read(self.io, v).timestamp_ms for v in range(start + 1, end + 1)}
        return changes.read_changes(spark, self.io, state, start, end, timestamps, change_types)

    def history(self) -> list[dict[str, Any]]:
        """One entry per commit, newest first."""
        out = []
        for v in reversed(commitlog.list_versions(self.io)):
            c = commitlog.read(self.io, v)
            out.append({
                "version": c.version,
                "timestamp": dt.datetime.fromtimestamp(c.timestamp_ms / 1000, dt.UTC).isoformat(),
                "operation": c.operation,
                "batch_id": c.batch_id,
                "processed": list(c.processed),
                "counts": dict(c.counts),
            })
        return out

    def describe(self) -> dict[str, Any]:
        state = self.refresh()
        meta = state.metadata
        return {
            "path": self.io.base,
            "format_version": meta.format_version,
            "version": state.version,
            "columns": meta.to_json()["columns"],
            "primary_key": list(meta.primary_key),
            "delta_column": meta.delta_column,
            "partition_by": list(meta.partition_by),
            "file_format": meta.file_format,
            "num_buckets": meta.num_buckets,
            "data_files": len(state.data_files()),
            "data_bytes": sum(f.bytes for f in state.data_files()),
            "stored_rows": sum(s.data_rows for s in state.segments.values()),
            "valid_rows": sum(s.cardinality for s in state.segments.values()),
            "segments": len(state.segments),
            "pending_batches": [b.batch_id for b in state.pending],
            "keystore_files": sum(len(v) for v in state.keystore.values()),
            "keystore_bytes": sum(f.bytes for v in state.keystore.values() for f in v),
        }

    # ------------------------------------------------------------------------------ maintenance

    def cleanup(self, *, min_age_seconds: float = 3600.0, dry_run: bool = False) -> list[str]:
        """Removes files that no commit references: the leftovers of jobs that never committed.

        Only files older than ``min_age_seconds`` go, so a writer that is still landing or running
        MetaGen keeps its files. Returns the removed (or, with ``dry_run``, removable) paths.
        """
        state = self.refresh()
        referenced: set[str] = set()
        for v in commitlog.list_versions(self.io):
            c = commitlog.read(self.io, v)
            if c.landed:
                referenced.update(f.path for f in c.landed.files)
            referenced.update(f.path for f in c.logs)
            referenced.update(s.bitmap for s in c.segments if s.bitmap)
            referenced.update(f.path for f in c.keystore_add)
        now = time.time()
        removable = []
        for folder in ("data", "_bitlake/keys", "_bitlake/logs", "_bitlake/bitmaps", "_bitlake/keystore"):
            for rel in self.io.walk_files(folder):
                if rel not in referenced and now - self.io.mtime(rel) >= min_age_seconds:
                    removable.append(rel)
        for folder in ("_bitlake/commits", "_bitlake/checkpoints", PARTS_DIR):
            for rel in self.io.walk_files(folder):
                if rel.rsplit("/", 1)[-1].startswith(".tmp-") and now - self.io.mtime(rel) >= min_age_seconds:
                    removable.append(rel)
        for name in self.io.listdir(PARTS_DIR):
            rel = f"{PARTS_DIR}/{name}"
            if name.isdigit() and int(name) <= state.max_part and now - self.io.mtime(rel) >= min_age_seconds:
                removable.append(rel)
        if not dry_run:
            for rel in removable:
                self.io.delete(rel)
            self.io.remove_empty_dirs("data")
        return sorted(removable)


def _session():
    from bitlake.spark.session import spark_session

    return spark_session()


def _check_batch_id(batch_id: str | None) -> str:
    if batch_id is None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S")
        return f"{stamp}-{uuid.uuid4().hex[:12]}"
    if not isinstance(batch_id, str) or not batch_id or len(batch_id) > MAX_BATCH_ID_LENGTH:
        raise InvalidInputError(f"batch_id must be a non-empty string of at most {MAX_BATCH_ID_LENGTH} characters")
    return batch_id


def _to_spark(spark, data):
    from pyspark.sql import DataFrame

    if isinstance(data, DataFrame):
        return data
    if isinstance(data, pa.Table):
        return spark.createDataFrame(data)
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        pd = None
    if pd is not None and isinstance(data, pd.DataFrame):
        return spark.createDataFrame(data)
    raise InvalidInputError(
        f"cannot ingest a {type(data).__name__}: pass a Spark DataFrame, pyarrow Table or pandas DataFrame"
    )


def _read_file(path: str, file_format: str, schema: pa.Schema) -> pa.Table:
    if file_format == "orc":
        import pyarrow.orc as orc

        return orc.read_table(path).cast(schema)
    import pyarrow.parquet as pq

    return pq.read_table(path, schema=schema)


def _deltas_as_int(column: pa.ChunkedArray, delta_type: pa.DataType) -> np.ndarray:
    """Delta values as the int64 metadata uses (see schema.delta_to_int), vectorised."""
    if pa.types.is_integer(delta_type):
        return column.cast(pa.int64()).to_numpy()
    if pa.types.is_date(delta_type):
        return column.cast(pa.int32()).to_numpy().astype(np.int64) * 86_400_000_000
    return column.cast(pa.timestamp("us", tz=delta_type.tz)).cast(pa.int64()).to_numpy()
