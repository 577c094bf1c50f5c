"""Put on PYTHONPATH by benchmarks/fsync_cost.py: with BITLAKE_FSYNC_LOG set, every process (the benchmark worker and
Spark's Python workers) logs each os.fsync and os.sync call with its duration."""

import os
import time

if os.environ.get("BITLAKE_FSYNC_LOG"):  # "<pid> fsync|sync <end time> <seconds>" per call, from every process
    _fsync, _sync, _log = os.fsync, os.sync, os.environ["BITLAKE_FSYNC_LOG"]

    def _write(what, t0):
        t1 = time.time()
        fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{os.getpid()} {what} {t1:.6f} {t1 - t0:.6f}\n".encode())
        finally:
            os.close(fd)

    def fsync(fd):
        t0 = time.time()
        try:
            return _fsync(fd)
        finally:
            _write("fsync", t0)

    def sync():
        t0 = time.time()
        try:
            return _sync()
        finally:
            _write("sync", t0)

    os.fsync, os.sync = fsync, sync
