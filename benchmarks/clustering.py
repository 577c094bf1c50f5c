"""The clustering benchmark: the erasure of 1,000 suppliers' rows (``l_suppkey`` 1..1000) from TPC-H ``lineitem``,
on a table as loaded and after a compaction clustered by ``l_suppkey``, against delta-rs's ``delete`` of the same
rows on a Delta table as written and after ``optimize.z_order(["l_suppkey"])``.

The run (every figure against a baseline measured in the same run):

1. the base (``benchmarks/peers.py``'s base file, read a row group at a time) loaded into a bitlake table (16
   buckets) and written as a Delta table by delta-rs; each copied once (synced to disk first);
2. bitlake, on the table as loaded: ``tombstone("l_suppkey", 1..1000)`` then ``vacuum()``: wall time, files read
   and rewritten of those considered, bytes written;
3. bitlake, on the copy: ``compact(cluster_by="l_suppkey", major=True, look_back=<its version>)`` (the retention
   window starts at the compaction, so the vacuum need not rewrite the files it replaced), then the same erasure;
4. delta-rs: ``delete("l_suppkey IN (1..1000)")`` on the table as written; on the copy ``optimize.z_order`` then
   the same ``delete``.

Bytes written are every byte added under the table's folder (a walk before and after; bitlake's key index, a
local cache, left out). Results: ``benchmarks/results/clustering-<date>-sf<sf>.json`` and the section "## Clustering:
erasure after a compaction by a column" of docs/benchmarks.md.

    .venv/bin/python benchmarks/clustering.py --scale-factor 1     # what `make bench-clustering` runs
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core  # noqa: E402
import peers  # noqa: E402
from core import DELTA, PRIMARY_KEY, log, mb, sf_text  # noqa: E402

import bitlake  # noqa: E402
from bitlake.engine.keys.indexsession import flush_idle  # noqa: E402

SECTION = "## Clustering: erasure after a compaction by a column"
SUPPLIERS = list(range(1, 1001))


def measure(path: Path, fn) -> dict:
    """``fn()``'s wall time (the key index's work after a commit included) and the bytes it wrote under ``path``."""
    before = core.snapshot(path)
    t0 = time.perf_counter()
    out = fn()
    flush_idle()
    seconds = time.perf_counter() - t0
    total, by_cat, files = core.written_between(before, core.snapshot(path))
    total -= by_cat.pop("index", 0)
    return {"seconds": seconds, "bytes": total, "files": files, "result": repr(out)}


def copy(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst)
    os.sync()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale-factor", type=float, default=1.0)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    sf = args.scale_factor
    import deltalake

    work = core.fresh_work(f"clustering-sf{sf_text(sf)}")
    result: dict = {"scale_factor": sf, "date": dt.date.today().isoformat(), "machine": core.machine(),
                    "suppliers": len(SUPPLIERS), "code": core.code_version()}
    base = work / "base.parquet"
    peers.write_base(core.lineitem(sf), base)
    schema = pq.read_schema(base)
    result["rows"] = pq.ParquetFile(base).metadata.num_rows

    plain = work / "bitlake"
    t = bitlake.create_table(str(plain), schema, primary_key=PRIMARY_KEY, delta_column=DELTA, num_buckets=16)
    t.ingest(peers.file_stream(base))
    flush_idle()
    delta_plain = work / "delta"
    deltalake.write_deltalake(str(delta_plain), peers.file_stream(base))
    copy(plain, work / "bitlake-clustered")
    copy(delta_plain, work / "delta-zordered")

    def erase(path: Path) -> dict:
        table = bitlake.open_table(str(path))
        tomb = measure(path, lambda: table.tombstone("l_suppkey", SUPPLIERS))
        vac = measure(path, table.vacuum)
        return {"seconds": tomb["seconds"] + vac["seconds"], "bytes": tomb["bytes"] + vac["bytes"],
                "tombstone": tomb, "vacuum": vac}

    condition = f"l_suppkey IN ({', '.join(map(str, SUPPLIERS))})"
    result["bitlake"] = {"erase": erase(plain)}
    log(f"bitlake erase as loaded: {result['bitlake']['erase']}")
    clustered = bitlake.open_table(str(work / "bitlake-clustered"))
    result["bitlake"]["compact"] = measure(work / "bitlake-clustered", lambda: clustered.compact(
        cluster_by="l_suppkey", major=True, look_back=clustered.version))
    log(f"bitlake compact(cluster_by): {result['bitlake']['compact']}")
    result["bitlake"]["erase_clustered"] = erase(work / "bitlake-clustered")
    log(f"bitlake erase clustered: {result['bitlake']['erase_clustered']}")

    result["delta_rs"] = {"erase": measure(delta_plain, lambda: deltalake.DeltaTable(str(delta_plain)).delete(
        condition))}
    log(f"delta-rs delete as written: {result['delta_rs']['erase']}")
    zordered = work / "delta-zordered"
    result["delta_rs"]["compact"] = measure(zordered, lambda: deltalake.DeltaTable(str(zordered)).optimize.z_order(
        ["l_suppkey"]))
    log(f"delta-rs z_order: {result['delta_rs']['compact']}")
    result["delta_rs"]["erase_clustered"] = measure(zordered, lambda: deltalake.DeltaTable(str(zordered)).delete(
        condition))
    log(f"delta-rs delete z-ordered: {result['delta_rs']['erase_clustered']}")
    core.save_results(result, f"clustering-{result['date']}-sf{sf_text(sf)}", markdown,
                      core.heading(sf_text(sf), SECTION), args.no_doc)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def markdown(r: dict) -> str:
    b, d = r["bitlake"], r["delta_rs"]
    sf = sf_text(r["scale_factor"])

    def cell(m: dict) -> str:
        return f"{m['seconds']:.2f} s, {mb(m['bytes'])}"

    def vacuum(m: dict) -> str:
        res = m["vacuum"]["result"]
        read = res.split("files_read=")[1].split(",")[0]
        considered = res.split("files_considered=")[1].split(",")[0]
        return f"{cell(m)} ({read} of {considered} files read; the tombstone {m['tombstone']['seconds']:.2f} s)"

    ratio = d["erase_clustered"]["seconds"] / b["erase_clustered"]["seconds"]
    return "\n".join([
        core.heading(sf, SECTION), "",
        f"TPC-H `lineitem` at SF {sf} ({r['rows']:,} rows), the rows of {r['suppliers']:,} suppliers (`l_suppkey` "
        f"1..{r['suppliers']}) erased, {r['date']}: `.venv/bin/python benchmarks/clustering.py --scale-factor {sf}` "
        f"(`make bench-clustering SF={sf}`; the JSON: `{r.get('json_path', '')}`). bitlake: `tombstone` then "
        "`vacuum` (wall times summed; the files the vacuum read); after `compact(cluster_by=\"l_suppkey\", major=True, "
        "look_back=<version>)`. delta-rs: `delete` of the same rows; after `optimize.z_order"
        "([\"l_suppkey\"])`. Bytes: what the operation wrote under the table's folder.", "",
        "| | bitlake | delta-rs |",
        "| --- | --- | --- |",
        f"| erase, as loaded | {vacuum(b['erase'])} | {cell(d['erase'])} |",
        f"| compaction by `l_suppkey` (bitlake `compact(cluster_by=...)`, delta-rs `z_order`) | "
        f"{cell(b['compact'])} | {cell(d['compact'])} |",
        f"| erase, after that compaction | {vacuum(b['erase_clustered'])} | {cell(d['erase_clustered'])} |",
        "",
        f"After the compaction, delta-rs's erasure took {ratio:.2f}x bitlake's time. Machine: "
        f"{r['machine']['cores']} cores, {r['machine']['memory_gib']} GiB; bitlake at `{r['code']['git_head']}`.", "",
    ])


if __name__ == "__main__":
    sys.exit(main())
