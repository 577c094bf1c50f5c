"""Probe: a stream of batches, back to back: each call's wall time and the stream's total with the key index
caught up after the last one (the index takes each commit's entries on a thread after the call, and the next
commit waits for it), on a copy of TABLE whose key store this process first reads into memory, as a writer
that loaded it holds it.

    .venv/bin/python benchmarks/probes/stream.py TABLE BATCH.parquet N

TABLE: a bitlake table, e.g. the one `benchmarks/peers.py --scale-factors 10 --systems bitlake-arrow --keep-work`
leaves in benchmarks/work/peers/sf10/bitlake-arrow/table; BATCH.parquet: a batch of its schema, e.g. that run's
batches/2-upsert-0.01.parquet (each call takes it under a new batch id: the same keys again).
"""

from __future__ import annotations

import os
import sys
import time

import pyarrow.parquet as pq
from warm import warm_copy

from bitlake.engine.keys.indexsession import flush_idle


def main() -> None:
    source, batch_file, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with warm_copy(source) as t:
        os.sync()
        batches = [pq.read_table(batch_file) for _ in range(n)]
        calls = []
        t0 = time.perf_counter()
        for k, batch in enumerate(batches):
            c0 = time.perf_counter()
            t.ingest(batch, batch_id=f"stream-{k}")
            calls.append(time.perf_counter() - c0)
        flush_idle()
        total = time.perf_counter() - t0
    print("calls (s):", " / ".join(f"{c:.2f}" for c in calls), f"; total with the index caught up: {total:.2f} s")


if __name__ == "__main__":
    main()
