"""Every writer, a fault at every step of the one commit path (bitlake/transaction.py): before each file write,
after each atomic put (a lost answer: the file landed, the writer sees an error), at each named fault point
(bitlake/faults.py) — as an error and as a ``KeyboardInterrupt``. After each fault:

* every file that any commit names exists (but those a vacuum rewrote, which it deletes on purpose);
* the table reads, at every version, as the same operation without the fault left it (if its commit landed)
  or as it was before (if not);
* a retry of an operation whose commit did not land commits exactly once and gives the faultless result; a
  retry of an idempotent one (a batch id) whose commit landed commits nothing;
* cleanup then keeps every version readable.

SIGKILL at the named points is tests/test_crash.py's (a process per case), and test_kill_at_every_point below.
Local disk for every operation and every write; moto's S3 server for the commit path's points and puts of
the operations that write most.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from oracle import rows_key

import bitlake
from bitlake import faults
from bitlake.engine.keys import indexsession
from bitlake.errors import BitlakeError, VersionExpiredError
from bitlake.format import commitlog
from bitlake.fs import LocalFileIO
from bitlake.fs.objectstore import ObjectStoreFileIO

pytestmark = pytest.mark.slow
HERE = str(pathlib.Path(__file__).parent)
FIXTURES = pathlib.Path(HERE) / "fixtures"

SCHEMA = pa.schema([("k", pa.int64()), ("user", pa.string()), ("v", pa.int64()), ("mod", pa.int64())])
UNKEYED = pa.schema([("user", pa.string()), ("v", pa.int64())])


def rows(keys, mod, users=None, ops=None):
    users = users or [("ann", "bob")[k % 2] for k in keys]
    t = pa.table({"k": pa.array(keys, pa.int64()), "user": users, "v": pa.array(keys, pa.int64()),
                  "mod": pa.array([mod] * len(keys), pa.int64())})
    return t.append_column("op", pa.array(ops or ["upsert"] * len(keys)))


def keyed_base(t, *, pending=False, tombstoned=False):
    t.ingest(rows(list(range(8)), 10), op_column="op", batch_id="b0")
    t.ingest(rows([1, 3, 9, 2], 12, ops=["upsert", "upsert", "upsert", "delete"]), op_column="op", batch_id="b1")
    t.ingest(rows([4, 5], 13), op_column="op", batch_id="b2")
    if pending:
        t.ingest(rows([6, 20], 14), op_column="op", batch_id="p", metagen=False)
    if tombstoned:
        t.tombstone("user", ["ann"])


def unkeyed_base(t):
    for i in range(3):
        t.ingest(pa.table({"user": [f"u{i}", f"w{i}"], "v": pa.array([i, 10 + i], pa.int64())}))


# name -> (keyed?, base builder (or a fixture table), the operation, idempotent: a retry after it landed commits
# nothing)
OPERATIONS = {
    "ingest": (True, keyed_base, lambda t: t.ingest(rows([1, 30], 15), op_column="op", batch_id="x"), True),
    "land": (True, keyed_base, lambda t: t.ingest(rows([1, 30], 15), op_column="op", batch_id="x", metagen=False),
             True),
    "metagen": (True, lambda t: keyed_base(t, pending=True), lambda t: t.metagen(), True),
    "revert": (True, keyed_base, lambda t: t.revert_batch("b1"), True),
    "replace": (True, keyed_base, lambda t: t.replace_batch("b1", rows([3, 31], 16), op_column="op"), False),
    "tombstone": (True, keyed_base, lambda t: t.tombstone("user", ["bob"]), False),
    "vacuum": (True, lambda t: keyed_base(t, tombstoned=True), lambda t: t.vacuum(), True),
    "delete": (True, keyed_base, lambda t: t.delete(pc.field("v") > 4), True),
    "update": (True, keyed_base, lambda t: t.update(pc.field("v") > 4, {"user": "'zed'"}), False),
    "merge": (True, keyed_base, lambda t: t.merge(rows([3, 40], 17).drop_columns(["op"]))
              .when_matched_update_all().when_not_matched_insert_all().execute(), False),
    "compact": (True, keyed_base, lambda t: t.compact(), False),
    "major": (True, keyed_base, lambda t: t.compact(major=True, look_back=2), False),
    "cleanup": (True, lambda t: (keyed_base(t), t.compact(major=True, look_back=3)),
                lambda t: t.cleanup(min_age_seconds=0), True),
    "properties": (True, keyed_base, lambda t: t.set_properties({"compact.min_input_files": "3"}), False),
    "add_columns": (True, keyed_base, lambda t: t.add_columns([pa.field("extra", pa.string())]), False),
    "upgrade": (True, "v1/keyed", lambda t: t.upgrade(), True),
    "unkeyed-delete": (False, unkeyed_base, lambda t: t.delete(pc.field("v") >= 10), True),
    "unkeyed-update": (False, unkeyed_base, lambda t: t.update(pc.field("v") >= 10, {"v": pa.scalar(7, pa.int64())}),
                       True),
}


class Injected(BitlakeError):
    """The fault these tests inject (a store's failure)."""


class Faulty:
    """A store (mixed into a FileIO class) that raises ``error`` "before" its ``at``-th write (put, atomic write,
    output stream, delete) or "after" its ``at``-th atomic put landed (a lost answer); counts both."""

    def __init__(self, base: str, at: int | None = None, when: str = "before", error: BaseException | None = None):
        super().__init__(base)
        self.at, self.when, self.error = at, when, error
        self.writes = 0
        self.puts = 0
        self.fired = False
        self._lock = threading.Lock()

    def _step(self, atomic: bool) -> bool:
        """Counts a write; raises before it, or returns True when it must raise after it."""
        with self._lock:
            self.writes += 1
            self.puts += atomic
            n = self.writes if self.when == "before" else self.puts if atomic else None
            hit = not self.fired and n == self.at
            self.fired |= hit
        if hit and self.when == "before":
            raise self.error
        return hit

    def put_if_absent(self, rel, data):
        after = self._step(True)
        super().put_if_absent(rel, data)
        if after:
            raise self.error

    def write_atomic(self, rel, data):
        after = self._step(True)
        super().write_atomic(rel, data)
        if after:
            raise self.error

    def open_output(self, rel):
        self._step(False)
        return super().open_output(rel)

    def delete(self, rel):
        self._step(False)
        super().delete(rel)


class FaultyLocal(Faulty, LocalFileIO):
    pass


class FaultyObjectStore(Faulty, ObjectStoreFileIO):
    pass


class Local:
    """Tables in folders under ``root``."""

    faulty, plain = FaultyLocal, LocalFileIO

    def __init__(self, root):
        self.root = root

    def new(self, name: str) -> str:
        return str(self.root / name)

    def copy(self, src: str, name: str) -> str:
        indexsession.close_idle()
        dst = self.new(name)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("index", "index.lock"))
        return dst

    def remove(self, path: str) -> None:
        shutil.rmtree(path)


class S3:
    """Tables under fresh prefixes of moto's S3 bucket."""

    faulty, plain = FaultyObjectStore, ObjectStoreFileIO

    def __init__(self, server):
        self.server = server

    def new(self, name: str) -> str:
        return self.server.uri(name)

    def copy(self, src: str, name: str) -> str:
        indexsession.close_idle()
        dst = self.new(name)
        source, target = ObjectStoreFileIO(src), ObjectStoreFileIO(dst)
        for rel in source.walk():
            target.write_atomic(rel, source.read_bytes(rel))
        return dst

    def remove(self, path: str) -> None:
        io = ObjectStoreFileIO(path)
        for rel in io.walk():
            io.delete(rel)


def views(path) -> dict:
    """The views of the table's last three versions (that every file of every version is there, named_files
    checks)."""
    t = bitlake.open_table(path)
    out = {}
    for v in range(max(t.version - 2, 0), t.version + 1):
        try:
            view = t.to_arrow(version=v)
            out[v] = rows_key(view.to_pylist(), view.column_names)
        except VersionExpiredError:
            out[v] = "expired"
    return out


def named_files(path) -> set[str]:
    """Every file a commit of the table names, but those a vacuum rewrote (it deletes them on purpose) and those of
    commits up to a retention window's start (expired: cleanup deletes them; the views read the versions)."""
    t = bitlake.open_table(path)
    state = t.refresh()
    out: set[str] = set()
    start = state.window.version + 1 if state.window else 0
    for v in range(max(start, bitlake.format.state.earliest_version(t.io)), state.version + 1):
        c = commitlog.read(t.io, v)
        out.update(f.path for f in c.add_files)
        out.update(f.offsets for f in c.add_files if f.offsets)
        out.update(f.path for b in c.batches for f in b.keys_files)
        out.update(f.path for f in c.logs)
        out.update(p for s in c.segments for p in (s.bitmap, s.delta) if p)
        out.update(f.path for f in c.keystore_add)
        out.update(tb.path for tb in c.tombstones)
        out.update(f.path for f in c.change_files)
        out.update(f.path for f in c.purged)
        out.update(p for r in c.rewrites if r.to for p in (r.to.path, r.to.offsets) if p)
    return out - set(state.rewritten)


def reference(store, name: str) -> dict:
    """An operation's base table, the views before and after it ran without a fault, and its writes."""
    keyed, build, op, _ = OPERATIONS[name]
    base = store.new(f"{name}-base")
    if isinstance(build, str):  # a table written by an earlier bitlake (tests/fixtures)
        shutil.copytree(FIXTURES / build, base)
    else:
        kw = dict(primary_key=["k"], delta_column="mod", num_buckets=2) if keyed else {}
        t = bitlake.create_table(base, SCHEMA if keyed else UNKEYED,
                                 properties={"compact.min_input_files": "2", "checkpoint.interval": "5"}, **kw)
        build(t)
    ref = store.copy(base, f"{name}-ref")
    io = store.faulty(ref)
    reached, point = [], faults.point
    faults.point = lambda where: (reached.append(where), point(where))
    try:
        op(bitlake.open_table(io))
    finally:
        faults.point = point
    indexsession.close_idle()
    return {"base": base, "before": views(base), "after": views(ref), "writes": io.writes, "puts": io.puts,
            "version": bitlake.open_table(base).version, "points": sorted(set(reached))}


def cases(name: str) -> list[tuple[str, str]]:
    """(where, error) of one operation: each named point, before each write (an error), after each atomic put (an
    error: a lost answer, and an interrupt). A key index update runs on a thread after the commit, where no
    interrupt arrives (signals go to the main thread)."""
    out = [(f"point:{p}", e) for p in faults.POINTS for e in ("error", "interrupt")
           if not (p == "in_index_update" and e == "interrupt")]
    return out + [("write:before", "error"), ("write:after", "error"), ("write:after", "interrupt")]


def error_of(kind: str) -> BaseException:
    return Injected("injected fault") if kind == "error" else KeyboardInterrupt()


def check(ref: dict, path: str, name: str, case: str) -> None:
    _, _, op, idempotent = OPERATIONS[name]
    name = f"{name} {case}"
    io = bitlake.open_table(path).io
    missing = sorted(p for p in named_files(path) if not io.exists(p))
    assert missing == [], f"{name}: files a commit names are gone"
    landed = bitlake.open_table(path).version > ref["version"]
    assert views(path) == (ref["after"] if landed else ref["before"]), f"{name}: not as at its last commit"
    if not landed:
        op(bitlake.open_table(path))
        assert views(path) == ref["after"], f"{name}: the retry does not give the faultless result"
    elif idempotent:
        version = bitlake.open_table(path).version
        op(bitlake.open_table(path))
        assert bitlake.open_table(path).version == version, f"{name}: the retry committed again"
    indexsession.close_idle()
    bitlake.open_table(path).cleanup(min_age_seconds=0)
    assert views(path) == ref["after"], f"{name}: cleanup changed a view"


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """Tables in local folders, and each operation's reference, made once for the module's tests."""
    store = Local(tmp_path_factory.mktemp("faults"))
    refs: dict[str, dict] = {}

    def ref(name: str) -> dict:
        if name not in refs:
            refs[name] = reference(store, name)
        return refs[name]

    return store, ref


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_a_fault_at_every_step_keeps_the_table(local, name):
    store, ref = local
    run_cases(store, name, cases(name), ref(name))


S3_CASES = [(f"point:{p}", "error") for p in faults.POINTS] + [
    ("point:before_commit", "interrupt"), ("point:after_commit", "interrupt"), ("write:after", "error")]


@pytest.mark.s3
@pytest.mark.parametrize("name", ["ingest", "vacuum"])
def test_a_fault_in_the_commit_path_on_s3_keeps_the_table(s3_server, name):
    """On S3 (each copy of a table costs a request a file: a subset), the commit path's points and a lost answer
    to each atomic put; the writes before them are the same code through another FileIO."""
    store = S3(s3_server)
    run_cases(store, name, S3_CASES, reference(store, name))


def run_cases(store, name: str, chosen: list[tuple[str, str]], ref: dict) -> None:
    op = OPERATIONS[name][2]
    n = 0
    for where, kind in chosen:
        steps = [None] if where.startswith("point:") else range(1, ref["writes" if where == "write:before" else "puts"] + 1)
        for at in steps:
            n += 1
            path = store.copy(ref["base"], f"{name}-c{n}")
            error = error_of(kind)
            if where.startswith("point:"):
                with faults.inject(where[6:], error):
                    _run(op, store.plain(path), error)
            else:
                _run(op, store.faulty(path, at, where[6:], error), error)
            indexsession.close_idle()
            check(ref, path, name, f"{where} {kind} at write {at}")
            store.remove(path)
    assert ref["writes"] > 0 and n >= len(chosen)


KILLER = """
import sys
sys.path[:0] = sys.argv[3:]
from test_faults import OPERATIONS
import bitlake
OPERATIONS[sys.argv[1]][2](bitlake.open_table(sys.argv[2]))
"""


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_a_writer_killed_at_every_point_keeps_the_table(local, name):
    """SIGKILL (BITLAKE_CRASH_AT) at every named point the operation passes, a process each, two at a time."""
    store, references = local
    ref = references(name)
    killed = {}
    for point in ref["points"]:
        path = store.copy(ref["base"], f"{name}-killed-{point}")
        env = {**os.environ, "BITLAKE_CRASH_AT": point}
        killed[point] = (path, subprocess.Popen([sys.executable, "-c", KILLER, name, path, *sys.path[:3]], env=env,
                                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=HERE))
        if len(killed) % 2 == 0:
            for _, p in list(killed.values())[-2:]:
                p.wait()
    for point, (path, process) in killed.items():
        out = process.communicate()[0].decode()
        assert process.returncode == -signal.SIGKILL, f"{name} at {point}: {out}"
        check(ref, path, name, f"killed at {point}")
    assert ref["points"], f"{name} passes no fault point"


def _run(op, io, error) -> None:
    try:
        op(bitlake.open_table(io))
    except (Injected, KeyboardInterrupt, bitlake.CommitStateUnknownError) as e:
        assert e is error or e.__cause__ is error or isinstance(e, bitlake.CommitStateUnknownError)
