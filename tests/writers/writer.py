"""A writer process for the concurrency and crash tests.

Usage: ``python writer.py SPEC.json``. The spec is a JSON object:

* ``table``: the table path; ``ack``: a file that gets one JSON line per finished step;
* ``ready`` / ``go`` (optional): after it is warmed up the writer creates ``ready`` and waits for ``go``
  to exist, so that several writers start committing at the same moment;
* ``steps``, each one of:

  - ``{"op": "ingest", "batch_id": ..., "rows": [[id, v, mod, op], ...], "metagen": bool}``;
  - ``{"op": "metagen", "expect_visible": [batch ids]}``;
  - ``{"op": "compact", "target_file_bytes": n, "major": bool, "look_back": ...}``;
  - ``{"op": "revert", "batch_id": ...}``: ``Table.revert_batch``;
  - ``{"op": "replace", "batch_id": ..., "rows": [[id, v, mod, op], ...]}``: ``Table.replace_batch`` with
    ``op_column="op"``, as ingest;
  - ``{"op": "tombstone", "column": ..., "values": [...]}``: ``Table.tombstone`` (the ack's ``version`` is
    the tombstone's commit);
  - ``{"op": "vacuum"}``: ``Table.vacuum`` (the ack's ``version`` is its commit, or null).

An ingest, metagen or compact step with ``"driver": true`` runs without Spark (Arrow input landed and its
MetaGen run on the driver). A writer starts a SparkSession only when a step takes one: a writer that only
restates (revert, replace, tombstone, vacuum: work in the driver) or runs driver steps starts in a second or
two.

An ack line is written (and fsynced) only after the step returned, so a writer killed by a crash
point never acknowledges the step it died in.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time

import pyarrow as pa

import bitlake
from bitlake.transaction import Transaction

LOST_RACES = [0]


def _counting_publish(self, attempt, _publish=Transaction._publish):
    """Transaction._publish, counting the commits this writer lost to another (reported in the acks)."""
    landed = _publish(self, attempt)
    LOST_RACES[0] += not landed
    return landed


Transaction._publish = _counting_publish

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("mod", pa.int64()), ("op", pa.string())])


def batch_table(rows: list[list]) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in rows], schema=SCHEMA)


SPARK_OPS = ("ingest", "metagen", "compact")


def main(spec_path: str) -> None:
    faulthandler.register(signal.SIGUSR1)  # the harness asks for a traceback of a writer that hangs
    with open(spec_path) as f:
        spec = json.load(f)
    spark = None
    if any(step["op"] in SPARK_OPS and not step.get("driver") for step in spec["steps"]):
        # A short-lived driver: C1-only JIT and the serial GC start it in about half the time on 2 cores.
        spark = bitlake.spark_session("local[1]", app_name=f"bitlake-writer-{os.getpid()}", **{
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        })
    table = bitlake.open_table(spec["table"])
    if spec.get("ready"):
        # Warm up (JVM, Python workers, Arrow) before the barrier, so the writers' commits overlap.
        if spark is not None:
            spark.createDataFrame(batch_table(spec["steps"][0].get("rows") or [[0, "", 0, "upsert"]])) \
                .mapInArrow(lambda batches: batches, "id long, v string, mod long, op string").collect()
        table.state()
        open(spec["ready"], "w").close()
        deadline = time.monotonic() + 300
        while not os.path.exists(spec["go"]):
            if time.monotonic() > deadline:
                raise SystemExit("never got the go signal")
            time.sleep(0.05)
    with open(spec["ack"], "a") as ack:
        for i, step in enumerate(spec["steps"]):
            started = time.monotonic()
            on = None if step.get("driver") else spark
            if step["op"] == "ingest":
                r = table.ingest(batch_table(step["rows"]), op_column="op", batch_id=step["batch_id"],
                                 metagen=step["metagen"], spark=on)
            elif step["op"] == "revert":
                r = table.revert_batch(step["batch_id"])
            elif step["op"] == "replace":
                r = table.replace_batch(step["batch_id"], batch_table(step["rows"]), op_column="op")
            elif step["op"] in ("compact", "tombstone", "vacuum"):
                if step["op"] == "vacuum":
                    line = {"step": i, "op": "vacuum", "version": table.vacuum().version}
                elif step["op"] == "compact":
                    c = table.compact(target_file_bytes=step.get("target_file_bytes"),
                                      major=step.get("major", False), look_back=step.get("look_back"))
                    line = {"step": i, "op": "compact", "version": c.version, "removed_files": c.removed_files}
                else:
                    line = {"step": i, "op": "tombstone", "version": table.tombstone(step["column"], step["values"]).version}
                line.update(seconds=round(time.monotonic() - started, 2), lost_races=LOST_RACES[0])
                _ack(ack, line)
                continue
            else:
                r = table.metagen(spark=on)
            line = {"step": i, "op": step["op"], "batch_id": r.batch_id, "version": r.version,
                    "committed": r.committed, "visible": r.visible, "counts": r.counts,
                    "seconds": round(time.monotonic() - started, 2), "lost_races": LOST_RACES[0]}
            if step["op"] == "metagen":
                state = table.state()
                line["now_visible"] = {b: state.batch(b) is not None and state.batch(b).status == "live"
                                       for b in step.get("expect_visible", [])}
            _ack(ack, line)
    if spark is not None:
        spark.stop()


def _ack(ack, line: dict) -> None:
    ack.write(json.dumps(line) + "\n")
    ack.flush()
    os.fsync(ack.fileno())

if __name__ == "__main__":
    main(sys.argv[1])
