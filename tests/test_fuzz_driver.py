"""A bug hunt on the Spark-free driver path: one random sequence mixes every operation (Arrow ingests with
inline MetaGen, retries of committed batch ids, two-step ingests, reverts, replaces, tombstones on key and
non-key columns, vacuums, minor and major compactions) and the table is compared to the oracle after every
step: the current view, views at every retained version and several event times (ties with delta values,
below them all, +infinity), change ranges, the refusals outside a major compaction's window, and the counts
each call returns.

Never starts Spark (every MetaGen is inline). ``BITLAKE_FUZZ_EXAMPLES`` raises the example count per case,
``BITLAKE_FUZZ_SHRINK=1`` shrinks a failure to a minimal sequence, ``BITLAKE_FUZZ_FULL=1`` checks the full grid of
versions and event times after every step (by default: after the steps that can change past views, and a
sample of it after the others)."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, event, given, note, settings
from hypothesis import strategies as st

import bitlake
from bitlake.engine.keys import keyindex
from bitlake.engine.write import landing, metagen
from tests.oracle import COUNTS, Oracle, Record

EXAMPLES = int(os.environ.get("BITLAKE_FUZZ_EXAMPLES", "10"))
PHASES = [p for p in Phase if os.environ.get("BITLAKE_FUZZ_SHRINK") or p is not Phase.shrink]
FULL = bool(os.environ.get("BITLAKE_FUZZ_FULL"))
_DEFAULTS = {"LOOKUP_COST_IN_ROWS": metagen.LOOKUP_COST_IN_ROWS}  # as imported, before any test changes it
STATS: collections.Counter = collections.Counter()  # step outcomes; BITLAKE_FUZZ_STATS=1 prints them
# bitmap.deltas "always": every change to a segment's bitmap is a delta (these tables are too small for the cost
# rule to choose one; tests/test_bitmap_deltas.py checks the rule on larger ones).
PROPERTIES = {"keystore.max_increments": "2", "checkpoint.interval": "3", "compact.min_log_files": "2",
              "compact.min_input_files": "2", "bitmap.deltas": "always"}
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
GROUPS = ["a", "b", None, "p q/r=1"]  # values of the non-key string column (a partition column in some cases)
DELTAS = range(5)  # generated delta values, mapped to the kind's delta type


@dataclasses.dataclass(frozen=True)
class Kind:
    """A table's key and delta types: the generated small integers mapped to them."""

    keys: tuple[tuple[str, pa.DataType], ...]
    key: Callable[[int], tuple]  # key index 0..5 -> the key columns' values
    delta_type: pa.DataType
    delta: Callable[[int], Any]  # 0..4 -> a delta value
    between: Callable[[int], Any]  # 0..4 -> a time strictly between delta(d) and delta(d + 1)
    below: Any  # a time below every delta value
    partition_by: tuple[str, ...] = ()
    tombstone_columns: tuple[str, ...] = ("value",)

    @property
    def key_names(self) -> list[str]:
        return [n for n, _ in self.keys]

    @property
    def columns(self) -> list[str]:
        return [*self.key_names, "grp", "value", "mod"]

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([*self.keys, ("grp", pa.string()), ("value", pa.int64()), ("mod", self.delta_type)])

    def column_value(self, column: str, i: int) -> Any:
        """A tombstone value of ``column`` from a generated integer."""
        if column == "value":
            return i
        if column == "grp":
            return GROUPS[i % len(GROUPS)] or "a"
        return self.key(i % 6)[self.key_names.index(column)]


STRINGS = ["", "a", "ä", "a b", "A", "zz"]
DAYS = [dt.date(2026, 1, 1), dt.date(1969, 12, 31)]


def _ts(d: float) -> dt.datetime:
    return T0 + dt.timedelta(hours=d)


KINDS = {
    "int64-key/int-delta": Kind((("k", pa.int64()),), lambda i: (i * 7 - 10,), pa.int64(), lambda d: d * 10,
                                lambda d: d * 10 + 5, -1, tombstone_columns=("value", "k")),
    "string-key/int-delta/partitioned": Kind((("k", pa.string()),), lambda i: (STRINGS[i],), pa.int64(),
                                             lambda d: d, lambda d: d, -1,  # no room between integers 1 apart
                                             partition_by=("grp",), tombstone_columns=("value", "k", "grp")),
    "int32+date-key/timestamp-delta": Kind((("k", pa.int32()), ("day", pa.date32())),
                                           lambda i: ([0, 1, -1][i % 3], DAYS[i // 3]),
                                           pa.timestamp("us", tz="UTC"), _ts, lambda d: _ts(d + 0.5), _ts(-1),
                                           tombstone_columns=("value", "k", "day")),
    "int32+date-key/timestamp-delta/partitioned-by-key": Kind(
        (("k", pa.int32()), ("day", pa.date32())), lambda i: ([0, 1, -1][i % 3], DAYS[i // 3]),
        pa.timestamp("us", tz="UTC"), _ts, lambda d: _ts(d + 0.5), _ts(-1), partition_by=("day",),
        tombstone_columns=("value", "day", "grp")),
}

CHANGE_TYPES = ["insert", "update_preimage", "update_postimage", "delete"]
MODES = ["lookups", "scan", "default"]  # how the inline MetaGen reads the key store
record = st.tuples(
    st.integers(0, 5),  # key
    st.sampled_from(DELTAS),  # delta
    st.sampled_from(["upsert", "upsert", "upsert", "delete"]),
    st.one_of(st.none(), st.integers(0, 9)),  # value
    st.integers(0, len(GROUPS) - 1),  # grp
)
records = st.lists(record, max_size=8)
INPUTS = ["table", "segments", "stream"]  # how a batch reaches ingest (see Run.input)
ingest_step = st.tuples(st.just("ingest"), records, st.booleans(), st.sampled_from(MODES), st.booleans(),
                        st.sampled_from(INPUTS))
step = st.one_of(
    ingest_step,  # (records, MetaGen at once, mode, retry it at once, input)
    ingest_step,
    ingest_step,
    st.tuples(st.just("metagen"), st.sampled_from(MODES)),
    st.tuples(st.just("retry"), st.integers(0, 30), records, st.booleans()),
    st.tuples(st.just("revert"), st.integers(0, 30)),
    st.tuples(st.just("replace"), st.integers(0, 30), records, st.sampled_from(MODES), st.sampled_from(INPUTS)),
    st.tuples(st.just("tombstone"), st.integers(0, 2), st.lists(st.integers(0, 9), min_size=1, max_size=3),
              st.booleans()),  # (column, values, vacuum at once)
    st.tuples(st.just("vacuum")),
    st.tuples(st.just("compact")),
    st.tuples(st.just("major"), st.integers(0, 4)),  # the window that many versions back
    st.tuples(st.just("cleanup")),  # with no grace period: drops what only expired versions read
)
steps = st.builds(lambda first, rest: [first, *rest], ingest_step, st.lists(step, max_size=14))


# ----------------------------------------------------------------------------------------------- values


def _norm(v: Any) -> tuple:
    """A value comparable across types and time zones (None sorts with the rest)."""
    if v is None:
        return ("~null",)
    if isinstance(v, dt.datetime):
        return ("ts", _micros(v))
    if isinstance(v, dt.date):
        return ("date", v.toordinal())
    return (type(v).__name__, v)


def _micros(v: Any) -> int:
    if isinstance(v, dt.datetime):
        d = v - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
        return (d.days * 86400 + d.seconds) * 1_000_000 + d.microseconds
    return v


def _rows(rows, columns) -> list[tuple]:
    return sorted(tuple(_norm(r[c]) for c in columns) for r in rows)


def _change_rows(rows, columns) -> list[tuple]:
    return [(r["_change_type"], r["_commit_version"], tuple(_norm(r[c]) for c in columns)) for r in rows]


# ----------------------------------------------------------------------------------------------- the run


class Run:
    def __init__(self, t: bitlake.Table, kind: Kind, rnd, monkeypatch):
        self.t, self.kind, self.rnd, self.mp = t, kind, rnd, monkeypatch
        self.oracle = Oracle()
        self.ids: list[str] = []
        self.pending: list[tuple[str, list[Record]]] = []
        self.took: dict[str, int] = {}  # batch id -> the version a retry answers with (when known)
        self.inputs: dict[str, list] = {}  # batch id -> the records its current incarnation was given
        self.live: dict[str, int] = {}  # batch id -> the version its current incarnation was made live at
        self.window: tuple[int, int] | None = None  # (W, watermark as an int), as the harness expects it
        self.readable_from = 0  # the first version a read may ask for (the window's, or the look-back's before it)
        self.ordered: set[int] = set()  # versions whose change rows follow acceptance order exactly
        self.log: list[str] = []
        self.reader = t  # the table object the checks read
        self.earliest = 0  # the first version history() lists (cleanup drops the commits before the window)
        self.row_ids: dict[tuple, tuple] = {}  # row id -> the row every read returned with it

    def table(self) -> bitlake.Table:
        """The table object a step uses: mostly the one that made every commit (its state kept up to date commit by
        commit), sometimes a freshly opened one (its state loaded from checkpoints and commits, as another process
        would)."""
        return self.t if self.rnd.random() < 0.7 else bitlake.open_table(self.t.path)

    # -- inputs

    def arrow(self, recs) -> pa.Table:
        k = self.kind
        cols: dict[str, pa.Array] = {}
        for j, (name, typ) in enumerate(k.keys):
            cols[name] = pa.array([k.key(r[0])[j] for r in recs], typ)
        cols["grp"] = pa.array([GROUPS[r[4]] for r in recs], pa.string())
        cols["value"] = pa.array([None if r[2] == "delete" else r[3] for r in recs], pa.int64())
        cols["mod"] = pa.array([k.delta(r[1]) for r in recs], k.delta_type)
        cols["op"] = pa.array([r[2] for r in recs], pa.string())
        return pa.table(cols)

    def input(self, recs, form: str) -> Any:
        """The batch as ingest takes it: a pyarrow Table landed in one segment, or cut into segments of a few
        rows (landed at once by the pool), or a RecordBatchReader of two-row batches (streamed, in segments of
        three rows, its records read back from the files by MetaGen, which folds them from a spill)."""
        table = self.arrow(recs)
        self.mp.setattr(landing, "MIN_TASK_ROWS", 2 if form == "segments" else 1 << 20)
        self.mp.setattr(landing, "STREAM_TASK_ROWS", 3 if form == "stream" else 1 << 22)
        # A stream's MetaGen folds from a spill, in groups of buckets (as a commit of millions of records does).
        self.mp.setattr(metagen, "SPILL_RECORDS", 0 if form == "stream" else 16_000_000)
        self.mp.setattr(metagen, "SPILL_GROUP_RECORDS", 3)
        if form != "stream":
            return table
        return pa.RecordBatchReader.from_batches(table.schema, table.to_batches(max_chunksize=2))

    def records(self, recs) -> list[Record]:
        k = self.kind
        out = []
        for r in recs:
            key = k.key(r[0])
            row = None
            if r[2] == "upsert":
                row = {**dict(zip(k.key_names, key, strict=True)), "grp": GROUPS[r[4]], "value": r[3],
                       "mod": k.delta(r[1])}
            out.append(Record(key, k.delta(r[1]), r[2], row))
        return out

    def mode(self, mode: str) -> None:
        """How the inline MetaGen reads the key store: point lookups in the key index, a scan of the touched
        buckets in groups, or bitlake's own choice by cost."""
        if mode == "default":
            self.mp.setattr(metagen, "LOOKUP_COST_IN_ROWS", _DEFAULTS["LOOKUP_COST_IN_ROWS"])
            self.mp.setattr(metagen, "GROUP_RECORDS", 20_000_000)
            self.mp.setattr(keyindex, "_SST_MIN_ROWS", 200_000)
            return
        self.mp.setattr(metagen, "LOOKUP_COST_IN_ROWS", 0 if mode == "lookups" else 10**12)
        self.mp.setattr(metagen, "GROUP_RECORDS", 2 if mode == "scan" else 20_000_000)
        self.mp.setattr(keyindex, "_SST_MIN_ROWS", 1 if mode == "lookups" else 200_000)

    def pick(self, i: int) -> str:
        """An earlier batch id: mostly one that is not pending, a quarter of the time any."""
        pending = {b for b, _ in self.pending}
        choices = self.ids if i % 4 == 0 else [b for b in self.ids if b not in pending] or self.ids
        return choices[i % len(choices)]

    def make_live(self, version: int) -> dict[str, int]:
        """Applies the pending batches to the oracle, as made live at ``version``; returns their summed counts."""
        total = dict.fromkeys(COUNTS, 0)
        for b, recs in self.pending:
            counts = self.oracle.apply(recs, version, b)
            self.last_counts = counts
            for c in COUNTS:
                total[c] += counts[c]
            self.took[b] = version
            self.live[b] = version
        self.pending = []
        self.ordered.add(version)
        return total

    # -- steps

    def step(self, n: int, s: tuple) -> str:
        t, kind = self.table(), self.kind
        before = t.version
        op = s[0]
        if op == "ingest":
            _, recs, now, mode, retry, form = s
            self.mode(mode)
            batch_id = f"b{n}"
            result = t.ingest(self.input(recs, form), op_column="op", batch_id=batch_id, metagen=now, inline=True)
            assert result.committed and result.version == before + 1 and result.visible == now
            self.ids.append(batch_id)
            self.inputs[batch_id] = list(recs)
            waiting = [b for b, _ in self.pending]
            self.pending.append((batch_id, self.records(recs)))
            if now:
                self.make_live(result.version)
                assert result.counts == self.last_counts, (result.counts, self.last_counts)
                assert tuple(result.processed) == (*waiting, batch_id)
            else:
                assert result.counts == {}
                self.took[batch_id] = result.version
            if retry:
                again = t.ingest(self.arrow(recs), op_column="op", batch_id=batch_id, metagen=True, inline=True)
                assert not again.committed and again.version == result.version and t.version == result.version
                assert again.visible == now
            return f"ingest {batch_id} now={now} {recs}"
        if op == "metagen":
            self.mode(s[1])
            waiting = [b for b, _ in self.pending]
            result = t.metagen(inline=True)
            if not waiting:
                assert not result.committed and t.version == before
                return "metagen (nothing pending)"
            assert result.committed and result.version == before + 1
            counts = self.make_live(result.version)
            assert result.counts == counts, (result.counts, counts)
            assert tuple(result.processed) == tuple(waiting)
            return f"metagen {waiting}"
        if op == "retry":
            if not self.ids:
                return "retry (no batch)"
            batch_id = self.ids[s[1] % len(self.ids)]
            # Half the retries give the batch's own records (a no-op), half others (refused unless equal).
            recs = self.inputs[batch_id] if s[1] % 2 else s[2]
            if self.arrow(recs) != self.arrow(self.inputs[batch_id]):
                with pytest.raises(bitlake.BatchIdReusedError, match=batch_id):
                    t.ingest(self.arrow(recs), op_column="op", batch_id=batch_id, metagen=s[3], inline=True)
                assert t.version == before
                return f"retry {batch_id} (other records: refused)"
            result = t.ingest(self.arrow(recs), op_column="op", batch_id=batch_id, metagen=s[3], inline=True)
            assert not result.committed and t.version == before, result
            assert result.visible == all(b != batch_id for b, _ in self.pending)
            if batch_id in self.took:
                assert result.version == self.took[batch_id], (result, self.took[batch_id])
            return f"retry {batch_id}"
        if op in ("revert", "replace"):
            if not self.ids:
                return f"{op} (no batch)"
            batch_id = self.pick(s[1])
            if any(b == batch_id for b, _ in self.pending):
                with pytest.raises(bitlake.InvalidInputError, match="pending"):
                    if op == "revert":
                        t.revert_batch(batch_id)
                    else:
                        t.replace_batch(batch_id, self.arrow(s[2]), op_column="op")
                assert t.version == before
                return f"{op} {batch_id} (pending: refused)"
            changes_before = len(self.oracle.changes)
            try:
                if op == "revert":
                    result = t.revert_batch(batch_id)
                else:
                    self.mode(s[3])
                    result = t.replace_batch(batch_id, self.input(s[2], s[4]), op_column="op")
            except bitlake.VersionExpiredError:
                assert t.version == before
                # Only when the fold needs a key store from before the window's start (docs/restatement.md,
                # "Retention"; bitlake/engine/write/restate.py, fold_start).
                start = self.fold_start(batch_id)
                assert start is not None and self.window is not None and start <= self.window[0], \
                    (batch_id, start, self.window)
                return f"{op} {batch_id} (expired: refused)"
            start = self.fold_start(batch_id)
            assert self.window is None or start is None or start > self.window[0], (batch_id, start, self.window)
            if op == "revert":
                if batch_id not in self.live:  # reverted already: a retry
                    assert not result.committed and t.version == before, result
                    return f"revert {batch_id} (again: no-op)"
                assert result.committed and result.version == before + 1, result
                self.oracle.revert(batch_id, result.version)
                del self.live[batch_id]
            else:
                assert result.committed and result.version == before + 1, result
                self.oracle.replace(batch_id, self.records(s[2]), result.version)
                self.inputs[batch_id] = list(s[2])
                self.live[batch_id] = result.version
                self.took[batch_id] = result.version
            made = collections.Counter(c for c, _, _ in self.oracle.changes[changes_before:])
            expected = {"inserted": made["insert"], "updated": made["update_preimage"], "deleted": made["delete"]}
            assert {c: result.counts.get(c, 0) for c in expected} == expected, (result.counts, expected)
            return f"{op} {batch_id}" + (f" with {s[2]}" if op == "replace" else "")
        if op == "tombstone":
            column = kind.tombstone_columns[s[1] % len(kind.tombstone_columns)]
            values = [kind.column_value(column, i) for i in s[2]]
            version = t.tombstone(column, values).version
            assert version == before + 1
            self.oracle.tombstone(column, values, version)
            if not s[3]:
                return f"tombstone {column} {values}"
            self.check(full=False)
            return self.step(n, ("vacuum",))
        if op == "vacuum":
            result = t.vacuum()
            if result.version is None:
                assert not self.oracle.tombstones and t.version == before
                return "vacuum (nothing)"
            assert result.version == before + 1
            keep = {*kind.key_names, "mod"}
            self.oracle.vacuum(result.version, lambda row: {c: (v if c in keep else None) for c, v in row.items()})
            return "vacuum"
        if op == "compact":
            result = t.compact()
            assert result.version is None or result.version == before + 1
            return f"compact -> {result.version}"
        if op == "major":
            look_back = max(0, before - s[1])
            previous = self.window
            start = max(look_back, previous[0] if previous else 0)
            result = t.compact(major=True, look_back=look_back)
            if result.version is None:
                assert t.version == before
            else:
                assert result.version == before + 1
                w = result.version if start == before else start
                mark = self.watermark(start)
                if previous is not None:
                    mark = max(mark, previous[1])
                if w != (previous[0] if previous else None):
                    # A window at the latest version starts at this commit, and the look-back's version (the one
                    # before, which reads the same) still reads.
                    self.readable_from = start
                self.window = (w, mark)
            got = t.state().window
            if self.window is None:
                assert got is None
            else:
                assert got is not None and got.version == self.window[0], (got, self.window)
                assert got.watermark == self.window[1], (got, self.window)
            return f"major look_back={look_back} -> {result.version} window={self.window and list(self.window)}"
        if op == "cleanup":
            t.cleanup(min_age_seconds=0)
            assert t.version == before
            if self.window is not None:
                self.earliest = self.window[0]
            return "cleanup"
        raise AssertionError(op)

    def fold_start(self, batch_id: str) -> int | None:
        """The version whose key store a revert of ``batch_id`` folds from: the one that made its current
        incarnation live, or earlier when a restatement since then removed a batch made live before it (the
        key store of that version still holds it; docs/restatement.md, "Retention"). None: no live incarnation
        (reverted already)."""
        live = [inc.version for inc in self.oracle.incarnations if inc.batch_id == batch_id and inc.restated is None]
        if not live:
            return None
        start = live[0]
        while True:
            earlier = [inc.version for inc in self.oracle.incarnations
                       if inc.restated is not None and inc.version < start and inc.restated >= start]
            if not earlier:
                return start
            start = min(earlier)

    def watermark(self, start: int) -> int:
        """The largest delta value of the records made live by ``start`` (any incarnation, stale ones and
        deletes included, and rows a vacuum removed: their records are the batches' still, docs/FORMAT.md,
        "Retention window"; bitlake reads them from the vacuums' purged files)."""
        best = -(1 << 63)
        for inc in self.oracle.incarnations:
            if inc.version <= start:
                best = max([best, *(_micros(r.delta) for r in inc.records)])
        return best

    # -- checks

    def times(self) -> list[Any]:
        k = self.kind
        out = [None, k.below, *(k.delta(d) for d in DELTAS)]
        out += sorted({k.between(d) for d in DELTAS} - set(out), key=_micros)
        return out

    def refused(self, v: int, at: Any) -> bool:
        if self.window is None:
            return False
        return v < self.readable_from or (at is not None and _micros(at) < self.window[1])

    def check_view(self, v: int | None, at: Any) -> None:
        t, cols = self.reader, self.kind.columns
        if v is not None and self.refused(v, at):
            with pytest.raises(bitlake.VersionExpiredError):
                t.to_arrow(version=v, valid_at=at)
            return
        ids = self.rnd.random() < 0.5
        got = t.to_arrow(version=v, valid_at=at, include_row_ids=ids)
        assert got.column_names[:len(cols)] == cols and (ids or got.column_names == cols)
        assert _rows(got.to_pylist(), cols) == _rows(self.oracle.view(at, v), cols), (v, at)
        if ids:  # a row id names one row for ever, whichever version, event time or file reads it
            extra = got.column_names[len(cols):]
            assert extra, "include_row_ids gave no row id columns"
            seen = set()
            for row in got.to_pylist():
                rid, values = tuple(row[c] for c in extra), tuple(_norm(row[c]) for c in cols)
                assert rid not in seen, f"row id {rid} twice in the view at {(v, at)}"
                seen.add(rid)
                assert self.row_ids.setdefault(rid, values) == values, (rid, values, self.row_ids[rid])

    def check_changes(self, lo: int, hi: int) -> None:
        """The feed of commits ``lo + 1`` to ``hi`` (the oracle's ``(lo, hi]``)."""
        t, cols = self.reader, self.kind.columns
        if self.window is not None and lo < self.readable_from:
            with pytest.raises(bitlake.VersionExpiredError):
                t.changes_to_arrow(starting_version=lo + 1, ending_version=hi)
            return
        if lo == hi:  # no commit: a start after the end, after the latest version, or an end before the window
            with pytest.raises((bitlake.InvalidInputError, bitlake.VersionNotFoundError),
                               match="starting_version|ending_version"):
                t.changes_to_arrow(starting_version=lo + 1, ending_version=hi)
            return
        got = _change_rows(t.changes_to_arrow(starting_version=lo + 1, ending_version=hi).to_pylist(), cols)
        expected = [(c, v, tuple(_norm(row[k]) for k in cols)) for c, v, row in self.oracle.changes_between(lo, hi)]
        assert sorted(got) == sorted(expected), (lo, hi)
        assert [v for _, v, _ in got] == sorted(v for _, v, _ in got), "not in commit order"
        for v in self.ordered:  # ingest and MetaGen commits: in acceptance order, a preimage before its postimage
            if lo < v <= hi:
                assert [g for g in got if g[1] == v] == [e for e in expected if e[1] == v], (lo, hi, v)
        kinds = self.rnd.sample(CHANGE_TYPES, self.rnd.randint(1, 3))  # a filter prunes files: the same rows
        some = _change_rows(t.changes_to_arrow(starting_version=lo + 1, ending_version=hi, change_types=kinds).to_pylist(),
                            cols)
        assert sorted(some) == sorted(e for e in expected if e[0] in kinds), (lo, hi, kinds)

    def check_timestamps(self) -> None:
        """Every change row's ``_commit_timestamp`` is its commit's, as history() gives it."""
        t = self.reader
        stamps = {h["version"]: dt.datetime.fromisoformat(h["timestamp"]) for h in t.history()}
        for row in t.changes_to_arrow().to_pylist():  # from the first commit still readable
            assert row["_commit_timestamp"] == stamps[row["_commit_version"]], row

    def check(self, full: bool) -> None:
        self.reader = t = self.table()
        rnd = self.rnd
        latest = t.version
        cols = self.kind.columns
        # The current view, and every event time at the latest version.
        got = t.to_arrow()
        assert _rows(got.to_pylist(), cols) == _rows(self.oracle.view(), cols)
        times = self.times()
        for at in times:
            self.check_view(latest, at)
        # Past versions: all of them (and the refusals before the window), or a sample.
        grid = [(v, at) for v in range(latest) for at in times]
        for v, at in grid if full or FULL else rnd.sample(grid, min(len(grid), 6)):
            self.check_view(v, at)
        # Change ranges: the latest commit's, and random ones.
        if latest:
            self.check_changes(latest - 1, latest)
        pairs = [(lo, hi) for hi in range(latest + 1) for lo in range(hi + 1)]
        for lo, hi in rnd.sample(pairs, min(len(pairs), 3)) + ([(0, latest)] if full else []):
            self.check_changes(lo, hi)
        history = t.history()
        assert [h["version"] for h in history] == list(range(latest, self.earliest - 1, -1))


@pytest.fixture(scope="module", autouse=True)
def _stats():
    yield
    if os.environ.get("BITLAKE_FUZZ_STATS"):
        print("\nstep outcomes:", dict(sorted(STATS.items())))


@pytest.mark.parametrize("kind_name", list(KINDS))
def test_every_operation_at_random_matches_the_oracle(kind_name, monkeypatch):
    kind = KINDS[kind_name]

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), phases=PHASES)
    @given(steps, st.randoms(use_true_random=False))
    def run(plan, rnd):
        path = tempfile.mkdtemp(prefix="bitlake-fuzz-")
        try:
            t = bitlake.create_table(path, kind.schema, primary_key=kind.key_names, delta_column="mod",
                                     num_buckets=3, partition_by=list(kind.partition_by), properties=PROPERTIES)
            r = Run(t, kind, rnd, monkeypatch)
            for n, s in enumerate(plan):
                r.log.append(r.step(n, s))
                note(f"step {n}: {r.log[-1]} (version {t.version})")
                outcome = r.log[-1].split(" ")[0] + (" (" + r.log[-1].split("(")[-1] if r.log[-1].endswith(")") else "")
                event(outcome)
                STATS[outcome] += 1
                r.check(full=s[0] in ("revert", "replace", "tombstone", "vacuum", "compact", "major"))
            if r.pending:
                r.mode("default")
                waiting = [b for b, _ in r.pending]
                result = t.metagen(inline=True)
                assert result.committed and tuple(result.processed) == tuple(waiting)
                assert result.counts == r.make_live(result.version)
            r.check(full=True)
            for lo in range(t.version + 1):
                r.check_changes(lo, t.version)
            r.check_timestamps()
        finally:
            shutil.rmtree(path, ignore_errors=True)

    run()


def test_a_revert_whose_history_starts_before_the_window_is_refused_with_the_versions_that_decide(tmp_path):
    """B was made live after the window's start, but A, made live before it, was reverted after B: the key
    store just before B still holds A, so the fold would start before the window (docs/restatement.md)."""
    schema = pa.schema([("k", pa.int64()), ("value", pa.int64()), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["k"], delta_column="mod")

    def batch(k, value, d):
        return pa.table({"k": [k], "value": [value], "mod": [d]}, schema=schema)

    t.ingest(batch(1, 10, 1), batch_id="A", inline=True)  # v1
    t.ingest(batch(2, 20, 1), batch_id="B", inline=True)  # v2, after the window below
    t.revert_batch("A")  # v3
    t.ingest(batch(3, 30, 1), batch_id="C", inline=True)  # v4, after A's revert
    t.compact(major=True, look_back=2)  # v5: the window starts at version 2
    assert t.state().window.version == 2
    with pytest.raises(bitlake.VersionExpiredError, match=r"made live at version 2, after a batch made live at "
                       r"version 1 that a restatement removed since: .* before version 1, .* \(versions from 2;"):
        t.revert_batch("B")
    assert t.revert_batch("C").committed  # A's revert is not in C's history
    assert [r["k"] for r in t.to_arrow().to_pylist()] == [2]
