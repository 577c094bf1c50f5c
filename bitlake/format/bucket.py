"""The key-store bucket of a key, computed the same way by every engine (docs/FORMAT.md, "Bucket hash").

Each key column's value is encoded in primary-key order: integers, booleans, dates (days since 1970-01-01) and
timestamps (microseconds since 1970-01-01 UTC) as the 8 big-endian bytes of their int64 two's complement (an
unsigned 64-bit value: its own 8 bytes); strings (UTF-8), binaries and decimals (their text with exactly
``scale`` digits after the point) as a 4-byte big-endian length and the bytes. The bucket is
``fmix64(FNV-1a-64(encoding)) mod num_buckets`` (unsigned), fmix64 being MurmurHash3's 64-bit finaliser, which
spreads FNV's low bits.

The implementation is vectorised with numpy: one pass per encoded byte position, no Python loop per row.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_BYTE = np.uint64(0xFF)


def _fixed_as_int64(column: pa.Array) -> np.ndarray:
    t = column.type
    if pa.types.is_unsigned_integer(t) and t.bit_width == 64:  # its bits: values from 2^63 on are negative int64s
        return pc.cast(column, pa.uint64()).fill_null(0).to_numpy(zero_copy_only=False).view(np.int64)
    if pa.types.is_boolean(t):
        column = pc.cast(column, pa.int8())
    elif pa.types.is_date(t):
        column = pc.cast(pc.cast(column, pa.date32()), pa.int32())
    elif pa.types.is_timestamp(t):
        column = pc.cast(pc.cast(column, pa.timestamp("us", tz=t.tz)), pa.int64())
    return pc.cast(column, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)


def _is_variable(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_decimal(t))


def _feed_bytes(h: np.ndarray, byte: np.ndarray) -> np.ndarray:
    return (h ^ byte) * FNV_PRIME


def _feed_int64(h: np.ndarray, values: np.ndarray, width: int = 8) -> np.ndarray:
    u = values.astype(np.int64).view(np.uint64)
    byte = np.empty_like(h)
    for i in range(width):
        np.right_shift(u, np.uint64(8 * (width - 1 - i)), out=byte)
        np.bitwise_and(byte, _BYTE, out=byte)
        np.bitwise_xor(h, byte, out=h)
        np.multiply(h, FNV_PRIME, out=h)
    return h


def decimal_text(column: pa.Array) -> pa.Array:
    """Digits with exactly ``scale`` decimals. Arrow's cast writes an exponent for small magnitudes
    ('1E-10'); those few values are rendered again in plain digits."""
    text = pc.cast(column, pa.string())
    exponent = pc.fill_null(pc.match_substring(text, "E"), False)
    if not pc.any(exponent).as_py():
        return text
    form = f".{column.type.scale}f"
    plain = [None if v is None else format(v, form) for v in column.to_pylist()]
    return pc.if_else(exponent, pa.array(plain, pa.string()), text)


def _feed_variable(h: np.ndarray, column: pa.Array) -> np.ndarray:
    if pa.types.is_decimal(column.type):
        column = decimal_text(column)
    column = pc.cast(column, pa.large_binary()).fill_null(b"")
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int64)[column.offset:column.offset + len(column) + 1]
    data_buffer = column.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
    starts, lengths = offsets[:-1], offsets[1:] - offsets[:-1]
    h = _feed_int64(h, lengths, width=4)
    active = np.arange(len(column))
    for j in range(int(lengths.max()) if len(lengths) else 0):
        active = active[lengths[active] > j]
        h[active] = _feed_bytes(h[active], data[starts[active] + j].astype(np.uint64))
    return h


def fmix64(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _M1
    h = h ^ (h >> np.uint64(33))
    h = h * _M2
    return h ^ (h >> np.uint64(33))


# Rows hashed at once: the hash makes a pass over its arrays per byte of the key, which for arrays this small stay
# in the CPU's caches (4M keys of two integer columns: 0.55 s whole, 0.095 s in chunks; docs/benchmarks.md,
# "Design measurements", "Bucket hash").
_CHUNK_ROWS = 65_536


def key_hash(table: pa.Table | pa.RecordBatch, primary_key: list[str] | tuple[str, ...]) -> np.ndarray:
    """The 64-bit hash of each row's key, as uint64."""
    columns = []
    for name in primary_key:
        column = table.column(name)
        columns.append(column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column)
    n = table.num_rows
    if n <= _CHUNK_ROWS:
        return _hash(columns, n)
    return np.concatenate([_hash([c.slice(start, _CHUNK_ROWS) for c in columns], min(_CHUNK_ROWS, n - start))
                           for start in range(0, n, _CHUNK_ROWS)])


def _hash(columns: list[pa.Array], n: int) -> np.ndarray:
    h = np.full(n, FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in columns:
            if _is_variable(column.type):
                h = _feed_variable(h, column)
            else:
                h = _feed_int64(h, _fixed_as_int64(column))
        return fmix64(h)


def buckets(table: pa.Table | pa.RecordBatch, primary_key: list[str] | tuple[str, ...], num_buckets: int) -> np.ndarray:
    """Each row's bucket, as int32."""
    return (key_hash(table, primary_key) % np.uint64(num_buckets)).astype(np.int32)
