"""Probe: the key index's bottom run written with other RocksDB options. Takes the first ROWS keys of the key
store of the table benchmarks/probes/load_stream.py made (their deltas set to 0, as a load leaves them), writes
them as one SST file a way, ingests it into an empty database and looks up one key in 1,000 (sorted, as the
inline MetaGen does) three times; prints each way's SST bytes, write time and lookup cost a key.

    .venv/bin/python benchmarks/probes/index_options.py SF ROWS
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import core  # noqa: E402

from bitlake.engine.keys import keyencoding, keyindex  # noqa: E402
from bitlake.format import keystore  # noqa: E402

PK = ["l_orderkey", "l_linenumber"]


def previous_options():
    """The bottom run's options of the index's format 1: zstd level 3, 4 KB blocks, bloom filters (its values were
    18 bytes; here they are format 2's)."""
    from rocksdict import BlockBasedOptions

    options = keyindex.KeyIndex._options("upper")  # zstd at level 3
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    return options


def key_store_rows(sf: float, rows: int) -> pa.Table:
    folder = core.ROOT / "benchmarks" / "work" / "probes" / f"s{sf}" / "_bitlake" / "keystore"
    t = pa.concat_tables([pq.read_table(f) for f in sorted(glob.glob(str(folder / "**" / "*.parquet"),
                                                                          recursive=True))])
    order = keyencoding.key_order(t, PK)
    t = t if order is None else t.take(pa.array(order))
    keys = [t.column(c).to_numpy() for c in PK]
    last = np.ones(t.num_rows, dtype=bool)  # a key's latest row (a key store may hold several)
    last[:-1] = np.logical_or.reduce([k[1:] != k[:-1] for k in keys])
    t = t.filter(pa.array(last)).slice(0, rows)
    return t.set_column(t.schema.get_field_index(keystore.DELTA), keystore.DELTA,
                        pa.array(np.zeros(t.num_rows, np.int64)))


def main() -> None:
    from rocksdict import Rdict, SstFileWriter

    sf, rows = float(sys.argv[1]), int(sys.argv[2])
    table = key_store_rows(sf, rows)
    rng = np.random.default_rng(1)
    wanted = table.take(pa.array(np.sort(rng.choice(table.num_rows, table.num_rows // 1000, replace=False))))
    keys = sorted(keyencoding.encode_keys(wanted, PK))
    for name, options in [("before: zstd 3, 4 KB blocks, filters", previous_options()),
                          ("now: LZ4, 2 KB blocks, no filter", keyindex.KeyIndex._options("bottom"))]:
        folder = tempfile.mkdtemp(dir=str(core.ROOT / "benchmarks" / "work" / "probes"))
        try:
            t0 = time.perf_counter()
            writer = SstFileWriter(options=options)
            writer.open(os.path.join(folder, "run.sst"))
            for start in range(0, table.num_rows, 200_000):
                chunk = table.slice(start, 200_000)
                for k, v in zip(keyencoding.encode_keys(chunk, PK), keyencoding.encode_values(chunk), strict=True):
                    writer[k] = v
            writer.finish()
            written = time.perf_counter() - t0
            size = os.path.getsize(os.path.join(folder, "run.sst"))
            db = Rdict(os.path.join(folder, "db"), keyindex.KeyIndex._options())
            db.ingest_external_file([os.path.join(folder, "run.sst")])
            costs = []
            for _ in range(3):
                t0 = time.perf_counter()
                assert all(v is not None for v in db[keys])
                costs.append((time.perf_counter() - t0) / len(keys) * 1e6)
            db.close()
            print(f"{name}: {size / 1e6:.1f} MB, written in {written:.1f} s, lookups "
                  f"{' / '.join(f'{c:.2f}' for c in costs)} us a key ({len(keys):,} keys)", flush=True)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
