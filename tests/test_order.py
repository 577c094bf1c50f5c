"""bitlake.format.order: lexsort is np.lexsort, packed or not; SortedSearch finds what np.searchsorted finds, its
values searched among the wanted ones or the wanted among them;
isin is np.isin."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bitlake.format.order import SortedSearch, isin, lexsort

INT64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=300, deadline=None)
@given(st.data(), st.integers(0, 60), st.integers(1, 4))
def test_lexsort_is_numpys_for_any_integer_and_boolean_keys(data, n, k):
    keys = []
    for _ in range(k):
        kind = data.draw(st.sampled_from(["small", "wide", "few wide", "bool", "int32"]))
        if kind == "bool":
            keys.append(np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool))
        elif kind == "int32":
            keys.append(np.array(data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=n, max_size=n)),
                                 dtype=np.int32))
        else:  # few distinct values (ties), any int64 (no room), or a few far apart (no room for the index)
            values = {"small": st.integers(-3, 3), "wide": INT64, "few wide": st.sampled_from([-(2**40), 0, 2**40])}[kind]
            keys.append(np.array(data.draw(st.lists(values, min_size=n, max_size=n)), dtype=np.int64))
    assert lexsort(keys).tolist() == np.lexsort(keys).tolist()


def test_lexsort_of_large_inputs_packed_with_or_without_the_index_or_not():
    rng = np.random.default_rng(7)
    keys = (rng.integers(1, 8, 200_000), rng.integers(-(10**6), 10**6, 200_000))  # many ties on the primary key
    assert np.array_equal(lexsort(keys), np.lexsort(keys))
    flags = rng.integers(0, 3, 50_000) == 1
    assert np.array_equal(lexsort((flags,)), np.lexsort((flags,)))
    row_ids = np.unique((rng.integers(0, 40, 200_000) << 39) | rng.integers(0, 1 << 23, 200_000))  # distinct
    rng.shuffle(row_ids)
    assert np.array_equal(lexsort((row_ids, np.zeros(len(row_ids), bool))), np.argsort(row_ids, kind="stable"))
    tied = np.concatenate([row_ids, row_ids[:1000]])  # no room for the index, and ties
    assert np.array_equal(lexsort((tied,)), np.lexsort((tied,)))
    wide = [rng.integers(-(2**62), 2**62, 200_000) for _ in range(3)]  # no room at all
    assert np.array_equal(lexsort(wide), np.lexsort(wide))


def _found(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    at = np.minimum(np.searchsorted(values, wanted), max(len(values) - 1, 0))
    return np.where((len(values) > 0) & (values[at] == wanted) if len(values) else np.zeros(len(wanted), bool), at, -1)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_sorted_search_finds_what_searchsorted_finds(data):
    """Any distinct non-negative values (clustered, spread over all 63 bits, a few far apart), any wanted values:
    every width of the bits held below the slots' (none to 62)."""
    kind = data.draw(st.sampled_from(["small", "wide", "clusters"]))
    raw = {"small": st.integers(0, 50), "wide": st.integers(0, 2**63 - 1),
           "clusters": st.sampled_from([0, 2**20, 2**62]).flatmap(lambda c: st.integers(c, c + 40))}[kind]
    values = np.unique(np.array(data.draw(st.lists(raw, max_size=300)), dtype=np.int64))
    present = st.sampled_from(values.tolist()) if len(values) else st.integers(0, 5)
    wanted = np.array(data.draw(st.lists(st.one_of(present, st.integers(0, 2**63 - 1), raw), max_size=60)),
                      dtype=np.int64)
    assert SortedSearch(values).find(wanted).tolist() == _found(values, wanted).tolist()
    ordered = np.unique(wanted)  # in order, each once: the values searched among them find the same pairs
    mine, theirs = SortedSearch(values).find_sorted(ordered)
    at = _found(values, ordered)
    assert mine.tolist() == np.flatnonzero(at >= 0).tolist() and theirs.tolist() == at[at >= 0].tolist()


def test_sorted_search_of_millions_of_packed_keys():
    rng = np.random.default_rng(11)
    values = np.unique(rng.integers(0, 2**45, 3_000_000))
    wanted = np.concatenate([values[rng.integers(0, len(values), 5_000)], rng.integers(0, 2**45, 5_000)])
    search = SortedSearch(values)
    assert search.starts.nbytes <= len(values)  # its table: about half a byte a value
    assert search.values.dtype == np.uint32  # 45 bits a key, of which the slots take the top 19 (3M keys / 8)
    for few in (np.sort(wanted), wanted):  # in key order (as a bucket's keys come) or not
        assert np.array_equal(search.find(few), _found(values, few))
    many = np.sort(rng.choice(values, 500_000, replace=False))  # dense
    assert np.array_equal(search.find(many), np.searchsorted(values, many))
    mine, theirs = search.find_sorted(many)
    assert np.array_equal(mine, np.arange(len(many))) and np.array_equal(theirs, np.searchsorted(values, many))


def test_sorted_search_of_every_value_around_sparse_values():
    """Every value from below the lowest to past the highest, among values whose slots are mostly empty: a value in
    an empty slot is not found, though its probes read the slot before, whose low bits may equal its own."""
    rng = np.random.default_rng(5)
    for size in (1, 2, 7, 40, 300):
        values = np.unique(rng.integers(0, 1 << 14, size))
        wanted = np.arange(-3, (1 << 14) + 3, dtype=np.int64)
        assert SortedSearch(values).find(wanted).tolist() == _found(values, wanted).tolist()


DTYPES = st.sampled_from([np.int64, np.uint32, np.int32, np.uint64])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_isin_is_numpys(data):
    dtype = data.draw(DTYPES)
    other = data.draw(st.one_of(st.just(dtype), DTYPES))
    small = st.integers(0, 50) if data.draw(st.booleans()) else None
    values = data.draw(hnp.arrays(dtype, st.integers(0, 40), elements=small))
    of = data.draw(hnp.arrays(other, st.integers(0, 60), elements=small))
    assert np.array_equal(isin(values, of), np.isin(values, of))


def test_large_sets_either_way():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 2**62, 200_000)
    few = np.concatenate([rng.choice(ids, 3_000), rng.integers(0, 2**62, 3_000)])
    assert np.array_equal(isin(few, ids), np.isin(few, ids))
    assert np.array_equal(isin(ids, few), np.isin(ids, few))
