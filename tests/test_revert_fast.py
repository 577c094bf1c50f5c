"""A restatement reads of the batches made live after the restated one only the records of the keys it touches
(:func:`bitlake.engine.write.restate._records` with ``of_keys``: the data files' rows of other keys are left out
before they are made keys-file rows). These tests check that the records it folds are those the unfiltered read
gives for those keys, and that reverts and replaces on histories where later batches touched the same keys
(updates, deletes, stale records, restatements of restatements, compacted files holding several batches) give
the views of the contract's model, on a key of two columns (a string among them) and on an integer key. No Spark:
many histories run in a few seconds."""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bitlake
from bitlake.engine.keys import keycache
from bitlake.engine.keys.keyencoding import key_codes
from bitlake.engine.write import metagen, restate
from bitlake.format import commitlog, datafile, keystore, prior, rowid
from bitlake.format import state as state_mod
from bitlake.format.commit import LIVE
from bitlake.format.state import TableState
from tests.oracle import Oracle, Record, rows_key

SCHEMAS = {
    "two-column key": (pa.schema([("a", pa.int32()), ("b", pa.string()), ("value", pa.int64()), ("mod", pa.int64())]),
                       ["a", "b"]),
    "int key": (pa.schema([("a", pa.int64()), ("value", pa.int64()), ("mod", pa.int64())]), ["a"]),
}
COLUMNS = {"two-column key": ["a", "b", "value", "mod"], "int key": ["a", "value", "mod"]}

record = st.tuples(st.integers(0, 7), st.integers(0, 6), st.sampled_from(["upsert", "upsert", "delete"]),
                   st.integers(0, 99))
records = st.lists(record, min_size=1, max_size=10)
step = st.one_of(
    st.tuples(st.just("ingest"), records),
    st.tuples(st.just("ingest"), records),
    st.tuples(st.just("revert"), st.integers(0, 20)),
    st.tuples(st.just("replace"), st.integers(0, 20), records),
    st.tuples(st.just("compact")),
)


def _key(name: str, k: int) -> dict:
    return {"a": k % 3, "b": f"k{k}"} if name == "two-column key" else {"a": k}


def _arrow(name: str, recs) -> pa.Table:
    schema, _ = SCHEMAS[name]
    rows = [{**_key(name, k), "value": None if op == "delete" else v, "mod": d, "op": op} for k, d, op, v in recs]
    return pa.Table.from_pylist(rows, schema=schema.append(pa.field("op", pa.string())))


def _records(name: str, recs) -> list[Record]:
    pk = SCHEMAS[name][1]
    out = []
    for k, d, op, v in recs:
        key = _key(name, k)
        out.append(Record(tuple(key[c] for c in pk), d, op, None if op == "delete" else {**key, "value": v, "mod": d}))
    return out


def _check_filtered_reads(t: bitlake.Table, name: str, rnd: np.random.Generator) -> None:
    """For the batches made live after each live batch, the records of a few keys read with ``of_keys`` are the
    unfiltered read's records of those keys."""
    state = t.state()
    meta = state.metadata
    pk = list(meta.primary_key)
    for b in [b for b in state.parts.values() if b.status == LIVE]:
        later = [x for x in state.parts.values() if x.status == LIVE and x.live_version is not None
                 and x.live_version >= b.live_version and x.part != b.part]
        if not later:
            continue
        files, keys_files = restate._files_of(state, later)
        parts = [x.part for x in later]
        everything = restate._records(t.io, meta, files, keys_files, parts)
        if not everything.num_rows:
            continue
        distinct = everything.take(pa.array(key_codes(everything, pk)[1])).select(pk)
        some = distinct.take(pa.array(np.flatnonzero(rnd.random(distinct.num_rows) < 0.5)))
        got = restate._records(t.io, meta, files, keys_files, parts, some)
        want = everything.join(some, keys=pk, join_type="left semi")
        assert got.sort_by(keystore.ROW_ID).to_pylist() == want.sort_by(keystore.ROW_ID).to_pylist()
        _check_keystore_read_for_some_keys(t, state_mod.load(t.io, b.live_version - 1), some)
        _check_prior_entries(t, state, b.live_version)
        # A keys file read for some keys (Polars decodes only the rows that may match) or some batches' rows
        # holds the unfiltered read's rows of those.
        firsts = pc.unique(some.column(pk[0]))
        for f in keys_files:
            whole = datafile.read_keys(t.io, f.path, meta)
            of_parts = whole.filter(pa.array(np.isin(whole.column(keystore.ROW_ID).to_numpy() >> rowid.PART_SHIFT,
                                                     parts)))
            got = restate._of_keys(restate._keys_rows(t.io, meta, [f.path], firsts)[0], some)
            assert got.to_pylist() == whole.join(some, keys=pk, join_type="left semi").sort_by(
                keystore.ROW_ID).to_pylist() == got.sort_by(keystore.ROW_ID).to_pylist()
            assert restate._keys_rows(t.io, meta, [f.path], parts=parts)[0].to_pylist() == of_parts.to_pylist()


def _check_prior_entries(t: bitlake.Table, state: TableState, version: int) -> None:
    """The entries the prior-entries files of the commit ``version`` give (with its log) for the keys of each batch it
    made live are those a search of the key store of the version before it finds, for every key of the batch."""
    c = commitlog.read(t.io, version)
    if not c.prior_entries:
        return
    meta = state.metadata
    for part in [b.part for b in c.batches if b.status == LIVE]:
        gone = restate._records(t.io, meta, *restate._files_of(state, [state.parts[part]]), [part])
        if not gone.num_rows:
            continue
        keys = restate._touched_keys(t.io, state, gone, gone, datafile.keys_schema(meta).empty_table(), [], [])
        n = keys.distinct.num_rows
        got = (np.zeros(n, bool), np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool))
        assert restate._prior_entries(t.io, c, part, keys, got).all()
        want = metagen.scan_keystore(t.io, state_mod.load(t.io, version - 1), keys.distinct,
                                     sorted(set(keys.distinct.column(keystore.BUCKET).to_pylist())))
        np.testing.assert_array_equal(got[0], want[0])
        for g, w in zip(got[1:], want[1:], strict=True):
            np.testing.assert_array_equal(g[want[0]], w[want[0]])


def _check_keystore_read_for_some_keys(t: bitlake.Table, at: TableState, some: pa.Table) -> None:
    """The key-store entries of keys ``some`` at ``at`` (a restatement's version before its fold), read from their
    files for those keys only, as a process that holds none of them reads them, are those of the whole files."""
    wanted = keystore.with_buckets(some, at.metadata)
    buckets = sorted(set(wanted.column(keystore.BUCKET).to_pylist()))
    whole = metagen.scan_keystore(t.io, at, wanted, buckets)
    held, few = keycache.CACHE, keycache.FEW_OF_FILE
    keycache.CACHE, keycache.FEW_OF_FILE = keycache.KeyStoreCache(0), 0
    try:
        found, *values = metagen.scan_keystore(t.io, at, wanted, buckets, keep=False)
    finally:
        keycache.CACHE, keycache.FEW_OF_FILE = held, few
    np.testing.assert_array_equal(found, whole[0])
    for got, want in zip(values, whole[1:], strict=True):
        np.testing.assert_array_equal(got[found], want[found])


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_reverts_of_histories_with_later_batches_match_the_model(name, monkeypatch):
    # Every commit on a key store with rows writes its prior entries, which most reverts then start from.
    monkeypatch.setattr(metagen, "PRIOR_SHARE", 0)
    schema, pk = SCHEMAS[name]
    columns = COLUMNS[name]

    @settings(max_examples=int(os.environ.get("BITLAKE_MODEL_EXAMPLES", "12")), deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(step, min_size=3, max_size=10), st.integers(0, 2**31))
    def run(steps, seed):
        rnd = np.random.default_rng(seed)
        path = tempfile.mkdtemp(prefix="bitlake-revert-fast-")
        try:
            t = bitlake.create_table(path, schema, primary_key=pk, delta_column="mod", num_buckets=2,
                                     properties={"keystore.max_increments": "2"})
            oracle = Oracle()
            ids: list[str] = []
            for n, s in enumerate(steps):
                if s[0] == "ingest":
                    ids.append(f"b{n}")
                    t.ingest(_arrow(name, s[1]), op_column="op", batch_id=ids[-1])
                    oracle.apply(_records(name, s[1]), t.version, ids[-1])
                elif s[0] == "compact":
                    t.compact()
                elif ids:
                    batch_id = ids[s[1] % len(ids)]
                    if s[0] == "revert":
                        if t.revert_batch(batch_id).committed:
                            oracle.revert(batch_id, t.version)
                    else:
                        t.replace_batch(batch_id, _arrow(name, s[2]), op_column="op")
                        oracle.replace(batch_id, _records(name, s[2]), t.version)
                    assert rows_key(t.to_arrow().to_pylist(), columns) == rows_key(oracle.view(), columns), n
                _check_filtered_reads(t, name, rnd)
            for v in range(t.version + 1):
                for at in (None, 2, 4):
                    assert rows_key(t.to_arrow(version=v, valid_at=at).to_pylist(), columns) == \
                        rows_key(oracle.view(at, v), columns), (v, at)
            if t.version == 0:
                return
            expected = sorted((c, v, tuple(row[k] for k in columns)) for c, v, row in oracle.changes_between(0, t.version))
            got = sorted((r["_change_type"], r["_commit_version"], tuple(r[c] for c in columns))
                         for r in t.changes_to_arrow(starting_version=1, ending_version=t.version).to_pylist())
            assert got == expected
        finally:
            shutil.rmtree(path, ignore_errors=True)

    run()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 5), st.integers(-1, 5)), max_size=40))
def test_change_rows_are_the_difference_of_each_keys_row(pairs):
    """restate.diff (built in place order with numpy) against the rule written out key by key."""
    before = np.array([b for b, _ in pairs], dtype=np.int64)
    after = np.array([a for _, a in pairs], dtype=np.int64)
    want, counts = [], {"updated": 0, "deleted": 0, "inserted": 0}
    for i, (b, a) in enumerate(pairs):
        if b == a:
            continue
        if b != restate.NO_ROW and a != restate.NO_ROW:
            want += [(b, "update_preimage", 2 * i), (a, "update_postimage", 2 * i + 1)]
            counts["updated"] += 1
        elif b != restate.NO_ROW:
            want.append((b, "delete", 2 * i))
            counts["deleted"] += 1
        else:
            want.append((a, "insert", 2 * i + 1))
            counts["inserted"] += 1
    changes, got_counts = restate.diff(before, after)
    assert [tuple(r.values()) for r in changes.to_pylist()] == want
    assert {k: got_counts[k] for k in counts} == counts and sum(got_counts.values()) == sum(counts.values())


def test_a_batchs_records_are_read_from_the_row_groups_holding_it(tmp_path, monkeypatch):
    """After a compaction a file holds several batches' rows, in row-id order: the records of one batch come from
    the row groups whose ``_segment_part`` statistics may hold it, and a revert folds them as before."""
    import pyarrow.parquet as pq

    from bitlake.format import datafile, rowid

    monkeypatch.setattr(datafile, "ROW_GROUP_ROWS", 16)
    schema, pk = SCHEMAS["int key"]
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=pk, delta_column="mod")
    for n in range(4):  # batch n adds keys 100n..100n+99; batch 2 also updates keys 100..109 of batch 1
        recs = [(k, n, "upsert", k) for k in range(100 * n, 100 * n + 100)]
        t.ingest(_arrow("int key", recs + [(k, n, "upsert", -k) for k in range(100, 110) if n == 2]),
                 batch_id=f"b{n}", op_column="op")
    while t.compact(dry_run=True)["files"]:  # the wasteful file first, then a tier of small ones
        t.compact()
    state = t.state()
    part = next(p for p, b in state.parts.items() if b.batch_id == "b1")
    # the small files merged, the 10 rows of batch 1 that batch 2 superseded in a file of history rows
    f = max((f for f in state.data_files() if part in {r.part for r in f.segments}), key=lambda f: len(f.segments))
    assert len({r.part for r in f.segments}) == 4
    groups = datafile._groups_of_parts(pq.ParquetFile(t.io.open_input(f.path)), np.array([part]))
    assert 0 < len(groups) < pq.ParquetFile(t.io.open_input(f.path)).num_row_groups
    rows = datafile.read_data(t.io, f.path, state.metadata, parts=np.array([part]))
    assert rows.num_rows == 90 and set(rows.column(rowid.PART_COLUMN).to_pylist()) == {part}
    t.revert_batch("b1")
    want = {k: k for k in range(400) if not 110 <= k < 200} | {k: -k for k in range(100, 110)}
    assert {r["a"]: r["value"] for r in t.to_arrow().to_pylist()} == want
    t.revert_batch("b2")
    assert {r["a"]: r["value"] for r in t.to_arrow().to_pylist()} == {k: k for k in [*range(100), *range(300, 400)]}


def test_a_small_batchs_revert_starts_from_the_prior_entries_its_commit_wrote(tmp_path, monkeypatch):
    """A batch of few records against the key store (a PRIOR_SHARE-th of its rows at most) writes its keys' entries
    before it (those that had one: an update's row, a delete marker); its revert starts from them and searches the
    key store of the version before it only for the keys they cannot answer (a replacement's new ones). A load writes
    none; cleanup keeps them while their version may be restated; only writers that know them may write."""
    schema, pk = SCHEMAS["int key"]
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=pk, delta_column="mod")
    t.ingest(_arrow("int key", [(k, 1, "upsert", k) for k in range(200)]), batch_id="load", op_column="op")
    assert not commitlog.read(t.io, 1).prior_entries  # no key had an entry
    t.ingest(_arrow("int key", [(5, 2, "delete", 0)]), batch_id="gone5", op_column="op")
    small = [(3, 3, "upsert", -3), (5, 3, "upsert", -5), (5, 4, "upsert", -50), (900, 3, "upsert", 9),
             (4, 0, "upsert", 1)]
    t.ingest(_arrow("int key", small), batch_id="small", op_column="op")
    c = commitlog.read(t.io, t.version)
    assert len(c.prior_entries) == 1 and "priorEntries" in t.state().protocol.writer_features
    assert "priorEntries" not in t.state().protocol.reader_features
    # A row a record, in row-id order (the batch's order here): the load's row of 3, ended by this commit (its row
    # id left to the log); the marker of 5 (twice: two records); nothing for 900; the load's row of 4, which the
    # stale record did not end.
    rows = prior.read(t.io, c.prior_entries[0], c.batches[0].part).to_pydict()
    load_part = t.state().parts[min(t.state().parts)].part
    marker = rowid.pack(t.state().parts[load_part + 1].part, 0, 0)
    assert rows[prior.DELTA] == [1, 2, 2, None, 1]
    assert rows[prior.PRIOR_ROW_ID] == [None, marker, marker, None, rowid.pack(load_part, 0, 4)]
    assert rows[prior.DELETED] == [False, True, True, False, False]
    t.ingest(_arrow("int key", [(3, 5, "upsert", 33), (900, 2, "upsert", 0)]), batch_id="later", op_column="op")
    removed = t.cleanup(min_age_seconds=0)
    assert removed and not [p for p in removed if p.startswith("_bitlake/keystore")]  # part claims, no more

    searched = []
    scan = metagen.scan_keystore
    monkeypatch.setattr(metagen, "scan_keystore", lambda io, at, keys, *a, **k: searched.append(
        keys.column("a").to_pylist()) or scan(io, at, keys, *a, **k))
    # The replaced batch's keys (3, 900) come from its commit's file; the replacement's new key 7 is searched for.
    t.replace_batch("later", _arrow("int key", [(3, 6, "upsert", 36), (7, 6, "upsert", 70)]), op_column="op")
    assert searched == [[7]]
    base = {k: k for k in range(200) if k != 5}
    assert {r["a"]: r["value"] for r in t.to_arrow().to_pylist()} == base | {3: 36, 5: -50, 7: 70, 900: 9}
    t.revert_batch("small")
    assert searched == [[7]]
    # 4: the load's row (the small batch's record was stale); 5: deleted again; 900: no record left
    assert {r["a"]: r["value"] for r in t.to_arrow().to_pylist()} == base | {3: 36, 7: 70}


def test_the_rows_of_consecutive_batches_are_one_range_of_row_ids():
    s = rowid.PART_SHIFT
    assert restate._part_ranges([9, 4, 3, 5, 4]) == [(3 << s, 6 << s), (9 << s, 10 << s)]
    assert restate._part_ranges([]) == []
