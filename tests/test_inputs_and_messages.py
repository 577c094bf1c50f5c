"""Issue 41: inputs from any Arrow producer, a committed batch id re-ingested with other records, messages a new
user can act on, and compaction of a one-file table. No Spark."""

from __future__ import annotations

import duckdb
import polars as pl
import pyarrow as pa
import pytest

import bitlake
from bitlake.errors import InvalidInputError

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("mod", pa.int64())])


def rows(ids, names, mods):
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string()),
                     "mod": pa.array(mods, pa.int64())})


@pytest.fixture
def table(tmp_path):
    return bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="id", delta_column="mod", num_buckets=2)


def current(t) -> list[tuple]:
    got = t.to_arrow().sort_by("id")
    return list(zip(*(got.column(c).to_pylist() for c in SCHEMA.names), strict=True))


# ------------------------------------------------------------------------------------------ Arrow producers


@pytest.mark.parametrize("make", [
    pytest.param(lambda: pl.DataFrame({"id": [1, 2], "name": ["a", "b"], "mod": [1, 1]}), id="polars"),
    pytest.param(lambda: duckdb.sql("SELECT * FROM (VALUES (1::BIGINT, 'a', 1::BIGINT), (2, 'b', 1)) v(id, name, mod)"),
                 id="duckdb"),
    pytest.param(lambda: rows([1, 2], ["a", "b"], [1, 1]).to_reader(max_chunksize=1), id="reader"),
    pytest.param(lambda: rows([1, 2], ["a", "b"], [1, 1]).to_batches()[0], id="record_batch"),
    pytest.param(lambda: rows([1, 2], ["a", "b"], [1, 1]).to_struct_array().combine_chunks(), id="struct_array"),
])
def test_ingest_takes_arrow_producers(table, make):
    r = table.ingest(make())
    assert r.committed and r.counts["inserted"] == 2
    assert current(table) == [(1, "a", 1), (2, "b", 1)]


def test_ingest_takes_another_tables_view(tmp_path, table):
    table.ingest(rows([1, 2, 3], ["a", "b", "c"], [1, 1, 1]))
    other = bitlake.create_table(str(tmp_path / "o"), SCHEMA, primary_key="id", delta_column="mod")
    assert other.ingest(table.view()).counts["inserted"] == 3
    assert current(other) == current(table)


def test_replace_batch_and_merge_take_polars(table):
    table.ingest(rows([1, 2], ["a", "b"], [1, 1]), batch_id="b1")
    table.replace_batch("b1", pl.DataFrame({"id": [1], "name": ["x"], "mod": [1]}))
    assert current(table) == [(1, "x", 1)]
    table.merge(pl.DataFrame({"id": [1, 5], "name": ["y", "z"], "mod": [2, 2]})) \
        .when_matched_update_all().when_not_matched_insert_all().execute()
    assert current(table) == [(1, "y", 2), (5, "z", 2)]


def test_a_polars_lazy_frame_is_refused_with_what_is_accepted(table):
    with pytest.raises(InvalidInputError, match=r"LazyFrame.*__arrow_c_stream__.*collect\(\)"):
        table.ingest(pl.DataFrame({"id": [1], "name": ["a"], "mod": [1]}).lazy())


def test_an_object_of_no_arrow_producer_names_what_is_accepted(table):
    with pytest.raises(InvalidInputError, match="PyCapsule interface.*polars DataFrame.*DuckDB relation"):
        table.ingest([{"id": 1, "name": "a", "mod": 1}])


def test_convert_takes_a_polars_frame_and_a_duckdb_relation(tmp_path):
    r = bitlake.convert(pl.DataFrame({"id": [1, 2, 2], "name": ["a", "b", "c"], "mod": [1, 1, 2]}),
                        str(tmp_path / "c"), primary_key="id", delta_column="mod")
    assert (r.source_kind, r.rows, r.duplicates) == ("arrow", 3, 1)
    assert sorted(r.table.to_arrow().column("name").to_pylist()) == ["a", "c"]
    r = bitlake.convert(duckdb.sql("SELECT 1 AS x"), str(tmp_path / "d"))
    assert r.table.to_arrow().column("x").to_pylist() == [1]
