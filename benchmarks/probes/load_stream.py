"""Probe: TPC-H lineitem streamed from its Parquet file into a new keyed table by the driver path, in bounded
memory; prints the wall time and the peak RSS.

    .venv/bin/python benchmarks/probes/load_stream.py SF
"""

from __future__ import annotations

import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import core  # noqa: E402

import bitlake  # noqa: E402


def main() -> None:
    sf = float(sys.argv[1])
    source = pq.ParquetFile(core.lineitem(sf))
    schema = core.table_schema(source.schema_arrow)

    def batches():
        for b in source.iter_batches(batch_size=1 << 17):
            columns = [b.column(f.name).cast(f.type) for f in schema if f.name != core.DELTA]
            columns.append(pa.array(np.zeros(b.num_rows, dtype=np.int32)))
            yield pa.RecordBatch.from_arrays(columns, schema=schema)

    path = core.ROOT / "benchmarks" / "work" / "probes" / f"s{sf}"
    shutil.rmtree(path, ignore_errors=True)
    t = bitlake.create_table(str(path), schema, primary_key=core.PRIMARY_KEY, delta_column=core.DELTA,
                             num_buckets=64)
    t0 = time.perf_counter()
    r = t.ingest(pa.RecordBatchReader.from_batches(schema, batches()), batch_id="base")
    print("load", sf, source.metadata.num_rows, round(time.perf_counter() - t0, 1), r.counts, flush=True)
    print("peak RSS MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10)


if __name__ == "__main__":
    main()
