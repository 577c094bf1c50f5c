"""Probe: ``bitlake.convert`` of the peers' base batch (TPC-H lineitem with ``l_delta``) from a Parquet file, a
Delta table and a lance dataset, against the load of the same file by ``t.ingest(pq.read_table(file))``, each
in a process of its own, one after the other; prints each wall time and peak RSS.

The Delta table and the lance dataset are written from the file first (not timed). The base batch is the one
``benchmarks/peers.py --keep-work`` left, or generated as it does when missing.

    .venv/bin/python benchmarks/probes/convert.py SF
"""

from __future__ import annotations

import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core import DELTA, PRIMARY_KEY, ROOT, sf_text  # noqa: E402

import bitlake  # noqa: E402

NUM_BUCKETS = 16  # as the peers' bitlake tables


STEPS = ("load", "parquet", "delta", "lance")


def main() -> None:
    sf = float(sys.argv[1])
    base = ROOT / "benchmarks" / "work" / "peers" / f"sf{sf_text(sf)}" / "batches" / "0-base.parquet"
    work = ROOT / "benchmarks" / "work" / "probes" / f"convert-sf{sf_text(sf)}"
    if len(sys.argv) > 2:  # one step, in a process of its own (its peak RSS is its own)
        step(sys.argv[2], base, work)
        return
    if not base.exists():  # generated in a process of its own, which frees the table's memory when done
        subprocess.run([sys.executable, __file__, sys.argv[1], "base"], check=True)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    import lance
    from deltalake import write_deltalake

    def stream():
        source = pq.ParquetFile(base)
        return pa.RecordBatchReader.from_batches(source.schema_arrow, source.iter_batches())

    write_deltalake(str(work / "delta"), stream())
    lance.write_dataset(stream(), str(work / "source.lance"))
    for name in STEPS:
        subprocess.run([sys.executable, __file__, sys.argv[1], name], check=True)
    shutil.rmtree(work, ignore_errors=True)


def step(name: str, base: Path, work: Path) -> None:
    if name == "base":
        import core

        core.write_parquet(core.load_base(core.lineitem(float(sys.argv[1]))), base)
        return
    t0 = time.perf_counter()
    if name == "load":
        what = "load (t.ingest(pq.read_table(file)))"
        t = bitlake.create_table(str(work / "load"), pq.read_schema(base), primary_key=PRIMARY_KEY,
                                 delta_column=DELTA, num_buckets=NUM_BUCKETS)
        rows = t.ingest(pq.read_table(base), batch_id="base").counts["inserted"]
    else:
        source = {"parquet": base, "delta": work / "delta", "lance": work / "source.lance"}[name]
        what = f"convert {name}"
        rows = bitlake.convert(str(source), str(work / f"from-{name}"), primary_key=PRIMARY_KEY, delta_column=DELTA,
                               num_buckets=NUM_BUCKETS).rows
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
    print(f"{what}: {time.perf_counter() - t0:.1f} s, {rows} rows, peak RSS {peak} MB", flush=True)


if __name__ == "__main__":
    main()
