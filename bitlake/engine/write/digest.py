"""The digest of a batch's records: what tells a retry of a committed batch id (the same records: a no-op) from
new records under a taken id (an error), docs/FORMAT.md "Batch digest".

It is computed over the conformed input (the table's columns and types, and the op column), column by column,
as the records stream to the landing, so it depends on the records and their order only: not on how the input
was cut into record batches, nor on the files the landing writes. Each column is split into value streams
(a list's lengths and its values, a struct's fields), and each stream feeds a SHA-256 with its null positions
and its non-null values in a fixed binary form; a column without a non-null value is left out, so an omitted
nullable column and an all-null one are the same records.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ALGORITHM = "sha256-columns-v1"


class Digest:
    """A running digest of conformed record batches; :meth:`over` passes them through while it feeds them."""

    def __init__(self) -> None:
        self._hashes: dict[str, hashlib._Hash] = {}
        self._seen: dict[str, int] = {}  # values fed to a stream so far (nulls included): where its next one sits
        self._valued: set[str] = set()  # columns with a non-null value

    def over(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            self.update(b)
            yield b

    def update(self, batch: pa.RecordBatch) -> None:
        for name, column in zip(batch.schema.names, batch.columns, strict=True):
            if column.null_count < len(column):
                self._valued.add(name)
            self._feed(name, column)

    def hexdigest(self) -> str:
        """``sha256-columns-v1:`` and the hex SHA-256 of each valued column's streams, by name."""
        top = hashlib.sha256(ALGORITHM.encode())
        for stream in sorted(self._hashes):
            if stream.split("\0", 1)[0] in self._valued:
                top.update(stream.encode() + b"\0" + self._hashes[stream].digest())
        return f"{ALGORITHM}:{top.hexdigest()}"

    def _hash(self, stream: str) -> hashlib._Hash:
        h = self._hashes.get(stream)
        if h is None:
            h = self._hashes[stream] = hashlib.sha256()
        return h

    def _feed(self, stream: str, a: pa.Array) -> None:
        start = self._seen.get(stream, 0)
        self._seen[stream] = start + len(a)
        if a.null_count:
            nulls = pc.indices_nonzero(a.is_null()).to_numpy().astype(np.int64) + start
            self._hash(stream + "\0nulls").update(nulls.tobytes())
            a = a.drop_null()
        if not len(a):
            return
        t = a.type
        h = self._hash(stream)
        if pa.types.is_boolean(t):
            h.update(pc.cast(a, pa.uint8()).to_numpy(zero_copy_only=False).tobytes())
        elif pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) \
                or pa.types.is_large_binary(t):
            wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
            offsets = np.frombuffer(a.buffers()[1], dtype=np.int64 if wide else np.int32, count=len(a) + 1,
                                    offset=a.offset * (8 if wide else 4))
            self._hash(stream + "\0lengths").update(np.diff(offsets).astype(np.int64).tobytes())
            data = a.buffers()[2]
            if data is not None:
                h.update(memoryview(data)[int(offsets[0]):int(offsets[-1])])
        elif pa.types.is_struct(t):
            for i, field in enumerate(t):
                self._feed(f"{stream}\0.{field.name}", a.field(i))
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            self._hash(stream + "\0lengths").update(
                pc.list_value_length(a).cast(pa.int64()).to_numpy().tobytes())
            self._feed(f"{stream}\0[]", a.flatten())
        elif (width := _byte_width(t)) and len(a.buffers()) == 2 and a.buffers()[1] is not None:
            h.update(memoryview(a.buffers()[1])[a.offset * width:(a.offset + len(a)) * width])
        else:  # maps and other rare types: their values as Python objects (slow, exact)
            for value in a.to_pylist():
                text = repr(value).encode()
                h.update(len(text).to_bytes(8, "little") + text)


def _byte_width(t: pa.DataType) -> int:
    """The bytes a value of a fixed-width type takes in its one values buffer; 0 for any other type."""
    if pa.types.is_dictionary(t) or pa.types.is_nested(t):
        return 0
    try:
        bits = t.bit_width
    except ValueError:  # not fixed width
        return 0
    return bits // 8 if bits % 8 == 0 else 0
