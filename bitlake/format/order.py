"""Integer key columns as one int64 a row: sorting rows as ``np.lexsort`` does, in a fraction of its time, and
matching rows by key (:mod:`bitlake.engine.keycache`)."""

from __future__ import annotations

import numpy as np


def lexsort(keys) -> np.ndarray:
    """Row indices that sort ``keys`` (integer or boolean arrays of one length, the last one the primary key),
    ties in row order: exactly ``np.lexsort(keys)``, which sorts indirectly once a key. When the keys' value
    ranges fit in 63 bits together they are packed into one int64 a row: with the row index beside them, one
    sort of values, which numpy does with SIMD (6M random TPC-H keys (l_orderkey, l_linenumber): 0.14 s
    against 1.34 s); without room for the index, one ``argsort``, whose order is the stable one when the
    packed keys are distinct (6M random row ids: 0.5 s against 0.9 s)."""
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
