"""Key-index blocks: the bottom run of the index of a table whose keys are fixed-width, as entries of many keys each.

A load into an empty index (or a rebuild) writes each of its keys' entries through RocksDB one call at a time
otherwise, which was a third of the load's time (docs/benchmarks.md, "Design measurements", "Key index blocks").
In blocks, a load writes one entry a :data:`BLOCK_ENTRIES` keys, built with NumPy. Entries a later commit writes
are one a key, as before, and take precedence over a block's: the index holds blocks only when they went into an
empty index, so a key's own entry is always the newer (:class:`bitlake.engine.keys.keyindex.KeyIndex`).

A block's entry key is byte 2, then the encoded key (:func:`bitlake.engine.keys.keyencoding.encode_keys`, with its
bucket) of its first entry. Its value is :data:`BLOCK_ENTRIES` entries in the index's order (a run's last block
repeats its last entry to fill up), each entry its encoded key, then its packed row id, delta and 1 for a delete
marker (else 0) as little-endian int64 values; the block is stored byte-transposed, the first bytes of its entries
first, then their second bytes, and so on, so that bytes the entries share (a bucket, the high bytes of keys and
row ids close together) make runs, which the SST file's LZ4 compression shrinks. A lookup turns back the key bytes
of the blocks it reads, searches them, and reads the 24 other bytes of each key it finds (docs/benchmarks.md,
"Design measurements", "Key index blocks").

The directory: the first keys of the blocks of each run taken in at once (its SST files, a range of the run each),
end to end in one entry (``\\x00bitlake:blocks:`` and the run's first key). The block that may hold a key is the
last whose first key is at most the key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from bitlake.engine.keys.keyencoding import SIGN_BIT, fixed_key_array, fixed_key_width, int64_values
from bitlake.format import keystore
from bitlake.format.order import places, strictly_increasing

BLOCK_ENTRIES = 64
BLOCK_PREFIX = b"\x02"
DIRECTORY_PREFIX = b"\x00bitlake:blocks:"
_VALUE_COLUMNS = 3  # row id, delta, deleted
# Blocks read from RocksDB at once by a lookup (under 3 KB each for a key of two columns), on threads: bounds its
# memory; and searched at once, in arrays the allocator reuses (see chunks).
_BLOCKS_READ_AT_ONCE = 16_384
_BLOCKS_AT_ONCE = 2_048
_ENCODE_BLOCKS = 1_024  # blocks encoded at once (see chunks)


def chunks(table: pa.Table, primary_key: list[str], buckets: np.ndarray, order: np.ndarray
           ) -> Iterator[tuple[np.ndarray, list[bytes]]]:
    """The blocks of key-store rows ``table`` (one a key) of buckets ``buckets``, its rows taken in the index's order
    ``order``, a chunk at a time: each chunk's blocks' first keys (an array of encoded keys) and their values. Arrays
    of a few megabytes, which the allocator reuses, where arrays of the whole run took fresh pages each, and in a
    process whose writes fill the page cache, huge pages cost a compaction to fault in; a writer that takes each chunk
    before the next holds a few blocks' values, not the run's (docs/benchmarks.md, "Design measurements", "Key index
    blocks")."""
    keys = [int64_values(table.column(c)) for c in primary_key]
    values = [table.column(keystore.ROW_ID).to_numpy(), table.column(keystore.DELTA).to_numpy(zero_copy_only=False),
              table.column(keystore.DELETED).to_numpy(zero_copy_only=False)]
    step = _ENCODE_BLOCKS * BLOCK_ENTRIES  # whole blocks: a chunk's first key is its first block's
    for start in range(0, len(order), step):
        rows = order[start:start + step]
        firsts = rows[::BLOCK_ENTRIES]
        yield fixed_key_array(buckets[firsts], [k[firsts] for k in keys]), _encode_blocks(rows, buckets, keys, values)


def _encode_blocks(rows: np.ndarray, buckets: np.ndarray, keys: list[np.ndarray], values: list[np.ndarray]
                   ) -> list[bytes]:
    """The values of the blocks of entries ``rows`` (the last block filled up with its last entry): each field's
    bytes, as the encoded key and the entry's values have them, go straight into their planes, a field at a time,
    where the entries were built first, then transposed (docs/benchmarks.md, "Design measurements", "Key index
    blocks")."""
    blocks = -(-len(rows) // BLOCK_ENTRIES)
    if blocks * BLOCK_ENTRIES > len(rows):
        rows = np.concatenate([rows, np.full(blocks * BLOCK_ENTRIES - len(rows), rows[-1])])
    elif rows[-1] - rows[0] == len(rows) - 1 and strictly_increasing(rows):
        rows = slice(int(rows[0]), int(rows[-1]) + 1)  # a run of the table's rows (in the index's order): no gathers
    one = np.ones((blocks * BLOCK_ENTRIES, 1), np.uint8)
    fields = [one, buckets[rows].astype(">u2").view(np.uint8).reshape(-1, 2)]  # the encoded key: fixed_key_array's
    fields += [(k[rows].view(np.uint64) ^ SIGN_BIT).astype(">u8").view(np.uint8).reshape(-1, 8) for k in keys]
    fields += [one] + [v[rows].astype("<i8").view(np.uint8).reshape(-1, 8) for v in values]
    width = sum(f.shape[1] for f in fields)
    planes = np.empty((blocks, width, BLOCK_ENTRIES), np.uint8)  # (block, byte of an entry, entry)
    at = 0
    for f in fields:
        planes[:, at:at + f.shape[1], :] = f.reshape(blocks, BLOCK_ENTRIES, f.shape[1]).transpose(0, 2, 1)
        at += f.shape[1]
    row = width * BLOCK_ENTRIES
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
        return Blocks(np.frombuffer(b"".join(pieces), dtype=f"S{fixed_key_width(key_columns)}"), key_columns)

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
        for start in range(0, len(wanted), _BLOCKS_READ_AT_ONCE):
            read = wanted[start:start + _BLOCKS_READ_AT_ONCE]
            values = get([BLOCK_PREFIX + k for k in self.directory[read].tolist()])
            if any(v is None for v in values):
                raise ValueError("the key index lacks a block its directory names")
            for first in range(0, len(read), _BLOCKS_AT_ONCE):
                self._search(read[first:first + _BLOCKS_AT_ONCE], values[first:first + _BLOCKS_AT_ONCE], keys, order,
                             ordered, (found, delta, rid, deleted))
        return found, delta, rid, deleted

    def _search(self, chunk: np.ndarray, values: list[bytes], keys: np.ndarray, order: np.ndarray,
                ordered: np.ndarray, out: tuple[np.ndarray, ...]) -> None:
        """Finds the keys of blocks ``chunk`` (whose values are ``values``) in them, into ``out``."""
        found, delta, rid, deleted = out
        width = self.directory.dtype.itemsize
        row = width + 8 * _VALUE_COLUMNS  # an entry's bytes
        raw = np.frombuffer(b"".join(values), dtype=np.uint8)
        if len(raw) != len(values) * row * BLOCK_ENTRIES:
            raise ValueError("the key index holds a block of another encoding")
        planes = raw.reshape(len(values), row, BLOCK_ENTRIES)  # (block, byte of an entry, entry)
        # The blocks' keys, end to end, are in order: one search finds each wanted key's place.
        entries = np.ascontiguousarray(planes[:, :width].transpose(0, 2, 1)).view(f"S{width}").ravel()
        at = order[np.searchsorted(ordered, chunk[0]):np.searchsorted(ordered, chunk[-1], side="right")]
        pos, hit = places(entries, keys[at])
        at, pos = at[hit], pos[hit]
        picked = np.ascontiguousarray(planes[pos // BLOCK_ENTRIES, width:, pos % BLOCK_ENTRIES])  # (key, byte)
        columns = picked.view("<i8").reshape(len(pos), _VALUE_COLUMNS)
        found[at], rid[at], delta[at], deleted[at] = True, columns[:, 0], columns[:, 1], columns[:, 2] != 0
