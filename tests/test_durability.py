"""Durability on local disk: every file LocalFileIO writes is fsynced, and so is every name on its path.

A power loss cannot be pulled in a test; what can be observed is the system call. ``os.fsync`` is wrapped to
record, for each call, which inode it synced and, for a folder, the names the folder held at that moment: a name
is durable only if its folder was fsynced while it held the name, and the folder's own name likewise, up to the
root. The wrapper calls the real ``os.fsync``.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

import pyarrow as pa
import pytest

import bitlake
from bitlake import fs
from bitlake.fs import LocalFileIO


@dataclass
class Fsyncs:
    """The fsync calls seen: (device, inode) and, for a folder, the names it held, in call order."""

    calls: list[tuple[tuple[int, int], frozenset[str] | None]] = field(default_factory=list)

    def of(self, path) -> list[frozenset[str] | None]:
        st = os.stat(path)
        return [names for ident, names in self.calls if ident == (st.st_dev, st.st_ino)]

    def synced(self, path) -> bool:
        return bool(self.of(path))

    def folder_synced_holding(self, folder, name) -> int:
        """How many fsyncs of ``folder`` happened while it held ``name``."""
        return sum(1 for names in self.of(folder) if names is not None and name in names)

    def name_is_durable(self, path) -> bool:
        """Whether every name from the root down to ``path`` went through an fsync of its folder that held it
        (folders this process may not read excepted: it cannot fsync them)."""
        path = os.path.abspath(path)
        while os.path.dirname(path) != path:
            folder, name = os.path.dirname(path), os.path.basename(path)
            if os.access(folder, os.R_OK) and not self.folder_synced_holding(folder, name):
                return False
            path = folder
        return True


@pytest.fixture
def fsyncs(monkeypatch) -> Fsyncs:
    seen = Fsyncs()
    real = os.fsync

    def fsync(fd):
        st = os.fstat(fd)
        names = frozenset(os.listdir(fd)) if stat.S_ISDIR(st.st_mode) else None
        seen.calls.append(((st.st_dev, st.st_ino), names))
        return real(fd)

    monkeypatch.setattr(fs, "FSYNC", True)  # whatever BITLAKE_FSYNC says in this environment
    monkeypatch.setattr(fs, "_durable_folders", set())  # as in a new process: no folder known durable
    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_open_output_syncs_the_file_then_its_name_and_the_names_of_new_folders(tmp_path, fsyncs):
    io = LocalFileIO(str(tmp_path / "table"))
    with io.open_output("data/p=1/f.parquet") as out:
        out.write(b"x" * 3_000_000)  # more than the stream's buffer
        assert not fsyncs.synced(tmp_path / "table/data/p=1/f.parquet")
    file, folder = tmp_path / "table/data/p=1/f.parquet", tmp_path / "table/data/p=1"
    assert fsyncs.synced(file)
    assert fsyncs.name_is_durable(file)
    last_two = [ident for ident, _ in fsyncs.calls[-2:]]
    assert last_two == [(os.stat(p).st_dev, os.stat(p).st_ino) for p in (file, folder)]  # the file, then its folder
    assert fsyncs.of(folder)[-1] == {"f.parquet"}
    assert file.read_bytes() == b"x" * 3_000_000


def test_a_folder_is_synced_for_each_file_and_its_parent_once(tmp_path, fsyncs):
    io = LocalFileIO(str(tmp_path / "table"))
    for name in ("a", "b", "c"):
        with io.open_output(f"logs/{name}") as out:
            out.write(name.encode())
    folder = tmp_path / "table/logs"
    # Each file's name needs an fsync of the folder after the file was created: earlier ones do not cover it.
    assert [names for names in fsyncs.of(folder)] == [{"a"}, {"a", "b"}, {"a", "b", "c"}]
    # The folder's own name in its parent: once, when it was made.
    assert fsyncs.folder_synced_holding(tmp_path / "table", "logs") == 1
    assert fsyncs.folder_synced_holding(tmp_path, "table") == 1


def test_a_folder_removed_and_made_again_has_its_name_synced_again(tmp_path, fsyncs):
    io = LocalFileIO(str(tmp_path / "table"))
    with io.open_output("keys/a") as out:
        out.write(b"a")
    io.delete("keys/a")
    io.remove_empty_dirs("")
    with io.open_output("keys/b") as out:
        out.write(b"b")
    assert fsyncs.folder_synced_holding(tmp_path / "table", "keys") == 2
    # Removed behind this FileIO's back (another process, say): the open finds the folder gone.
    os.unlink(tmp_path / "table/keys/b")
    os.rmdir(tmp_path / "table/keys")
    with io.open_output("keys/c") as out:
        out.write(b"c")
    assert fsyncs.folder_synced_holding(tmp_path / "table", "keys") == 3
    assert fsyncs.name_is_durable(tmp_path / "table/keys/c")


@pytest.mark.parametrize("call", ["put_if_absent", "write_atomic"])
def test_put_if_absent_and_write_atomic_sync_the_file_and_its_name(tmp_path, fsyncs, call):
    io = LocalFileIO(str(tmp_path / "table"))
    getattr(io, call)("_bitlake/commits/00000000000000000000.json", b"{}")
    file = tmp_path / "table/_bitlake/commits/00000000000000000000.json"
    assert fsyncs.synced(file)  # the temporary file's inode, which the link or rename gave this name
    assert fsyncs.name_is_durable(file)
    assert fsyncs.of(file.parent)[-1] == {file.name}  # synced after the temporary name was gone


def test_bitlake_fsync_0_syncs_nothing(tmp_path, fsyncs, monkeypatch):
    monkeypatch.setattr(fs, "FSYNC", False)
    io = LocalFileIO(str(tmp_path / "table"))
    with io.open_output("data/f") as out:
        out.write(b"f")
    io.put_if_absent("c/0", b"0")
    io.write_atomic("s/0", b"0")
    assert fsyncs.calls == []
    assert io.read_bytes("data/f") == b"f" and io.read_bytes("c/0") == b"0" and io.read_bytes("s/0") == b"0"


def test_every_file_of_a_committed_table_is_durable(tmp_path, fsyncs):
    """Data, keys files, segment logs, bitmaps, key store, commits: an ingest on the driver (Arrow input, inline
    MetaGen) leaves no file of the table whose bytes or name were not fsynced. The key index is a cache
    (rebuilt from the key store), RocksDB's own files."""
    schema = pa.schema([("id", pa.int64()), ("region", pa.string()), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id"], delta_column="mod",
                             partition_by=["region"], num_buckets=2)
    t.ingest(pa.table({"id": [1, 2, 3], "region": ["eu", "us", "eu"], "mod": [1, 1, 1]}, schema=schema))
    t.ingest(pa.table({"id": [2, 4], "region": ["eu", "us"], "mod": [2, 2]}, schema=schema))
    t.ingest(pa.table({"id": [1], "region": ["eu"], "mod": [3], "op": ["delete"]}), op_column="op")
    from bitlake.engine.keys.indexsession import flush_idle

    flush_idle()
    files = [p for p in t.io.walk() if not p.startswith(("_bitlake/index/", "_bitlake/index."))]
    kinds = {p.split("/")[1] if p.startswith("_bitlake/") else p.split("/")[0] for p in files}
    assert {"data", "keys", "logs", "bitmaps", "keystore", "commits"} <= kinds
    not_synced = [p for p in files if not fsyncs.synced(t.io.local_path(p))]
    not_named = [p for p in files if not fsyncs.name_is_durable(t.io.local_path(p))]
    assert not_synced == [] and not_named == []
    assert sorted(r["id"] for r in t.to_arrow().to_pylist()) == [2, 3, 4]


def test_a_delete_is_durable(tmp_path, fsyncs):
    """A vacuum's delete erases rows (a GDPR erasure): the folder is fsynced once the name is gone."""
    io = LocalFileIO(str(tmp_path / "table"))
    io.write_atomic("data/f.parquet", b"secret")
    io.write_atomic("data/g.parquet", b"kept")
    io.delete("data/f.parquet")
    assert fsyncs.of(tmp_path / "table/data")[-1] == {"g.parquet"}
    calls = len(fsyncs.calls)
    io.delete("data/f.parquet")  # gone already: nothing to make durable
    assert len(fsyncs.calls) == calls
