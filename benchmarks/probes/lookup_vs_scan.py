"""Probe: one upsert batch (a random fraction of lineitem's rows, sampled from random row groups) committed
with the key index's point lookups and with a scan of the key store, each on a fresh copy of the table
benchmarks/probes/load_stream.py made; prints the wall times, which set metagen.LOOKUP_COST_IN_ROWS.

    .venv/bin/python benchmarks/probes/lookup_vs_scan.py SF FRACTION [SEED ...]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import core  # noqa: E402
from upsert import batch  # noqa: E402 - the same sampled batch

import bitlake  # noqa: E402
from bitlake.engine.write import metagen  # noqa: E402


def main() -> None:
    sf, fraction = float(sys.argv[1]), float(sys.argv[2])
    seeds = [int(s) for s in sys.argv[3:]] or [1, 2]
    table = core.ROOT / "benchmarks" / "work" / "probes" / f"s{sf}"
    source = pq.ParquetFile(core.lineitem(sf))
    schema = core.table_schema(source.schema_arrow)
    with tempfile.TemporaryDirectory(prefix="bitlake-probe-") as work:
        for seed in seeds:
            b = batch(source, schema, fraction, seed)
            for mode, cost in (("lookups", 0), ("scan", 10**12)):
                copy = Path(work) / f"{mode}-{seed}"  # a path of its own: no index this process keeps is reused
                shutil.copytree(table, copy)
                metagen.LOOKUP_COST_IN_ROWS = cost
                t = bitlake.open_table(str(copy))
                t0 = time.perf_counter()
                r = t.ingest(b, batch_id=f"probe-{seed}")
                print(mode, "seed", seed, "rows", b.num_rows, "wall s", round(time.perf_counter() - t0, 3), r.counts,
                      flush=True)
                shutil.rmtree(copy)


if __name__ == "__main__":
    main()
