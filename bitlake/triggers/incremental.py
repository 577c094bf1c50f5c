"""Incremental reads: the range of snapshots a batch of events names, and the rows changed in it.

A snapshot trigger hands a consumer the events registered since its last acknowledged run.
:func:`snapshot_range` chains them by ``prev_snapshot_id`` into one range ``(start, end]`` of the table's
snapshots (start exclusive: the snapshot before the first event's; end inclusive) and refuses events that
do not form one unbroken chain: a missing event would mean rows silently skipped. :func:`read_changes`
reads exactly that range with Spark, in each table format's own terms:

- **BITLAKE**: the change feed, ``Table.changes(starting_version=start + 1, ending_version=end)``: inserts, update
  pre- and postimages and deletes, with ``_change_type``, ``_commit_version``, ``_commit_timestamp``.
- **DELTA**: Delta's change data feed over versions ``start + 1 .. end`` (deltalake's ``load_cdf``; the
  table needs ``delta.enableChangeDataFeed=true``), with the same three columns.
- **ICEBERG**: the data files the APPEND snapshots of the range added, read by Spark, with
  ``_change_type`` (always ``insert``), ``_commit_snapshot_id`` and ``_commit_timestamp``. Iceberg's
  incremental read returns appends only, so a range holding an OVERWRITE or DELETE snapshot is refused
  (:class:`IncrementalReadError`) rather than read without its deletes; REPLACE snapshots (compaction)
  change no rows and are skipped.
- **HIVE**: the partition folders the events name (their ``partition_path`` tag), read with the table's
  folder as Spark's ``basePath`` so the partition columns are there too.

Where the table is: the ``location=`` argument, else the events' ``location`` tag (the adapters and the
bitlake publisher set it), else the event's ``table`` itself when it is a URI or an absolute path. An
Iceberg table is loaded from ``catalog=`` (a pyiceberg catalog, by the event's table identifier) when
given, else from the newest metadata file under its location.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlparse

import bitlake
from bitlake.triggers.errors import BrokenChainError, IncrementalReadError
from bitlake.triggers.event import Event, EventIn, TableFormat, decode_events

Events = str | bytes | Iterable[Event | EventIn | Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class SnapshotRange:
    """The snapshots ``(start_snapshot_id, end_snapshot_id]`` of one table that a batch of events covers.

    ``start_snapshot_id`` is None when the range starts at the table's beginning; both ends are None for
    HIVE, whose landings are not a chain (read the ``partitions`` instead). ``snapshot_ids`` lists the
    snapshots of the events in chain order, ``partitions`` the distinct partitions they touched (None for
    an unpartitioned table) in order of first appearance.
    """

    table: str
    table_format: TableFormat
    start_snapshot_id: str | None
    end_snapshot_id: str | None
    snapshot_ids: tuple[str, ...] = ()
    partitions: tuple[tuple[str | None, ...] | None, ...] = ()
    events: tuple[Event | EventIn, ...] = dataclasses.field(default=(), repr=False, compare=False)

    def tag(self, name: str) -> str | None:
        """The tag's value on the last event that has it (adapters put the same value on every event)."""
        for e in reversed(self.events):
            if name in e.tags:
                return e.tags[name]
        return None


def as_events(events: Events) -> list[Event | EventIn]:
    """Events as models: a JSON array (:func:`encode_events`), or an iterable of events or their dicts."""
    if isinstance(events, str | bytes):
        return list(decode_events(events))
    out: list[Event | EventIn] = []
    for e in events:
        if isinstance(e, Event | EventIn):
            out.append(e)
        elif isinstance(e, Mapping):
            # A registered event (from the service, or an XCom) has an event_id; a producer's has not.
            out.append(Event.model_validate(e) if "event_id" in e else EventIn.model_validate(e))
        else:
            raise TypeError(f"an event is an Event, an EventIn or a mapping, not a {type(e).__name__}")
    return out


def snapshot_range(events: Events) -> SnapshotRange:
    """The range of snapshots the events cover, chained by ``prev_snapshot_id``.

    The events may come in any order and a snapshot may have several (one per partition it touched);
    each snapshot counts once. They must all be of one table and format and form one chain: every
    snapshot but the first follows another of the events, and no two follow the same one.

    Raises:
        IncrementalReadError: no events, or events of several tables or formats.
        BrokenChainError: the events do not form one unbroken chain (an event is missing, for example one
            a tag filter left out, or two events disagree about a snapshot's predecessor).

    >>> e = lambda s, p: {"table": "db.t", "snapshot_id": s, "prev_snapshot_id": p, "table_format": "BITLAKE",
    ...                   "operation_type": "APPEND"}
    >>> r = snapshot_range([e("4", "3"), e("3", "1")])
    >>> (r.start_snapshot_id, r.end_snapshot_id, r.snapshot_ids)
    ('1', '4', ('3', '4'))
    """
    items = as_events(events)
    if not items:
        raise IncrementalReadError("no events: there is no range to read")
    tables = sorted({(e.table, e.table_format.value) for e in items})
    if len(tables) > 1:
        raise IncrementalReadError(
            f"the events are of several tables or formats ({', '.join(f'{t} ({f})' for t, f in tables)}); "
            "a range is of one table: evaluate one trigger per table")
    table, table_format = items[0].table, items[0].table_format
    partitions = tuple(dict.fromkeys(None if e.partition is None else tuple(e.partition) for e in items))
    if table_format == TableFormat.HIVE:
        ids = tuple(dict.fromkeys(e.snapshot_id for e in items if e.snapshot_id is not None))
        return SnapshotRange(table, table_format, None, None, ids, partitions, tuple(items))

    prev_of: dict[str, str | None] = {}
    for e in items:
        if e.snapshot_id is None:
            raise BrokenChainError(f"an event of {table_format.value} table {table!r} has no snapshot_id")
        if e.snapshot_id in prev_of and prev_of[e.snapshot_id] != e.prev_snapshot_id:
            raise BrokenChainError(
                f"events of snapshot {e.snapshot_id} of {table!r} disagree about its previous snapshot "
                f"({prev_of[e.snapshot_id]!r} and {e.prev_snapshot_id!r})")
        prev_of[e.snapshot_id] = e.prev_snapshot_id
    follower: dict[str | None, str] = {}
    for snapshot, prev in prev_of.items():
        if prev in follower:
            raise BrokenChainError(
                f"snapshots {follower[prev]} and {snapshot} of {table!r} both follow {prev!r}: the events fork")
        follower[prev] = snapshot
    firsts = [s for s, prev in prev_of.items() if prev not in prev_of]
    if len(firsts) != 1:
        gaps = ", ".join(f"{s} follows {prev_of[s]}" for s in firsts)
        raise BrokenChainError(
            f"the events of {table!r} do not form one chain of snapshots ({gaps}, and those are not among the "
            "events): events in between are missing, for example left out by a tag filter or a trigger's "
            "limit; read each chain on its own or evaluate the trigger without the filter"
            if firsts else f"the events of {table!r} form a cycle of snapshots")
    chain = [firsts[0]]
    while chain[-1] in follower:
        chain.append(follower[chain[-1]])
    if len(chain) != len(prev_of):
        raise BrokenChainError(f"the events of {table!r} hold a cycle of snapshots besides the chain {chain}")
    return SnapshotRange(table, table_format, prev_of[chain[0]], chain[-1], tuple(chain), partitions, tuple(items))


def read_changes(spark, events: Events, *, location: str | None = None, catalog: Any = None):
    """The rows changed in the range of ``events`` (see :func:`snapshot_range`) as a Spark DataFrame.

    Args:
        spark: the SparkSession.
        events: the events of one table, e.g. a fired snapshot trigger's, or their JSON encoding.
        location: where the table is, when neither the events' ``location`` tag nor their table name says.
        catalog: a pyiceberg catalog to load an Iceberg table from by the events' table identifier.

    Raises:
        BrokenChainError: the events do not chain into one range.
        IncrementalReadError: the format cannot return that range (an Iceberg range with deletes, a Delta
            table without change data feed) or the table cannot be found.
    """
    rng = snapshot_range(events)
    reader = {TableFormat.BITLAKE: _read_bitlake, TableFormat.DELTA: _read_delta,
              TableFormat.ICEBERG: _read_iceberg, TableFormat.HIVE: _read_hive}[rng.table_format]
    return reader(spark, rng, location=location, catalog=catalog)


# ----------------------------------------------------------------------------------------------- formats


def require(module: str, error: type[Exception] = IncrementalReadError) -> None:
    """Delta and Iceberg support is the optional extra ``formats``: say so instead of an ImportError."""
    if importlib.util.find_spec(module) is None:
        raise error(f"this needs the {module} package: pip install 'bitlake[formats]'")


def _location(rng: SnapshotRange, location: str | None) -> str:
    found = location or rng.tag("location")
    if found:
        return found
    if "://" in rng.table or os.path.isabs(rng.table):
        return rng.table
    raise IncrementalReadError(
        f"cannot tell where table {rng.table!r} is: pass location=, or register its events with a 'location' tag")


def local_path(uri: str) -> str:
    """A local path from a path or a ``file://`` URI (the only storage the readers here support)."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return parsed.path if parsed.scheme else uri
    raise IncrementalReadError(f"unsupported storage scheme {parsed.scheme!r} in {uri!r}; supported: local paths, "
                               "file://")


def _int_snapshot(rng: SnapshotRange, snapshot_id: str | None) -> int | None:
    if snapshot_id is None:
        return None
    try:
        return int(snapshot_id)
    except ValueError:
        raise IncrementalReadError(
            f"snapshot id {snapshot_id!r} of {rng.table_format.value} table {rng.table!r} is not a number") from None


def _read_bitlake(spark, rng: SnapshotRange, *, location: str | None, catalog: Any):
    table = bitlake.open_table(_location(rng, location))
    start = _int_snapshot(rng, rng.start_snapshot_id)
    # The feed's range includes its start; the events' range excludes it. No start: from the table's creation (a
    # range the retention window cut is refused rather than read in part).
    return table.changes(spark, starting_version=0 if start is None else start + 1,
                         ending_version=_int_snapshot(rng, rng.end_snapshot_id))


def _read_delta(spark, rng: SnapshotRange, *, location: str | None, catalog: Any):
    require("deltalake")
    import pyarrow as pa
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    where = _location(rng, location)
    try:
        table = DeltaTable(where)
    except TableNotFoundError:
        raise IncrementalReadError(f"no Delta table at {where} (table {rng.table!r})") from None
    if table.metadata().configuration.get("delta.enableChangeDataFeed", "false").lower() != "true":
        raise IncrementalReadError(
            f"Delta table {rng.table!r} has no change data feed: set the table property "
            "delta.enableChangeDataFeed=true (changes made before that cannot be read incrementally)")
    start = _int_snapshot(rng, rng.start_snapshot_id)
    end = _int_snapshot(rng, rng.end_snapshot_id)
    try:
        feed = table.load_cdf(starting_version=0 if start is None else start + 1, ending_version=end)
    except Exception as e:  # deltalake raises plain ValueErrors and its own errors for a missing range
        raise IncrementalReadError(f"cannot read the change data feed of {rng.table!r} over versions "
                                   f"({start}, {end}]: {e}") from e
    changes = pa.RecordBatchReader.from_stream(feed).read_all()
    changes = changes.cast(_plain_schema(changes.schema)).sort_by([("_commit_version", "ascending")])
    return spark.createDataFrame(changes)


def _plain_type(t):
    """Arrow types Spark takes: views become plain strings and binaries, unsigned ints signed, and naive
    timestamps UTC (Delta's commit timestamps are UTC)."""
    import pyarrow as pa

    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_unsigned_integer(t):
        return pa.int64()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=t.tz or "UTC")
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(pa.field(t.value_field.name, _plain_type(t.value_type), t.value_field.nullable))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain_type(f.type), f.nullable) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_plain_type(t.key_type), _plain_type(t.item_type))
    return t


def _plain_schema(schema):
    import pyarrow as pa

    return pa.schema([pa.field(f.name, _plain_type(f.type), f.nullable) for f in schema])


def _read_iceberg(spark, rng: SnapshotRange, *, location: str | None, catalog: Any):
    require("pyiceberg")
    from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus
    from pyiceberg.table.snapshots import Operation
    from pyspark.sql import functions as F

    from bitlake.spark.schema import spark_schema

    table = _iceberg_table(rng, location, catalog)
    start = _int_snapshot(rng, rng.start_snapshot_id)
    end = _int_snapshot(rng, rng.end_snapshot_id)
    snapshot = table.snapshot_by_id(end) if end is not None else None
    if snapshot is None:
        raise IncrementalReadError(f"Iceberg table {rng.table!r} has no snapshot {end} (expired, or another table?)")
    chain = []
    while snapshot is not None and snapshot.snapshot_id != start:
        chain.append(snapshot)
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id else None
    if start is not None and snapshot is None:
        raise BrokenChainError(f"snapshot {start} of Iceberg table {rng.table!r} is not an ancestor of snapshot "
                               f"{end} (expired, or the table was rolled back)")
    schema = table.schema().as_arrow()
    columns = [f.name for f in schema]
    frames = []
    for s in reversed(chain):
        operation = s.summary.operation if s.summary is not None else None
        if operation == Operation.REPLACE:
            continue  # compaction: the same rows in other files
        if operation != Operation.APPEND:
            raise IncrementalReadError(
                f"snapshot {s.snapshot_id} of Iceberg table {rng.table!r} is a {operation.value if operation else '?'}"
                f" (it may delete rows): Iceberg's incremental read returns appended rows only and cannot return "
                f"deletes; read the table at snapshot {end} instead, or read the range without that snapshot")
        files: dict[str, list[str]] = {}
        for manifest in s.manifests(table.io):
            if manifest.content != ManifestContent.DATA or manifest.added_snapshot_id != s.snapshot_id:
                continue
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.status == ManifestEntryStatus.ADDED and entry.data_file.content == DataFileContent.DATA:
                    fmt = entry.data_file.file_format.name.lower()
                    files.setdefault(fmt, []).append(entry.data_file.file_path)
        for fmt, paths in files.items():
            frames.append(
                spark.read.schema(spark_schema(_plain_schema(schema))).format(fmt).load(paths).select(*columns)
                .withColumn("_change_type", F.lit("insert"))
                .withColumn("_commit_snapshot_id", F.lit(s.snapshot_id).cast("long"))
                .withColumn("_commit_timestamp", F.timestamp_millis(F.lit(s.timestamp_ms))))
    if not frames:
        from pyspark.sql.types import LongType, StringType, StructField, TimestampType

        empty = spark_schema(_plain_schema(schema))
        for name, kind in (("_change_type", StringType()), ("_commit_snapshot_id", LongType()),
                           ("_commit_timestamp", TimestampType())):
            empty = empty.add(StructField(name, kind))
        return spark.createDataFrame([], empty)
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


_METADATA_FILE = re.compile(r"^(?:v)?(\d+)(?:-.*)?\.metadata\.json$")


def newest_metadata_file(location: str) -> str:
    """The newest ``metadata/<n>-<uuid>.metadata.json`` (or ``v<n>.metadata.json``) of an Iceberg table's
    folder: the current metadata of a table written without a catalog at hand, e.g. by pyiceberg's
    SqlCatalog or a Hadoop catalog."""
    folder = os.path.join(local_path(location), "metadata")
    try:
        names = os.listdir(folder)
    except (FileNotFoundError, NotADirectoryError):
        raise IncrementalReadError(f"{location} is not an Iceberg table: it has no metadata folder") from None
    numbered = [(int(m[1]), os.path.getmtime(os.path.join(folder, n)), n)
                for n in names if (m := _METADATA_FILE.match(n))]
    if not numbered:
        raise IncrementalReadError(f"{location} is not an Iceberg table: no *.metadata.json under {folder}")
    return os.path.join(folder, max(numbered)[2])


def load_iceberg_table(location: str):
    """A read-only Iceberg table from a metadata JSON file or a table folder (its newest metadata file)."""
    require("pyiceberg")
    from pyiceberg.table import StaticTable

    path = local_path(location)
    metadata = path if path.endswith(".metadata.json") else newest_metadata_file(path)
    return StaticTable.from_metadata(metadata)


def _iceberg_table(rng: SnapshotRange, location: str | None, catalog: Any):
    if catalog is not None and location is None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return catalog.load_table(rng.table)
        except NoSuchTableError:
            raise IncrementalReadError(f"catalog {catalog.name!r} has no table {rng.table!r}") from None
    return load_iceberg_table(_location(rng, location))


def _read_hive(spark, rng: SnapshotRange, *, location: str | None, catalog: Any):
    base = _location(rng, location)
    folders = []
    for e in rng.events:
        path = e.tags.get("partition_path")
        if path is None:
            raise IncrementalReadError(
                f"HIVE event of {rng.table!r} for partition {e.partition} has no 'partition_path' tag naming its "
                "folder (bitlake's Hive adapter sets it)")
        folders.append(f"{base.rstrip('/')}/{path.strip('/')}")
    fmt = rng.tag("format") or "parquet"
    return spark.read.format(fmt).option("basePath", base).load(list(dict.fromkeys(folders)))
