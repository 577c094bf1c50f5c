"""DuckDB and Polars over a table: the projection and the filter of a query reach bitlake's reader, and the
rows are exactly those of ``to_arrow`` — current and past views, narrow, filtered and full queries."""

from __future__ import annotations

import datetime as dt
import math
import os
import shutil
import subprocess
import sys
from decimal import Decimal

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import bitlake
import bitlake.polars as bp
from bitlake.engine.read import reader as reader_mod
from bitlake.errors import InvalidInputError, MissingDependencyError

SCHEMA = pa.schema([("k", pa.int64()), ("x", pa.float64()), ("s", pa.string()), ("day", pa.date32()),
                    ("n", pa.int32()), ("v", pa.int64())])


def _batch(keys, version, op="upsert"):
    keys = list(keys)
    return pa.table({"k": keys, "x": [float("nan") if k % 97 == 0 else k * 0.5 + version for k in keys],
                     "s": [None if k % 11 == 0 else f"s{(k + version) % 5}" for k in keys],
                     "day": [dt.date(2026, 1, 1) + dt.timedelta(days=(k * 7 + version) % 60) for k in keys],
                     "n": pa.array([k % 13 for k in keys], pa.int32()), "v": [version] * len(keys),
                     "op": [op] * len(keys)})


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """Version 1: 3,000 rows; 2: a third of them updated and 500 new; 3: 200 deleted, 100 updated."""
    t = bitlake.create_table(str(tmp_path_factory.mktemp("engines") / "t"), SCHEMA, primary_key="k",
                             delta_column="v")
    t.ingest(_batch(range(3000), 1), op_column="op")
    t.ingest(_batch(list(range(0, 3000, 3)) + list(range(3000, 3500)), 2), op_column="op")
    t.ingest(pa.concat_tables([_batch(range(1000, 1200), 3, "delete"), _batch(range(2000, 2100), 3)]),
             op_column="op")
    return t


@pytest.fixture
def asked(monkeypatch):
    """The columns and conditions bitlake's reader was asked for, one entry a read."""
    calls = []
    real = reader_mod.reader

    def spy(io, p, include_row_ids=False, where=None, columns=None, batch_rows=reader_mod.BATCH_ROWS):
        calls.append({"columns": columns, "where": where})
        return real(io, p, include_row_ids, where, columns, batch_rows)

    monkeypatch.setattr(reader_mod, "reader", spy)
    return calls


def _rows(table: pa.Table) -> list[tuple]:
    """Rows sorted by k, NaN made comparable."""
    rows = [tuple("nan" if isinstance(x, float) and math.isnan(x) else x for x in r.values())
            for r in table.to_pylist()]
    return sorted(rows, key=lambda r: r[0])


def _duck(sql: str, **names) -> list[tuple]:
    con = duckdb.connect()
    for name, obj in names.items():
        con.register(name, obj)
    rows = con.sql(sql).fetchall()
    return sorted((tuple("nan" if isinstance(x, float) and math.isnan(x) else x for x in r) for r in rows),
                  key=lambda r: r[0])


# ------------------------------------------------------------------------------------------------ DuckDB

@pytest.mark.parametrize("version", [None, 1, 2])
def test_duckdb_full_narrow_and_filtered_equal_to_arrow(table, version):
    v = table.view(version=version)
    assert _duck("SELECT * FROM v", v=v) == _rows(table.to_arrow(version=version))
    expected = table.to_arrow(version=version, columns=["n"])
    assert duckdb.sql("SELECT sum(n), count(*) FROM v").fetchall() == [(pc.sum(expected["n"]).as_py(),
                                                                        expected.num_rows)]
    where = (pc.field("day") >= dt.date(2026, 1, 10)) & (pc.field("day") < dt.date(2026, 2, 10)) \
        & (pc.field("s") != "s1")
    assert _duck("SELECT k, s, day FROM v WHERE day >= DATE '2026-01-10' AND day < DATE '2026-02-10' "
                 "AND s <> 's1'", v=v) == _rows(table.to_arrow(version=version, columns=["k", "s", "day"],
                                                                filter=where))
    assert _duck("SELECT k, x FROM v WHERE s IS NULL AND k BETWEEN 100 AND 2500", v=v) == _rows(
        table.to_arrow(version=version, columns=["k", "x"],
                       filter=pc.field("s").is_null() & (pc.field("k") >= 100) & (pc.field("k") <= 2500)))


def test_duckdb_pushes_the_projection_and_the_filter_into_the_reader(table, asked):
    v = table.view()  # noqa: F841 - DuckDB finds it by its name
    duckdb.sql("SELECT sum(n) FROM v").fetchall()
    assert asked[-1]["columns"] == ["n"] and asked[-1]["where"] is None
    duckdb.sql("SELECT sum(x) FROM v WHERE k > 3200 AND s = 's2'").fetchall()
    assert asked[-1]["columns"] == ["x"]
    pushed = str(asked[-1]["where"])
    assert "k" in pushed and "3200" in pushed and "s2" in pushed
    plan = duckdb.sql("EXPLAIN SELECT sum(x) FROM v WHERE k > 3200").fetchall()[0][1]
    assert "k>3200" in plan.replace(" ", "").replace('"', "")


def test_duckdb_filter_adds_to_the_views_own(table, asked):
    v = table.view(version=2, columns=["k", "n"], filter="n < 5")
    assert _duck("SELECT k FROM v WHERE k >= 3000", v=v) == _rows(
        table.to_arrow(version=2, columns=["k"], filter=(pc.field("n") < 5) & (pc.field("k") >= 3000)))
    assert "n" in str(asked[-1]["where"]) and "3000" in str(asked[-1]["where"])


def test_duckdb_reads_row_ids_of_a_view_that_has_them(table):
    v = table.view(include_row_ids=True)
    ids = table.to_arrow(include_row_ids=True)
    assert _duck("SELECT * FROM v", v=v) == _rows(ids)
    names = ids.schema.names[-3:]
    assert _duck(f"SELECT k, {names[2]} FROM v WHERE k < 50", v=v) == _rows(
        ids.filter(pc.field("k") < 50).select(["k", names[2]]))


def test_duckdb_and_polars_over_an_event_time_view(table):
    expected = table.to_arrow(version=3, valid_at=2)
    v = table.view(version=3, valid_at=2)
    assert _duck("SELECT * FROM v", v=v) == _rows(expected)
    assert _duck("SELECT k, v FROM v WHERE v = 1 AND k < 900", v=v) == _rows(
        expected.filter((pc.field("v") == 1) & (pc.field("k") < 900)).select(["k", "v"]))
    lf = bp.scan(table, version=3, valid_at=2)
    assert _rows(lf.filter(pl.col("v") == 2).collect().to_arrow()) == _rows(expected.filter(pc.field("v") == 2))


TYPES = pa.schema([("k", pa.int64()), ("ts", pa.timestamp("ms")), ("tz", pa.timestamp("us", tz="UTC")),
                   ("dec", pa.decimal128(12, 2)), ("b", pa.bool_()), ("i16", pa.int16()), ("u", pa.uint32()),
                   ("f", pa.float32()), ("d", pa.int64())])


@pytest.mark.parametrize("where", ["ts >= TIMESTAMP '2026-01-02 00:00:00'", "tz >= TIMESTAMPTZ '2026-01-02 00:00:00+00'",
                                   "dec > 10.5", "b", "NOT b", "i16 < 5", "u > 90", "f > 40.25", "k IN (1, 5, 7)",
                                   "k % 3 = 0", "k IS NULL", "ts::date = DATE '2026-01-02'"])
def test_duckdb_filters_of_every_type_give_the_rows_of_the_table(tmp_path, where):
    start = dt.datetime(2026, 1, 1)
    t = bitlake.create_table(str(tmp_path / "t"), TYPES, primary_key="k", delta_column="d")
    t.ingest(pa.table({"k": range(100), "ts": [start + dt.timedelta(hours=i) for i in range(100)],
                       "tz": [start.replace(tzinfo=dt.UTC) + dt.timedelta(hours=i) for i in range(100)],
                       "dec": [Decimal(i) / 4 for i in range(100)], "b": [i % 2 == 0 for i in range(100)],
                       "i16": range(100), "u": range(100), "f": [i / 2 for i in range(100)], "d": [1] * 100},
                      schema=TYPES))
    v, whole = t.view(), t.to_arrow()  # noqa: F841 - DuckDB finds them by their names
    assert duckdb.sql(f"SELECT k FROM v WHERE {where} ORDER BY k").fetchall() == \
        duckdb.sql(f"SELECT k FROM whole WHERE {where} ORDER BY k").fetchall()


def test_a_view_is_a_pyarrow_dataset_that_reads_like_one(table):
    v = table.view(version=2)
    expected = table.to_arrow(version=2)
    assert v.count_rows() == expected.num_rows
    assert v.count_rows(filter="k < 100") == expected.filter(pc.field("k") < 100).num_rows
    assert v.head(7).num_rows == 7
    assert _rows(v.to_table(columns=["k", "s"], filter=pc.field("n") == 3)) == _rows(
        expected.filter(pc.field("n") == 3).select(["k", "s"]))
    assert _rows(v.scanner(columns=["k"]).to_table()) == _rows(expected.select(["k"]))
    small = expected.filter(pc.field("k") < 100).select(["k"])
    assert v.scanner(columns=["k"], filter="k < 100").count_rows() == small.num_rows
    assert v.scanner(columns=["k"], filter="k < 100").head(3).num_rows == min(3, small.num_rows)
    scan = v.scanner(columns=["k", "s"])
    assert scan.projected_schema.names == ["k", "s"] and sum(b.num_rows for b in scan.to_batches()) == len(expected)
    assert sum(b.num_rows for b in v.to_batches(batch_size=100)) == expected.num_rows
    assert pa.table(v).num_rows == pl.DataFrame(v).height == expected.num_rows
    with pytest.raises(InvalidInputError, match="not in the view"):
        v.scanner(columns=["nope"])
    with pytest.raises(InvalidInputError, match="no join"):
        v.join(v, "k")


def test_duckdb_scans_the_table_itself_by_name_and_follows_its_commits(tmp_path, asked):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="k", delta_column="v")
    t.ingest(_batch(range(100), 1), op_column="op")
    assert duckdb.sql("SELECT count(*), sum(n) FROM t WHERE k >= 10").fetchall() == [
        (90, sum(k % 13 for k in range(10, 100)))]
    assert asked[-1]["columns"] == ["n"] and "10" in str(asked[-1]["where"])
    t.ingest(_batch(range(50, 150), 2), op_column="op")  # the next scan reads the new version
    assert _duck("SELECT * FROM t", t=t) == _rows(t.to_arrow())
    pinned = bitlake.open_table(t.path, version=1)
    assert _duck("SELECT * FROM pinned", pinned=pinned) == _rows(t.to_arrow(version=1))
    assert pinned.count_rows() == 100 and t.count_rows(filter="k >= 100") == 50
    assert pl.scan_pyarrow_dataset(t).select(pl.len()).collect().item() == 150
    with pytest.raises(InvalidInputError, match="no join"):
        t.join(t, "k")


def test_a_table_pickles_as_its_location_and_pinned_version(tmp_path):
    import pickle

    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="k", delta_column="v")
    t.ingest(_batch(range(10), 1), op_column="op")
    t.ingest(_batch(range(5), 2), op_column="op")
    again = pickle.loads(pickle.dumps(bitlake.open_table(t.path, version=1)))
    assert again.version == 1 and _rows(again.to_arrow()) == _rows(t.to_arrow(version=1))


def test_reads_of_one_version_plan_once(table, monkeypatch):
    from bitlake.engine.read import plan as plan_mod

    made = []
    real = plan_mod.plan
    monkeypatch.setattr(plan_mod, "plan", lambda *a, **k: made.append(a[2:]) or real(*a, **k))
    fresh = bitlake.open_table(table.path)
    for _ in range(3):
        fresh.to_arrow(columns=["k"])
        fresh.to_arrow(version=2)
    assert made == [(None,), (None,)]  # the latest version once, version 2 once
    import pickle

    state = fresh.state()
    assert state.derived and pickle.loads(pickle.dumps(state)).derived == {}  # Spark tasks get no plans


def test_a_landed_file_of_every_offset_of_its_segment_is_filtered_by_position(tmp_path, monkeypatch):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="k", delta_column="v")
    t.ingest(_batch(range(10), 1), op_column="op")
    t.ingest(_batch([0, 7, 8, 9], 2), op_column="op")  # the first file's last three rows go: its kept array ends early
    read = []
    real = reader_mod._chunks
    monkeypatch.setattr(reader_mod, "_chunks", lambda io, meta, files, needed, *rest: read.append(needed)
                        or real(io, meta, files, needed, *rest))
    out = t.to_arrow()
    assert sorted(zip(out["k"].to_pylist(), out["v"].to_pylist(), strict=True)) == \
        [(0, 2)] + [(k, 1) for k in range(1, 7)] + [(k, 2) for k in (7, 8, 9)]
    assert all("_segment_offset" not in columns for columns in read)
    read.clear()
    assert t.to_arrow(filter="k > 0").num_rows == 9 and any("_segment_offset" in c for c in read)  # by offset


def test_a_table_whose_files_are_all_kept_is_read_by_pyarrows_own_scanner(tmp_path, monkeypatch):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="k", delta_column="v")
    t.ingest(_batch(range(300), 1), op_column="op")
    t.ingest(_batch(range(0, 300, 4), 2), op_column="op")
    t.compact(major=True)
    where = (pc.field("n") > 4) & (pc.field("day") < dt.date(2026, 2, 1))
    duck = "SELECT k, n, s FROM t WHERE n > 4 AND day < DATE '2026-02-01'"
    native = [t.to_arrow(), t.to_arrow(columns=["k", "s"], filter=where), t.to_arrow(version=2), _duck(duck, t=t)]
    monkeypatch.setattr(reader_mod, "_kept", lambda *a: pytest.fail("the native scan filters no chunk in Python"))
    assert _rows(t.to_arrow()) == _rows(native[0]) and t.count_rows() == 300
    monkeypatch.undo()
    # With a condition Polars decodes only the rows it may keep (tests/test_prefiltered.py): not the native scan.
    monkeypatch.setattr(reader_mod, "_scanner", lambda *a: pytest.fail("a condition Polars takes is Polars' read"))
    assert _rows(t.to_arrow(columns=["k", "s"], filter=where)) == _rows(native[1])
    monkeypatch.undo()
    monkeypatch.setattr(reader_mod, "_native", lambda *a: None)  # bitlake's own reader gives the same rows
    assert _rows(t.to_arrow()) == _rows(native[0]) and _duck(duck, t=t) == native[3]
    assert _rows(t.to_arrow(columns=["k", "s"], filter=where)) == _rows(native[1])
    assert _rows(t.to_arrow(version=2)) == _rows(native[2])  # version 2 has superseded rows: never native


def test_the_reader_keeps_the_file_order_and_raises_what_a_file_read_raises(table, tmp_path, monkeypatch):
    expected = table.to_arrow()  # several files read at once
    monkeypatch.setattr(reader_mod, "READERS", 1)
    assert table.to_arrow(columns=["k"]).column("k").to_pylist() == expected.column("k").to_pylist()
    assert len(table.state().data_files()) > reader_mod.READERS
    fresh = bitlake.open_table(str(shutil.copytree(table.path, tmp_path / "copy")))  # the fixture's table is shared
    v = fresh.view()  # planned: the bitmaps are read
    gone = sorted(f.path for f in fresh.state().data_files())[-1]
    os.remove(fresh.io.local_path(gone))
    with pytest.raises(FileNotFoundError, match=gone.rsplit("/", 1)[-1]):
        v.to_table()


# ------------------------------------------------------------------------------------------------ Polars

@pytest.mark.parametrize("version", [None, 1])
def test_polars_scan_equals_to_arrow(table, version):
    lf = bp.scan(table, version=version)
    expected = table.to_arrow(version=version)
    assert _rows(lf.collect().to_arrow()) == _rows(expected)
    assert lf.select(pl.col("n").sum()).collect().item() == pc.sum(expected["n"]).as_py()
    month = lf.filter(pl.col("day").is_between(dt.date(2026, 1, 10), dt.date(2026, 2, 10), closed="left")
                      & (pl.col("s") != "s1")).select("k", "s", "day")
    where = (pc.field("day") >= dt.date(2026, 1, 10)) & (pc.field("day") < dt.date(2026, 2, 10)) \
        & (pc.field("s") != "s1")
    assert _rows(month.collect().to_arrow()) == _rows(expected.filter(where).select(["k", "s", "day"]))


def test_polars_scan_of_a_path_and_a_past_version(table):
    lf = bp.scan(table.io.uri(), version=2)
    assert _rows(lf.collect().to_arrow()) == _rows(table.to_arrow(version=2))


def test_polars_pushes_columns_filter_and_row_limit(table, asked):
    lf = bp.scan(table)
    lf.select(pl.col("n").sum()).collect()
    assert asked[-1]["columns"] == ["n"] and asked[-1]["where"] is None
    out = lf.filter((pl.col("k") > 3200) & pl.col("s").str.contains("2")).select("k", "x").collect()
    assert set(asked[-1]["columns"]) == {"k", "x", "s"} and "3200" in str(asked[-1]["where"])
    expected = table.to_arrow(filter=(pc.field("k") > 3200) & pc.match_substring(pc.field("s"), "2"))
    assert _rows(out.to_arrow()) == _rows(expected.select(["k", "x"]))
    assert lf.head(10).collect().height == 10
    assert lf.filter(pl.col("k") >= 3000).head(5).collect()["k"].min() >= 3000


def test_polars_predicates_that_stay_with_polars_are_exact(table):
    """NaN is above every number in Polars and equal to itself; pyarrow compares it false: float comparisons
    are not pushed. A predicate that does not translate (a string function, an expression of two columns) is
    applied to each batch."""
    lf = bp.scan(table)
    expected = table.to_arrow()
    got = lf.filter(pl.col("x") > 1000).select("k").collect()["k"].to_list()
    xs = expected["x"].to_pylist()
    assert sorted(got) == sorted(k for k, x in zip(expected["k"].to_pylist(), xs, strict=True)
                                 if math.isnan(x) or x > 1000)
    got = lf.filter(pl.col("k") * 2 > pl.col("n") + 5000).select("k").collect()["k"].to_list()
    assert sorted(got) == sorted(k for k, n in zip(expected["k"].to_pylist(), expected["n"].to_pylist(),
                                                   strict=True) if k * 2 > n + 5000)


def test_polars_predicate_translation():
    schema = SCHEMA
    assert str(bp.to_arrow_expression((pl.col("k") > 3) & (pl.col("s") == "u"), schema)) == \
        str((pc.field("k") > 3) & (pc.field("s") == "u"))
    assert bp.to_arrow_expression(pl.col("x") > 1, schema) is None
    assert str(bp.to_arrow_expression((pl.col("k") > 1) & pl.col("s").str.contains("a"), schema)) == \
        str(pc.field("k") > 1)
    assert bp.to_arrow_expression((pl.col("k") > 1) | pl.col("s").str.contains("a"), schema) is None
    assert bp.to_arrow_expression(None, schema) is None


def test_polars_is_optional(monkeypatch, table):
    out = subprocess.run([sys.executable, "-c", "import sys, bitlake, bitlake.polars; "
                          "print('polars' in sys.modules)"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    monkeypatch.setitem(sys.modules, "polars", None)
    with pytest.raises(MissingDependencyError, match="pip install polars"):
        bp.scan(table)
