"""Probe: what a snapshot being a value costs. A table's snapshot after PARTS batches and as many data files takes
one ingest commit (``TableState.applied``: each container the commit changes is copied once), against the same
commit applied in place to plain dicts and lists (what the mutable state did before snapshots were values), and
a replay of 20 commits at once (a refresh after 20 commits, a load from a checkpoint). Medians of 7 runs.

    .venv/bin/python benchmarks/probes/snapshot.py [PARTS ...]
"""

from __future__ import annotations

import functools
import statistics
import sys
import time

import pyarrow as pa

from bitlake.format.commit import (
    INGEST,
    LIVE,
    BatchRecord,
    BucketFile,
    Commit,
    DataFile,
    LogFile,
    SegmentRows,
    SegmentState,
)
from bitlake.format.metadata import TableMetadata
from bitlake.format.protocol import Protocol
from bitlake.format.state import BatchState, TableState


def table_state(n: int) -> TableState:
    meta = TableMetadata(schema=pa.schema([("k", pa.int64()), ("d", pa.int64())]), primary_key=("k",),
                         delta_column="d")
    parts = {p: BatchState(f"b{p}", p, LIVE, 10, (), p, p) for p in range(1, n + 1)}
    files = {f"data/{p}.parquet": DataFile(f"data/{p}.parquet", 10, 100, None, (SegmentRows(p, 0, 10),))
             for p in range(1, n + 1)}
    segments = {(p, 0): SegmentState(p, 0, 10, 10, None, 10) for p in range(1, n + 1)}
    keystore = {b: [BucketFile(b, f"ks/{b}-{i}", 10, 10, i == 0) for i in range(8)] for b in range(16)}
    logs = [(p, LogFile(f"log/{p}", 1, 1, 0, 0)) for p in range(1, min(n, 2000) + 1)]
    return TableState(Protocol(), meta, n, 0, parts, {f"b{p}": p for p in parts}, files, segments, keystore, logs,
                      max_part=n)


def ingest_commit(version: int) -> Commit:
    p = version
    return Commit(version, INGEST, 0, batches=(BatchRecord(f"x{p}", p, LIVE, 10, ()),),
                  add_files=(DataFile(f"data/n{p}", 10, 100, None, (SegmentRows(p, 0, 10),)),),
                  segments=(SegmentState(p, 0, 10, 10, None, 10),), logs=(LogFile(f"log/n{p}", 1, 1, 0, 0),),
                  keystore_add=(BucketFile(3, f"ks/s{p}", 1, 1, False),))


def in_place(parts: dict, files: dict, segments: dict, logs: list, c: Commit) -> None:
    """The commit applied to plain containers, as a mutable state applies it."""
    for b in c.batches:
        parts[b.part] = b
    for f in c.add_files:
        files[f.path] = f
    for s in c.segments:
        segments[s.segment] = s
    logs.extend((c.version, f) for f in c.logs)


def median_ms(fn, runs: int = 7) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    print("| batches and data files | applied(1 commit) ms | in place ms | 20 commits in one replay ms |")
    print("| --- | --- | --- | --- |")
    for n in [int(a) for a in sys.argv[1:]] or [1_000, 10_000, 100_000]:
        state = table_state(n)
        one = ingest_commit(n + 1)
        twenty = [ingest_commit(n + 1 + i) for i in range(20)]
        plain = dict(state.parts), dict(state.files), dict(state.segments), list(state.logs)
        applied = median_ms(functools.partial(state.applied, one))
        mutated = median_ms(functools.partial(in_place, *plain, one))
        replay = median_ms(functools.partial(state.applied, *twenty))
        print(f"| {n:,} | {applied:.2f} | {mutated:.4f} | {replay:.2f} |")


if __name__ == "__main__":
    main()
