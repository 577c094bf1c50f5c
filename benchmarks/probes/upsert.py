"""Probe: an upsert of a random fraction of lineitem's rows (sampled from random row groups, delta = SEED) into
the table benchmarks/probes/load_stream.py made; prints the wall time and a profile.

    .venv/bin/python benchmarks/probes/upsert.py SF FRACTION SEED
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import core  # noqa: E402

import bitlake  # noqa: E402


def batch(source: pq.ParquetFile, schema: pa.Schema, fraction: float, seed: int) -> pa.Table:
    """``fraction`` of the source's rows, sampled from random row groups, as the table stores them, delta ``seed``."""
    rng = np.random.default_rng(seed)
    n = int(source.metadata.num_rows * fraction)
    groups = rng.choice(source.metadata.num_row_groups, min(source.metadata.num_row_groups, max(1, n // 2000)),
                        replace=False)
    raw = source.read_row_groups(sorted(groups.tolist()))
    raw = pa.Table.from_arrays([c.cast(f.type) for c, f in zip(raw.columns, schema, strict=False)],
                               schema=pa.schema(list(schema)[:-1]))
    raw = raw.take(pa.array(rng.choice(raw.num_rows, min(n, raw.num_rows), replace=False)))
    return raw.append_column(schema.field(core.DELTA), pa.array(np.full(raw.num_rows, seed, np.int32)))


def main() -> None:
    sf, fraction, seed = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    source = pq.ParquetFile(core.lineitem(sf))
    changes = batch(source, core.table_schema(source.schema_arrow), fraction, seed)
    t = bitlake.open_table(str(core.ROOT / "benchmarks" / "work" / "probes" / f"s{sf}"))
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    r = t.ingest(changes, batch_id=f"u{seed}-{fraction}")
    profile.disable()
    print("upsert", sf, fraction, changes.num_rows, round(time.perf_counter() - t0, 3), r.counts, flush=True)
    pstats.Stats(profile).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
