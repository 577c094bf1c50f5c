"""Probe: N upserts of a FRACTION of lineitem's rows (uniform, as the peers benchmark draws them) into a copy of a
table, one after the other in one process; prints each batch's wall time, the time of its key-store step
(writing the buckets' increments and the merges due) and the number of key-store files of each bucket, then the
median and the slowest batch. Run it on a table whose buckets hold as many files each (after a load, or a copy
of benchmarks/work/probes/churn-sf1.0/table) with the code before and after a change to the merge policy.

    .venv/bin/python benchmarks/probes/merge_turns.py TABLE_PATH N FRACTION [SF]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import core  # noqa: E402
from upsert import metagen_steps, uniform_batch  # noqa: E402

import bitlake  # noqa: E402


def main() -> None:
    path, n, fraction = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    source = pq.ParquetFile(core.lineitem(float(sys.argv[4]) if len(sys.argv) > 4 else 1.0))
    t = bitlake.open_table(path)
    schema = core.table_schema(source.schema_arrow)
    walls = []
    for seed in range(500, 500 + n):
        changes = uniform_batch(source, schema, fraction, seed)
        with core.PhaseTimer().installed(metagen_steps()) as steps:
            t0 = time.perf_counter()
            t.ingest(changes, batch_id=f"m{seed}")
            wall = time.perf_counter() - t0
        walls.append(wall)
        files = sorted(len(f) for f in t.state().keystore.values())
        print(t.version, "wall", round(wall, 3), "key-store files", round(steps.take().get("key-store files", 0), 3),
              "files a bucket", files, flush=True)
    walls.sort()
    print("median", round(walls[len(walls) // 2], 3), "slowest", round(walls[-1], 3), "total", round(sum(walls), 2))


if __name__ == "__main__":
    main()
