"""Restatement against the oracle: random ingests, reverts, replaces, tombstones, vacuums and DML (delete and
update by a pyarrow expression or a Spark SQL condition), with minor and major compactions between them; every
version, every event time and change ranges (Spark, and the spec reader) match it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import bitlake
from bitlake.format.metadata import delta_to_int
from tests import spec_reader
from tests.oracle import Oracle, Record, rows_key

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("BITLAKE_MODEL_EXAMPLES", "6"))
PHASES = [p for p in Phase if os.environ.get("BITLAKE_MODEL_SHRINK") or p is not Phase.shrink]
COLUMNS = ["k", "value", "mod"]
TIMES = [None, -1, *range(0, 8)]


@dataclasses.dataclass(frozen=True)
class Kind:
    """A table's key and delta types: the generated small integers mapped to them."""

    key_type: pa.DataType
    key: Callable[[int], Any]
    delta_type: pa.DataType
    delta: Callable[[int], Any]
    options: dict

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([("k", self.key_type), ("value", pa.int64()), ("mod", self.delta_type)])


T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
KINDS = {
    "int-key/int-delta": Kind(pa.int64(), int, pa.int64(), int, {}),
    "string-key/timestamp-delta/partitioned": Kind(pa.string(), lambda k: f"key-{k}", pa.timestamp("us", tz="UTC"),
                                                   lambda d: T0 + dt.timedelta(hours=d), {"partition_by": ["grp"]}),
    "orc": Kind(pa.int32(), int, pa.int64(), int, {"file_format": "orc"}),
}

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


def _arrow(recs, kind: Kind) -> pa.Table:
    table = pa.table({
        "k": pa.array([kind.key(r[0]) for r in recs], kind.key_type),
        "value": pa.array([None if r[2] == "delete" else r[3] for r in recs], pa.int64()),
        "mod": pa.array([kind.delta(r[1]) for r in recs], kind.delta_type),
        "op": pa.array([r[2] for r in recs], pa.string()),
    })
    return _grouped(table, kind)


def _grouped(table: pa.Table, kind: Kind) -> pa.Table:
    """A partitioned kind's tables carry ``grp`` (from the key: a key's records stay in one partition)."""
    if "partition_by" not in kind.options:
        return table
    return table.append_column("grp", pa.array([f"g{len(str(k)) % 2}{str(k)[-1]}" for k in
                                                 table.column("k").to_pylist()], pa.string()))


def _row(kind: Kind, k: int, value: int | None, d: int) -> dict:
    row = {"k": kind.key(k), "value": value, "mod": kind.delta(d)}
    return _grouped(pa.Table.from_pylist([row]), kind).to_pylist()[0]


def _records(recs, kind: Kind) -> list[Record]:
    return [Record((kind.key(r[0]),), kind.delta(r[1]), r[2], None if r[2] == "delete" else _row(kind, r[0], r[3], r[1]))
            for r in recs]


def _run(t: bitlake.Table, oracle: Oracle, steps, kind: Kind) -> None:
    ids: list[str] = []
    pending: list[tuple[str, list]] = []
    for n, s in enumerate(steps):
        if s[0] == "ingest":
            batch_id = f"b{n}"
            ids.append(batch_id)
            t.ingest(_arrow(s[1], kind), op_column="op", batch_id=batch_id, metagen=s[2])
            pending.append((batch_id, s[1]))
            if s[2]:
                for b, recs in pending:
                    oracle.apply(_records(recs, kind), t.version, b)
                pending = []
            continue
        if s[0] == "compact":
            t.compact(**({"major": True, "look_back": max(0, t.version - 2)} if s[1] == "major" else {}))
            continue
        if s[0] == "tombstone":
            oracle.tombstone("value", s[1], t.tombstone("value", s[1]).version)
            continue
        if s[0] == "vacuum":
            v = t.vacuum()
            if v.version is not None:
                oracle.vacuum(t.version, lambda row: {**row, "value": None})
            continue
        if s[0] == "merge":
            _merge(t, oracle, s[1], n, pending, kind)
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
                oracle.apply(_records(recs, kind), t.version, b)
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
                result = t.replace_batch(batch_id, _arrow(s[2], kind), op_column="op")
        except bitlake.VersionExpiredError:
            # Refused whole: outside a major compaction's window.
            assert t.state().window is not None and t.version == before
            continue
        if s[0] == "revert":
            if result.committed:
                oracle.revert(batch_id, t.version)
            else:
                assert t.version == before  # reverted already: a retry
        else:
            oracle.replace(batch_id, _records(s[2], kind), t.version)
    if pending:
        t.metagen()
        for b, recs in pending:
            oracle.apply(_records(recs, kind), t.version, b)


def _merge(t, oracle, rows, n, pending, kind: Kind) -> None:
    """A merge of source rows (k, mod, value): matched with value < 5 deletes, else updates all; not matched
    inserts. Each source row is judged against the view before the merge."""
    source = _grouped(pa.table({"k": pa.array([kind.key(r[0]) for r in rows], kind.key_type),
                                "value": pa.array([r[2] for r in rows], pa.int64()),
                                "mod": pa.array([kind.delta(r[1]) for r in rows], kind.delta_type)}), kind)
    current = {r["k"]: r for r in oracle.view()}
    rows = [(kind.key(k), d, value) for k, d, value in rows]
    r = (t.merge(source).when_matched_delete(predicate=pc.field("source.value") < 5).when_matched_update_all()
         .when_not_matched_insert_all().execute())
    assert (r.matched, r.not_matched) == (sum(k in current for k, _, _ in rows), sum(k not in current for k, _, _ in rows))
    records = []
    for k, mod, value in rows:
        if k in current and value < 5:
            records.append(Record((k,), current[k]["mod"], "delete", None))
        else:
            row = {"k": k, "value": value, "mod": kind.delta(mod)}
            records.append(Record((k,), kind.delta(mod), "upsert", _grouped(pa.Table.from_pylist([row]), kind)
                                  .to_pylist()[0]))
    for b, recs in pending:  # the merge's commit makes the pending batches live first
        oracle.apply(_records(recs, kind), t.version, b)
    oracle.apply(records, t.version, f"merge{n}")


def _utc(row: dict) -> dict:
    """PySpark returns timestamps as naive datetimes in UTC (the session time zone); Arrow as aware ones."""
    return {k: v.replace(tzinfo=dt.UTC) if isinstance(v, dt.datetime) and v.tzinfo is None else v
            for k, v in row.items()}


@pytest.mark.parametrize("kind_name", list(KINDS))
def test_reverts_and_replaces_match_the_oracle(spark, kind_name):
    kind = KINDS[kind_name]

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), phases=PHASES)
    @given(st.lists(step, min_size=2, max_size=9), st.randoms(use_true_random=False))
    def run(steps, rnd):
        path = tempfile.mkdtemp(prefix="bitlake-revert-")
        try:
            schema = kind.schema.append(pa.field("grp", pa.string())) if "partition_by" in kind.options \
                else kind.schema
            t = bitlake.create_table(path, schema, primary_key=["k"], delta_column="mod", num_buckets=2,
                                     properties={"keystore.max_increments": "2", "checkpoint.interval": "3",
                                                 "compact.min_log_files": "2"}, **kind.options)
            oracle = Oracle()
            _run(t, oracle, steps, kind)
            window = t.state().window
            first = window.version if window else 0
            for v in range(first, t.version + 1):
                for at in TIMES:
                    at = None if at is None else kind.delta(at)
                    if at is not None and window is not None and delta_to_int(at, kind.delta_type) < window.watermark:
                        continue
                    got = rows_key(t.to_arrow(version=v, valid_at=at).to_pylist(), COLUMNS)
                    assert got == rows_key(oracle.view(at, v), COLUMNS), (v, at)
            assert rows_key(spec_reader.read_view(path), COLUMNS) == rows_key(oracle.view(), COLUMNS)
            got = [_utc(r.asDict()) for r in t.to_spark(spark).collect()]
            assert rows_key(got, COLUMNS) == rows_key(oracle.view(), COLUMNS)
            # The oracle's (lo, hi] is the feed of commits lo + 1 to hi.
            start = rnd.randint(first, max(first, t.version - 1))
            for lo, hi in ((start, rnd.randint(min(start + 1, t.version), t.version)), (first, t.version)):
                if lo == hi:
                    continue
                expected = sorted((c, v, tuple(row[k] for k in COLUMNS)) for c, v, row in oracle.changes_between(lo, hi))
                got = sorted((r["_change_type"], r["_commit_version"], tuple(_utc(r.asDict())[c] for c in COLUMNS))
                             for r in t.changes(spark, starting_version=lo + 1, ending_version=hi).collect())
                assert got == expected, (lo, hi)
                arrow = t.changes_to_arrow(starting_version=lo + 1, ending_version=hi).to_pylist()
                assert sorted((r["_change_type"], r["_commit_version"], tuple(r[c] for c in COLUMNS))
                              for r in arrow) == expected, (lo, hi)
                spec = sorted((r["_change_type"], r["_commit_version"], tuple(r[c] for c in COLUMNS))
                              for r in spec_reader.read_changes(path, lo, hi))
                assert spec == expected, (lo, hi)
        finally:
            shutil.rmtree(path, ignore_errors=True)

    run()


# ------------------------------------------------------------------------------- an append-only table

UNKEYED = pa.schema([("user", pa.string()), ("n", pa.int64())])
user_row = st.tuples(st.sampled_from(["ann", "bob", "cy", "dee"]), st.integers(0, 9))
unkeyed_step = st.one_of(
    st.tuples(st.just("ingest"), st.lists(user_row, max_size=5)),
    st.tuples(st.just("revert"), st.integers(0, 20)),
    st.tuples(st.just("replace"), st.integers(0, 20), st.lists(user_row, max_size=4)),
    st.tuples(st.sampled_from(["delete", "update"]), st.integers(0, 9), st.booleans()),
    st.tuples(st.just("tombstone"), st.sampled_from(["ann", "bob", "cy", "dee"])),
    st.tuples(st.just("vacuum")),
    st.tuples(st.just("compact")),
)


class _Row:
    def __init__(self, user: str, n: int, born: int, batch: str | None):
        self.user, self.n, self.born, self.batch, self.died = user, n, born, batch, None

    def values(self) -> tuple:
        return (self.user, self.n)


class _AppendOnly:
    """The contract of an append-only table: rows live from the commit that adds them until one removes them;
    tombstones hide rows of earlier commits by value; a vacuum removes them from every version."""

    def __init__(self):
        self.rows: list[_Row] = []
        self.tombstones: list[tuple[int, str]] = []
        self.purged: set[int] = set()
        self.changes: list[tuple[str, int, _Row]] = []

    def _hidden(self, r: _Row, version: int | None) -> bool:
        return any(r.born < w and (version is None or w <= version) and r.user == u for w, u in self.tombstones)

    def view(self, version: int) -> list[tuple]:
        return sorted(r.values() for r in self.rows if r.born <= version and (r.died is None or r.died > version)
                      and id(r) not in self.purged and not self._hidden(r, version))

    def current(self, version: int) -> list[_Row]:
        return [r for r in self.rows if r.died is None and id(r) not in self.purged and not self._hidden(r, version)]

    def add(self, rows, version: int, batch: str | None) -> None:
        for user, n in rows:
            self.rows.append(_Row(user, n, version, batch))
            self.changes.append(("insert", version, self.rows[-1]))

    def remove(self, rows: list[_Row], version: int, kind: str = "delete") -> None:
        for r in rows:
            r.died = version
            self.changes.append((kind, version, r))

    def vacuum(self) -> None:
        self.purged |= {id(r) for r in self.rows if self._hidden(r, None)}
        self.tombstones = []

    def changes_between(self, start: int, end: int) -> list[tuple]:
        return sorted((k, v, *r.values()) for k, v, r in self.changes if start < v <= end and id(r) not in self.purged)


def test_an_append_only_table_matches_its_model(spark):
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), phases=PHASES)
    @given(st.lists(unkeyed_step, min_size=2, max_size=9), st.randoms(use_true_random=False))
    def run(steps, rnd):
        path = tempfile.mkdtemp(prefix="bitlake-unkeyed-")
        try:
            t = bitlake.create_table(path, UNKEYED, properties={"compact.min_input_files": "2"})
            model, ids = _AppendOnly(), []
            for i, s in enumerate(steps):
                if s[0] == "ingest":
                    ids.append(f"b{i}")
                    t.ingest(pa.table({"user": [r[0] for r in s[1]], "n": pa.array([r[1] for r in s[1]], pa.int64())},
                                      schema=UNKEYED), batch_id=ids[-1])
                    model.add(s[1], t.version, ids[-1])
                elif s[0] in ("revert", "replace") and ids:
                    b = ids[s[1] % len(ids)]
                    live = [r for r in model.rows if r.batch == b and r.died is None]
                    if s[0] == "revert":
                        if not t.revert_batch(b).committed:
                            continue
                    else:
                        t.replace_batch(b, pa.table({"user": [r[0] for r in s[2]],
                                                     "n": pa.array([r[1] for r in s[2]], pa.int64())}, schema=UNKEYED))
                        for r in model.rows:
                            if r.batch == b:
                                r.batch = None  # the replaced incarnation
                    model.remove(live, t.version)
                    if s[0] == "replace":
                        model.add(s[2], t.version, b)
                elif s[0] in ("delete", "update"):
                    where = (pc.field("n") <= s[1]) if s[2] else f"n <= {s[1]}"
                    matched = [r for r in model.current(t.version) if r.n <= s[1]]
                    if s[0] == "delete":
                        r = t.delete(where)
                    else:
                        r = t.update(where, {"n": pc.field("n") + 10} if s[2] else {"n": "n + 10"})
                    assert r.matched == len(matched)
                    if not matched:
                        continue
                    model.remove(matched, t.version, "delete" if s[0] == "delete" else "update_preimage")
                    if s[0] == "update":
                        for m in matched:
                            model.rows.append(_Row(m.user, m.n + 10, t.version, None))
                            model.changes.append(("update_postimage", t.version, model.rows[-1]))
                elif s[0] == "tombstone":
                    model.tombstones.append((t.tombstone("user", [s[1]]).version, s[1]))
                elif s[0] == "vacuum":
                    if t.vacuum().version is not None:
                        model.vacuum()
                elif s[0] == "compact":
                    t.compact()
            for v in range(t.version + 1):
                got = sorted((r["user"], r["n"]) for r in t.to_arrow(version=v).to_pylist())
                assert got == model.view(v), v
            assert sorted((r["user"], r["n"]) for r in spec_reader.read_view(path)) == model.view(t.version)
            lo = rnd.randint(0, max(t.version - 1, 0))  # the model's (lo, latest]: commits lo + 1 on (0 on at 0)
            got = sorted((r["_change_type"], r["_commit_version"], r["user"], r["n"])
                         for r in t.changes(spark, starting_version=min(lo + 1, t.version)).collect())
            assert got == model.changes_between(lo, t.version), lo
            arrow = sorted((r["_change_type"], r["_commit_version"], r["user"], r["n"])
                           for r in t.changes_to_arrow(starting_version=min(lo + 1, t.version)).to_pylist())
            assert arrow == got, lo
        finally:
            shutil.rmtree(path, ignore_errors=True)

    run()
