"""The PostgreSQL mirror's benchmark: pgbench beside the mirror, a backlog's catch-up, the initial snapshot.

On a throwaway PostgreSQL (``wal_level=logical``, wal2json) with pgbench's tables at ``--scale`` (100: 10 M
accounts), every figure against a baseline of the same run:

1. **Initial snapshot** of ``pgbench_accounts``: the mirror's exported-snapshot COPY into a new table, against
   dumping the same table to Parquet (COPY to CSV, parsed by pyarrow, written as one Parquet file: what a
   ``pg_dump``-to-Parquet job does without the lake's metadata).
2. **Keeping up**: pgbench with 4 clients for ``--seconds`` alone (its full rate), then again with the mirror
   running beside it (1 s micro-batches): pgbench's rate, the changes the mirror applied per second, and the
   end-to-end lag: a sampler notes ``pg_current_wal_lsn()`` and the time every 100 ms; a position is visible
   when the mirror's commit that covers it lands; p50 and p99 of the differences.
3. **Catch-up**: with the mirror stopped, ``--backlog`` changes (updates of that many accounts, 100,000 per
   transaction), then the mirror started: changes applied per second until caught up; against Spark reading
   the same changes from a Parquet file and against a delta-rs ``merge`` of them into a Delta table of the
   accounts, each in this run.

Results: ``benchmarks/results/mirror-<date>.json`` and the section "## The PostgreSQL mirror" of
docs/benchmarks.md.

    .venv/bin/python benchmarks/mirror.py --scale 100     # what `make bench-mirror` runs
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core  # noqa: E402
from core import log  # noqa: E402

import bitlake  # noqa: E402
from bitlake.mirror import PostgresMirror, lsn_int  # noqa: E402
from bitlake.triggers.pgserver import PostgresServer  # noqa: E402

SECTION = "## The PostgreSQL mirror"


def pgbench(server, *args) -> str:
    out = subprocess.run([str(server.bin / "pgbench"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "bitlake",
                          *args, "postgres"], check=True, capture_output=True, text=True)
    return out.stdout + out.stderr


def tps(output: str) -> float:
    line = next(x for x in output.splitlines() if x.startswith("tps = "))
    return float(line.split()[2])


def current_lsn(conn) -> int:
    return lsn_int(conn.execute("SELECT pg_current_wal_lsn()::text").fetchall()[0][0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=100)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--backlog", type=int, default=1_000_000)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    work = core.fresh_work("mirror")
    result: dict = {"scale": args.scale, "date": dt.date.today().isoformat(), "machine": core.machine()}
    server = PostgresServer({"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4",
                             "shared_buffers": "1GB", "max_wal_size": "8GB"}).start()
    try:
        log(f"pgbench -i -s {args.scale}")
        pgbench(server, "-i", "-s", str(args.scale), "-q")
        result["snapshot"] = snapshot_section(server, work)
        result["keep_up"] = keep_up_section(server, work, args.seconds)
        result["catch_up"] = catch_up_section(server, work, args.backlog)
    finally:
        server.stop()
    core.save_results(result, f"mirror-{result['date']}", markdown, SECTION, args.no_doc)
    return 0


def snapshot_section(server, work: Path) -> dict:
    t0 = time.perf_counter()
    m = PostgresMirror(server.dsn(), "public.pgbench_accounts", str(work / "accounts"))
    m.snapshot()
    mirror_s = time.perf_counter() - t0
    rows = m.table.to_arrow(columns=["aid"]).num_rows
    m.close()
    t0 = time.perf_counter()
    with server.connect() as conn:
        buf = bytearray()
        with conn.cursor().copy("COPY pgbench_accounts TO STDOUT WITH (FORMAT csv)") as copy:
            for chunk in copy:
                buf += chunk
    table = pacsv.read_csv(pa.BufferReader(bytes(buf)), read_options=pacsv.ReadOptions(
        column_names=["aid", "bid", "abalance", "filler"]), convert_options=pacsv.ConvertOptions(
        column_types={"aid": pa.int32(), "bid": pa.int32(), "abalance": pa.int32(), "filler": pa.string()}))
    pq.write_table(table, work / "dump.parquet")
    dump_s = time.perf_counter() - t0
    log(f"snapshot: mirror {mirror_s:.1f} s, dump to Parquet {dump_s:.1f} s, {rows:,} rows")
    return {"rows": rows, "mirror_s": mirror_s, "dump_parquet_s": dump_s}


class Sampler(threading.Thread):
    """Notes (time, current WAL position) every 100 ms."""

    def __init__(self, server):
        super().__init__(daemon=True)
        self.conn = server.connect()
        self.samples: list[tuple[float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.time(), current_lsn(self.conn)))
            time.sleep(0.1)


def keep_up_section(server, work: Path, seconds: int) -> dict:
    alone = tps(pgbench(server, "-c", "4", "-j", "2", "-T", str(seconds)))
    log(f"pgbench alone: {alone:.0f} tps")
    commits: list[tuple[float, int, int]] = []  # (time, end LSN, changes)
    m = PostgresMirror(server.dsn(), "public.pgbench_accounts", str(work / "accounts"),
                       progress=lambda p: commits.append((time.time(), p.lsn, p.changes)))
    m.run(until_caught_up=True, interval=0.1)  # the load before (pgbench alone) is not this measure's
    commits.clear()
    stop = threading.Event()
    runner = threading.Thread(target=lambda: m.run(interval=1.0, stop=stop), daemon=True)
    runner.start()
    sampler = Sampler(server)
    sampler.start()
    started = time.time()
    beside = tps(pgbench(server, "-c", "4", "-j", "2", "-T", str(seconds)))
    ended = time.time()
    time.sleep(5)  # the mirror catches up with the end of the load
    sampler.stop.set()
    sampler.join()
    stop.set()
    runner.join(timeout=60)
    m.close()
    applied = sum(c for t, _, c in commits if started <= t <= ended + 5)
    lags = []
    for when, lsn in sampler.samples:
        if not started <= when <= ended:
            continue
        visible = next((t for t, end, _ in commits if end >= lsn and t >= when), None)
        if visible is not None:
            lags.append(visible - when)
    lags.sort()
    # Changes made during the load and applied by 5 s after it, over the load's duration.
    out = {"pgbench_alone_tps": alone, "pgbench_beside_tps": beside, "changes_applied": applied,
           "changes_per_s": applied / (ended - started), "lag_p50_s": statistics.median(lags),
           "lag_p99_s": lags[int(len(lags) * 0.99) - 1], "lag_samples": len(lags)}
    log(f"beside the mirror: {beside:.0f} tps; lag p50 {out['lag_p50_s']:.2f} s, p99 {out['lag_p99_s']:.2f} s")
    return out


def catch_up_section(server, work: Path, backlog: int) -> dict:
    with server.connect() as conn:
        accounts = conn.execute("SELECT count(*) FROM pgbench_accounts").fetchall()[0][0]
        n = min(backlog, accounts)
        for lo in range(1, n + 1, 100_000):
            conn.execute("UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid BETWEEN %s AND %s",
                         (lo, min(lo + 99_999, n)))
    m = PostgresMirror(server.dsn(), "public.pgbench_accounts", str(work / "accounts"), batch_changes=200_000)
    t0 = time.perf_counter()
    applied = 0
    while True:
        p = m.step()
        applied += p.changes
        if p.changes == 0:
            break
    mirror_s = time.perf_counter() - t0
    changes = m.table.to_arrow(columns=["aid", "bid", "abalance", "filler"], filter=pa.compute.field("aid") <= n)
    m.close()
    pq.write_table(changes, work / "changes.parquet")
    spark = bitlake.spark_session("local[2]", app_name="bitlake-bench-mirror")
    read = spark.read.parquet(str(work / "changes.parquet")).selectExpr("sum(abalance)", "count(*)")
    read.collect()  # warm-up: the JVM's first job
    t0 = time.perf_counter()
    read.collect()
    spark_s = time.perf_counter() - t0
    spark.stop()
    import deltalake

    dump = pq.read_table(work / "dump.parquet")
    deltalake.write_deltalake(str(work / "delta"), dump)
    t0 = time.perf_counter()
    (deltalake.DeltaTable(str(work / "delta")).merge(changes, "t.aid = s.aid", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())
    delta_s = time.perf_counter() - t0
    log(f"catch-up of {applied:,} changes: mirror {mirror_s:.1f} s, Spark reading them {spark_s:.1f} s, "
        f"delta-rs merge {delta_s:.1f} s")
    return {"changes": applied, "mirror_s": mirror_s, "changes_per_s": applied / mirror_s,
            "spark_read_parquet_s": spark_s, "delta_rs_merge_s": delta_s}


def markdown(r: dict) -> str:
    s, k, c = r["snapshot"], r["keep_up"], r["catch_up"]
    return "\n".join([
        SECTION, "",
        f"pgbench scale {r['scale']} ({s['rows']:,} accounts), {r['date']}; command: `.venv/bin/python "
        f"benchmarks/mirror.py --scale {r['scale']}` (`make bench-mirror`). PostgreSQL 15 on the same 2 cores.", "",
        f"- Initial snapshot: the mirror (exported snapshot, COPY into pyarrow, a bitlake ingest with its key store) "
        f"{s['mirror_s']:.1f} s against a dump of the same table to one Parquet file {s['dump_parquet_s']:.1f} s: "
        f"**{s['mirror_s'] / s['dump_parquet_s']:.2f}x**.",
        f"- pgbench with 4 clients: {k['pgbench_alone_tps']:,.0f} tps alone, {k['pgbench_beside_tps']:,.0f} tps "
        f"with the mirror beside it (1 s micro-batches), which applied {k['changes_applied']:,} changes, "
        f"{k['changes_per_s']:,.0f}/s of the load's duration; commit-to-visible lag p50 "
        f"**{k['lag_p50_s']:.2f} s**, p99 **{k['lag_p99_s']:.2f} s** (target p99 < 5 s; {k['lag_samples']} samples).",
        f"- Catch-up after a backlog of {c['changes']:,} changes: **{c['changes_per_s']:,.0f} changes/s** "
        f"({c['mirror_s']:.1f} s); Spark reading the same changes from a Parquet file "
        f"{c['spark_read_parquet_s']:.2f} s; "
        f"a delta-rs merge of them into a Delta table of the accounts {c['delta_rs_merge_s']:.1f} s.",
        "", f"Raw results: `{r['json_path']}`.", ""])


if __name__ == "__main__":
    sys.exit(main())
