"""Probe: TPC-H lineitem of scale factor SF loaded into a new keyed table by ``t.ingest(arrow_table)``, with a
timeline of the ingestion's steps (landing, the groups, each fold, the key-index staging, the key-store files,
the segment states, the key index after the commit) and the peak RSS.

    .venv/bin/python benchmarks/probes/load_phases.py SF
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import core  # noqa: E402

import bitlake  # noqa: E402
from bitlake.engine.keys import indexsession, keyindex  # noqa: E402
from bitlake.engine.write import landing, metagen  # noqa: E402
from bitlake.format import keystore  # noqa: E402

STEPS = [(landing, "land_local"), (metagen, "run_inline"), (metagen, "_groups"), (metagen, "_run_spilled"),
         (metagen, "fold_records"), (metagen, "key_codes"), (metagen, "fold"), (keyindex.KeyIndex, "stage"),
         (keystore, "write_bucket_files"), (metagen, "write_segments"), (indexsession.IndexSession, "after_commit"),
         (keyindex.KeyIndex, "_ingest_sorted"), (keyindex, "key_order"), (keyindex._SstWriting, "start_processes"),
         (keyindex._SstWriting, "wait"), (keyindex.KeyIndex, "commit_staged")]


def timed(steps: list[tuple[float, float, str]], clock: list[float]):
    def install(owner, name):
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                steps.append((start - clock[0], time.perf_counter() - start, name))

        setattr(owner, name, wrapper)

    for owner, name in STEPS:
        if hasattr(owner, name):
            install(owner, name)


def main() -> None:
    sf = float(sys.argv[1])
    steps: list[tuple[float, float, str]] = []
    clock = [0.0]
    timed(steps, clock)
    t0 = time.perf_counter()
    data = pq.read_table(core.lineitem(sf))
    schema = core.table_schema(data.schema)
    data = data.append_column(core.DELTA, pa.array(np.zeros(data.num_rows, np.int32))).cast(schema)
    print(f"read {time.perf_counter() - t0:.2f} s")
    path = core.ROOT / "benchmarks" / "work" / "probes" / f"phases-{sf:g}"
    shutil.rmtree(path, ignore_errors=True)
    t = bitlake.create_table(str(path), schema, primary_key=core.PRIMARY_KEY, delta_column=core.DELTA,
                             num_buckets=16)
    cpu = os.times()
    clock[0] = time.perf_counter()
    r = t.ingest(data, batch_id="load")
    print(f"ingest {time.perf_counter() - clock[0]:.2f} s, {r.counts}")
    settled = time.perf_counter()
    indexsession.flush_idle()  # the key index's update after the commit, before the folder goes
    print(f"after {time.perf_counter() - settled:.2f} s")
    spent = [b - a for a, b in zip(cpu, os.times(), strict=True)]
    print(f"CPU of the ingest and after: {spent[0] + spent[1]:.2f} s in this process, "
          f"{spent[2] + spent[3]:.2f} s in its children")
    for start, took, name in sorted(steps):
        print(f"  {start:7.2f} +{took:6.2f}  {name}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.1f} GB")
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
