"""Structured Streaming into and out of bitlake: ``writeStream.format("bitlake")`` applies every micro-batch
exactly once through killed commits and a killed driver (the epoch is the batch id), from Spark's file and
rate sources, and ``readStream.format("bitlake")`` streams the change feed with versions as offsets."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from writers.harness import writer_env

import bitlake

pytestmark = [pytest.mark.spark, pytest.mark.slow]

STREAM = Path(__file__).parent / "writers" / "stream.py"
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("ts", pa.int64())])


def _files(folder: Path, n: int, rng: random.Random) -> list[list[dict]]:
    """``n`` JSON files of records over 12 keys; every record's ts is unique, so the view does not depend on
    the order of arrival and the oracle is: per key, the record with the highest ts, unless it deletes."""
    batches = []
    folder.mkdir()
    for i in range(n):
        records = [{"id": rng.randrange(12), "v": f"f{i}#{j}", "ts": i * 100 + j,
                    "op": "delete" if rng.random() < 0.2 else "upsert"} for j in range(rng.randrange(1, 6))]
        (folder / f"part-{i:03d}.json").write_text("".join(json.dumps(r) + "\n" for r in records))
        batches.append(records)
    return batches


def _expected(batches: list[list[dict]]) -> list[tuple]:
    latest: dict[int, dict] = {}
    for r in (r for b in batches for r in b):
        if r["id"] not in latest or r["ts"] > latest[r["id"]]["ts"]:
            latest[r["id"]] = r
    return sorted((r["id"], r["v"], r["ts"]) for r in latest.values() if r["op"] == "upsert")


def _start(source, table, checkpoint, sink, crash_at=None) -> subprocess.Popen:
    env = writer_env(crash_at) | {"STREAM_SINK": sink}
    return subprocess.Popen([sys.executable, str(STREAM), str(source), table, str(checkpoint)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.parametrize("sink", ["format", "foreach_batch"])
def test_a_restarted_query_applies_every_epoch_exactly_once(tmp_path, sink):
    """``format``: ``writeStream.format("bitlake")``; ``foreach_batch``: ``bitlake.foreach_batch``."""
    rng = random.Random(7)
    batches = _files(tmp_path / "in", 10, rng)
    path = str(tmp_path / "t")
    t = bitlake.create_table(path, SCHEMA, primary_key=["id"], delta_column="ts")
    checkpoint = tmp_path / "checkpoint"

    # 1. The first epoch's bitlake commit lands, then the process running it dies: Spark never records the
    #    epoch as done, so the restarted query runs it again, under the same batch id.
    first = _start(tmp_path / "in", path, checkpoint, sink, crash_at="after_commit")
    out = first.communicate(timeout=300)[0].decode(errors="replace")
    assert first.returncode != 0, out
    assert t.version == 1, out
    # 2. Restarted, then the whole driver is killed (SIGKILL to its process group) once a few epochs landed.
    second = _start(tmp_path / "in", path, checkpoint, sink)
    deadline = time.monotonic() + 300
    while t.version < 4 and second.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(second.pid, signal.SIGKILL)
    second.wait(timeout=60)
    # 3. Restarted again, it finishes the files.
    third = _start(tmp_path / "in", path, checkpoint, sink)
    out = third.communicate(timeout=300)[0].decode(errors="replace")
    assert third.returncode == 0, out

    history = t.history()
    ids = [h["batch_id"] for h in history if h["operation"] == "INGEST"]
    assert len(ids) == len(set(ids)), ids
    assert len({i.rsplit("-", 1)[0] for i in ids}) == 1, "one query id from the checkpoint"
    # One file per epoch, but a restarted availableNow query may plan its remaining files differently.
    assert sorted(int(i.rsplit("-", 1)[1]) for i in ids) == list(range(len(ids)))
    assert sum(sum(h["counts"].values()) for h in history if h["operation"] == "INGEST") == sum(
        len(b) for b in batches), "every record counted once"
    assert sorted((r["id"], r["v"], r["ts"]) for r in t.to_arrow().to_pylist()) == _expected(batches)
    left = [p for p in t.cleanup(min_age_seconds=0, dry_run=True) if not p.startswith("_bitlake/parts/")]
    assert all(p.startswith(("_bitlake/staging/", "data/", "_bitlake/")) for p in left)


def test_the_change_feed_streams_by_version(spark, tmp_path):
    src = bitlake.create_table(str(tmp_path / "src"), SCHEMA, primary_key=["id"], delta_column="ts")
    dst = bitlake.create_table(str(tmp_path / "dst"), SCHEMA, primary_key=["id"], delta_column="ts")
    src.ingest(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"], "ts": [1, 1, 1]}))
    mirror = (spark.readStream.format("bitlake").option("readChangeFeed", "true").option("startingVersion", 1)
              .load(src.path)
              .where("_change_type != 'update_preimage'")
              .selectExpr("id", "v", "ts", "if(_change_type = 'delete', 'delete', 'upsert') AS op")
              .writeStream.format("bitlake").option("opColumn", "op")
              .option("checkpointLocation", str(tmp_path / "ck")).start(dst.path))
    try:
        mirror.processAllAvailable()
        src.ingest(pa.table({"id": [2, 4], "v": ["B", "d"], "ts": [2, 2]}))
        src.ingest(pa.table({"id": [1, 3], "v": [None, "C"], "ts": [3, 3], "op": ["delete", "upsert"]}),
                   op_column="op")
        mirror.processAllAvailable()
        assert sorted(dst.to_arrow().to_pylist(), key=lambda r: r["id"]) == sorted(
            src.to_arrow().to_pylist(), key=lambda r: r["id"])
        assert dst.version >= 2
    finally:
        mirror.stop()
    plain = spark.readStream.format("bitlake").load(src.path).writeStream.format("noop").start()
    try:
        with pytest.raises(Exception, match="readChangeFeed"):  # the query fails as it starts
            plain.awaitTermination(120)
    finally:
        plain.stop()


def test_a_rate_source_restarted_from_its_checkpoint_loses_and_repeats_nothing(spark, tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="ts")

    def run(seconds: float) -> None:
        q = (spark.readStream.format("rate").option("rowsPerSecond", 40).load()
             .selectExpr("value AS id", "cast(value AS string) AS v", "value AS ts")
             .writeStream.format("bitlake").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="500 milliseconds").start(t.path))
        try:
            time.sleep(seconds)
        finally:
            q.stop()

    run(4)
    first = t.version
    run(4)
    assert t.version > first, "the restarted query went on"
    ids = sorted(r["id"] for r in t.to_arrow().to_pylist())
    assert ids == list(range(len(ids))) and len(ids) > 40, "every generated row, once, no gap"
    inserted = sum(h["counts"].get("inserted", 0) for h in t.history() if h["operation"] == "INGEST")
    assert inserted == len(ids) and all(h["counts"].get("updated", 0) == 0 for h in t.history()
                                         if h["operation"] == "INGEST"), "no epoch applied twice"
