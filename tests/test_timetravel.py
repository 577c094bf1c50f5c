"""Time travel by version, commit time and event time, and the change feed, against the oracle; minor and
major compactions at random points between batches change none of them inside the retention window."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import bitlake
import bitlake.read
from tests.oracle import Oracle, Record, rows_key

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("BITLAKE_MODEL_EXAMPLES", "6"))
PHASES = [p for p in Phase if os.environ.get("BITLAKE_MODEL_SHRINK") or p is not Phase.shrink]
SCHEMA = pa.schema([("k", pa.int64()), ("value", pa.int64()), ("mod", pa.int64())])
COLUMNS = ["k", "value", "mod"]

record = st.tuples(st.integers(0, 5), st.integers(0, 6), st.sampled_from(["upsert", "upsert", "delete"]),
                   st.integers(0, 99))
# (records, run MetaGen at once, compact afterwards: no, minor, or major with the window two versions back)
batches = st.lists(st.tuples(st.lists(record, max_size=10), st.booleans(), st.sampled_from([None, "minor", "major"])),
                   min_size=1, max_size=5)


def _arrow(records):
    return pa.table({
        "k": pa.array([r[0] for r in records], pa.int64()),
        "value": pa.array([None if r[2] == "delete" else r[3] for r in records], pa.int64()),
        "mod": pa.array([r[1] for r in records], pa.int64()),
        "op": pa.array([r[2] for r in records], pa.string()),
    })


def _records(records):
    return [Record((r[0],), r[1], r[2], None if r[2] == "delete" else {"k": r[0], "value": r[3], "mod": r[1]})
            for r in records]


def _build(path, spark, plan):
    """Ingests the plan; returns the table and the oracle with the versions each batch became visible at."""
    t = bitlake.create_table(path, SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2,
                             properties={"keystore.max_increments": "2", "checkpoint.interval": "3",
                                         "compact.min_log_files": "2"})  # compactions regroup logs too
    oracle, pending = Oracle(), []
    for i, (records, now, *compact) in enumerate(plan):
        t.ingest(_arrow(records), op_column="op", batch_id=f"b{i}", metagen=now, spark=spark)
        pending.append(records)
        if now:
            for recs in pending:
                oracle.apply(_records(recs), t.version)
            pending = []
        if compact and compact[0]:  # a version that changes no view inside the window: nothing to apply
            t.compact(**({"major": True, "look_back": max(0, t.version - 2)} if compact[0] == "major" else {}))
    if pending:
        t.metagen(spark=spark)
        for recs in pending:
            oracle.apply(_records(recs), t.version)
    return t, oracle


def _changes(df) -> list[tuple]:
    return _changes_of(r.asDict() for r in df.collect())


def _changes_of(rows) -> list[tuple]:
    return sorted((r["_change_type"], r["_commit_version"], tuple(r[c] for c in COLUMNS)) for r in rows)


def test_every_version_and_event_time_and_change_range_matches_the_oracle(spark):
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), phases=PHASES)
    @given(batches, st.randoms(use_true_random=False))
    def run(plan, rnd):
        path = tempfile.mkdtemp(prefix="bitlake-tt-")
        try:
            t, oracle = _build(path, spark, plan)
            window = t.state().window  # major compactions: reads before it are refused, all others read the same
            first = window.version if window else 0
            times = [None, -1, *range(0, 8)]
            inside = [(v, at) for v in range(t.version + 1) for at in times
                      if v >= first and (at is None or window is None or at >= window.watermark)]
            for v in range(t.version + 1):
                for at in times:
                    if (v, at) not in inside:
                        with pytest.raises(bitlake.VersionExpiredError):
                            t.to_arrow(version=v, valid_at=at)
                        continue
                    got = rows_key(t.to_arrow(version=v, valid_at=at).to_pylist(), COLUMNS)
                    assert got == rows_key(oracle.view(at, v), COLUMNS), (v, at)
            v, at = rnd.choice(inside)
            got = [r.asDict() for r in t.to_spark(spark, version=v, valid_at=at).collect()]
            assert rows_key(got, COLUMNS) == rows_key(oracle.view(at, v), COLUMNS)
            # The oracle's (start, end] is the feed of commits start + 1 to end.
            start = rnd.randint(first, max(first, t.version - 1))
            end = rnd.randint(min(start + 1, t.version), t.version)
            expected = sorted((c, ver, tuple(row[k] for k in COLUMNS)) for c, ver, row in oracle.changes_between(start, end))
            spark_rows = t.changes(spark, starting_version=start + 1, ending_version=end).collect()
            assert _changes_of([r.asDict() for r in spark_rows]) == expected
            arrow_rows = t.changes_to_arrow(starting_version=start + 1, ending_version=end).to_pylist()
            assert _changes_of(arrow_rows) == expected
            # The same order: commit, batch, delta value, cause, the old row before the new one.
            assert [(r["_change_type"], r["_commit_version"]) for r in arrow_rows] == [
                (r["_change_type"], r["_commit_version"]) for r in spark_rows]
        finally:
            shutil.rmtree(path, ignore_errors=True)

    run()


@pytest.fixture(scope="module")
def history_table(spark, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tt") / "t")
    plan = [
        ([(1, 1, "upsert", 10), (2, 1, "upsert", 20), (3, 1, "upsert", 30)], True),  # v1
        ([(1, 2, "upsert", 11), (2, 3, "delete", 0), (1, 4, "upsert", 12)], True),  # v2
        ([(2, 0, "upsert", 99), (4, 5, "upsert", 40)], False),  # v3 land, stale 2
        ([(3, 6, "delete", 0), (3, 7, "upsert", 31)], True),  # v4: processes v3's batch too
    ]
    return _build(path, spark, plan)


def test_change_feed_in_commit_order(history_table, spark):
    t, oracle = history_table
    rows = [(r["_change_type"], r["_commit_version"], r["k"], r["value"]) for r in t.changes(spark, starting_version=1).collect()]
    assert rows == [
        ("insert", 1, 1, 10), ("insert", 1, 2, 20), ("insert", 1, 3, 30),
        ("update_preimage", 2, 1, 10), ("update_postimage", 2, 1, 11),
        ("delete", 2, 2, 20),
        ("update_preimage", 2, 1, 11), ("update_postimage", 2, 1, 12),
        ("insert", 4, 4, 40),
        ("delete", 4, 3, 30), ("insert", 4, 3, 31),
    ]
    assert sorted(rows) == sorted((c, v, row["k"], row["value"]) for c, v, row in oracle.changes_between(0, 4))
    deletes = t.changes(spark, starting_version=2, ending_version=2, change_types=["delete"]).collect()
    assert [(r["k"], r["_change_type"]) for r in deletes] == [(2, "delete")]
    stamps = {r["_commit_version"]: r["_commit_timestamp"] for r in t.changes(spark, starting_version=1).collect()}
    history = {h["version"]: h["timestamp"] for h in t.history()}
    for v, ts in stamps.items():
        assert ts.replace(tzinfo=dt.UTC) == dt.datetime.fromisoformat(history[v])
    assert t.changes(spark, starting_version=3, ending_version=3).count() == 0  # a LAND commit changes nothing


def test_as_of_picks_the_latest_commit_at_or_before(history_table, spark):
    t, _ = history_table
    history = {h["version"]: dt.datetime.fromisoformat(h["timestamp"]) for h in t.history()}
    for v in range(t.version + 1):
        assert bitlake.read.view(t.io, t.refresh(), None, history[v], None)[0].version == v
        assert bitlake.read.view(t.io, t.refresh(), None, history[v] + dt.timedelta(microseconds=500), None)[0].version == v
    rows = t.to_arrow(as_of=history[1].isoformat()).to_pylist()
    assert sorted(r["k"] for r in rows) == [1, 2, 3]


def test_spark_and_arrow_agree_on_past_views(history_table, spark):
    t, oracle = history_table
    for v, at in [(1, None), (2, 2), (2, 3), (4, 6), (4, 5), (3, None)]:
        a = rows_key(t.to_arrow(version=v, valid_at=at).to_pylist(), COLUMNS)
        s = rows_key([r.asDict() for r in t.to_spark(spark, version=v, valid_at=at).collect()], COLUMNS)
        assert a == s == rows_key(oracle.view(at, v), COLUMNS)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(version=99), bitlake.VersionNotFoundError, "versions 0 to"),
        (dict(version=-1), bitlake.VersionNotFoundError, "does not exist"),
        (dict(as_of="2000-01-01T00:00:00Z"), bitlake.VersionNotFoundError, "before the table's first commit"),
        (dict(as_of="yesterday"), bitlake.InvalidInputError, "not an ISO-8601"),
        (dict(version=1, as_of="2030-01-01"), bitlake.InvalidInputError, "not both"),
        (dict(valid_at="x"), bitlake.InvalidInputError, "integer delta"),
    ],
)
def test_bad_time_travel_arguments(history_table, kwargs, error, message):
    t, _ = history_table
    with pytest.raises(error, match=message):
        t.to_arrow(**kwargs)


def test_bad_change_ranges(history_table, spark):
    t, _ = history_table
    with pytest.raises(bitlake.InvalidInputError, match="starting_version 4 is after ending_version 1"):
        t.changes(spark, starting_version=4, ending_version=1)
    with pytest.raises(bitlake.VersionNotFoundError):
        t.changes(spark, starting_version=1, ending_version=99)
    with pytest.raises(bitlake.InvalidInputError, match="unknown change types"):
        t.changes(spark, starting_version=1, change_types=["upsert"])


def test_append_only_change_feed_lists_inserts(spark, tmp_path):
    t = bitlake.create_table(str(tmp_path / "log"), SCHEMA)
    t.ingest(pa.table({"k": [1, 2], "value": [1, 2], "mod": [0, 0]}), spark=spark)
    t.ingest(pa.table({"k": [3], "value": [3], "mod": [0]}), spark=spark)
    t.ingest(pa.table({"k": [5, 4], "value": [5, 4], "mod": [0, 0]}), spark=spark)
    rows = [(r["_change_type"], r["_commit_version"], r["k"]) for r in t.changes(spark, starting_version=1).collect()]
    assert rows == [("insert", 1, 1), ("insert", 1, 2), ("insert", 2, 3), ("insert", 3, 5), ("insert", 3, 4)]
    assert [r["k"] for r in t.changes(spark, starting_version=2, ending_version=2).collect()] == [3]
    with pytest.raises(bitlake.InvalidInputError, match="keyed table"):
        t.to_arrow(valid_at=1)
