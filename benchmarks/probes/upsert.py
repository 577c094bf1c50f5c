"""Probe: an upsert of a random fraction of lineitem's rows (sampled from random row groups, or with ``uniform``
uniformly from all rows as the peers benchmark does; delta = SEED) into the table benchmarks/probes/load_stream.py
made; prints the wall time, the process's CPU time, the time of the inline MetaGen's steps and a profile of the
calling thread.

    .venv/bin/python benchmarks/probes/upsert.py SF FRACTION SEED [uniform] [warm]

``warm`` reads every key-store file into the process's memory first (bitlake/engine/keys/keycache.py), as a writer
holds them after a load or a scan; BITLAKE_KEYSTORE_CACHE_BYTES=0 keeps nothing there.
"""

from __future__ import annotations

import cProfile
import os
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


def uniform_batch(source: pq.ParquetFile, schema: pa.Schema, fraction: float, seed: int) -> pa.Table:
    """``fraction`` of the source's rows drawn uniformly, shuffled, as the table stores them, delta ``seed``."""
    rng = np.random.default_rng(seed)
    meta = source.metadata
    wanted = np.sort(rng.choice(meta.num_rows, int(meta.num_rows * fraction), replace=False))
    starts = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
    group_of = np.searchsorted(starts, wanted, side="right") - 1
    columns = pa.schema(list(schema)[:-1])
    parts = []
    for g in np.unique(group_of).tolist():
        raw = source.read_row_group(g)
        raw = pa.Table.from_arrays([c.cast(f.type) for c, f in zip(raw.columns, columns, strict=False)],
                                   schema=columns)
        parts.append(raw.take(pa.array(wanted[group_of == g] - starts[g])))
    raw = pa.concat_tables(parts)
    raw = raw.take(pa.array(rng.permutation(raw.num_rows)))
    return raw.append_column(schema.field(core.DELTA), pa.array(np.full(raw.num_rows, seed, np.int32)))


def metagen_steps() -> list[tuple[object, str, str]]:
    """The inline MetaGen's steps, for :class:`core.PhaseTimer`."""
    from bitlake import batches
    from bitlake.engine.keys import keyencoding, keyindex
    from bitlake.engine.write import metagen
    from bitlake.format import keystore

    return [(batches, "land", "landing"), (metagen, "run_inline", "metagen"),
            (keyencoding, "key_codes", "key codes"), (keyindex.KeyIndex, "lookup", "lookups"),
            (metagen, "scan_keystore", "key-store scan"), (metagen, "fold", "fold"),
            (keystore, "write_bucket_files", "key-store files"), (metagen, "write_segments", "segment log and bitmaps")]


def main() -> None:
    sf, fraction, seed = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    source = pq.ParquetFile(core.lineitem(sf))
    sample = uniform_batch if "uniform" in sys.argv[4:] else batch
    changes = sample(source, core.table_schema(source.schema_arrow), fraction, seed)
    t = bitlake.open_table(str(core.ROOT / "benchmarks" / "work" / "probes" / f"s{sf}"))
    if "warm" in sys.argv[4:]:
        from bitlake.engine.keys import keycache
        from bitlake.pool import thread_map

        state = t.state()
        files = [f for fs in state.keystore.values() for f in fs]
        t0 = time.perf_counter()
        thread_map(lambda f: keycache.CACHE.entries(t.io, f, state.metadata), files)
        print("warm:", len(files), "key-store files,", sum(f.rows for f in files), "rows,",
              keycache.CACHE.held >> 20, "MB held, in", round(time.perf_counter() - t0, 2), "s", flush=True)
    profile = cProfile.Profile()
    with core.PhaseTimer().installed(metagen_steps()) as steps:
        t0, c0 = time.perf_counter(), os.times()
        profile.enable()
        r = t.ingest(changes, batch_id=f"u{seed}-{fraction}")
        profile.disable()
        wall, c1 = time.perf_counter() - t0, os.times()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    print("upsert", sf, fraction, changes.num_rows, round(wall, 3), r.counts, flush=True)
    print(f"process CPU {cpu:.2f} s: {cpu / wall:.2f} cores busy on average", flush=True)
    print("steps (wall s):", ", ".join(f"{k} {v:.3f}" for k, v in steps.take().items()), flush=True)
    pstats.Stats(profile).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
