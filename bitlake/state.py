"""The state of a table at one version: replay of the commit log from the last checkpoint.

The state grows with the number of files, segments and batches, never with the number of rows.
"""

from __future__ import annotations

import dataclasses
import json

from bitlake import commitlog
from bitlake.commitlog import Batch, Commit, DataFile, LogFile, SegmentState
from bitlake.errors import NotATableError, TableNotFoundError, VersionNotFoundError
from bitlake.fs import FileIO
from bitlake.keystore import BucketFile
from bitlake.schema import TableMetadata


@dataclasses.dataclass
class TableState:
    metadata: TableMetadata
    version: int = 0
    timestamp_ms: int = 0
    batches: dict[str, int] = dataclasses.field(default_factory=dict)  # batch id -> version that landed it
    visible: dict[str, int] = dataclasses.field(default_factory=dict)  # batch id -> version made visible
    pending: list[Batch] = dataclasses.field(default_factory=list)  # landed, awaiting MetaGen, in order
    files: list[DataFile] = dataclasses.field(default_factory=list)  # landed by visible batches
    segments: dict[tuple[int, int], SegmentState] = dataclasses.field(default_factory=dict)
    keystore: dict[int, list[BucketFile]] = dataclasses.field(default_factory=dict)
    logs: list[tuple[int, LogFile]] = dataclasses.field(default_factory=list)
    visible_parts: dict[int, int] = dataclasses.field(default_factory=dict)  # segment part -> version visible
    last_visible_version: int = 0  # the last commit that made batches visible
    # The last commit that carried Data Change Events: the next event's prev_snapshot_id. It differs from
    # last_visible_version only after a commit that touched no partition (deletes of absent keys in a
    # partitioned table), which has no event, so consumers chaining events must not wait for it.
    last_event_version: int = 0
    max_part: int = 0

    def apply(self, c: Commit) -> None:
        if c.version != self.version + 1:
            raise VersionNotFoundError(f"commit {c.version} does not follow version {self.version}")
        self.version = c.version
        self.timestamp_ms = c.timestamp_ms
        if c.landed is not None:
            self.batches[c.landed.batch_id] = c.version
            self.max_part = max(self.max_part, c.landed.segment_part)
            self.pending.append(c.landed)
        if c.events:
            self.last_event_version = c.version
        if c.processed:
            self.last_visible_version = c.version
            by_id = {b.batch_id: b for b in self.pending}
            for batch_id in c.processed:
                batch = by_id.pop(batch_id)
                self.visible[batch_id] = c.version
                self.visible_parts[batch.segment_part] = c.version
                self.files.extend(batch.files)
            self.pending = [b for b in self.pending if b.batch_id in by_id]
        for s in c.segments:
            self.segments[(s.part, s.seq)] = s
        for f in c.logs:
            self.logs.append((c.version, f))
        if c.keystore_remove:
            removed = set(c.keystore_remove)
            for bucket, files in self.keystore.items():
                self.keystore[bucket] = [f for f in files if f.path not in removed]
        for bucket_file in c.keystore_add:
            self.keystore.setdefault(bucket_file.bucket, []).append(bucket_file)

    def data_files(self) -> list[DataFile]:
        return [f for f in self.files if f.kind == "data"]

    def to_json(self) -> dict:
        return {
            "metadata": self.metadata.to_json(),
            "version": self.version,
            "timestamp_ms": self.timestamp_ms,
            "batches": self.batches,
            "visible": self.visible,
            "pending": [b.to_json() for b in self.pending],
            "files": [f.to_json() for f in self.files],
            "segments": [s.to_json() for s in self.segments.values()],
            "keystore": {str(b): [f.to_json() for f in fs] for b, fs in self.keystore.items()},
            "logs": [[v, f.to_json()] for v, f in self.logs],
            "visible_parts": {str(p): v for p, v in self.visible_parts.items()},
            "last_visible_version": self.last_visible_version,
            "last_event_version": self.last_event_version,
            "max_part": self.max_part,
        }

    @classmethod
    def from_json(cls, d: dict) -> TableState:
        return cls(
            metadata=TableMetadata.from_json(d["metadata"]),
            version=d["version"],
            timestamp_ms=d["timestamp_ms"],
            batches=dict(d["batches"]),
            visible=dict(d["visible"]),
            pending=[Batch.from_json(b) for b in d["pending"]],
            files=[DataFile.from_json(f) for f in d["files"]],
            segments={(s["part"], s["seq"]): SegmentState.from_json(s) for s in d["segments"]},
            keystore={int(b): [BucketFile.from_json(f) for f in fs] for b, fs in d["keystore"].items()},
            logs=[(v, LogFile.from_json(f)) for v, f in d["logs"]],
            visible_parts={int(p): v for p, v in d["visible_parts"].items()},
            last_visible_version=d["last_visible_version"],
            # Checkpoints written before the field existed: every visible commit had events then.
            last_event_version=d.get("last_event_version", d["last_visible_version"]),
            max_part=d["max_part"],
        )


def checkpoint_path(version: int) -> str:
    return f"{commitlog.CHECKPOINTS_DIR}/{version:020d}.json"


def write_checkpoint(io: FileIO, state: TableState) -> None:
    """Checkpoints are a cache of the replay: optional, written after the commit, and replaceable."""
    io.write_atomic(checkpoint_path(state.version), commitlog.encode(state.to_json()))


def load(io: FileIO, version: int | None = None) -> TableState:
    """The state at ``version`` (default: the latest)."""
    if not io.exists():
        raise TableNotFoundError(f"no such table: {io.base} does not exist")
    versions = commitlog.list_versions(io)
    if not versions or versions[0] != 0:
        raise NotATableError(f"{io.base} is not a bitlake table (no commit log under _bitlake/commits)")
    latest = versions[-1]
    if version is None:
        version = latest
    if not 0 <= version <= latest:
        raise VersionNotFoundError(f"version {version} does not exist; the table has versions 0 to {latest}")
    state = None
    checkpoints = [
        int(n[:-5]) for n in io.listdir(commitlog.CHECKPOINTS_DIR) if n.endswith(".json") and not n.startswith(".")
    ]
    usable = [v for v in checkpoints if v <= version]
    if usable:
        path = checkpoint_path(usable[-1])
        state = TableState.from_json(commitlog.decode(io.read_bytes(path), path))
    if state is None:
        first = commitlog.read(io, 0)
        assert first.metadata is not None
        state = TableState(metadata=TableMetadata.from_json(first.metadata), timestamp_ms=first.timestamp_ms)
    for v in range(state.version + 1, version + 1):
        state.apply(commitlog.read(io, v))
    return state


def dumps(state: TableState) -> str:
    return json.dumps(state.to_json(), indent=1)
