"""Restatement against the oracle: random ingests, reverts, replaces, tombstones, vacuums and DML (delete and
update by a pyarrow expression or a Spark SQL condition), with minor and major compactions between them; every
version, every event time and change ranges (Spark, and the spec reader) match it."""

from __future__ import annotations

import os
import shutil
import tempfile

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import bitlake
from tests import spec_reader
from tests.oracle import Oracle, Record, rows_key

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("BITLAKE_MODEL_EXAMPLES", "6"))
PHASES = [p for p in Phase if os.environ.get("BITLAKE_MODEL_SHRINK") or p is not Phase.shrink]
SCHEMA = pa.schema([("k", pa.int64()), ("value", pa.int64()), ("mod", pa.int64())])
COLUMNS = ["k", "value", "mod"]
TIMES = [None, -1, *range(0, 8)]

record = st.tuples(st.integers(0, 5), st.integers(0, 6), st.sampled_from(["upsert", "upsert", "delete"]),
                   st.integers(0, 19))
records = st.lists(record, max_size=8)
step = st.one_of(
    st.tuples(st.just("ingest"), records, st.booleans()),  # the records, MetaGen at once
    st.tuples(st.just("revert"), st.integers(0, 20)),  # which earlier batch id
    st.tuples(st.just("replace"), st.integers(0, 20), records),
    st.tuples(st.just("compact"), st.sampled_from(["minor", "major"])),
    st.tuples(st.just("tombstone"), st.lists(st.integers(0, 19), min_size=1, max_size=4)),
    st.tuples(st.just("vacuum")),
    st.tuples(st.sampled_from(["delete", "update"]), st.integers(0, 19), st.integers(0, 8), st.booleans()),
    st.tuples(st.just("merge"), st.lists(st.tuples(st.integers(0, 7), st.integers(0, 6), st.integers(0, 19)),
                                         min_size=1, max_size=5)),
)


def _arrow(recs) -> pa.Table:
    return pa.table({
        "k": pa.array([r[0] for r in recs], pa.int64()),
        "value": pa.array([None if r[2] == "delete" else r[3] for r in recs], pa.int64()),
        "mod": pa.array([r[1] for r in recs], pa.int64()),
        "op": pa.array([r[2] for r in recs], pa.string()),
    })


def _records(recs) -> list[Record]:
    return [Record((r[0],), r[1], r[2], None if r[2] == "delete" else {"k": r[0], "value": r[3], "mod": r[1]})
            for r in recs]


def _run(t: bitlake.Table, oracle: Oracle, steps) -> None:
    ids: list[str] = []
    pending: list[tuple[str, list]] = []
    for n, s in enumerate(steps):
        if s[0] == "ingest":
            batch_id = f"b{n}"
            ids.append(batch_id)
            t.ingest(_arrow(s[1]), op_column="op", batch_id=batch_id, metagen=s[2])
            pending.append((batch_id, s[1]))
            if s[2]:
                for b, recs in pending:
                    oracle.apply(_records(recs), t.version, b)
                pending = []
            continue
        if s[0] == "compact":
            t.compact(major=s[1] == "major", look_back=max(0, t.version - 2))
            continue
        if s[0] == "tombstone":
            oracle.tombstone("value", s[1], t.tombstone("value", s[1]))
            continue
        if s[0] == "vacuum":
            if t.vacuum().version is not None:
                oracle.vacuum(t.version, lambda row: {"k": row["k"], "value": None, "mod": row["mod"]})
            continue
        if s[0] == "merge":
            _merge(t, oracle, s[1], n, pending)
            pending = []
            continue
        if s[0] in ("delete", "update"):
            lo, hi = s[1], s[1] + s[2]
            if s[3]:
                where = (pc.field("value") >= lo) & (pc.field("value") <= hi)
                change = {"value": pc.field("value") + 100}
            else:
                where, change = f"value between {lo} and {hi}", {"value": "value + 100"}
            matched = [r for r in oracle.view() if lo <= r["value"] <= hi]
            before = t.version
            r = t.delete(where) if s[0] == "delete" else t.update(where, change)
            assert r.matched == len(matched)
            if not matched:
                assert r.version is None and t.version == before
                continue
            for b, recs in pending:  # the DML batch's commit makes the pending batches live first
                oracle.apply(_records(recs), t.version, b)
            pending = []
            op = "delete" if s[0] == "delete" else "upsert"
            oracle.apply([Record((m["k"],), m["mod"], op, None if op == "delete" else {**m, "value": m["value"] + 100})
                          for m in matched], t.version, f"dml{n}")
            continue
        if not ids:
            continue
        batch_id = ids[s[1] % len(ids)]
        if any(b == batch_id for b, _ in pending):
            with pytest.raises(bitlake.InvalidInputError, match="pending"):
                t.revert_batch(batch_id)
            continue
        before = t.version
        try:
            if s[0] == "revert":
                result = t.revert_batch(batch_id)
            else:
                result = t.replace_batch(batch_id, _arrow(s[2]), op_column="op")
        except bitlake.VersionExpiredError:
            assert t.state().window is not None and t.version == before  # refused whole
            continue
        if s[0] == "revert":
            if result.committed:
                oracle.revert(batch_id, t.version)
            else:
                assert t.version == before  # reverted already: a retry
        else:
            oracle.replace(batch_id, _records(s[2]), t.version)
    if pending:
        t.metagen()
        for b, recs in pending:
            oracle.apply(_records(recs), t.version, b)


def _merge(t, oracle, rows, n, pending) -> None:
    """A merge of source rows (k, mod, value): matched with value < 5 deletes, else updates all; not matched
    inserts. Each source row is judged against the view before the merge."""
    source = pa.table({"k": pa.array([r[0] for r in rows], pa.int64()), "value": pa.array([r[2] for r in rows],
                       pa.int64()), "mod": pa.array([r[1] for r in rows], pa.int64())})
    current = {r["k"]: r for r in oracle.view()}
    r = (t.merge(source).when_matched_delete(predicate=pc.field("source.value") < 5).when_matched_update_all()
         .when_not_matched_insert_all().execute())
    assert (r.matched, r.not_matched) == (sum(k in current for k, _, _ in rows), sum(k not in current for k, _, _ in rows))
    records = []
    for k, mod, value in rows:
        if k in current and value < 5:
            records.append(Record((k,), current[k]["mod"], "delete", None))
        else:
            records.append(Record((k,), mod, "upsert", {"k": k, "value": value, "mod": mod}))
    for b, recs in pending:  # the merge's commit makes the pending batches live first
        oracle.apply(_records(recs), t.version, b)
    oracle.apply(records, t.version, f"merge{n}")


def test_reverts_and_replaces_match_the_oracle(spark):
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), phases=PHASES)
    @given(st.lists(step, min_size=2, max_size=9), st.randoms(use_true_random=False))
    def run(steps, rnd):
        path = tempfile.mkdtemp(prefix="bitlake-revert-")
        try:
            t = bitlake.create_table(path, SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2,
                                     properties={"keystore.max_increments": "2", "checkpoint.interval": "3",
                                                 "compact.min_log_files": "2"})
            oracle = Oracle()
            _run(t, oracle, steps)
            window = t.state().window
            first = window.version if window else 0
            for v in range(first, t.version + 1):
                for at in TIMES:
                    if at is not None and window is not None and at < window.watermark:
                        continue
                    got = rows_key(t.to_arrow(version=v, valid_at=at).to_pylist(), COLUMNS)
                    assert got == rows_key(oracle.view(at, v), COLUMNS), (v, at)
            assert rows_key(spec_reader.read_view(path), COLUMNS) == rows_key(oracle.view(), COLUMNS)
            got = [r.asDict() for r in t.to_spark(spark).collect()]
            assert rows_key(got, COLUMNS) == rows_key(oracle.view(), COLUMNS)
            start = rnd.randint(first, t.version)
            for lo, hi in ((start, rnd.randint(start, t.version)), (first, t.version)):
                expected = sorted((c, v, tuple(row[k] for k in COLUMNS)) for c, v, row in oracle.changes_between(lo, hi))
                got = sorted((r["_change_type"], r["_commit_version"], tuple(r[c] for c in COLUMNS))
                             for r in t.changes(spark, start_version=lo, end_version=hi).collect())
                assert got == expected, (lo, hi)
                spec = sorted((r["_change_type"], r["_commit_version"], tuple(r[c] for c in COLUMNS))
                              for r in spec_reader.read_changes(path, lo, hi))
                assert spec == expected, (lo, hi)
        finally:
            shutil.rmtree(path, ignore_errors=True)

    run()
