"""Reads of a churned table by pyarrow, DuckDB and Polars: bitlake against plain Parquet of the same rows, lance and
delta-rs (issue 42).

The table is TPC-H ``lineitem`` (``tpchgen-cli``) after the workload of benchmarks/peers.py, built with its
functions and system classes: the base, upserts of 0.1 %, 1 % and 10 % of the base rows (95 % updates of random
keys, 5 % new keys) and a delete of 0.1 % of the keys. The same batches build four tables, each in a process of
its own:

- bitlake: ``t.ingest(pq.read_table(batch))`` (peers.py's ``bitlake-arrow`` mode, 16 buckets);
- plain: bitlake's ``t.to_arrow()`` written as one Parquet file (snappy, row groups of the size tpchgen-cli
  writes, decimals as INT64 as tpchgen-cli, delta-rs and bitlake write them);
- lance: ``lance.write_dataset`` then ``merge_insert`` of each batch (``when_matched_delete`` for the delete);
- delta-rs: ``write_deltalake`` then ``DeltaTable.merge`` of each batch;
- compacted: a copy of the bitlake table after ``t.compact(major=True)``.

Three queries — ``sum(l_quantity)``; ``sum(l_extendedprice), count(*)`` of one month of ``l_shipdate`` (March
1995); every column, materialised — run on each engine:

- pyarrow: ``t.to_arrow(columns=, filter=)``; plain ``pyarrow.dataset``; lance ``ds.to_table(columns=,
  filter=)``; delta-rs ``DeltaTable.to_pyarrow_dataset().to_table(columns=, filter=)``;
- DuckDB: ``register`` of ``t.view()`` (and of the table object ``t`` itself, when DuckDB takes it); plain
  ``read_parquet``; the lance dataset and delta-rs's ``to_pyarrow_dataset()`` registered;
- Polars: ``bitlake.polars.scan(t)``; ``pl.scan_parquet``; ``pl.scan_pyarrow_dataset(lance)``;
  ``pl.scan_delta``.

Every result is checked against plain Parquet's (sums, counts, rows) and plain's against the workload's expected
figures; a difference stops the run. Per query and engine the tables are read in turn: one warm-up each, then
``--runs`` rounds (the order reversed every other round), medians. It prints a markdown table; ``--output``
writes it to the section "## Reads: engines against plain Parquet, lance and delta-rs" of docs/benchmarks.md.

    .venv/bin/python benchmarks/reads.py --scale-factor 1 --output      # what `make bench-reads` runs
    .venv/bin/python benchmarks/reads.py --scale-factor 0.1
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core  # noqa: E402  (benchmarks/ is not a package)
import peers  # noqa: E402
from core import CODEC, ROOT, log, sf_text  # noqa: E402

WORK_DIR = ROOT / "benchmarks" / "work" / "reads"
SECTION = "## Reads: engines against plain Parquet, lance and delta-rs"
MONTH = peers.MONTH  # [1995-03-01, 1995-04-01)
BITLAKE_MODE = "bitlake-arrow"  # peers.py's mode whose batches land from Arrow, without Spark
SYSTEMS = ("bitlake", "plain", "lance", "deltalake", "compacted")
CENT = Decimal("0.01")


# ------------------------------------------------------------------------------------------ build


def _data_stats(files: list[str]) -> dict:
    return {"files": len(files), "bytes": sum(os.path.getsize(f) for f in files)}


def build(system: str, spec_path: Path, folder: Path, out: Path) -> None:
    """Builds one system's table from the batch files of ``spec_path`` (run in a process of its own); writes what
    it did to ``out`` (JSON). The bitlake build also writes the plain file and the compacted copy."""
    spec = json.loads(spec_path.read_text())
    schema = core.table_schema(pq.read_schema(spec["source"]))
    name = BITLAKE_MODE if system == "bitlake" else system
    shutil.rmtree(folder, ignore_errors=True)
    s = peers.SYSTEM_CLASSES[name](name, folder, schema)
    report: dict[str, Any] = {"ops": []}
    start = time.perf_counter()
    for op in spec["ops"]:
        t0 = time.perf_counter()
        getattr(s, op["operation"])(op["file"], op["k"])
        s.settle()
        report["ops"].append({"operation": op["operation"], "fraction": op["batch_fraction"],
                              "s": time.perf_counter() - t0})
    report["build_s"] = time.perf_counter() - start
    if system == "bitlake":
        import bitlake

        t = s.table
        report["version"] = t.version
        report["data"] = _data_stats([t.io.local_path(f.path) for f in t.state().data_files()])
        # plain: the current view's rows as one Parquet file, in row groups of the size tpchgen-cli writes, its
        # decimals as INT64 as tpchgen-cli, delta-rs and bitlake write them (pyarrow's default, fixed-length byte
        # arrays, took pyarrow 0.14 s to sum l_quantity at SF 1 against 0.009 s as INT64)
        t0 = time.perf_counter()
        rows = t.to_arrow()
        group = pq.ParquetFile(spec["source"]).metadata.row_group(0).num_rows
        plain = folder.parent / "plain" / "lineitem.parquet"
        plain.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows, plain, compression=CODEC, row_group_size=group, store_decimal_as_integer=True)
        report["plain"] = {**_data_stats([str(plain)]), "rows": rows.num_rows, "row_group_rows": group,
                           "s": time.perf_counter() - t0}
        del rows
        # compacted: a copy of the table folder, then a major compaction of the copy
        copy = folder.parent / "compacted"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(folder / "table", copy / "table")
        c = bitlake.open_table(str(copy / "table"))
        t0 = time.perf_counter()
        r = c.compact(major=True)
        c = bitlake.open_table(str(copy / "table"))
        report["compacted"] = {"s": time.perf_counter() - t0, "version": c.version, "committed": r.version,
                               **_data_stats([c.io.local_path(f.path) for f in c.state().data_files()])}
    elif system == "lance":
        d = s.dataset()
        report["data"] = {"fragments": len(d.get_fragments()), "bytes": s.current_data_bytes(),
                          "deletion_files": sum(1 for f in d.get_fragments() if f.deletion_file() is not None)}
    elif system == "deltalake":
        from deltalake import DeltaTable

        report["data"] = {"files": len(DeltaTable(s.uri).file_uris()), "bytes": s.current_data_bytes()}
    out.write_text(json.dumps(report, indent=1))


def build_apart(system: str, spec_path: Path, folder: Path) -> dict:
    out = folder.parent / f"{system}.build.json"
    out.unlink(missing_ok=True)
    child = multiprocessing.get_context("spawn").Process(target=build, args=(system, spec_path, folder, out))
    child.start()
    child.join()
    if child.exitcode != 0 or not out.exists():
        raise RuntimeError(f"building the {system} table failed (exit code {child.exitcode})")
    return json.loads(out.read_text())


# ------------------------------------------------------------------------------------------ queries


def dec(x: Any) -> Decimal:
    return Decimal(str(x)).quantize(CENT)


def arrow_figures(query: str, result: Any) -> tuple:
    """The figures of a pyarrow result (a table) to compare."""
    if query == "narrow":
        return (dec(pc.sum(result["l_quantity"]).as_py()),)
    if query == "selective":
        return dec(pc.sum(result["l_extendedprice"]).as_py() or 0), result.num_rows
    return result.num_rows, dec(pc.sum(result["l_quantity"]).as_py()), tuple(sorted(result.schema.names))


def row_figures(query: str, result: Any) -> tuple:
    """The figures of a DuckDB result: a row of sums and counts, or an Arrow table (every column)."""
    if query == "narrow":
        return (dec(result[0][0]),)
    if query == "selective":
        return dec(result[0][0] or 0), int(result[0][1])
    return arrow_figures(query, result)


def polars_figures(query: str, result: Any) -> tuple:
    if query == "narrow":
        return (dec(result.item(0, 0)),)
    if query == "selective":
        return dec(result.item(0, 0) or 0), int(result.item(0, 1))
    return result.height, dec(result["l_quantity"].sum()), tuple(sorted(result.columns))


QUERIES = {
    "narrow": "sum(l_quantity)",
    "selective": "one month: sum(l_extendedprice), count(*)",
    "wide": "every column",
}


class Tables:
    """The five tables, opened once; each engine's readers of them."""

    def __init__(self, work: Path):
        import duckdb
        import lance
        from deltalake import DeltaTable

        import bitlake

        self.bitlake = bitlake.open_table(str(work / "bitlake" / "table"))
        self.compacted = bitlake.open_table(str(work / "compacted" / "table"))
        self.plain_file = str(work / "plain" / "lineitem.parquet")
        self.plain = ds.dataset(self.plain_file, format="parquet")
        self.lance_uri = str(work / "lance" / "table")
        self.lance = lance.dataset(self.lance_uri)
        self.delta_uri = str(work / "deltalake" / "table")
        self.delta = DeltaTable(self.delta_uri).to_pyarrow_dataset()
        self.duck = duckdb.connect()
        self.duck.register("bl", self.bitlake.view())
        self.duck.register("blc", self.compacted.view())
        self.duck.execute(f"CREATE VIEW plain AS SELECT * FROM read_parquet('{self.plain_file}')")
        self.duck.register("lance_ds", self.lance)
        self.duck.register("delta_ds", self.delta)
        # The table object itself, if DuckDB takes it (a Table that is a dataset, or has an Arrow stream).
        self.table_note = None
        try:
            self.duck.register("blt", self.bitlake)
            self.duck.register("blct", self.compacted)
            self.duck.sql("SELECT count(*) FROM blt").fetchall()
        except Exception as e:  # noqa: BLE001 - recorded in the doc, the view's row stands
            self.table_note = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            log(f"DuckDB does not take the table object: {self.table_note}")

    def pyarrow(self, query: str) -> dict[str, Callable[[], Any]]:
        month = (pc.field("l_shipdate") >= pa.scalar(MONTH[0])) & (pc.field("l_shipdate") < pa.scalar(MONTH[1]))
        args: dict[str, Any] = {"narrow": {"columns": ["l_quantity"]},
                                "selective": {"columns": ["l_extendedprice"], "filter": month},
                                "wide": {}}[query]
        return {"bitlake": lambda: self.bitlake.to_arrow(**args),
                "plain": lambda: self.plain.to_table(**args),
                "lance": lambda: self.lance.to_table(**args),
                "deltalake": lambda: self.delta.to_table(**args),
                "compacted": lambda: self.compacted.to_arrow(**args)}

    def duckdb(self, query: str) -> dict[str, Callable[[], Any]]:
        sql = {"narrow": "SELECT sum(l_quantity) FROM {}",
               "selective": f"SELECT sum(l_extendedprice), count(*) FROM {{}} WHERE l_shipdate >= DATE '{MONTH[0]}'"
                            f" AND l_shipdate < DATE '{MONTH[1]}'",
               "wide": "SELECT * FROM {}"}[query]

        def run(name: str) -> Callable[[], Any]:
            if query == "wide":
                return lambda: self.duck.sql(sql.format(name)).to_arrow_table()
            return lambda: self.duck.sql(sql.format(name)).fetchall()

        out = {"bitlake": run("bl"), "plain": run("plain"), "lance": run("lance_ds"), "deltalake": run("delta_ds"),
               "compacted": run("blc")}
        if self.table_note is None:
            out.update({"bitlake (table)": run("blt"), "compacted (table)": run("blct")})
        return out

    def polars(self, query: str) -> dict[str, Callable[[], Any]]:
        import polars as pl

        import bitlake.polars

        month = pl.col("l_shipdate").is_between(MONTH[0], MONTH[1], closed="left")
        q: Callable[[Any], Any] = {
            "narrow": lambda lf: lf.select(pl.col("l_quantity").sum()),
            "selective": lambda lf: lf.filter(month).select(pl.col("l_extendedprice").sum(), pl.len()),
            "wide": lambda lf: lf}[query]
        return {"bitlake": lambda: q(bitlake.polars.scan(self.bitlake)).collect(),
                "plain": lambda: q(pl.scan_parquet(self.plain_file)).collect(),
                "lance": lambda: q(pl.scan_pyarrow_dataset(self.lance)).collect(),
                "deltalake": lambda: q(pl.scan_delta(self.delta_uri)).collect(),
                "compacted": lambda: q(bitlake.polars.scan(self.compacted)).collect()}


ENGINES: dict[str, Callable[[str, Any], tuple]] = {"pyarrow": arrow_figures, "DuckDB": row_figures,
                                                   "Polars": polars_figures}


def expected_figures(query: str, expected: dict) -> dict[int, Any]:
    """What the workload's bookkeeping says of a result's figures (position: value)."""
    if query == "narrow":
        return {0: dec(expected["sum_l_quantity"])}
    if query == "selective":
        return {1: expected["selective_rows"]}
    return {0: expected["rows"], 1: dec(expected["sum_l_quantity"])}


def measure(fns: dict[str, Callable[[], Any]], figures: Callable[[Any], tuple], runs: int, cell: str,
            expected: dict[int, Any]) -> dict[str, dict]:
    """One warm-up of each, then ``runs`` rounds of all in turn (reversed every other round); every result's figures
    checked against plain's. Returns each one's median and runs."""
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    want = None
    for r in range(runs + 1):
        order = ["plain"] + [n for n in names if n != "plain"] if r == 0 else names if r % 2 else names[::-1]
        for name in order:
            t0 = time.perf_counter()
            result = fns[name]()
            elapsed = time.perf_counter() - t0
            got = figures(result)
            del result
            if name == "plain" and want is None:
                want = got
                wrong = {i: (got[i], v) for i, v in expected.items() if got[i] != v}
                if wrong:
                    raise SystemExit(f"{cell}: plain Parquet's result differs from the workload's expected "
                                     f"figures (position: (got, expected)): {wrong}")
            if got != want:
                raise SystemExit(f"{cell}: {name}'s result {got} differs from plain Parquet's {want}")
            if r > 0:
                times[name].append(elapsed)
    return {n: {"median_s": statistics.median(ts), "runs_s": ts} for n, ts in times.items()}


# ------------------------------------------------------------------------------------------ report


ENGINE_LABEL = {"pyarrow": "pyarrow", "DuckDB": "DuckDB", "Polars": "Polars"}


def rows_of(results: list[dict]) -> list[dict]:
    """The table's rows: one per (query, engine), plus DuckDB over the table object when it ran."""
    out = []
    for r in results:
        m = r["systems"]
        variants = [("", "bitlake", "compacted")]
        if "bitlake (table)" in m:
            variants = [(" (`register(t.view())`)", "bitlake", "compacted"),
                        (" (`register(t)`)", "bitlake (table)", "compacted (table)")]
        for suffix, b, c in variants:
            out.append({"query": r["query"], "engine": r["engine"] + suffix, "bitlake": m[b]["median_s"],
                        "plain": m["plain"]["median_s"], "lance": m["lance"]["median_s"],
                        "deltalake": m["deltalake"]["median_s"], "compacted": m[c]["median_s"]})
    return out


def render_table(results: list[dict]) -> str:
    lines = ["| query | engine | bitlake | plain | lance | delta-rs | bitlake/plain | compacted | compacted/plain |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows_of(results):
        lines.append(f"| {QUERIES[r['query']]} | {r['engine']} | {r['bitlake']:.3f} | {r['plain']:.3f} | "
                     f"{r['lance']:.3f} | {r['deltalake']:.3f} | {r['bitlake'] / r['plain']:.2f}x | "
                     f"{r['compacted']:.3f} | {r['compacted'] / r['plain']:.2f}x |")
    return "\n".join(lines) + "\n"


def targets(results: list[dict]) -> list[str]:
    """Issue 42's targets, cell by cell: within 1.25x of plain (1.05x compacted), no slower than lance and
    delta-rs."""
    rows = rows_of(results)
    out = []
    for what, test in [
        ("bitlake within 1.25x of plain", lambda r: r["bitlake"] <= 1.25 * r["plain"]),
        ("bitlake no slower than lance", lambda r: r["bitlake"] <= r["lance"]),
        ("bitlake no slower than delta-rs", lambda r: r["bitlake"] <= r["deltalake"]),
        ("compacted within 1.05x of plain", lambda r: r["compacted"] <= 1.05 * r["plain"]),
    ]:
        met = [f"{QUERIES[r['query']]} / {r['engine']}" for r in rows if test(r)]
        missed = [f"{QUERIES[r['query']]} / {r['engine']}" for r in rows if not test(r)]
        if not met or not missed:
            out.append(f"- {what}: {'met' if met else 'missed'} in all {len(rows)} cells")
        elif len(met) <= len(missed):
            out.append(f"- {what}: met in {len(met)} of {len(rows)} cells, only: {'; '.join(met)}")
        else:
            out.append(f"- {what}: met in {len(met)} of {len(rows)} cells; missed in: {'; '.join(missed)}")
    return out


def versions() -> str:
    names = ("pyarrow", "duckdb", "polars", "pylance", "deltalake")
    out = []
    for n in names:
        try:
            out.append(f"{n} {importlib_metadata.version(n)}")
        except importlib_metadata.PackageNotFoundError:
            pass
    return ", ".join(out)


def files(n: int, kind: str = "") -> str:
    return f"{n} {kind}file{'' if n == 1 else 's'}"


def render(run: dict) -> str:
    b, built = run["built"], run["built"]["bitlake"]
    plain, comp, lan, dlt = built["plain"], built["compacted"], b["lance"]["data"], b["deltalake"]["data"]
    exp = run["expected"]
    load = run["load"]
    text = [
        SECTION,
        "",
        f"TPC-H `lineitem` at SF {sf_text(run['scale_factor'])} ({run['base_rows']:,} rows) after the workload of "
        "`benchmarks/peers.py` (upserts of 0.1 %, 1 % and 10 % of the base rows, then a delete of 0.1 % of the "
        f"keys): {exp['rows']:,} current rows, {exp['selective_rows']:,} of them shipped in March 1995. The same "
        "batches built each table: **bitlake** (`t.ingest(pq.read_table(batch))`, 16 buckets; version "
        f"{built['version']}, {files(built['data']['files'], 'data ')}, {core.mb(built['data']['bytes'])}), **plain** "
        f"(bitlake's `t.to_arrow()` written as one Parquet file by pyarrow, snappy, decimals as INT64, row groups of "
        f"{plain['row_group_rows']:,} rows as tpchgen-cli writes them; {core.mb(plain['bytes'])}), **lance** "
        f"(`write_dataset` + `merge_insert`; {lan['fragments']} fragments, {lan['deletion_files']} with deletion "
        f"files, {core.mb(lan['bytes'])}), **delta-rs** (`write_deltalake` + `merge`; {files(dlt['files'])}, "
        f"{core.mb(dlt['bytes'])}) and **compacted** (a copy of the bitlake table after `t.compact(major=True)` "
        f"with the default look-back, {comp['s']:.1f} s; {files(comp['files'], 'data ')}, {core.mb(comp['bytes'])}).",
        "",
        "Readers: pyarrow — `t.to_arrow(columns=, filter=)` (planned at each call), plain `pyarrow.dataset`, "
        "lance `ds.to_table(columns=, filter=)`, delta-rs `to_pyarrow_dataset().to_table(...)` (datasets opened "
        "once); DuckDB — `register` of `t.view()`, plain `read_parquet`, the lance dataset and delta-rs's "
        "`to_pyarrow_dataset()` registered (every column: `to_arrow_table()`); Polars — `bitlake.polars.scan(t)`, "
        "`scan_parquet`, `scan_pyarrow_dataset(lance)`, `scan_delta` (every column: `collect()`). Every result "
        "was checked against plain's (sums, count, rows) and plain's against the workload's figures. Seconds, "
        f"median of {run['runs']} after a warm-up, the tables read in turn (order reversed every other round).",
        "",
        f"{run['date']}, commit {run['commit']}{' (bitlake/ modified)' if run['dirty'] else ''}, "
        f"{run['cores']} cores shared with other jobs: load average {load[0]:.1f} at the start, {load[1]:.1f} at "
        f"the end; {run['versions']}. Command: `{run['command']}` ({run['minutes']:.1f} min in all, "
        f"building {run['build_minutes']:.1f}).",
        "",
    ]
    spreads = sorted((max(v["runs_s"]) / min(v["runs_s"]), f"{QUERIES[r['query']]} / {r['engine']} / {name}")
                     for r in run["results"] for name, v in r["systems"].items())
    text += [f"The machine's other jobs make readings noisy: the slowest of a reading's {run['runs']} runs over its "
             f"fastest is {statistics.median(s for s, _ in spreads):.2f} in the median reading, up to "
             f"{spreads[-1][0]:.2f} ({spreads[-1][1]}).", ""]
    if run.get("table_note"):
        text += [f"DuckDB over the table object (`duckdb.register(\"t\", t)`) was not measured: it raised "
                 f"`{run['table_note']}`.", ""]
    if run.get("note"):
        text += [run["note"], ""]
    text.append(render_table(run["results"]))
    text += ["Issue 42's targets:", "", *targets(run["results"]), ""]
    return "\n".join(text)


# ------------------------------------------------------------------------------------------ main


def git(*cmd: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *cmd], capture_output=True, text=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale-factor", type=float, default=1.0, help="TPC-H scale factor (1 = 6M rows)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs of each read, after one warm-up")
    ap.add_argument("--output", action="store_true",
                    help=f"write the section \"{SECTION}\" of docs/benchmarks.md (other sections are kept)")
    ap.add_argument("--note", default="", help="a line for the doc's text")
    ap.add_argument("--keep-work", action="store_true", help="keep the tables under benchmarks/work/reads")
    ap.add_argument("--reuse", action="store_true", help=argparse.SUPPRESS)  # the tables of a kept work folder
    args = ap.parse_args(argv)
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    given = sys.argv[1:] if argv is None else argv
    sf = args.scale_factor
    work = WORK_DIR / f"sf{sf_text(sf)}"
    built: dict[str, dict] = {}
    if args.reuse and (work / "built.json").exists():
        spec = json.loads((work / "spec.json").read_text())
        built = json.loads((work / "built.json").read_text())
    else:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        log(f"SF {sf_text(sf)}: generating the batches (benchmarks/peers.py's prepare)")
        spec = peers.prepare_apart(sf, work, quick=False)
        for system in ("bitlake", "lance", "deltalake"):
            log(f"building the {system} table")
            built[system] = build_apart(system, work / "spec.json", work / system)
            log(f"{system}: built in {built[system]['build_s']:.1f} s")
        (work / "built.json").write_text(json.dumps(built, indent=1))
    build_minutes = (time.perf_counter() - started) / 60
    tables = Tables(work)
    results = []
    for query in QUERIES:
        for engine, figures in ENGINES.items():
            cell = f"{QUERIES[query]} / {engine}"
            fns = getattr(tables, engine.lower())(query)
            m = measure(fns, lambda r, q=query, f=figures: f(q, r), args.runs, cell,
                        expected_figures(query, spec["expected"]))
            results.append({"query": query, "engine": engine, "systems": m})
            log(f"{cell}: " + ", ".join(f"{n} {v['median_s']:.3f} s" for n, v in m.items()))
    run = {"command": shlex.join([".venv/bin/python", "benchmarks/reads.py", *given]),
           "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
           "commit": git("rev-parse", "--short", "HEAD"),
           "dirty": bool(git("status", "--porcelain", "--", "bitlake")), "cores": os.cpu_count(),
           "load": (load_start, os.getloadavg()[0]), "versions": versions(), "scale_factor": sf,
           "base_rows": spec["base_rows"], "expected": spec["expected"], "built": built, "runs": args.runs,
           "results": results, "table_note": tables.table_note, "note": args.note,
           "minutes": (time.perf_counter() - started) / 60, "build_minutes": build_minutes}
    (work / "results.json").write_text(json.dumps(run, indent=1, default=str))
    section = render(run)
    print(section)
    if args.output:
        core.write_doc(section, SECTION)
        log(f"wrote {SECTION!r} in {os.path.relpath(core.DOC, ROOT)}")
    del tables
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
