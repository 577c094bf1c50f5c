"""Probe: the inline MetaGen beside the landing's writes, or after them. N ingests of BATCH on a copy of TABLE whose
key store this process first reads into memory (as a writer that loaded it holds it), alternating: even calls as
bitlake runs them (the MetaGen while the last segments' files are written), odd ones with the landing settled
first; each call's wall time, the key index caught up between calls.

    .venv/bin/python benchmarks/probes/overlap.py TABLE BATCH.parquet N

TABLE and BATCH as for benchmarks/probes/stream.py (e.g. the SF 10 table `benchmarks/peers.py --keep-work` leaves
right after its load, and that run's batches/2-upsert-0.01.parquet).
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import pyarrow.parquet as pq
from warm import warm_copy

from bitlake import batches
from bitlake.engine.keys.indexsession import flush_idle


def main() -> None:
    source, batch_file, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    land = batches.land
    times: dict[str, list[float]] = {"beside the writes": [], "after the writes": []}
    with warm_copy(source) as t:
        try:
            for i in range(n):
                serial = i % 2 == 1
                batches.land = (lambda *a, **k: land(*a[:4], settle=True)) if serial else land
                batch = pq.read_table(batch_file)
                os.sync()
                t0 = time.perf_counter()
                t.ingest(batch, batch_id=f"overlap-{i}")
                times["after the writes" if serial else "beside the writes"].append(time.perf_counter() - t0)
                flush_idle()
        finally:
            batches.land = land
    for name, ts in times.items():
        print(f"MetaGen {name}: median {statistics.median(ts):.3f} s; calls " + " / ".join(f"{x:.2f}" for x in ts))


if __name__ == "__main__":
    main()
