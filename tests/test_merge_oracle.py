"""bitlake's merge against delta-rs's (docs/dml.md#merge): the same rows, the same merge (the same SQL predicate
and clause strings, kept to what both bitlake's SQL and DataFusion's accept), the same resulting rows and the same
figures (delta-rs's num_target_rows_updated/deleted/inserted against MergeResult.updated/deleted/inserted).

An append-only bitlake table is compared with a Delta table holding the same rows; a keyed one too, where its
documented differences from Delta cannot show: the predicate is the key's equality, the source has no duplicate
keys and its delta values are newer than the target's."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bitlake

deltalake = pytest.importorskip("deltalake")

SCHEMA = pa.schema([("k", pa.int64()), ("a", pa.int64()), ("s", pa.string())])
KEYED = pa.schema([("k", pa.int64()), ("a", pa.int64()), ("s", pa.string()), ("m", pa.int64())])

SETTINGS = settings(max_examples=60, derandomize=True, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Join predicates: the key's equality, alone or with a condition on the pair.
JOINS = ["target.k = source.k", "source.k = target.k", "target.k = source.k AND target.a < 5",
         "target.k = source.k AND (source.s IS NOT NULL OR target.a > 2)", "target.k = source.k AND target.s = source.s",
         "target.s = source.s AND source.k = target.k AND source.a <> target.a"]
MATCHED_PREDICATES = [None, "source.a > target.a", "target.a IS NULL", "source.s = 'x'",
                      "source.a > 2 AND target.a < 5", "source.s IS NULL OR target.a > 3", "target.s <> source.s",
                      "source.a IN (1, 2) OR target.s LIKE 'x%'", "NOT (target.a > 2)", "coalesce(source.a, 0) > 1"]
NOT_MATCHED_PREDICATES = [None, "source.a > 1", "source.s IS NULL", "source.a < 3 OR source.s = 'y'",
                          "source.a BETWEEN 0 AND 3",
                          "source.k IS NULL"]
BY_SOURCE_PREDICATES = [None, "target.a > 1", "target.s IS NULL", "target.a < 2 AND target.s = 'y'",
                        "target.k IS NULL OR target.a IS NULL"]
MATCHED_UPDATES = [{"a": "source.a + target.a"}, {"s": "'x'"}, {"a": "target.a * 2", "s": "source.s"},
                   {"a": "source.a - 1"},
                   {"s": "CASE WHEN source.a > 2 THEN 'x' ELSE target.s END", "a": "source.a % 3"},
                   {"s": "source.s || 'x'", "a": "coalesce(source.a, target.a, -1)"}]
INSERTS = [{"k": "source.k", "a": "source.a * 3"}, {"k": "source.k", "s": "'x'"}, {"a": "source.a", "s": "source.s"}]
BY_SOURCE_UPDATES = [{"a": "target.a - 1"}, {"s": "'x'"}, {"a": "target.a + 10", "s": "'z'"},
                     {"s": "upper(target.s)", "a": "abs(target.a)"}]

keys = st.one_of(st.none(), st.integers(0, 4))
values = st.one_of(st.none(), st.integers(-3, 8))
strings = st.one_of(st.none(), st.sampled_from(["x", "y", "z"]))


@st.composite
def clause(draw, keyed: bool = False):
    """One clause as (builder method, kwargs)."""
    kind = draw(st.sampled_from(["matched_update", "matched_update_all", "matched_delete", "insert", "insert_all",
                                 "by_source_update", "by_source_delete"]))
    if kind.startswith("matched"):
        p = draw(st.sampled_from(MATCHED_PREDICATES))
    elif kind.startswith("insert"):
        p = draw(st.sampled_from(NOT_MATCHED_PREDICATES))
    else:
        p = draw(st.sampled_from(BY_SOURCE_PREDICATES))
    kw = {} if p is None else {"predicate": p}
    if kind == "matched_update":
        return "when_matched_update", {"updates": draw(st.sampled_from(MATCHED_UPDATES)), **kw}
    if kind == "insert":
        updates = dict(draw(st.sampled_from(INSERTS)))
        if keyed:
            updates.update({"k": "source.k", "m": "source.m"})
        return "when_not_matched_insert", {"updates": updates, **kw}
    if kind == "by_source_update":
        return "when_not_matched_by_source_update", {"updates": draw(st.sampled_from(BY_SOURCE_UPDATES)), **kw}
    if kind in ("matched_update_all", "insert_all") and draw(st.booleans()):
        kw["except_cols"] = [draw(st.sampled_from(["a", "s"]))]
    return {"matched_update_all": "when_matched_update_all", "matched_delete": "when_matched_delete",
            "insert_all": "when_not_matched_insert_all", "by_source_delete": "when_not_matched_by_source_delete"}[kind], kw


NAN = 1e308  # NaN, which equals nothing, as a number rows can be sorted and compared by


def rows(table: pa.Table, names) -> list[tuple]:
    return sorted((tuple(NAN if isinstance(r[n], float) and r[n] != r[n] else r[n] for n in names)
                   for r in table.to_pylist()),
                  key=lambda r: tuple((v is None, v if v is not None else 0) for v in r))


def run_both(tmp_path, schema, target: pa.Table, source: pa.Table, join: str, clauses, keyed: bool):
    root = tmp_path / uuid.uuid4().hex
    if keyed:
        b = bitlake.create_table(str(root / "b"), schema, primary_key="k", delta_column="m")
    else:
        b = bitlake.create_table(str(root / "b"), schema)
    half = target.num_rows // 2  # two batches: two files on each side
    for part in (target.slice(0, half), target.slice(half)):
        if part.num_rows:
            b.ingest(part)
            deltalake.write_deltalake(str(root / "d"), part, mode="append")
    if not target.num_rows:
        deltalake.write_deltalake(str(root / "d"), target)
    d = deltalake.DeltaTable(str(root / "d"))
    if target.num_rows > 2:  # some rows deleted first (bitlake: invalid in their bitmaps, or tombstoned)
        b.delete("a < 0")
        d.delete("a < 0")
        d = deltalake.DeltaTable(str(root / "d"))
    bm, dm = b.merge(source, join), d.merge(source, join, source_alias="source", target_alias="target")
    for method, kw in clauses:
        bm, dm = getattr(bm, method)(**kw), getattr(dm, method)(**kw)
    r = bm.execute()
    metrics = dm.execute()
    got = rows(b.to_arrow(), schema.names)
    want = rows(deltalake.DeltaTable(str(root / "d")).to_pyarrow_table(), schema.names)
    return r, metrics, got, want


def check(r, metrics, got, want, context):
    assert got == want, context
    assert (r.updated, r.deleted, r.inserted) == (
        metrics["num_target_rows_updated"], metrics["num_target_rows_deleted"],
        metrics["num_target_rows_inserted"]), context


@st.composite
def append_only_case(draw):
    target = draw(st.lists(st.tuples(keys, values, strings), max_size=8))
    # Source keys repeat only where the first matched clause is an unconditional delete (Delta deletes the row
    # once; an update or a conditional delete is refused by both, test_both_refuse_...).
    repeat = draw(st.integers(0, 4)) == 0
    source_keys = draw(st.lists(st.integers(0, 5), unique=not repeat, max_size=5))
    nulls = draw(st.integers(0, 2))  # source rows with a null key: they match nothing
    source = [(k, draw(values), draw(strings)) for k in [*source_keys, *[None] * nulls]]
    source = draw(st.permutations(source))
    clauses = draw(st.lists(clause(), min_size=1, max_size=4))
    if repeat:
        clauses = [("when_matched_delete", {}), *clauses]
    return target, source, draw(st.sampled_from(JOINS)), clauses


def as_table(rows_, schema) -> pa.Table:
    return pa.table({n: [r[i] for r in rows_] for i, n in enumerate(schema.names)}, schema=schema)


@SETTINGS
@given(case=append_only_case())
def test_append_only_merge_equals_delta_rs(tmp_path, case):
    target, source, join, clauses = case
    r, metrics, got, want = run_both(tmp_path, SCHEMA, as_table(target, SCHEMA), as_table(source, SCHEMA), join,
                                     clauses, keyed=False)
    check(r, metrics, got, want, (target, source, join, clauses))


@st.composite
def keyed_case(draw):
    target_keys = draw(st.lists(st.integers(0, 6), unique=True, max_size=6))
    target = [(k, draw(values), draw(strings), 1) for k in target_keys]
    source_keys = draw(st.lists(st.integers(0, 6), unique=True, max_size=5))
    source = [(k, draw(values), draw(strings), 2) for k in source_keys]  # newer than the target's
    clauses = draw(st.lists(clause(keyed=True), min_size=1, max_size=4))
    return target, source, clauses


@SETTINGS
@given(case=keyed_case())
def test_keyed_merge_by_the_key_with_newer_source_equals_delta_rs(tmp_path, case):
    target, source, clauses = case
    r, metrics, got, want = run_both(tmp_path, KEYED, as_table(target, KEYED), as_table(source, KEYED),
                                     "target.k = source.k", clauses, keyed=True)
    check(r, metrics, got, want, (target, source, clauses))


def test_both_refuse_two_source_rows_for_one_target_row(tmp_path):
    """An update, or a conditional delete, of a target row that two source rows match is refused by both; an
    unconditional delete (the first matched clause) deletes it once in both."""
    target = as_table([(1, 1, "a"), (2, 2, "b")], SCHEMA)
    source = as_table([(1, 5, "x"), (1, 6, "y")], SCHEMA)
    b = bitlake.create_table(str(tmp_path / "b"), SCHEMA)
    b.ingest(target)
    deltalake.write_deltalake(str(tmp_path / "d"), target)

    def delta():
        return deltalake.DeltaTable(str(tmp_path / "d")).merge(source, "target.k = source.k", source_alias="source",
                                                               target_alias="target")

    refused = [("when_matched_update_all", {}), ("when_matched_delete", {"predicate": "source.a > 0"}),
               ("when_matched_update", {"updates": {"a": "source.a"}})]
    for method, kw in refused:
        with pytest.raises(bitlake.InvalidInputError, match="more than one source row matched"):
            getattr(b.merge(source, "target.k = source.k"), method)(**kw).execute()
        with pytest.raises(Exception, match="multiple source rows"):
            getattr(delta(), method)(**kw).execute()
    assert rows(b.to_arrow(), SCHEMA.names) == rows(target, SCHEMA.names)
    assert rows(deltalake.DeltaTable(str(tmp_path / "d")).to_pyarrow_table(), SCHEMA.names) == rows(target, SCHEMA.names)

    r = b.merge(source, "target.k = source.k").when_matched_delete().when_matched_update_all().execute()
    metrics = delta().when_matched_delete().when_matched_update_all().execute()
    check(r, metrics, rows(b.to_arrow(), SCHEMA.names),
          rows(deltalake.DeltaTable(str(tmp_path / "d")).to_pyarrow_table(), SCHEMA.names), "unconditional delete")
    assert rows(b.to_arrow(), SCHEMA.names) == [(2, 2, "b")]


FLOATS = pa.schema([("k", pa.float64()), ("a", pa.float64())])


@pytest.mark.parametrize("by_source", [False, True])
def test_float_keys_signed_zeros_and_nans_match_as_in_delta_rs(tmp_path, by_source):
    """-0.0 = 0.0 and NaN = NaN in the join, NaN greater than any number in a predicate (DataFusion's, Spark's
    order); with a by-source clause the whole target is read, without one only the rows the source's keys admit."""
    nan = float("nan")
    target = pa.table({"k": [-0.0, nan, 1.0, 3.0, None], "a": [1.0, nan, 1.5, 2.0, 0.0]}, schema=FLOATS)
    source = pa.table({"k": [0.0, nan, 1.0, 9.0], "a": [7.0, 2.0, nan, 1.0]}, schema=FLOATS)
    clauses = [("when_matched_update", {"updates": {"a": "source.a"}, "predicate": "source.a > target.a"}),
               ("when_matched_delete", {}), ("when_not_matched_insert_all", {"predicate": "source.a > 0.5"})]
    if by_source:
        clauses.append(("when_not_matched_by_source_update", {"updates": {"a": "target.a + 1"}}))
    r, metrics, got, want = run_both(tmp_path, FLOATS, target, source, "target.k = source.k", clauses, keyed=False)
    check(r, metrics, got, want, clauses)
