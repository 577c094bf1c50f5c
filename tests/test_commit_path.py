"""The one commit path (bitlake/transaction.py) keeps what a published commit names: an error after the commit's
put, a lost answer to it or an interrupt never deletes a file the commit names, and snapshots a caller holds
never move. These are the regressions of issue 40 (they failed before snapshots were values); the fault matrix
over every operation and every step is tests/test_faults.py."""

from __future__ import annotations

import pyarrow as pa
import pytest
from oracle import rows_key

import bitlake
from bitlake.errors import StorageError
from bitlake.format import layout
from bitlake.fs import LocalFileIO

SCHEMA = pa.schema([("k", pa.int64()), ("user", pa.string()), ("mod", pa.int64())])


def batch(keys, users, mod):
    return pa.table({"k": pa.array(keys, pa.int64()), "user": users, "mod": pa.array([mod] * len(keys), pa.int64())})


class LostCommitAnswer(LocalFileIO):
    """A local store whose answer to the next commit put is lost: the commit lands, the writer sees an error."""

    armed = False

    def put_if_absent(self, rel: str, data: bytes) -> None:
        super().put_if_absent(rel, data)
        if self.armed and rel.startswith(layout.COMMITS_DIR):
            self.armed = False
            raise StorageError(f"lost answer to the put of {rel}")


def read_all(path):
    t = bitlake.open_table(path)
    return {v: rows_key(t.to_arrow(version=v).to_pylist(), SCHEMA.names) for v in range(t.version + 1)}


def test_a_vacuum_whose_commit_answer_is_lost_leaves_the_table_readable(tmp_path):
    path = str(tmp_path / "t")
    bitlake.create_table(path, SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2)
    io = LostCommitAnswer(path)
    t = bitlake.open_table(io)
    t.ingest(batch([1, 2, 3], ["ann", "bob", "ann"], 1))
    t.tombstone("user", ["ann"])
    io.armed = True
    t.vacuum()  # the commit landed: its outcome is learned from the log, and the vacuum reports it
    views = read_all(path)  # every file the commits name is there
    assert views[max(views)] == [(2, "bob", 1)]
    assert bitlake.open_table(path).vacuum().version is None


def test_snapshots_a_caller_holds_never_move(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["k"], delta_column="mod")
    before = t.refresh()
    t.ingest(batch([1], ["ann"], 1))
    after = t.refresh()
    assert (before.version, after.version) == (0, 1) and before is not after and not before.files
    assert t.refresh() is after  # the table did not move: the same snapshot
    with pytest.raises((AttributeError, TypeError)):
        after.files.clear()
    with pytest.raises(dataclasses_frozen()):
        after.version = 7
    with pytest.raises(TypeError):  # the models a snapshot holds are values too
        after.metadata.properties["compact.min_input_files"] = "1"


def dataclasses_frozen():
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_a_compaction_whose_input_a_vacuum_deleted_plans_again(tmp_path):
    path = str(tmp_path / "t")
    t = bitlake.create_table(path, SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2,
                             properties={"compact.min_input_files": "2"})
    for i in range(3):
        t.ingest(batch([10 * i, 10 * i + 1], ["ann", f"u{i}"], 1))
    t.tombstone("user", ["ann"])
    other = bitlake.open_table(path)
    calls = []

    def progress(rows, total):
        if not calls:  # planned, about to read its inputs: a vacuum rewrites them first
            assert other.vacuum().version is not None
        calls.append(rows)

    r = t.compact(progress=progress)
    assert r.version == t.version
    assert sorted(x["k"] for x in t.to_arrow().to_pylist()) == [1, 11, 21]
    assert read_all(path)  # every version reads



def test_a_part_claimed_after_a_long_plan_is_above_every_committed_part(tmp_path, monkeypatch):
    """A vacuum plans for long; meanwhile other writers commit parts and cleanup removes their claims. The part its
    delete batch claims must still be new (it was computed from the plan's old snapshot and overwrote a
    committed segment: a key vanished from the view)."""
    from bitlake.engine.maintain import vacuum as engine_vacuum

    path = str(tmp_path / "t")
    t = bitlake.create_table(path, SCHEMA, primary_key="k", delta_column="mod")
    t.ingest(batch([1, 2], ["ann", "bob"], 1))
    t.tombstone("user", ["ann"])
    other = bitlake.open_table(path)
    prepare = engine_vacuum.prepare

    def slow_prepare(io, state):
        out = prepare(io, state)
        for i in range(3):
            other.ingest(batch([10 + i], ["x"], 5))
        latest = other.refresh()
        for name in other.io.listdir(layout.PARTS_DIR):  # cleanup's rule for claims, its minimum age passed
            if name.isdigit() and int(name) <= latest.max_part:
                other.io.delete(f"{layout.PARTS_DIR}/{name}")
        return out

    monkeypatch.setattr(engine_vacuum, "prepare", slow_prepare)
    t.vacuum()
    assert sorted(r["k"] for r in bitlake.open_table(path).to_arrow().to_pylist()) == [2, 10, 11, 12]
    assert read_all(path)


def test_an_object_store_put_that_failed_may_land_later_so_nothing_is_deleted(tmp_path):
    """A put to an object store that timed out may be applied after the writer looked: the commit's outcome is
    unknown, so its files are kept (cleanup removes them if it never lands)."""
    from bitlake.fs.objectstore import ObjectStoreFileIO

    class TimedOut(ObjectStoreFileIO):
        armed = False

        def put_if_absent(self, rel, data):
            if self.armed and rel.startswith(layout.COMMITS_DIR):
                self.armed = False
                raise StorageError(f"timed out putting {rel}")
            super().put_if_absent(rel, data)

    uri = f"memory:///commit-unknown-{tmp_path.name}"
    bitlake.create_table(uri, SCHEMA, primary_key=["k"], delta_column="mod")
    io = TimedOut(uri)
    t = bitlake.open_table(io)
    io.armed = True
    with pytest.raises(bitlake.CommitStateUnknownError, match="may still land"):
        t.ingest(batch([1], ["ann"], 1), batch_id="b")
    assert [p for p in io.walk("data")], "the landed files are kept"
    assert bitlake.open_table(uri).ingest(batch([1], ["ann"], 1), batch_id="b").committed  # it did not land
