"""Probe: finding a batch's keys in a key-store file held in memory, numpy's binary search against
bitlake.format.order.SortedSearch (each wanted key bisected, ``find``, or the file's keys searched among the
wanted, ``find_sorted``), on the packed keys of TABLE's bucket 0 base file: random keys of the file, new
ones each run (so that no run finds the lines an earlier one left in the CPU's caches), medians of 7 runs.

    .venv/bin/python benchmarks/probes/keysearch.py TABLE
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import bitlake
from bitlake.engine.keys.keyencoding import int64_values
from bitlake.format import keystore, order


def main() -> None:
    t = bitlake.open_table(sys.argv[1])
    state = t.state()
    files = state.keystore[0]
    pk = list(state.metadata.primary_key)
    rows = keystore.read_file(t.io, files[0], state.metadata, columns=pk)
    columns = [int64_values(rows.column(c)) for c in pk]  # keys of fixed width only
    values = order.pack(columns, order.key_spans(columns))
    t0 = time.perf_counter()
    search = order.SortedSearch(values)
    print(f"{len(values):,} keys; the search's table built in {time.perf_counter() - t0:.3f} s, "
          f"{search.nbytes / len(values):.2f} bytes a key")
    rng = np.random.default_rng(7)
    for k in (len(values) // 1000, len(values) // 100, len(values) // 10, len(values) // 2, len(values)):
        for name, find in (("np.searchsorted", lambda q: np.searchsorted(values, q)), ("SortedSearch", search.find),
                           ("SortedSearch.find_sorted", search.find_sorted)):
            runs = []
            for _ in range(7):
                wanted = np.sort(values[rng.choice(len(values), k, replace=False)])
                t0 = time.perf_counter()
                find(wanted)
                runs.append(time.perf_counter() - t0)
            print(f"{k:,} keys, {name}: {statistics.median(runs) / k * 1e9:.0f} ns a key")


if __name__ == "__main__":
    main()
