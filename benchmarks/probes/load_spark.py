"""Probe: TPC-H lineitem of scale factor SF loaded into a new keyed table from a Spark DataFrame
(``spark.read.parquet`` of the file), then upsert batches of random keys (as benchmarks/probes/upsert.py draws
them with ``uniform``, written as Parquet and read by Spark) with each MetaGen mode: inline on the driver and
as a Spark job (``inline=False``). Prints each step's wall time and the peak RSS of the driver's Python, the JVM
(driver and executors in local mode) and PySpark's Python workers (benchmarks/core.py's TreeRss). The process
holds no copy of the data, so the driver's figures are bitlake's.

    .venv/bin/python benchmarks/probes/load_spark.py SF
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import core  # noqa: E402
from upsert import uniform_batch  # noqa: E402

import bitlake  # noqa: E402

STEPS = [("1 % inline", 0.01, 1, None), ("1 % Spark MetaGen", 0.01, 2, False), ("10 % inline", 0.10, 3, None),
         ("10 % Spark MetaGen", 0.10, 4, False)]


def main() -> None:
    sf = float(sys.argv[1])
    os.environ.setdefault("BITLAKE_DRIVER_MEMORY", "8g")
    source = core.lineitem(sf)
    schema = core.table_schema(pq.read_schema(source))
    work = core.ROOT / "benchmarks" / "work" / "probes" / f"spark-{sf:g}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "batches").mkdir(parents=True)
    for _, fraction, seed, _ in STEPS:  # drawn before the run: the process holds none of them while it runs
        batch = uniform_batch(pq.ParquetFile(source), schema, fraction, seed)
        pq.write_table(batch, work / "batches" / f"{seed}.parquet")
        del batch
    spark = bitlake.spark_session("local[2]", app_name="bitlake-probe-load-spark")
    t = bitlake.create_table(str(work / "table"), schema, primary_key=core.PRIMARY_KEY, delta_column=core.DELTA,
                             num_buckets=16)
    from pyspark.sql import functions as F

    spark.read.parquet(str(source)).limit(10).collect()  # the JVM's classes loaded before the timed load
    rss = core.TreeRss().start()
    spans: list[tuple[str, float, float]] = []

    def step(name, df, **kw):
        rss.mark()
        start, t0 = time.time() * 1000, time.perf_counter()
        r = t.ingest(df, **kw)
        wall = time.perf_counter() - t0
        rss.mark()
        spans.append((name, start, time.time() * 1000))
        peak = rss.peaks(spans[-1:])[name]
        print(f"{name}: {wall:.1f} s, {r.counts}; peak RSS: driver Python {core.mb(peak['driver_python'])}, "
              f"JVM {core.mb(peak['jvm'])}, Python workers {core.mb(peak['python_workers'])}, "
              f"all {core.mb(peak['tree'])}", flush=True)

    base = spark.read.parquet(str(source)).withColumn(core.DELTA, F.lit(0).cast("int"))
    step("load", base, batch_id="load")
    for name, _, seed, inline in STEPS:
        step(name, spark.read.parquet(str(work / "batches" / f"{seed}.parquet")), batch_id=f"u{seed}", inline=inline)
    rss.stop()
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
