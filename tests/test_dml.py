"""DML: delete and update by a Spark SQL condition or a pyarrow expression, on keyed and unkeyed tables; no
data file is rewritten, time travel and the change feed follow, bad input is refused with nothing committed."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import bitlake
from bitlake.cli import main as cli
from tests import spec_reader
from tests.oracle import rows_key

SCHEMA = pa.schema([("k", pa.int64()), ("region", pa.string()), ("amount", pa.int64()), ("mod", pa.int64())])
COLUMNS = SCHEMA.names


def keyed(path):
    t = bitlake.create_table(path, SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2)
    t.ingest(pa.table({"k": list(range(10)), "region": ["EU", "US"] * 5, "amount": list(range(10)),
                       "mod": [1] * 10}), batch_id="b0")
    return t


def rows(t, **view) -> dict:
    return {r["k"]: (r["region"], r["amount"], r["mod"]) for r in t.to_arrow(**view).to_pylist()}


def test_keyed_delete_and_update_with_pyarrow_expressions(tmp_path):
    t = keyed(str(tmp_path / "t"))
    data = sorted(t.io.walk("data"))
    r = t.delete((pc.field("region") == "EU") & (pc.field("amount") < 5))  # keys 0, 2, 4
    assert (r.matched, r.version, r.counts["deleted"]) == (3, 2, 3)
    u = t.update(pc.field("k") >= 8, {"amount": pc.field("amount") * 100, "region": "'ASIA'"})
    assert (u.matched, u.version, u.counts["updated"]) == (2, 3, 2)
    now = rows(t)
    assert set(now) == {1, 3, 5, 6, 7, 8, 9} and now[8] == ("ASIA", 800, 1) and now[9] == ("ASIA", 900, 1)
    assert len(rows(t, version=1)) == 10 and rows(t, version=2)[8] == ("EU", 8, 1)
    assert set(sorted(t.io.walk("data"))) >= set(data)  # only added to
    assert t.history()[0]["operation"] == "UPDATE" and t.history()[1]["operation"] == "DELETE"
    assert rows_key(spec_reader.read_view(t.path), COLUMNS) == rows_key(t.to_arrow().to_pylist(), COLUMNS)
    # The DML records take the changed row's delta value: an event-time view at it sees the new state, and a
    # later record with an older delta value stays stale.
    assert rows(t, valid_at=1)[9] == ("ASIA", 900, 1)
    late = t.ingest(pa.table({"k": [9], "region": ["US"], "amount": [-1], "mod": [0]}))
    assert late.counts["stale"] == 1
    assert t.delete(pc.field("k") == 1000).version is None  # nothing matched, nothing committed


@pytest.mark.spark
def test_spark_sql_dml_change_feed_and_commands(tmp_path, spark, capsys):
    t = keyed(str(tmp_path / "t"))
    r = t.delete("region = 'US' and amount > 6", spark=spark)  # keys 7, 9
    u = t.update("k = 0 or k = 1", {"amount": "amount + 1000"}, spark=spark)
    assert (r.matched, u.matched) == (2, 2)
    changes = sorted((x["_change_type"], x["_commit_version"], x["k"], x["amount"])
                     for x in t.changes(spark, starting_version=2).collect())
    assert changes == [("delete", 2, 7, 7), ("delete", 2, 9, 9), ("update_postimage", 3, 0, 1000),
                       ("update_postimage", 3, 1, 1001), ("update_preimage", 3, 0, 0), ("update_preimage", 3, 1, 1)]
    version = t.version
    with pytest.raises(bitlake.InvalidInputError, match="where"):
        t.delete("nope = 1", spark=spark)
    with pytest.raises(bitlake.InvalidInputError, match="primary key"):
        t.update("k = 1", {"k": "2"}, spark=spark)
    with pytest.raises(bitlake.InvalidInputError, match="no columns"):
        t.update("k = 1", {"zz": "2"}, spark=spark)
    with pytest.raises(bitlake.InvalidInputError, match="where must be"):
        t.delete(42)
    assert t.version == version
    assert cli(["delete", t.path, "--where", "k = 3"]) == 0
    assert "1 row(s) deleted" in capsys.readouterr().out
    assert cli(["update", t.path, "--where", "k = 5", "--set", "region='MARS'"]) == 0
    assert rows(t)[5][0] == "MARS" and 3 not in rows(t)


@pytest.mark.spark
def test_unkeyed_delete_is_a_deletion_vector(tmp_path, spark):
    schema = pa.schema([("user", pa.string()), ("n", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "events"), schema)
    t.ingest(pa.table({"user": ["a", "b", "c", "d"], "n": [1, 2, 3, 4]}))
    data = sorted(t.io.walk("data"))
    assert t.delete(pc.field("n") == 2).matched == 1 and sorted(t.io.walk("data")) == data
    assert t.delete(pc.field("n") == 2).version is None  # already gone
    u = t.update("user = 'c'", {"n": "n * 11"}, spark=spark)
    assert u.counts["updated"] == 1
    assert sorted((r["user"], r["n"]) for r in t.to_arrow().to_pylist()) == [("a", 1), ("c", 33), ("d", 4)]
    assert len(t.to_arrow(version=1).to_pylist()) == 4
    assert sorted((r["user"], r["n"]) for r in spec_reader.read_view(t.path)) == [("a", 1), ("c", 33), ("d", 4)]
    changes = sorted((x["_change_type"], x["_commit_version"], x["user"], x["n"])
                     for x in t.changes(spark, starting_version=2).collect())
    assert changes == [("delete", 2, "b", 2), ("update_postimage", 3, "c", 33), ("update_preimage", 3, "c", 3)]
    assert sorted((x["_change_type"], x["user"]) for x in spec_reader.read_changes(t.path, 1, t.version)) == [
        ("delete", "b"), ("update_postimage", "c"), ("update_preimage", "c")]


def test_merge_by_key_with_clauses(tmp_path):
    t = keyed(str(tmp_path / "t"))  # keys 0..9, regions EU/US, amount = key, mod 1
    source = pa.table({"k": [1, 2, 3, 20, 21], "region": ["X", "X", "X", "NEW", "NEW"], "amount": [-1, 50, 60, 7, 8],
                       "mod": [5, 5, 0, 5, 5]})
    r = (t.merge(source)
         .when_matched_delete(predicate=pc.field("source.amount") < 0)
         .when_matched_update(set={"amount": pc.field("source.amount") + pc.field("target.amount")},
                              predicate=pc.field("target.region") == "EU")
         .when_matched_update_all()
         .when_not_matched_insert_all(predicate=pc.field("source.k") != 21)
         .execute())
    # The figures are the commit's: key 3's update_all carries an older delta value, so it is stale.
    assert (r.matched, r.not_matched, r.deleted, r.updated, r.inserted, r.stale) == (3, 2, 1, 1, 1, 1)
    now = rows(t)
    assert 1 not in now  # deleted
    assert now[2] == ("EU", 52, 1)  # set: amount source + target, the target's region and delta value
    assert now[3] == ("US", 3, 1)  # update_all with an older delta value (0 < 1): stale by the contract
    assert now[20] == ("NEW", 7, 5) and 21 not in now
    assert r.counts["stale"] == 1 and t.history()[0]["operation"] == "MERGE"
    version = t.version
    with pytest.raises(bitlake.InvalidInputError, match="primary key"):
        t.merge(source, on=["region"]).when_matched_update_all().execute()
    with pytest.raises(bitlake.InvalidInputError, match="lacks the columns"):
        t.merge(pa.table({"region": ["EU"]})).when_matched_update_all().execute()
    with pytest.raises(bitlake.InvalidInputError, match="at least one"):
        t.merge(source).execute()
    assert t.version == version


def test_merge_carries_nested_columns(tmp_path):
    """The merge's join pairs rows by the keys alone: list, struct and map columns come through it."""
    schema = pa.schema([("k", pa.int64()), ("tags", pa.list_(pa.string())), ("who", pa.struct([("n", pa.string())])),
                        ("attrs", pa.map_(pa.string(), pa.int64())), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["k"], delta_column="mod")
    t.ingest(pa.table({"k": [1, 2], "tags": [["a"], None], "who": [{"n": "x"}, {"n": "y"}],
                       "attrs": [[("p", 1)], []], "mod": [1, 1]}, schema=schema))
    source = pa.table({"k": [2, 3], "tags": [["b", "c"], []], "who": [{"n": "z"}, None],
                       "attrs": [[("q", 2)], None], "mod": [2, 2]}, schema=schema)
    r = t.merge(source).when_matched_update_all().when_not_matched_insert_all().execute()
    assert (r.updated, r.inserted) == (1, 1)
    assert sorted(t.to_arrow().to_pylist(), key=lambda row: row["k"]) == [
        {"k": 1, "tags": ["a"], "who": {"n": "x"}, "attrs": [("p", 1)], "mod": 1},
        {"k": 2, "tags": ["b", "c"], "who": {"n": "z"}, "attrs": [("q", 2)], "mod": 2},
        {"k": 3, "tags": [], "who": None, "attrs": None, "mod": 2}]


def test_unkeyed_update_pairs_each_preimage_with_its_own_postimage(tmp_path):
    """The view reads a whole file before a filtered one, so the matched rows come out of row-id order: each
    update_preimage must still be followed by its own row's update_postimage."""
    schema = pa.schema([("name", pa.string()), ("v", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema)
    t.ingest(pa.table({"name": ["x1", "x2"], "v": [1, 2]}, schema=schema))
    t.delete(pc.field("name") == "x2")
    t.ingest(pa.table({"name": ["y"], "v": [3]}, schema=schema))
    r = t.update(pc.field("name").isin(["x1", "y"]), {"v": pc.field("v") + 100})
    assert r.counts["updated"] == 2
    feed = t.changes_to_arrow(starting_version=4).to_pylist()
    pairs = [(a["name"], a["v"], b["v"]) for a, b in zip(feed[::2], feed[1::2], strict=True)]
    assert [(a["_change_type"], b["_change_type"]) for a, b in zip(feed[::2], feed[1::2], strict=True)] == \
        [("update_preimage", "update_postimage")] * 2
    assert sorted(pairs) == [("x1", 1, 101), ("y", 3, 103)]
    assert all(a["name"] == b["name"] for a, b in zip(feed[::2], feed[1::2], strict=True))


def test_merge_of_a_change_feed_with_an_op_column(tmp_path):
    """The source's columns the table lacks (a change feed's op) are there for the predicates, written nowhere."""
    t = keyed(str(tmp_path / "t"))
    feed = pa.table({"k": [1, 2, 30], "region": ["X", "X", "N"], "amount": [0, 20, 3], "mod": [2, 2, 2],
                     "op": ["D", "U", "I"]})
    r = (t.merge(feed)
         .when_matched_delete(predicate=pc.field("source.op") == "D")
         .when_matched_update_all()
         .when_not_matched_insert_all()
         .execute())
    assert (r.deleted, r.updated, r.inserted) == (1, 1, 1)
    now = rows(t)
    assert 1 not in now and now[2] == ("X", 20, 2) and now[30] == ("N", 3, 2)
    assert t.to_arrow().column_names == COLUMNS


def test_unkeyed_update_racing_a_delete_does_not_bring_rows_back(tmp_path, monkeypatch):
    """Another writer deletes a row an unkeyed update matched, after the update landed its rewrite and before it
    commits: the update matches again on the new state, so the deleted row stays deleted."""
    from bitlake import batches, dml

    schema = pa.schema([("name", pa.string()), ("v", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema)
    t.ingest(pa.table({"name": ["a", "b", "c"], "v": [1, 2, 3]}, schema=schema))
    other = bitlake.open_table(t.path)
    real, calls = batches.land, []

    def land_then_race(*args, **kwargs):
        landed = real(*args, **kwargs)
        if not calls:
            other.delete(pc.field("name") == "b")
        calls.append(landed)
        return landed

    monkeypatch.setattr(dml.batches, "land", land_then_race)
    r = t.update(pc.field("v") >= 2, {"v": pc.field("v") + 100})
    assert len(calls) == 2 and r.counts["updated"] == 1
    assert sorted((x["name"], x["v"]) for x in t.to_arrow().to_pylist()) == [("a", 1), ("c", 103)]
    feed = [(x["_change_type"], x["name"]) for x in t.changes_to_arrow(starting_version=2).to_pylist()]
    assert feed == [("delete", "b"), ("update_preimage", "c"), ("update_postimage", "c")]
    assert [p for p in t.cleanup(min_age_seconds=0, dry_run=True) if p.startswith("data/")] == []
