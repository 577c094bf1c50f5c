"""What making every local file durable costs (docs/benchmarks.md, "Durability (fsync) cost"): the peers benchmark's
bitlake workload (load, 0.1/1/10 % upserts, 0.1 % delete; no scans) run ROUNDS times with fsync on and off
(BITLAKE_FSYNC), alternating, in one process; the time inside fsync from a log every process writes.

    PYTHONPATH=benchmarks/fsynclog .venv/bin/python benchmarks/fsync_cost.py SF ROUNDS    (make bench-fsync)
"""

import json
import os
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import peers  # noqa: E402


def main(sf: float, rounds: int) -> None:
    for k, v in (("BITLAKE_DRIVER_MEMORY", "8g"), ("BITLAKE_SHUFFLE_PARTITIONS", "16"),
                 ("BITLAKE_SPARK_MASTER", "local[2]")):
        os.environ.setdefault(k, v)
    work = peers.WORK_DIR / f"sf{peers.sf_text(sf)}"
    spec = peers.prepare_apart(sf, work, quick=False)
    spec["scans"] = False
    (work / "spec.json").write_text(json.dumps(spec, indent=1))
    log = work / "fsync.log"
    os.environ["BITLAKE_FSYNC_LOG"] = str(log)
    rows = {}  # (op, fraction) -> "1"/"0" -> [(wall, fsync calls, seconds in fsync, files written)]
    for r in range(rounds):
        for fsync in ("1", "0") if r % 2 == 0 else ("0", "1"):
            os.environ["BITLAKE_FSYNC"] = fsync
            log.unlink(missing_ok=True)
            recs = [x for x in peers.run_system("bitlake", spec, work / "bitlake", 900) if x["operation"] != "storage"]
            lines = [ln.split() for ln in log.read_text().splitlines()] if log.exists() else []
            ends = [float(t) for pid, what, t, _ in lines if what == "sync" and int(pid) != os.getpid()]
            for i, rec in enumerate(recs):
                lo, hi = ends[i - 1] if i else 0.0, ends[i] if i < len(ends) else float("inf")
                calls = [float(d) for _, what, t, d in lines if what == "fsync" and lo < float(t) <= hi]
                wall = rec["error"] or round(rec["wall_s"], 3)
                rows.setdefault((rec["operation"], rec["batch_fraction"]), {}).setdefault(fsync, []).append(
                    (wall, len(calls), round(sum(calls), 3), rec.get("files_written")))
    print(json.dumps([[op, fr, v] for (op, fr), v in rows.items()]))
    for (op, fr), v in rows.items():
        on, off = statistics.median(x[0] for x in v["1"]), statistics.median(x[0] for x in v["0"])
        print(f"{op} {peers.fraction_text(fr)}: fsync {on:.2f} s, no fsync {off:.2f} s, ratio {on / off:.2f}; "
              f"{statistics.median(x[1] for x in v['1']):.0f} fsync calls, "
              f"{statistics.median(x[2] for x in v['1']):.3f} s in them; {v['1'][0][3]} files")


if __name__ == "__main__":
    main(float(sys.argv[1]), int(sys.argv[2]))
