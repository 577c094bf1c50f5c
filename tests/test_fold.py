"""The inline MetaGen's vectorised fold against a plain loop over the contract (no Spark)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from bitlake.engine.keys import keycache
from bitlake.engine.write.fold import fold
from bitlake.engine.write.segments import segment_runs
from bitlake.format import keystore, rowid


def reference(codes, deltas, rids, deleted, batch, found, prior_d, prior_rid, prior_deleted):
    """Record by record, as docs/semantics.md rules 1-2 state the contract.

    Returns per input row (accepted, until, last rid), and the rows that end up last per key."""
    n = len(codes)
    accepted, until, last_rid = [False] * n, [False] * n, [None] * n
    final = {}
    last = {g: (prior_d[g], prior_rid[g], bool(prior_deleted[g])) for g in range(len(found)) if found[g]}
    for i in sorted(range(n), key=lambda i: (codes[i], batch[i], deltas[i], rids[i])):
        g = codes[i]
        if g in last and deltas[i] < last[g][0]:
            continue
        accepted[i] = True
        if g in last and not last[g][2]:
            until[i], last_rid[i] = True, last[g][1]
        last[g] = (deltas[i], rids[i], bool(deleted[i]))
        final[g] = i
    return accepted, until, last_rid, sorted(final.values())


record = st.tuples(st.integers(0, 5), st.integers(-3, 3), st.booleans(), st.integers(0, 2))
prior = st.tuples(st.booleans(), st.integers(-3, 3), st.booleans())


@settings(max_examples=400, deadline=None)
@given(st.lists(record, min_size=1, max_size=40), st.lists(prior, min_size=6, max_size=6), st.sampled_from([1, 10**15]))
def test_fold_matches_the_contract_loop(records, priors, scale):
    # Codes must be 0..k-1, each present; keep the keys that occur, renumbered.
    present = sorted({r[0] for r in records})
    number = {key: i for i, key in enumerate(present)}
    codes = np.array([number[r[0]] for r in records])
    deltas = np.array([r[1] * scale for r in records], dtype=np.int64)
    rids = np.arange(len(records), dtype=np.int64) + 1000
    deleted = np.array([r[2] for r in records])
    batch = np.array([r[3] for r in records])
    found = np.array([priors[k][0] for k in present])
    prior_d = np.array([priors[k][1] * scale for k in present], dtype=np.int64)
    prior_rid = np.arange(len(present), dtype=np.int64)
    prior_deleted = np.array([priors[k][2] for k in present])

    f = fold(codes, deltas, rids, deleted, batch, found, prior_d, prior_rid, prior_deleted)
    accepted, until, last_rid, final = reference(codes, deltas, rids, deleted, batch, found, prior_d, prior_rid,
                                                 prior_deleted)
    assert f.accepted.tolist() == [accepted[i] for i in f.order]
    assert f.until.tolist() == [until[i] for i in f.order]
    assert [int(x) for x, u in zip(f.last_rid, f.until, strict=True) if u] == [last_rid[i] for i in f.order if until[i]]
    assert sorted(f.final.tolist()) == final


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, rowid.MAX_PART]), st.sampled_from([0, 1, rowid.MAX_SEQ]),
                          st.sampled_from([0, 1, rowid.MAX_OFFSET])), max_size=30))
def test_segment_runs_cut_sorted_row_ids_by_segment_up_to_the_last_one(ids):
    packed = np.unique(np.array([rowid.pack(*i) for i in ids], dtype=np.int64))
    runs = segment_runs(packed)
    expected: dict[int, list[int]] = {}
    for p in packed.tolist():
        expected.setdefault(p >> rowid.OFFSET_BITS, []).append(p)
    assert {seg: run.tolist() for seg, run in runs.items()} == expected


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 5), st.integers(0, 3)), max_size=30, unique=True),
       st.lists(st.tuples(st.integers(-6, 6), st.integers(0, 3)), max_size=20, unique=True),
       st.booleans(), st.sampled_from(["int", "string"]), st.booleans())
def test_key_store_entries_match_keys_as_a_hash_join_does(stored_keys, wanted_keys, in_order, kind, one_delta):
    """Keys of integer columns, held packed in the file's order, are found by binary search; others (and files out
    of order) by a hash join; a column of one value is held as a broadcast scalar."""
    if in_order:
        stored_keys = sorted(stored_keys)
    to = (lambda v: v) if kind == "int" else (lambda v: f"k{v:+d}")
    a, b = (list(c) for c in zip(*stored_keys, strict=True)) if stored_keys else ([], [])
    n = len(a)
    stored = pa.table({"a": pa.array([to(v) for v in a], pa.int64() if kind == "int" else pa.string()),
                       "b": pa.array(b, pa.int32()), keystore.DELTA: pa.array([7 if one_delta else i for i in range(n)],
                                                                               pa.int64()),
                       keystore.ROW_ID: pa.array(range(n), pa.int64()), keystore.DELETED: pa.array([i % 2 == 0 for i in range(n)], pa.bool_()),
                       keystore.VERSION: pa.array([3] * n, pa.int64())})
    wa, wb = (list(c) for c in zip(*wanted_keys, strict=True)) if wanted_keys else ([], [])
    keys = pa.table({"a": pa.array([to(v) for v in wa], stored.schema.field("a").type),
                     "b": pa.array(wb, pa.int32()), "_code": pa.array(range(len(wa)), pa.int64())})
    entries = keycache.Entries(stored, ["a", "b"])
    assert (entries.search is not None) == (kind == "int" and n > 0 and stored_keys == sorted(stored_keys))
    codes, (delta, rid, deleted, version) = entries.match(keys, ["a", "b"])
    want = stored.join(keys, keys=["a", "b"], join_type="inner")
    assert sorted(zip(codes.tolist(), delta.tolist(), rid.tolist(), deleted.tolist(), version.tolist(), strict=True)) \
        == sorted(zip(*(want.column(c).to_pylist() for c in ["_code", keystore.DELTA, keystore.ROW_ID, keystore.DELETED,
                                                             keystore.VERSION]), strict=True))
