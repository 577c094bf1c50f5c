"""A streaming query for tests/test_streaming.py: Spark's file source (JSON files, one per micro-batch) into a
bitlake table with ``writeStream.format("bitlake")``, from a checkpoint, until every file is processed.

Usage: stream.py SOURCE_DIR TABLE CHECKPOINT_DIR. ``STREAM_SINK=foreach_batch`` writes with
``bitlake.foreach_batch`` instead. Exits 0 when the query finished, 3 when it failed."""

from __future__ import annotations

import os
import sys

import bitlake


def main(source: str, table: str, checkpoint: str) -> int:
    spark = bitlake.spark_session(os.environ.get("BITLAKE_SPARK_MASTER", "local[1]"))
    stream = (spark.readStream.schema("id long, v string, ts long, op string").option("maxFilesPerTrigger", 1)
              .json(source))
    if os.environ.get("STREAM_SINK") == "foreach_batch":
        writer = stream.writeStream.foreachBatch(bitlake.foreach_batch(table, op_column="op"))
    else:
        writer = stream.writeStream.format("bitlake").option("opColumn", "op").option("path", table)
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    try:
        query.awaitTermination()
    except Exception as e:  # noqa: BLE001 - the query failed (a killed commit): the test restarts it
        print(f"query failed: {type(e).__name__}: {str(e)[:2000]}", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
