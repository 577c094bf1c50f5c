"""Peak memory of a base load from an Arrow stream: TPC-H lineitem (tpchgen-cli) read row group by row group from
its Parquet file into a new keyed table (16 buckets), the resident set of the process tree (the key index's SST
writers are processes) and pyarrow's allocations sampled every 50 ms, with the peak of each phase: the landing
of the data, the inline MetaGen, the key index's update after the commit. Memory, not time: the figures hold on
a busy machine (the seconds do not). ``--output`` prints the row of docs/benchmarks.md ("Memory of a load");
``BITLAKE_KEYSTORE_CACHE_BYTES=0`` measures without the key-store cache.

    .venv/bin/python benchmarks/memory.py --scale-factor 1 [--output]
"""

from __future__ import annotations

import argparse
import functools
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import core  # noqa: E402


def rss() -> int:
    """The resident set of this process and its children (the key index's SST writers are processes)."""
    return core.TreeRss.sample()[3]


class Sampler:
    """The peak RSS and pyarrow allocation of each phase (the phase a sample falls in)."""

    def __init__(self):
        self.phase = "start"
        self.peaks: dict[str, list[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            peak = self.peaks.setdefault(self.phase, [0, 0])
            peak[0], peak[1] = max(peak[0], rss()), max(peak[1], pa.total_allocated_bytes())
            time.sleep(0.05)

    def during(self, phase: str, f):
        @functools.wraps(f)
        def wrapped(*args, **kwargs):
            before, self.phase = self.phase, phase
            try:
                return f(*args, **kwargs)
            finally:
                self.phase = before
        return wrapped

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def stream(path: Path, schema: pa.Schema):
    """The lineitem file as the table's schema, batch by batch (never whole in memory)."""
    source = pq.ParquetFile(path)
    # Row group by row group: ParquetFile.iter_batches buffers ahead of its consumer (1.25 GB of pyarrow's memory
    # while 30 M rows of SF 10 pass through it, on pyarrow 26), which would be the input's memory, not the load's.
    for b in (b for i in range(source.num_row_groups) for b in source.read_row_group(i).to_batches(65_536)):
        yield pa.RecordBatch.from_arrays(core.base_columns(b, schema), schema=schema)


def measure(sf: float) -> dict:
    import bitlake
    from bitlake.engine.keys.indexsession import flush_idle
    from bitlake.engine.write import landing, metagen

    path = core.lineitem(sf)
    schema = core.table_schema(pq.ParquetFile(path).schema_arrow)
    work = core.fresh_work(f"memory-sf{core.sf_text(sf)}")
    sampler = Sampler()
    landing.land_local = sampler.during("landing", landing.land_local)
    metagen.run_inline = sampler.during("MetaGen", metagen.run_inline)
    start = rss()
    t = bitlake.create_table(str(work / "table"), schema, primary_key=core.PRIMARY_KEY, delta_column=core.DELTA,
                             num_buckets=16)
    with sampler:
        t0 = time.perf_counter()
        r = t.ingest(pa.RecordBatchReader.from_batches(schema, stream(path, schema)))
        seconds = time.perf_counter() - t0
        sampler.phase = "key index"  # brought to the commit on a thread of its own after the call returns
        t1 = time.perf_counter()
        flush_idle()
        index_seconds = time.perf_counter() - t1
    return {"sf": sf, "rows": r.counts["inserted"], "seconds": seconds, "index_seconds": index_seconds,
            "rss_before": start,
            "phases": {k: {"rss": v[0], "arrow": v[1]} for k, v in sampler.peaks.items()}}


def mb(n: int) -> str:
    return f"{n / (1 << 20):,.0f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale-factor", type=float, default=1.0)
    p.add_argument("--output", action="store_true", help="print the doc's table row (docs/benchmarks.md)")
    args = p.parse_args()
    m = measure(args.scale_factor)
    phases = m["phases"]
    peak = max(v["rss"] for v in phases.values())
    print(f"SF {core.sf_text(m['sf'])}: {m['rows']:,} rows in {m['seconds']:.1f} s (then the key index "
          f"{m['index_seconds']:.1f} s); peak RSS {mb(peak)} MB "
          f"(before the load {mb(m['rss_before'])} MB)")
    for name in ("landing", "MetaGen", "key index"):
        if name in phases:
            print(f"  {name}: peak RSS {mb(phases[name]['rss'])} MB, pyarrow {mb(phases[name]['arrow'])} MB")
    if args.output:
        cells = [f"{mb(phases[n]['rss'])} ({mb(phases[n]['arrow'])})" if n in phases else "-"
                 for n in ("landing", "MetaGen", "key index")]
        print(f"| {core.sf_text(m['sf'])} | {m['rows']:,} | {m['seconds']:.1f} + {m['index_seconds']:.1f} | {mb(peak)} "
              f"| {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
