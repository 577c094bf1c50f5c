"""delta-rs's merge, whole (docs/dml.md#merge): SQL predicates and values over source and target aliases, every
clause kind, keyed and append-only targets, and figures that agree with the commit's counts. Runs on Arrow only."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import bitlake
from bitlake.errors import InvalidInputError

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("balance", pa.float64()), ("mod", pa.int64())])


@pytest.fixture
def t(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="id", delta_column="mod")
    t.ingest(pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"], "balance": [10.0, 20.0, 30.0], "mod": [1, 1, 1]}))
    return t


def now(t) -> dict:
    return {r["id"]: (r["name"], r["balance"], r["mod"]) for r in t.to_arrow().to_pylist()}


def test_a_source_column_named_in_a_value_is_the_source_value_not_a_string(t):
    """The bug a delta-rs user met: ``set={"name": "source.name"}`` stored the string 'source.name'."""
    src = pa.table({"id": [1], "name": ["z"], "balance": [99.5], "mod": [1]})
    r = t.merge(src, predicate="target.id = source.id").when_matched_update(
        updates={"name": "source.name", "balance": "source.balance"}).execute()
    assert (r.matched, r.updated, r.stale) == (1, 1, 0) and r.updated == r.counts["updated"]
    assert now(t)[1] == ("z", 99.5, 1)
    t.merge(src).when_matched_update(set={"name": "'fixed'", "balance": "target.balance * 2"}).execute()
    assert now(t)[1] == ("fixed", 199.0, 1)


def test_every_clause_with_sql_predicates_and_aliases(t):
    src = pa.table({"id": [1, 2, 4, 5], "name": ["x", "y", "n4", "n5"], "balance": [-1.0, 5.0, 4.0, 0.0],
                    "mod": [2, 2, 2, 2]})
    r = (t.merge(src, "t.id = s.id", source_alias="s", target_alias="t")
         .when_matched_delete(predicate="s.balance < 0")
         .when_matched_update_all(predicate="s.balance > 0")
         .when_not_matched_insert(updates={"id": "s.id", "name": "upper(s.name)", "mod": "s.mod"},
                                  predicate="s.balance > 0")
         .when_not_matched_insert_all()
         .when_not_matched_by_source_update(updates={"balance": "t.balance + 1"}, predicate="t.name = 'c'")
         .execute())
    assert (r.matched, r.not_matched, r.deleted, r.updated, r.inserted) == (2, 2, 1, 2, 2)
    assert now(t) == {2: ("y", 5.0, 2), 3: ("c", 31.0, 1), 4: ("N4", None, 2), 5: ("n5", 0.0, 2)}
    r = t.merge(pa.table({"id": [2], "mod": [3]})).when_not_matched_by_source_delete(predicate="coalesce(balance, 2) > 1").execute()
    assert (r.deleted, r.matched) == (2, 1) and set(now(t)) == {2, 5}


def test_figures_agree_with_the_counts_when_a_record_is_stale(t):
    src = pa.table({"id": [1], "name": ["old"], "balance": [0.0], "mod": [0]})  # older than the target's mod 1
    r = t.merge(src).when_matched_update_all().execute()
    assert (r.matched, r.updated, r.stale) == (1, 0, 1) and r.counts["updated"] == 0 and now(t)[1][0] == "a"


def test_misuse_is_refused_by_name_and_nothing_commits(t):
    src = pa.table({"id": [1], "name": ["z"], "balance": [1.0], "mod": [2]})
    version = t.version
    cases = [
        (lambda: t.merge(src, "target.id = source.id and source.balance > 0").when_matched_update_all(),
         "keyed table the predicate is the primary key's equality"),
        (lambda: t.merge(src, "target.name = source.name").when_matched_update_all(), "primary key's equality"),
        (lambda: t.merge(src, "source.balance > 0").when_matched_update_all(), "no equality between a source"),
        (lambda: t.merge(src).when_matched_update(updates={"name": "nme"}), r"no column 'nme'"),
        (lambda: t.merge(src).when_matched_update(updates={"name": "name"}), "'name' is ambiguous"),
        (lambda: t.merge(src).when_matched_update(updates={"id": "source.id"}), "cannot set the primary key"),
        (lambda: t.merge(src).when_not_matched_insert(updates={"name": "source.name"}), "must set the key and delta"),
        (lambda: t.merge(src).when_matched_update(updates={"balance": "source.balance"}, predicate="source.nope > 1"),
         "source has no column 'nope'"),
        (lambda: t.merge(src, source_alias="x", target_alias="x").when_matched_delete(), "both 'x'"),
        (lambda: t.merge(src, predicate="target.id = source.id", on="id").when_matched_delete(), "not both"),
        (lambda: t.merge(src).when_matched_update(), "needs updates="),
    ]
    for build, message in cases:
        with pytest.raises(bitlake.InvalidInputError, match=message):
            build().execute()
    assert t.version == version


def test_a_pyarrow_predicate_still_works_and_an_unqualified_one_is_explained(t):
    src = pa.table({"id": [2, 3], "name": ["p", "q"], "balance": [1.0, 2.0], "mod": [5, 5]})
    r = t.merge(src).when_matched_update_all(predicate=pc.field("source.balance") > 1.5).execute()
    assert r.updated == 1 and now(t)[3] == ("q", 2.0, 5) and now(t)[2] == ("b", 20.0, 1)
    version = t.version
    with pytest.raises(InvalidInputError, match=r"names its columns with their alias: pc.field\('source.balance'\)"):
        t.merge(src).when_matched_update(updates={"balance": pc.field("balance") * 2}).execute()
    with pytest.raises(InvalidInputError, match="source.balance"):
        t.merge(src).when_matched_update_all(predicate=pc.field("balance") > 1.5).execute()
    assert t.version == version


def test_append_only_target_merged_by_predicate(tmp_path):
    schema = pa.schema([("user", pa.string()), ("day", pa.int64()), ("n", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "events"), schema)
    t.ingest(pa.table({"user": ["a", "a", "b", "c"], "day": [1, 2, 1, 1], "n": [1, 2, 3, 4]}))
    src = pa.table({"user": ["a", "b", "d"], "day": [2, 1, 1], "n": [20, -1, 7]})
    r = (t.merge(src, "target.user = source.user and target.day = source.day and target.n < 100")
         .when_matched_delete(predicate="source.n < 0")
         .when_matched_update(updates={"n": "source.n + target.n"})
         .when_not_matched_insert_all()
         .when_not_matched_by_source_update(updates={"n": "0"}, predicate="target.user = 'c'")
         .execute())
    assert (r.matched, r.not_matched, r.updated, r.deleted, r.inserted) == (2, 1, 2, 1, 1)
    assert sorted((x["user"], x["day"], x["n"]) for x in t.to_arrow().to_pylist()) == [
        ("a", 1, 1), ("a", 2, 22), ("c", 1, 0), ("d", 1, 7)]
    feed = sorted((x["_change_type"], x["user"], x["n"]) for x in t.changes_to_arrow(starting_version=2).to_pylist())
    assert feed == [("delete", "b", 3), ("insert", "d", 7), ("update_postimage", "a", 22), ("update_postimage", "c", 0),
                    ("update_preimage", "a", 2), ("update_preimage", "c", 4)]
    # Two source rows for one target row would update it twice: refused, as Delta does.
    twice = pa.table({"user": ["a", "a"], "day": [1, 1], "n": [5, 6]})
    with pytest.raises(bitlake.InvalidInputError, match="more than one source row matched the same target row"):
        t.merge(twice, "target.user = source.user and target.day = source.day").when_matched_update_all().execute()
    with pytest.raises(bitlake.InvalidInputError, match="append-only table needs predicate"):
        t.merge(src).when_matched_delete().execute()
    # on= names columns both sides share.
    assert t.merge(pa.table({"user": ["d"]}), on="user").when_matched_delete().execute().deleted == 1


def test_an_unconditional_delete_of_a_row_two_source_rows_match_deletes_it_once(tmp_path):
    """Delta (and delta-rs) allow several source rows to match a target row when the first matched clause is an
    unconditional delete: the row is deleted once. bitlake refused it (tests/test_merge_oracle.py found it)."""
    schema = pa.schema([("user", pa.string()), ("n", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "events"), schema)
    t.ingest(pa.table({"user": ["a", "b"], "n": [1, 2]}))
    twice = pa.table({"user": ["a", "a", "c"], "n": [5, 6, 7]})
    r = (t.merge(twice, "target.user = source.user").when_matched_delete().when_matched_update_all()
         .when_not_matched_insert_all().execute())
    assert (r.matched, r.deleted, r.updated, r.inserted) == (2, 1, 0, 1)
    assert sorted((x["user"], x["n"]) for x in t.to_arrow().to_pylist()) == [("b", 2), ("c", 7)]
    feed = sorted((x["_change_type"], x["user"]) for x in t.changes_to_arrow(starting_version=r.version).to_pylist())
    assert feed == [("delete", "a"), ("insert", "c")]
    # A conditional delete could disagree between the two source rows: still refused, as in Delta.
    t.ingest(pa.table({"user": ["a"], "n": [1]}))
    with pytest.raises(bitlake.InvalidInputError, match="more than one source row matched"):
        t.merge(twice, "target.user = source.user").when_matched_delete(predicate="source.n > 0").execute()


def test_a_source_zero_matches_a_target_negative_zero(tmp_path):
    """SQL's equality (and delta-rs's merge) has -0.0 = 0.0; bitlake's join (pyarrow's, which hashes the bits) and
    the ``isin`` that narrows the target rows to the source's keys told them apart: the -0.0 row was not updated
    and the source row was inserted beside it (tests/test_merge_oracle.py's probes found it)."""
    schema = pa.schema([("k", pa.float64()), ("n", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "floats"), schema)
    t.ingest(pa.table({"k": [-0.0, 1.0], "n": [1, 2]}))
    r = (t.merge(pa.table({"k": [0.0, 2.0], "n": [10, 20]}), "target.k = source.k")
         .when_matched_update(updates={"n": "source.n"}).when_not_matched_insert_all().execute())
    assert (r.matched, r.not_matched, r.updated, r.inserted) == (1, 1, 1, 1)
    assert sorted((x["k"], x["n"]) for x in t.to_arrow().to_pylist()) == [(0.0, 10), (1.0, 2), (2.0, 20)]
