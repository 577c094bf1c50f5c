"""Per-file column statistics (docs/FORMAT.md, "File statistics"): every file a commit adds carries the exact
bounds and null counts of its rows, readers skip the files a filter rules out without opening them, and a read
with a filter returns exactly the rows of the unfiltered read filtered afterwards, whatever the filter."""

from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bitlake
from bitlake.engine.read import reader as reader_mod
from bitlake.format import datafile, stats
from bitlake.format.commit import DataFile, SegmentRows

SCHEMA = pa.schema([("k", pa.int64()), ("x", pa.float64()), ("s", pa.string()), ("day", pa.date32()),
                    ("ts", pa.timestamp("us", tz="UTC")), ("m", pa.decimal128(10, 2)), ("b", pa.bool_()),
                    ("v", pa.int64())])
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _rows(keys, version, *, nan_every=0, long_strings=False):
    keys = list(keys)
    return pa.table({
        "k": keys,
        "x": [math.nan if nan_every and k % nan_every == 0 else None if k % 7 == 0 else k / 4 for k in keys],
        "s": [None if k % 5 == 0 else ("y" * 70 if long_strings else f"s{k % 13:02d}") for k in keys],
        "day": [dt.date(2026, 1, 1) + dt.timedelta(days=k % 90) for k in keys],
        "ts": [T0 + dt.timedelta(minutes=k) for k in keys],
        "m": [Decimal(k) / 4 if k % 3 else None for k in keys],
        "b": [k % 2 == 0 for k in keys], "v": [version] * len(keys)}, schema=SCHEMA)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """Four batches of disjoint key ranges (one file each), then updates across them."""
    t = bitlake.create_table(str(tmp_path_factory.mktemp("stats") / "t"), SCHEMA, primary_key="k",
                             delta_column="v")
    for i in range(4):
        t.ingest(_rows(range(i * 1000, (i + 1) * 1000), 1, nan_every=97 if i == 2 else 0, long_strings=i == 3))
    t.ingest(_rows(range(500, 2500, 10), 2))
    return t


def _expected(path: str, t: bitlake.Table) -> dict:
    rows = datafile.read_data(t.io, path, t.metadata)
    out: dict = {"min": {}, "max": {}, "nulls": {}}
    for f in SCHEMA:
        if not stats.covered(f.type):
            continue
        column = rows.column(f.name)
        out["nulls"][f.name] = column.null_count
        values = [v for v in column.to_pylist() if v is not None]
        if not values or any(isinstance(v, float) and not math.isfinite(v) for v in values):
            continue
        lo, hi = min(values), max(values)
        out["min"][f.name], out["max"][f.name] = (stats.encode(v, f.type) for v in (lo, hi))
    return out


def _bounds(f: DataFile) -> dict:
    """A file's bounds and null counts (its statistics without the dictionary hint)."""
    return {k: dict(v) for k, v in f.stats.items() if k != "dictionary"}


def test_every_added_file_carries_the_exact_bounds_and_null_counts_of_its_rows(table):
    files = table.state().data_files()
    assert len(files) == 5
    for f in files:
        assert f.stats is not None
        assert _bounds(f) == _expected(f.path, table)


def test_files_a_vacuum_and_a_compaction_write_carry_them_too(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="k", delta_column="v")
    for i in range(3):
        t.ingest(_rows(range(i * 300, i * 300 + 400), i + 1, nan_every=50 if i == 1 else 0))
    t.tombstone("k", list(range(0, 900, 4)))
    t.vacuum()
    t.compact(major=True)
    files = t.state().data_files()
    assert files and all(f.offsets is not None for f in files)  # all rewritten by the compaction
    for f in files:
        assert _bounds(f) == _expected(f.path, t)


@pytest.mark.parametrize("file_format", ["parquet", "orc"])
def test_parquet_bounds_from_footers_and_orc_bounds_from_values_agree(tmp_path, file_format):
    # A table keeps timestamps in microseconds: the bounds count microseconds.
    schema = pa.schema([("k", pa.int64()), ("sec", pa.timestamp("s")), ("ns", pa.timestamp("ns", tz="UTC")),
                        ("u", pa.uint64() if file_format == "parquet" else pa.int64()), ("s", pa.string()),
                        ("v", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key="k", delta_column="v",
                             file_format=file_format)
    t.ingest(pa.table({"k": [1, 2, 3], "sec": pa.array([10, None, 5], pa.timestamp("s")),
                       "ns": pa.array([7000, 8000, 10**9], pa.timestamp("ns", tz="UTC")),
                       "u": pa.array([2**63 - 1, 0, 5], schema.field("u").type), "s": ["é", "a", "z"],
                       "v": [1, 1, 1]},
                      schema=schema))
    (f,) = t.state().data_files()
    assert _bounds(f) == {"min": {"k": 1, "sec": 5 * 10**6, "ns": 7, "u": 0, "v": 1},
                          "max": {"k": 3, "sec": 10**7, "ns": 10**6, "u": 2**63 - 1, "v": 1},
                          "nulls": {"k": 0, "sec": 1, "ns": 0, "u": 0, "v": 0}}
    assert t.to_arrow(filter=pc.field("sec") > pa.scalar(20, pa.timestamp("s"))).num_rows == 0


def test_bounds_are_left_out_for_nan_and_strings_get_no_statistics(table):
    by_first = {min(r.part for r in f.segments): f for f in table.state().data_files()}
    with_nan = by_first[3]
    assert "x" not in with_nan.stats["min"] and with_nan.stats["nulls"]["x"] > 0 and "x" in by_first[1].stats["min"]
    assert all("s" not in f.stats["nulls"] for f in by_first.values())


def test_the_json_form_of_each_type(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="k", delta_column="v")
    t.ingest(_rows([8, 16], 1))
    (f,) = t.state().data_files()
    entry = f.to_json()["stats"]
    assert entry["min"] == {"k": 8, "x": 2.0, "day": "2026-01-09",
                            "ts": int((T0 + dt.timedelta(minutes=8)).timestamp() * 1_000_000),
                            "m": "2.00", "v": 1}
    assert entry["max"]["m"] == "4.00" and entry["max"]["x"] == 4.0 and entry["nulls"]["m"] == 0
    assert "b" not in entry["nulls"] and "s" not in entry["nulls"]  # booleans and strings get none
    assert DataFile.from_json(f.to_json()) == f


def test_a_filter_opens_only_the_files_its_bounds_allow(table, monkeypatch):
    opened = []  # the data files given to pyarrow's scanner (it opens each of them)
    real = reader_mod._chunks
    monkeypatch.setattr(reader_mod, "_chunks", lambda io, meta, files, *a: opened.extend(f.path for f in files)
                        or real(io, meta, files, *a))
    table.view()  # planned (its bitmaps read) before the count starts
    opened.clear()
    out = table.to_arrow(filter=(pc.field("k") >= 3100) & (pc.field("k") < 3200))
    assert sorted(out.column("k").to_pylist()) == list(range(3100, 3200))
    assert len([p for p in opened if p.startswith("data/")]) == 1
    opened.clear()
    assert table.to_arrow(filter="day > DATE '2027-01-01'").num_rows == 0
    assert not [p for p in opened if p.startswith("data/")]


def test_a_comparison_with_nan_prunes_nothing(table):
    # pyarrow 26 prunes row groups (and would prune files) wrongly by such a filter: x < NaN is false for every
    # number, so its negation holds for every row with an x.
    where = ~(pc.field("x") < math.nan)
    assert not stats.prunes_safely(where) and stats.prunes_safely(pc.field("x") < 2.5)
    assert table.to_arrow(filter=where).num_rows == table.to_arrow().filter(where).num_rows > 0


def test_analyze_records_the_statistics_of_files_written_without_them(tmp_path, monkeypatch, capsys):
    from bitlake.cli import main

    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="k", delta_column="v")
    with monkeypatch.context() as m:  # a bitlake that recorded no statistics
        m.setattr(datafile.FileWriter, "stats", lambda self: None)
        for i in range(3):
            t.ingest(_rows(range(i * 100, i * 100 + 150), i + 1, nan_every=40 if i == 1 else 0))
    assert all(f.stats is None for f in t.state().data_files())
    before = t.version
    def view(v):
        rows = t.to_arrow(version=v).to_pylist()
        return sorted(str(sorted(r.items())) for r in rows)  # NaN as text: comparable

    views = [view(v) for v in range(before + 1)]
    r = t.analyze()
    assert (r.version, r.operation, r.counts["files"]) == (before + 1, "ANALYZE", 3)
    for f in t.state().data_files():
        assert _bounds(f) == _expected(f.path, t)
    assert [view(v) for v in range(before + 1)] == views and view(t.version) == views[-1]
    assert t.changes_to_arrow(starting_version=t.version).num_rows == 0
    assert main(["analyze", t.path]) == 0 and "nothing done" in capsys.readouterr().out
    assert t.version == before + 1 and t.history()[0]["operation"] == "ANALYZE"


def test_files_without_statistics_are_always_read():
    bare = DataFile("a.parquet", 10, 100, None, (SegmentRows(1, 0, 10),))
    bounded = DataFile("b.parquet", 10, 100, None, (SegmentRows(2, 0, 10),), None,
                       {"min": {"k": 0}, "max": {"k": 9}, "nulls": {"k": 0}})
    assert stats.pruned([bare, bounded], pc.field("k") > 100, SCHEMA) == [bare]
    assert stats.pruned([bare, bounded], pc.field("k") < 5, SCHEMA) == [bare, bounded]


_VALUES = {
    "k": st.integers(-10, 4200), "x": st.one_of(st.floats(-10, 700), st.just(math.nan)),
    "s": st.sampled_from(["s00", "s05", "s12", "s99", "", "y" * 70]),
    "day": st.dates(dt.date(2025, 12, 1), dt.date(2026, 5, 1)),
    "m": st.decimals(-1, 600, places=2, allow_nan=False),
}


@st.composite
def _filters(draw, depth=0):
    if depth < 2 and draw(st.booleans()):
        a, b = draw(_filters(depth + 1)), draw(_filters(depth + 1))
        return draw(st.sampled_from([a & b, a | b, ~a]))
    column = draw(st.sampled_from(sorted(_VALUES)))
    field = pc.field(column)
    if draw(st.integers(0, 9)) == 0:
        return field.is_null() if draw(st.booleans()) else field.is_valid()
    value = pa.scalar(draw(_VALUES[column]), SCHEMA.field(column).type)
    op = draw(st.sampled_from(["<", "<=", "==", "!=", ">=", ">"]))
    return {"<": field < value, "<=": field <= value, "==": field == value, "!=": field != value,
            ">=": field >= value, ">": field > value}[op]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=_filters())
def test_a_filtered_read_is_the_whole_read_filtered(table, where):
    whole = table.to_arrow()
    got = table.to_arrow(filter=where)
    assert sorted(got.column("k").to_pylist()) == sorted(whole.filter(where).column("k").to_pylist())


def test_string_columns_dictionary_encoded_throughout_are_hinted_from_the_footer(tmp_path):
    """A chunk of fewer uncompressed bytes than the writers' 1 MB dictionary limit never fell back to plain values;
    pyarrow's own writer, dictionaries on for every column: a few values are hinted, distinct ones (the dictionary
    filled, the rest plain) are not, nor a column without a dictionary, nor numbers."""
    n = 200_000
    table = pa.table({"few": pa.array([f"mode-{i % 7}" for i in range(n)]),
                      "distinct": pa.array([f"comment number {i:012d} of many" for i in range(n)]),
                      "bare": pa.array([f"x{i % 3}" for i in range(n)]), "k": pa.array(range(n), pa.int64())})
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, use_dictionary=["few", "distinct", "k"], row_group_size=n // 2)
    metadata = pq.read_metadata(path)
    assert metadata.row_group(0).column(1).has_dictionary_page  # tried, then dropped for plain values
    collector = stats.Collector(table.schema, ["k"], footer=True)
    collector.footer(metadata)
    assert collector.to_json()["dictionary"] == {"few": True}


def test_only_columns_every_file_holds_as_dictionaries_are_read_as_them_and_reads_give_the_tables_types(
        tmp_path, monkeypatch):
    schema = pa.schema([("k", pa.int64()), ("mode", pa.string()), ("note", pa.large_string()), ("v", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key="k", delta_column="v")
    t.ingest(pa.table({"k": range(3000), "mode": [f"m{i % 4}" for i in range(3000)],
                       "note": [f"n{i % 5}" for i in range(3000)], "v": [1] * 3000}, schema=schema))
    # Distinct notes over 1 MB: this file's chunk of them is not wholly a dictionary.
    t.ingest(pa.table({"k": range(2000, 60_000), "mode": [f"m{i % 4}" for i in range(2000, 60_000)],
                       "note": [f"a note that says {i:020d}" for i in range(2000, 60_000)],
                       "v": [2] * 58_000}, schema=schema))
    files = t.state().data_files()
    assert [dict(f.stats["dictionary"]) for f in files] == [{"mode": True, "note": True}, {"mode": True}]
    assert stats.dictionary_columns(files, ["k", "mode", "note"]) == ["mode"]
    assert stats.dictionary_columns(files[:1], ["note", "mode", "v"]) == ["note", "mode"]
    assert stats.dictionary_columns([*files, DataFile("old", 1, 1, None, ())], ["mode"]) == []  # no statistics

    asked = []
    real = stats.dictionary_columns
    monkeypatch.setattr(stats, "dictionary_columns", lambda f, c: asked.append(real(f, c)) or real(f, c))
    hinted = t.to_arrow()
    assert asked and all(a == ["mode"] for a in asked)
    assert hinted.schema == t.schema
    # Polars reads with the second condition, pyarrow's scanner with the third (it does not translate).
    for where in (None, pc.field("mode") == "m1", pc.starts_with(pc.field("mode"), "m1"), pc.field("k") < 2500):
        monkeypatch.setattr(stats, "dictionary_columns", lambda f, c: [])
        plain = t.to_arrow(filter=where).sort_by("k")
        monkeypatch.setattr(stats, "dictionary_columns", real)
        got = t.to_arrow(filter=where).sort_by("k")
        assert got.schema == t.schema and got.equals(plain)
        assert got.num_rows == plain.num_rows > 0
