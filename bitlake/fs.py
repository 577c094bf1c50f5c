"""The file IO that every layer goes through, behind a small interface.

A table lives under a base URI. Only local paths (and ``file://`` URIs) are implemented now; other
schemes register an implementation in :data:`_IMPLEMENTATIONS` with the same four guarantees:

* ``put_if_absent`` is atomic: either the whole file appears under the name, or the call fails with
  :class:`FileExistsError` because another writer got there first. The commit log and the segment-part
  claims rest on it.
* ``write_atomic`` replaces a file with complete content or leaves the old one.
* Listing returns names only, sorted.
* Files are never modified in place.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from urllib.parse import urlparse


class FileIO:
    """Local-filesystem IO. Paths given to methods are relative to the table's base path."""

    def __init__(self, base: str):
        self.base = os.path.abspath(base)

    def uri(self) -> str:
        return "file://" + self.base

    def path(self, rel: str) -> str:
        return os.path.join(self.base, rel) if rel else self.base

    def exists(self, rel: str = "") -> bool:
        return os.path.exists(self.path(rel))

    def is_dir(self, rel: str = "") -> bool:
        return os.path.isdir(self.path(rel))

    def makedirs(self, rel: str) -> None:
        os.makedirs(self.path(rel), exist_ok=True)

    def read_bytes(self, rel: str) -> bytes:
        with open(self.path(rel), "rb") as f:
            return f.read()

    def size(self, rel: str) -> int:
        return os.path.getsize(self.path(rel))

    def _write_tmp(self, rel: str, data: bytes) -> str:
        directory = os.path.dirname(self.path(rel))
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def put_if_absent(self, rel: str, data: bytes) -> None:
        """Creates ``rel`` with ``data`` atomically; FileExistsError if it already exists."""
        tmp = self._write_tmp(rel, data)
        try:
            # link(2) fails with EEXIST instead of replacing: an atomic put-if-absent of a
            # complete file, which O_EXCL alone is not (a crash mid-write would leave it torn).
            os.link(tmp, self.path(rel))
        finally:
            os.unlink(tmp)
        _fsync_dir(os.path.dirname(self.path(rel)))

    def write_atomic(self, rel: str, data: bytes) -> None:
        tmp = self._write_tmp(rel, data)
        os.replace(tmp, self.path(rel))

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except FileNotFoundError:
            return []

    def walk_files(self, rel: str = "") -> list[str]:
        """Every file under ``rel``, as paths relative to the base."""
        out = []
        root = self.path(rel)
        for dirpath, _, names in os.walk(root):
            for name in names:
                out.append(os.path.relpath(os.path.join(dirpath, name), self.base))
        return sorted(out)

    def mtime(self, rel: str) -> float:
        return os.path.getmtime(self.path(rel))

    def delete(self, rel: str) -> None:
        try:
            os.unlink(self.path(rel))
        except FileNotFoundError:
            pass

    def remove_empty_dirs(self, rel: str) -> None:
        root = self.path(rel)
        for dirpath, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
            if dirpath != root and not os.listdir(dirpath):
                os.rmdir(dirpath)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_IMPLEMENTATIONS: dict[str, Callable[[str], FileIO]] = {
    "": FileIO,
    "file": lambda uri: FileIO(urlparse(uri).path),
}


def file_io(base: str) -> FileIO:
    """The IO implementation for a base path or URI."""
    scheme = urlparse(base).scheme if "://" in base else ""
    try:
        return _IMPLEMENTATIONS[scheme](base)
    except KeyError:
        raise ValueError(
            f"unsupported storage scheme {scheme!r} in {base!r}; supported: local paths, file://"
        ) from None
