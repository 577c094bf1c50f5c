"""The commit log: ``_bitlake/commits/<version:020d>.json``, one immutable file per version.

A commit file is created with the storage's atomic put-if-absent: the writer that creates version ``v``
owns it, and a writer that finds ``v`` taken has lost the race and rebases (:mod:`bitlake.transaction`).

The file is the ASCII bytes ``{"crc32":<N>,"body":<B>}``: ``B`` is the commit as JSON and ``N`` the CRC-32
of exactly the bytes ``B`` (docs/FORMAT.md, "Commit files"). bitlake writes ``B`` with sorted keys, no
whitespace and ``\\u`` escapes for non-ASCII characters, which is also what format v1 readers recompute to
check a commit; so a v1 reader verifies a v2 commit and then refuses it by its ``format_version``.
"""

from __future__ import annotations

import json
import re
import time
import zlib

from bitlake.errors import CorruptTableError, UnsupportedFormatVersionError
from bitlake.format import layout, v1
from bitlake.format.commit import Commit
from bitlake.format.protocol import Protocol
from bitlake.fs import FileIO

_ENVELOPE = re.compile(rb'\{"crc32":(\d+),"body":')


def encode(body: dict) -> bytes:
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return b'{"crc32":%d,"body":%s}' % (zlib.crc32(data), data)


def decode(data: bytes, what: str) -> dict:
    """The body of a commit or checkpoint file, its checksum verified."""
    m = _ENVELOPE.match(data)
    if m is None:
        return v1.decode(data, what)  # v1's envelope: JSON with a checksum of Python's canonical form
    body = data[m.end():-1]
    if data[-1:] != b"}":
        raise CorruptTableError(f"{what} is truncated")
    if zlib.crc32(body) != int(m[1]):
        raise CorruptTableError(f"{what} fails its checksum")
    try:
        return json.loads(body)
    except ValueError as e:
        raise CorruptTableError(f"{what} cannot be parsed: {e}") from e


def write(io: FileIO, commit: Commit) -> None:
    """Writes ``commit`` if its version is free; FileExistsError if another writer took it."""
    io.put_if_absent(layout.commit_path(commit.version), encode(commit.to_json()))


def read(io: FileIO, version: int) -> Commit:
    path = layout.commit_path(version)
    body = decode(io.read_bytes(path), path)
    fv = body.get("format_version")
    if fv == 1:
        return v1.translate(body, io)
    if fv != 2:
        raise UnsupportedFormatVersionError(
            f"commit {version} of {io.uri()} has format version {fv!r}; this bitlake reads versions 1 and 2: "
            "upgrade bitlake"
        )
    if "protocol" in body:  # before the actions it enables are parsed
        Protocol.from_json(body["protocol"]).check_read(io.uri())
    return Commit.from_json(body)


def exists(io: FileIO, version: int) -> bool:
    return io.exists(layout.commit_path(version))


def list_versions(io: FileIO) -> list[int]:
    return [int(n[:-5]) for n in io.listdir(layout.COMMITS_DIR) if n.endswith(".json") and n[:-5].isdigit()]


def last_at_or_before(io: FileIO, lo: int, hi: int, ms: int) -> int:
    """The newest of versions ``lo`` to ``hi`` committed at or before ``ms``, given that ``lo`` was: a binary
    search, as commit times strictly increase."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if read(io, mid).timestamp_ms <= ms:
            lo = mid
        else:
            hi = mid - 1
    return lo


def now_ms(previous_ms: int) -> int:
    """Commit timestamps strictly increase, so ``as_of`` a time names exactly one version."""
    return max(int(time.time() * 1000), previous_ms + 1)
