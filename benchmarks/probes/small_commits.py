"""Probe: a writer's commits of ROWS records each. N ingests of consecutive ROWS-row slices of BATCH on a copy of
TABLE whose key store this process first reads into memory (as a writer that loaded it holds it); each call's wall
time, the key index's update after it (waited for between calls, as `benchmarks/peers.py` counts it), and the SST
files the index's RocksDB wrote meanwhile (its flushes and compactions, from its info `LOG`, the index closed last).

    .venv/bin/python benchmarks/probes/small_commits.py TABLE BATCH.parquet N ROWS

TABLE and BATCH as for benchmarks/probes/stream.py: e.g. the SF 3 table `benchmarks/peers.py --scale-factors 3
--systems bitlake-arrow --no-scans --keep-work` leaves after its batches (benchmarks/work/peers/sf3/bitlake-arrow/
table) and that run's batches/1-upsert-0.001.parquet with ROWS 100; or the SF 10 table right after its load and
batches/3-upsert-0.1.parquet with ROWS 60000 (a 0.1 % batch's size). To compare two versions of bitlake, run it
from each one's checkout (`PYTHONPATH=<checkout>`) on the same TABLE: the copy leaves TABLE as it was.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import time

import pyarrow.parquet as pq
from warm import warm_copy

from bitlake.engine.keys.indexsession import close_idle, join_updates
from bitlake.format import layout


def index_writes(t) -> tuple[int, int, int]:
    """The SST bytes, flushes and compactions in the info LOG of the index of ``t`` (this opening's: the LOG starts
    afresh with each)."""
    with open(t.io.local_path(layout.INDEX_DIR) + "/LOG") as f:
        events = [json.loads(m) for m in re.findall(r"EVENT_LOG_v1 (\{.*\})", f.read())]
    return (sum(e.get("file_size", 0) for e in events if e.get("event") == "table_file_creation"),
            sum(e.get("event") == "flush_started" for e in events),
            sum(e.get("event") == "compaction_started" for e in events))


def main() -> None:
    source, batch_file, n, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    batch = pq.read_table(batch_file)
    if batch.num_rows < n * rows:
        sys.exit(f"{batch_file} has {batch.num_rows:,} rows: fewer than {n} slices of {rows:,}")
    calls, after = [], []
    with warm_copy(source) as t:
        for i in range(n):
            piece = batch.slice(i * rows, rows)
            t0 = time.perf_counter()
            t.ingest(piece, batch_id=f"small-{i}")
            t1 = time.perf_counter()
            join_updates()
            calls.append(t1 - t0)
            after.append(time.perf_counter() - t1)
        close_idle()
        written, flushes, compactions = index_writes(t)
    print(f"{n} commits of {rows:,} records: call median {1000 * statistics.median(calls):.1f} ms "
          f"(mean {1000 * statistics.mean(calls):.1f}), "
          f"key index after median {1000 * statistics.median(after):.1f} ms; the index wrote "
          f"{written / 1e6:.1f} MB of SST files in {flushes} flushes and {compactions} compactions")


if __name__ == "__main__":
    main()
