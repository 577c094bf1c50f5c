"""Probe: the inline MetaGen's key-store scan (``metagen.scan_keystore``) for the keys of a random FRACTION of
lineitem's row groups, on the table benchmarks/probes/load_stream.py made (and upsert.py changed): the scan as
it runs (binary search in each key-store file), then with hash joins instead, in one process, each from a cache
of its own (the files read and decoded in both); prints both wall
times and whether they found the same entries.

    .venv/bin/python benchmarks/probes/scan_keystore.py SF FRACTION SEED
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import core  # noqa: E402

import bitlake  # noqa: E402
from bitlake.engine.keys import keycache  # noqa: E402
from bitlake.engine.write import metagen  # noqa: E402
from bitlake.format import datafile, keystore  # noqa: E402


def main() -> None:
    sf, fraction, seed = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    t = bitlake.open_table(str(core.ROOT / "benchmarks" / "work" / "probes" / f"s{sf}"))
    state = t.state()
    meta, pk = state.metadata, list(state.metadata.primary_key)
    source = pq.ParquetFile(core.lineitem(sf))
    rng = np.random.default_rng(seed)
    groups = rng.choice(source.metadata.num_row_groups, max(1, int(source.metadata.num_row_groups * fraction)),
                        replace=False)
    keys = source.read_row_groups(sorted(groups.tolist()), columns=pk)
    keys = pa.table([c.cast(meta.schema.field(n).type) for n, c in zip(pk, keys.columns, strict=True)], names=pk)
    n = keys.num_rows
    rows = datafile.keys_rows(keys, meta, np.zeros(n, np.int64), np.arange(n, dtype=np.int64), False)
    distinct = rows.select([*pk, keystore.BUCKET])
    buckets = sorted(set(distinct.column(keystore.BUCKET).to_pylist()))
    stored = sum(f.rows for b in buckets for f in state.keystore.get(b, []))
    t0 = time.perf_counter()
    searched = metagen.scan_keystore(t.io, state, distinct, buckets)
    t1 = time.perf_counter()
    # Again from a cache of its own, each file held as its rows, which keycache.Entries matches by a hash join.
    keycache.CACHE = keycache.KeyStoreCache(keycache.CACHE.budget)
    keycache.fixed_width = lambda table, primary_key: False
    joined = metagen.scan_keystore(t.io, state, distinct, buckets)
    t2 = time.perf_counter()
    same = all(np.array_equal(a, b) for a, b in zip(searched, joined, strict=True))
    print(f"{n:,} keys, {stored:,} key-store rows: binary search {t1 - t0:.2f} s, hash join {t2 - t1:.2f} s, "
          f"same entries: {same}, found {int(searched[0].sum()):,}")


if __name__ == "__main__":
    main()
