"""Writes one SST file of key-index entries: ``python -m bitlake.engine.keys.sstwrite ROWS.arrow OUT.sst RUN KEY...``
(RUN: ``bottom`` or ``upper``), from key-store rows in key order in an Arrow IPC file. The key index runs one such
process per core for a large ingest (:meth:`bitlake.engine.keys.keyindex.KeyIndex._ingest_sorted`)."""

from __future__ import annotations

import sys

# pyarrow imports pandas, when installed, the first time it converts an array to numpy, a large part of this short
# process's start (docs/benchmarks.md, "Design measurements"): this process never needs it, and an import of a
# module mapped to None fails, which pyarrow takes for "pandas is missing".
sys.modules.setdefault("pandas", None)  # type: ignore[arg-type]

import pyarrow as pa  # noqa: E402

from bitlake.engine.keys.keyindex import write_sst  # noqa: E402


def main(argv: list[str]) -> None:
    rows, out, run, *primary_key = argv
    with pa.memory_map(rows) as source:
        table = pa.ipc.open_file(source).read_all()
    write_sst(table, primary_key, out, run == "bottom")


if __name__ == "__main__":
    main(sys.argv[1:])
