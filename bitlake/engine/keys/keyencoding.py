"""Key encoding: a primary key's values as one byte string a row, equal for equal keys and ordered as the key
columns compare, and the numbering of a batch's distinct keys. The key index stores its entries under these
bytes, with values of :func:`encode_values`; MetaGen and the key cache match keys by them. Nothing here knows
RocksDB.

Keys are encoded per column: integers, dates, timestamps and booleans as 8 big-endian bytes (the int64 value
with its sign bit flipped), strings and binaries as a 4-byte length and the bytes, decimals as their text.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bitlake.errors import IndexUnavailableError
from bitlake.format import bucket, keystore
from bitlake.format.order import lexsort, strictly_increasing

# Flipped in a fixed-width key column's int64 value: its big-endian bytes then compare as the signed values do.
SIGN_BIT = np.uint64(1 << 63)


def encodable(t: pa.DataType) -> bool:
    """Whether a key column of type ``t`` has a fixed-width or length-prefixed encoding (what the key index
    takes)."""
    return fixed_type(t) or _variable(t)


def fixed_type(t: pa.DataType) -> bool:
    """Whether a key column of type ``t`` encodes to 8 bytes, ordered as :func:`int64_values` gives its values."""
    return pa.types.is_integer(t) or pa.types.is_date(t) or pa.types.is_timestamp(t) or pa.types.is_boolean(t)


def _variable(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(
        t
    )


def encode_keys(table: pa.Table, primary_key: list[str], buckets: np.ndarray | None = None) -> list[bytes]:
    """One bytes value per row, equal for equal keys and different for different ones. Every key
    starts with byte 1, so that it never collides with the index's own entries (byte 0). A fixed-width
    column is its int64 value with the sign bit flipped, big-endian: bytes compare as the values do; a decimal
    is its text with exactly its scale's digits (as the bucket hash takes it). ``buckets``: each row's bucket,
    put as two big-endian bytes after the first, so that keys order by bucket, then by key (the key index's)."""
    columns = [table.column(c) for c in primary_key]
    if all(fixed_type(c.type) for c in columns):
        return fixed_key_array(buckets, [int64_values(c) for c in columns]).tolist()
    parts = [[int(b).to_bytes(2, "big") for b in buckets.tolist()]] if buckets is not None else []
    for c in columns:
        if fixed_type(c.type):
            parts.append([(x + 2**63).to_bytes(8, "big") for x in int64_values(c).tolist()])
        else:
            values = (bucket.decimal_text(c) if pa.types.is_decimal(c.type) else c).to_pylist()
            parts.append([
                len(b).to_bytes(4, "big") + b for b in (v.encode() if isinstance(v, str) else v for v in values)
            ])
    return [b"\x01" + b"".join(row) for row in zip(*parts, strict=True)]


def _fixed_key_record(columns: int, bucket: bool) -> np.dtype:
    """The record of an encoded key of ``columns`` fixed-width columns (after its bucket, with ``bucket``)."""
    head = [("bucket", ">u2")] if bucket else []
    # A one-byte terminator keeps numpy from stripping trailing zero bytes of the fixed width.
    return np.dtype([("start", "u1"), *head, *[(f"k{i}", ">u8") for i in range(columns)], ("end", "u1")])


def fixed_key_width(columns: int) -> int:
    """The bytes of an encoded key of ``columns`` fixed-width columns, with its bucket (:func:`fixed_key_array`)."""
    return _fixed_key_record(columns, True).itemsize


def fixed_key_array(buckets: np.ndarray | None, columns: list[np.ndarray]) -> np.ndarray:
    """The encoded keys (:func:`encode_keys`) of fixed-width key columns given as their int64 values
    (:func:`int64_values`), as a NumPy array of fixed-width bytes, which compare as the keys do."""
    rec = np.empty(len(columns[0]), dtype=_fixed_key_record(len(columns), buckets is not None))
    rec["start"] = 1
    if buckets is not None:
        rec["bucket"] = buckets
    for i, c in enumerate(columns):
        rec[f"k{i}"] = c.view(np.uint64) ^ SIGN_BIT
    rec["end"] = 1
    return rec.view(f"S{rec.dtype.itemsize}")


def fixed_width(table: pa.Table, primary_key: list[str]) -> bool:
    """Whether every key column encodes to 8 bytes (so keys sort and compare as integer columns)."""
    return all(fixed_type(table.schema.field(c).type) for c in primary_key)


def key_order(table: pa.Table, primary_key: list[str]) -> np.ndarray | None:
    """Row indices in the byte order of the rows' encoded keys (:func:`encode_keys`), ties in row order; None
    when the rows are in that order already."""
    if fixed_width(table, primary_key):
        # Encoded with the sign bit flipped, the values compare bytewise as they do as signed integers.
        return int64_order([int64_values(table.column(c)) for c in primary_key])
    keys = encode_keys(table, primary_key)
    order = np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=np.int64)
    return None if strictly_increasing(order) else order


def int64_order(columns: list[np.ndarray]) -> np.ndarray | None:
    """The rows of int64 key ``columns`` in key order, ties in row order; None when they are in it already
    (a dump in key order, or rows a sort put in it): an O(n) check spares the sort."""
    return None if ascending(columns) else lexsort(columns[::-1])


def ascending(columns: list[np.ndarray]) -> bool:
    """Whether the rows of ``columns`` (int64, one array a key column) are in ascending key order."""
    undecided = np.ones(max(len(columns[0]) - 1, 0), dtype=bool)
    for c in columns:
        before, after = c[:-1], c[1:]
        if np.any(undecided & (after < before)):
            return False
        undecided &= after == before
    return True


def key_codes(table: pa.Table, primary_key: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Numbers the distinct keys of ``table``'s rows: each row's code (0..k-1) and, per code, the first row
    that has it."""
    n = table.num_rows
    if n and fixed_width(table, primary_key):
        columns = [int64_values(table.column(c)) for c in primary_key]
        order = int64_order(columns)
        values = columns if order is None else [c[order] for c in columns]
        starts = np.ones(n, dtype=bool)
        starts[1:] = np.logical_or.reduce([v[1:] != v[:-1] for v in values])
        distinct = bool(starts.all())  # one row a key (a load, most batches): codes are the rows' ranks
        ranks = np.arange(n, dtype=np.int64) if distinct else np.cumsum(starts) - 1
        if order is None:
            return ranks, ranks if distinct else np.flatnonzero(starts)
        codes = np.empty(n, dtype=np.int64)
        codes[order] = ranks
        return codes, order if distinct else order[starts]  # lexsort is stable: a run starts with its key's first row
    keys = encode_keys(table, primary_key)
    codes = pc.dictionary_encode(pa.array(keys, pa.binary())).indices.to_numpy().astype(np.int64)
    return codes, np.unique(codes, return_index=True)[1]


def int64_values(column) -> np.ndarray:
    """A fixed-width key column as int64 values, in the order its encoded keys compare (an unsigned 64-bit
    column as its bits: values from 2^63 on come first, as negative int64s)."""
    t = column.type
    if pa.types.is_unsigned_integer(t) and t.bit_width == 64:
        return pc.cast(column, pa.uint64()).to_numpy(zero_copy_only=False).view(np.int64)
    if pa.types.is_boolean(t):
        column = pc.cast(column, pa.int8())
    elif pa.types.is_date(t):
        column = pc.cast(pc.cast(column, pa.date32()), pa.int32())
    elif pa.types.is_timestamp(t):
        column = pc.cast(column, pa.int64())
    return pc.cast(column, pa.int64()).to_numpy(zero_copy_only=False)


def encode_values(table: pa.Table) -> list[bytes]:
    """Each key-store row's entry value: its row id (8 bytes, big-endian), its delta (8 more) unless 0, and a
    flag byte, 1 for an upsert and 2 for a delete marker (never 0: numpy's fixed-width bytes drop trailing zeros).
    A load with no delta values stores half the bytes; :func:`decode_values` reads both lengths."""
    n = table.num_rows
    rid = table.column(keystore.ROW_ID).to_numpy()
    delta = table.column(keystore.DELTA).to_numpy()
    flag = table.column(keystore.DELETED).to_numpy(zero_copy_only=False).astype(np.uint8) + 1
    with_delta = np.flatnonzero(delta)
    if len(with_delta) < n:
        short = np.empty(n, dtype=[("r", ">i8"), ("f", "u1")])
        short["r"], short["f"] = rid, flag
        out = short.view("S9").tolist()
        if not len(with_delta):
            return out
    full = np.empty(len(with_delta), dtype=[("r", ">i8"), ("d", ">i8"), ("f", "u1")])
    full["r"], full["d"], full["f"] = rid[with_delta], delta[with_delta], flag[with_delta]
    if len(with_delta) == n:
        return full.view("S17").tolist()
    for i, value in zip(with_delta.tolist(), full.view("S17").tolist(), strict=True):
        out[i] = value
    return out


def decode_values(values: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Delta, row id and deleted of entry values (:func:`encode_values`)."""
    lengths = np.fromiter(map(len, values), dtype=np.int64, count=len(values))
    if np.any((lengths != 9) & (lengths != 17)):
        raise IndexUnavailableError("the key index holds a value of another encoding")
    joined = b"".join(values)
    if len(joined) in (9 * len(values), 17 * len(values)):  # all of one length: read as records
        short = len(joined) == 9 * len(values)
        records = np.frombuffer(joined, dtype=[("r", ">i8"), ("f", "u1")] if short else
                                [("r", ">i8"), ("d", ">i8"), ("f", "u1")])
        delta = np.zeros(len(values), np.int64) if short else records["d"].astype(np.int64)
        return delta, records["r"].astype(np.int64), records["f"] == 2
    raw = np.frombuffer(joined, dtype=np.uint8)
    starts = np.cumsum(lengths) - lengths
    eight = np.arange(8)
    rid = raw[starts[:, None] + eight].view(">i8").reshape(-1).astype(np.int64)
    delta = np.zeros(len(values), np.int64)
    full = lengths == 17
    delta[full] = raw[starts[full][:, None] + 8 + eight].view(">i8").reshape(-1)
    deleted = raw[starts + lengths - 1] == 2
    return delta, rid, deleted
