"""Scans with a condition read by Polars' Parquet reader (bitlake/engine/read/prefiltered.py): the Polars
predicate is at least as wide as the pyarrow condition, and the rows are exactly pyarrow's filter of the view."""

from __future__ import annotations

import datetime as dt
import os
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import bitlake
from bitlake.engine.read import prefiltered

SCHEMA = pa.schema([("k", pa.int64()), ("n", pa.int32()), ("u", pa.uint8()), ("x", pa.float64()),
                    ("s", pa.string()), ("day", pa.date32()), ("amount", pa.decimal128(12, 2)),
                    ("at", pa.timestamp("us", "UTC")), ("naive", pa.timestamp("us")), ("v", pa.int64())])


def _batch(keys, version):
    keys = list(keys)
    return pa.table({
        "k": keys,
        "n": pa.array([None if k % 17 == 0 else k % 13 for k in keys], pa.int32()),
        "u": pa.array([k % 200 for k in keys], pa.uint8()),
        "x": [float("nan") if k % 23 == 0 else -0.0 if k % 29 == 0 else k * 0.5 - 40 for k in keys],
        "s": [None if k % 11 == 0 else f"s{(k + version) % 7}é" for k in keys],
        "day": [dt.date(2026, 1, 1) + dt.timedelta(days=(k * 7 + version) % 90) for k in keys],
        "amount": pa.array([Decimal(k % 500) / 4 - 50 for k in keys], pa.decimal128(12, 2)),
        "at": pa.array([dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(hours=k) for k in keys],
                       pa.timestamp("us", "UTC")),
        "naive": pa.array([None if k % 19 == 0 else dt.datetime(2026, 1, 1) + dt.timedelta(hours=k) for k in keys],
                          pa.timestamp("us")),
        "v": [version] * len(keys)}, schema=SCHEMA)


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """Three versions: 2,000 rows; 700 updated and 300 new; 150 deleted (files filtered by their bitmaps)."""
    t = bitlake.create_table(str(tmp_path_factory.mktemp("prefiltered") / "t"), SCHEMA, primary_key="k",
                             delta_column="v")
    t.ingest(_batch(range(2000), 1))
    t.ingest(_batch(list(range(0, 2100, 3)), 2))
    gone = _batch(range(500, 650), 3).append_column("op", pa.array(["delete"] * 150))
    t.ingest(gone, op_column="op")
    return t


CONDITIONS = {
    "a range of dates": (pc.field("day") >= dt.date(2026, 2, 1)) & (pc.field("day") < dt.date(2026, 3, 1)),
    "an int32 column": pc.field("n") == 5,
    "a literal on the left": pc.scalar(7) < pc.field("k"),
    "strings, is_in": pc.field("s").isin(["s1é", "s3é"]),
    "a string range": (pc.field("s") > "s2é") & (pc.field("s") <= "s5é"),
    "not equal": pc.field("n") != 4,
    "decimals": pc.field("amount") > pa.scalar(Decimal("12.50"), pa.decimal128(12, 2)),
    "an or": (pc.field("n") == 1) | (pc.field("day") == dt.date(2026, 1, 8)),
    "an untranslated part of an and": (pc.field("n") < 6) & (pc.field("x") * 2 > 10),
    "an untranslated part of an or": (pc.field("n") < 2) | (pc.field("x") > 10),
    "floats, NaN and signed zero": (pc.field("x") == 0.0) | (pc.field("x") > 500),
    "a negation": ~(pc.field("n") < 6) & (pc.field("k") < 1500),
    "nulls": pc.field("s").is_null() | (pc.field("n") > 11),
    "a timestamp": pc.field("at") >= pa.scalar(dt.datetime(2026, 2, 1, tzinfo=dt.UTC),
                                                pa.timestamp("us", "UTC")),
    "a uint8 column with a cast": pc.field("u") < 3,
    "an is_in with a null": pc.field("n").isin(pa.array([3, None], pa.int32())),
    "a negated is_in": ~pc.field("s").isin(["s1é"]) & (pc.field("k") > 100),
    "a negated and": ~((pc.field("n") < 6) & (pc.field("day") > dt.date(2026, 2, 1))),
    "a negated or with nulls": ~((pc.field("n") == 3) | pc.field("s").is_null()),
    "is_valid of floats": pc.field("x").is_valid() & (pc.field("k") < 300),
    "a timestamp range": (pc.field("at") > pa.scalar(dt.datetime(2026, 1, 20, tzinfo=dt.UTC), pa.timestamp("us", "UTC")))
    & (pc.field("at") <= pa.scalar(dt.datetime(2026, 2, 3, 5, tzinfo=dt.UTC), pa.timestamp("us", "UTC"))),
    "a naive timestamp": pc.field("naive") < pa.scalar(dt.datetime(2026, 1, 9, 7), pa.timestamp("us")),
}


@pytest.mark.parametrize("name", list(CONDITIONS))
@pytest.mark.parametrize("version", [None, 1, 2])
def test_a_condition_keeps_the_rows_pyarrow_keeps(table, name, version):
    where = CONDITIONS[name]
    view = table.to_arrow(version=version)
    expected = sorted(view.filter(where).column("k").to_pylist())
    got = table.to_arrow(version=version, filter=where)
    assert sorted(got.column("k").to_pylist()) == expected
    assert got.schema == view.schema
    assert repr(got.sort_by("k").to_pylist()) == repr(view.filter(where).sort_by("k").to_pylist())  # NaN too


def test_the_predicate_is_as_wide_as_the_condition_or_absent():
    def text(where):
        t = prefiltered.predicate(where, SCHEMA)
        return None if t is None else str(t.predicate)

    assert "col(\"n\")" in text((pc.field("n") < 6) & (pc.field("x") * 2 > 10))  # the untranslated part left out
    assert "col(\"x\")" not in text((pc.field("n") < 6) & (pc.field("x") * 2 > 10))
    assert text((pc.field("n") < 2) | (pc.field("x") > 10)) is None  # an or with an untranslated part
    assert text(pc.field("x") > 1.0) is None  # floats never translate
    assert "col(\"n\")" in text(~(pc.field("n") < 6))  # the negation of an exact part
    assert text(~pc.field("s").isin(["a"])) is None  # is_in is false for a null in pyarrow, null in Polars
    assert text(~((pc.field("n") < 6) & (pc.field("x") * 2 > 10))) is None  # nor that of a widened one
    assert "is_null" in text(pc.field("x").is_null())  # any column type
    translated = prefiltered.predicate((pc.field("n") < 6) & (pc.field("x") * 2 > 10), SCHEMA)
    assert translated.names == {"n", "x"}  # the reader reads every column the condition names


def test_polars_reads_a_condition_it_takes_and_pyarrow_the_others(table, monkeypatch):
    read = []
    real = prefiltered.chunks
    monkeypatch.setattr(prefiltered, "chunks", lambda paths, *a: read.append(paths) or real(paths, *a))
    table.to_arrow(filter=pc.field("n") == 5)
    assert read and all(p.endswith(".parquet") for p in read[0])
    read.clear()
    table.to_arrow(filter=pc.field("x") > 1.0)
    table.to_arrow()
    assert not read


def test_a_column_added_later_reads_as_null_in_older_files(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="k", delta_column="v")
    t.ingest(_batch(range(100), 1))
    t.add_columns([pa.field("extra", pa.int64())])
    later = _batch(range(50, 150), 2)
    t.ingest(later.append_column("extra", pa.array(range(100), pa.int64())))
    got = t.to_arrow(filter=(pc.field("k") >= 40) & (pc.field("k") < 60), columns=["k", "extra"])
    assert sorted(got.to_pylist(), key=lambda r: r["k"]) == (
        [{"k": k, "extra": None} for k in range(40, 50)] + [{"k": k, "extra": k - 50} for k in range(50, 60)])
    assert t.to_arrow(filter=pc.field("extra") < 3).column("k").to_pylist() == [50, 51, 52]


def test_a_condition_on_an_object_store_table_is_read_by_pyarrow(tmp_path, monkeypatch):
    t = bitlake.create_table("memory://prefiltered/t", SCHEMA, primary_key="k", delta_column="v")
    t.ingest(_batch(range(300), 1))
    monkeypatch.setattr(prefiltered, "chunks", lambda *a: pytest.fail("an object store's files are not local"))
    assert sorted(t.to_arrow(filter=pc.field("n") == 5).column("k").to_pylist()) == \
        [k for k in range(300) if k % 13 == 5 and k % 17]


def test_a_file_gone_or_damaged_raises_as_pyarrows_reader_does(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="k", delta_column="v")
    t.ingest(_batch(range(100), 1))
    view = t.view()  # planned
    path = t.io.local_path(t.state().data_files()[0].path)
    with open(path, "r+b") as f:
        f.truncate(50)
    with pytest.raises(pa.ArrowInvalid, match=os.path.basename(path)):
        view.to_table(filter=pc.field("n") == 5)
    os.remove(path)
    with pytest.raises(FileNotFoundError, match=os.path.basename(path)):
        view.to_table(filter=pc.field("n") == 5)


def test_a_revert_reads_the_later_batches_records_of_its_keys_with_polars(tmp_path, monkeypatch):
    read = []
    real = prefiltered.rows_in
    monkeypatch.setattr(prefiltered, "rows_in", lambda paths, schema, values, ranges=None: read.append(sorted(values))
                        or real(paths, schema, values, ranges))
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="k", delta_column="v")
    t.ingest(_batch(range(1000), 1), batch_id="one")
    t.ingest(_batch(range(0, 100), 2), batch_id="two")
    t.ingest(_batch(range(50, 1150, 10), 3), batch_id="three")  # some of two's keys again, and new ones
    t.compact(major=True)  # one file holds every batch's rows: two's keys are a few of its rows
    t.revert_batch("two")
    assert read and all(columns == ["_segment_part", "k"] for columns in read)
    got = {r["k"]: r["v"] for r in t.to_arrow(columns=["k", "v"]).to_pylist()}
    expected = {k: 1 for k in range(1000)} | {k: 3 for k in range(50, 1150, 10)}
    assert got == expected
