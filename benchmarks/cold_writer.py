"""Small batches from a new process each (an Airflow task, a cron job) against one long-lived writer.

The peers' workload (benchmarks/peers.py: TPC-H lineitem, 16 buckets) loaded from its Arrow stream and its three
upserts ingested, in this process; then deletes of 0.1 % random keys, each once in this process (the writer that
loaded the table: its key-store cache holds what it wrote) and once on a copy of the table in a new process that
imports bitlake, opens the table and ingests the batch (its key store not in memory: the key index answers the
lookups), one after the other on the same copy. The new process's import and open are timed apart from its
ingest. Time, not memory: run it on a quiet machine and compare its figures with each other, not across runs.
``BITLAKE_COLD_KEEP=1`` keeps its folder (``benchmarks/work/bitlake-cold-*``: the tables and the batches) to profile.

    .venv/bin/python benchmarks/cold_writer.py --scale-factor 1 [--batches 4]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core  # noqa: E402  (benchmarks/ is not a package)
import peers  # noqa: E402


def one(table: str, batch: str) -> None:
    """In a new process: import, open, ingest ``batch`` (keys, delta and an op column); prints the timings."""
    t0 = time.perf_counter()
    import bitlake
    from bitlake.engine.keys.indexsession import join_updates

    t1 = time.perf_counter()
    t = bitlake.open_table(table)
    keys = pq.read_table(batch)
    t2 = time.perf_counter()
    t.ingest(keys, op_column="op")
    t3 = time.perf_counter()
    join_updates()
    after = time.perf_counter() - t3
    print(json.dumps({"import_s": t1 - t0, "open_s": t2 - t1, "ingest_s": t3 - t2, "after_s": after}))


def delete_batches(base_file: str, count: int, folder: Path) -> list[str]:
    """``count`` batches of 0.1 % random keys of the base (the peers' delete batch, ``peers.PeerChanges.delete``), as
    delete records of a delta above every upsert's."""
    maker = peers.PeerChanges(peers.BaseFile(Path(base_file)), seed=20261202)
    paths = []
    for i in range(count):
        keys, _ = maker.delete(100 + i, peers.DELETE_FRACTION)
        path = folder / f"delete-{i}.parquet"
        pq.write_table(keys.append_column("op", pa.array(["delete"] * keys.num_rows, pa.string())), path)
        paths.append(str(path))
    return paths


def measure(sf: float, count: int) -> dict:
    import bitlake
    from bitlake.engine.keys.indexsession import flush_idle, join_updates

    parent = Path(__file__).resolve().parent / "work"
    parent.mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bitlake-cold-", dir=parent))
    try:
        spec = peers.prepare(sf, work, quick=False)
        base = next(op["file"] for op in spec["ops"] if op["operation"] == "load")
        table = str(work / "table")
        t = bitlake.create_table(table, pq.read_schema(base), primary_key=peers.PRIMARY_KEY, delta_column=peers.DELTA,
                                 num_buckets=16)
        t.ingest(peers.file_stream(base))
        for op in spec["ops"]:
            if op["operation"] == "upsert":
                t.ingest(pq.read_table(op["file"]))
        flush_idle()  # the index's entries still in memory written, so that the copy's index is whole
        copy = str(work / "copy")
        shutil.copytree(table, copy)
        batches = delete_batches(base, count, work)
        warm, cold = [], []
        for path in batches:
            keys = pq.read_table(path)
            t0 = time.perf_counter()
            t.ingest(keys, op_column="op")
            warm.append(time.perf_counter() - t0)
            join_updates()
        env = dict(os.environ, PYTHONPATH=str(Path(bitlake.__file__).resolve().parent.parent))  # this bitlake
        for path in batches:
            out = subprocess.run([sys.executable, __file__, "--one", copy, path], env=env, check=True,
                                 capture_output=True, text=True).stdout
            cold.append(json.loads(out.strip().splitlines()[-1]))
        return {"sf": sf, "rows": spec["base_rows"], "keys": pq.read_metadata(batches[0]).num_rows, "warm": warm,
                "cold": cold}
    finally:
        if not os.environ.get("BITLAKE_COLD_KEEP"):
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale-factor", type=float, default=1.0)
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--one", nargs=2, metavar=("TABLE", "BATCH"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        one(*args.one)
        return
    m = measure(args.scale_factor, args.batches)

    def cells(values: list[float]) -> str:
        return " / ".join(f"{v:.3f}" for v in values)

    cold = m["cold"]
    print(f"SF {core.sf_text(m['sf'])} ({m['rows']:,} rows), deletes of {m['keys']:,} keys each:")
    print(f"  in the writer that loaded the table: {cells(m['warm'])} s")
    print(f"  each in a new process: ingest {cells([c['ingest_s'] for c in cold])} s "
          f"(+ the key index's update after it {cells([c['after_s'] for c in cold])} s; before it, importing bitlake "
          f"{cells([c['import_s'] for c in cold])} s, opening the table and reading the batch "
          f"{cells([c['open_s'] for c in cold])} s)")


if __name__ == "__main__":
    main()
