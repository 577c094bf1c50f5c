"""The console's page times on a table of many commits (docs/console.md; docs/benchmarks.md, "Console page times").

It builds a keyed table of ``--commits`` (10,000) small ingests, one data file each (or takes ``--table``, a
table built so before), then requests each console page of it three times through the service's app in
process (FastAPI's TestClient: no network), and prints the median times as a markdown table.

    .venv/bin/python benchmarks/console.py                      # builds the table: about 13 minutes
    .venv/bin/python benchmarks/console.py --table /tmp/t10k    # an existing one
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa

import bitlake

SCHEMA = pa.schema([("k", pa.int64()), ("grp", pa.string()), ("value", pa.int64()), ("mod", pa.int64())])


def build(path: str, commits: int) -> bitlake.Table:
    t = bitlake.create_table(path, SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2)
    for i in range(commits):  # an update of one of 500 keys and a new key each
        keys = [i % 500, 1000 + i]
        t.ingest(pa.table({"k": keys, "grp": [f"g{k % 3}" for k in keys], "value": [i, i], "mod": [10 + i] * 2},
                          schema=SCHEMA), batch_id=f"b{i}")
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=10_000)
    parser.add_argument("--table", help="an existing table to measure (built by this script before)")
    args = parser.parse_args()
    from fastapi.testclient import TestClient

    from bitlake.triggers import TriggerConfig, create_app

    with tempfile.TemporaryDirectory(prefix="bitlake-console-") as folder:
        path = args.table
        if path is None:
            os.environ.setdefault("BITLAKE_FSYNC", "0")  # the build only: the pages read
            path = str(Path(folder) / "t")
            start = time.perf_counter()
            build(path, args.commits)
            print(f"built {args.commits:,} commits in {time.perf_counter() - start:.0f} s")
        table = bitlake.open_table(path)
        root = str(Path(path).parent)
        app = create_app(TriggerConfig(db_url=f"sqlite:///{folder}/service.db"), console=[root])
        token = app.state.store.create_token("consumer", ["*"])
        p = quote(path, safe="")
        pages = {"lake": "/", "table (timeline page 1)": f"/console/table?path={p}",
                 "table (timeline page 200)": f"/console/table?path={p}&page=200",
                 "change feed (last 10 versions)": f"/console/changes?path={p}",
                 "past view": f"/console/view?path={p}", "events": f"/console/events?path={p}",
                 "maintain dry run": f"/console/action?path={p}&name=maintain"}
        print(f"\n{table.version:,} commits, {len(table.state().data_files()):,} data files; "
              f"load {os.getloadavg()[0]:.1f}; median of 3 requests, seconds\n")
        print("| page | seconds | bytes |")
        print("| --- | --- | --- |")
        with TestClient(app) as client:
            for name, url in pages.items():
                times = []
                for _ in range(3):
                    start = time.perf_counter()
                    r = client.get(url, headers={"Authorization": f"Bearer {token}"})
                    times.append(time.perf_counter() - start)
                    r.raise_for_status()
                print(f"| {name} | {statistics.median(times):.2f} | {len(r.content):,} |", flush=True)


if __name__ == "__main__":
    main()
