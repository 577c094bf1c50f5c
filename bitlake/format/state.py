"""The state of a table at one version: the replay of its commits (docs/FORMAT.md, "State and replay").

The state grows with the number of files, segments and batches, never with the number of rows. Every
``checkpoint.interval`` versions a writer also stores the state as a checkpoint, so that loading a version
reads one checkpoint and the commits after it.
"""

from __future__ import annotations

import dataclasses

from bitlake.errors import NotATableError, TableNotFoundError, VersionExpiredError, VersionNotFoundError
from bitlake.format import commitlog, layout
from bitlake.format.commit import (
    LIVE,
    PENDING,
    REPLACED,
    REVERTED,
    BatchRecord,
    BucketFile,
    Commit,
    DataFile,
    KeysFile,
    LogFile,
    PurgedFile,
    SegmentState,
    Tombstone,
    Window,
)
from bitlake.format.frozen import FrozenDict, FrozenList
from bitlake.format.metadata import TableMetadata
from bitlake.format.protocol import Protocol
from bitlake.fs import FileIO


@dataclasses.dataclass(frozen=True)
class BatchState:
    """One incarnation of a batch id: its segment part, status, records and keys files, and the versions
    that landed it and made it live (None while pending)."""

    batch_id: str
    part: int
    status: str
    records: int
    keys_files: tuple[KeysFile, ...]
    landed_version: int
    live_version: int | None = None
    restated_version: int | None = None  # the version that reverted or replaced it
    digest: str | None = None  # of its records, from the record that landed it (None: none was taken)

    def to_json(self) -> dict:
        d = {"id": self.batch_id, "part": self.part, "status": self.status, "records": self.records,
             "keys_files": [f.to_json() for f in self.keys_files], "landed_version": self.landed_version,
             "live_version": self.live_version}
        if self.restated_version is not None:
            d["restated_version"] = self.restated_version
        if self.digest is not None:
            d["digest"] = self.digest
        return d

    @classmethod
    def from_json(cls, d: dict) -> BatchState:
        return cls(d["id"], d["part"], d["status"], d["records"], tuple(KeysFile.from_json(f) for f in d["keys_files"]),
                   d["landed_version"], d["live_version"], d.get("restated_version"), d.get("digest"))

    def changed_by(self, b: BatchRecord, version: int) -> BatchState:
        """This incarnation after a commit at ``version`` recorded ``b`` for it."""
        restated = self.restated_version
        if b.status in (REVERTED, REPLACED) and restated is None:
            restated = version
        live = version if b.status == LIVE and self.live_version is None else self.live_version
        return dataclasses.replace(self, status=b.status, live_version=live, restated_version=restated)


@dataclasses.dataclass(frozen=True)
class TableState:
    """A snapshot of a table: the replay of its commits up to ``version``. A value: :meth:`applied` returns a new
    snapshot and never changes this one, so whoever holds it can compare it with a later one."""

    protocol: Protocol
    metadata: TableMetadata
    version: int = 0
    timestamp_ms: int = 0
    parts: dict[int, BatchState] = dataclasses.field(default_factory=dict)  # segment part -> incarnation
    batches: dict[str, int] = dataclasses.field(default_factory=dict)  # batch id -> part of its current incarnation
    files: dict[str, DataFile] = dataclasses.field(default_factory=dict)  # path -> data file, in the order added
    segments: dict[tuple[int, int], SegmentState] = dataclasses.field(default_factory=dict)
    keystore: dict[int, list[BucketFile]] = dataclasses.field(default_factory=dict)
    logs: list[tuple[int, LogFile]] = dataclasses.field(default_factory=list)  # (version, file)
    tombstones: list[tuple[int, Tombstone]] = dataclasses.field(default_factory=list)  # (version, tombstone)
    # The last commit that carried Data Change Events: the next event's prev_snapshot_id.
    last_event_version: int = 0
    max_part: int = 0
    window: Window | None = None  # set by major compactions: reads before it are refused
    # Data files a vacuum rewrote, by path: what every version reads in their place (None: nothing).
    rewritten: dict[str, DataFile | None] = dataclasses.field(default_factory=dict)
    # The records of the rows vacuums purged, by the version of the vacuum (restatements fold them again).
    purged: list[tuple[int, PurgedFile]] = dataclasses.field(default_factory=list)
    # What readers derive from this snapshot (read plans, older snapshots), kept as long as it lives: a snapshot
    # never changes, so neither does what is derived from it. Not copied by dataclasses.replace (init=False).
    derived: dict = dataclasses.field(default_factory=dict, init=False, compare=False, repr=False)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "derived": {}}  # a snapshot sent to Spark tasks leaves its plans behind

    def __post_init__(self):
        for name in _CONTAINERS:
            value = getattr(self, name)
            frozen = FrozenList if name in _LISTS else FrozenDict
            if type(value) is not frozen:
                object.__setattr__(self, name, frozen(value))
        if any(type(v) is not FrozenList for v in self.keystore.values()):
            object.__setattr__(self, "keystore", FrozenDict({b: FrozenList(fs) for b, fs in self.keystore.items()}))

    def applied(self, *commits: Commit) -> TableState:
        """The snapshot after ``commits`` (the next versions, in order) replay on this one (docs/FORMAT.md,
        "State and replay")."""
        if not commits:
            return self
        replay = _Replay(self)
        for c in commits:
            replay.apply(c)
        return replay.snapshot()

    def batch(self, batch_id: str) -> BatchState | None:
        """The current incarnation of ``batch_id``, or None if it never landed."""
        part = self.batches.get(batch_id)
        return None if part is None else self.parts[part]

    @property
    def pending(self) -> list[BatchState]:
        """Batches landed and not yet visible, in landing order."""
        return sorted((b for b in self.parts.values() if b.status == PENDING), key=lambda b: (b.landed_version, b.part))

    def data_files(self) -> list[DataFile]:
        return list(self.files.values())

    def read_through(self, rewritten: dict[str, DataFile | None]) -> TableState:
        """This (older) snapshot reading, in place of each data file a later vacuum rewrote, its rewrite
        (``rewritten``: the latest snapshot's): the files it names are gone (docs/FORMAT.md, "Vacuum")."""
        if not any(p in rewritten for p in self.files):
            return self
        return dataclasses.replace(self, files=_read_through(self.files, rewritten))

    def to_json(self) -> dict:
        return {
            "protocol": self.protocol.to_json(),
            "metadata": self.metadata.to_json(),
            "version": self.version,
            "timestamp_ms": self.timestamp_ms,
            "batches": [b.to_json() for b in self.parts.values()],
            "current": dict(self.batches),
            "files": [f.to_json() for f in self.files.values()],
            "segments": [s.to_json() for s in self.segments.values()],
            "keystore": [f.to_json() for fs in self.keystore.values() for f in fs],
            "logs": [[v, f.to_json()] for v, f in self.logs],
            "tombstones": [[v, t.to_json()] for v, t in self.tombstones],
            "last_event_version": self.last_event_version,
            "max_part": self.max_part,
            "window": self.window.to_json() if self.window else None,
            "rewritten": [[p, f.to_json() if f else None] for p, f in self.rewritten.items()],
            "purged": [[v, f.to_json()] for v, f in self.purged],
        }

    @classmethod
    def from_json(cls, d: dict) -> TableState:
        keystore: dict[int, list[BucketFile]] = {}
        for f in d["keystore"]:
            bf = BucketFile.from_json(f)
            keystore.setdefault(bf.bucket, []).append(bf)
        parts = {b["part"]: BatchState.from_json(b) for b in d["batches"]}
        metadata = TableMetadata.from_json(d["metadata"])
        return cls(
            protocol=Protocol.from_json(d["protocol"]),
            metadata=metadata,
            version=d["version"],
            timestamp_ms=d["timestamp_ms"],
            parts=parts,
            batches=dict(d["current"]),
            files={f["path"]: DataFile.from_json(f) for f in d["files"]},
            segments={(s["part"], s["seq"]): SegmentState.from_json(s) for s in d["segments"]},
            keystore=keystore,
            logs=[(v, LogFile.from_json(f)) for v, f in d["logs"]],
            tombstones=[(v, Tombstone.from_json(t)) for v, t in d["tombstones"]],
            last_event_version=d["last_event_version"],
            max_part=d["max_part"],
            window=typed_window(Window.from_json(d["window"]), metadata) if d.get("window") else None,
            rewritten={p: DataFile.from_json(f) if f else None for p, f in d.get("rewritten", [])},
            purged=[(v, PurgedFile.from_json(f)) for v, f in d.get("purged", [])],
        )


_LISTS = ("logs", "tombstones", "purged")
_CONTAINERS = ("parts", "batches", "files", "segments", "keystore", "rewritten", *_LISTS)


def _read_through(files: dict[str, DataFile], rewritten: dict[str, DataFile | None]) -> dict[str, DataFile]:
    out: dict[str, DataFile] = {}
    for f in files.values():
        g: DataFile | None = f
        while g is not None and g.path in rewritten:
            g = rewritten[g.path]
        if g is not None:
            out[g.path] = g
    return out


class _Replay:
    """The private working copy one replay of commits builds a new snapshot in. Each container a commit changes
    is copied once, on its first change, however many commits follow, into the frozen type the new snapshot
    holds: the replay alone changes it, through the base class's methods (the snapshot takes it as it is, with
    no second copy). The snapshot it starts from is never changed."""

    def __init__(self, s: TableState):
        self.fields = {f.name: getattr(s, f.name) for f in dataclasses.fields(TableState) if f.init}
        self._own: set[str] = set()

    def _mine(self, name: str):
        if name not in self._own:
            value = self.fields[name]
            self.fields[name] = FrozenList(value) if name in _LISTS else FrozenDict(value)
            self._own.add(name)
        return self.fields[name]

    def _set(self, name: str, value) -> None:
        """Replaces a container by a new one (built from a filter of the old)."""
        self.fields[name] = FrozenList(value) if name in _LISTS else FrozenDict(value)
        self._own.add(name)

    def snapshot(self) -> TableState:
        return TableState(**self.fields)

    def apply(self, c: Commit) -> None:
        s = self.fields
        if c.version != s["version"] + 1:
            raise VersionNotFoundError(f"commit {c.version} does not follow version {s['version']}")
        s["version"] = c.version
        s["timestamp_ms"] = c.timestamp_ms
        if c.protocol is not None:
            s["protocol"] = c.protocol
        if c.metadata is not None:
            s["metadata"] = TableMetadata.from_json(c.metadata)
        for b in c.batches:
            self._apply_batch(b, c.version)
        if c.remove_files or c.add_files:
            files = self._mine("files")
            for path in c.remove_files:
                dict.pop(files, path, None)
            for added in c.add_files:
                dict.__setitem__(files, added.path, added)
        if c.file_stats:
            files = self._mine("files")
            for fs in c.file_stats:  # a file removed meanwhile is not the table's any more: nothing to do
                if fs.path in files:
                    dict.__setitem__(files, fs.path, dataclasses.replace(files[fs.path], stats=fs.stats))
        if c.segments:
            segments = self._mine("segments")
            for seg in c.segments:
                dict.__setitem__(segments, seg.segment, seg)
        if c.remove_logs:
            removed_logs = set(c.remove_logs)
            self._set("logs", [(v, f) for v, f in s["logs"] if f.path not in removed_logs])
        if c.logs:
            list.extend(self._mine("logs"), [(c.version, f) for f in c.logs])
        if c.window is not None:
            s["window"] = typed_window(c.window, s["metadata"])
        if c.keystore_remove:
            removed = set(c.keystore_remove)
            self._set("keystore", {b: FrozenList(f for f in fs if f.path not in removed)
                                   for b, fs in s["keystore"].items()})
        if c.keystore_add:
            keystore = self._mine("keystore")
            for bf in c.keystore_add:
                dict.__setitem__(keystore, bf.bucket, FrozenList([*keystore.get(bf.bucket, ()), bf]))
        if c.tombstones:
            list.extend(self._mine("tombstones"), [(c.version, t) for t in c.tombstones])
        if c.remove_tombstones:
            retired = set(c.remove_tombstones)
            self._set("tombstones", [(v, t) for v, t in s["tombstones"] if t.path not in retired])
        if c.rewrites:
            rewrites = {r.path: r.to for r in c.rewrites}
            dict.update(self._mine("rewritten"), rewrites)
            self._set("files", _read_through(s["files"], rewrites))
        if c.purged:
            list.extend(self._mine("purged"), [(c.version, f) for f in c.purged])
        if c.events:
            s["last_event_version"] = c.version

    def _apply_batch(self, b: BatchRecord, version: int) -> None:
        parts = self._mine("parts")
        known = parts.get(b.part)
        if known is None:
            known = BatchState(b.batch_id, b.part, b.status, b.records or 0, b.keys_files, version, digest=b.digest)
            self.fields["max_part"] = max(self.fields["max_part"], b.part)
        dict.__setitem__(parts, b.part, known.changed_by(b, version))
        if b.status != REPLACED:
            dict.__setitem__(self._mine("batches"), b.batch_id, b.part)


def typed_window(window: Window, metadata: TableMetadata) -> Window:
    """``window`` knowing the type of the table's delta column (its watermark is then written as a time)."""
    return dataclasses.replace(window, delta_type=metadata.delta_type if metadata.delta_column else None)


def initial(io: FileIO, first: Commit) -> TableState:
    """The state at version 0, from the ``CREATE`` commit."""
    if first.metadata is None or first.protocol is None:
        raise NotATableError(f"{io.uri()}: commit 0 does not create a table")
    return TableState(first.protocol, TableMetadata.from_json(first.metadata), 0, first.timestamp_ms)


def write_checkpoint(io: FileIO, state: TableState) -> None:
    """Checkpoints are a cache of the replay: optional, written after the commit, and replaceable."""
    io.write_atomic(layout.checkpoint_path(state.version), commitlog.encode(state.to_json()))


def checkpoint_versions(io: FileIO) -> list[int]:
    return sorted(int(n[:-5]) for n in io.listdir(layout.CHECKPOINTS_DIR) if n.endswith(".json") and n[:-5].isdigit())


def earliest_version(io: FileIO) -> int:
    """The oldest version whose state can be loaded: 0, or, once cleanup dropped the commits before a
    retention window, the window's start (a checkpoint holds its state)."""
    versions = commitlog.list_versions(io)
    return min(versions) if versions else 0


def _foreign_format(io: FileIO) -> str | None:
    """What other table format the folder holds, if one that ``bitlake convert`` reads."""
    try:
        if io.listdir("_delta_log"):
            return "a Delta table"
        if any(n.endswith(".metadata.json") for n in io.listdir("metadata")):
            return "an Iceberg table"
        if io.listdir("_versions"):
            return "a lance dataset"
    except Exception:  # noqa: BLE001 - only a hint: the error it adds to is raised whatever happens here
        return None
    return None


def latest_version(io: FileIO) -> int:
    """The latest version: listed once, then probed forwards (a listing may lag behind a fresh commit)."""
    versions = sorted(commitlog.list_versions(io))
    # After cleanup dropped the commits before a retention window, a checkpoint holds the state they replayed to.
    if not versions or (versions[0] != 0 and not any(v >= versions[0] for v in checkpoint_versions(io))):
        if not io.exists():
            raise TableNotFoundError(f"no such table: {io.uri()} does not exist")
        what = "no commit log" if not versions else f"its commit log starts at {versions[0]} without a checkpoint"
        foreign = _foreign_format(io) if not versions else None
        if foreign is not None:
            raise NotATableError(f"{io.uri()} is {foreign}, not a bitlake table: convert it into one with "
                                 f"`bitlake convert {io.uri()} NEW_PATH` or bitlake.convert({io.uri()!r}, new_path) "
                                 "(docs/convert.md)")
        raise NotATableError(f"{io.uri()} is not a bitlake table ({what} under {layout.COMMITS_DIR})")
    latest = versions[-1]
    while commitlog.exists(io, latest + 1):
        latest += 1
    return latest


def load(io: FileIO, version: int | None = None) -> TableState:
    """The state at ``version`` (default: the latest), checked against what this library reads."""
    latest = latest_version(io)
    if version is None:
        version = latest
    if not 0 <= version <= latest:
        raise VersionNotFoundError(f"version {version} does not exist; the table has versions 0 to {latest}")
    state = None
    usable = [v for v in checkpoint_versions(io) if v <= version]
    if usable:
        path = layout.checkpoint_path(usable[-1])
        state = TableState.from_json(commitlog.decode(io.read_bytes(path), path))
        state.protocol.check_read(io.uri())
    if state is None:
        if not commitlog.exists(io, 0):
            raise VersionExpiredError(f"version {version} of {io.uri()} has expired: the table keeps versions from "
                                      f"{earliest_version(io)} (cleanup removed the commits before its retention "
                                      "window)")
        state = initial(io, commitlog.read(io, 0))
    # Each commit's protocol is checked as it is read.
    return state.applied(*(commitlog.read(io, v) for v in range(state.version + 1, version + 1)))
