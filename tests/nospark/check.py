"""Run by tests/test_without_spark.py in a virtual environment with bitlake's core dependencies only (no
pyspark, no pandas): every driver-side capability works there. Exits non-zero on the first failure."""

from __future__ import annotations

import importlib.util
import sys
import tempfile

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

import bitlake

assert importlib.util.find_spec("pyspark") is None, "this check runs where pyspark is not installed"
assert importlib.util.find_spec("pandas") is None, "nor pandas"

SCHEMA = pa.schema([("k", pa.int64()), ("g", pa.string()), ("v", pa.int64()), ("mod", pa.int64())])


def batch(keys, mod, ops=None):
    return pa.table({"k": keys, "g": [f"g{k % 3}" for k in keys], "v": [k * mod for k in keys], "mod": [mod] * len(keys),
                     "op": ops or ["upsert"] * len(keys)})


def check(path: str) -> None:
    t = bitlake.create_table(path, SCHEMA, primary_key=["k"], delta_column="mod", partition_by=["g"])
    t.ingest(batch(list(range(100)), 1), op_column="op", batch_id="b1")
    t.ingest(batch(list(range(0, 100, 2)), 2, ["delete" if k % 10 == 0 else "upsert" for k in range(0, 100, 2)]),
             op_column="op", batch_id="b2")
    t.ingest(batch(list(range(100, 120)), 3), op_column="op", batch_id="b3", metagen=False)
    assert t.metagen().committed
    rows = {r["k"]: r for r in t.to_arrow().to_pylist()}
    assert len(rows) == 110 and rows[2]["mod"] == 2 and 10 not in rows and rows[1]["mod"] == 1
    assert t.to_arrow(version=1).num_rows == 100
    assert t.to_arrow(valid_at=1).num_rows == 100  # every record with mod 1, as the latest version knows them
    small = t.to_arrow(columns=["k"], filter=(pc.field("g") == "g1") & (pc.field("k") < 30))
    assert small.column_names == ["k"] and sorted(small.column("k").to_pylist()) == [
        k for k in range(30) if k % 3 == 1 and k % 10 != 0]
    reader = t.to_batches(batch_size=16)
    assert isinstance(reader, pa.RecordBatchReader) and sum(b.num_rows for b in reader) == 110
    view = t.view(version=2)
    assert duckdb.sql("SELECT count(*) FROM view").fetchall() == [(90,)]
    assert duckdb.sql("SELECT count(*) FROM view WHERE mod = 2").fetchall() == [(40,)]
    assert pl.DataFrame(view).height == 90
    changes = t.changes_to_arrow(starting_version=2, ending_version=2)
    kinds = pc.value_counts(changes.column("_change_type")).to_pylist()
    assert {k["values"]: k["counts"] for k in kinds} == {"update_preimage": 40, "update_postimage": 40, "delete": 10}
    assert t.compact().version is not None
    assert t.to_arrow().num_rows == 110
    assert t.revert_batch("b2").committed
    assert t.to_arrow().num_rows == 120 and {r["k"]: r["mod"] for r in t.to_arrow().to_pylist()}[2] == 1
    t.tombstone("g", ["g0"])
    assert t.vacuum().version is not None
    assert all(r["g"] != "g0" for r in t.to_arrow().to_pylist())
    left = t.to_arrow().num_rows
    deleted = t.delete(pc.field("k") >= 110)
    assert deleted.version is not None and t.to_arrow().num_rows == left - deleted.matched > 0
    assert t.update(pc.field("k") == 1, {"v": pc.scalar(-1)}).matched == 1
    assert [r["v"] for r in t.to_arrow(filter=pc.field("k") == 1).to_pylist()] == [-1]
    # A batch past metagen.inline_max_rows with no session given still runs MetaGen here: Spark only when asked.
    t.set_properties({"metagen.inline_max_rows": "1"})
    assert t.ingest(batch([1000, 1001], 5), op_column="op").counts["inserted"] == 2
    t.set_properties({"metagen.inline_max_rows": ""})
    # SQL strings without Spark, as a delta-rs user writes them.
    assert t.delete("k = 4").matched == 1 and t.to_arrow(filter="k = 4").num_rows == 0
    assert t.update("k = 1", {"v": "v * 10 - 5"}).matched == 1
    assert [r["v"] for r in t.to_arrow(filter="k = 1 and g = 'g1'").to_pylist()] == [-15]
    r = (t.merge(pa.table({"k": [1, 500], "g": ["g1", "g2"], "v": [7, 8], "mod": [9, 9]}), "target.k = source.k")
         .when_matched_update(updates={"v": "source.v + target.v"}).when_not_matched_insert_all().execute())
    assert (r.updated, r.inserted) == (1, 1) and t.to_arrow(filter="k in (1, 500)").sort_by("k").column("v").to_pylist() == [-8, 8]


check(tempfile.mkdtemp() + "/t")
check("memory:///nospark/t")
if len(sys.argv) > 1:  # an s3:// URI on a server the test started (its variables are in the environment)
    check(sys.argv[1])
print("ok")
