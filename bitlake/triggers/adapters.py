"""Producers for tables bitlake does not write: Hive-style folders, Iceberg tables, Delta tables.

Each adapter looks at its table, finds the changes it has not emitted yet, registers one event per
partition they touched with a :class:`TriggerStore` or a :class:`Client`, and then records what it
emitted in its **state file** (JSON, replaced atomically). The events are a function of the table alone
(never of when the adapter looked), so a run that crashed after registering and before saving its state
registers the same events again on the next run, which the service treats as a retry: every change is
emitted exactly once. ``bitlake events watch {hive,iceberg,delta} LOCATION`` runs one in a loop.

- :class:`HiveFolderAdapter`: a partition folder ``k1=v1/k2=v2/`` with a ``_SUCCESS`` marker is a landing;
  one APPEND event per landing, ``snapshot_id`` the marker's modification time in nanoseconds (a partition
  landed again, with a new marker, is a new event), tags ``location``, ``partition_path`` and ``format``.
- :class:`IcebergAdapter`: one event per partition a snapshot added or deleted files in, ``snapshot_id``
  the Iceberg snapshot id, ``prev_snapshot_id`` its nearest ancestor that changed data (REPLACE snapshots,
  compactions, change no row and get no event), operation APPEND, DELETE (Iceberg ``delete``) or UPDATE
  (``overwrite``).
- :class:`DeltaAdapter`: one event per partition a version added or removed files in (``dataChange``),
  ``snapshot_id`` the version, ``prev_snapshot_id`` the previous version that changed data (OPTIMIZE and
  metadata-only versions get no event), operation APPEND (adds only), DELETE (removes only) or UPDATE.

Every event carries a ``location`` tag, the table's URI, so :func:`bitlake.triggers.read_changes` finds
the table whatever name the events use (default: that URI; for Iceberg tables from a catalog, the
table's identifier).
"""

from __future__ import annotations

import abc
import datetime as dt
import json
import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from pydantic import ValidationError

from bitlake.triggers.client import Client
from bitlake.triggers.errors import AdapterError, IncrementalReadError
from bitlake.triggers.event import EventIn, OperationType, TableFormat
from bitlake.triggers.incremental import load_iceberg_table, local_path, require
from bitlake.triggers.models import Registration

if TYPE_CHECKING:
    from bitlake.triggers.store import TriggerStore

SUCCESS_MARKER = "_SUCCESS"
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def _uri(location: str) -> str:
    return "file://" + os.path.abspath(local_path(location))


def _utc_ms(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


class Adapter(abc.ABC):
    """Finds a table's changes not emitted yet and registers their events, remembering them in a state file.

    Args:
        location: the table's folder (a local path or ``file://`` URI).
        state_path: the JSON file where the adapter keeps what it emitted; one per table and target.
        table: the table's name in the events (default: its location URI).
    """

    table_format: TableFormat

    def __init__(self, location: str, *, state_path: str | os.PathLike, table: str | None = None):
        self.location = _uri(location)
        self.state_path = os.fspath(state_path)
        self.table = table or self.location
        self.state = self._load_state()

    def _load_state(self) -> dict[str, Any]:
        try:
            with open(self.state_path) as f:
                state = json.load(f)
        except FileNotFoundError:
            return {"format": self.table_format.value, "location": self.location, "table": self.table}
        except (OSError, ValueError) as e:
            raise AdapterError(f"cannot read the adapter state {self.state_path}: {e}") from None
        if not isinstance(state, dict) or (state.get("format"), state.get("location"), state.get("table")) != (
                self.table_format.value, self.location, self.table):
            raise AdapterError(
                f"the adapter state {self.state_path} belongs to {state.get('format')} table {state.get('table')!r} "
                f"at {state.get('location')}, not to {self.table_format.value} table {self.table!r} at "
                f"{self.location}: give each watched table its own state file")
        return state

    def _save_state(self) -> None:
        folder = os.path.dirname(os.path.abspath(self.state_path))
        os.makedirs(folder, exist_ok=True)
        tmp = os.path.join(folder, f".tmp-{uuid.uuid4().hex}")
        with open(tmp, "w") as f:
            json.dump(self.state, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)

    @abc.abstractmethod
    def _changes(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The events of the changes not emitted yet, in order, and the state once they are registered."""

    def pending(self) -> list[EventIn]:
        """The events this adapter would register now (nothing is registered or remembered)."""
        return self._validated(self._changes()[0])

    def _validated(self, events: list[dict[str, Any]]) -> list[EventIn]:
        try:
            return [EventIn.model_validate(e) for e in events]
        except ValidationError as e:
            first = e.errors()[0]
            raise AdapterError(f"{self.table!r} has a change that makes no valid event: "
                               f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None

    def emit(self, target: TriggerStore | Client) -> list[Registration]:
        """Registers the pending events with ``target``, then remembers them; returns the registrations."""
        raw, state = self._changes()
        events = self._validated(raw)
        registered = target.register(events) if events else []
        if state != self.state:
            self.state = state
            self._save_state()
        return registered


# ------------------------------------------------------------------------------------------------- Hive


class HiveFolderAdapter(Adapter):
    """Landings of Hive-style partition folders (``k=v/...`` with a ``_SUCCESS`` marker) under ``location``.

    Args:
        file_format: the data files' format, for readers (the ``format`` tag; Spark's name: parquet, orc...).
    """

    table_format = TableFormat.HIVE

    def __init__(self, location: str, *, state_path: str | os.PathLike, table: str | None = None,
                 file_format: str = "parquet"):
        self.file_format = file_format
        super().__init__(location, state_path=state_path, table=table)
        if not os.path.isdir(local_path(self.location)):
            raise AdapterError(f"no such folder: {local_path(self.location)}")

    def landings(self) -> Iterator[tuple[str, list[str | None], os.stat_result]]:
        """Every partition folder with a marker: (relative path, partition values, the marker's stat)."""
        root = local_path(self.location)
        for folder, dirs, files in os.walk(root):
            # Names starting with _ or . are not data (Hive's and Spark's convention): staging, logs, state.
            dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")) and "=" in d)
            if folder == root or SUCCESS_MARKER not in files:
                continue
            rel = os.path.relpath(folder, root).replace(os.sep, "/")
            values = []
            for segment in rel.split("/"):
                key, _, value = segment.partition("=")
                value = unquote(value)  # Hive escapes special characters as %XX
                values.append(None if value == HIVE_NULL else value)
            yield rel, values, os.stat(os.path.join(folder, SUCCESS_MARKER))

    def _changes(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        emitted: dict[str, str] = dict(self.state.get("emitted", {}))
        new = []
        for rel, values, marker in self.landings():
            snapshot = str(marker.st_mtime_ns)
            if emitted.get(rel) != snapshot:
                new.append((marker.st_mtime_ns, rel, values, snapshot))
        events = []
        for mtime_ns, rel, values, snapshot in sorted(new):
            events.append({
                "table": self.table, "partition": values, "snapshot_id": snapshot,
                "snapshot_ts": dt.datetime.fromtimestamp(mtime_ns / 1e9, dt.UTC), "prev_snapshot_id": None,
                "table_format": "HIVE", "operation_type": "APPEND",
                "tags": {"location": self.location, "partition_path": rel, "format": self.file_format},
            })
            emitted[rel] = snapshot
        return events, {**self.state, "emitted": emitted}


# ---------------------------------------------------------------------------------------------- Iceberg


def _partition_values(spec, schema, record) -> list[str | None] | None:
    if spec.is_unpartitioned():
        return None
    types = spec.partition_type(schema).fields
    return [None if record[i] is None else f.transform.to_human_string(types[i].field_type, value=record[i])
            for i, f in enumerate(spec.fields)]


class IcebergAdapter(Adapter):
    """New snapshots of an Iceberg table.

    Args:
        table: a pyiceberg ``Table`` loaded from a catalog (refreshed on every run; the events are named by
            its identifier), or the table's folder or a metadata JSON file (read without a catalog from its
            newest metadata file; the events are named by its location).
        name: the table's name in the events instead.
    """

    table_format = TableFormat.ICEBERG

    def __init__(self, table: Any, *, state_path: str | os.PathLike, name: str | None = None):
        if isinstance(table, str | os.PathLike):
            self._table = None
            path = local_path(os.fspath(table))
            if path.endswith(".metadata.json"):
                path = os.path.dirname(os.path.dirname(path))
            location = path
        else:
            self._table = table
            location = table.location()
            name = name or ".".join(table.name())
        super().__init__(location, state_path=state_path, table=name)

    def load(self):
        if self._table is None:
            try:
                return load_iceberg_table(self.location)
            except IncrementalReadError as e:
                raise AdapterError(str(e)) from None
        self._table = self._table.refresh()
        return self._table

    def _changes(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        require("pyiceberg", AdapterError)
        from pyiceberg.manifest import ManifestEntryStatus
        from pyiceberg.table.snapshots import Operation

        table = self.load()
        ancestry = []
        snapshot = table.current_snapshot()
        while snapshot is not None:
            ancestry.append(snapshot)
            snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
        emitted = set(self.state.get("emitted", []))
        schema, specs = table.schema(), table.specs()
        kinds: dict[Any, str] = {Operation.APPEND: "APPEND", Operation.DELETE: "DELETE", Operation.OVERWRITE: "UPDATE"}
        events = []
        prev = None
        for s in reversed(ancestry):
            operation = s.summary.operation if s.summary is not None else None
            if operation == Operation.REPLACE:
                continue
            sid = str(s.snapshot_id)
            if sid not in emitted:
                partitions: dict[str, list[str | None] | None] = {}
                for manifest in s.manifests(table.io):
                    if manifest.added_snapshot_id != s.snapshot_id:
                        continue
                    spec = specs[manifest.partition_spec_id]
                    for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                        if entry.status in (ManifestEntryStatus.ADDED, ManifestEntryStatus.DELETED):
                            values = _partition_values(spec, schema, entry.data_file.partition)
                            partitions.setdefault(json.dumps(values), values)
                for values in sorted(partitions.values(), key=lambda p: json.dumps(p)) or [None]:
                    events.append({
                        "table": self.table, "partition": values, "snapshot_id": sid,
                        "snapshot_ts": _utc_ms(s.timestamp_ms), "prev_snapshot_id": prev,
                        "table_format": "ICEBERG", "operation_type": kinds.get(operation, "UPDATE"),
                        "tags": {"location": self.location},
                    })
                emitted.add(sid)
            prev = sid
        return events, {**self.state, "emitted": sorted(emitted, key=int)}


# ------------------------------------------------------------------------------------------------ Delta


class DeltaAdapter(Adapter):
    """New versions of a Delta table, read from its commit files ``_delta_log/<version>.json``."""

    table_format = TableFormat.DELTA

    def _changes(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        require("deltalake", AdapterError)
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            table = DeltaTable(self.location)
        except TableNotFoundError:
            raise AdapterError(f"no Delta table at {self.location}") from None
        latest = table.version()
        columns = list(table.metadata().partition_columns)
        log = os.path.join(local_path(self.location), "_delta_log")
        done = self.state.get("version", -1)
        prev = self.state.get("prev")
        events = []
        for version in range(done + 1, latest + 1):
            path = os.path.join(log, f"{version:020d}.json")
            if not os.path.exists(path):
                # Log retention removed it (its data is in a checkpoint): nothing left to tell about it.
                continue
            adds, removes, stamp = 0, 0, None
            partitions: dict[str, list[str | None] | None] = {}
            with open(path) as f:
                for line in f:
                    if not line.strip():
                        continue
                    action = json.loads(line)
                    if "commitInfo" in action:
                        stamp = action["commitInfo"].get("timestamp")
                    for kind in ("add", "remove"):
                        item = action.get(kind)
                        if item is None or not item.get("dataChange", True):
                            continue
                        adds += kind == "add"
                        removes += kind == "remove"
                        pv = item.get("partitionValues") or {}
                        values = [pv.get(c) for c in columns] if columns else None
                        partitions.setdefault(json.dumps(values), values)
            if not adds and not removes:
                continue  # OPTIMIZE, a metadata change: no row changed
            op = OperationType.APPEND if not removes else OperationType.DELETE if not adds else OperationType.UPDATE
            if stamp is None:
                stamp = int(os.path.getmtime(path) * 1000)
            for values in sorted(partitions.values(), key=lambda p: json.dumps(p)):
                events.append({
                    "table": self.table, "partition": values, "snapshot_id": str(version),
                    "snapshot_ts": _utc_ms(stamp), "prev_snapshot_id": prev, "table_format": "DELTA",
                    "operation_type": op.value, "tags": {"location": self.location},
                })
            prev = str(version)
        return events, {**self.state, "version": latest, "prev": prev}


ADAPTERS: dict[str, type[Adapter]] = {"hive": HiveFolderAdapter, "iceberg": IcebergAdapter, "delta": DeltaAdapter}
