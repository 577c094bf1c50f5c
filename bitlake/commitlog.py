"""The commit log: ``_bitlake/commits/<version:020d>.json``, one immutable file per commit.

A commit is written with the storage's atomic put-if-absent; the writer that creates version ``v``
owns it, and a writer that finds ``v`` taken has lost the race and must rebase (see ``Table._commit``).
Each file is ``{"crc32": <crc of the canonical JSON of body>, "body": {...}}``.
"""

from __future__ import annotations

import dataclasses
import json
import time
import zlib
from typing import Any

from bitlake.errors import CorruptTableError, UnsupportedFormatVersionError
from bitlake.fs import FileIO
from bitlake.keystore import BucketFile
from bitlake.schema import FORMAT_VERSION

COMMITS_DIR = "_bitlake/commits"
CHECKPOINTS_DIR = "_bitlake/checkpoints"

CREATE = "CREATE"
LAND = "LAND"  # data landed, pending MetaGen; the view does not change
INGEST = "INGEST"  # data landed and made visible in one commit
METAGEN = "METAGEN"  # pending batches made visible


def commit_path(version: int) -> str:
    return f"{COMMITS_DIR}/{version:020d}.json"


@dataclasses.dataclass(frozen=True)
class DataFile:
    """A file of landed records. ``kind`` is ``data`` (upserts, read by readers) or ``keys`` (key,
    delta, row id, delete flag and bucket of every record of a keyed table, read only by MetaGen)."""

    path: str
    kind: str
    segment_part: int
    segment_seq: int
    rows: int
    bytes: int
    partition: dict[str, str | None] | None = None

    @property
    def segment(self) -> tuple[int, int]:
        return (self.segment_part, self.segment_seq)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> DataFile:
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class Batch:
    """One ingested batch: its id, its segment part and the files it landed."""

    batch_id: str
    segment_part: int
    files: tuple[DataFile, ...]

    @property
    def records(self) -> int:
        """Records landed: every record of a keyed table is in its keys files, an unkeyed one has data files only."""
        keys = [f.rows for f in self.files if f.kind == "keys"]
        return sum(keys) if keys else sum(f.rows for f in self.files)

    def to_json(self) -> dict:
        return {
            "batch_id": self.batch_id,
            "segment_part": self.segment_part,
            "files": [f.to_json() for f in self.files],
        }

    @classmethod
    def from_json(cls, d: dict) -> Batch:
        return cls(d["batch_id"], d["segment_part"], tuple(DataFile.from_json(f) for f in d["files"]))


@dataclasses.dataclass(frozen=True)
class SegmentState:
    """A segment's current validity: its bitmap file (None: nothing valid) and counts.

    ``offsets`` is how many row ids the segment allocated (data and delete records); ``data_rows`` how
    many of them are in data files; ``cardinality`` how many are valid now.
    """

    part: int
    seq: int
    offsets: int
    data_rows: int
    bitmap: str | None = None
    cardinality: int = 0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> SegmentState:
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class LogFile:
    """A segment-log file; ``min_t``/``max_t`` bound its event times, so an event-time read skips
    files that cannot hold an event after its time."""

    path: str
    events: int
    bytes: int
    min_t: int
    max_t: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> LogFile:
        return cls(**d)


@dataclasses.dataclass(frozen=True)
class Commit:
    version: int
    operation: str
    timestamp_ms: int
    metadata: dict[str, Any] | None = None
    batch_id: str | None = None  # the batch this commit landed, if any
    landed: Batch | None = None
    processed: tuple[str, ...] = ()  # batch ids made visible, in the order they were applied
    segments: tuple[SegmentState, ...] = ()  # new state of every segment the commit touched
    logs: tuple[LogFile, ...] = ()
    keystore_add: tuple[BucketFile, ...] = ()
    keystore_remove: tuple[str, ...] = ()
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    batch_counts: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    events: tuple[dict, ...] = ()  # Data Change Events (see bitlake.changeevent)
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict:
        return {
            "format_version": self.format_version,
            "version": self.version,
            "operation": self.operation,
            "timestamp_ms": self.timestamp_ms,
            "metadata": self.metadata,
            "batch_id": self.batch_id,
            "landed": self.landed.to_json() if self.landed else None,
            "processed": list(self.processed),
            "segments": [s.to_json() for s in self.segments],
            "logs": [f.to_json() for f in self.logs],
            "keystore_add": [f.to_json() for f in self.keystore_add],
            "keystore_remove": list(self.keystore_remove),
            "counts": dict(self.counts),
            "batch_counts": dict(self.batch_counts),
            "events": list(self.events),
        }

    @classmethod
    def from_json(cls, d: dict) -> Commit:
        if d.get("format_version", 0) > FORMAT_VERSION:
            raise UnsupportedFormatVersionError(
                f"commit {d.get('version')} was written with format version {d['format_version']}; "
                f"this bitlake reads up to {FORMAT_VERSION}: upgrade bitlake"
            )
        return cls(
            version=d["version"],
            operation=d["operation"],
            timestamp_ms=d["timestamp_ms"],
            metadata=d["metadata"],
            batch_id=d["batch_id"],
            landed=Batch.from_json(d["landed"]) if d["landed"] else None,
            processed=tuple(d["processed"]),
            segments=tuple(SegmentState.from_json(s) for s in d["segments"]),
            logs=tuple(LogFile.from_json(f) for f in d["logs"]),
            keystore_add=tuple(BucketFile.from_json(f) for f in d["keystore_add"]),
            keystore_remove=tuple(d["keystore_remove"]),
            counts=dict(d["counts"]),
            batch_counts=dict(d["batch_counts"]),
            events=tuple(d["events"]),
            format_version=d["format_version"],
        )


def encode(body: dict) -> bytes:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return json.dumps({"crc32": zlib.crc32(canonical.encode()), "body": body}, indent=None).encode()


def decode(data: bytes, what: str) -> dict:
    try:
        doc = json.loads(data)
        body = doc["body"]
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        ok = zlib.crc32(canonical.encode()) == doc["crc32"]
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptTableError(f"{what} cannot be parsed: {e}") from e
    if not ok:
        raise CorruptTableError(f"{what} fails its checksum")
    return body


def write(io: FileIO, commit: Commit) -> None:
    """Writes ``commit`` if its version is free; FileExistsError if another writer took it."""
    io.put_if_absent(commit_path(commit.version), encode(commit.to_json()))


def read(io: FileIO, version: int) -> Commit:
    path = commit_path(version)
    return Commit.from_json(decode(io.read_bytes(path), path))


def list_versions(io: FileIO) -> list[int]:
    return [int(n[:-5]) for n in io.listdir(COMMITS_DIR) if n.endswith(".json") and not n.startswith(".")]


def now_ms(previous_ms: int) -> int:
    """Commit timestamps strictly increase, so ``as_of`` a time names exactly one version."""
    return max(int(time.time() * 1000), previous_ms + 1)
