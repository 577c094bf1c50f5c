"""Spark SQL over a bitlake table by name, against Spark over plain Parquet of the same rows and the Python data
source (docs/benchmarks.md, "Spark SQL by name").

The table is the synthetic one of benchmarks/engines.py (``--rows`` rows, default 2,000,000, then ``--batches``
(3) upsert batches of 5 % of the rows each); the current view's rows are also written as one plain Parquet file.
Three queries — the sum of one column, one month of ``day``, every column (``count`` of a full scan that
reads every column: the sum of ``hash(*)``) — run on:

- **by name**: ``spark.sql("... FROM t")`` with ``t`` created ``USING bitlake LOCATION`` (bitlake's session
  extension: Spark's Parquet scans of the plan's files, pruned and filtered by Spark);
- **plain**: ``spark.read.parquet(<plain file>)`` as a temporary view;
- **to_spark**: ``Table.to_spark()`` as a temporary view (the same Spark plan, built in Python);
- **Python data source**: bitlake's PySpark data source, which reads the view's files in Python tasks, registered
  under a second name, ``bitlake_python``, that the session extension leaves to it (``format("bitlake")`` read
  this way before the extension).

Each query builds its DataFrame anew (planning included), one warm-up then ``--runs`` (3) runs, medians, in
seconds; the table is printed as markdown.

    .venv/bin/python benchmarks/spark_sql.py
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import engines  # noqa: E402  (benchmarks/ is not a package)

import bitlake  # noqa: E402
from bitlake.datasource import BitlakeDataSource  # noqa: E402


class PythonOnly(BitlakeDataSource):
    """bitlake's Python data source under another name, which the session extension does not take over."""

    @classmethod
    def name(cls) -> str:
        return "bitlake_python"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    spark = bitlake.spark_session()
    spark.dataSource.register(PythonOnly)
    with tempfile.TemporaryDirectory(prefix="bitlake-spark-sql-") as folder:
        start = time.perf_counter()
        t, plain = engines.build(Path(folder), args.rows, args.batches)
        print(f"load average {os.getloadavg()[0]:.1f}; built {t.to_arrow(columns=[]).num_rows:,} rows at version "
              f"{t.version} in {time.perf_counter() - start:.1f} s; median of {args.runs} after a warm-up (seconds)\n")
        spark.sql(f"CREATE TABLE t USING bitlake LOCATION '{t.path}'")
        lo, hi = engines.MONTH
        def view(df: Callable[[], object]) -> Callable[[], str]:
            def name() -> str:
                df().createOrReplaceTempView("q")
                return "q"
            return name

        sources: dict[str, Callable[[], str]] = {
            "by name": lambda: "t",
            "plain Parquet": view(lambda: spark.read.parquet(plain)),
            "to_spark": view(lambda: t.to_spark(spark)),
            "Python data source": view(lambda: spark.read.format("bitlake_python").load(t.path)),
        }
        queries = {
            "sum(qty)": "SELECT sum(qty) FROM {}",
            "one month: sum(price), count(*)": f"SELECT sum(price), count(*) FROM {{}} WHERE day >= DATE '{lo}' "
                                               f"AND day < DATE '{hi}'",
            "every column": "SELECT sum(CAST(hash(*) AS BIGINT)), count(*) FROM {}",
        }
        check = {}
        print("| query | by name | plain Parquet | to_spark | Python data source | by name / plain | to_spark / plain "
              "| Python / plain |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for q, sql in queries.items():
            s = {}
            for source, name in sources.items():
                def run(name=name, sql=sql):
                    return tuple(spark.sql(sql.format(name())).collect()[0])
                check[source] = run()
                s[source] = engines.median_time(run, args.runs)
            for got in check.values():  # a float sum depends on the order of its terms
                assert all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(got, check["plain Parquet"], strict=True)
                           ), (q, check)
            p = s["plain Parquet"]
            print(f"| {q} | {s['by name']:.3f} | {p:.3f} | {s['to_spark']:.3f} | {s['Python data source']:.3f} | "
                  f"{s['by name'] / p:.2f}x | {s['to_spark'] / p:.2f}x | {s['Python data source'] / p:.2f}x |",
                  flush=True)
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
