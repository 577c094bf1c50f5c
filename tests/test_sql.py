"""SQL conditions and values without Spark (bitlake/sql.py): each construct against its answer on Arrow, the
types SQL implies where pyarrow's differ, and every name or construct it cannot take refused by name."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

import bitlake
from bitlake import sql

TABLE = pa.table({
    "id": pa.array([1, 2, 3], pa.int32()), "name": ["a", "Bob", None], "bal": [1.5, 2.5, None],
    "d": pa.array([dt.date(2024, 1, 1), dt.date(2024, 2, 1), None]),
    "ts": pa.array([dt.datetime(2024, 1, 1), dt.datetime(2024, 3, 1), None], pa.timestamp("us", "UTC")),
    "amt": pa.array([1, 2, 3], pa.decimal128(10, 2))})


def values(text: str, what: str = "condition") -> list:
    return ds.dataset(TABLE).to_table(columns={"x": sql.to_expression(text, TABLE.schema, what=what)}).column(0).to_pylist()


@pytest.mark.parametrize("text, expected", [
    ("id = 2", [False, True, False]),
    ("id > 1 and bal < 3", [False, True, None]),  # three-valued: unknown stays unknown
    ("id > 2 or bal < 2", [True, False, True]),
    ("not (id = 1)", [False, True, True]),
    ("name like 'B%'", [False, True, None]),
    ("name ilike 'b%'", [False, True, None]),
    ("name not like 'B%'", [True, False, None]),
    ("d >= '2024-01-15'", [False, True, None]),  # a string read as a date
    ("d between date '2024-01-01' and '2024-01-31'", [True, False, None]),
    ("ts > '2024-02-01'", [False, True, None]),  # no zone: UTC
    ("ts > timestamp '2024-02-01 00:00:00'", [False, True, None]),
    ("ts < d", [False, False, None]),  # a date compared with a zoned timestamp
    ("id in (1, 3)", [True, False, True]),
    ("id not in (1, 3)", [False, True, False]),
    ("name in ('a', 'x')", [True, False, None]),
    ("d in ('2024-01-01')", [True, False, None]),
    ("id in (1, id + 0)", [True, True, True]),  # not all constants: a disjunction
    ("name is null", [False, False, True]),
    ("bal is not null", [True, True, False]),
    ("amt > 1.5", [False, True, True]),
    ("id % 2 = 1", [True, False, True]),
    ("id / 2 > 0.7", [False, True, True]),  # / divides as floating point
    ("coalesce(bal, 0) > 2", [False, True, False]),
    ("lower(name) = 'bob'", [False, True, None]),
    ("case when id > 1 then 'big' else 'small' end = 'big'", [False, True, True]),
    ("case id when 1 then 'one' end = 'one'", [True, None, None]),
    ("id <=> 2", [False, True, False]),
    ("name <=> null", [False, False, True]),
    ("starts_with(name, 'B')", [False, True, None]),
    ("if(bal > 2, true, false)", [False, True, False]),  # unknown takes the else branch
    ("(id > 1) is true", [False, True, True]),
    ("ID = 1", [True, False, False]),  # names match without regard to case when that is unique
    ("`id` = 1", [True, False, False]),
])
def test_conditions(text, expected):
    assert values(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("bal * 2", [3.0, 5.0, None]),
    ("'fixed'", ["fixed"] * 3),
    ("name || '!'", ["a!", "Bob!", None]),
    ("cast(id as string)", ["1", "2", "3"]),
    ("-id", [-1, -2, -3]),
    ("round(bal)", [2.0, 3.0, None]),  # half up, as Spark
    ("nullif(id, 2)", [1, None, 3]),
    ("null", [None] * 3),
    ("amt * 2", [Decimal("2.00"), Decimal("4.00"), Decimal("6.00")]),  # 2 is decimal(1, 0), as in Spark
    ("amt * id", [Decimal("1.00"), Decimal("4.00"), Decimal("9.00")]),
    ("case when id > 1 then 1 else 2.5 end", [2.5, 1.0, 1.0]),  # branches of a mix of numbers: float64
])
def test_values(text, expected):
    assert values(text, "value") == expected


@pytest.mark.parametrize("text, message", [
    ("fixed", r"no column 'fixed' \(a string value is written in quotes: 'fixed'\)"),
    ("id = ", "is not a SQL expression"),
    ("foo(id) = 1", r"function foo\(\) is not supported without Spark"),
    ("select 1", "is a statement"),
    ("id + 1", "is not a condition"),
    ("x.id = 1", "unknown table 'x'"),
    ("d > 'nope'", "'nope' is not a value of type date32"),
    ("id in (select 1)", "IN takes a list"),
    ("name like id", "LIKE takes a string pattern"),
    ("", "non-empty"),
])
def test_refused_by_name(text, message):
    with pytest.raises(bitlake.InvalidInputError, match=message):
        values(text)


def test_qualified_names_resolve_in_a_scope_and_ambiguity_is_refused():
    schema = pa.schema([("source.id", pa.int64()), ("source.x", pa.int64()), ("target.id", pa.int64()),
                        ("target.y", pa.int64())])
    scope = sql.Scope(schema, {"source": {"id": "source.id", "x": "source.x"}, "target": {"id": "target.id", "y": "target.y"}})
    table = pa.table({"source.id": [1], "source.x": [2], "target.id": [1], "target.y": [3]})
    e = sql.to_expression("source.id = target.id and x < y", scope)
    assert ds.dataset(table).to_table(columns={"_": e}).column(0).to_pylist() == [True]
    with pytest.raises(bitlake.InvalidInputError, match="'id' is ambiguous: qualify it as source.id or target.id"):
        sql.to_expression("id = 1", scope)
    with pytest.raises(bitlake.InvalidInputError, match="target has no column 'x'"):
        sql.to_expression("target.x = 1", scope)


def test_a_filter_string_is_pushed_into_the_files(tmp_path):
    """``to_arrow(filter=...)`` takes SQL; row groups its statistics rule out are not read."""
    t = bitlake.create_table(str(tmp_path / "t"), pa.schema([("id", pa.int64()), ("bal", pa.float64())]))
    t.ingest(pa.table({"id": list(range(1000)), "bal": [i / 10 for i in range(1000)]}))
    assert sorted(t.to_arrow(filter="bal > 99.5 and id % 2 = 1").column("id").to_pylist()) == [997, 999]
    assert t.to_arrow(filter="id in (3, 4)", columns=["id"]).num_rows == 2
    assert t.view(filter="bal < 0").to_table().num_rows == 0
    with pytest.raises(bitlake.InvalidInputError, match="no column 'nope'"):
        t.to_arrow(filter="nope > 1")


# Regressions found by tests/test_sql_oracle.py (bitlake against DuckDB, Spark's rules where they differ).
EDGE = pa.table({"f": [1.5, float("nan"), -0.0, None], "i": pa.array([1, 0, -2, None], pa.int32()),
                 "j": pa.array([1 << 40, 0, -3, None], pa.int64())})


def edge(text: str, what: str = "condition") -> list:
    return ds.dataset(EDGE).to_table(columns={"x": sql.to_expression(text, EDGE.schema, what=what)}).column(0).to_pylist()


@pytest.mark.parametrize("text, expected", [
    # NaN as Spark orders it: equal to NaN, greater than any other number (pyarrow: false both ways).
    ("f = cast('NaN' as double)", [False, True, False, None]),
    ("f > 100", [False, True, False, None]),
    ("f >= f", [True, True, True, None]),
    ("f < 100", [True, False, True, None]),
    ("f <> f", [False, False, False, None]),
    ("f between 0 and f", [True, True, True, None]),
    ("nullif(f, f) is null", [True, True, True, True]),
    ("f <=> f", [True, True, True, True]),
    ("coalesce(f, 0) > 1e300", [False, True, False, False]),
    # x IN (..., NULL) is true or unknown, never false; null IN (NULL) is unknown, not true.
    ("i in (1, null)", [True, None, None, None]),
    ("i not in (1, null)", [False, None, None, None]),
    ("i in (null)", [None, None, None, None]),
    ("f in (0.0)", [False, False, True, None]),  # -0.0 = 0.0
    ("f not in (0.0, null)", [None, None, False, None]),
])
def test_sql_rules_where_pyarrow_differs(text, expected):
    assert edge(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("cast(f * 0 + 2.7 as int)", [2, None, 2, None]),  # toward zero, as Spark (NaN * 0 is NaN: see below)
    ("cast(i - 0.5 as int)", [0, 0, -2, None]),
    ("cast(i as string)", ["1", "0", "-2", None]),
])
def test_casts_as_spark(text, expected):
    if "f *" in text:
        with pytest.raises(pa.ArrowInvalid, match="nan"):  # NaN to an integer: an error, as in Spark's ANSI mode
            edge(text, "value")
        assert edge("cast(coalesce(nullif(f, f), 2.7) as int)", "value") == [2, 2, 2, 2]
        return
    assert edge(text, "value") == expected


@pytest.mark.parametrize("text", ["1 / i", "1.5 / (f - f)", "i % 0"])
def test_division_by_zero_is_an_error_not_inf(text):
    """Spark's ANSI mode raises DIVIDE_BY_ZERO; pyarrow's divide gave inf (or NaN for 0/0)."""
    with pytest.raises(pa.ArrowInvalid, match="divide by zero"):
        edge(text, "value")


@pytest.mark.parametrize("text", ["cast(j as int)", "cast(f as bigint)"])
def test_a_cast_that_does_not_convert_is_an_error_not_garbage(text):
    """sqlglot reads Spark's CAST as TRY_CAST; pyarrow's unsafe cast wrapped 2**40 to 0 and NaN to INT64_MIN."""
    with pytest.raises(pa.ArrowInvalid):
        edge(text, "value")


@pytest.mark.parametrize("text", ["cast(f as string)", "f || 'x'", "cast(ts as string)"])
def test_strings_pyarrow_writes_unlike_spark_are_refused(text):
    """pyarrow writes 1.0 as '1' (Spark '1.0') and a timestamp with its zone: refused by name."""
    with pytest.raises(bitlake.InvalidInputError, match="as a string .* is not supported"):
        sql.to_expression(text, EDGE.schema.append(pa.field("ts", pa.timestamp("us", "UTC"))), what="value")


@pytest.mark.parametrize("text, expected", [
    ("j * 0.5", [float(1 << 39), 0.0, -1.5, None]),  # pyarrow's implicit cast refused an int64 beyond 2**24
    ("j % 0.5 = 0", [True, True, True, None]),  # -3 % 0.5 is -0.0
    ("i in (1.5, -2)", [False, False, True, None]),  # compared as doubles (the list was refused)
    ("cast(m as int)", [-2, 123, 0, None]),  # decimal to integer: toward zero
    ("m + j", [Decimal("1099511627773.25"), Decimal("123.45"), Decimal("-3.01"), None]),  # refused: precision
    ("m in (3, 123.45)", [False, True, False, None]),  # the list was refused: precision
])
def test_numbers_of_mixed_kinds_meet_as_spark_widens(text, expected):
    table = EDGE.append_column("m", pa.array([Decimal("-2.75"), Decimal("123.45"), Decimal("-0.01"), None],
                                             pa.decimal128(10, 2)))
    what = "condition" if any(op in text for op in ("=", " in ")) else "value"
    got = ds.dataset(table).to_table(columns={"x": sql.to_expression(text, table.schema, what=what)})
    assert got.column(0).to_pylist() == expected


def test_a_decimal_value_of_more_places_is_rounded_half_up_to_the_column(tmp_path):
    """``x * x`` on a decimal(10, 2) column has four places: stored rounded half up, as Spark stores it (it was
    refused: 'Rescaling Decimal value would cause data loss'); ``x * 2`` was refused (45 digits)."""
    schema = pa.schema([("id", pa.int64()), ("x", pa.decimal128(10, 2)), ("d", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key="id", delta_column="d")
    t.ingest(pa.table({"id": [1, 2], "x": [Decimal("1.25"), Decimal("2.50")], "d": [1, 1]}, schema=schema))
    assert t.update("id = 1", {"x": "x * x"}).matched == 1 and t.update("id = 2", {"x": "x * 2"}).matched == 1
    assert t.to_arrow().sort_by("id").column("x").to_pylist() == [Decimal("1.56"), Decimal("5.00")]


def test_a_float_compared_with_a_number_stays_a_comparison_the_scan_prunes_by():
    """Spark's NaN rule (NaN is greater than any number) needs no if_else against a number that is not NaN:
    ``bal < 2`` stays pyarrow's comparison (row groups are skipped by it), ``bal > 2`` adds the NaN rows."""
    assert "if_else" not in str(sql.to_expression("bal < 2", TABLE.schema))
    assert "if_else" not in str(sql.to_expression("bal > 2", TABLE.schema))
    assert "is_nan" not in str(sql.to_expression("bal <= 2.5", TABLE.schema))
    nan = pa.table({"bal": [float("nan"), 1.0, None, 3.0]})
    for text, expected in [("bal > 2", [True, False, None, True]), ("2 > bal", [False, True, None, False]),
                           ("bal = 1", [False, True, None, False]), ("bal <> 1", [True, False, None, True])]:
        assert ds.dataset(nan).to_table(columns={"x": sql.to_expression(text, nan.schema)}).column(0).to_pylist() \
            == expected, text
