"""The maintenance benchmark: the current view's scan and the storage over a churning table, with and without
compaction, against plain Spark over the same live rows written as fresh Parquet.

Workload (the peers benchmark's, on the core benchmark's TPC-H ``lineitem`` table, ``benchmarks/core.py``): the
base, change batches of 0.1 %, 1 % and 10 % (95 % updates, 0.1 % deletes, the rest new keys), then
``--small-batches`` (200) batches of 0.01 %. Three copies of the table take the same batches, on the driver
path: **kept** never compacts; **auto** has ``maintain.auto=true`` (a bounded compaction after each commit);
**upkept** runs ``t.maintain(min_age_seconds=0)`` after every batch, with a window of two minutes
(``compact.look_back=120s``, ``maintain.major_interval=60s``). Every ``--every`` batches the current views
are scanned (a full aggregate over every column) and their stored bytes counted, for the plot. At the end:

1. plain: the live rows written as fresh Parquet by Spark, scanned with the same aggregate, and with the
   peers' selective filter (one month of ``l_shipdate``);
2. kept: scanned (full and selective), a past version's view and a change range timed; then ``t.compact()``
   of kept (wall and bytes written, against Spark reading and rewriting the same files as Parquet), and the
   scans, the past view and the change range again;
3. ``t.maintain()`` of the compacted table once nothing is due (it reads metrics, not data);
4. ``t.compact(major=True, look_back="0s")`` and ``t.cleanup(min_age_seconds=0)`` of kept: the scans and the
   stored bytes again.

Each scan is one warm-up then ``--runs`` interleaved runs, medians. Results: ``benchmarks/results/
maintenance-<date>-sf<sf>.json``, the section "## Maintenance: compaction and upkeep, SF <sf>" of
docs/benchmarks.md and the plot ``docs/img/maintenance-sf<sf>.png``.

    .venv/bin/python benchmarks/maintenance.py --scale-factor 1      # what `make bench-maintenance` runs
    .venv/bin/python benchmarks/maintenance.py --scale-factor 3      # `make bench-maintenance SF=3`
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core  # noqa: E402
from core import DELTA, OP, PRIMARY_KEY, ROOT, log, sf_text  # noqa: E402

import bitlake  # noqa: E402
from bitlake.format import layout  # noqa: E402

SECTION = "## Maintenance: compaction and upkeep"
PEER_FRACTIONS = (0.001, 0.01, 0.1)
SELECTIVE = ("1995-03-01", "1995-04-01")  # the peers benchmark's month of l_shipdate


def stored_bytes(path: str) -> int:
    """Every file under the table path, the key index excluded (it is a local cache, not the table)."""
    total = 0
    for folder, _, names in os.walk(path):
        if f"{os.sep}{layout.INDEX_DIR.replace('/', os.sep)}" in folder + os.sep:
            continue
        total += sum(os.path.getsize(os.path.join(folder, n)) for n in names)
    return total


def selective(df):
    from pyspark.sql import functions as F

    return df.filter((F.col("l_shipdate") >= F.lit(SELECTIVE[0]).cast("date"))
                     & (F.col("l_shipdate") < F.lit(SELECTIVE[1]).cast("date")))


def timed_runs(fns: dict, runs: int) -> dict[str, float]:
    """One warm-up each, then ``runs`` rounds with the order rotating; the median seconds of each."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for i in range(runs):
        for name in names[i % len(names):] + names[:i % len(names)]:
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale-factor", type=float, default=1.0)
    ap.add_argument("--small-batches", type=int, default=200)
    ap.add_argument("--every", type=int, default=25, help="scan both tables every this many small batches")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args(argv)
    sf = args.scale_factor
    work = core.fresh_work(f"maintenance-sf{sf_text(sf)}")
    spark = bitlake.spark_session("local[2]", app_name="bitlake-bench-maintenance")

    base = core.load_base(core.lineitem(sf))
    schema = base.schema
    maker = core.ChangeMaker(base, args.seed)
    kept = bitlake.create_table(str(work / "kept"), schema, primary_key=PRIMARY_KEY, delta_column=DELTA,
                                num_buckets=16)
    t0 = time.perf_counter()
    kept.ingest(base, batch_id="base")
    log(f"base loaded in {time.perf_counter() - t0:.1f} s")
    del base
    tables = {"kept": kept}
    for name, properties in (("auto", {"maintain.auto": "true"}),
                             ("upkept", {"compact.look_back": "120s", "maintain.major_interval": "60s"})):
        shutil.copytree(kept.io.local_path(""), work / name)
        tables[name] = bitlake.open_table(str(work / name))
        tables[name].set_properties(properties)
    upkept = tables["upkept"]

    def aggregate(t, **kw):
        return core.aggregate(t.to_spark(spark, **kw), schema).collect()[0]

    fractions = list(PEER_FRACTIONS) + [0.0001] * args.small_batches
    series: list[dict] = []
    upkeep_s: list[float] = []
    for k, fraction in enumerate(fractions, start=1):
        batch, _ = maker.make(k, fraction)
        for t in tables.values():
            t.ingest(batch, op_column=OP, batch_id=f"b{k}")
        t0 = time.perf_counter()
        upkept.maintain(min_age_seconds=0)
        upkeep_s.append(time.perf_counter() - t0)
        small = k - len(PEER_FRACTIONS)
        if small >= 0 and small % args.every == 0:
            point = {"small_batches": small}
            for name, t in tables.items():
                point[f"{name}_scan_s"] = timed_runs({name: lambda t=t: aggregate(t)}, 1)[name]
                point[f"{name}_bytes"] = stored_bytes(t.io.local_path(""))
            series.append(point)
            log(f"after {small} small batches: {point}")

    # Plain: the live rows as fresh Parquet, written by Spark.
    plain_dir = str(work / "plain")
    kept.to_spark(spark).write.parquet(plain_dir)
    plain_bytes = stored_bytes(plain_dir)
    from bitlake.spark.schema import spark_schema

    def plain_df():
        return spark.read.schema(spark_schema(schema)).parquet(plain_dir)

    def scans(t) -> dict[str, float]:
        return timed_runs({
            "plain": lambda: core.aggregate(plain_df(), schema).collect(),
            "bitlake": lambda: aggregate(t),
            "plain_selective": lambda: core.aggregate(selective(plain_df()), schema).collect(),
            "bitlake_selective": lambda: core.aggregate(selective(t.to_spark(spark)), schema).collect(),
        }, args.runs)

    past = len(PEER_FRACTIONS) + 1  # the version after the 1 % batch
    start = max(0, kept.version - 10)

    def history_reads(t) -> dict[str, float]:
        return timed_runs({
            "past_view": lambda: aggregate(t, version=past),
            "change_range": lambda: t.changes(spark, starting_version=start + 1).count(),
        }, args.runs)

    result: dict = {"scale_factor": sf, "small_batches": args.small_batches, "date": dt.date.today().isoformat(),
                    "series": series, "plain_bytes": plain_bytes,
                    "upkeep_s": {"median": statistics.median(upkeep_s), "max": max(upkeep_s),
                                 "total": sum(upkeep_s)}}
    result["kept_before"] = {**scans(kept), **history_reads(kept), "bytes": stored_bytes(kept.io.local_path("")),
                             "data_files": len(kept.state().data_files())}
    log(f"kept, before compaction: {result['kept_before']}")
    result["upkept"] = {**scans(upkept), "bytes": stored_bytes(upkept.io.local_path("")),
                        "data_files": len(upkept.state().data_files())}
    log(f"upkept: {result['upkept']}")
    result["auto"] = {**scans(tables["auto"]), "bytes": stored_bytes(tables["auto"].io.local_path("")),
                      "data_files": len(tables["auto"].state().data_files())}
    log(f"auto: {result['auto']}")

    state = kept.state()
    plan = kept.compact(dry_run=True)
    t0 = time.perf_counter()
    r = kept.compact()
    compact_s = time.perf_counter() - t0
    replaced = [kept.io.uri(f.path) for f in state.data_files() if f.path not in kept.state().files]
    t0 = time.perf_counter()
    spark.read.parquet(*replaced).write.parquet(str(work / "spark-rewrite"))
    spark_rewrite_s = time.perf_counter() - t0
    result["compaction"] = {"plan": plan, "seconds": compact_s, "spark_rewrite_s": spark_rewrite_s,
                            "bytes_removed": r.bytes_removed, "bytes_written": r.bytes_written,
                            "files_removed": r.removed_files, "files_added": r.added_files,
                            "current_rows": r.current_rows, "history_rows": r.history_rows}
    log(f"compaction: {result['compaction']}")
    result["kept_after"] = {**scans(kept), **history_reads(kept), "bytes": stored_bytes(kept.io.local_path("")),
                            "data_files": len(kept.state().data_files())}
    log(f"kept, after compaction: {result['kept_after']}")
    while kept.maintain().compaction is not None:  # size tiers may take another round
        pass
    t0 = time.perf_counter()
    kept.maintain()
    result["noop_upkeep_s"] = time.perf_counter() - t0

    # Major compaction with the window at the latest version, then the expiry of what only older versions read.
    t0 = time.perf_counter()
    m = kept.compact(major=True, look_back="0s")
    major_s = time.perf_counter() - t0
    expired = kept.cleanup(min_age_seconds=0)
    result["major"] = {**scans(kept), "seconds": major_s, "purged_rows": m.purged_rows,
                       "files_expired": len(expired), "bytes": stored_bytes(kept.io.local_path("")),
                       "data_files": len(kept.state().data_files())}
    log(f"after major compaction and cleanup: {result['major']}")
    spark.stop()

    core.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = core.RESULTS_DIR / f"maintenance-{result['date']}-sf{sf_text(sf)}.json"
    out.write_text(json.dumps(result, indent=1))
    if not args.no_doc:
        img = plot(result, ROOT / "docs" / "img" / f"maintenance-sf{sf_text(sf)}.png")
        core.write_doc(markdown(result, img), heading(sf))
    shutil.rmtree(work, ignore_errors=True)
    return 0


def heading(sf: float) -> str:
    return f"{SECTION}, SF {sf_text(sf)}"


def plot(result: dict, path: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [p["small_batches"] for p in result["series"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, label in (("kept", "no upkeep"), ("auto", "maintain.auto"), ("upkept", "maintain() after each batch")):
        a.plot(xs, [p[f"{name}_scan_s"] for p in result["series"]], marker="o", label=label)
        b.plot(xs, [p[f"{name}_bytes"] / 1e6 for p in result["series"]], marker="o", label=label)
    a.set(xlabel="0.01 % batches after the peers workload", ylabel="current-view scan (s)")
    b.set(xlabel="0.01 % batches after the peers workload", ylabel="stored MB (index excluded)")
    b.axhline(result["plain_bytes"] / 1e6, color="grey", linestyle="--", label="live rows as Parquet")
    a.legend()
    b.legend()
    fig.suptitle(f"TPC-H lineitem SF {sf_text(result['scale_factor'])}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return str(path.relative_to(ROOT / "docs"))


def markdown(r: dict, img: str) -> str:
    sf = sf_text(r["scale_factor"])
    b, u, a, c = r["kept_before"], r["upkept"], r["kept_after"], r["compaction"]

    def ratio(x: dict, scan: str) -> str:
        return f"{x['plain' + scan] / x['bitlake' + scan]:.2f}"

    m = r["major"]
    rows = [
        ("no upkeep", b), ("maintain.auto (bounded compaction after each commit)", r["auto"]),
        ("maintain() after each batch (2-minute window)", u), ("no upkeep, then one compact()", a),
        ("then compact(major=True, look_back='0s') and cleanup()", m),
    ]
    lines = [
        heading(r["scale_factor"]), "",
        f"`make bench-maintenance` (`.venv/bin/python benchmarks/maintenance.py --scale-factor {sf}`), {r['date']}: "
        f"TPC-H lineitem SF {sf}, the peers workload (base, 0.1 %, 1 %, 10 %) then {r['small_batches']} batches of "
        "0.01 %, on the driver path. Plain: Spark over the same live rows written as fresh Parquet, in the same run. "
        "Relative speed = plain time / bitlake time (1.0 = as fast as plain; median of interleaved runs).", "",
        "| table | full scan (s) | vs plain | selective scan (s) | vs plain | data files | stored MB |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, x in rows:
        lines.append(f"| {name} | {x['bitlake']:.2f} | {ratio(x, '')} | {x['bitlake_selective']:.2f} | "
                     f"{ratio(x, '_selective')} | {x['data_files']} | {x['bytes'] / 1e6:.0f} |")
    lines += [
        f"| plain (live rows) | {b['plain']:.2f} | 1.00 | {b['plain_selective']:.2f} | 1.00 | | "
        f"{r['plain_bytes'] / 1e6:.0f} |", "",
        f"- One `compact()` of the uncompacted table: {c['files_removed']} files ({c['bytes_removed'] / 1e6:.0f} MB) "
        f"into {c['files_added']} ({c['bytes_written'] / 1e6:.0f} MB: {c['bytes_written'] / c['bytes_removed']:.2f}x "
        f"the bytes replaced), {c['current_rows']} current and {c['history_rows']} superseded rows, "
        f"{c['seconds']:.1f} s; Spark reading and rewriting the same files as Parquet: {c['spark_rewrite_s']:.1f} s.",
        f"- Past view (version {len(PEER_FRACTIONS) + 1}) before / after that compaction: {b['past_view']:.2f} / "
        f"{a['past_view']:.2f} s; change feed of the last 10 versions: {b['change_range']:.2f} / "
        f"{a['change_range']:.2f} s.",
        f"- `maintain()` after each batch: median {r['upkeep_s']['median']:.2f} s, max "
        f"{r['upkeep_s']['max']:.2f} s, total {r['upkeep_s']['total']:.0f} s; `maintain()` on the compacted "
        f"table once nothing is due: {r['noop_upkeep_s']:.2f} s (target < 1 s at SF 3).",
        f"- Major compaction with the window at the latest version: {m['seconds']:.1f} s, {m['purged_rows']} rows "
        f"purged; `cleanup()` then expired {m['files_expired']} files: stored bytes (key index excluded) "
        f"{m['bytes'] / r['plain_bytes']:.2f}x the live rows as fresh Parquet (target <= 1.25).",
        "- Minor compaction keeps every row (time travel needs the superseded ones), so storage does not shrink "
        "until a major compaction and `cleanup()` release what no version inside the window reads.", "",
        f"![scan time and storage over the small batches]({img})", "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
