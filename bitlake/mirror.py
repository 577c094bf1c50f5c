"""A PostgreSQL table mirrored into a bitlake table: a consistent snapshot, then logical replication, exactly
once through crashes (docs/cdc.md, "PostgreSQL mirror").

1. **Snapshot.** A logical replication slot is created on a replication connection with
   ``EXPORT_SNAPSHOT``; the table is read in that very snapshot (``SET TRANSACTION SNAPSHOT``, ``COPY ... TO
   STDOUT``, parsed by pyarrow's CSV reader) and ingested as batch ``snapshot-<slot>``, every row at the
   slot's consistent point (its LSN). Every change after that point comes from the slot. A mirror killed
   before the snapshot's commit drops the slot and starts over.
2. **Changes.** Each step peeks at most ``batch_changes`` changes of whole transactions from the slot
   (``pg_logical_slot_peek_changes`` with wal2json, format 2), ingests them as batch
   ``wal-<slot>-<end LSN>`` (the delta column takes each change's commit LSN; a transaction's changes tie and
   keep their order, as the contract orders ties), and only then advances the slot
   to the end LSN (``pg_replication_slot_advance``). A restart first advances the slot to the end of the last
   committed batch, so a step whose commit landed is never applied again, and one that did not is peeked
   again. TRUNCATE deletes every key at its LSN (the batch is split there; the parts but the last carry a
   ``-part<i>`` suffix).
3. **Schema changes.** A column added to the source is added to the table when it is nullable; a column
   dropped, or one whose type changed, stops the mirror with an error before anything of that step is
   written.

The bitlake table is keyed by the source's primary key (or ``key``, for a table without one, which then needs
``REPLICA IDENTITY FULL``) with an ``int64`` delta column ``_lsn``.
"""

from __future__ import annotations

import dataclasses
import decimal
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

import bitlake
from bitlake import cdc
from bitlake.errors import BitlakeError, InvalidInputError
from bitlake.format import commitlog
from bitlake.fs import file_io

log = logging.getLogger(__name__)

LSN_COLUMN = "_lsn"
# How long a mirror waits for a server process that holds its replication slot to let it go (that of a mirror
# killed while it read the slot goes on until the server notices) before it takes the slot for another mirror's.
SLOT_WAIT_SECONDS = 30
# How long run() keeps reconnecting to a source that went away (a restart, a cut connection) before it gives up.
RECONNECT_SECONDS = 300.0
APPLICATION_NAME = "bitlake-mirror"
_WAL2JSON = ("'format-version', '2', 'include-lsn', '1', 'include-transaction', '1', 'include-types', '1', "
             "'add-tables', %s")


class SchemaChangedError(BitlakeError):
    """The source table changed in a way the mirror cannot follow (a column dropped, a type changed)."""


def lsn_int(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def lsn_text(value: int) -> str:
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


_WAL_BATCH = re.compile(r"wal-(?P<slot>.+)-(?P<end>[0-9a-f]{16})(?P<piece>-part\d+)?")


def wal_batch(batch_id: str) -> tuple[str, int, bool] | None:
    """The slot and end LSN of a change batch the mirror named (``wal-<slot>-<end LSN>``), and whether it is a
    piece a TRUNCATE split the step into (not its last); None for any other batch id."""
    m = _WAL_BATCH.fullmatch(batch_id)
    return (m["slot"], int(m["end"], 16), m["piece"] is not None) if m is not None else None


_TYPES: dict[str, pa.DataType] = {
    "bigint": pa.int64(), "integer": pa.int32(), "smallint": pa.int16(), "boolean": pa.bool_(),
    "text": pa.string(), "character varying": pa.string(), "character": pa.string(), "uuid": pa.string(),
    "json": pa.string(), "jsonb": pa.string(), "double precision": pa.float64(), "real": pa.float32(),
    "date": pa.date32(), "timestamp with time zone": pa.timestamp("us", tz="UTC"),
    "timestamp without time zone": pa.timestamp("us"), "bytea": pa.binary(),
}


def arrow_type(pg_type: str) -> pa.DataType:
    """The Arrow type of a column of PostgreSQL type ``pg_type`` (``format_type``'s text)."""
    if pg_type.strip().endswith("[]"):
        return pa.string()  # arrays: their text form
    # A type modifier goes: "numeric(10,2)", "timestamp(3) with time zone", "character varying(20)".
    base = re.sub(r"\s*\([^)]*\)", "", pg_type).strip()
    if base == "numeric":
        if "(" in pg_type:
            precision, _, scale = pg_type[pg_type.index("(") + 1:pg_type.index(")")].partition(",")
            return pa.decimal128(int(precision), int(scale or 0))
        return pa.string()  # unconstrained numeric: any scale; kept exactly as text
    if base in _TYPES:
        return _TYPES[base]
    raise InvalidInputError(f"PostgreSQL type {pg_type!r} has no mapping to Arrow in bitlake's mirror")


@dataclasses.dataclass
class Column:
    name: str
    pg_type: str
    nullable: bool


@dataclasses.dataclass
class Progress:
    """One step: the LSN applied up to, the source's current LSN, the bytes of WAL behind, the changes the
    step applied and their rate."""

    lsn: int
    current: int
    lag_bytes: int
    changes: int
    seconds: float

    @property
    def changes_per_s(self) -> float:
        return self.changes / self.seconds if self.seconds else 0.0


class PostgresMirror:
    """Mirrors ``source`` (``schema.table``) of the database at ``dsn`` (a libpq connection string or
    ``postgresql://`` URL) into the bitlake table at ``path``, created on the first run."""

    def __init__(self, dsn: str, source: str, path: str, *, slot: str | None = None, key: list[str] | None = None,
                 batch_changes: int = 50_000, storage_options: dict | None = None,
                 progress: Callable[[Progress], None] | None = None, reconnect_seconds: float = RECONNECT_SECONDS):
        self.dsn, self.path, self.key, self.batch_changes = dsn, path, key, batch_changes
        self.reconnect_seconds = reconnect_seconds
        self.storage_options = storage_options
        self.schema_name, _, self.table_name = source.rpartition(".")
        self.schema_name = self.schema_name or "public"
        self.source = f"{self.schema_name}.{self.table_name}"
        self.slot = slot or "bitlake_" + "".join(c if c.isalnum() else "_" for c in self.source.lower())
        self.progress = progress
        self.conn = self._connect()
        self.table = self._table()

    def _connect(self):
        import psycopg

        conn = psycopg.connect(self.dsn, autocommit=True, application_name=APPLICATION_NAME)
        conn.execute("SET TimeZone = 'UTC'")
        return conn

    def close(self) -> None:
        self.conn.close()

    # ------------------------------------------------------------------------------------ the catalog

    def columns(self) -> list[Column]:
        rows = self.conn.execute(
            "SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull FROM pg_attribute a "
            "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            (self.source,)).fetchall()
        if not rows:
            raise InvalidInputError(f"no such table in the source database: {self.source}")
        return [Column(n, t, bool(nullable)) for n, t, nullable in rows]

    def primary_key(self) -> list[str]:
        rows = self.conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary "
            "ORDER BY array_position(i.indkey, a.attnum)", (self.source,)).fetchall()
        if rows:
            return [r[0] for r in rows]
        if not self.key:
            raise InvalidInputError(
                f"{self.source} has no primary key: add one, or pass key=[...] (columns unique in the table) and set "
                f"ALTER TABLE {self.source} REPLICA IDENTITY FULL, so that deletes carry the key")
        identity = self.conn.execute("SELECT relreplident FROM pg_class WHERE oid = %s::regclass",
                                     (self.source,)).fetchone()
        if identity is None or identity[0] != "f":
            raise InvalidInputError(f"{self.source} has no primary key: its deletes carry no key unless "
                                    f"ALTER TABLE {self.source} REPLICA IDENTITY FULL")
        return list(self.key)

    def _table(self):
        key = self.primary_key()
        try:
            t = bitlake.open_table(self.path, self.storage_options)
        except (bitlake.TableNotFoundError, bitlake.NotATableError) as e:
            # A mirror killed while it created the table leaves its folder without commit 0: create it again.
            if isinstance(e, bitlake.NotATableError) and commitlog.list_versions(file_io(self.path,
                                                                                       self.storage_options)):
                raise
            columns = self.columns()
            schema = pa.schema([pa.field(c.name, arrow_type(c.pg_type), c.nullable or c.name in key)
                                for c in columns] + [pa.field(LSN_COLUMN, pa.int64())])
            return bitlake.create_table(self.path, schema, primary_key=key, delta_column=LSN_COLUMN,
                                        name=f"postgresql.{self.source}", storage_options=self.storage_options)
        meta = t.metadata
        if list(meta.primary_key) != key or meta.delta_column != LSN_COLUMN:
            raise InvalidInputError(f"{self.path} is not a mirror of {self.source}: its key is "
                                    f"{list(meta.primary_key)} and delta column {meta.delta_column!r}")
        return t

    # ------------------------------------------------------------------------------------ the snapshot

    def _snapshot_id(self) -> str:
        return f"snapshot-{self.slot}"

    def snapshot(self) -> None:
        """Takes the initial snapshot unless a committed one exists."""
        import psycopg

        if self.table.refresh().batch(self._snapshot_id()) is not None:
            return
        exists = self.conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                                   (self.slot,)).fetchone()
        if exists:  # a mirror killed before its snapshot committed: start over
            self._wait_for_slot(exists[0])
            self.conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        replication = psycopg.connect(self.dsn, autocommit=True, replication="database")
        try:
            create = f"CREATE_REPLICATION_SLOT {self.slot} LOGICAL wal2json EXPORT_SNAPSHOT"
            row = replication.execute(create).fetchone()
            assert row is not None
            point, snapshot_name = lsn_int(row[1]), row[2]
            with psycopg.connect(self.dsn, autocommit=True) as reader:
                reader.execute("SET TimeZone = 'UTC'")
                reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                reader.execute(f"SET TRANSACTION SNAPSHOT '{snapshot_name}'")
                result = self.table.ingest(self._copy(reader, point), batch_id=self._snapshot_id())
                reader.execute("ROLLBACK")
        finally:
            replication.close()
        log.info("snapshot of %s: %s at LSN %s", self.source, result.counts, lsn_text(point))

    def _copy(self, reader, point: int) -> pa.RecordBatchReader:
        """The source table's rows in the reader's transaction, each at LSN ``point``, streamed: COPY in CSV
        through a pipe into pyarrow's CSV reader (typed by the table's schema: no Python object per value)."""
        import pyarrow.csv as pacsv

        meta = self.table.metadata
        names = [c for c in meta.column_names if c != LSN_COLUMN]
        # Read as text where pyarrow's CSV parser and PostgreSQL's text form differ; converted per batch.
        text_types = {n: pa.string() for n in names if not _csv_native(meta.schema.field(n).type)}
        types = {n: text_types.get(n, meta.schema.field(n).type) for n in names}
        read_fd, write_fd = os.pipe()
        error: list[BaseException] = []

        def pump() -> None:
            try:
                with os.fdopen(write_fd, "wb") as out, reader.cursor().copy(
                        f"COPY (SELECT {', '.join(_quote(n) for n in names)} FROM {_quote_table(self.source)}) "
                        "TO STDOUT WITH (FORMAT csv, NULL '\\N')") as copy:
                    for chunk in copy:
                        out.write(chunk)
            except BaseException as e:  # noqa: BLE001 - re-raised by the reading side
                error.append(e)

        thread = threading.Thread(target=pump, daemon=True, name="bitlake-mirror-copy")
        thread.start()
        stream = os.fdopen(read_fd, "rb")
        csv = pacsv.open_csv(pa.PythonFile(stream, mode="r"), read_options=pacsv.ReadOptions(
            column_names=names, block_size=8 << 20), convert_options=pacsv.ConvertOptions(
            column_types=types, null_values=["\\N"], strings_can_be_null=True, quoted_strings_can_be_null=False))
        schema = pa.schema([*(meta.schema.field(n) for n in names), meta.schema.field(LSN_COLUMN)])

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                for rb in csv:
                    columns = [_from_text(rb.column(n), meta.schema.field(n).type) if n in text_types
                               else rb.column(n) for n in names]
                    yield pa.RecordBatch.from_arrays([*columns, pa.array([point] * rb.num_rows, pa.int64())],
                                                     schema=schema)
            finally:
                stream.close()
                thread.join()
            if error:
                raise error[0]

        return pa.RecordBatchReader.from_batches(schema, batches())

    # ------------------------------------------------------------------------------------ the changes

    def committed_lsn(self) -> int | None:
        """The end LSN of the last committed change batch (None: none yet)."""
        steps = [wal_batch(b.batch_id) for b in self.table.refresh().parts.values()]
        ends = [end for slot, end, piece in filter(None, steps) if slot == self.slot and not piece]
        return max(ends) if ends else None

    def _wait_for_slot(self, pid: int | None) -> None:
        """Waits until no server process holds the slot (``pid``: the one that did). A mirror killed while it read
        the slot leaves its server process at work until the server notices, for a moment; a slot held for
        SLOT_WAIT_SECONDS is another mirror's, and this one stops."""
        deadline = time.monotonic() + SLOT_WAIT_SECONDS
        while pid is not None:
            if time.monotonic() > deadline:
                raise BitlakeError(f"the replication slot {self.slot} has been in use by server process {pid} for "
                                   f"{SLOT_WAIT_SECONDS} s: another mirror of {self.source} runs on it")
            time.sleep(0.1)
            row = self.conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                                    (self.slot,)).fetchone()
            pid = row[0] if row is not None else None

    def step(self) -> Progress:
        """One micro-batch: peek, ingest, advance. Returns its progress (``changes`` 0: nothing was waiting)."""
        started = time.perf_counter()
        committed = self.committed_lsn()
        slot = self.conn.execute("SELECT confirmed_flush_lsn::text, active_pid FROM pg_replication_slots "
                                 "WHERE slot_name = %s", (self.slot,)).fetchone()
        if slot is None:
            raise BitlakeError(f"the replication slot {self.slot} is gone (dropped?): the changes since the table's "
                               "last commit are lost to it; mirror into a new table")
        self._wait_for_slot(slot[1])
        confirmed = lsn_int(slot[0])
        if committed is not None and committed > confirmed:  # killed between a commit and its advance
            self.conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot, lsn_text(committed)))
        rows = self.conn.execute(
            f"SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, %s, {_WAL2JSON})",
            (self.slot, self.batch_changes, self.source)).fetchall()
        changes, end, commit = [], None, 0
        # One parse for the step (numbers as Decimal: numeric values keep every digit).
        parsed = json.loads("[" + ",".join(data for _, data in rows) + "]", parse_float=decimal.Decimal)
        for c in parsed:
            if c["action"] == "B":
                commit = lsn_int(c["lsn"])  # the transaction's commit LSN (wal2json's B row names it)
            elif c["action"] == "C":
                end = lsn_int(c["nextlsn"])
            elif c["action"] in "IUDT":  # not "M": a logical decoding message (pg_logical_emit_message)
                changes.append({**c, "_commit": commit})
        if end is not None:
            self._apply(changes, end)
            self.conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot, lsn_text(end)))
        current = lsn_int(self.conn.execute("SELECT pg_current_wal_lsn()::text").fetchall()[0][0])
        done = end if end is not None else max(confirmed, committed or 0)
        p = Progress(done, current, max(0, current - done), len(changes), time.perf_counter() - started)
        if self.progress is not None:
            self.progress(p)
        return p

    def _apply(self, changes: list[dict], end: int) -> None:
        self._follow_schema(changes)
        pieces = _columnar(changes, self.table.metadata, self._current)
        base = f"wal-{self.slot}-{end:016x}"
        for i, (kind, piece) in enumerate(pieces):
            batch_id = base if i == len(pieces) - 1 else f"{base}-part{i}"
            if kind == "truncate":
                piece = cdc.truncation(self.table, piece)
            self.table.ingest(piece, op_column=cdc.OP, batch_id=batch_id)
        # No piece (transactions of other tables only): nothing to commit; the slot's advance moves the position.

    def _current(self, keys: list[tuple]) -> dict[tuple, dict]:
        """The table's current rows of ``keys`` (tuples of the primary key's values), by key."""
        pk = list(self.table.metadata.primary_key)
        rows = self.table.to_arrow(filter=pc.field(pk[0]).isin(sorted({k[0] for k in keys}))).to_pylist()
        return {tuple(r[c] for c in pk): r for r in rows}

    def _follow_schema(self, changes: list[dict]) -> None:
        """Adds the nullable columns the source gained; raises SchemaChangedError for any other change."""
        meta = self.table.metadata
        known = {n: meta.schema.field(n).type for n in meta.column_names}
        # The distinct column lists of the step's rows (one, but around a DDL): each checked once. An update
        # leaves out the TOASTed values it did not change: a column missing there is dropped only when the
        # catalog says so.
        signatures = {(c["action"] == "U", tuple((v["name"], v["type"]) for v in c["columns"]))
                      for c in changes if c["action"] in "IU"}
        seen: dict[str, str] = {}
        listed: set[str] | None = None
        for update, signature in signatures:
            names = {n for n, _ in signature}
            missing = [n for n in known if n != LSN_COLUMN and n not in names]
            if missing and update:
                listed = listed if listed is not None else {c.name for c in self.columns()}
                missing = [n for n in missing if n not in listed]
            if missing:
                raise SchemaChangedError(f"{self.source} no longer has columns {missing} (dropped?): the mirror "
                                         "stops; nothing of this step was written")
            for n, t in signature:
                if n in known and arrow_type(t) != known[n]:
                    raise SchemaChangedError(f"{self.source} changed the type of {n!r} (now {t}): the mirror stops; "
                                             "nothing of this step was written")
                seen.setdefault(n, t)
        added = [n for n in seen if n not in known]
        if added:
            catalog = {c.name: c for c in self.columns()}
            wrong = [n for n in added if n in catalog and not catalog[n].nullable]
            if wrong:
                raise SchemaChangedError(f"{self.source} gained NOT NULL columns {wrong}: earlier rows have no value; "
                                         "the mirror stops; nothing of this step was written")
            self.table.add_columns([pa.field(n, arrow_type(seen[n]), True) for n in added])
            log.info("%s gained columns %s: added to the table", self.source, added)

    # ------------------------------------------------------------------------------------ running

    def run(self, *, interval: float = 1.0, stop: threading.Event | None = None, until_caught_up: bool = False
            ) -> None:
        """The snapshot if needed, then steps until ``stop`` is set (or, ``until_caught_up``, until a step finds
        nothing left); sleeps ``interval`` seconds when a step found nothing.

        A lost connection to the source (a server restarted or crashed, the connection terminated) is not an
        error: the mirror connects again, waiting longer each time (up to 2 s), for up to
        :attr:`reconnect_seconds` without a step done, and goes on from its slot. Nothing is lost or applied twice
        (the restart rule of :meth:`step`): a step cut before its commit is peeked again, one cut after it is
        skipped by the slot's advance."""
        import psycopg

        snapshot_done, down_since, pause = False, None, 0.1
        while stop is None or not stop.is_set():
            try:
                if self.conn.closed:
                    self.conn = self._connect()
                if not snapshot_done:
                    self.snapshot()
                    snapshot_done = True
                p = self.step()
                caught_up = p.changes == 0 and until_caught_up and (p.lag_bytes == 0 or self._idle())
            except psycopg.OperationalError as e:
                now = time.monotonic()
                down_since = down_since or now
                if now - down_since > self.reconnect_seconds:
                    raise
                log.warning("the source database went away (%s): connecting again in %.1f s",
                            str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__, pause)
                self.conn.close()
                time.sleep(pause)
                pause = min(2.0, pause * 2)
                continue
            down_since, pause = None, 0.1
            if caught_up:
                return
            if p.changes == 0:
                time.sleep(interval)

    def _idle(self) -> bool:
        """Whether the slot has nothing left to decode (the WAL beyond it holds no change of any table)."""
        rows = self.conn.execute(f"SELECT 1 FROM pg_logical_slot_peek_changes(%s, NULL, 1, {_WAL2JSON})",
                                 (self.slot, self.source)).fetchall()
        return not rows


def _columnar(changes: list[dict], meta, current: Callable[[list[tuple]], dict[tuple, dict]]
              ) -> list[tuple[str, Any]]:
    """wal2json changes as record tables (the table's columns, :data:`bitlake.cdc.OP`, ``_lsn`` at the change's
    commit LSN), split at TRUNCATEs (``("truncate", commit LSN)``). Values are gathered column by column and
    converted by Arrow in bulk: a change costs a few dictionary lookups, not a Python conversion per value.
    An update leaves out the TOASTed values it did not change: they are taken from the key's latest change in
    this step, or else from the table's current row (``current``: key tuples to rows).

    Each change takes its transaction's commit LSN: a row's changes commit in the order they were made (the
    row stays locked), and a transaction in progress while the snapshot was taken commits after its
    consistent point though it wrote its changes before it."""
    names = [c for c in meta.column_names if c != LSN_COLUMN]
    pk = list(meta.primary_key)
    out: list[tuple[str, Any]] = []
    columns: dict[str, list] = {n: [] for n in names}
    ops: list[str] = []
    lsns: list[int] = []
    latest: dict[tuple, dict] = {}  # the values of each key's latest change in this step (JSON values)
    unchanged: list[tuple[int, list[str], tuple]] = []  # (row, columns left out, key): from the table's row

    def flush() -> None:
        if ops:
            arrays = [_array(columns[n], meta.schema.field(n).type) for n in names]
            if unchanged:
                arrays = _with_unchanged(arrays, names, meta, unchanged, current)
            out.append(("records", pa.Table.from_arrays(
                [*arrays, pa.array(lsns, pa.int64()), pa.array(ops, pa.string())],
                names=[*names, LSN_COLUMN, cdc.OP])))
            for n in names:
                columns[n] = []
            ops.clear()
            lsns.clear()
            unchanged.clear()

    for c in changes:
        action = c["action"]
        if action == "T":
            flush()
            latest.clear()
            out.append(("truncate", c["_commit"]))
            continue
        values = {v["name"]: v["value"] for v in (c["columns"] if action in "IU" else c["identity"])}
        key = tuple(values.get(k) for k in pk)
        if action == "U":
            before = key
            if "identity" in c:
                old = {v["name"]: v["value"] for v in c["identity"]}
                before = tuple(old.get(k) for k in pk)
                if before != key:  # an update of the key: wal2json names the old key; the old key is deleted
                    for n in names:
                        columns[n].append(old.get(n) if n in pk else None)
                    ops.append("delete")
                    lsns.append(c["_commit"])
            left_out = [n for n in names if n not in values]
            if left_out:
                if before in latest:
                    values = {**{n: latest[before].get(n) for n in left_out}, **values}
                else:
                    unchanged.append((len(ops), left_out, before))
        if action == "D" or any(n not in values for n in names):
            latest.pop(key, None)  # gone, or its left-out values come from the table's row
        else:
            latest[key] = values
        for n in names:
            columns[n].append(values.get(n))
        ops.append("delete" if action == "D" else "upsert")
        lsns.append(c["_commit"])
    flush()
    return out


def _with_unchanged(arrays: list[pa.Array], names: list[str], meta, unchanged: list, current) -> list[pa.Array]:
    """``arrays`` with the values updates left out (unchanged TOASTed ones) taken from the table's rows."""
    pk = list(meta.primary_key)
    typed = {raw: tuple(_array([v], meta.schema.field(k).type)[0].as_py() for k, v in zip(pk, raw, strict=True))
             for _, _, raw in unchanged}
    rows = current(sorted(set(typed.values()), key=repr))
    patched: dict[str, dict[int, Any]] = {}
    for row, left_out, raw in unchanged:
        stored = rows.get(typed[raw])
        for n in left_out:
            patched.setdefault(n, {})[row] = None if stored is None else stored.get(n)
    out = []
    for n, array in zip(names, arrays, strict=True):
        if n in patched:
            values = array.to_pylist()
            for row, value in patched[n].items():
                values[row] = value
            array = pa.array(values, array.type)
        out.append(array)
    return out


def _array(values: list, t: pa.DataType) -> pa.Array:
    """wal2json's JSON values of one column (numbers parsed as Decimal) as an Arrow array of type ``t``."""
    if pa.types.is_floating(t):
        return pa.array([None if v is None else float(v) for v in values], t)
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        return pa.array(values, pa.string()).cast(t)  # ISO text, with an offset for timestamptz
    if pa.types.is_binary(t):
        return pa.array([_bytea(v) for v in values], t)
    if pa.types.is_string(t):  # json/jsonb (parsed by the JSON reader), unconstrained numeric (a Decimal)
        return pa.array([v if v is None or isinstance(v, str) else
                         json.dumps(v, default=str) if isinstance(v, (dict, list)) else
                         format(v, "f") if isinstance(v, decimal.Decimal) else str(v) for v in values], t)
    return pa.array(values, t)


def _csv_native(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_string(t) or pa.types.is_date(t)
            or pa.types.is_decimal(t) or pa.types.is_timestamp(t))


def _from_text(column: pa.Array, t: pa.DataType) -> pa.Array:
    values = column.to_pylist()
    if pa.types.is_boolean(t):
        return pa.array([None if v is None else v == "t" for v in values], t)
    if pa.types.is_binary(t):
        return pa.array([_bytea(v) for v in values], t)
    return pa.array(values, t)


def _bytea(text: str | None) -> bytes | None:
    """A bytea value's hex text (``\\x0a0b`` from COPY, bare ``0a0b`` from wal2json) as bytes."""
    return None if text is None else bytes.fromhex(text.removeprefix("\\x"))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _quote_table(source: str) -> str:
    schema, _, table = source.partition(".")
    return f"{_quote(schema)}.{_quote(table)}"
