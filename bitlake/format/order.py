"""Integer key columns as one int64 a row: sorting rows as ``np.lexsort`` does, in a fraction of its time, and
matching rows by key (:mod:`bitlake.engine.keys.keycache`)."""

from __future__ import annotations

import numpy as np


def lexsort(keys) -> np.ndarray:
    """Row indices that sort ``keys`` (integer or boolean arrays of one length, the last one the primary key),
    ties in row order: exactly ``np.lexsort(keys)``, which sorts indirectly once a key. When the keys' value
    ranges fit in 63 bits together they are packed into one int64 a row: with the row index beside them, one
    sort of values, which numpy does with SIMD; without room for the index, one ``argsort``, whose order is the
    stable one when the packed keys are distinct. Both take a fraction of ``np.lexsort``'s time
    (docs/benchmarks.md, "Design measurements", "Sorting and searching packed keys")."""
    keys = list(keys)
    n = len(keys[0]) if keys else 0
    if n < 2 or any(k.dtype.kind not in "bi" for k in keys):
        return np.lexsort(keys) if keys else np.arange(n)
    columns = keys[::-1]
    spans = key_spans(columns)
    if spans is None:
        return np.lexsort(keys)
    packed = pack(columns, spans)
    index_bits = (n - 1).bit_length()
    if sum(bits for _, bits in spans) + index_bits <= 63:
        packed <<= index_bits
        packed |= np.arange(n, dtype=np.int64)
        packed.sort()
        return packed & np.int64((1 << index_bits) - 1)
    order = np.argsort(packed)
    if strictly_increasing(packed[order]):  # no ties: the only order
        return order
    return np.lexsort(keys)


def strictly_increasing(values: np.ndarray) -> bool:
    """Whether every value is greater than the one before (sorted, no two equal)."""
    return bool(np.all(values[1:] > values[:-1]))


def non_decreasing(values: np.ndarray) -> bool:
    """Whether no value is less than the one before (sorted, ties allowed)."""
    return bool(np.all(values[1:] >= values[:-1]))


def latest(ids: np.ndarray, versions: np.ndarray) -> np.ndarray:
    """Indices of each id's row of the highest version (the first of a tie), in id order."""
    order = lexsort((-versions, ids))
    first = np.ones(len(order), dtype=bool)
    first[1:] = ids[order][1:] != ids[order][:-1]
    return order[first]


def key_spans(*row_sets: list[np.ndarray]) -> list[tuple[int, int]] | None:
    """Per key column, the lowest value across ``row_sets`` and the bits the values take above it; None when
    they add up to more than 63."""
    spans = []
    for i in range(len(row_sets[0])):
        present = [columns[i] for columns in row_sets if len(columns[i])]
        low = min((int(c.min()) for c in present), default=0)
        high = max((int(c.max()) for c in present), default=0)
        spans.append((low, (high - low).bit_length()))
    return spans if sum(bits for _, bits in spans) <= 63 else None


def pack(columns: list[np.ndarray], spans: list[tuple[int, int]]) -> np.ndarray:
    """Rows of integer key columns, each within its span (:func:`key_spans`), packed into one int64 a row."""
    # Each value less its column's lowest is in [0, 2**bits): the spans fit in 63 bits, so nothing wraps around.
    packed = np.subtract(columns[0], np.int64(spans[0][0]), dtype=np.int64)
    for c, (low, bits) in zip(columns[1:], spans[1:], strict=True):
        packed <<= bits
        packed |= np.subtract(c, np.int64(low), dtype=np.int64)
    return packed


class SortedSearch:
    """Finds values in a sorted array of distinct non-negative int64 (packed keys) faster than ``np.searchsorted``
    when the array is far larger than the CPU's caches, and holds them in a fraction of their bytes. A table of
    where each value of its top bits (a slot) starts, half a byte to a byte a value, narrows each wanted value to
    a window of about 8 values, then all of them are bisected at once, a numpy gather a step. numpy's binary
    search walks each value's ~22 steps one after the other, each a cache (and TLB) miss in an array of millions;
    gathers let the CPU have many misses in flight. Since a slot's values share their top bits, each value is
    held as its bits below them only, in the narrowest unsigned type that holds them: 2 bytes a key for the
    packed keys of TPC-H lineitem's buckets at SF 10 and 30, where they took 8. The table costs one search of
    the array's slots, once a file, which a small batch's keys repay (docs/benchmarks.md, "Design measurements",
    "Sorting and searching packed keys")."""

    def __init__(self, values: np.ndarray):
        n = len(values)
        span = int(values[-1]) - int(values[0]) if n else 0
        self.shift = max(span.bit_length() - max((n // 8).bit_length(), 1), 0)
        # Slots start at a multiple of 2**shift (at or below the lowest value), so that a value's bits below its
        # slot's are its own lowest bits.
        self.low = (int(values[0]) >> self.shift) << self.shift if n else 0
        self.high = int(values[-1]) if n else -1
        # Where each slot's values start: a search of the slots' lowest values, sorted (a pass over the array);
        # the last slot ends at the end (its bound could pass int64).
        bounds = (np.arange(((self.high - self.low) >> self.shift) + 1, dtype=np.int64) << self.shift) + self.low
        starts = np.append(np.searchsorted(values, bounds), n)
        self.starts = starts.astype(np.int32 if n < 2**31 else np.int64)
        self.mask = (1 << self.shift) - 1
        self.held = next(t for t in (np.uint8, np.uint16, np.uint32, np.uint64) if self.shift <= np.iinfo(t).bits)
        self.values = self._low_bits(values)
        self.nbytes = self.starts.nbytes + self.values.nbytes

    def _low_bits(self, values: np.ndarray) -> np.ndarray:
        """The bits of ``values`` below their slots', in the type they are held in (one pass: the cast keeps them)."""
        return np.bitwise_and(values, self.mask, dtype=self.held, casting="unsafe")

    def find_sorted(self, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For ``wanted`` strictly increasing: where in ``wanted`` each value found is, and where in the values. The
        values are made whole (each slot's base added back), then the smaller side is searched in the larger one:
        for more than a quarter as many wanted as values (a large batch's keys), less than :meth:`find` costs
        (docs/benchmarks.md, "Design measurements", "Sorting and searching packed keys")."""
        slots = np.repeat(np.arange(len(self.starts) - 1, dtype=np.int64), np.diff(self.starts))
        values = (slots << self.shift) + self.low + self.values.astype(np.int64)
        if len(wanted) >= len(values):
            at = np.searchsorted(wanted, values)
            hit = at < len(wanted)
            hit[hit] = wanted[at[hit]] == values[hit]
            return at[hit], np.flatnonzero(hit)
        at = np.searchsorted(values, wanted)
        hit = at < len(values)
        hit[hit] = values[at[hit]] == wanted[hit]
        return np.flatnonzero(hit), at[hit]

    def find(self, wanted: np.ndarray) -> np.ndarray:
        """Where each of ``wanted`` is in the values, or -1. Each wanted value's slot is searched for the last
        of its values at or below it with steps of one length for all (a power of two, halved each time), a probe
        past the slot's end taken at its end: four numpy calls a step, where a bisection of each value's own
        bounds took ten (a small batch's keys are matched against every file of their buckets, and these calls
        on arrays of a thousand keys are most of a small commit's time)."""
        values, n = self.values, len(self.values)
        out = np.full(len(wanted), -1, np.int64)
        inside = np.flatnonzero((wanted >= self.low) & (wanted <= self.high))
        if not len(inside):
            return out
        q = wanted[inside]
        slot = (q - self.low) >> self.shift
        q = self._low_bits(q)
        first = self.starts[slot].astype(np.int64)
        last = self.starts[slot + 1] - 1  # the slot's values are at [first, last]; none when last < first
        at = first
        longest = int((last - first).max())
        step = 1 << (longest.bit_length() - 1) if longest > 0 else 0  # steps of step, step / 2 ... 1 reach longest
        if step > _SHORT_STEP:  # a few slots are long (new keys packed into a corner of the span): their own steps
            far = np.flatnonzero(last - first >= 2 * _SHORT_STEP)
            at_far, last_far, q_far = at[far], last[far], q[far]
            while step > _SHORT_STEP:
                probe = np.minimum(at_far + step, last_far)
                at_far = np.where(values[probe] <= q_far, probe, at_far)
                step >>= 1
            at = at.copy()
            at[far] = at_far
        while step:
            probe = np.minimum(at + step, last)
            at = np.where(values[probe] <= q, probe, at)
            step >>= 1
        hit = (last >= first) & (values[np.minimum(at, n - 1)] == q)  # an empty slot's probes read the one before
        out[inside[hit]] = at[hit]
        return out


# The steps every wanted value of :meth:`SortedSearch.find` takes, from this one down: they reach the end of a slot of
# up to twice as many values (about 8 a slot on average).
_SHORT_STEP = 16


def places(ordered: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each of ``values``, its place in ``ordered`` (sorted, not empty) and whether it is there: where a value
    is not, its place is where it would go, at most the last."""
    at = np.minimum(np.searchsorted(ordered, values), len(ordered) - 1)
    return at, ordered[at] == values


def isin(values: np.ndarray, of: np.ndarray) -> np.ndarray:
    """``np.isin(values, of)`` for integer arrays of one dtype, by sorting the smaller side and searching it:
    numpy 2.4's ``isin`` hashes both sides, which took 0.41 s for 6,000 row ids against 600,000 where a sort and a
    search take 5 ms (docs/benchmarks.md, "Design measurements", "Membership of row ids")."""
    values, of = np.asarray(values), np.asarray(of)
    if values.dtype != of.dtype or values.dtype.kind not in "iu":
        return np.isin(values, of)
    if not len(values) or not len(of):
        return np.zeros(len(values), dtype=bool)
    if len(of) > len(values):  # keep of's members that are values, then search those (fewer) among the values
        of = of[places(np.sort(values), of)[1]]
        if not len(of):
            return np.zeros(len(values), dtype=bool)
    return places(np.sort(of), values)[1]
