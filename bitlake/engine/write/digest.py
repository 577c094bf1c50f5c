"""The digest of a batch's records: what tells a retry of a committed batch id (the same records: a no-op) from
new records under a taken id (an error), docs/FORMAT.md "Batch digest".

It is computed over the conformed input (the table's columns and types, and the op column), column by column,
as the records stream to the landing, so it depends on the records and their order only: not on how the input
was cut into record batches, nor on the files the landing writes. Each column is split into value streams
(a list's lengths and its values, a struct's fields), and each stream feeds a hash with its null positions
and its non-null values in a fixed binary form; a column without a non-null value is left out, so an omitted
nullable column and an all-null one are the same records.

Streams are hashed with XXH3-128 (``xxh3-128-columns-v2``, what bitlake writes): a digest costs a fraction of the
landing's encoding, where SHA-256 cost a fifth of a load's CPU (docs/benchmarks.md, "Design measurements"). Digests
of ``sha256-columns-v1`` (older writers) are still compared, by digesting a retry's records the same way.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

# Each algorithm's hash of a stream; the top hash, over the streams' names and hashes, is SHA-256 for all.
STREAM_HASHES = {"xxh3-128-columns-v2": xxhash.xxh3_128, "sha256-columns-v1": hashlib.sha256}
ALGORITHM = "xxh3-128-columns-v2"
_QUEUED_BATCHES = 16


class Digest:
    """A running digest of conformed record batches; :meth:`over` passes them through while a thread of its own
    feeds them (NumPy and Arrow release the GIL), so the landing does not wait for the hashing."""

    def __init__(self, algorithm: str = ALGORITHM) -> None:
        self.algorithm = algorithm
        self._new_hash = STREAM_HASHES[algorithm]
        self._hashes: dict = {}
        self._seen: dict[str, int] = {}  # values fed to a stream so far (nulls included): where its next one sits
        self._valued: set[str] = set()  # columns with a non-null value
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    def over(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches``, digested on a thread as they pass; :meth:`hexdigest` waits for it."""
        # Bounded, so a stream that lands faster than it is hashed is held back rather than held in memory.
        todo: queue.Queue[pa.RecordBatch | None] = queue.Queue(maxsize=_QUEUED_BATCHES)

        def work() -> None:
            while (b := todo.get()) is not None:
                if self._failed is None:
                    try:
                        self.update(b)
                    except BaseException as e:  # noqa: BLE001 - raised by hexdigest, in the caller's thread
                        self._failed = e

        self._thread = threading.Thread(target=work, name="bitlake-digest", daemon=True)
        self._thread.start()
        try:
            for b in batches:
                todo.put(b)
                yield b
        finally:
            todo.put(None)

    def update(self, batch: pa.RecordBatch) -> None:
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            if column.null_count < len(column):
                self._valued.add(name)
            self._feed(name, column)

    def hexdigest(self) -> str:
        """The algorithm's name, ``:`` and the hex SHA-256 of each valued column's streams' hashes, by name."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._failed is not None:
            raise self._failed
        top = hashlib.sha256(self.algorithm.encode())
        for stream in sorted(self._hashes):
            if stream.split("\0", 1)[0] in self._valued:
                top.update(stream.encode() + b"\0" + self._hashes[stream].digest())
        return f"{self.algorithm}:{top.hexdigest()}"

    def _hash(self, stream: str):
        h = self._hashes.get(stream)
        if h is None:
            h = self._hashes[stream] = self._new_hash()
        return h

    def _feed(self, stream: str, a: pa.Array) -> None:
        start = self._seen.get(stream, 0)
        self._seen[stream] = start + len(a)
        if a.null_count:
            nulls = pc.indices_nonzero(a.is_null()).to_numpy().astype(np.int64) + start
            self._hash(stream + "\0nulls").update(nulls)
            a = a.drop_null()
        if not len(a):
            return
        t = a.type
        h = self._hash(stream)
        if pa.types.is_boolean(t):
            h.update(pc.cast(a, pa.uint8()).to_numpy(zero_copy_only=False))
        elif pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) \
                or pa.types.is_large_binary(t):
            wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
            offsets = np.frombuffer(a.buffers()[1], dtype=np.int64 if wide else np.int32, count=len(a) + 1,
                                    offset=a.offset * (8 if wide else 4))
            self._hash(stream + "\0lengths").update(np.diff(offsets).astype(np.int64, copy=False))
            data = a.buffers()[2]
            if data is not None:
                h.update(memoryview(data)[int(offsets[0]):int(offsets[-1])])
        elif pa.types.is_struct(t):
            for i, field in enumerate(t):
                self._feed(f"{stream}\0.{field.name}", a.field(i))
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            self._hash(stream + "\0lengths").update(
                pc.list_value_length(a).cast(pa.int64()).to_numpy())
            self._feed(f"{stream}\0[]", a.flatten())
        elif (width := _byte_width(t)) and len(a.buffers()) == 2 and a.buffers()[1] is not None:
            h.update(memoryview(a.buffers()[1])[a.offset * width:(a.offset + len(a)) * width])
        else:  # maps and other rare types: their values as Python objects (slow, exact)
            for value in a.to_pylist():
                text = repr(value).encode()
                h.update(len(text).to_bytes(8, "little") + text)


def algorithm_of(digest: str) -> str:
    """The algorithm a digest was taken by: its text before the first ``:``."""
    return digest.split(":", 1)[0]


def _byte_width(t: pa.DataType) -> int:
    """The bytes a value of a fixed-width type takes in its one values buffer; 0 for any other type."""
    if pa.types.is_dictionary(t) or pa.types.is_nested(t):
        return 0
    try:
        bits = t.bit_width
    except ValueError:  # not fixed width
        return 0
    return bits // 8 if bits % 8 == 0 else 0
