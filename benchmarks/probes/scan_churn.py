"""Probe: the Spark current-view scan of a churned table, bitlake's row filter against the left-anti join it falls
back to, against plain Spark over the same data files (invalid rows included). The table is the peers benchmark's
at scale factor SF (load, 0.1 % / 1 % / 10 % upserts, a 0.1 % delete, as bitlake-arrow ingests them), built under
benchmarks/work/probes/churn-sfSF on the first run. One warm-up each, then RUNS interleaved rounds; medians.

    .venv/bin/python benchmarks/probes/scan_churn.py SF [RUNS]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import core  # noqa: E402
import peers  # noqa: E402

import bitlake  # noqa: E402
from bitlake.spark import reader  # noqa: E402


def main() -> None:
    sf, runs = float(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3
    folder = core.ROOT / "benchmarks" / "work" / "probes" / f"churn-sf{sf}"
    if not (folder / "spec.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        spec = peers.prepare(sf, folder, False)
        system = peers.Bitlake("bitlake-arrow", folder, pq.read_schema(spec["ops"][0]["file"]))
        for op in spec["ops"]:
            getattr(system, op["operation"])(op["file"], op["k"])
    spec = json.loads((folder / "spec.json").read_text())
    system = peers.Bitlake("bitlake-arrow", folder, pq.read_schema(spec["ops"][0]["file"]))
    system.table = bitlake.open_table(str(folder / "table"))

    def joined(selective: bool) -> dict:
        limit, reader.FILTER_MAX_BYTES = reader.FILTER_MAX_BYTES, -1  # the fallback: no row filter
        try:
            return system.scan(selective)
        finally:
            reader.FILTER_MAX_BYTES = limit

    ways = {"plain": system.plain_scan, "row filter": system.scan, "join": joined}
    for name, scan in ways.items():
        print(name, scan(False), flush=True)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(runs):
        for name, scan in ways.items():
            t0 = time.perf_counter()
            scan(False)
            times[name].append(time.perf_counter() - t0)
    plain = statistics.median(times["plain"])
    for name, runs_s in times.items():
        median = statistics.median(runs_s)
        print(f"{name}: median {median:.2f} s ({', '.join(f'{x:.2f}' for x in runs_s)}), {median / plain:.2f}x plain")


if __name__ == "__main__":
    main()
