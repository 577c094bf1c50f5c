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
* A file is durable once the call that wrote it returns (``open_output``: once the stream is closed), and so is
  its name: a commit never names a file that a power loss can take back. An object store's acknowledged PUT
  is; :class:`LocalFileIO` fsyncs the file, its folder, and the parent of every folder it creates.

Instances are small, picklable values (Spark tasks receive them), equal when they name the same base.
Local paths and ``file://`` URIs are :class:`LocalFileIO`; ``s3://``, ``gs://``, ``az://`` and ``memory://``
are :class:`bitlake.fs.objectstore.ObjectStoreFileIO` (docs/storage.md). Another scheme registers a factory
in :data:`_IMPLEMENTATIONS`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from bitlake.errors import InvalidInputError

_T = TypeVar("_T")

# Whether LocalFileIO fsyncs what it writes. BITLAKE_FSYNC=0 turns it off, for throwaway tables and for measuring
# what durability costs (docs/benchmarks.md, "Durability (fsync) cost"): a power loss may then lose committed data.
FSYNC = os.environ.get("BITLAKE_FSYNC", "1") != "0"


class FileIO:
    """The interface."""

    # Whether a put that failed without leaving its file can still land later (a request the store received and
    # applies after the client gave up on it): a commit's writer then cannot prove it did not land.
    failed_put_may_land_later = False

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

    def arrow_filesystem(self) -> pafs.FileSystem:
        """A read-only pyarrow file system over this storage (paths relative to the base), for pyarrow's dataset
        scanner: its threads read through :meth:`open_input`, so every byte still goes through this class.
        Those threads then call Python: a scan of it must never be started by ``Scanner.to_reader``, which
        waits for them holding the GIL (``to_batches`` lets it go); see :func:`calls_python`."""
        return pafs.PyFileSystem(_ArrowReads(self))


def calls_python(fs: pafs.FileSystem) -> bool:
    """Whether pyarrow's threads reading ``fs`` call into Python (and so need the GIL)."""
    return isinstance(fs, pafs.PyFileSystem)


class _ArrowReads(pafs.FileSystemHandler):
    """pyarrow's handler of :meth:`FileIO.arrow_filesystem`: opens files to read; refuses everything else."""

    def __init__(self, io: FileIO):
        self.io = io

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ArrowReads) and other.io is self.io

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return "bitlake"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return [pafs.FileInfo(p, pafs.FileType.File, size=self.io.size(p)) for p in paths]

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self.io.open_input(path)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.io.open_input(path)

    def _read_only(self, *args: object) -> None:
        raise NotImplementedError("bitlake's pyarrow file system only reads")

    get_file_info_selector = create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = \
        delete_file = move = copy_file = open_output_stream = open_append_stream = _read_only


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
        tmp = os.path.join(os.path.dirname(self._path(rel)), f".tmp-{uuid.uuid4().hex}")
        with _create(tmp, lambda p: open(p, "wb")) as f:
            f.write(data)
            f.flush()
            if FSYNC:
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
        if FSYNC:
            _fsync_dir(os.path.dirname(self._path(rel)))

    def write_atomic(self, rel: str, data: bytes) -> None:
        tmp = self._write_tmp(rel, data)
        try:
            os.replace(tmp, self._path(rel))
        except BaseException:
            os.unlink(tmp)
            raise
        if FSYNC:
            _fsync_dir(os.path.dirname(self._path(rel)))

    def open_input(self, rel: str) -> pa.NativeFile:
        return pa.memory_map(self._path(rel))

    def arrow_filesystem(self) -> pafs.FileSystem:
        """pyarrow's own file system under the folder: it reads files as :meth:`open_input` does (memory maps),
        and its threads never wait for the GIL."""
        return pafs.SubTreeFileSystem(self.base, pafs.LocalFileSystem(use_mmap=True))

    def open_output(self, rel: str) -> pa.NativeFile:
        path = self._path(rel)
        file = _create(path, lambda p: pa.OSFile(p, "wb"))
        if FSYNC:
            return _DurableOutput(file, os.path.dirname(path))
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
        path = self._path(rel)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        if FSYNC:  # a vacuum's delete erases data (a GDPR erasure): it must not come back after a power loss
            _fsync_dir(os.path.dirname(path))

    def remove_empty_dirs(self, rel: str) -> None:
        root = self._path(rel)
        for dirpath, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
            if dirpath != root and not os.listdir(dirpath):
                os.rmdir(dirpath)
                _forget_durable_folders()


class _DurableOutput(pa.BufferedOutputStream):
    """A new local file that is on disk once closed, under its name: the file is fsynced, then its folder, which
    holds the name. The folder is fsynced for every file: its fsyncs from before this file was created do not
    cover the file's entry (what the fsyncs cost: docs/benchmarks.md, "Durability (fsync) cost")."""

    def __init__(self, file: pa.OSFile, folder: str):
        # Writers of Parquet and ORC issue many small writes: one system call each without a buffer.
        super().__init__(file, buffer_size=1 << 20)
        self._file, self._folder = file, folder

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.flush()
            os.fsync(self._file.fileno())
        finally:
            super().close()
        _fsync_dir(self._folder)


# Folders whose entries, and those of all their ancestors, this process has fsynced after they existed: a file's
# name survives a power loss only if every folder on its path does, so each new folder's parent is fsynced once,
# when this process first writes under it, and not again for the folder's next files. A folder removed meanwhile
# clears the set (remove_empty_dirs, or an open that finds its folder gone), so a folder made again is fsynced
# again; a folder another process removes and makes again is fsynced by that process.
_durable_folders: set[str] = set()


def _forget_durable_folders() -> None:
    _durable_folders.clear()


def _make_durable_folder(folder: str) -> None:
    """Makes ``folder`` and its missing ancestors, and fsyncs the parent of each folder on its path that is not
    known durable yet, the folders this process did not create included (another writer may have created one
    and not fsynced its parent yet)."""
    chain = []
    while folder not in _durable_folders and os.path.dirname(folder) != folder:
        chain.append(folder)
        folder = os.path.dirname(folder)
    for folder in reversed(chain):
        if not os.path.isdir(folder):
            try:
                os.mkdir(folder)
            except FileExistsError:
                if not os.path.isdir(folder):
                    raise
        _fsync_dir(os.path.dirname(folder), may_be_unreadable=True)
        _durable_folders.add(folder)


def _create(path: str, opener: Callable[[str], _T]) -> _T:
    """``opener(path)`` for a new file, with its folder made first (durable when FSYNC)."""
    folder = os.path.dirname(path)
    if FSYNC and folder not in _durable_folders:
        _make_durable_folder(folder)
    try:
        return opener(path)
    except FileNotFoundError:  # its folder is new, or was removed (a folder is made once, not checked per file)
        if FSYNC:
            _forget_durable_folders()
            _make_durable_folder(folder)
        else:
            os.makedirs(folder, exist_ok=True)
        return opener(path)


def _fsync_dir(directory: str, *, may_be_unreadable: bool = False) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except PermissionError:
        # A folder this process may enter but not read (mode 711, a home folder say) cannot be fsynced by it:
        # only ancestors it found in place can be such, never the folders of the files it writes.
        if may_be_unreadable:
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _local_uri(uri: str) -> LocalFileIO:
    parsed = urlparse(uri)
    if parsed.netloc not in ("", "localhost"):
        raise InvalidInputError(f"{uri!r} names the host {parsed.netloc!r}: a file URI is file:///absolute/path")
    return LocalFileIO(unquote(parsed.path))


def _object_store(base: str, storage_options: dict | None) -> FileIO:
    from bitlake.fs.objectstore import ObjectStoreFileIO

    return ObjectStoreFileIO(base, storage_options)


def _local(base: str, storage_options: dict | None) -> FileIO:
    if storage_options:
        raise InvalidInputError(f"storage_options configure object stores (s3://, gs://, az://); {base!r} is a local "
                                f"path, which takes none (given: {sorted(storage_options)})")
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
