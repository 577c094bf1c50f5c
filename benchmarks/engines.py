"""DuckDB and Polars over a bitlake view, against the same engines over plain Parquet of the same rows.

It builds a synthetic keyed table of ``--rows`` rows (default 2,000,000) and ingests ``--batches`` (3) upsert
batches of 5 % of the rows each (updates of random keys, a fifth of them new keys), then writes the current
view's rows to one plain Parquet file. Three queries — the sum of one column, one month of ``day`` (about
1/24 of the rows) and every column — run on each engine, one warm-up then ``--runs`` (3) runs, medians:

- pyarrow: ``t.to_arrow(columns=, filter=)``; plain: ``pyarrow.dataset`` over the file;
- DuckDB: "before" reads the view through its Arrow C stream (no projection, no filter reaches bitlake),
  "after" scans the view itself (a ``pyarrow.dataset.Dataset``: DuckDB hands ``scanner()`` its columns and
  filters); plain: ``read_parquet``;
- Polars: "before" ``polars.DataFrame(view)`` then the query, "after" ``bitlake.polars.scan(t)`` lazily;
  plain: ``polars.scan_parquet``.

It prints a markdown table of seconds and ratios (docs/benchmarks.md, "Engines: DuckDB and Polars over a view").

    .venv/bin/python benchmarks/engines.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

import bitlake
import bitlake.polars

SCHEMA = pa.schema([("k", pa.int64()), ("qty", pa.int32()), ("price", pa.float64()), ("day", pa.date32()),
                    ("flag", pa.string()), ("note", pa.string()), ("v", pa.int64())])
START, DAYS = dt.date(2020, 1, 1), 730
MONTH = (dt.date(2020, 6, 1), dt.date(2020, 7, 1))


def rows(keys: np.ndarray, version: int, rng: np.random.Generator) -> pa.Table:
    n = len(keys)
    return pa.table({
        "k": keys, "qty": pa.array(rng.integers(1, 50, n), pa.int32()), "price": rng.random(n) * 1000,
        "day": pa.array(rng.integers(0, DAYS, n) + (START - dt.date(1970, 1, 1)).days, pa.int32()).cast(pa.date32()),
        "flag": pa.array(np.array(["A", "N", "R"])[rng.integers(0, 3, n)]),
        "note": pa.array([f"note {i % 9973} of batch {version}" for i in range(n)]),
        "v": np.full(n, version, dtype=np.int64)}, schema=SCHEMA)


def build(folder: Path, n: int, batches: int) -> tuple[bitlake.Table, str]:
    rng = np.random.default_rng(42)
    t = bitlake.create_table(str(folder / "t"), SCHEMA, primary_key="k", delta_column="v")
    t.ingest(rows(np.arange(n, dtype=np.int64), 0, rng))
    top = n
    for b in range(1, batches + 1):
        size = n // 20
        new = size // 5
        keys = np.concatenate([rng.choice(top, size - new, replace=False), np.arange(top, top + new)])
        top += new
        t.ingest(rows(keys.astype(np.int64), b, rng))
    plain = str(folder / "plain.parquet")
    pq.write_table(t.to_arrow(), plain)
    return t, plain


class Stream:
    """The view through its Arrow C stream only: what DuckDB read before the view was a dataset."""

    def __init__(self, view):
        self.view = view

    def __arrow_c_stream__(self, requested_schema=None):
        return self.view.__arrow_c_stream__(requested_schema)


def queries(t: bitlake.Table, plain: str) -> dict[tuple[str, str], dict[str, Callable[[], object]]]:
    lo, hi = MONTH
    month = (pc.field("day") >= lo) & (pc.field("day") < hi)
    sql_month = f"day >= DATE '{lo}' AND day < DATE '{hi}'"
    pl_month = pl.col("day").is_between(lo, hi, closed="left")
    view = t.view()
    stream = Stream(view)
    dataset = ds.dataset(plain)
    duck = duckdb.connect()
    duck.register("after", view)
    duck.register("before", stream)
    duck.execute(f"CREATE VIEW plain AS SELECT * FROM read_parquet('{plain}')")

    def dsql(sql: str, name: str):
        return lambda: duck.sql(sql.format(name)).to_arrow_table()

    def polars_before(q):
        return lambda: q(pl.DataFrame(t.view()).lazy()).collect()

    def polars_lazy(make, q):
        return lambda: q(make()).collect()

    narrow = lambda lf: lf.select(pl.col("qty").sum())  # noqa: E731
    selective = lambda lf: lf.filter(pl_month).select(pl.col("price").sum(), pl.len())  # noqa: E731
    full = lambda lf: lf  # noqa: E731
    out: dict[tuple[str, str], dict[str, Callable[[], object]]] = {}
    for q, pa_after, pa_plain, sql, lazy in [
        ("sum(qty)", lambda: pc.sum(t.to_arrow(columns=["qty"])["qty"]),
         lambda: pc.sum(dataset.to_table(columns=["qty"])["qty"]), "SELECT sum(qty) FROM {}", narrow),
        ("one month of day", lambda: t.to_arrow(columns=["price"], filter=month),
         lambda: dataset.to_table(columns=["price"], filter=month),
         "SELECT sum(price), count(*) FROM {} WHERE " + sql_month, selective),
        ("every column", lambda: t.to_arrow(), lambda: dataset.to_table(), "SELECT * FROM {}", full),
    ]:
        out[(q, "pyarrow")] = {"after": pa_after, "plain": pa_plain}
        out[(q, "DuckDB")] = {"before": dsql(sql, "before"), "after": dsql(sql, "after"), "plain": dsql(sql, "plain")}
        out[(q, "Polars")] = {"before": polars_before(lazy),
                              "after": polars_lazy(lambda: bitlake.polars.scan(t), lazy),
                              "plain": polars_lazy(lambda: pl.scan_parquet(plain), lazy)}
    return out


def median_time(fn: Callable[[], object], runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bitlake-engines-") as folder:
        start = time.perf_counter()
        t, plain = build(Path(folder), args.rows, args.batches)
        print(f"built {t.to_arrow(columns=[]).num_rows:,} rows at version {t.version} "
              f"in {time.perf_counter() - start:.1f} s; median of {args.runs} after a warm-up (seconds)\n")
        print("| query | engine | before | after | plain Parquet | before / plain | after / plain |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for (q, engine), fns in queries(t, plain).items():
            s = {name: median_time(fn, args.runs) for name, fn in fns.items()}
            before = f"{s['before']:.3f}" if "before" in s else "—"
            ratio = f"{s['before'] / s['plain']:.1f}x" if "before" in s else "—"
            print(f"| {q} | {engine} | {before} | {s['after']:.3f} | {s['plain']:.3f} | {ratio} | "
                  f"{s['after'] / s['plain']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
