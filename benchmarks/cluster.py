"""bitlake on a standalone Spark cluster (a master and two workers started from the pyspark wheel on this machine,
each worker with one core), TPC-H ``lineitem`` keyed by ``(l_orderkey, l_linenumber)``: the base load from a Spark
DataFrame (``spark.read.parquet``), then a 10 % upsert batch (the peers benchmark's, same seed) made live by a Spark
MetaGen job (``inline=False``), and another by the default, against plain Spark writing the same DataFrames as
Parquet on the same cluster. Each operation's peak resident set is sampled every 0.25 s: the driver (this Python
process and its JVM) and each executor (its JVM and its Python workers).

    .venv/bin/python benchmarks/cluster.py --scale-factor 10 [--no-doc]

Writes ``benchmarks/results/cluster-<date>-sf<SF>.json`` and the section "Cluster" of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import core, peers  # noqa: E402

HEADING = "## Cluster: Spark input and Spark MetaGen on a standalone cluster"
EXECUTOR = "CoarseGrainedExecutorBackend"


class ClusterRss:
    """The peak resident set of the driver (this process and its descendants outside the cluster's daemons) and
    of each executor (its JVM and its Python workers), sampled on a thread while a span runs."""

    def __init__(self, daemons: list[int], interval: float = 0.25):
        self.daemons, self.interval = set(daemons), interval
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> dict[str, int]:
        procs, children = core.processes()
        me = os.getpid()
        driver = procs.get(me, (0, "", 0))[2] + sum(procs[p][2] for p in core.descendants(me, children, self.daemons))
        out = {"driver": driver}
        executors = sorted(p for d in self.daemons for p in core.descendants(d, children) if _is_executor(p))
        for i, pid in enumerate(executors):
            out[f"executor {i + 1}"] = procs[pid][2] + sum(procs[p][2] for p in core.descendants(pid, children))
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            for k, v in self.sample().items():
                self.peaks[k] = max(self.peaks.get(k, 0), v)
            time.sleep(self.interval)

    def __enter__(self) -> ClusterRss:
        self.peaks, self._stop = {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()


def _is_executor(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return EXECUTOR.encode() in f.read()
    except OSError:
        return False


def run(sf: float, worker_memory: str, executor_memory: str) -> dict:
    import bitlake
    from bitlake.engine.keys.indexsession import flush_idle
    from tests.sparkservers import start_cluster, wait_executors

    work = core.fresh_work(f"cluster-sf{core.sf_text(sf)}")
    base = work / "base.parquet"
    core.log(f"writing the base of SF {core.sf_text(sf)}")
    peers.write_base(core.lineitem(sf), base)
    maker = peers.PeerChanges(peers.BaseFile(base), peers.SEED)
    batches = []
    for k in (1, 2):
        batch, comp = maker.upsert(k, 0.10)
        path = work / f"{k}-upsert-0.1.parquet"
        core.write_parquet(batch, path)
        batches.append((path, comp))
        del batch
    (work / "spark").mkdir()
    cluster = start_cluster(work / "spark", workers=2, cores=1, memory=worker_memory)
    ops: list[dict] = []
    try:
        spark = bitlake.spark_session(master=cluster.url, app_name="bitlake-cluster-bench",
                                      **{"spark.executor.memory": executor_memory, "spark.executor.cores": "1"})
        executors = wait_executors(spark, 2)
        rss = ClusterRss([p.pid for p in cluster.processes])
        spark.read.parquet(str(base)).limit(1).collect()  # the executors' JVMs and Python workers started

        def timed(name: str, baseline: str | None, call) -> dict:
            os.sync()
            with rss:
                t0 = time.perf_counter()
                result = call()
                wall = time.perf_counter() - t0
                t1 = time.perf_counter()
                flush_idle()  # the key index's update after a commit, counted as the operation's
                settle = time.perf_counter() - t1
            op = {"operation": name, "baseline": baseline, "wall_s": wall, "settle_s": settle,
                  "peak_rss": dict(rss.peaks), "result": result}
            core.log(f"{name}: {wall:.1f} s (+{settle:.1f} s after), peak RSS "
                     + ", ".join(f"{k} {v / 2**20:,.0f} MB" for k, v in rss.peaks.items()))
            ops.append(op)
            return op

        def plain(path: Path) -> dict:
            out = work / "plain"
            spark.read.parquet(str(path)).write.mode("overwrite").parquet(str(out))
            written = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
            shutil.rmtree(out, ignore_errors=True)
            return {"bytes_written": written}

        schema = pq.read_schema(base)
        table = bitlake.create_table(str(work / "table"), schema, primary_key=core.PRIMARY_KEY,
                                     delta_column=core.DELTA, num_buckets=16)
        timed("plain Spark writes the base", None, lambda: plain(base))
        timed("load: ingest(spark.read.parquet(base))", "plain Spark writes the base",
              lambda: table.ingest(spark.read.parquet(str(base))).counts)
        timed("plain Spark writes the 10 % batch", None, lambda: plain(batches[0][0]))
        timed("10 % upsert, Spark MetaGen: ingest(df, inline=False)", "plain Spark writes the 10 % batch",
              lambda: table.ingest(spark.read.parquet(str(batches[0][0])), inline=False).counts)
        timed("10 % upsert, default MetaGen (inline): ingest(df)", "plain Spark writes the 10 % batch",
              lambda: table.ingest(spark.read.parquet(str(batches[1][0]))).counts)
        base_rows = pq.ParquetFile(base).metadata.num_rows
        expected = base_rows + sum(c["inserts"] for _, c in batches)
        rows = table.to_spark(spark).count()
        if rows != expected:
            raise AssertionError(f"the table holds {rows:,} rows, not the {expected:,} the batches make")
        spark.stop()
    finally:
        cluster.stop()
    shutil.rmtree(work, ignore_errors=True)
    return {"scale_factor": sf, "rows": base_rows, "ops": ops, "executors": executors,
            "worker_memory": worker_memory, "executor_memory": executor_memory,
            "batches": [c for _, c in batches]}


def markdown(r: dict) -> str:
    run = r["run"]
    lines = [HEADING, "",
             f"Command: `{run['command']}`, {run['date']}; bitlake at commit {run['code']['git_head']}"
             f"{' (bitlake/ modified)' if run['code']['bitlake_dirty'] else ''}. A standalone master and two workers "
             f"(`spark-class`, one core and {r['worker_memory']} each; executors of {r['executor_memory']}) on this "
             f"machine ({run['machine']['cores']} cores, {run['machine']['memory_gib']} GiB), the driver in this "
             f"process; {r['executors']} executors registered. TPC-H `lineitem` SF {core.sf_text(r['scale_factor'])} "
             f"({r['rows']:,} rows), 16 buckets; the 10 % batches of the peers benchmark (95 % updates of random keys, "
             "the rest new keys). Times include the key index's update after the commit, (+x after); peak RSS is "
             "sampled every 0.25 s. The operations ran in the order listed, the first on executors that had run one "
             "small job (their JIT still warming up counts against it). Load average (1 min) "
             f"{run['load_average_start']:.1f} at the start, {run['load_average_end']:.1f} at the end.", "",
             "| operation | wall s | against plain Spark | peak RSS, driver | peak RSS, executors |",
             "| --- | --- | --- | --- | --- |"]
    by_name = {o["operation"]: o for o in r["ops"]}
    for o in r["ops"]:
        base = by_name.get(o["baseline"]) if o["baseline"] else None
        total = o["wall_s"] + o["settle_s"]
        ratio = f"{total / base['wall_s']:.2f}x" if base else "(baseline)"
        execs = ", ".join(f"{v / 2**20:,.0f} MB" for k, v in sorted(o["peak_rss"].items()) if k != "driver")
        lines.append(f"| {o['operation']} | {o['wall_s']:.1f} (+{o['settle_s']:.1f} after) | {ratio} | "
                     f"{o['peak_rss'].get('driver', 0) / 2**20:,.0f} MB | {execs or '-'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale-factor", type=float, default=10.0)
    p.add_argument("--worker-memory", default="6g")
    p.add_argument("--executor-memory", default="5g")
    p.add_argument("--no-doc", action="store_true", help="do not touch docs/benchmarks.md")
    args = p.parse_args()
    start = dt.datetime.now(dt.UTC)
    load_start = os.getloadavg()[0]
    result = run(args.scale_factor, args.worker_memory, args.executor_memory)
    result["run"] = {"command": ".venv/bin/python benchmarks/cluster.py " + " ".join(sys.argv[1:]),
                     "date": start.strftime("%Y-%m-%d %H:%M UTC"), "machine": core.machine(),
                     "code": core.code_version(), "load_average_start": load_start,
                     "load_average_end": os.getloadavg()[0]}
    stem = f"cluster-{start:%Y-%m-%d}-sf{core.sf_text(args.scale_factor)}"
    core.save_results(result, stem, markdown, HEADING, args.no_doc)


if __name__ == "__main__":
    main()
