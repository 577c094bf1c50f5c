"""Key-index blocks: the bottom run of the index of a table whose keys are fixed-width, as entries of many keys each.

A load into an empty index (or a rebuild) writes each of its keys' entries through RocksDB one call at a time
otherwise, which was a third of the load's time (docs/benchmarks.md, "Design measurements", "Key index blocks").
In blocks, a load writes one entry a :data:`BLOCK_ENTRIES` keys, built with NumPy. Entries a later commit writes
are one a key, as before, and take precedence over a block's: the index holds blocks only when they went into an
empty index, so a key's own entry is always the newer (:class:`bitlake.engine.keys.keyindex.KeyIndex`).

A block's entry key is byte 2, then the encoded key (:func:`bitlake.engine.keys.keyencoding.encode_keys`, with its
bucket) of its first entry. Its value is :data:`BLOCK_ENTRIES` entries in the index's order (a run's last block
repeats its last entry to fill up), as columns of int64 values: the bucket, each key column (its int64 value, as
the encoding orders it), the packed row id, the delta, and 1 for a delete marker (else 0). The bucket and key
columns hold each value's difference from the one before (the first as itself), zigzag-coded; each column is then
stored byte-transposed, its values' lowest bytes first, then their next ones, and so on, so that the high bytes of
small numbers are runs of zeros, which the SST file's LZ4 compression shrinks.

The directory: the first keys of the blocks of each SST file, end to end in one entry (``\\x00bitlake:blocks:`` and
the file's first key). The block that may hold a key is the last whose first key is at most the key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from bitlake.engine.keys.keyencoding import fixed_key_array, int64_values
from bitlake.format import keystore

BLOCK_ENTRIES = 64
BLOCK_PREFIX = b"\x02"
DIRECTORY_PREFIX = b"\x00bitlake:blocks:"
_VALUE_COLUMNS = 3  # row id, delta, deleted
# Blocks decoded at once by a lookup (about 3 KB each for a key of two columns): bounds its memory.
_BLOCKS_AT_ONCE = 16_384
_ENCODE_BLOCKS = 1_024  # blocks encoded at once (see encode)


def encode(table: pa.Table, primary_key: list[str], buckets: np.ndarray, order: np.ndarray
           ) -> tuple[np.ndarray, list[bytes]]:
    """The blocks of key-store rows ``table`` (one a key) of buckets ``buckets``, its rows taken in the index's
    order ``order``: the blocks' first keys (an array of encoded keys) and their values."""
    keys = [buckets, *(int64_values(table.column(c)) for c in primary_key)]
    values = [table.column(keystore.ROW_ID).to_numpy(), table.column(keystore.DELTA).to_numpy(zero_copy_only=False),
              table.column(keystore.DELETED).to_numpy(zero_copy_only=False)]
    starts = order[::BLOCK_ENTRIES]
    first = fixed_key_array(buckets[starts], [k[starts] for k in keys[1:]])
    # A few blocks at a time: arrays of a few megabytes, which the allocator reuses, where arrays of the whole
    # run took fresh pages each, and in a process whose writes fill the page cache, huge pages cost a compaction
    # to fault in (docs/benchmarks.md, "Design measurements", "Key index blocks").
    step = _ENCODE_BLOCKS * BLOCK_ENTRIES
    out: list[bytes] = []
    for start in range(0, len(order), step):
        rows = order[start:start + step]
        out.extend(_encode_blocks([c[rows] for c in keys], [c[rows] for c in values]))
    return first, out


def _encode_blocks(keys: list[np.ndarray], values: list[np.ndarray]) -> list[bytes]:
    n = len(keys[0])
    blocks = -(-n // BLOCK_ENTRIES)
    columns = np.empty((len(keys) + _VALUE_COLUMNS, blocks * BLOCK_ENTRIES), dtype=np.int64)
    for i, c in enumerate(keys + values):
        columns[i, :n] = c
    columns[:, n:] = columns[:, n - 1:n]  # the last block filled up with its last entry
    columns = columns.reshape(len(columns), blocks, BLOCK_ENTRIES)
    coded = columns[:len(keys)]
    diffs = coded.copy()
    diffs[:, :, 1:] -= coded[:, :, :-1]  # wraps around as int64, as the cumulative sum that undoes it does
    columns[:len(keys)] = (diffs << 1) ^ (diffs >> 63)  # zigzag: small differences either way, small numbers
    planes = np.ascontiguousarray(columns.transpose(1, 0, 2)).astype("<i8", copy=False).view(np.uint8)
    planes = np.ascontiguousarray(planes.reshape(blocks, len(columns), BLOCK_ENTRIES, 8).transpose(0, 1, 3, 2))
    row = planes[0].nbytes
    return planes.reshape(blocks, row).view(np.dtype((np.void, row))).ravel().tolist()


class Blocks:
    """The blocks of an index (its directory), to look keys up in."""

    def __init__(self, directory: np.ndarray, key_columns: int):
        self.directory = directory
        self.key_columns = key_columns
        if len(directory) > 1 and not np.all(directory[1:] > directory[:-1]):
            raise ValueError("the key index's block directory is out of order")

    @staticmethod
    def of(pieces: Sequence[bytes], key_columns: int) -> Blocks | None:
        """The blocks whose directory is ``pieces`` (the directory entries' values in key order); None when there
        are none."""
        if not pieces:
            return None
        width = 1 + 2 + 8 * key_columns + 1
        return Blocks(np.frombuffer(b"".join(pieces), dtype=f"S{width}"), key_columns)

    def find(self, get: Callable[[list[bytes]], list[bytes | None]], keys: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For each of ``keys`` (encoded keys, as an array): found, delta, packed row id, deleted; ``get`` reads the
        values of block entries by their keys."""
        n = len(keys)
        found, delta, rid, deleted = np.zeros(n, bool), np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
        block = np.searchsorted(self.directory, keys, side="right") - 1
        order = np.argsort(block, kind="stable")
        order = order[block[order] >= 0]  # a key before the first block's is in none
        ordered = block[order]
        wanted = np.unique(ordered)
        for start in range(0, len(wanted), _BLOCKS_AT_ONCE):
            chunk = wanted[start:start + _BLOCKS_AT_ONCE]
            values = get([BLOCK_PREFIX + k for k in self.directory[chunk].tolist()])
            if any(v is None for v in values):
                raise ValueError("the key index lacks a block its directory names")
            columns = self._decode(values)
            entries = fixed_key_array(columns[:, 0].ravel(), [columns[:, i].ravel()
                                                              for i in range(1, 1 + self.key_columns)])
            at = order[np.searchsorted(ordered, chunk[0]):np.searchsorted(ordered, chunk[-1], side="right")]
            pos = np.minimum(np.searchsorted(entries, keys[at]), len(entries) - 1)
            hit = entries[pos] == keys[at]
            at, pos = at[hit], pos[hit]
            values_at = 1 + self.key_columns
            found[at] = True
            rid[at] = columns[:, values_at].ravel()[pos]
            delta[at] = columns[:, values_at + 1].ravel()[pos]
            deleted[at] = columns[:, values_at + 2].ravel()[pos] != 0
        return found, delta, rid, deleted

    def _decode(self, values: list[bytes]) -> np.ndarray:
        """Block values as an array of (block, column, entry) int64 values, the key columns decoded."""
        width = 1 + self.key_columns + _VALUE_COLUMNS
        raw = np.frombuffer(b"".join(values), dtype=np.uint8)
        if len(raw) != len(values) * width * 8 * BLOCK_ENTRIES:
            raise ValueError("the key index holds a block of another encoding")
        planes = raw.reshape(len(values), width, 8, BLOCK_ENTRIES).transpose(0, 1, 3, 2)
        columns = np.ascontiguousarray(planes).view("<i8").reshape(len(values), width, BLOCK_ENTRIES)
        columns = columns.astype(np.int64, copy=False)
        coded = columns[:, :1 + self.key_columns].view(np.uint64)
        diffs = ((coded >> np.uint64(1)) ^ (np.uint64(0) - (coded & np.uint64(1)))).view(np.int64)
        columns[:, :1 + self.key_columns] = np.cumsum(diffs, axis=2)
        return columns
