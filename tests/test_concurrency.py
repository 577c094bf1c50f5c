"""Several writer processes, each with its own SparkSession, commit to one keyed table at once.

The commit log must stay a gap-free sequence in which every acknowledged batch lands and becomes
visible exactly once, and the table's view must equal the oracle applied in the commit log's order.
"""

from __future__ import annotations

import os
import random

import pytest
from writers import harness
from writers.harness import Writer

import bitlake

pytestmark = [pytest.mark.slow, pytest.mark.spark]


@pytest.fixture
def procs():
    started: list[Writer] = []
    yield started
    harness.kill_all(started)


def make_batch(rng: random.Random, name: str, n: int = 7, keys: int = 10) -> list[list]:
    """``n`` records over a small shared key space: overlapping keys across writers, a repeated key
    inside the batch, ties and out-of-order deltas, about a quarter deletes."""
    ids = [rng.randrange(keys) for _ in range(n - 1)]
    ids.append(ids[0])  # the same key twice in one batch
    return [[k, f"{name}#{i}", rng.randrange(12), "delete" if rng.random() < 0.25 else "upsert"]
            for i, k in enumerate(ids)]


@pytest.mark.parametrize("store", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_concurrent_writers(tmp_path, spark, procs, store, request):
    """``s3``: the table on moto's S3 server; the commit log's put-if-absent is S3's conditional put."""
    path = request.getfixturevalue("s3_server").uri("concurrent") if store == "s3" else tmp_path / "t"
    table = harness.create(path, num_buckets=4)
    rng = random.Random(20240611)
    plans = {  # per writer, in order: (batch id, metagen) or "metagen"
        "w0": [("w0-b0", True), ("w0-b1", False), "metagen"],
        "w1": [("w1-b0", False), "metagen", ("w1-b1", True)],
        "w2": [("w2-b0", False), ("w2-b1", True)],  # w2-b0: made visible by an INGEST
    }
    batches: dict[str, list[list]] = {}
    for name, plan in plans.items():
        steps, landed = [], []
        for item in plan:
            if item == "metagen":
                steps.append({"op": "metagen", "expect_visible": list(landed)})
                continue
            batch_id, metagen = item
            batches[batch_id] = make_batch(rng, batch_id)
            steps.append({"op": "ingest", "batch_id": batch_id, "rows": batches[batch_id],
                          "metagen": metagen})
            landed.append(batch_id)
        procs.append(Writer(tmp_path, name, table.path, steps, barrier=True))
    harness.release(tmp_path, procs)
    harness.run_all(procs)

    history = harness.check_log(table)
    by_version = {c["version"]: c for c in history}
    landed_at = {c["batch_id"]: c["version"] for c in history if c["batch_id"] is not None}
    visible_at = {b: c["version"] for c in history for b in c["processed"]}
    assert set(landed_at) == set(batches), "every batch landed, none other"
    assert set(visible_at) == set(batches), "every batch became visible"
    assert table.state().pending == []

    for w in procs:
        acks = w.acks()
        assert [a["step"] for a in acks] == list(range(len(plans[w.name]))), w.output()
        for a, item in zip(acks, plans[w.name], strict=True):
            if item == "metagen":
                assert all(a["now_visible"].values()), a
                if a["committed"]:
                    assert by_version[a["version"]]["operation"] == "METAGEN"
                continue
            batch_id, metagen = item
            assert a["batch_id"] == batch_id and a["committed"] is True and a["visible"] is metagen, a
            assert landed_at[batch_id] == a["version"], f"ack of {batch_id} names the commit that landed it"
            if metagen:
                assert visible_at[batch_id] == a["version"], "an INGEST commit makes its own batch visible"
            else:
                assert visible_at[batch_id] > a["version"]
        committed = [a["version"] for a in acks if a["committed"]]
        assert committed == sorted(set(committed)), f"{w.name}'s commits go forward: {committed}"

    expected = harness.check_view(table, batches, spark)
    assert expected, "the oracle keeps some rows (the test data is not degenerate)"
    assert harness.arrow_rows(bitlake.open_table(table.path)) == expected
    assert harness.orphans(table) == [], "losers of a commit race delete what they wrote"


def test_same_batch_id_from_two_writers(tmp_path, spark, procs):
    table = harness.create(tmp_path / "t", num_buckets=2)
    base = [[k, f"base#{k}", 5, "upsert"] for k in range(8)]
    dup = [[1, "dup#0", 7, "upsert"], [2, "dup#1", 3, "upsert"], [3, "dup#2", 6, "delete"],
           [9, "dup#3", 1, "upsert"], [1, "dup#4", 7, "upsert"]]
    assert table.ingest(harness.batch_table(base), op_column="op", batch_id="base", spark=spark).committed
    steps = [{"op": "ingest", "batch_id": "dup", "rows": dup, "metagen": True}]
    procs.extend(Writer(tmp_path, f"w{i}", table.path, steps, barrier=True) for i in range(2))
    harness.release(tmp_path, procs)
    harness.run_all(procs)

    acks = [a for w in procs for a in w.acks()]
    assert len(acks) == 2
    assert sorted(a["committed"] for a in acks) == [False, True], acks
    assert acks[0]["version"] == acks[1]["version"] == 2, acks
    assert all(a["visible"] for a in acks)

    history = harness.check_log(table)
    assert [c["version"] for c in history if c["batch_id"] == "dup"] == [2]
    assert [c["version"] for c in history if "dup" in c["processed"]] == [2]
    assert table.version == 2
    harness.check_view(table, {"base": base, "dup": dup}, spark)
    assert harness.orphans(table) == [], "the writer that found the batch committed removed its files"


def test_ingest_and_compaction_at_once(tmp_path, spark, procs):
    """Writers ingest while two others compact the same files, one of them a major compaction: every batch
    commits once, the compactions that lose the files to the other give up cleanly, and the view equals the
    oracle (a major compaction never drops a row the current view shows)."""
    table = harness.create(tmp_path / "t", num_buckets=2)
    rng = random.Random(7)
    batches: dict[str, list[list]] = {}
    for i in range(4):  # four small files, with superseded rows: worth compacting
        batches[f"base{i}"] = make_batch(rng, f"base{i}")
        table.ingest(harness.batch_table(batches[f"base{i}"]), op_column="op", batch_id=f"base{i}")
    plans = {
        "w0": [("w0-b0", True), ("w0-b1", True)],
        "w1": [("w1-b0", False), ("w1-b1", True)],
    }
    for name, plan in plans.items():
        steps = []
        for batch_id, metagen in plan:
            batches[batch_id] = make_batch(rng, batch_id)
            steps.append({"op": "ingest", "batch_id": batch_id, "rows": batches[batch_id], "metagen": metagen})
        procs.append(Writer(tmp_path, name, table.path, steps, barrier=True))
    procs.append(Writer(tmp_path, "c0", table.path, [{"op": "compact"}, {"op": "compact"}], barrier=True))
    procs.append(Writer(tmp_path, "c1", table.path, [{"op": "compact", "major": True, "look_back": 2},
                                                     {"op": "compact"}], barrier=True))
    harness.release(tmp_path, procs)
    harness.run_all(procs)

    history = harness.check_log(table)
    compactions = [c["version"] for c in history if c["operation"] == "COMPACT"]
    acked = [a["version"] for w in procs if w.name.startswith("c") for a in w.acks() if a["version"] is not None]
    assert compactions and sorted(acked) == compactions, "every committed compaction is acknowledged, once"
    assert {b for c in history for b in c["processed"]} == set(batches)
    expected = harness.check_view(table, batches, spark)
    assert harness.arrow_rows(bitlake.open_table(table.path)) == expected
    state = table.state()
    expired = {f.path for b in state.parts.values() for f in b.keys_files  # keys files the window let go
               if state.window and b.live_version is not None and b.live_version <= state.window.version}
    assert [p for p in harness.orphans(table) if p not in expired] == [], "a compaction that gave up removed what it wrote"


def test_restatements_and_ingest_at_once(tmp_path, spark, procs):
    """While one writer ingests, others revert a batch (then retry the revert), replace another and tombstone a
    key, all at once: every one commits exactly once (a lost race is rebuilt on the new state), the retried
    revert is a no-op, and the view equals the oracle applied in the commit log's order: the revert, the
    replace and the tombstone take effect where they committed, the tombstone hiding the key's rows of batches
    made visible before it and not those after."""
    table = harness.create(tmp_path / "t", num_buckets=2)
    rng = random.Random(31)
    batches: dict[str, list[list]] = {}
    for i in range(3):
        batches[f"base{i}"] = make_batch(rng, f"base{i}")
        table.ingest(harness.batch_table(batches[f"base{i}"]), op_column="op", batch_id=f"base{i}", spark=spark)
    start = table.version
    key = batches["base0"][0][0]  # the tombstoned key: base0 has it, and so does the ingesting writer's w-b1
    for name in ("w-b0", "w-b1"):
        batches[name] = make_batch(rng, name)
    batches["w-b1"].append([key, "w-b1#key", 20, "upsert"])
    replacement = make_batch(rng, "r-base2")
    plans = {
        "ingest": [{"op": "ingest", "batch_id": b, "rows": batches[b], "metagen": True} for b in ("w-b0", "w-b1")],
        "revert": [{"op": "revert", "batch_id": "base1"}, {"op": "revert", "batch_id": "base1"}],
        "replace": [{"op": "replace", "batch_id": "base2", "rows": replacement}],
        "tombstone": [{"op": "tombstone", "column": "id", "values": [key]}],
    }
    procs.extend(Writer(tmp_path, name, table.path, steps, barrier=True) for name, steps in plans.items())
    harness.release(tmp_path, procs)
    harness.run_all(procs)

    acks = {w.name: w.acks() for w in procs}
    for w in procs:
        assert [a["step"] for a in acks[w.name]] == list(range(len(plans[w.name]))), w.output()
    history = harness.check_log(table)
    by_version = {c["version"]: c for c in history}
    done = {  # version -> (operation, batch id) of each acknowledged commit
        acks["ingest"][0]["version"]: ("INGEST", "w-b0"),
        acks["ingest"][1]["version"]: ("INGEST", "w-b1"),
        acks["revert"][0]["version"]: ("REVERT", "base1"),
        acks["replace"][0]["version"]: ("REPLACE", "base2"),
        acks["tombstone"][0]["version"]: ("TOMBSTONE", None),
    }
    assert sorted(done) == list(range(start + 1, table.version + 1)), "every write committed once, none lost"
    assert {v: (by_version[v]["operation"], by_version[v]["batch_id"]) for v in done} == done
    assert all(a["committed"] for name in ("ingest", "replace") for a in acks[name])
    first, retry = acks["revert"]
    assert first["committed"] and not retry["committed"] and retry["version"] == first["version"], acks["revert"]
    assert table.state().batch("base1").status == "reverted"
    assert table.state().batch("base2").live_version == acks["replace"][0]["version"]

    tombstone_at = acks["tombstone"][0]["version"]
    expected = harness.check_view(table, batches, spark, replacements={"base2": replacement},
                                  tombstones=[("id", [key])])
    assert expected, "the oracle keeps some rows (the test data is not degenerate)"
    # The key's row is w-b1's (delta 20, above every other record of it): hidden only by a tombstone after w-b1.
    assert (key in [r[0] for r in expected]) is (tombstone_at < acks["ingest"][1]["version"])
    assert harness.arrow_rows(bitlake.open_table(table.path)) == expected
    assert harness.orphans(table) == [], "losers of a commit race delete what they wrote"


def test_driver_writers_with_bitmap_deltas(tmp_path, procs):
    """Writers on the Spark-free driver path (Arrow input, inline MetaGen, two-step ingests) commit at once with
    a compactor, a restater and a tombstone, on a table whose every bitmap change is a delta (``bitmap.deltas``
    ``always``) and whose key-store increments merge every other commit: a lost race rebuilds its deltas on the
    winner's bitmaps. Every batch lands and becomes visible once, and the view at every version equals the
    oracle applied in the commit log's order."""
    table = harness.create(tmp_path / "t", num_buckets=2, properties={
        "bitmap.deltas": "always", "keystore.max_increments": "2", "checkpoint.interval": "3",
        "compact.min_input_files": "2"})
    rng = random.Random(int(os.environ.get("BITLAKE_RACE_SEED", "20261127")))
    batches: dict[str, list[list]] = {}
    for i in range(3):
        batches[f"base{i}"] = make_batch(rng, f"base{i}", n=12)
        table.ingest(harness.batch_table(batches[f"base{i}"]), op_column="op", batch_id=f"base{i}")
    start = table.version
    key = batches["base0"][0][0]
    plans: dict[str, list[dict]] = {}
    for w in range(3):
        steps = []
        for i in range(4):
            b = f"w{w}-b{i}"
            batches[b] = make_batch(rng, b, n=9)
            steps.append({"op": "ingest", "batch_id": b, "rows": batches[b], "metagen": (w + i) % 3 != 0,
                          "driver": True})
        steps.append({"op": "metagen", "driver": True})
        plans[f"w{w}"] = steps
    replacement = make_batch(rng, "r-base2")
    plans["restate"] = [{"op": "revert", "batch_id": "base1"}, {"op": "replace", "batch_id": "base2",
                                                                 "rows": replacement},
                        {"op": "tombstone", "column": "id", "values": [key]}]
    plans["compact"] = [{"op": "compact", "driver": True}, {"op": "compact", "driver": True}]
    procs.extend(Writer(tmp_path, name, table.path, steps, barrier=True) for name, steps in plans.items())
    harness.release(tmp_path, procs)
    harness.run_all(procs)

    for w in procs:
        assert [a["step"] for a in w.acks()] == list(range(len(plans[w.name]))), w.output()
    assert sum(a.get("lost_races", 0) > 0 for w in procs for a in w.acks()[-1:]) > 0, "the writers raced"
    history = harness.check_log(table)
    assert {b for c in history for b in c["processed"]} == set(batches), "every batch became visible"
    assert table.state().pending == []
    expected = harness.check_view(table, batches, None, replacements={"base2": replacement},
                                  tombstones=[("id", [key])])
    assert expected, "the oracle keeps some rows (the test data is not degenerate)"

    model = harness.Oracle()
    for c in reversed(table.history()):
        v = c["version"]
        if c["operation"] == "REVERT":
            model.revert(c["batch_id"], v)
        elif c["operation"] == "REPLACE":
            model.replace(c["batch_id"], harness.records(replacement), v)
        elif c["operation"] == "TOMBSTONE":
            model.tombstone("id", [key], v)
        else:
            for b in c["processed"]:
                model.apply(harness.records(batches[b]), v, b)
        if v >= start:
            got = harness.arrow_rows(table, v)
            assert got == harness.rows_key(model.view(version=v), harness.TABLE_SCHEMA.names), f"version {v}"
    deltas = [s.delta for s in table.state().segments.values() if s.delta]
    assert harness.orphans(table) == [], "losers of a commit race delete what they wrote"
    assert deltas or any(c["operation"] == "COMPACT" for c in history), "some segment's bitmap is a delta"
