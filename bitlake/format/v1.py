"""Reading format v1 commits: each is translated into the v2 actions it amounts to (docs/FORMAT.md,
"Format v1 tables"), so one replay serves both. Tables stay readable in v1 and are written only after
``bitlake upgrade`` (:func:`bitlake.maintenance.upgrade`)."""

from __future__ import annotations

import json
import posixpath
import zlib
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from bitlake.errors import CorruptTableError
from bitlake.format import layout
from bitlake.format.commit import (
    LIVE,
    PENDING,
    BatchRecord,
    BucketFile,
    Commit,
    DataFile,
    KeysFile,
    LogFile,
    SegmentRows,
    SegmentState,
)
from bitlake.format.protocol import Protocol
from bitlake.fs import FileIO


def decode(data: bytes, what: str) -> dict:
    """v1's envelope: ``{"crc32": N, "body": {...}}``, N the CRC-32 of Python's canonical JSON of body."""
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


def _data_file(f: dict) -> DataFile:
    return DataFile(f["path"], f["rows"], f["bytes"], f["partition"],
                    (SegmentRows(f["segment_part"], f["segment_seq"], f["rows"]),))


def translate(body: dict, io: FileIO) -> Commit:
    """The v2 commit a v1 commit body amounts to."""
    metadata = None
    protocol = None
    if body["metadata"] is not None:
        m = dict(body["metadata"])
        props = dict(m.pop("properties"))
        name = props.pop("table.name", "") or posixpath.basename(urlparse(io.uri()).path.rstrip("/")) or "table"
        if "keystore.max_deltas" in props:
            props["keystore.max_increments"] = props.pop("keystore.max_deltas")
        m.pop("format_version", None)
        metadata = {**m, "name": name, "properties": props}
        protocol = Protocol(reader_version=1, writer_version=1)
    batches: list[BatchRecord] = []
    add_files: list[DataFile] = []
    landed = body["landed"]
    if landed is not None:
        keys = tuple(KeysFile(f["path"], f["segment_seq"], f["rows"], f["bytes"])
                     for f in landed["files"] if f["kind"] == "keys")
        data = [f for f in landed["files"] if f["kind"] == "data"]
        records = sum(f.rows for f in keys) if keys else sum(f["rows"] for f in data)
        status = LIVE if landed["batch_id"] in body["processed"] else PENDING
        batches.append(BatchRecord(landed["batch_id"], landed["segment_part"], status, records, keys))
        add_files.extend(_data_file(f) for f in data)
    parts = _V1Parts.of(io)
    for batch_id in body["processed"]:
        if landed is None or batch_id != landed["batch_id"]:
            batches.append(BatchRecord(batch_id, parts.part_of(batch_id, body["version"]), LIVE))
    return Commit(
        version=body["version"],
        operation=body["operation"],
        timestamp_ms=body["timestamp_ms"],
        protocol=protocol,
        metadata=metadata,
        batches=tuple(batches),
        add_files=tuple(add_files),
        segments=tuple(SegmentState.from_json(s) for s in body["segments"]),
        logs=tuple(LogFile.from_json(f) for f in body["logs"]),
        keystore_add=tuple(BucketFile.from_json(f) for f in body["keystore_add"]),
        keystore_remove=tuple(body["keystore_remove"]),
        counts=dict(body["counts"]),
        batch_counts=dict(body["batch_counts"]),
        events=tuple(body["events"]),
    )


def read_keystore_file(io: FileIO, path: str) -> pa.Table:
    """A v1 key-store file, with v2's column names (v1 called the writing version ``_ks_seq``)."""
    table = pq.read_table(io.open_input(path))
    return table.rename_columns(["_ks_version" if n == "_ks_seq" else n for n in table.column_names])


class _V1Parts:
    """A v1 METAGEN commit names the batches it made visible by id only; their parts are in earlier LAND
    commits. Looked up once per table and cached (v1 histories are closed: nothing is added to them)."""

    _cache: dict[str, _V1Parts] = {}

    def __init__(self, io: FileIO):
        self.io = io
        self.parts: dict[str, int] = {}
        self.scanned = -1

    @classmethod
    def of(cls, io: FileIO) -> _V1Parts:
        return cls._cache.setdefault(io.uri(), cls(io))

    def part_of(self, batch_id: str, before: int) -> int:
        while batch_id not in self.parts and self.scanned + 1 < before:
            self.scanned += 1
            path = layout.commit_path(self.scanned)
            body = decode(self.io.read_bytes(path), path)
            if body.get("landed"):
                self.parts[body["landed"]["batch_id"]] = body["landed"]["segment_part"]
        if batch_id not in self.parts:
            raise CorruptTableError(
                f"v1 commit {before} makes batch {batch_id!r} visible, which no earlier commit landed")
        return self.parts[batch_id]
