"""The storage interface every byte of a table goes through, and its implementations by URI scheme.

A table lives under a base URI. :class:`FileIO` is the interface; paths given to its methods are
relative to the base and use ``/``. Every implementation keeps these guarantees (the contract test
suite, ``tests/test_fileio_contract.py``, checks them for each registered implementation):

* ``put_if_absent`` is atomic: either the whole file appears under the name, or the call fails with
  :class:`FileExistsError` because another writer got there first. Of several racing writers exactly
  one wins. The commit log and the segment-part claims rest on it.
* ``write_atomic`` replaces a file with complete content or leaves the old one.
* ``open_output`` writes a new file that no one else writes; a reader may see it only once it is closed
  and complete, or see a torn file that no commit names (the writer crashed).
* ``listdir`` and ``walk`` return names sorted by their UTF-8 bytes; missing folders list as empty.
* Reading a missing file raises :class:`FileNotFoundError`; deleting one does nothing.
* Files are never modified in place.

Instances are small, picklable values (Spark tasks receive them), equal when they name the same base.
Local paths and ``file://`` URIs are :class:`LocalFileIO`; ``s3://``, ``gs://``, ``az://`` and ``memory://``
are :class:`bitlake.fs.objectstore.ObjectStoreFileIO` (docs/storage.md). Another scheme registers a factory
in :data:`_IMPLEMENTATIONS`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from urllib.parse import unquote, urlparse

import pyarrow as pa

from bitlake.errors import InvalidInputError


class FileIO:
    """The interface."""

    base: str
    # Whether Spark's JVM reads the files at uri() as they are (else executors read them through this class).
    spark_readable = True
    # Whether the files live in this process only (memory://): no other process, a Spark worker included, sees them.
    process_local = False

    def uri(self, rel: str = "") -> str:
        """The URI of ``rel`` (or of the base), as engines such as Spark address it."""
        raise NotImplementedError

    def local_path(self, rel: str = "") -> str | None:
        """A local file-system path of ``rel`` when the storage is local (RocksDB, locks), else None."""
        raise NotImplementedError

    def exists(self, rel: str = "") -> bool:
        raise NotImplementedError

    def read_bytes(self, rel: str) -> bytes:
        raise NotImplementedError

    def size(self, rel: str) -> int:
        raise NotImplementedError

    def mtime(self, rel: str) -> float:
        """Seconds since the epoch of the file's last write."""
        raise NotImplementedError

    def put_if_absent(self, rel: str, data: bytes) -> None:
        raise NotImplementedError

    def write_atomic(self, rel: str, data: bytes) -> None:
        raise NotImplementedError

    def open_input(self, rel: str) -> pa.NativeFile:
        """A random-access pyarrow file (what Parquet and ORC readers take)."""
        raise NotImplementedError

    def open_output(self, rel: str) -> pa.NativeFile:
        """A writable pyarrow stream for a new file; the file is complete once the stream is closed."""
        raise NotImplementedError

    def listdir(self, rel: str) -> list[str]:
        """The names directly under folder ``rel``, sorted."""
        raise NotImplementedError

    def walk(self, rel: str = "") -> list[str]:
        """Every file under folder ``rel``, as sorted paths relative to the base."""
        raise NotImplementedError

    def delete(self, rel: str) -> None:
        raise NotImplementedError

    def remove_empty_dirs(self, rel: str) -> None:
        """Removes empty folders under ``rel`` (a no-op on stores without folders)."""


class LocalFileIO(FileIO):
    """A folder of the local file system."""

    def __init__(self, base: str):
        self.base = os.path.abspath(base)

    def __repr__(self) -> str:
        return f"LocalFileIO({self.base!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalFileIO) and other.base == self.base

    def __hash__(self) -> int:
        return hash(self.base)

    def _path(self, rel: str) -> str:
        return os.path.join(self.base, rel) if rel else self.base

    def uri(self, rel: str = "") -> str:
        return "file://" + self._path(rel)

    def local_path(self, rel: str = "") -> str:
        return self._path(rel)

    def exists(self, rel: str = "") -> bool:
        return os.path.exists(self._path(rel))

    def read_bytes(self, rel: str) -> bytes:
        with open(self._path(rel), "rb") as f:
            return f.read()

    def size(self, rel: str) -> int:
        return os.path.getsize(self._path(rel))

    def mtime(self, rel: str) -> float:
        return os.path.getmtime(self._path(rel))

    def _write_tmp(self, rel: str, data: bytes) -> str:
        directory = os.path.dirname(self._path(rel))
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def put_if_absent(self, rel: str, data: bytes) -> None:
        tmp = self._write_tmp(rel, data)
        try:
            # link(2) fails with EEXIST instead of replacing: an atomic put-if-absent of a
            # complete file, which O_EXCL alone is not (a crash mid-write would leave it torn).
            os.link(tmp, self._path(rel))
        finally:
            os.unlink(tmp)
        _fsync_dir(os.path.dirname(self._path(rel)))

    def write_atomic(self, rel: str, data: bytes) -> None:
        tmp = self._write_tmp(rel, data)
        try:
            os.replace(tmp, self._path(rel))
        except BaseException:
            os.unlink(tmp)
            raise
        _fsync_dir(os.path.dirname(self._path(rel)))

    def open_input(self, rel: str) -> pa.NativeFile:
        return pa.memory_map(self._path(rel))

    def open_output(self, rel: str) -> pa.NativeFile:
        path = self._path(rel)
        try:
            file = pa.OSFile(path, "wb")
        except FileNotFoundError:  # its folder is new (a folder is made once, not checked at every file)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            file = pa.OSFile(path, "wb")
        # Writers of Parquet and ORC issue many small writes: one system call each without a buffer.
        return pa.BufferedOutputStream(file, buffer_size=1 << 20)

    def listdir(self, rel: str) -> list[str]:
        try:
            names = os.listdir(self._path(rel))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(names, key=lambda n: n.encode())

    def walk(self, rel: str = "") -> list[str]:
        out = []
        for dirpath, _, names in os.walk(self._path(rel)):
            for name in names:
                out.append(os.path.relpath(os.path.join(dirpath, name), self.base).replace(os.sep, "/"))
        return sorted(out, key=lambda n: n.encode())

    def delete(self, rel: str) -> None:
        try:
            os.unlink(self._path(rel))
        except FileNotFoundError:
            pass

    def remove_empty_dirs(self, rel: str) -> None:
        root = self._path(rel)
        for dirpath, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
            if dirpath != root and not os.listdir(dirpath):
                os.rmdir(dirpath)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _local_uri(uri: str) -> LocalFileIO:
    parsed = urlparse(uri)
    if parsed.netloc not in ("", "localhost"):
        raise ValueError(f"{uri!r} names the host {parsed.netloc!r}: a file URI is file:///absolute/path")
    return LocalFileIO(unquote(parsed.path))


def _object_store(base: str, storage_options: dict | None) -> FileIO:
    from bitlake.fs.objectstore import ObjectStoreFileIO

    return ObjectStoreFileIO(base, storage_options)


def _local(base: str, storage_options: dict | None) -> FileIO:
    if storage_options:
        raise ValueError(f"storage_options configure object stores; {base!r} is a local path")
    return _local_uri(base) if base.startswith("file:") else LocalFileIO(base)


_IMPLEMENTATIONS: dict[str, Callable[[str, dict | None], FileIO]] = {
    "": _local,
    "file": _local,
    **{scheme: _object_store for scheme in ("s3", "s3a", "gs", "az", "abfs", "abfss", "memory")},
}


def file_io(base: str | FileIO, storage_options: dict | None = None) -> FileIO:
    """The IO implementation for a base path or URI (a FileIO is returned as it is). ``storage_options``
    configure an object store (credentials, endpoint, region: docs/storage.md)."""
    if isinstance(base, FileIO):
        return base
    scheme = urlparse(base).scheme.lower()
    if len(scheme) <= 1:  # a relative path, or a Windows drive letter
        scheme = ""
    try:
        factory = _IMPLEMENTATIONS[scheme]
    except KeyError:
        raise InvalidInputError(
            f"unsupported storage scheme {scheme!r} in {base!r}; supported: local paths, "
            + ", ".join(f"{s}://" for s in sorted(_IMPLEMENTATIONS) if s)) from None
    return factory(base, storage_options)
