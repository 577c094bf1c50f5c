"""What DuckDB and Polars push into a bitlake table gives the rows they find in the same rows in memory: for
hypothesis-drawn conditions over integers, floats with NaN and nulls, strings and dates, the query over the table
(its projection and filters pushed into bitlake's reader, its files pruned by their statistics and row groups by
Parquet's) equals the query over ``to_arrow()``'s table, for the current and a past version."""

from __future__ import annotations

import datetime as dt
import math

import duckdb
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bitlake
import bitlake.polars as bp

SCHEMA = pa.schema([("k", pa.int64()), ("n", pa.int32()), ("x", pa.float64()), ("s", pa.string()),
                    ("day", pa.date32()), ("v", pa.int64())])


def _batch(keys, version):
    keys = list(keys)
    return pa.table({
        "k": keys, "n": pa.array([None if k % 17 == 0 else k % 50 - 10 for k in keys], pa.int32()),
        "x": [math.nan if k % 23 == 0 else None if k % 19 == 0 else (k % 40) / 4 - 3 for k in keys],
        "s": [None if k % 13 == 0 else f"s{(k + version) % 7}" for k in keys],
        "day": [dt.date(2026, 1, 1) + dt.timedelta(days=(k * 3 + version) % 100) for k in keys],
        "v": [version] * len(keys)}, schema=SCHEMA)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """Several files of separate key ranges (their bounds differ), then updates across them."""
    t = bitlake.create_table(str(tmp_path_factory.mktemp("oracle") / "t"), SCHEMA, primary_key="k",
                             delta_column="v")
    for i in range(4):
        t.ingest(_batch(range(i * 400, i * 400 + 400), 1))
    t.ingest(_batch(range(100, 1500, 7), 2))
    return t


_LITERALS = {
    "k": st.integers(-5, 1700).map(str), "n": st.integers(-12, 42).map(str),
    "x": st.sampled_from(["0", "-3", "2.5", "6.75", "CAST('NaN' AS DOUBLE)", "-1e308"]),
    "s": st.sampled_from(["'s0'", "'s3'", "'s6'", "'s9'", "''"]),
    "day": st.dates(dt.date(2025, 12, 1), dt.date(2026, 5, 1)).map(lambda d: f"DATE '{d}'"),
}


@st.composite
def _condition(draw, depth=0):
    if depth < 2 and draw(st.integers(0, 2)) == 0:
        a, b = draw(_condition(depth + 1)), draw(_condition(depth + 1))
        return draw(st.sampled_from([f"({a} AND {b})", f"({a} OR {b})", f"(NOT {a})"]))
    column = draw(st.sampled_from(sorted(_LITERALS)))
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return f"{column} IS {draw(st.sampled_from(['', 'NOT ']))}NULL"
    if kind == 1:
        low, high = sorted([draw(_LITERALS[column]), draw(_LITERALS[column])])
        return f"{column} BETWEEN {low} AND {high}"
    if kind == 2:
        values = ", ".join(draw(st.lists(_LITERALS[column], min_size=1, max_size=3)))
        return f"{column} IN ({values})"
    op = draw(st.sampled_from(["<", "<=", "=", "<>", ">=", ">"]))
    return f"{column} {op} {draw(_LITERALS[column])}"


def _keys(rows) -> list[int]:
    return sorted(r[0] for r in rows)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(condition=_condition(), version=st.sampled_from([None, 4]))
def test_duckdb_over_the_table_finds_the_rows_it_finds_in_memory(table, condition, version):
    v = table.view(version=version)  # noqa: F841 - DuckDB finds it by its name
    rows = table.to_arrow(version=version)  # noqa: F841
    query = f"SELECT k FROM {{}} WHERE {condition}"
    assert _keys(duckdb.sql(query.format("v")).fetchall()) == _keys(duckdb.sql(query.format("rows")).fetchall())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(condition=_condition(), version=st.sampled_from([None, 4]))
def test_polars_over_the_table_finds_the_rows_it_finds_in_memory(table, condition, version):
    # Polars' SQL over the lazy scan: its predicate goes to bitlake's IO plugin, the rest stays with Polars.
    lazy = bp.scan(table, version=version)
    eager = pl.from_arrow(table.to_arrow(version=version)).lazy()
    query = f"SELECT k FROM t WHERE {condition}"
    try:
        expected = pl.SQLContext(t=eager).execute(query).collect()
    except Exception:  # noqa: BLE001 - a condition Polars' SQL does not take: nothing to compare
        return
    got = pl.SQLContext(t=lazy).execute(query).collect()
    assert sorted(got["k"].to_list()) == sorted(expected["k"].to_list())
