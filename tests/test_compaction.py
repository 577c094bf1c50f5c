"""Minor compaction: files rewritten with every row and row id kept; every view at every version and event
time, and every change range, reads the same after it; the current view reads current files whole."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import bitlake
from bitlake.cli import main as cli
from bitlake.engine.read import plan as planner
from bitlake.format import bitmap, datafile, rowid
from tests import spec_reader
from tests.oracle import rows_key

SCHEMA = pa.schema([("k", pa.int64()), ("grp", pa.string()), ("value", pa.int64()), ("mod", pa.int64())])
COLUMNS = SCHEMA.names
TIMES = [None, 0, 3, 6, 12, 30]


def batch(keys, mod, value, op="upsert"):
    return pa.table({"k": pa.array(keys, pa.int64()), "grp": [f"g{k % 2}" for k in keys],
                     "value": pa.array([value + k for k in keys], pa.int64()), "mod": pa.array([mod] * len(keys), pa.int64()),
                     "op": [op] * len(keys)})


def churned(path, **options):
    """A table of several batches: inserts, updates, deletes, a stale record and one batch left pending."""
    t = bitlake.create_table(path, SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2,
                             properties={"compact.min_input_files": "2"}, **options)
    t.ingest(batch(range(40), 1, 0), op_column="op", batch_id="b0")
    t.ingest(batch(range(0, 40, 3), 5, 100), op_column="op", batch_id="b1")
    t.ingest(batch(range(1, 40, 7), 8, 0, "delete"), op_column="op", batch_id="b2")
    t.ingest(batch([2, 3, 50], 2, 900), op_column="op", batch_id="b3")  # 2 and 3: older than b0/b1: stale
    t.ingest(batch(range(0, 40, 5), 10, 200), op_column="op", batch_id="b4")
    t.ingest(batch([4, 60], 20, 300), op_column="op", batch_id="pending", metagen=False)
    return t


def views(t, upto: int) -> dict:
    return {(v, at): rows_key(t.to_arrow(version=v, valid_at=at).to_pylist(), COLUMNS)
            for v in range(upto + 1) for at in TIMES}


def changes(t, spark, start: int, end: int) -> list[tuple]:
    df = t.changes(spark, starting_version=start + 1, ending_version=end)
    return sorted((r["_change_type"], r["_commit_version"], *(r[c] for c in COLUMNS)) for r in df.collect())


def check_offsets(t) -> None:
    """Each compacted file's offsets bitmap file names exactly the row ids the file holds."""
    for f in t.state().data_files():
        if f.offsets is None:
            continue
        rows = datafile.read_data(t.io, f.path, t.metadata, list(rowid.ROW_ID_COLUMNS))
        held: dict = {}
        for p, s, o in zip(*(rows.column(c).to_pylist() for c in rowid.ROW_ID_COLUMNS), strict=True):
            held.setdefault((p, s), set()).add(o)
        named = {seg: set(bm) for seg, bm in bitmap.BitmapCache(t.io).file(f.offsets).items()}
        assert named == held, f.path
        assert {r.segment: r.rows for r in f.segments} == {seg: len(o) for seg, o in held.items()}


@pytest.mark.spark
@pytest.mark.parametrize("options", [{}, {"partition_by": ["grp"]}, {"file_format": "orc"}], ids=str)
def test_compaction_keeps_every_view_and_change(tmp_path, spark, options):
    t = churned(str(tmp_path / "t"), **options)
    before_version = t.version
    before = views(t, before_version)
    feed = {(s, e): changes(t, spark, s, e) for s, e in [(0, before_version), (2, 4), (4, before_version)]}
    files_before = len(t.state().data_files())

    r = t.compact()
    assert r.version == before_version + 1 and r.removed_files > 1
    removed = [f for f in t.state(before_version).data_files() if f.path not in t.state().files]
    assert len(removed) == r.removed_files and r.current_rows + r.history_rows == sum(f.rows for f in removed)
    assert t.state().batch("pending").part not in {s.part for f in removed for s in f.segments}
    assert t.history()[0]["operation"] == "COMPACT"
    check_offsets(t)
    assert len(t.state().data_files()) < files_before
    assert views(t, before_version) == before, "every past view reads the same rows"
    assert {(None if at is None else at): rows for (v, at), rows in views(t, t.version).items()
            if v == t.version} == {at: before[(before_version, at)] for at in TIMES}
    for (s, e), expected in feed.items():
        assert changes(t, spark, s, e) == expected, (s, e)
    assert changes(t, spark, before_version, t.version) == [], "a compaction changes nothing"
    # tests/spec_reader.py, written from docs/FORMAT.md alone (it ignores `offsets`), reads the same.
    for v in (before_version, t.version):
        for at in TIMES:
            got = rows_key(spec_reader.read_view(t.path, version=v, valid_at=at), COLUMNS)
            assert got == before[(before_version, at)], (v, at)
    assert rows_key(spec_reader.read_changes(t.path, 0, t.version), COLUMNS + ["_change_type"]) == rows_key(
        [r.asDict() for r in t.changes(spark, starting_version=1).collect()], COLUMNS + ["_change_type"])
    got = [r.asDict() for r in t.to_spark(spark).collect()]
    assert rows_key(got, COLUMNS) == before[(before_version, None)]

    # The current view reads the current files whole and skips the history files.
    p = planner.plan(t.io, t.state())
    assert not p.filtered
    compacted = {f.path for f in t.state().data_files() if f.offsets}
    read = compacted & {f.path for f in p.whole}
    partitions = 2 if options.get("partition_by") else 1
    assert (len(compacted), len(read)) == (2 * partitions, partitions), "current files whole, history files skipped"

    # MetaGen of the pending batch and later batches go on as usual, and a second compaction takes the
    # compacted files that now hold superseded rows.
    t.metagen()
    t.ingest(batch(range(0, 40, 2), 30, 500), op_column="op", batch_id="b5")
    after = views(t, t.version)
    r2 = t.compact()
    assert r2.version == t.version and r2.removed_files >= 1
    assert views(t, t.version - 1) == after
    check_offsets(t)
    for _ in range(3):  # size tiers may take another round; then a compacted table is left as it is
        if t.compact().version is None:
            break
    else:
        raise AssertionError("compaction does not converge")
    check_offsets(t)
    assert views(t, r2.version - 1) == after
    assert rows_key(t.to_arrow().to_pylist(), COLUMNS) == after[(r2.version - 1, None)]


def test_nothing_to_compact_and_dry_run(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["k"], delta_column="mod",
                             properties={"compact.min_input_files": "2"})
    t.ingest(batch(range(10), 1, 0), op_column="op")
    assert t.compact().version is None and t.compact(dry_run=True)["files"] == 0
    t.ingest(batch(range(10, 20), 1, 0), op_column="op")
    plan = t.compact(dry_run=True)
    assert plan == {"files": 2, "rows": 20, "bytes": plan["bytes"], "partitions": 1, "log_files": 0} and t.version == 2
    assert t.compact().version == 3 and len(t.state().data_files()) == 1


def test_unkeyed_table_compaction(tmp_path):
    schema = pa.schema([("x", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema)
    for i in range(4):
        t.ingest(pa.table({"x": pa.array(range(i * 5, i * 5 + 5), pa.int64())}))
    r = t.compact()
    assert (r.removed_files, r.added_files, r.current_rows, r.history_rows) == (4, 1, 20, 0)
    assert sorted(t.to_arrow().column("x").to_pylist()) == list(range(20))
    assert sorted(t.to_arrow(version=2).column("x").to_pylist()) == list(range(10))


def test_target_file_size_splits_the_output(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["k"], delta_column="mod")
    for i in range(4):
        t.ingest(batch(range(i * 500, i * 500 + 500), 1, 0), op_column="op")
    per_file = t.state().data_files()[0].bytes
    r = t.compact(target_file_bytes=2 * per_file)
    assert r.added_files == 2
    assert t.to_arrow().num_rows == 2000


def test_output_files_are_balanced_by_the_bytes_written(tmp_path, monkeypatch):
    """The output is split into files of equal size measured on the row groups written: 1.5 targets of rows
    make two files of about 0.75, not a full one and a half one."""
    monkeypatch.setattr(datafile, "ROW_GROUP_ROWS", 400)
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["k"], delta_column="mod")
    for i in range(6):
        t.ingest(batch(range(i * 1000, i * 1000 + 1000), 1, 0), op_column="op")
    assert t.compact(target_file_bytes=1 << 40).added_files == 1
    whole = t.state().data_files()[0].bytes  # the 6000 rows in one file
    for i in range(6):  # the same keys again: six small files of current rows, 1.5 targets together
        t.ingest(batch(range(i * 1000, i * 1000 + 1000), 2, 0), op_column="op")
    r = t.compact(target_file_bytes=int(whole / 1.5))
    new = [f for f in t.state().data_files() if f.path not in t.state(t.version - 1).files]
    assert r.current_rows == 6000 and len(new) == 2
    assert all(0.4 * whole <= f.bytes <= 0.6 * whole for f in new), ([f.bytes for f in new], whole)


def test_the_compact_command(tmp_path, capsys):
    t = churned(str(tmp_path / "t"))
    assert cli(["compact", t.path, "--dry-run"]) == 0
    assert "would rewrite" in capsys.readouterr().out and t.history()[0]["operation"] != "COMPACT"
    assert cli(["compact", t.path]) == 0
    assert "rewritten into" in capsys.readouterr().out and t.history()[0]["operation"] == "COMPACT"
    while t.compact(dry_run=True)["files"]:  # size tiers may take another round
        t.compact()
    assert cli(["compact", t.path]) == 0
    assert "nothing to compact" in capsys.readouterr().out
    assert cli(["compact", t.path, "--major", "--look-back", "2"]) == 0
    out = capsys.readouterr().out
    assert "purged" in out and "retention window: versions from 2, event times from 5" in out


def test_small_files_merge_by_size_tiers(tmp_path):
    """Four small batches merge into one file; a few tiny ones later wait for a tier of their own instead of
    rewriting the big file each time; the fourth one makes a tier."""
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["k"], delta_column="mod")
    for i in range(4):
        t.ingest(batch(range(i * 500, i * 500 + 500), 1, 0), op_column="op")
    assert t.compact().removed_files == 4
    big = t.state().data_files()[0].path
    for i in range(3):
        t.ingest(batch([10_000 + i], 1, 0), op_column="op")
        assert t.compact().version is None
    t.ingest(batch([20_000], 1, 0), op_column="op")
    r = t.compact()
    assert r.removed_files == 4 and big in t.state().files
    assert t.to_arrow().num_rows == 2004


def inside(window, v, at) -> bool:
    return v >= window.version and (at is None or at >= window.watermark)


def test_unkeyed_major_compaction_keeps_rows_removed_inside_the_window(tmp_path):
    """An unkeyed table's revert, replace and DML remove rows by their bitmaps alone (no log event dates them): a
    major compaction purges only the rows already gone at the window's start, so every version and change range
    inside the window reads as before it, cleanup included."""
    import pyarrow.compute as pc

    schema = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema)
    t.ingest(pa.table({"k": [1, 2], "v": [1, 2]}, schema=schema), batch_id="a")
    t.ingest(pa.table({"k": [4, 5], "v": [4, 5]}, schema=schema), batch_id="d")
    t.delete(pc.field("k") == 5)  # v3: gone before the window's start, purged
    t.ingest(pa.table({"k": [8], "v": [8]}, schema=schema), batch_id="e")
    t.revert_batch("d")  # v5
    t.replace_batch("a", pa.table({"k": [7], "v": [7]}, schema=schema))  # v6
    t.update(pc.field("k") == 8, {"v": pc.field("v") + 1})  # v7

    def feed():
        return sorted((r["k"], r["v"], r["_change_type"], r["_commit_version"])
                      for r in t.changes_to_arrow(starting_version=5).to_pylist())

    views = {v: sorted(map(tuple, (r.values() for r in t.to_arrow(version=v).to_pylist()))) for v in range(4, 8)}
    changes = feed()
    assert (1, 1, "delete", 6) in changes and (8, 8, "update_preimage", 7) in changes
    r = t.compact(major=True, look_back=4)
    assert r.purged_rows == 1  # k 5's row, deleted at version 3
    t.cleanup(min_age_seconds=0)
    assert feed() == changes
    for v, rows in views.items():
        assert sorted(map(tuple, (r.values() for r in t.to_arrow(version=v).to_pylist()))) == rows, v



@pytest.mark.spark
@pytest.mark.parametrize("options", [{}, {"partition_by": ["grp"]}], ids=str)
def test_major_compaction_keeps_the_window_and_purges_the_rest(tmp_path, spark, options):
    t = churned(str(tmp_path / "t"), **options)
    t.metagen()
    t.ingest(batch(range(0, 40, 2), 30, 500), op_column="op", batch_id="b5")
    latest = t.version
    before = views(t, latest)
    feeds = {s: changes(t, spark, s, latest) for s in (4, 6)}
    stored = t.describe()["stored_rows"]

    r = t.compact(major=True, look_back=4)
    window = t.state().window
    # Version 4 made b0-b3 live; the largest delta committed by it is b2's deletes at 8.
    assert (window.version, window.watermark) == (4, 8) and r.purged_rows > 0
    assert t.describe()["stored_rows"] == stored - r.purged_rows
    check_offsets(t)
    for (v, at), rows in before.items():
        if inside(window, v, at):
            assert rows_key(t.to_arrow(version=v, valid_at=at).to_pylist(), COLUMNS) == rows, (v, at)
        else:
            with pytest.raises(bitlake.VersionExpiredError, match="before the retention window"):
                t.to_arrow(version=v, valid_at=at)
    with pytest.raises(bitlake.VersionNotFoundError):  # the subclass callers already catch
        t.to_spark(spark, version=3)
    with pytest.raises(bitlake.VersionExpiredError, match="starting_version 4 is before the retention window"):
        t.changes(spark, starting_version=4)
    for s, expected in feeds.items():
        assert changes(t, spark, s, latest) == expected
        assert rows_key(spec_reader.read_changes(t.path, s, t.version), COLUMNS + ["_change_type"]) == rows_key(
            [r.asDict() for r in t.changes(spark, starting_version=s + 1).collect()], COLUMNS + ["_change_type"])
    for v in (4, latest, t.version):
        for at in (12, 30, None):
            assert rows_key(spec_reader.read_view(t.path, version=v, valid_at=at), COLUMNS) == before[
                (min(v, latest), at)]

    # Expiry: cleanup removes what only expired versions read; every read inside the window stays. The keys files of
    # batches made live before the window go, but for those the key store lists (b2's: a batch of deletes alone,
    # docs/FORMAT.md "Keys files as entries").
    state = t.state()
    listed = {f.path for files in state.keystore.values() for f in files}
    expired = {f.path for b in state.parts.values() if b.live_version is not None and b.live_version < window.version
               for f in b.keys_files}
    assert expired & listed == {f.path for f in state.batch("b2").keys_files}
    removed = set(t.cleanup(min_age_seconds=0))
    assert expired - listed <= removed and not expired & listed & removed
    assert all(t.io.exists(p) for p in listed)
    for (v, at), rows in before.items():
        if inside(window, v, at):
            assert rows_key(t.to_arrow(version=v, valid_at=at).to_pylist(), COLUMNS) == rows, (v, at)
    assert rows_key([r.asDict() for r in t.to_spark(spark, version=5, valid_at=12).collect()], COLUMNS) == before[
        (5, 12)]
    for s, expected in feeds.items():
        assert changes(t, spark, s, latest) == expected

    # The contract holds for what comes next: a late record of key 1, deleted at 8 (before the window's
    # watermark), does not bring it back; a later one does.
    r1 = t.ingest(batch([1], 3, 7), op_column="op", batch_id="late")
    assert r1.counts["stale"] == 1 and 1 not in {row["k"] for row in t.to_arrow().to_pylist()}
    t.ingest(batch([1], 40, 7), op_column="op", batch_id="later")
    assert 1 in {row["k"] for row in t.to_arrow().to_pylist()}
    # The same window keeps the late stale record: its batch was made live inside the window, where a revert
    # may yet make it accepted; a window past that batch purges it, and then nothing more is due.
    current = rows_key(t.to_arrow().to_pylist(), COLUMNS)
    assert t.compact(major=True, look_back=4).purged_rows == 0
    assert t.compact(major=True, look_back=t.version).purged_rows >= 1
    assert t.compact(major=True, look_back=t.version - 1).version is None
    assert rows_key(t.to_arrow().to_pylist(), COLUMNS) == current


def test_a_window_at_the_latest_version_releases_storage(tmp_path):
    t = churned(str(tmp_path / "t"))
    t.metagen()
    current = rows_key(t.to_arrow().to_pylist(), COLUMNS)
    data_before = sum(f.bytes for f in t.state().data_files())
    w = t.version
    r = t.compact(major=True, look_back="0s")
    assert t.state().window.version == r.version, "the window starts at the compaction's own version"
    with pytest.raises(bitlake.VersionExpiredError):
        t.to_arrow(version=w - 1)
    removed = t.cleanup(min_age_seconds=0)
    # The look-back's version w still reads (as the compaction's commit, which reads the same), change
    # ranges from it too, after cleanup released the files the compaction replaced.
    assert rows_key(t.to_arrow(version=w).to_pylist(), COLUMNS) == current
    assert t.changes_to_arrow(starting_version=w + 1).num_rows == 0
    left = [p for p in t.io.walk("data")]
    assert sorted(left) == sorted(f.path for f in t.state().data_files()) and removed
    assert sum(f.bytes for f in t.state().data_files()) < data_before
    assert rows_key(t.to_arrow().to_pylist(), COLUMNS) == current
    assert t.compact(major=True, look_back="0s").version is None, "nothing more to purge or move"


def test_look_back_forms(tmp_path):
    import datetime as dt

    t = churned(str(tmp_path / "t"))
    with pytest.raises(bitlake.InvalidInputError, match="look_back version 99"):
        t.compact(major=True, look_back=99)
    with pytest.raises(bitlake.InvalidInputError, match="look_back must be"):
        t.compact(major=True, look_back=True)
    assert t.compact(major=True, look_back="7d").version is not None  # every version is younger: window 0
    assert t.state().window.version == 0
    t.compact(major=True, look_back=dt.datetime.now(dt.UTC).isoformat())
    assert t.state().window.version == t.version
    t.compact(major=True, look_back=1)
    assert t.state().window.version == t.version, "a window never moves back"
    other = churned(str(tmp_path / "other"))
    other.set_properties({"compact.look_back": "3"})  # the default window, as a version
    other.compact(major=True)
    assert other.state().window.version == 3


@pytest.mark.spark
def test_log_files_are_regrouped_keeping_every_view_and_change(tmp_path, spark):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2,
                             properties={"compact.min_log_files": "3", "compact.min_input_files": "100",
                                         "compact.invalid_fraction": "1"})
    t.ingest(batch(range(40), 1, 0), op_column="op", batch_id="b0")
    for i in range(1, 7):
        t.ingest(batch(range(i, 40, 5), 2 * i + 1, 10 * i), op_column="op", batch_id=f"u{i}")
        t.ingest(batch([30 + i], 2 * i + 2, 0, "delete"), op_column="op", batch_id=f"d{i}")
    latest = t.version
    before = views(t, latest)
    feed = {(s, e): changes(t, spark, s, e) for s, e in [(0, latest), (3, 8), (6, latest)]}
    logs_before = len(t.state().logs)

    assert t.compact(dry_run=True)["log_files"] >= 3
    r = t.compact()
    assert r.version == latest + 1 and r.removed_files == 0, "no data file was worth rewriting: logs only"
    regrouped = [f for _, f in t.state().logs if f.versions is not None]
    assert len(regrouped) == 1 and len(t.state().logs) < logs_before
    assert views(t, latest) == before
    assert {(v, at): rows_key(t.to_arrow(valid_at=at).to_pylist(), COLUMNS) for v in [latest] for at in TIMES} == {
        (latest, at): before[(latest, at)] for at in TIMES}
    for (s, e), rows in feed.items():
        assert changes(t, spark, s, e) == rows
    assert changes(t, spark, 0, t.version) == feed[(0, latest)], "the compaction itself changes nothing"
    for at in TIMES:
        assert rows_key(spec_reader.read_view(t.path, valid_at=at), COLUMNS) == before[(latest, at)]
    for s in (0, 3):
        assert rows_key(spec_reader.read_changes(t.path, s, t.version), COLUMNS + ["_change_type"]) == rows_key(
            [r.asDict() for r in t.changes(spark, starting_version=s + 1).collect()], COLUMNS + ["_change_type"])

    # A major compaction whose window starts inside the regrouped versions keeps every read inside it.
    m = t.compact(major=True, look_back=6)
    assert m.version == t.version
    for (v, at), rows in before.items():
        if inside(t.state().window, v, at):
            assert rows_key(t.to_arrow(version=v, valid_at=at).to_pylist(), COLUMNS) == rows, (v, at)
            assert rows_key(t.to_arrow(valid_at=at).to_pylist(), COLUMNS) == before[(latest, at)], at
    assert changes(t, spark, 6, t.version) == feed[(6, latest)]


@pytest.mark.parametrize("restatement", ["revert", "replace"])
def test_a_major_compaction_overtaken_by_a_restatement_plans_again(tmp_path, restatement):
    """A revert or replace that commits while a major compaction writes may make valid again a row the
    compaction's purge leaves out: the compaction plans again on the new state instead of committing a window
    without that row."""
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("d", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["k"], delta_column="d", num_buckets=2)
    t.ingest(pa.table({"k": [1, 2], "v": [10, 20], "d": [1, 1]}, schema=schema), batch_id="a")
    t.ingest(pa.table({"k": [1], "v": [11], "d": [2]}, schema=schema), batch_id="b")  # supersedes k=1 v=10
    t.ingest(pa.table({"k": [3], "v": [30], "d": [3]}, schema=schema), batch_id="c")
    other = bitlake.open_table(t.path)
    done = []

    def progress(rows, total):
        if not done:  # the purge is planned; another writer commits before the compaction does
            done.append(other.revert_batch("b") if restatement == "revert" else
                        other.replace_batch("b", pa.table({"k": [9], "v": [90], "d": [9]}, schema=schema)))

    r = t.compact(major=True, look_back=3, progress=progress)
    assert r.version == t.version and t.state().window is not None
    expected = [(1, 10, 1), (2, 20, 1), (3, 30, 3)] + ([(9, 90, 9)] if restatement == "replace" else [])
    assert sorted(tuple(x.values()) for x in t.to_arrow().to_pylist()) == expected
    assert sorted(tuple(x.values()) for x in t.to_arrow(version=4).to_pylist()) == expected
    assert t.describe()["valid_rows"] == len(expected)


def test_the_watermark_counts_the_delta_values_of_vacuumed_rows(tmp_path):
    """The window's watermark is the largest delta value committed by its version, rows a vacuum erased
    included (their purged file keeps the values)."""
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("d", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["k"], delta_column="d")
    t.ingest(pa.table({"k": [1], "v": [10], "d": [1]}, schema=schema))
    t.ingest(pa.table({"k": [2], "v": [66], "d": [3]}, schema=schema))
    t.tombstone("v", [66])
    t.vacuum()
    t.compact(major=True, look_back=2)
    assert t.state().window.watermark == 3
    with pytest.raises(bitlake.VersionExpiredError):
        t.to_arrow(valid_at=2)


def test_a_background_writer_writes_the_same_file_and_raises_what_failed_on_its_thread(tmp_path):
    """``FileWriter(background=True)`` encodes each full row group on a shared thread: its file reads the same rows
    in the same order as one written on the calling thread, and a row group that fails there fails its close."""
    from bitlake.fs import file_io

    io = file_io(str(tmp_path))
    schema = pa.schema([("a", pa.int64()), ("s", pa.string())])
    chunks = [pa.table({"a": list(range(i, i + 700)), "s": [f"v{j % 13}" for j in range(700)]}, schema=schema)
              for i in range(0, 7000, 700)]
    for background in (False, True):
        w = datafile.FileWriter(io, f"{background}.parquet", schema, "parquet", {}, background=background)
        for chunk in chunks:
            w.write(chunk)
            w.flush()  # a row group each
        w.close()
    files = [pq.ParquetFile(tmp_path / f"{b}.parquet") for b in (False, True)]
    assert [f.metadata.num_row_groups for f in files] == [len(chunks)] * 2
    assert [f.read().to_pylist() for f in files] == [pa.concat_tables(chunks).to_pylist()] * 2
    w = datafile.FileWriter(io, "bad.parquet", schema, "parquet", {}, background=True)
    w.write(chunks[0])
    w.flush()
    w.write(pa.table({"a": ["not a number"], "s": ["x"]}))  # the writer's schema refuses it, on its thread
    w.flush()
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, ValueError)):
        w.close()
