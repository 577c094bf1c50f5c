"""What a commit says: the typed actions of one commit file (docs/FORMAT.md, "Commits").

A commit is the unit of change. Each one may carry any of: a new protocol, new table metadata, batch
records (a batch landed, or a batch's status changing), data files added and removed, new segment
states, segment-log files, key-store files added and removed, counts and Data Change Events. Replaying
the commits in version order gives a version's state (:mod:`bitlake.format.state`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Self

from bitlake.format.frozen import FrozenDict
from bitlake.format.protocol import Protocol

CREATE = "CREATE"
LAND = "LAND"  # a batch landed, pending MetaGen; the view does not change
INGEST = "INGEST"  # a batch landed and made visible in one commit
METAGEN = "METAGEN"  # pending batches made visible
SET_METADATA = "SET_METADATA"  # properties changed or columns added
UPGRADE = "UPGRADE"  # a format v1 table upgraded to v2
COMPACT = "COMPACT"  # data files rewritten, every row kept with its row id; no view changes
TOMBSTONE = "TOMBSTONE"  # rows committed before it hidden by the value of a column
REVERT = "REVERT"  # a batch reverted: every view from here on as if it had never been ingested
REPLACE = "REPLACE"  # a batch reverted and new records ingested under its id, atomically
DELETE = "DELETE"  # rows matching a condition deleted (a keyed table: an ingest of delete records)
UPDATE = "UPDATE"  # rows matching a condition updated (a keyed table: an ingest of upserts)
MERGE = "MERGE"  # source rows merged by key (an ingest of the records its clauses make)
VACUUM = "VACUUM"  # tombstoned rows removed from every data file that held them; the tombstones retired
ANALYZE = "ANALYZE"  # column statistics of data files written without them; no view changes

PENDING, LIVE, REVERTED, REPLACED = "pending", "live", "reverted", "replaced"
BATCH_STATUSES = (PENDING, LIVE, REVERTED, REPLACED)


class _AsFields:
    """An entry whose JSON object is its fields, as they are."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> Self:
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class SegmentRows:
    """How many rows of segment ``(part, seq)`` a data file holds (Opal's data-to-segment mapping)."""

    part: int
    seq: int
    rows: int

    @property
    def segment(self) -> tuple[int, int]:
        return (self.part, self.seq)


@dataclasses.dataclass(frozen=True)
class DataFile:
    """A data file: the table's columns and the row-id columns, holding rows of one or more segments.

    ``offsets`` names a bitmap file with the offsets the file holds of each of its segments (a compacted
    file); without it the file holds every data row of its segments that its partition value selects."""

    path: str
    rows: int
    bytes: int
    partition: dict[str, str | None] | None
    segments: tuple[SegmentRows, ...]
    offsets: str | None = None
    stats: dict | None = None  # column statistics (bitlake/format/stats.py); None for files written before them

    def __post_init__(self):
        if self.partition is not None and type(self.partition) is not FrozenDict:  # a snapshot holds it: a value
            object.__setattr__(self, "partition", FrozenDict(self.partition))
        if self.stats is not None and type(self.stats) is not FrozenDict:
            object.__setattr__(self, "stats", FrozenDict({k: FrozenDict(v) for k, v in self.stats.items()}))

    def to_json(self) -> dict:
        d = {"path": self.path, "rows": self.rows, "bytes": self.bytes, "partition": self.partition,
             "segments": [[s.part, s.seq, s.rows] for s in self.segments]}
        if self.offsets is not None:
            d["offsets"] = self.offsets
        if self.stats is not None:
            d["stats"] = {k: dict(v) for k, v in self.stats.items()}
        return d

    @classmethod
    def from_json(cls, d: dict) -> DataFile:
        return cls(d["path"], d["rows"], d["bytes"], d["partition"], tuple(SegmentRows(*s) for s in d["segments"]),
                   d.get("offsets"), d.get("stats"))


@dataclasses.dataclass(frozen=True)
class KeysFile(_AsFields):
    """A keys file of a batch: key, delta value, row id, delete flag and bucket of each record that landed in
    segment ``(part of the batch, seq)``."""

    path: str
    seq: int
    rows: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class BatchRecord:
    """A batch incarnation (``batch_id`` landed under segment part ``part``) and its status.

    The record that lands a batch carries its ``records`` count and ``keys_files``, and the ``digest`` of its
    records when they came as Arrow input (:mod:`bitlake.engine.write.digest`; None for a Spark DataFrame and
    for tables written before digests); a later record of the same ``part`` only changes the status.
    """

    batch_id: str
    part: int
    status: str
    records: int | None = None
    keys_files: tuple[KeysFile, ...] = ()
    digest: str | None = None

    def to_json(self) -> dict:
        d: dict[str, Any] = {"id": self.batch_id, "part": self.part, "status": self.status}
        if self.records is not None:
            d["records"] = self.records
            d["keys_files"] = [f.to_json() for f in self.keys_files]
        if self.digest is not None:
            d["digest"] = self.digest
        return d

    @classmethod
    def from_json(cls, d: dict) -> BatchRecord:
        return cls(d["id"], d["part"], d["status"], d.get("records"),
                   tuple(KeysFile.from_json(f) for f in d.get("keys_files", ())), d.get("digest"))


@dataclasses.dataclass(frozen=True)
class SegmentState:
    """A segment's validity as of a commit: ``offsets`` row ids allocated (upserts and deletes), ``data_rows``
    of them in data files, ``cardinality`` valid now. ``bitmap`` names the bitmap file holding the valid
    offsets; None means they are exactly ``0 .. cardinality - 1`` (every offset, or none). ``delta``, when set
    (only with a ``bitmap``), names the bitmap file holding the offsets whose validity differs from that
    bitmap's: a commit that changes a few offsets of a large bitmap writes them, not the whole bitmap again."""

    part: int
    seq: int
    offsets: int
    data_rows: int
    bitmap: str | None = None
    cardinality: int = 0
    delta: str | None = None

    @property
    def segment(self) -> tuple[int, int]:
        return (self.part, self.seq)

    def with_bitmap(self, path: str | None, cardinality: int) -> SegmentState:
        return dataclasses.replace(self, bitmap=path, delta=None, cardinality=cardinality)

    def with_delta(self, path: str | None, cardinality: int) -> SegmentState:
        assert self.bitmap is not None and path is not None, "a delta is a file, to a bitmap"
        return dataclasses.replace(self, delta=path, cardinality=cardinality)

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        if self.delta is None:  # tables without deltas keep the JSON that readers before them read
            del d["delta"]
        return d

    @classmethod
    def from_json(cls, d: dict) -> SegmentState:
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class LogFile:
    """A segment-log file; ``min_t``/``max_t`` bound its event times, so an event-time read skips files that
    cannot hold an event after its time. ``resets``: the file holds events for rows that already had one (a
    restatement's), so a reader deciding a row's latest event never skips it. ``folded``: a major compaction
    folded events of versions up to the window's start into it: they are not changes of the commit listing it.
    ``versions``: a compaction regrouped events of several commits into it, each with its commit version in a
    ``version`` column; the pair bounds them."""

    path: str
    events: int
    bytes: int
    min_t: int
    max_t: int
    resets: bool = False
    folded: bool = False
    versions: tuple[int, int] | None = None

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        for flag in ("resets", "folded", "versions"):
            if not d[flag]:
                del d[flag]
        if self.versions is not None:
            d["versions"] = list(self.versions)
        return d

    @classmethod
    def from_json(cls, d: dict) -> LogFile:
        versions = d.get("versions")
        return cls(**{**d, "versions": tuple(versions) if versions else None})

    def version_range(self, listed: int) -> tuple[int, int]:
        """The commit versions of its events, for a file listed at version ``listed``: a regrouped file's own
        range; a folded file's events are older than any commit's (-1)."""
        if self.versions is not None:
            return self.versions
        return (-1, -1) if self.folded else (listed, listed)


@dataclasses.dataclass(frozen=True)
class BucketFile(_AsFields):
    """A key-store file of one bucket: a base (the bucket's first file, or a merge of all of them) or a delta.
    ``version`` not None: the file is a batch's keys file, every row of which is a key-store row of that
    ``_ks_version`` (a shared file, feature ``keysFileEntries``)."""

    bucket: int
    path: str
    rows: int
    bytes: int
    base: bool
    version: int | None = None

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        if self.version is None:
            del d["version"]
        return d


@dataclasses.dataclass(frozen=True)
class Tombstone(_AsFields):
    """Rows committed before this commit whose ``column`` holds one of the values in the one-column Parquet
    file ``path`` are hidden from every view at this version and later."""

    column: str
    path: str
    count: int


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """A vacuum's rewrite of data file ``path`` (of the latest version or an older one): every version reads
    ``to`` in its place (None: nothing of it is left)."""

    path: str
    to: DataFile | None

    def to_json(self) -> dict:
        return {"path": self.path, "to": self.to.to_json() if self.to else None}

    @classmethod
    def from_json(cls, d: dict) -> Rewrite:
        return cls(d["path"], DataFile.from_json(d["to"]) if d.get("to") else None)


@dataclasses.dataclass(frozen=True)
class FileStats:
    """The column statistics (docs/FORMAT.md, "File statistics") of data file ``path``, which an earlier commit
    added without them."""

    path: str
    stats: dict

    def to_json(self) -> dict:
        return {"path": self.path, "stats": self.stats}

    @classmethod
    def from_json(cls, d: dict) -> FileStats:
        return cls(d["path"], d["stats"])


@dataclasses.dataclass(frozen=True)
class ChangeFile(_AsFields):
    """The change rows of a restatement commit: a Parquet file of ``rows`` row ids, each with its change type
    and its place among them (docs/FORMAT.md, "Change feed")."""

    path: str
    rows: int


@dataclasses.dataclass(frozen=True)
class PurgedFile(_AsFields):
    """The records of the rows a vacuum purged: a keys file (key columns, delta value, row id, delete flag false,
    bucket) of ``rows`` records of earlier batches, without their values, which a later revert or replace folds
    again (docs/FORMAT.md, "Vacuum")."""

    path: str
    rows: int


@dataclasses.dataclass(frozen=True)
class PriorFile(_AsFields):
    """What the records of a MetaGen commit found in the key store, ``rows`` of them (:mod:`bitlake.format.prior`;
    docs/FORMAT.md, "Prior entries"). A revert of a batch that commit made live starts from them, not from a search
    of the key store of the version before it."""

    path: str
    rows: int


@dataclasses.dataclass(frozen=True)
class Window:
    """The retention window a major compaction set: every version from ``version`` on, and every event time
    from ``watermark`` on (the largest delta value committed by that version). Reads outside it are refused."""

    version: int
    watermark: int | None  # None: an unkeyed table (no event time)
    # The delta column's type, which a snapshot sets so that messages can write the watermark as a time; not stored.
    delta_type: Any = dataclasses.field(default=None, compare=False, repr=False)

    def to_json(self) -> dict:
        return {"version": self.version, "watermark": self.watermark}

    @classmethod
    def from_json(cls, d: dict) -> Window:
        return cls(d["version"], d.get("watermark"))


@dataclasses.dataclass(frozen=True)
class Commit:
    version: int
    operation: str
    timestamp_ms: int
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    protocol: Protocol | None = None
    metadata: dict[str, Any] | None = None  # TableMetadata.to_json()
    batches: tuple[BatchRecord, ...] = ()
    add_files: tuple[DataFile, ...] = ()
    remove_files: tuple[str, ...] = ()
    segments: tuple[SegmentState, ...] = ()
    logs: tuple[LogFile, ...] = ()
    remove_logs: tuple[str, ...] = ()
    window: Window | None = None
    keystore_add: tuple[BucketFile, ...] = ()
    keystore_remove: tuple[str, ...] = ()
    prior_entries: tuple[PriorFile, ...] = ()  # a MetaGen's: its keys' entries before it
    tombstones: tuple[Tombstone, ...] = ()
    change_files: tuple[ChangeFile, ...] = ()  # a restatement's change rows
    rewrites: tuple[Rewrite, ...] = ()  # a vacuum's
    remove_tombstones: tuple[str, ...] = ()  # paths of the tombstones a vacuum retired
    purged: tuple[PurgedFile, ...] = ()  # a vacuum's purged records
    file_stats: tuple[FileStats, ...] = ()  # statistics of files already in the table
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    batch_counts: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    events: tuple[dict, ...] = ()  # Data Change Events (bitlake.changeevent)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)  # who wrote it, how long it took (for people)

    @property
    def made_live(self) -> tuple[str, ...]:
        """The batch ids this commit made visible, in the order they were applied."""
        return tuple(b.batch_id for b in self.batches if b.status == LIVE)

    @property
    def landed(self) -> tuple[BatchRecord, ...]:
        return tuple(b for b in self.batches if b.records is not None)

    def to_json(self) -> dict:
        d: dict[str, Any] = {
            "format_version": 2,
            "version": self.version,
            "operation": self.operation,
            "timestamp_ms": self.timestamp_ms,
        }
        optional = {
            "parameters": self.parameters,
            "protocol": self.protocol.to_json() if self.protocol else None,
            "metadata": self.metadata,
            "batches": [b.to_json() for b in self.batches],
            "add_files": [f.to_json() for f in self.add_files],
            "remove_files": list(self.remove_files),
            "segments": [s.to_json() for s in self.segments],
            "logs": [f.to_json() for f in self.logs],
            "remove_logs": list(self.remove_logs),
            "window": self.window.to_json() if self.window else None,
            "keystore_add": [f.to_json() for f in self.keystore_add],
            "keystore_remove": list(self.keystore_remove),
            "prior_entries": [f.to_json() for f in self.prior_entries],
            "tombstones": [t.to_json() for t in self.tombstones],
            "change_files": [f.to_json() for f in self.change_files],
            "rewrites": [r.to_json() for r in self.rewrites],
            "remove_tombstones": list(self.remove_tombstones),
            "purged": [f.to_json() for f in self.purged],
            "file_stats": [f.to_json() for f in self.file_stats],
            "counts": self.counts,
            "batch_counts": self.batch_counts,
            "events": list(self.events),
            "info": self.info,
        }
        d.update({k: v for k, v in optional.items() if v})
        return d

    @classmethod
    def from_json(cls, d: dict) -> Commit:
        return cls(
            version=d["version"],
            operation=d["operation"],
            timestamp_ms=d["timestamp_ms"],
            parameters=dict(d.get("parameters", {})),
            protocol=Protocol.from_json(d["protocol"]) if d.get("protocol") else None,
            metadata=d.get("metadata"),
            batches=tuple(BatchRecord.from_json(b) for b in d.get("batches", ())),
            add_files=tuple(DataFile.from_json(f) for f in d.get("add_files", ())),
            remove_files=tuple(d.get("remove_files", ())),
            segments=tuple(SegmentState.from_json(s) for s in d.get("segments", ())),
            logs=tuple(LogFile.from_json(f) for f in d.get("logs", ())),
            remove_logs=tuple(d.get("remove_logs", ())),
            window=Window.from_json(d["window"]) if d.get("window") else None,
            keystore_add=tuple(BucketFile.from_json(f) for f in d.get("keystore_add", ())),
            keystore_remove=tuple(d.get("keystore_remove", ())),
            prior_entries=tuple(PriorFile.from_json(f) for f in d.get("prior_entries", ())),
            tombstones=tuple(Tombstone.from_json(t) for t in d.get("tombstones", ())),
            change_files=tuple(ChangeFile.from_json(f) for f in d.get("change_files", ())),
            rewrites=tuple(Rewrite.from_json(r) for r in d.get("rewrites", ())),
            remove_tombstones=tuple(d.get("remove_tombstones", ())),
            purged=tuple(PurgedFile.from_json(f) for f in d.get("purged", ())),
            file_stats=tuple(FileStats.from_json(f) for f in d.get("file_stats", ())),
            counts=dict(d.get("counts", {})),
            batch_counts=dict(d.get("batch_counts", {})),
            events=tuple(d.get("events", ())),
            info=dict(d.get("info", {})),
        )
