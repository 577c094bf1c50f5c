"""The change feed takes Delta's range everywhere: ``starting_version`` / ``ending_version`` (or timestamps), both
included, in Python and in the Spark data source; ``open_table(version=|as_of=)`` pins a read-only table."""

from __future__ import annotations

import datetime as dt
import os
import time

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import bitlake

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("mod", pa.int64())])
COMMITS = 5  # versions 1..5, one key each, key 0 updated by every one


def _batch(i: int) -> pa.Table:
    return pa.table({"k": [i, 0], "v": [i, i], "mod": [i, i]}, schema=SCHEMA)


def _make(path: str) -> bitlake.Table:
    t = bitlake.create_table(path, SCHEMA, primary_key="k", delta_column="mod")
    for i in range(1, COMMITS + 1):
        time.sleep(0.005)  # commit times a few milliseconds apart, so a time between two commits exists
        t.ingest(_batch(i), batch_id=f"b{i}")
    return t


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> bitlake.Table:
    return _make(str(tmp_path_factory.mktemp("cf") / "t"))


def _stamps(t: bitlake.Table) -> dict[int, dt.datetime]:
    return {h["version"]: dt.datetime.fromisoformat(h["timestamp"]) for h in t.history()}


def _feed(rows) -> list[tuple]:
    return [(r["_change_type"], r["_commit_version"], r["k"], r["v"]) for r in rows]


def _versions(t: bitlake.Table, **kwargs) -> list[int]:
    return sorted({r["_commit_version"] for r in t.changes_to_arrow(**kwargs).to_pylist()})


def _expected(first: int, last: int) -> list[tuple]:
    """The rows of commits ``first`` to ``last`` of :func:`_make`'s table."""
    out = []
    for i in range(max(first, 1), last + 1):
        out.append(("insert", i, i, i))
        if i > 1:  # key 0 exists from commit 1 on: updated with its old and new value
            out += [("update_preimage", i, 0, i - 1), ("update_postimage", i, 0, i)]
        else:
            out.append(("insert", i, 0, i))
    return out


def _sorted(rows: list[tuple]) -> list[tuple]:
    return sorted(rows, key=lambda r: (r[1], r[2], r[0]))


# ------------------------------------------------------------------------------------------ versions


@pytest.mark.parametrize(("first", "last"), [(2, 4), (3, 3), (1, 5), (0, 2), (4, 5)])
def test_both_ends_are_included(table, first, last):
    got = _feed(table.changes_to_arrow(starting_version=first, ending_version=last).to_pylist())
    assert _sorted(got) == _sorted(_expected(first, last))
    assert {v for _, v, _, _ in got} == set(range(max(first, 1), last + 1))


def test_defaults_read_every_commit_to_the_latest(table):
    assert _versions(table) == list(range(1, COMMITS + 1))
    assert _versions(table, starting_version=4) == [4, 5]
    assert _versions(table, ending_version=2) == [1, 2]
    assert _sorted(_feed(table.changes_to_arrow().to_pylist())) == _sorted(_expected(0, COMMITS))


def test_the_default_start_is_the_first_readable_commit_of_the_retention_window(tmp_path):
    t = _make(str(tmp_path / "t"))
    before = _feed(t.changes_to_arrow(starting_version=4).to_pylist())
    t.compact(major=True, look_back=3)  # keeps the views from version 3: commits 4 on have their changes
    assert t.state().window.version == 3
    assert _feed(t.changes_to_arrow().to_pylist()) == before
    assert _feed(t.changes_to_arrow(starting_version=4).to_pylist()) == before
    with pytest.raises(bitlake.VersionExpiredError, match="starting_version 3 is before the retention window: "
                                                          "the change feed keeps the commits from version 4 on"):
        t.changes_to_arrow(starting_version=3)
    with pytest.raises(bitlake.VersionExpiredError, match="ending_version 3 is before the retention window"):
        t.changes_to_arrow(ending_version=3)
    with pytest.raises(bitlake.VersionExpiredError, match="starting_timestamp"):
        t.changes_to_arrow(starting_timestamp=_stamps(t)[2])


def test_a_start_after_the_end_names_both(table):
    with pytest.raises(bitlake.InvalidInputError, match="starting_version 4 is after ending_version 2"):
        table.changes_to_arrow(starting_version=4, ending_version=2)
    stamps = _stamps(table)
    with pytest.raises(bitlake.InvalidInputError, match=r"starting_timestamp .* \(version 4\) is after "
                                                        r"ending_timestamp .* \(version 2\)"):
        table.changes_to_arrow(starting_timestamp=stamps[4], ending_timestamp=stamps[2])
    with pytest.raises(bitlake.InvalidInputError, match=r"starting_version 4 is after ending_timestamp .* \(version "
                                                        r"3\)"):
        table.changes_to_arrow(starting_version=4, ending_timestamp=stamps[3])


@pytest.mark.parametrize("end", ["starting", "ending"])
def test_a_version_and_a_timestamp_for_one_end_are_refused(table, end):
    with pytest.raises(bitlake.InvalidInputError, match=f"give {end}_version or {end}_timestamp, not both"):
        table.changes_to_arrow(**{f"{end}_version": 2, f"{end}_timestamp": _stamps(table)[2]})


def test_unknown_versions(table):
    with pytest.raises(bitlake.VersionNotFoundError, match="starting_version 9 does not exist"):
        table.changes_to_arrow(starting_version=9)
    with pytest.raises(bitlake.VersionNotFoundError, match="ending_version 9 does not exist"):
        table.changes_to_arrow(starting_version=1, ending_version=9)
    with pytest.raises(bitlake.InvalidInputError, match="starting_version must be an integer"):
        table.changes_to_arrow(starting_version="2")


# ---------------------------------------------------------------------------------------- timestamps


def test_timestamps_resolve_as_delta_does(table):
    stamps = _stamps(table)
    # A commit's own time: the start includes that commit, the end too.
    assert _versions(table, starting_timestamp=stamps[2], ending_timestamp=stamps[4]) == [2, 3, 4]
    # ISO strings as well as datetimes.
    assert _versions(table, starting_timestamp=stamps[2].isoformat(), ending_timestamp=stamps[4].isoformat()) == [
        2, 3, 4]
    # Between two commits: the start is the next commit, the end the previous one.
    between = {v: stamps[v] + (stamps[v + 1] - stamps[v]) / 2 for v in range(COMMITS)}
    assert _versions(table, starting_timestamp=between[1], ending_timestamp=between[3]) == [2, 3]
    assert _versions(table, starting_timestamp=between[3]) == [4, 5]
    assert _versions(table, ending_timestamp=between[2]) == [1, 2]
    # A time a fraction of a millisecond after a commit is after it.
    assert _versions(table, starting_timestamp=stamps[2] + dt.timedelta(microseconds=300)) == [3, 4, 5]
    # Mixed: a version at one end, a time at the other.
    assert _versions(table, starting_version=2, ending_timestamp=between[3]) == [2, 3]
    # Two ordered times with no commit between them: an empty range, as in Delta.
    gap = (stamps[3] - stamps[2]) / 4
    assert table.changes_to_arrow(starting_timestamp=stamps[2] + gap, ending_timestamp=stamps[3] - gap).num_rows == 0


def test_timestamps_outside_the_table_are_refused(table):
    stamps = _stamps(table)
    with pytest.raises(bitlake.VersionNotFoundError, match="starting_timestamp .* is after the latest commit, "
                                                           "version 5"):
        table.changes_to_arrow(starting_timestamp=stamps[COMMITS] + dt.timedelta(seconds=1))
    with pytest.raises(bitlake.VersionNotFoundError, match="ending_timestamp .* is before the table's first commit"):
        table.changes_to_arrow(ending_timestamp=stamps[0] - dt.timedelta(seconds=1))
    with pytest.raises(bitlake.InvalidInputError, match="starting_timestamp 'yesterday' is not an ISO-8601 time"):
        table.changes_to_arrow(starting_timestamp="yesterday")


def test_a_start_before_the_first_commit_reads_from_it(table):
    stamps = _stamps(table)
    assert _versions(table, starting_timestamp=stamps[0] - dt.timedelta(days=1)) == list(range(1, COMMITS + 1))


# --------------------------------------------------------------------------------------- open_table


def test_open_table_at_a_version_reads_that_version(table):
    latest = bitlake.open_table(table.path)
    for v in (1, 3):
        pinned = bitlake.open_table(table.path, version=v)
        assert pinned.version == v and repr(pinned).endswith(f"version={v})")
        want = sorted(latest.to_arrow(version=v).to_pylist(), key=lambda r: r["k"])
        assert sorted(pinned.to_arrow().to_pylist(), key=lambda r: r["k"]) == want
        assert sorted(pinned.to_batches().read_all().to_pylist(), key=lambda r: r["k"]) == want
        assert pinned.view().to_table().num_rows == len(want)
        assert pinned.describe()["version"] == v
        assert pinned.state().version == v
        assert [h["version"] for h in pinned.history()] == list(range(v, -1, -1))
        assert _versions(pinned) == list(range(1, v + 1)), "the change feed ends at the pinned version"
    pinned = bitlake.open_table(table.path, version=2)
    # An explicit version or time still reads what it names.
    assert pinned.to_arrow(version=COMMITS).num_rows == latest.to_arrow().num_rows
    assert _versions(pinned, ending_version=4) == [1, 2, 3, 4]


def test_open_table_as_of_a_time_pins_the_latest_version_committed_by_then(table):
    stamps = _stamps(table)
    assert bitlake.open_table(table.path, as_of=stamps[3]).version == 3
    assert bitlake.open_table(table.path, as_of=(stamps[3] + (stamps[4] - stamps[3]) / 2).isoformat()).version == 3
    assert bitlake.open_table(table.path, as_of=stamps[COMMITS] + dt.timedelta(days=1)).version == COMMITS


def test_open_table_refuses_unknown_versions(table):
    with pytest.raises(bitlake.VersionNotFoundError, match="version 9 does not exist"):
        bitlake.open_table(table.path, version=9)
    with pytest.raises(bitlake.VersionNotFoundError, match="before the table's first commit"):
        bitlake.open_table(table.path, as_of=_stamps(table)[0] - dt.timedelta(days=1))
    with pytest.raises(bitlake.InvalidInputError, match="give version or as_of, not both"):
        bitlake.open_table(table.path, version=1, as_of=_stamps(table)[1])


WRITES = {
    "ingest": lambda t: t.ingest(_batch(9)),
    "ingest_pending": lambda t: t.ingest(_batch(9), metagen=False),
    "metagen": lambda t: t.metagen(),
    "delete": lambda t: t.delete(pc.field("k") == 1),
    "update": lambda t: t.update(pc.field("k") == 1, {"v": pc.scalar(7)}),
    "merge": lambda t: t.merge(_batch(9)).when_matched_update_all().when_not_matched_insert_all().execute(),
    "revert_batch": lambda t: t.revert_batch("b1"),
    "replace_batch": lambda t: t.replace_batch("b1", _batch(9)),
    "tombstone": lambda t: t.tombstone("k", [1]),
    "vacuum": lambda t: t.vacuum(),
    "compact": lambda t: t.compact(),
    "compact_major": lambda t: t.compact(major=True, look_back=1),
    "maintain": lambda t: t.maintain(),
    "cleanup": lambda t: t.cleanup(min_age_seconds=0),
    "set_properties": lambda t: t.set_properties({"compact.min_input_files": "2"}),
    "add_columns": lambda t: t.add_columns([pa.field("extra", pa.int64())]),
    "upgrade": lambda t: t.upgrade(),
}


def _files(path: str) -> set[str]:
    """The table's files but its key index (a RocksDB cache, whose background compaction may still write)."""
    return {os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if "/_bitlake/index" not in d}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_pinned_table_refuses_every_write(tmp_path, write):
    t = _make(str(tmp_path / "t"))
    files = _files(t.path)
    pinned = bitlake.open_table(t.path, version=2)
    with pytest.raises(bitlake.InvalidInputError, match=r"^table opened at version 2 is read-only: open it without "
                                                        r"version= to write$"):
        WRITES[write](pinned)
    assert t.version == COMMITS and _files(t.path) == files, "nothing was written"
    assert bitlake.open_table(t.path).ingest(_batch(9)).committed, "the same table opened without version= writes"


# ----------------------------------------------------------------------------------------------- Spark


def _source(spark, t, **options):
    reader = spark.read.format("bitlake").option("readChangeFeed", "true")
    for k, v in options.items():
        reader = reader.option(k, v if isinstance(v, (int, str)) else v.isoformat())
    return reader.load(t.path)


def _spark_feed(df) -> list[tuple]:
    return sorted(_feed(r.asDict() for r in df.collect()))


@pytest.mark.spark
def test_the_data_source_and_python_return_the_same_rows_for_the_same_range(spark, table):
    stamps = _stamps(table)
    between = {v: stamps[v] + (stamps[v + 1] - stamps[v]) / 2 for v in range(COMMITS)}
    ranges = [
        ({"startingVersion": 2, "endingVersion": 4}, {"starting_version": 2, "ending_version": 4}),
        ({"startingVersion": 3}, {"starting_version": 3}),
        ({"startingVersion": 0, "endingVersion": 1}, {"starting_version": 0, "ending_version": 1}),
        ({"startingTimestamp": stamps[2], "endingTimestamp": stamps[4]},
         {"starting_timestamp": stamps[2], "ending_timestamp": stamps[4]}),
        ({"startingTimestamp": between[1], "endingTimestamp": between[3]},
         {"starting_timestamp": between[1], "ending_timestamp": between[3]}),
        ({"startingTimestamp": between[2]}, {"starting_timestamp": between[2]}),
        ({"startingVersion": 2, "endingTimestamp": between[3]}, {"starting_version": 2, "ending_timestamp": between[3]}),
    ]
    for options, kwargs in ranges:
        got = _spark_feed(_source(spark, table, **options))
        assert got == sorted(_feed(table.changes_to_arrow(**kwargs).to_pylist())), options
        assert got == _spark_feed(table.changes(spark, **kwargs)), options
        assert got, options
    assert _spark_feed(_source(spark, table, startingVersion=2, endingVersion=4)) == sorted(_expected(2, 4))


@pytest.mark.spark
def test_the_data_source_names_its_options_in_errors(spark, table):
    from pyspark.errors import AnalysisException

    stamps = _stamps(table)
    with pytest.raises(AnalysisException, match="startingVersion 4 is after endingVersion 2"):
        _source(spark, table, startingVersion=4, endingVersion=2).collect()
    with pytest.raises(AnalysisException, match="give startingVersion or startingTimestamp, not both"):
        _source(spark, table, startingVersion=1, startingTimestamp=stamps[1]).collect()
    with pytest.raises(AnalysisException, match="readChangeFeed needs startingVersion or startingTimestamp"):
        _source(spark, table, endingVersion=2).collect()
    with pytest.raises(AnalysisException, match="startingTimestamp .* is after the latest commit"):
        _source(spark, table, startingTimestamp=stamps[COMMITS] + dt.timedelta(seconds=1)).collect()


@pytest.mark.spark
def test_a_stream_starts_at_its_starting_timestamp(spark, table, tmp_path):
    stamps = _stamps(table)
    between = stamps[2] + (stamps[3] - stamps[2]) / 2
    query = (spark.readStream.format("bitlake").option("readChangeFeed", "true")
             .option("startingTimestamp", between.isoformat()).load(table.path)
             .writeStream.format("memory").queryName("cf_from_time")
             .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        query.processAllAvailable()
        got = _spark_feed(spark.table("cf_from_time"))
    finally:
        query.stop()
    assert got == sorted(_feed(table.changes_to_arrow(starting_version=3).to_pylist()))
    assert {v for _, v, _, _ in got} == {3, 4, 5}


@pytest.mark.spark
def test_to_spark_of_a_pinned_table_reads_its_version(spark, table):
    pinned = bitlake.open_table(table.path, version=2)
    got = sorted(tuple(r) for r in pinned.to_spark(spark).collect())
    assert got == sorted(tuple(r.values()) for r in table.to_arrow(version=2).to_pylist())
