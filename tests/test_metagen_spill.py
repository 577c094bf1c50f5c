"""The inline MetaGen of a large commit folds its records from a spill, a group of buckets at a time
(bitlake.engine.write.metagen._run_spilled): the same views, counts, change feed and key store as the fold of
the whole commit at once, which tests/test_fuzz_driver.py also checks against the oracle (its streamed form
spills)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

import bitlake
from bitlake.engine.write import metagen, spill
from bitlake.format import keystore
from tests import spec_reader
from tests.oracle import rows_key

SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string()), ("v", pa.int64()), ("op", pa.string())])


def _batch(keys, v, ops=None) -> pa.Table:
    keys = list(keys)
    return pa.table({"k": keys, "s": [f"s{k % 7}-{v}" for k in keys], "v": [v] * len(keys),
                     "op": ops or ["upsert"] * len(keys)}, schema=SCHEMA)


def _workload(t: bitlake.Table) -> None:
    rng = np.random.default_rng(7)
    t.ingest(_batch(range(400), 1), op_column="op")  # a load
    t.ingest(_batch(rng.choice(600, 300, replace=False).tolist(), 3), op_column="op")  # updates and inserts
    keys = rng.choice(600, 120, replace=False).tolist()
    t.ingest(_batch(keys, 2, ["delete" if i % 3 else "upsert" for i in range(120)]), op_column="op")  # some stale
    t.ingest(_batch(range(0, 600, 5), 4, ["delete"] * 120), op_column="op", batch_id="late", metagen=False)
    t.ingest(_batch(range(1, 600, 7), 5), op_column="op", batch_id="later", metagen=False)
    t.metagen()  # two pending batches in one commit
    t.ingest(pa.RecordBatchReader.from_batches(SCHEMA, _batch(range(0, 700, 3), 6).to_batches(max_chunksize=50)),
             op_column="op")  # a stream: its records read back from the files


def _keystore(t: bitlake.Table) -> list[tuple]:
    """Each key's latest key-store row (key, delta, deleted), from the latest state's files."""
    rows = [keystore.read_file(t.io, f, t.state().metadata) for fs in t.state().keystore.values() for f in fs]
    latest: dict = {}
    for r in pa.concat_tables(rows).to_pylist():
        if r["k"] not in latest or r[keystore.VERSION] > latest[r["k"]][keystore.VERSION]:
            latest[r["k"]] = r
    return sorted((k, r[keystore.DELTA], r[keystore.DELETED]) for k, r in latest.items())


def _assert_same_commits(folded: bitlake.Table, whole: bitlake.Table) -> None:
    """``folded`` committed what ``whole`` (the same batches, each commit folded at once) did: the counts, the view
    at every version (also as the format's spec reads it), the change feed and the key store."""
    names = SCHEMA.remove(3).names
    assert [h["counts"] for h in folded.history()] == [h["counts"] for h in whole.history()]
    for v in range(whole.version + 1):
        assert rows_key(folded.to_arrow(version=v).to_pylist(), names) == \
            rows_key(whole.to_arrow(version=v).to_pylist(), names), v
    assert rows_key(spec_reader.read_view(folded.path), names) == rows_key(folded.to_arrow().to_pylist(), names)
    changes = [c for c in folded.changes_to_arrow(starting_version=1).column_names if c != "_commit_timestamp"]
    assert rows_key(folded.changes_to_arrow(starting_version=1).select(changes).to_pylist(), changes) == \
        rows_key(whole.changes_to_arrow(starting_version=1).select(changes).to_pylist(), changes)
    assert _keystore(folded) == _keystore(whole)


def _index_levels(t: bitlake.Table) -> list[int]:
    """The files at each level of ``t``'s key index (open in this process), once it has flushed."""
    from bitlake.engine.keys import indexsession, keyindex

    indexsession.flush_idle()
    index = indexsession._kept[keyindex.location(t.io, t.metadata)[0]].index
    return [index.db.property_int_value(f"rocksdb.num-files-at-level{i}") for i in range(7)]


def _ranged_load(monkeypatch, create, load) -> tuple[bitlake.Table, list]:
    """A table ``create()`` makes, loaded by ``load`` with spill groups of 40 records into its 4 buckets, so that the
    load folds by 6 ranges of its first key column: checks that it cut 6 ranges a bucket, each a key-store base file,
    whose index entries went in as SST files all at the bottom (the ranges never overlap). Returns the table and the
    cuts of every commit (``_key_ranges``'s answers)."""
    from bitlake.engine.keys import keyindex

    cuts = []
    real = metagen._key_ranges
    monkeypatch.setattr(metagen, "_key_ranges", lambda *a: cuts.append(real(*a)) or cuts[-1])
    monkeypatch.setattr(metagen, "SPILL_RECORDS", 0)
    monkeypatch.setattr(metagen, "SPILL_GROUP_RECORDS", 40)  # > 4 buckets x 40 records: ranges of ~20 records
    monkeypatch.setattr(keyindex, "_PROCESS_SST_ROWS", 1)  # every range stages its entries as SST files
    ranged = create()
    load(ranged)
    assert cuts[0] is not None and len(cuts[0]) == 5  # 6 ranges
    assert all(len(files) == 6 and all(f.base for f in files) for files in ranged.state().keystore.values())
    levels = _index_levels(ranged)
    assert levels[0] <= 1 and levels[1:6] == [0] * 5 and levels[6] >= 24, levels  # ranges never overlap
    return ranged, cuts


def test_a_spilled_metagen_commits_what_the_whole_fold_commits(tmp_path, monkeypatch):
    whole = bitlake.create_table(str(tmp_path / "whole"), SCHEMA.remove(3), primary_key="k", delta_column="v",
                                 num_buckets=8)
    _workload(whole)
    runs, groups = [], []
    real_run, real_init = metagen._run_spilled, spill.Spill.__init__
    monkeypatch.setattr(metagen, "_run_spilled", lambda *a: runs.append([b.spilled is not None for b in a[2]]) or
                        real_run(*a))
    monkeypatch.setattr(spill.Spill, "__init__", lambda self, n: groups.append(n) or real_init(self, n))
    monkeypatch.setattr(metagen, "SPILL_RECORDS", 0)  # every landing keeps its records' keys in scratch files
    monkeypatch.setattr(spill, "MAX_GROUPS", 3)  # groups of a few buckets each
    spilled = bitlake.create_table(str(tmp_path / "spilled"), SCHEMA.remove(3), primary_key="k", delta_column="v",
                                   num_buckets=8)
    _workload(spilled)
    # Every MetaGen spilled (5 of them): the landings' own records from their scratch files, the two pending
    # batches' from their files.
    assert runs == [[True], [True], [True], [False, False], [True]]
    assert set(groups) == {3}
    _assert_same_commits(spilled, whole)
    assert not [d for d in os.listdir(os.environ.get("TMPDIR", "/tmp")) if d.startswith("bitlake-metagen-")]


def test_the_spill_parts_rows_in_order_and_removes_its_files():
    table = pa.table({"x": list(range(10))})
    with spill.Spill(3) as parts:
        folder = parts._folder
        parts.add(table, np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0]))
        parts.add(table.slice(0, 2), np.array([2, 2]))
        assert parts.take(0).column("x").to_pylist() == [0, 3, 6, 9]
        assert parts.take(2).column("x").to_pylist() == [2, 5, 8, 0, 1]
        assert parts.take(0) is None  # taken: its file is gone
    assert not os.path.exists(folder)
    with pytest.raises(RuntimeError), spill.Spill(2) as parts:
        parts.add(table, np.zeros(10, np.int64))
        folder = parts._folder
        raise RuntimeError("a failed MetaGen")
    assert not os.path.exists(folder)


def _keys_rows(keys, bucket_count: int) -> pa.Table:
    keys = list(keys)
    return pa.table({"k": pa.array(keys, pa.int64()), keystore.BUCKET: pa.array([k % bucket_count for k in keys],
                                                                               pa.int32())})


def test_kept_rows_stay_in_memory_then_spill_by_group_in_segment_order_then_go():
    kept = spill.KeptRows(in_memory=10, at_most=100, num_buckets=4, first_key="k")
    kept.add(1, _keys_rows(range(100, 104), 4))
    kept.add(0, _keys_rows(range(4), 4))
    assert not kept.spilled and kept.complete
    assert kept.table(pa.schema([])).column("k").to_pylist() == [0, 1, 2, 3, 100, 101, 102, 103]  # segment order

    kept = spill.KeptRows(in_memory=10, at_most=100, num_buckets=4, first_key="k")
    kept.add(1, _keys_rows(range(100, 108), 4))
    kept.end(1)
    kept.add(0, _keys_rows(range(8), 4))  # past 10 records: what was held goes to the spill, segment 1's ended
    kept.add(0, _keys_rows(range(8, 12), 4))
    kept.end(0)
    assert kept.spilled and kept.complete and kept.table(pa.schema([])) is None
    assert [t.column("k").to_pylist() for t in kept.group(1)] == [[1, 5, 9], [101, 105]]
    assert [t.column("k").to_pylist() for t in kept.group(1)] == [[1, 5, 9], [101, 105]]  # read again: kept
    assert sorted(v.as_py() for v in kept.bounds)[::len(kept.bounds) - 1] == [0, 107]
    folders = [s._folder for s in kept._spills.values()]
    assert all(os.path.exists(f) for f in folders)
    kept.remove()
    assert not any(os.path.exists(f) for f in folders)

    kept = spill.KeptRows(in_memory=4, at_most=6, num_buckets=4, first_key="k")
    kept.add(0, _keys_rows(range(5), 4))
    folders = [s._folder for s in kept._spills.values()]
    kept.add(1, _keys_rows(range(5, 10), 4))  # past at_most: nothing is kept, the spilled files go
    assert not kept.complete and not kept.spilled and kept.table(pa.schema([])) is None
    assert folders and not any(os.path.exists(f) for f in folders)
    one = spill.KeptRows(in_memory=4, at_most=100, num_buckets=1, first_key="k")
    one.add(0, _keys_rows(range(5), 1))  # one bucket: nothing to part by, so nothing is spilled
    assert not one.complete and not one.spilled


def test_a_landing_no_inline_metagen_takes_keeps_nothing(tmp_path, monkeypatch):
    """A batch only landed (``metagen=False``) keeps none of its records' keys: its MetaGen reads its files later."""
    made = []
    real_init = spill.Spill.__init__
    monkeypatch.setattr(spill.Spill, "__init__", lambda self, n: made.append(n) or real_init(self, n))
    monkeypatch.setattr(metagen, "SPILL_RECORDS", 0)  # any kept rows would go to scratch files
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA.remove(3), primary_key="k", delta_column="v", num_buckets=4)
    t.ingest(_batch(range(100), 1), op_column="op", metagen=False)
    assert made == []
    r = t.metagen()  # folded from a spill of the batch's files
    assert r.counts["inserted"] == 100 and made and t.to_arrow().num_rows == 100


def test_a_spilled_load_goes_into_the_key_index_as_one_run_at_the_bottom(tmp_path, monkeypatch):
    """The index's keys start with the bucket: the groups of a spilled MetaGen (runs of buckets) stage SST files
    that overlap no other group's, which RocksDB puts at its bottom level, leaving nothing to compact."""
    from bitlake.engine.keys import indexsession, keyindex

    monkeypatch.setattr(metagen, "SPILL_RECORDS", 0)
    monkeypatch.setattr(metagen, "SPILL_GROUP_RECORDS", 90)
    monkeypatch.setattr(keyindex, "_PROCESS_SST_ROWS", 1)  # every group stages its entries as SST files
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA.remove(3), primary_key="k", delta_column="v",
                             num_buckets=8)
    t.ingest(_batch(range(400), 1), op_column="op")
    levels = _index_levels(t)
    # 5 groups' files, all at the bottom; the first level holds the flush of the index's version entries alone
    assert levels[0] <= 1 and levels[1:6] == [0] * 5 and levels[6] >= 5, levels
    r = t.ingest(_batch(range(350, 450), 2), op_column="op")
    assert r.counts == {"inserted": 50, "updated": 50, "deleted": 0, "stale": 0, "ignored_deletes": 0}
    r = t.ingest(_batch(range(300, 320), 1), op_column="op")  # ties with the load's delta: accepted
    assert r.counts["updated"] == 20
    indexsession.close_idle()


@pytest.mark.parametrize("stream", [False, True])
def test_a_load_too_large_for_its_buckets_folds_by_key_ranges(tmp_path, monkeypatch, stream):
    """A load whose buckets each hold more records than a group folds each bucket by ranges of its first key column
    (metagen._key_ranges): a key-store base file a range, index entries staged range after range, and the same
    views, counts, change feed and key store as the fold of the whole commit at once."""
    from bitlake.engine.keys import indexsession

    def load(t: bitlake.Table) -> None:
        keys = [k - 200 for k in range(400)] + [5, -7, 150]  # negative keys, and three keys twice
        batch = _batch(keys, 1)
        t.ingest(pa.RecordBatchReader.from_batches(SCHEMA, batch.to_batches(max_chunksize=64)) if stream else batch,
                 op_column="op")

    whole = bitlake.create_table(str(tmp_path / "whole"), SCHEMA.remove(3), primary_key="k", delta_column="v",
                                 num_buckets=4)
    load(whole)
    _workload(whole)
    ranged, cuts = _ranged_load(monkeypatch, lambda: bitlake.create_table(  # 403 records: 6 ranges of -200 .. 199
        str(tmp_path / "ranged"), SCHEMA.remove(3), primary_key="k", delta_column="v", num_buckets=4), load)
    _workload(ranged)
    assert all(c is None for c in cuts[1:])  # later commits: the table has key-store files
    _assert_same_commits(ranged, whole)
    indexsession.close_idle()


@pytest.mark.parametrize("stream", [False, True])
def test_a_load_keyed_by_a_date_then_a_string_folds_by_ranges_of_the_date(tmp_path, monkeypatch, stream):
    """The key ranges of a load cut any first key column of fixed width (here a date, before a string column):
    a key's encoding starts with that column's 8 bytes, so its ranges follow the key index's order too. Their
    bounds come from the records the landing kept, or from a stream's data files' statistics."""
    import datetime as dt

    schema = pa.schema([("day", pa.date32()), ("name", pa.string()), ("v", pa.int64()), ("op", pa.string())])
    names = schema.remove(3).names
    start = dt.date(2019, 12, 1)

    def batch(numbers, v, op="upsert") -> pa.Table:
        numbers = list(numbers)
        return pa.table({"day": [start + dt.timedelta(days=n // 3) for n in numbers],
                         "name": [f"n{n % 3}" for n in numbers], "v": [v] * len(numbers),
                         "op": [op] * len(numbers)}, schema=schema)

    def load(t: bitlake.Table) -> None:
        records = pa.concat_tables([batch(range(450), 1), batch([7, 8, 300], 1)])  # 3 keys twice
        t.ingest(pa.RecordBatchReader.from_batches(schema, records.to_batches(max_chunksize=64)) if stream
                 else records, op_column="op")

    def workload(t: bitlake.Table) -> None:
        t.ingest(batch(range(400, 520), 2), op_column="op")  # updates and inserts
        t.ingest(batch(range(0, 450, 9), 3, "delete"), op_column="op")

    def create(name: str) -> bitlake.Table:
        return bitlake.create_table(str(tmp_path / name), schema.remove(3), primary_key=["day", "name"],
                                    delta_column="v", num_buckets=4)

    from bitlake.engine.keys import indexsession

    whole = create("whole")
    load(whole)
    workload(whole)
    ranged, cuts = _ranged_load(monkeypatch, lambda: create("ranged"), load)  # 453 records: 6 ranges of the days
    workload(ranged)
    assert all(c is None for c in cuts[1:])
    assert [h["counts"] for h in ranged.history()] == [h["counts"] for h in whole.history()]
    for v in range(whole.version + 1):
        assert rows_key(ranged.to_arrow(version=v).to_pylist(), names) == \
            rows_key(whole.to_arrow(version=v).to_pylist(), names), v
    assert ranged.to_arrow().num_rows == 520 - 50
    indexsession.close_idle()
