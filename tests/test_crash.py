"""A writer killed (SIGKILL) at each crash point leaves the table readable and exactly as it was
committed; the batch can be retried and commits exactly once; cleanup removes what the dead writer
left behind without changing the view. The same for a restatement: a revert or a replace killed at each
crash point it passes.

Each case crashes a writer process on its own copy of a table that holds one committed batch (two for
compactions and restatements). The crashing processes run up front, a few at a time (an ingesting one
needs its own SparkSession), and the tests then check and repair one table each in the test process.
"""

from __future__ import annotations

import time

import pytest
from oracle import Oracle, rows_key
from writers import harness
from writers.harness import Writer

import bitlake
from bitlake import faults

pytestmark = [pytest.mark.slow, pytest.mark.spark]

B0 = [[k, f"b0#{k}", 10, "upsert"] for k in range(8)]
B1 = [
    [1, "b1#0", 12, "upsert"],  # update
    [2, "b1#1", 5, "upsert"],  # stale: older than b0's record
    [3, "b1#2", 11, "delete"],  # delete
    [9, "b1#3", 1, "upsert"],  # insert of a new key
    [4, "b1#4", 10, "upsert"],  # same delta as b0's record: the later arrival wins
    [3, "b1#5", 9, "upsert"],  # stale
    [5, "b1#6", 11, "delete"],  # applied after the next record (higher delta): delete
    [5, "b1#7", 10, "upsert"],  # update, then deleted by b1#6
    [8, "b1#8", 3, "delete"],  # delete of a key never seen: ignored
]
B2 = [[1, "b2#0", 13, "upsert"], [3, "b2#1", 10, "upsert"], [3, "b2#2", 12, "upsert"], [7, "b2#3", 9, "delete"]]
BATCHES = {"b0": B0, "b1": B1, "b2": B2}
# The new records of b1 in the replace cases.
R1 = [
    [1, "r1#0", 14, "upsert"],  # update (b1's record of key 1 has delta 12)
    [2, "r1#1", 9, "upsert"],  # stale: older than b0's record
    [6, "r1#2", 12, "delete"],  # delete of a key of b0's
    [10, "r1#3", 2, "upsert"],  # insert of a new key
    [3, "r1#4", 10, "upsert"],  # same delta as b0's record: the later arrival wins (b1's delete of key 3 is gone)
    [9, "r1#5", 4, "delete"],  # b1's insert of key 9 is gone: a delete of a key not in the view, ignored
]
REPLACEMENTS = {"b1": R1}

# case -> (crash point, what the writer does): "ingest" (metagen=True), "land" (metagen=False), or
# "metagen" (b1 already landed pending; the writer runs Table.metagen()).
INGEST_POINTS = [p for p in faults.POINTS if p not in ("after_compaction_write", "in_cleanup")]
CASES = {f"ingest-{p}": (p, "ingest") for p in INGEST_POINTS}
CASES["land-after_landing"] = ("after_landing", "land")
CASES["metagen-before_commit"] = ("before_commit", "metagen")
# "compact": b1 is committed; the writer runs Table.compact(), which rewrites both batches' files.
CASES["compact-after_compaction_write"] = ("after_compaction_write", "compact")
CASES["compact-after_commit"] = ("after_commit", "compact")
CASES["major-after_compaction_write"] = ("after_compaction_write", "major")
# "revert" / "replace": b1 is committed; the writer reverts b0 (b1's records stale against b0 become
# accepted) or replaces b1 by R1. Restating writers start no SparkSession.
REVERT_POINTS = ["before_commit", "after_commit"]
REPLACE_POINTS = ["after_claim", "after_landing", "before_commit", "after_commit"]
RESTATE_CASES = [("revert", p) for p in REVERT_POINTS] + [("replace", p) for p in REPLACE_POINTS]
CASES.update({f"{mode}-{p}": (p, mode) for mode, p in RESTATE_CASES})
# "vacuum": b1 is committed, then a tombstone of b0's value "b0#0"; the writer vacuums it.
VACUUM_POINTS = ["before_commit", "after_commit"]
CASES.update({f"vacuum-{p}": (p, "vacuum") for p in VACUUM_POINTS})
PARALLEL_WRITERS = 3


def ingest(table, batch_id, *, metagen=True, spark):
    return table.ingest(harness.batch_table(BATCHES[batch_id]), op_column="op", batch_id=batch_id,
                        metagen=metagen, spark=spark)


def data_files(paths):
    return [p for p in paths if p.startswith(("data/", "_bitlake/keys/"))]


def metadata_files(paths):
    return [p for p in paths if p.startswith(("_bitlake/logs/", "_bitlake/bitmaps/", "_bitlake/keystore/"))]


@pytest.fixture(scope="module")
def crashed(tmp_path_factory, spark):
    """Runs every case's crashing writer; returns case -> (table path, finished Writer)."""
    root = tmp_path_factory.mktemp("crash")
    yield from crash_all(root, CASES, spark, lambda name: root / name)


S3_CASES = {name: CASES[name] for name in
            ["ingest-after_landing", "ingest-before_commit", "ingest-after_commit", "compact-after_commit",
             "revert-after_commit", "replace-after_landing", "vacuum-before_commit", "vacuum-after_commit"]}


@pytest.fixture(scope="module")
def crashed_on_s3(tmp_path_factory, spark, s3_server):
    """The same, for a few cases, with the tables on moto's S3 server."""
    root = tmp_path_factory.mktemp("crash-s3")
    yield from crash_all(root, S3_CASES, spark, lambda name: s3_server.uri(f"crash-{name}"))


# A few cases on emulated Azure and GCS (tests/emulators.py), different ones on each: the tables there, the writers
# reaching them through the variables the emulators export.
EMULATED_CASES = {
    "azure": ["ingest-before_commit", "ingest-after_commit", "vacuum-before_commit"],
    "gcs": ["ingest-before_commit", "ingest-after_commit", "replace-after_landing"],
}


def crashed_on_emulator(store: str, tmp_path_factory, spark):
    from tests import emulators

    server = emulators.azurite() if store == "azure" else emulators.gcs()
    root = tmp_path_factory.mktemp(f"crash-{store}")
    yield from crash_all(root, {name: CASES[name] for name in EMULATED_CASES[store]}, spark,
                         lambda name: server.uri(f"crash-{name}"))


@pytest.fixture(scope="module")
def crashed_on_azure(tmp_path_factory, spark):
    yield from crashed_on_emulator("azure", tmp_path_factory, spark)


@pytest.fixture(scope="module")
def crashed_on_gcs(tmp_path_factory, spark):
    yield from crashed_on_emulator("gcs", tmp_path_factory, spark)


def copy_table(source: bitlake.Table, path) -> bitlake.Table:
    """A byte copy of ``source``'s files at ``path`` (a folder or an object-store URI), at rest."""
    from bitlake.engine.keys.indexsession import close_idle
    from bitlake.fs import file_io

    close_idle()  # this process keeps the key index open after a commit
    target = file_io(str(path))
    for rel in source.io.walk():
        target.write_atomic(rel, source.io.read_bytes(rel))
    return bitlake.open_table(str(path))


def crash_all(root, cases: dict, spark, path_of):
    base = harness.create(path_of("base"), num_buckets=2)
    assert ingest(base, "b0", spark=spark).version == 1
    todo = []
    for name, (point, mode) in cases.items():
        path = path_of(name)
        copy_table(base, path)
        if mode == "metagen":
            r = ingest(bitlake.open_table(str(path)), "b1", metagen=False, spark=spark)
            assert (r.version, r.committed, r.visible) == (2, True, False)
            steps = [{"op": "metagen"}]
        elif mode in ("compact", "major"):
            assert ingest(bitlake.open_table(str(path)), "b1", spark=spark).version == 2
            steps = [{"op": "compact", "major": mode == "major", **({"look_back": 2} if mode == "major" else {})}]
        elif mode == "vacuum":
            t = bitlake.open_table(str(path))
            assert ingest(t, "b1", spark=spark).version == 2 and t.tombstone("v", ["b0#0"]).version == 3
            steps = [{"op": "vacuum"}]
        elif mode in ("revert", "replace"):
            assert ingest(bitlake.open_table(str(path)), "b1", spark=spark).version == 2
            steps = [{"op": "revert", "batch_id": "b0"} if mode == "revert" else
                     {"op": "replace", "batch_id": "b1", "rows": R1}]
        else:
            steps = [{"op": "ingest", "batch_id": "b1", "rows": B1, "metagen": mode == "ingest"}]
        todo.append((name, path, steps, point))
    started: dict[str, tuple] = {}
    try:
        while todo or any(w.running() for _, w in started.values()):
            running = sum(w.running() for _, w in started.values())
            while todo and running < PARALLEL_WRITERS:
                name, path, steps, point = todo.pop(0)
                started[name] = (str(path), Writer(root, name, path, steps, crash_at=point))
                running += 1
            time.sleep(0.2)
        for _, w in started.values():
            w.wait()
        yield started
    finally:
        harness.kill_all([w for _, w in started.values()])


def check_died(writer: Writer, acknowledged: bool = False) -> None:
    """The writer was killed; before, it acknowledged nothing, or (``acknowledged``) at most the one step it was
    killed after."""
    assert writer.proc.returncode == -9, f"expected SIGKILL, got {writer.proc.returncode}:\n{writer.output()}"
    assert len(writer.acks()) <= acknowledged, "a killed writer acknowledged only what it had committed"


def landed_once(table, batch_id) -> int:
    """Asserts ``batch_id`` landed in exactly one commit and was applied exactly once; its version."""
    history = harness.check_log(table)
    landed = [c["version"] for c in history if c["batch_id"] == batch_id]
    assert len(landed) == 1, landed
    assert sum(batch_id in c["processed"] for c in history) <= 1
    return landed[0]


def cleanup_and_check(table, spark, expected_removed: list[str], expected_rows: list[tuple], *,
                      then_ingest: bool = False, after_b2: list[tuple] | None = None) -> None:
    """Cleanup removes exactly the dead writer's files (and segment-part claims); the view stays.
    With ``then_ingest``, a further batch is ingested: MetaGen still finds every key-store file it needs,
    and the view is then ``after_b2`` (default: b0, b1 and b2 applied)."""
    removed = table.cleanup(min_age_seconds=0)
    assert [p for p in removed if not p.startswith("_bitlake/parts/")] == expected_removed
    assert harness.orphans(table) == []
    assert harness.check_view(table, BATCHES, spark, replacements=REPLACEMENTS) == expected_rows
    reopened = bitlake.open_table(table.path)
    assert harness.arrow_rows(reopened) == expected_rows
    assert harness.spark_rows(reopened, spark) == expected_rows
    if then_ingest:
        r = ingest(reopened, "b2", spark=spark)
        assert r.committed and r.visible
        want = after_b2 if after_b2 is not None else harness.oracle([B0, B1, B2])[0]
        assert harness.check_view(reopened, BATCHES, spark, replacements=REPLACEMENTS) == want


@pytest.mark.parametrize("point", INGEST_POINTS)
def test_crash_during_ingest(crashed, spark, point):
    check_crash_during_ingest(crashed, spark, point)


@pytest.mark.s3
@pytest.mark.parametrize("point", ["after_landing", "before_commit", "after_commit"])
def test_crash_during_ingest_on_s3(crashed_on_s3, spark, point):
    check_crash_during_ingest(crashed_on_s3, spark, point)


@pytest.mark.azure
@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
def test_crash_during_ingest_on_azure(crashed_on_azure, spark, point):
    check_crash_during_ingest(crashed_on_azure, spark, point)


@pytest.mark.gcs
@pytest.mark.parametrize("point", ["before_commit", "after_commit"])
def test_crash_during_ingest_on_gcs(crashed_on_gcs, spark, point):
    check_crash_during_ingest(crashed_on_gcs, spark, point)


def check_crash_during_ingest(crashed, spark, point):
    path, writer = crashed[f"ingest-{point}"]
    # The key index takes a commit's entries on a thread while the ingest returns: killed there, the writer may
    # have acknowledged its commit.
    check_died(writer, acknowledged=point == "in_index_update")
    table = bitlake.open_table(path)
    harness.check_log(table)
    committed = point in ("after_commit", "after_checkpoint", "in_index_update", "after_commit_steps")
    if committed:
        assert table.version == 2
        assert landed_once(table, "b1") == 2
        assert table.history()[0]["processed"] == ["b1"]
    else:
        assert table.version == 1
        assert "b1" not in table.state().batches
    harness.check_view(table, BATCHES, spark)

    left = harness.orphans(table)
    if point == "after_landing":
        # The input is taken in and its files are being written (the MetaGen would run meanwhile): some may be
        # there (a local file as it is opened), none on S3, where a file appears whole when it is closed.
        assert not metadata_files(left), left
    elif point == "before_commit":
        assert data_files(left) and metadata_files(left), left
    else:
        assert left == [], left

    r = ingest(table, "b1", spark=spark)
    assert r.version == 2 and r.visible
    assert r.committed is not committed, "a retry of a committed batch is a no-op"
    assert landed_once(table, "b1") == 2 and table.version == 2
    expected = harness.check_view(table, BATCHES, spark)
    assert expected == harness.oracle([B0, B1])[0]
    assert harness.orphans(table) == left, "the retry leaves nothing behind"
    # After a crash inside the index update, the next inline MetaGen must replay that commit.
    cleanup_and_check(table, spark, left, expected, then_ingest=point in ("before_commit", "in_index_update"))


def test_crash_while_landing_a_pending_batch(crashed, spark):
    path, writer = crashed["land-after_landing"]
    check_died(writer)
    table = bitlake.open_table(path)
    assert table.version == 1 and "b1" not in table.state().batches
    before = harness.check_view(table, BATCHES, spark)
    left = harness.orphans(table)
    assert not metadata_files(left), left  # its data files were being written

    r = ingest(table, "b1", metagen=False, spark=spark)
    assert (r.version, r.committed, r.visible) == (2, True, False)
    assert [b.batch_id for b in table.state().pending] == ["b1"]
    assert harness.arrow_rows(table) == before, "a landed batch is not visible before MetaGen"
    r = table.metagen(spark=spark)
    assert (r.version, r.committed, r.visible) == (3, True, True)
    assert table.history()[0]["operation"] == "METAGEN" and table.history()[0]["processed"] == ["b1"]
    assert landed_once(table, "b1") == 2
    assert table.state().pending == []
    expected = harness.check_view(table, BATCHES, spark)
    assert expected == harness.oracle([B0, B1])[0]
    cleanup_and_check(table, spark, left, expected)


def test_crash_during_metagen_of_pending_batch(crashed, spark):
    path, writer = crashed["metagen-before_commit"]
    check_died(writer)
    table = bitlake.open_table(path)
    assert table.version == 2, "the landing commit stays, MetaGen's commit never happened"
    assert [b.batch_id for b in table.state().pending] == ["b1"]
    before = harness.check_view(table, BATCHES, spark)
    assert before == harness.oracle([B0])[0]
    left = harness.orphans(table)
    assert metadata_files(left) and not data_files(left), "the landed data is referenced by its commit"

    r = table.metagen(spark=spark)
    assert (r.version, r.committed, r.visible) == (3, True, True)
    assert landed_once(table, "b1") == 2
    assert table.state().pending == []
    expected = harness.check_view(table, BATCHES, spark)
    assert expected == harness.oracle([B0, B1])[0]
    assert harness.orphans(table) == left
    cleanup_and_check(table, spark, left, expected, then_ingest=True)


@pytest.mark.parametrize("point", ["after_compaction_write", "after_commit"])
def test_crash_during_compaction(crashed, spark, point):
    check_crash_during_compaction(crashed, spark, point)


@pytest.mark.s3
def test_crash_after_compaction_commit_on_s3(crashed_on_s3, spark):
    check_crash_during_compaction(crashed_on_s3, spark, "after_commit")


def check_crash_during_compaction(crashed, spark, point):
    path, writer = crashed[f"compact-{point}"]
    check_died(writer)
    table = bitlake.open_table(path)
    expected = harness.oracle([B0, B1])[0]
    assert harness.check_view(table, BATCHES, spark) == expected
    before = {p for p in harness.orphans(table)}
    if point == "after_compaction_write":
        # The table is at its last commit; the dead compaction's files are leftovers, and a rerun completes it.
        assert table.version == 2 and before and all(p.startswith(("data/c-", "_bitlake/bitmaps/")) for p in before)
        assert table.compact().version == 3
        cleanup_and_check(table, spark, sorted(before), expected, then_ingest=True)
    else:
        # The commit landed: nothing is left over, and a rerun finds nothing worth doing.
        assert table.version == 3 and table.history()[0]["operation"] == "COMPACT" and before == set()
        assert table.compact().version is None
        cleanup_and_check(table, spark, [], expected, then_ingest=True)


def test_crash_during_major_compaction(crashed, spark):
    """A major compaction killed before its commit: no window, no purge; the files it wrote (data, offsets,
    the folded log) are leftovers; a rerun sets the window and purges; then b2 goes on by the contract."""
    path, writer = crashed["major-after_compaction_write"]
    check_died(writer)
    table = bitlake.open_table(path)
    expected = harness.oracle([B0, B1])[0]
    assert table.version == 2 and table.state().window is None
    assert harness.check_view(table, BATCHES, spark) == expected
    before = sorted(harness.orphans(table))
    assert before and all(p.startswith(("data/c-", "_bitlake/bitmaps/", "_bitlake/logs/")) for p in before)
    r = table.compact(major=True, look_back=2)
    assert r.version == 3 and r.purged_rows > 0 and table.state().window.version == 3
    removed = table.cleanup(min_age_seconds=0)
    assert set(before) <= set(removed), "the dead compaction's files go with the expired ones"
    assert harness.orphans(table) == []
    assert harness.arrow_rows(table) == expected
    r = ingest(bitlake.open_table(path), "b2", spark=spark)
    assert r.committed and harness.arrow_rows(bitlake.open_table(path)) == harness.oracle([B0, B1, B2])[0]


def restated_oracle(mode: str, *later: list[list]) -> list[tuple]:
    """The current view, by the oracle directly: b0 (version 1), b1 (2), the revert of b0 or the replace of b1
    by R1 (3), then ``later`` batches (4, ...)."""
    model = Oracle()
    model.apply(harness.records(B0), 1, "b0")
    model.apply(harness.records(B1), 2, "b1")
    if mode == "revert":
        model.revert("b0", 3)
    else:
        model.replace("b1", harness.records(R1), 3)
    for v, rows in enumerate(later, start=4):
        model.apply(harness.records(rows), v)
    return rows_key(model.view(), harness.TABLE_SCHEMA.names)


@pytest.mark.parametrize(("mode", "point"), RESTATE_CASES)
def test_crash_during_restatement(crashed, spark, mode, point):
    check_crash_during_restatement(crashed, spark, mode, point)


@pytest.mark.s3
@pytest.mark.parametrize(("mode", "point"), [("revert", "after_commit"), ("replace", "after_landing")])
def test_crash_during_restatement_on_s3(crashed_on_s3, spark, mode, point):
    check_crash_during_restatement(crashed_on_s3, spark, mode, point)


@pytest.mark.gcs
def test_crash_during_replace_on_gcs(crashed_on_gcs, spark):
    check_crash_during_restatement(crashed_on_gcs, spark, "replace", "after_landing")


def check_crash_during_restatement(crashed, spark, mode, point):
    """A revert of b0 or a replace of b1 killed at a crash point: the table is at its last commit (the
    restatement committed once, or not at all); a retry of the revert is a no-op once it committed, a retry
    otherwise commits it; cleanup removes only the dead writer's files; a later batch goes on by the contract
    (after a kill at ``after_commit`` the key index never heard of the restatement)."""
    path, writer = crashed[f"{mode}-{point}"]
    check_died(writer)
    table = bitlake.open_table(path)
    operation, target = ("REVERT", "b0") if mode == "revert" else ("REPLACE", "b1")
    committed = point == "after_commit"
    history = harness.check_log(table)
    assert [c["version"] for c in history if c["operation"] == operation] == ([3] if committed else [])
    assert table.version == (3 if committed else 2)
    b = table.state().batch(target)
    if not committed:
        assert (b.status, b.live_version, b.restated_version) == ("live", 2 if mode == "replace" else 1, None)
        assert harness.check_view(table, BATCHES, spark) == harness.oracle([B0, B1])[0]
    elif mode == "revert":
        assert (b.status, b.restated_version) == ("reverted", 3)
    else:
        assert (b.status, b.live_version) == ("live", 3), "the new incarnation of b1"
    if committed:
        assert harness.check_view(table, BATCHES, spark, replacements=REPLACEMENTS) == restated_oracle(mode)

    left = harness.orphans(table)
    if point == "after_landing":
        # The input is taken in and its files are being written (the MetaGen would run meanwhile): some may be
        # there (a local file as it is opened), none on S3, where a file appears whole when it is closed.
        assert not metadata_files(left), left
    elif point == "before_commit":
        assert metadata_files(left) and bool(data_files(left)) is (mode == "replace"), left
        assert any(p.startswith("_bitlake/changes/") for p in left), left
    else:
        assert left == [], left

    if mode == "revert":
        r = table.revert_batch("b0")
        assert r.committed is not committed, "a retry of a committed revert is a no-op"
        assert r.version == 3
    elif not committed:
        r = table.replace_batch("b1", harness.batch_table(R1), op_column="op")
        assert r.committed and r.version == 3
    # (A replace is not idempotent: a retry of one that committed would replace b1 again, in a new commit.)
    history = harness.check_log(table)
    assert table.version == 3 and [c["version"] for c in history if c["operation"] == operation] == [3]
    expected = harness.check_view(table, BATCHES, spark, replacements=REPLACEMENTS)
    assert expected == restated_oracle(mode)
    assert harness.orphans(table) == left, "the retry leaves nothing behind"
    cleanup_and_check(table, spark, left, expected, then_ingest=True, after_b2=restated_oracle(mode, B2))


def holding(table, value: str) -> list[str]:
    """The data files under the table path (named by a commit or not) whose rows hold ``value`` in ``v``."""
    import pyarrow.parquet as pq

    return [p for p in table.io.walk("data") if value in pq.read_table(table.io.open_input(p)).column("v").to_pylist()]


@pytest.mark.parametrize("point", VACUUM_POINTS)
def test_crash_during_vacuum(crashed, spark, point):
    check_crash_during_vacuum(crashed, spark, point)


@pytest.mark.s3
@pytest.mark.parametrize("point", VACUUM_POINTS)
def test_crash_during_vacuum_on_s3(crashed_on_s3, spark, point):
    check_crash_during_vacuum(crashed_on_s3, spark, point)


@pytest.mark.azure
def test_crash_during_vacuum_on_azure(crashed_on_azure, spark):
    check_crash_during_vacuum(crashed_on_azure, spark, "before_commit")


def check_crash_during_vacuum(crashed, spark, point):
    """A vacuum killed before its commit leaves the tombstone and the view as they were, and its rewrites for
    cleanup; killed after it, the tombstone is retired and the row in no view, and the files it rewrote (still
    holding the row) go with the next vacuum, or cleanup."""
    path, writer = crashed[f"vacuum-{point}"]
    check_died(writer)
    table = bitlake.open_table(path)
    expected = [row for row in harness.oracle([B0, B1])[0] if row[1] != "b0#0"]
    assert harness.arrow_rows(table) == expected and harness.spark_rows(table, spark) == expected
    assert holding(table, "b0#0"), "the rows are still in a file: the one the vacuum read, or its original"
    if point == "after_commit":
        assert table.version == 4 and table.state().tombstones == []
        assert harness.orphans(table) == holding(table, "b0#0"), "the file it rewrote: no version names it"
        assert table.vacuum().version is None  # nothing to apply: it deletes what the dead vacuum left
    else:
        assert table.version == 3 and len(table.state().tombstones) == 1
        left = harness.orphans(table)
        # Its rewrites, and the batch deleting the erased key (keys file, events, bitmaps, key store, changes).
        assert any(p.startswith("data/") for p in left) and any(p.startswith("_bitlake/keys/") for p in left), left
        assert table.vacuum().version == 4
        assert sorted(p for p in table.cleanup(min_age_seconds=0) if not p.startswith("_bitlake/parts/")) == sorted(left)
    assert holding(table, "b0#0") == [] and harness.orphans(table) == []
    assert "b0#0" not in {r["v"] for r in table.to_arrow(version=1).to_pylist()}, "gone from time travel too"
    assert harness.arrow_rows(table) == expected and harness.spark_rows(bitlake.open_table(path), spark) == expected
