"""The restatement benchmark: revert and replace of a batch, a tombstone and its vacuum, and DML, on TPC-H
``lineitem`` after the peers workload, against the batches' own ingestion and against delta-rs and lance.

The run (every figure against a baseline measured in the same run):

1. the core benchmark's table (``benchmarks/core.py``): the base, then change batches of 0.1 %, 1 % and 10 %
   (95 % updates of random keys), each ingested on the driver path, its wall time and the bytes it wrote
   recorded, and the batch alone written as one Parquet file (its size: the batch as Parquet);
2. on a copy of that table each (synced to disk first; one path an operation, so that the runs after the first
   find its key-store files in this process's key cache): ``revert_batch`` of the 0.1 % and of the 1 % batch, and
   ``replace_batch`` of each with its records corrected (``l_quantity + 1`` again): wall time against the batch's
   own ingestion (in step 1, on the table whose key index the load left open) and against a new batch of the same
   size ingested on a copy the same way (the commit opens the copy's key index, as a restatement's does), bytes
   written against the batch as Parquet, data files rewritten (must be 0); ``--restate-only`` stops here;
3. ``delete`` and ``update`` (``l_quantity + 1``) of the rows with ``l_partkey <= N`` (0.1 % of the rows,
   spread over every file), by a pyarrow expression, against delta-rs ``delete`` / ``update`` and lance
   ``delete`` / ``update`` (deletion files) of the same predicate, each on a fresh copy: wall time and bytes
   written;
4. ``tombstone("l_suppkey", values)`` of 1,000 suppliers (a tenth of them when there are fewer than 10,000):
   bytes written; then the current view's full aggregate against plain Spark over the same live rows written
   as fresh Parquet, and against the view before the tombstone; then after ``t.compact()``;
5. ``vacuum()`` of them: files read and rewritten of those considered, wall time, against delta-rs ``delete``
   of the same predicate on a Delta table of the same rows (written by delta-rs in this run).

Bytes written are every byte added under the table path (a walk before and after), the key index (a local
cache) left out. Results: ``benchmarks/results/restatement-<date>-sf<sf>.json`` and the section
"## Restatement: revert, replace, tombstone, vacuum, DML" of docs/benchmarks.md.

    .venv/bin/python benchmarks/restatement.py --scale-factor 1     # what `make bench-restatement` runs
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core  # noqa: E402
from core import DELTA, OP, PRIMARY_KEY, log, mb, sf_text  # noqa: E402
from maintenance import timed_runs  # noqa: E402

import bitlake  # noqa: E402
from bitlake.engine.keys.indexsession import flush_idle  # noqa: E402

SECTION = "## Restatement: revert, replace, tombstone, vacuum, DML"
FRACTIONS = (("0.1 %", 0.001), ("1 %", 0.01), ("10 %", 0.1))
TOMBSTONED_SUPPLIERS = 1000


def written(path: Path, before: dict[str, int]) -> dict:
    total, by_cat, files = core.written_between(before, core.snapshot(path))
    total -= by_cat.pop("index", 0)
    return {"bytes": total, "by_category": by_cat, "files": files}


def measure(path: Path, fn) -> dict:
    before = core.snapshot(path)
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    flush_idle()  # the key index's update after the commit runs on a thread: not the next call's time (core.py)
    w = written(path, before)
    data_before = {k for k in before if k.startswith("data/")}
    data_after = {k for k in core.snapshot(path) if k.startswith("data/")}
    return {"seconds": seconds, **w, "data_files_added": len(data_after - data_before),
            "data_files_removed": len(data_before - data_after), "result": repr(out)}


def corrected(batch: pa.Table) -> pa.Table:
    """The batch with ``l_quantity + 1`` again: a replacement of the same keys."""
    from decimal import Decimal

    qty = batch.column("l_quantity")
    one = pa.scalar(Decimal("1.00"), qty.type) if pa.types.is_decimal(qty.type) else pa.scalar(1, qty.type)
    return batch.set_column(batch.schema.get_field_index("l_quantity"), "l_quantity",
                            pc.add(qty, one).cast(qty.type))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale-factor", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--no-doc", action="store_true")
    ap.add_argument("--restate-only", action="store_true",
                    help="steps 1 and 2 only (ingestion, revert and replace; a minute at SF 1): prints them and saves "
                         "benchmarks/results/restatement-restate-<date>-sf<sf>.json, docs/benchmarks.md untouched")
    args = ap.parse_args(argv)
    sf = args.scale_factor
    work = core.fresh_work(f"restatement-sf{sf_text(sf)}")
    result: dict = {"scale_factor": sf, "date": dt.date.today().isoformat(), "machine": core.machine()}

    base = core.load_base(core.lineitem(sf))
    schema = base.schema
    maker = core.ChangeMaker(base, args.seed)
    main_path = work / "bitlake"
    t = bitlake.create_table(str(main_path), schema, primary_key=PRIMARY_KEY, delta_column=DELTA, num_buckets=16)
    t0 = time.perf_counter()
    t.ingest(base, batch_id="base")
    result["base_load_s"] = time.perf_counter() - t0
    flush_idle()
    batches = {}
    result["batches"] = {}
    for k, (name, fraction) in enumerate(FRACTIONS, start=1):
        batch, _ = maker.make(k, fraction)
        batches[name] = batch
        m = measure(main_path, lambda b=batch, k=k: t.ingest(b, op_column=OP, batch_id=f"b{k}"))
        m["parquet_bytes"] = core.write_parquet(batch, work / f"batch-{k}.parquet")
        m["rows"] = batch.num_rows
        result["batches"][name] = m
        log(f"ingest {name}: {m['seconds']:.2f} s, {mb(m['bytes'])}")

    # 2. revert and replace, each on its own copy; and, as a baseline in the same conditions (a copy, its key index
    # opened by the commit, the key cache of the copy's path cold at the first run), a new batch of the same size
    # ingested on a copy.
    result["restate"], result["copy_ingest"] = {}, {}
    fresh = {name: maker.make(len(FRACTIONS) + k, fraction)[0]
             for k, (name, fraction) in enumerate(FRACTIONS[:2], start=1)}
    for k, (name, _) in enumerate(FRACTIONS[:2], start=1):
        for op in ("ingest", "revert", "replace"):
            tries = []
            for _ in range(args.runs):  # each on a fresh copy; the median wall time
                path = work / f"{op}-{k}"
                shutil.copytree(main_path, path)
                os.sync()  # the copy's writeback is not the restatement's: its commit's fsyncs would wait on it
                copy = bitlake.open_table(str(path))
                if op == "ingest":
                    tries.append(measure(path, lambda c=copy, b=fresh[name]: c.ingest(b, op_column=OP,
                                                                                       batch_id="fresh")))
                elif op == "revert":
                    tries.append(measure(path, lambda c=copy, k=k: c.revert_batch(f"b{k}")))
                else:
                    fixed = corrected(batches[name])
                    tries.append(measure(path, lambda c=copy, k=k, f=fixed: c.replace_batch(f"b{k}", f,
                                                                                            op_column=OP)))
                shutil.rmtree(path)
            m = sorted(tries, key=lambda x: x["seconds"])[len(tries) // 2]
            m["runs_s"] = [x["seconds"] for x in tries]
            if op == "ingest":
                result["copy_ingest"][name] = m
                runs = ", ".join(f"{x:.2f}" for x in m["runs_s"])
                log(f"ingest {name} on a copy: {m['seconds']:.2f} s (runs {runs})")
                continue
            own = result["batches"][name]
            m["vs_ingest_time"] = m["seconds"] / own["seconds"]
            m["vs_copy_ingest_time"] = m["seconds"] / result["copy_ingest"][name]["seconds"]
            m["vs_batch_parquet_bytes"] = m["bytes"] / own["parquet_bytes"]
            result["restate"][f"{op} {name}"] = m
            log(f"{op} {name}: {m['seconds']:.2f} s ({m['vs_ingest_time']:.2f}x its ingestion, "
                f"{m['vs_copy_ingest_time']:.2f}x a batch of its size on a copy), {mb(m['bytes'])} "
                f"({m['vs_batch_parquet_bytes']:.2f}x the batch as Parquet), {m['data_files_added']} data files "
                f"(runs {', '.join(f'{x:.2f}' for x in m['runs_s'])})")

    if args.restate_only:
        out = core.RESULTS_DIR / f"restatement-restate-{result['date']}-sf{sf_text(sf)}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str))
        log(f"results: {out}")
        return 0

    # 3. delete and update of 0.1 % of the rows, spread over every file; each system on a fresh copy.
    spark = bitlake.spark_session("local[2]", app_name="bitlake-bench-restatement")
    import deltalake
    import lance

    live = t.to_arrow()
    delta_base, lance_base = work / "delta-base", work / "lance-base"
    deltalake.write_deltalake(str(delta_base), live)
    lance.write_dataset(live, str(lance_base))
    partkeys = np.sort(live.column("l_partkey").to_numpy())
    bound = int(partkeys[max(0, int(0.001 * len(partkeys)) - 1)])
    where = pc.field("l_partkey") <= bound
    sql = f"l_partkey <= {bound}"
    result["dml"] = {"predicate": sql}
    from decimal import Decimal

    qty_type = schema.field("l_quantity").type
    one = pa.scalar(Decimal("1.00"), qty_type) if pa.types.is_decimal(qty_type) else pa.scalar(1, qty_type)
    for op in ("delete", "update"):
        paths = {name: work / f"{op}-{name}" for name in ("bitlake", "delta_rs", "lance")}
        for name, source in (("bitlake", main_path), ("delta_rs", delta_base), ("lance", lance_base)):
            shutil.copytree(source, paths[name])
        copy = bitlake.open_table(str(paths["bitlake"]))
        dt_, ds_ = deltalake.DeltaTable(str(paths["delta_rs"])), lance.dataset(str(paths["lance"]))
        row = {}
        if op == "delete":
            row["bitlake"] = measure(paths["bitlake"], lambda c=copy: c.delete(where))
            row["delta_rs"] = measure(paths["delta_rs"], lambda d=dt_: d.delete(sql))
            row["lance"] = measure(paths["lance"], lambda d=ds_: d.delete(sql))
        else:
            row["bitlake"] = measure(paths["bitlake"],
                                     lambda c=copy: c.update(where, {"l_quantity": pc.field("l_quantity") + one}))
            row["delta_rs"] = measure(paths["delta_rs"], lambda d=dt_: d.update(
                predicate=sql, updates={"l_quantity": "l_quantity + 1"}))
            try:
                row["lance"] = measure(paths["lance"], lambda d=ds_: d.update({"l_quantity": "l_quantity + 1"},
                                                                               where=sql))
            except Exception as e:  # noqa: BLE001 - a peer's limitation is a result
                row["lance"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0]}"}
        for path in paths.values():
            shutil.rmtree(path)
        result["dml"][op] = row
        log(f"{op}: " + ", ".join(f"{k} {v.get('seconds', float('nan')):.2f} s {mb(v.get('bytes', 0))}"
                                  for k, v in row.items()))

    # 4. tombstone of suppliers, and the scan with them hidden against plain Parquet of the same rows.
    suppliers = np.unique(live.column("l_suppkey").to_numpy())
    values = np.random.default_rng(args.seed).choice(suppliers, size=min(TOMBSTONED_SUPPLIERS, len(suppliers) // 10),
                                                      replace=False)
    result["tombstoned_values"] = len(values)
    before_tombstone = t.version
    m = measure(main_path, lambda: t.tombstone("l_suppkey", values))
    result["tombstone"] = m
    log(f"tombstone: {m['seconds']:.2f} s, {m['bytes']} bytes")
    plain_dir = work / "plain"
    core.write_parquet(live.filter(~pc.field("l_suppkey").isin(pa.array(values))), plain_dir / "part-0.parquet")
    del live
    from bitlake.spark.schema import spark_schema

    def plain():
        return core.aggregate(spark.read.schema(spark_schema(schema)).parquet(str(plain_dir)), schema).collect()

    scans = timed_runs({
        "plain": plain,
        "bitlake": lambda: core.aggregate(t.to_spark(spark), schema).collect(),
        "bitlake_before": lambda: core.aggregate(t.to_spark(spark, version=before_tombstone), schema).collect(),
    }, args.runs)
    result["tombstone"]["scan"] = {**scans, "ratio": scans["plain"] / scans["bitlake"],
                                   "vs_before": scans["bitlake_before"] / scans["bitlake"]}
    # After a minor compaction (the churn's superseded rows set apart; tombstoned rows stay until the vacuum).
    t.compact()
    scans = timed_runs({"plain": plain, "bitlake": lambda: core.aggregate(t.to_spark(spark), schema).collect()},
                       args.runs)
    result["tombstone"]["scan_compacted"] = {**scans, "ratio": scans["plain"] / scans["bitlake"]}
    log(f"scan with the tombstone: {result['tombstone']['scan']}")

    # 5. vacuum against delta-rs delete of the same predicate.
    sql_values = ", ".join(str(int(v)) for v in values)
    m = measure(main_path, t.vacuum)
    result["vacuum"] = {**m, "parameters": bitlake.format.commitlog.read(t.io, t.version).parameters}
    dm = measure(delta_base, lambda: deltalake.DeltaTable(str(delta_base)).delete(f"l_suppkey in ({sql_values})"))
    result["vacuum"]["delta_rs_delete"] = dm
    log(f"vacuum: {m['seconds']:.2f} s, {mb(m['bytes'])}, {m['result']}; delta-rs delete {dm['seconds']:.2f} s, "
        f"{mb(dm['bytes'])}")

    core.save_results(result, f"restatement-{result['date']}-sf{sf_text(sf)}", markdown, SECTION, args.no_doc)
    return 0


def markdown(r: dict) -> str:
    sf = sf_text(r["scale_factor"])
    lines = [f"{SECTION}", "", f"TPC-H lineitem SF {sf}, {r['date']}; command: "
             f"`.venv/bin/python benchmarks/restatement.py --scale-factor {sf}` (`make bench-restatement`).", "",
             "| operation | wall | vs its batch's ingestion | bytes written | vs the batch as Parquet | data files "
             "added / removed |", "| --- | --- | --- | --- | --- | --- |"]
    for name, b in r["batches"].items():
        lines.append(f"| ingest {name} ({b['rows']:,} records) | {b['seconds']:.2f} s | 1 | {mb(b['bytes'])} | "
                     f"{b['bytes'] / b['parquet_bytes']:.2f} | {b['data_files_added']} / {b['data_files_removed']} |")
    for name, m in r["restate"].items():
        on_copy = f" ({m['vs_copy_ingest_time']:.2f} against a batch of its size on a copy)" \
            if "vs_copy_ingest_time" in m else ""
        lines.append(f"| {name} | {m['seconds']:.2f} s | {m['vs_ingest_time']:.2f}{on_copy} | {mb(m['bytes'])} | "
                     f"{m['vs_batch_parquet_bytes']:.2f} | {m['data_files_added']} / {m['data_files_removed']} |")
    tomb = r["tombstone"]
    vac = r["vacuum"]
    p = vac["parameters"]
    lines += ["", f"- `tombstone` of {r['tombstoned_values']:,} `l_suppkey` values: {tomb['seconds']:.2f} s, "
              f"{tomb['bytes']:,} bytes written. Current-view aggregate with them hidden: "
              f"{tomb['scan']['bitlake']:.2f} s against {tomb['scan']['plain']:.2f} s for plain Spark over the same "
              f"live rows as fresh Parquet: **{tomb['scan']['ratio']:.2f} of plain**; the same table's view before the "
              f"tombstone (its churn: the anti-join of superseded rows, no compaction) takes "
              f"{tomb['scan']['bitlake_before']:.2f} s, so the tombstone's own cost is "
              f"{tomb['scan']['vs_before']:.2f} of it. After a minor compaction (tombstoned rows still there): "
              f"{tomb['scan_compacted']['bitlake']:.2f} s against {tomb['scan_compacted']['plain']:.2f} s: "
              f"**{tomb['scan_compacted']['ratio']:.2f} of plain**.",
              f"- `vacuum` of them: {vac['seconds']:.2f} s, {mb(vac['bytes'])} written, {p.get('files_rewritten')} "
              f"files rewritten, {p.get('rows_purged'):,} rows purged ({vac['result']}): the files of the latest "
              "version and the older files time travel still reads (the compaction's inputs), so that no file keeps a "
              f"purged row; delta-rs `delete` of the same predicate: {vac['delta_rs_delete']['seconds']:.2f} s, "
              f"{mb(vac['delta_rs_delete']['bytes'])} written (its older files keep the rows until its vacuum). "
              "No clustering by `l_suppkey` (not built): every data file's range admits some of the random "
              "suppliers.", "",
              f"DML of `{r['dml']['predicate']}` (0.1 % of the rows, in every file):", "",
              "| | bitlake | delta-rs | lance |", "| --- | --- | --- | --- |"]
    for op in ("delete", "update"):
        cells = []
        for system in ("bitlake", "delta_rs", "lance"):
            m = r["dml"][op][system]
            cells.append(m["error"] if "error" in m else f"{m['seconds']:.2f} s, {mb(m['bytes'])}")
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    lines += ["", f"Raw results: `{r['json_path']}`.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
