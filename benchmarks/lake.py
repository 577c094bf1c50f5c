"""The lake benchmark: bitlake on an S3 API against local disk and against delta-rs on the same store, the
Spark Python Data Source against the JVM reader, and the Arrow-native reads against pyarrow and DuckDB.

TPC-H ``lineitem`` after the peers workload (the base, then change batches of 0.1 %, 1 % and 10 %, 95 % updates
of random keys: ``benchmarks/core.py``'s batches), on the same machine, every figure against a baseline of the
same run:

1. the S3 store is moto's server on loopback (a single Python process keeping objects in memory: slower than
   a real S3, so the ratios are an upper bound of what S3 costs over local disk). The base and the 0.1 %
   batch ingested into a table on it and into one on local disk (driver path, inline MetaGen), and the full
   current-view read with ``to_arrow()``; delta-rs writes the same base to the same store, merges the same
   0.1 % batch and reads the table back (its own S3 client);
2. writing one data file through bitlake's storage interface (obstore) against pyarrow's own S3 filesystem;
3. the full aggregate of the current view (after the workload) through ``spark.read.format("bitlake")``
   against ``t.to_spark()`` (the JVM Parquet reader with the anti-join of superseded rows), local files;
4. ``t.to_batches()`` consumed batch by batch against pyarrow's dataset scanner over the same data files
   (superseded rows included: the plain files), and ``t.to_arrow()``; each in its own process, for its peak
   RSS;
5. a DuckDB aggregate over ``t.view()`` against DuckDB's own ``read_parquet`` of the same data files.

Results: ``benchmarks/results/lake-<date>-sf<sf>.json`` and the section "## The lake: object storage, the
data source, Arrow reads" of docs/benchmarks.md.

    .venv/bin/python benchmarks/lake.py --scale-factor 1     # what `make bench-lake` runs
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import core  # noqa: E402
from core import DELTA, OP, PRIMARY_KEY, log, mb, sf_text  # noqa: E402

import bitlake  # noqa: E402

SECTION = "## The lake: object storage, the data source, Arrow reads"
DATA_SOURCE_TARGET = 0.7
BATCHES_TARGET = 0.8
RSS_TARGET_BYTES = 1.5 * (1 << 30)


def timed(fn, runs: int = 1) -> tuple[float, object]:
    """The median wall time of ``runs`` calls, and the last call's result."""
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def child(mode: str, path: str) -> None:
    """Runs one scan in this (fresh) process and prints its wall time and peak RSS as JSON."""
    t0 = time.perf_counter()
    rows = 0
    if mode == "to_batches":
        for b in bitlake.open_table(path).to_batches():
            rows += b.num_rows
    elif mode == "to_arrow":
        rows = bitlake.open_table(path).to_arrow().num_rows
    elif mode == "pyarrow":
        t = bitlake.open_table(path)
        files = [f"{path}/{f.path}" for f in t.state().data_files()]
        for b in ds.dataset(files, format="parquet").to_batches(columns=t.metadata.column_names):
            rows += b.num_rows
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "rows": rows, "peak_rss": peak_rss()}))


def peak_rss() -> int:
    """This process's peak resident set in bytes: VmHWM (getrusage's ru_maxrss survives exec on Linux, so a
    child started by a large parent would report the parent's peak)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def in_child(mode: str, path: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", mode, path], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale-factor", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    from tests.s3server import start_s3_server

    sf = args.scale_factor
    work = core.fresh_work(f"lake-sf{sf_text(sf)}")
    result: dict = {"scale_factor": sf, "date": dt.date.today().isoformat(), "machine": core.machine()}
    base = core.load_base(core.lineitem(sf))
    maker = core.ChangeMaker(base, args.seed)
    batches = [maker.make(k, fraction)[0] for k, (_, fraction) in enumerate(core.BATCHES, start=1)]
    server = start_s3_server()
    try:
        result["s3"] = s3_section(work, base, batches[0], server, args.runs)
        result["write_file"] = write_file_section(base, server)
    finally:
        server.stop()

    # 3-5 on the local table after the whole workload.
    path = str(work / "local")
    t = bitlake.open_table(path)
    for k, batch in enumerate(batches[1:], start=2):
        t.ingest(batch, op_column=OP, batch_id=f"b{k}")
    spark = bitlake.spark_session("local[2]", app_name="bitlake-bench-lake")
    result["data_source"] = data_source_section(spark, t, base.schema, args.runs)
    spark.stop()
    result["arrow"] = arrow_section(path, args.runs)
    result["duckdb"] = duckdb_section(t, args.runs)

    core.save_results(result, f"lake-{result['date']}-sf{sf_text(sf)}", markdown, SECTION, args.no_doc)
    return 0


def s3_section(work: Path, base: pa.Table, batch: pa.Table, server, runs: int) -> dict:
    import deltalake

    out: dict = {}
    for where, path in (("local", str(work / "local")), ("s3", server.uri("lake"))):
        t = bitlake.create_table(path, base.schema, primary_key=PRIMARY_KEY, delta_column=DELTA, num_buckets=16)
        load, _ = timed(lambda t=t: t.ingest(base, batch_id="base"))
        small, _ = timed(lambda t=t: t.ingest(batch, op_column=OP, batch_id="b1"))
        scan, table = timed(lambda t=t: t.to_arrow(), runs)
        out[where] = {"load_s": load, "batch_s": small, "scan_s": scan, "rows": table.num_rows}
        log(f"bitlake on {where}: load {load:.1f} s, 0.1 % batch {small:.2f} s, scan {scan:.2f} s")
    uri = server.uri("delta")
    options = server.options | {"AWS_S3_ALLOW_UNSAFE_RENAME": "true"}
    load, _ = timed(lambda: deltalake.write_deltalake(uri, base, storage_options=options))
    dt_table = deltalake.DeltaTable(uri, storage_options=options)
    upserts = batch.filter(pa.compute.equal(batch.column(OP), "upsert")).drop_columns([OP])
    condition = " and ".join(f"t.{k} = s.{k}" for k in PRIMARY_KEY)

    def merge():
        (dt_table.merge(upserts, condition, source_alias="s", target_alias="t")
         .when_matched_update_all().when_not_matched_insert_all().execute())
    small, _ = timed(merge)
    scan, table = timed(lambda: deltalake.DeltaTable(uri, storage_options=options).to_pyarrow_table(), runs)
    out["delta_rs_s3"] = {"load_s": load, "batch_s": small, "scan_s": scan, "rows": table.num_rows}
    log(f"delta-rs on s3: load {load:.1f} s, 0.1 % merge {small:.2f} s, scan {scan:.2f} s")
    return out


def write_file_section(base: pa.Table, server) -> dict:
    """One data file (the base's first 1M rows) through obstore and through pyarrow's S3 filesystem."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from bitlake.fs import file_io

    rows = base.slice(0, 1_000_000)
    io = file_io(server.uri("writes"))

    def through_obstore():
        with io.open_output("obstore.parquet") as out:
            pq.write_table(rows, out)

    fs = pafs.S3FileSystem(access_key=server.options["AWS_ACCESS_KEY_ID"],
                           secret_key=server.options["AWS_SECRET_ACCESS_KEY"], region="us-east-1",
                           endpoint_override=server.endpoint, scheme="http")
    target = io.uri("pyarrow.parquet").removeprefix("s3://")

    def through_pyarrow():
        with fs.open_output_stream(target) as out:
            pq.write_table(rows, out)
    obstore_s, _ = timed(through_obstore, 3)
    pyarrow_s, _ = timed(through_pyarrow, 3)
    log(f"one data file: obstore {obstore_s:.2f} s, pyarrow S3FileSystem {pyarrow_s:.2f} s")
    return {"rows": rows.num_rows, "bytes": io.size("obstore.parquet"), "obstore_s": obstore_s,
            "pyarrow_s3fs_s": pyarrow_s}


def data_source_section(spark, t, schema: pa.Schema, runs: int) -> dict:
    def run(df):
        return core.aggregate(df, pa.schema([schema.field(c) for c in t.metadata.column_names])).collect()

    jvm_df = t.to_spark(spark)
    ds_df = spark.read.format("bitlake").load(t.path)
    run(jvm_df), run(ds_df)  # warm-up
    jvm, ds_ = [], []
    for _ in range(runs):
        jvm.append(timed(lambda: run(jvm_df))[0])
        ds_.append(timed(lambda: run(ds_df))[0])
    out = {"jvm_s": statistics.median(jvm), "data_source_s": statistics.median(ds_)}
    out["ratio"] = out["jvm_s"] / out["data_source_s"]
    log(f"aggregate: JVM reader {out['jvm_s']:.2f} s, data source {out['data_source_s']:.2f} s")
    return out


def arrow_section(path: str, runs: int) -> dict:
    out = {}
    for mode in ("pyarrow", "to_batches", "to_arrow"):
        tries = [in_child(mode, path) for _ in range(runs)]
        out[mode] = sorted(tries, key=lambda r: r["seconds"])[len(tries) // 2]
        log(f"{mode}: {out[mode]['seconds']:.2f} s, {out[mode]['rows']:,} rows, peak RSS {mb(out[mode]['peak_rss'])}")
    out["ratio"] = out["pyarrow"]["seconds"] / out["to_batches"]["seconds"]
    return out


def duckdb_section(t, runs: int) -> dict:
    import duckdb

    files = [f"{t.path}/{f.path}" for f in t.state().data_files()]
    columns = ["l_returnflag", "l_quantity", "l_extendedprice"]
    query = f"SELECT {columns[0]}, count(*), sum({columns[1]}), sum({columns[2]}) FROM {{}} GROUP BY 1 ORDER BY 1"
    plain, _ = timed(lambda: duckdb.sql(query.format(f"read_parquet({files!r})")).fetchall(), runs)
    # DuckDB finds the view by its name among the calling frame's variables. It asks an Arrow stream for no
    # projection: the second view names the query's columns itself.
    def over(v):
        return duckdb.sql(query.format("v")).fetchall()

    full, narrow = t.view(), t.view(columns=columns)
    over_view, _ = timed(lambda: over(full), runs)
    projected, _ = timed(lambda: over(narrow), runs)
    log(f"DuckDB aggregate: read_parquet {plain:.2f} s, over t.view() {over_view:.2f} s, with its columns "
        f"{projected:.2f} s")
    return {"read_parquet_s": plain, "view_s": over_view, "ratio": plain / over_view,
            "view_columns_s": projected, "ratio_columns": plain / projected}


def markdown(r: dict) -> str:
    sf = sf_text(r["scale_factor"])
    s3, w, d, a, duck = r["s3"], r["write_file"], r["data_source"], r["arrow"], r["duckdb"]
    lines = [SECTION, "", f"TPC-H lineitem SF {sf}, {r['date']}; command: "
             f"`.venv/bin/python benchmarks/lake.py --scale-factor {sf}` (`make bench-lake`). The S3 store is "
             "moto's server on loopback (one Python process, objects in memory): its figures are an upper bound of "
             "what S3 costs over local disk.", "",
             "| | base load | 0.1 % batch | full read |", "| --- | --- | --- | --- |"]
    for name, key in (("bitlake, local disk", "local"), ("bitlake, S3 (moto)", "s3"),
                      ("delta-rs, S3 (moto)", "delta_rs_s3")):
        m = s3[key]
        lines.append(f"| {name} | {m['load_s']:.1f} s | {m['batch_s']:.2f} s | {m['scan_s']:.2f} s |")
    lines += ["", f"- S3 against local disk: the 0.1 % batch {s3['s3']['batch_s'] / s3['local']['batch_s']:.2f}x, "
              f"the full read {s3['s3']['scan_s'] / s3['local']['scan_s']:.2f}x; against delta-rs on the same store: "
              f"the batch {s3['delta_rs_s3']['batch_s'] / s3['s3']['batch_s']:.1f}x faster, the read "
              f"{s3['s3']['scan_s'] / s3['delta_rs_s3']['scan_s']:.2f}x delta-rs's time.",
              f"- One data file ({w['rows']:,} rows, {mb(w['bytes'])}) to the store: through bitlake's storage "
              f"interface (obstore, multipart) {w['obstore_s']:.2f} s, through pyarrow's S3FileSystem "
              f"{w['pyarrow_s3fs_s']:.2f} s.",
              f"- Full aggregate of the current view after the workload: `spark.read.format(\"bitlake\")` "
              f"{d['data_source_s']:.2f} s against `t.to_spark()` (JVM Parquet reader) {d['jvm_s']:.2f} s: "
              f"**{d['ratio']:.2f}** of the JVM path's speed (target {DATA_SOURCE_TARGET}).",
              f"- `to_batches()` full scan {a['to_batches']['seconds']:.2f} s, peak RSS "
              f"{mb(a['to_batches']['peak_rss'])}, against pyarrow's scanner over the same data files "
              f"{a['pyarrow']['seconds']:.2f} s ({mb(a['pyarrow']['peak_rss'])}): **{a['ratio']:.2f}** of pyarrow's "
              f"speed (target {BATCHES_TARGET}); `to_arrow()` of the whole view {a['to_arrow']['seconds']:.2f} s, "
              f"{mb(a['to_arrow']['peak_rss'])}. Peak RSS target 1.5 GiB ({mb(int(RSS_TARGET_BYTES))}); a local "
              "table's files are memory-mapped, so the pages read count in the RSS.",
              f"- DuckDB `GROUP BY` over `t.view()` {duck['view_s']:.2f} s against DuckDB's `read_parquet` of the "
              f"same files {duck['read_parquet_s']:.2f} s: **{duck['ratio']:.2f}** of its speed; over "
              f"`t.view(columns=<the query's three>)` {duck['view_columns_s']:.2f} s: **{duck['ratio_columns']:.2f}** "
              "(DuckDB pushes no projection into an Arrow stream; `read_parquet` also reads in parallel).",
              "", f"Raw results: `{r['json_path']}`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
