"""Probe: ``bitlake.convert`` of the peers' base batch (TPC-H lineitem with ``l_delta``) from a Parquet file, a
Delta table and a lance dataset, against the load of the same file by ``t.ingest(pq.read_table(file))``, all
in this process one after the other; prints each wall time and the peak RSS.

The Delta table and the lance dataset are written from the file first (not timed). Run
``benchmarks/peers.py`` for the scale factor first: it writes the base batch.

    .venv/bin/python benchmarks/probes/convert.py SF
"""

from __future__ import annotations

import resource
import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import DELTA, PRIMARY_KEY, ROOT, sf_text  # noqa: E402

import bitlake  # noqa: E402

NUM_BUCKETS = 16  # as the peers' bitlake tables


def main() -> None:
    sf = float(sys.argv[1])
    base = ROOT / "benchmarks" / "work" / "peers" / f"sf{sf_text(sf)}" / "batches" / "0-base.parquet"
    if not base.exists():
        sys.exit(f"{base} is missing: run benchmarks/peers.py --scale-factors {sf_text(sf)} first")
    work = ROOT / "benchmarks" / "work" / "probes" / f"convert-sf{sf_text(sf)}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    import lance
    from deltalake import write_deltalake

    def stream():
        source = pq.ParquetFile(base)
        return pa.RecordBatchReader.from_batches(source.schema_arrow, source.iter_batches())

    write_deltalake(str(work / "delta"), stream())
    lance.write_dataset(stream(), str(work / "source.lance"))

    def timed(name, fn):
        t0 = time.perf_counter()
        rows = fn()
        print(f"{name}: {time.perf_counter() - t0:.1f} s, {rows} rows", flush=True)

    def load():
        t = bitlake.create_table(str(work / "load"), pq.read_schema(base), primary_key=PRIMARY_KEY,
                                 delta_column=DELTA, num_buckets=NUM_BUCKETS)
        inserted = t.ingest(pq.read_table(base), batch_id="base").counts["inserted"]
        pa.default_memory_pool().release_unused()  # the file read, before the conversions
        return inserted

    def convert(source, target):
        return lambda: bitlake.convert(str(source), str(work / target), primary_key=PRIMARY_KEY, delta_column=DELTA,
                                       num_buckets=NUM_BUCKETS).rows

    timed("load (t.ingest(pq.read_table(file)))", load)
    timed("convert Parquet file", convert(base, "from-parquet"))
    timed("convert Delta table", convert(work / "delta", "from-delta"))
    timed("convert lance dataset", convert(work / "source.lance", "from-lance"))
    print("peak RSS MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
