"""Probe: what the batch digest (bitlake/engine/write/digest.py) costs an Arrow ingest. A keyed table of ROWS
rows (five columns: two int64, a string, a double, an int32) is loaded, then upserted 1 % and 100 %, with the
digest taken and with it replaced by a no-op, runs interleaved; and the digest alone over the same records (CPU
time). Medians of 5 runs.

    .venv/bin/python benchmarks/probes/digest.py [ROWS]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

import bitlake
from bitlake.engine.keys.indexsession import flush_idle
from bitlake.engine.write import digest


class NoDigest(digest.Digest):
    def update(self, batch: pa.RecordBatch) -> None:
        pass


def data(rng, ids, mod: int) -> pa.Table:
    n = len(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "mod": pa.array(np.full(n, mod), pa.int64()),
                     "name": pa.array([f"name-{i}" for i in range(n)], pa.string()),
                     "amount": pa.array(rng.random(n)), "qty": pa.array(rng.integers(0, 1000, n), pa.int32())})


def main(rows: int) -> None:
    rng = np.random.default_rng(0)
    steps = {"load": data(rng, np.arange(rows), 1),
             "upsert 1 %": data(rng, rng.choice(rows, rows // 100, replace=False), 2),
             "upsert 100 %": data(rng, rng.permutation(rows), 3)}
    times: dict[tuple[str, str], list[float]] = {}
    real = digest.Digest
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(5):
            for variant, cls in (("digest", real), ("no digest", NoDigest)):
                digest.Digest = cls
                t = bitlake.create_table(f"{tmp}/{variant}-{run}", steps["load"].schema, primary_key="id",
                                         delta_column="mod")
                for step, batch in steps.items():
                    t0 = time.perf_counter()
                    t.ingest(batch)
                    times.setdefault((step, variant), []).append(time.perf_counter() - t0)
        flush_idle()  # the key index's last flush, before its folder goes
    digest.Digest = real
    cpu = []
    for _ in range(5):
        d = real()
        t0 = time.process_time()
        for b in steps["load"].to_batches():
            d.update(b)
        d.hexdigest()
        cpu.append(time.process_time() - t0)
    print(f"{rows:,} rows, {steps['load'].nbytes / 1e6:.0f} MB as Arrow; medians of 5 (s)")
    for step in steps:
        with_, without = (statistics.median(times[(step, v)]) for v in ("digest", "no digest"))
        print(f"  {step:14s} digest {with_:.3f}  no digest {without:.3f}  ratio {with_ / without:.2f}")
    print(f"  the digest alone over the load: {statistics.median(cpu) * 1000:.1f} ms CPU")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
