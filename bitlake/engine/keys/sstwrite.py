"""The key index's SST files: entries (a key each) and blocks written by the calling thread, and the process that
writes one SST file of entries: ``python -m bitlake.engine.keys.sstwrite ROWS.arrow OUT.sst RUN KEY...`` (RUN:
``bottom`` or ``upper``), from key-store rows in key order in an Arrow IPC file. The key index runs one such process
per core for a large ingest (:meth:`bitlake.engine.keys.keyindex.KeyIndex._ingest_sorted`)."""

from __future__ import annotations

import sys

if __name__ == "__main__":
    # pyarrow imports pandas, when installed, the first time it converts an array to numpy, a large part of this
    # short process's start (docs/benchmarks.md, "Design measurements"): this process never needs it, and an import
    # of a module mapped to None fails, which pyarrow takes for "pandas is missing".
    sys.modules.setdefault("pandas", None)  # type: ignore[arg-type]

import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterable  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from bitlake.engine.keys import keyblocks  # noqa: E402
from bitlake.engine.keys.keyencoding import encode_keys, encode_values  # noqa: E402
from bitlake.format import keystore  # noqa: E402

PUT_CHUNK = 200_000
_YIELD_EVERY = 1024  # entries written between two releases of the GIL (put_each)


def _options(sst: str):
    from bitlake.engine.keys.keyindex import KeyIndex

    return KeyIndex._options(sst)


def write_sst(table: pa.Table, primary_key: list[str], path: str, bottom: bool) -> None:
    """Writes the key-store rows ``table`` (with ``_bucket``), in the index's order, as an SST file of index entries
    (``bottom``: of the bottom run, see ``keyindex._BOTTOM_BLOCK_BYTES``)."""
    from rocksdict import SstFileWriter

    writer = SstFileWriter(options=_options("bottom" if bottom else "upper"))
    writer.open(path)
    for start in range(0, table.num_rows, PUT_CHUNK):
        chunk = table.slice(start, PUT_CHUNK)
        buckets = chunk.column(keystore.BUCKET).to_numpy().astype(np.uint16)
        put_each(writer.__setitem__, encode_keys(chunk, primary_key, buckets), encode_values(chunk))
    writer.finish()


def write_blocks(chunks: Iterable[tuple[np.ndarray, list[bytes]]], path: str) -> np.ndarray:
    """Writes blocks (chunks of first keys and values, in order: :func:`keyblocks.chunks`) as an SST file of the bottom
    run; returns their first keys."""
    from rocksdict import SstFileWriter

    writer = SstFileWriter(options=_options("bottom"))
    writer.open(path)
    firsts = []
    for first, values in chunks:
        for key, value in zip(first.tolist(), values, strict=True):
            writer[keyblocks.BLOCK_PREFIX + key] = value
        firsts.append(first)
    writer.finish()
    return np.concatenate(firsts)


def put_each(put, keys: list[bytes], values: list[bytes]) -> None:
    """``put(key, value)`` for each entry, letting other threads take the GIL every _YIELD_EVERY entries.
    rocksdict holds the GIL for each call, so a thread that needs it back after each call of its own (pyarrow,
    numpy) would wait up to a switch interval (5 ms by default) every time, and a commit's key-store files, written
    beside a thread putting its entries, would take several times as long; the pauses cost the entries nothing
    (docs/benchmarks.md, "Design measurements", "Key index: staging and the GIL")."""
    alone = threading.active_count() == 1  # no thread to let in (a process of its own, sstwrite): no pauses
    step = max(len(keys), 1) if alone else _YIELD_EVERY
    for start in range(0, len(keys), step):
        for k, v in zip(keys[start:start + step], values[start:start + step], strict=True):
            put(k, v)
        if not alone:
            time.sleep(0)  # releases the GIL: a thread waiting for it takes it now


def main(argv: list[str]) -> None:
    rows, out, run, *primary_key = argv
    with pa.memory_map(rows) as source:
        table = pa.ipc.open_file(source).read_all()
    write_sst(table, primary_key, out, run == "bottom")


if __name__ == "__main__":
    main(sys.argv[1:])
