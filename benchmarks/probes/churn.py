"""Probe: small commits after churn. On a copy of TABLE (a table right after its load), ingests CHURN (a large
batch of updates of random keys, which leaves holes all over the load's segments), then N batches of ROWS rows
drawn at random from BASE (updates of random keys of the load); for each call its wall time, the key index's
update after it, the bytes of bitmap files it wrote, every byte it wrote (as `benchmarks/peers.py` counts them: a
file of at most 1 MB that only grew counts what it grew) and how many of its segment states name a delta.

    .venv/bin/python benchmarks/probes/churn.py TABLE BASE.parquet CHURN.parquet N ROWS

E.g. the SF 10 table right after `benchmarks/peers.py --scale-factors 10 --systems bitlake-arrow --no-scans
--keep-work` loaded it, that run's batches/0-base.parquet and batches/3-upsert-0.1.parquet (the 10 % batch), N 6
and ROWS 60000 (a 0.1 % batch). To compare two versions of bitlake, run it from each one's checkout
(`PYTHONPATH=<checkout>`) on the same TABLE: the copy leaves TABLE as it was, and the batches are the same (seeded).
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from warm import warm_copy

from bitlake.engine.keys.indexsession import flush_idle
from bitlake.format import commitlog


def _sizes(root: str) -> dict[str, int]:
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            try:
                out[path] = os.path.getsize(path)
            except FileNotFoundError:  # removed by the index's thread meanwhile
                pass
    return out


def main() -> None:
    source, base_file, churn_file, n, rows = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    base = pq.read_table(base_file)
    rng = np.random.default_rng(7)
    batches = [("churn", pq.read_table(churn_file))]
    batches += [(f"random {i}", base.take(pa.array(np.sort(rng.choice(base.num_rows, rows, replace=False)))))
                for i in range(n)]
    del base
    delta_column = None
    with warm_copy(source) as t:
        delta_column = t.metadata.delta_column
        for i, (name, batch) in enumerate(batches):
            column = batch.schema.get_field_index(delta_column)
            batch = batch.set_column(column, delta_column, pa.array([1_000 + i] * batch.num_rows,
                                                                     batch.schema.field(column).type))
            os.sync()
            before = _sizes(t.path)
            t0 = time.perf_counter()
            r = t.ingest(batch, batch_id=f"churn-{i}")
            t1 = time.perf_counter()
            flush_idle()
            t2 = time.perf_counter()
            grown = {p: size for p, size in _sizes(t.path).items() if before.get(p) != size}
            bitmaps = sum(size for p, size in grown.items() if f"{os.sep}bitmaps{os.sep}" in p)
            written = sum(size - before[p] if before.get(p) and size <= 1 << 20 else size for p, size in grown.items())
            segments = commitlog.read(t.io, r.version).segments
            print(f"{name:>9}: {batch.num_rows:>9,} rows  call {t1 - t0:6.3f} s (+{t2 - t1:.3f} after)  bitmaps "
                  f"{bitmaps / 1e6:6.2f} MB  written {written / 1e6:7.2f} MB  deltas "
                  f"{sum(1 for s in segments if s.delta)} of {len(segments)} segment states", flush=True)


if __name__ == "__main__":
    main()
