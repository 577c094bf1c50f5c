"""bitlake.convert: a table bootstrapped from a Parquet folder, a Hive-partitioned folder, a Delta table, an
Iceberg table and a lance dataset, each written by its own library; duplicate keys resolved by the contract."""

from __future__ import annotations

import os
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import bitlake
from bitlake.cli import main as cli

ROWS = pa.table({
    "id": pa.array([1, 2, 3, 4, 2, 3], pa.int64()),
    "region": ["eu", "us", "eu", "us", "us", "eu"],
    "value": pa.array([10, 20, 30, 40, 21, 29], pa.int64()),
    "mod": pa.array([1, 1, 1, 1, 2, 0], pa.int64()),
})
# ids 2 and 3 twice: a batch applies a key's records in delta order, so the higher delta survives wherever it is
EXPECTED = {1: 10, 2: 21, 3: 30, 4: 40}


def current(t):
    return {r["id"]: r["value"] for r in t.to_arrow().to_pylist()}


def write_parquet_folder(folder):
    os.makedirs(folder)
    pq.write_table(ROWS.slice(0, 3), os.path.join(folder, "part-0.parquet"))
    pq.write_table(ROWS.slice(3), os.path.join(folder, "part-1.parquet"))


def write_hive(folder):
    pq.write_to_dataset(ROWS, folder, partition_cols=["region"])


def write_delta(folder):
    from deltalake import write_deltalake

    write_deltalake(folder, ROWS.slice(0, 4))
    write_deltalake(folder, ROWS.slice(4), mode="append")


def write_iceberg(folder):
    from pyiceberg.catalog.sql import SqlCatalog

    os.makedirs(folder)
    catalog = SqlCatalog("c", uri=f"sqlite:///{folder}/catalog.db", warehouse=f"file://{folder}")
    catalog.create_namespace("ns")
    table = catalog.create_table("ns.t", schema=ROWS.schema)
    table.append(ROWS.slice(0, 4))
    table.append(ROWS.slice(4))
    return table.location().removeprefix("file://")  # <warehouse>/ns.db/t, with metadata/ and data/


def write_lance(folder):
    import lance

    lance.write_dataset(ROWS.slice(0, 4), folder)
    lance.write_dataset(ROWS.slice(4), folder, mode="append")


@pytest.mark.parametrize("kind, writer", [
    ("parquet", write_parquet_folder), ("parquet", write_hive), ("delta", write_delta), ("iceberg", write_iceberg),
    ("lance", write_lance),
])
def test_convert_keeps_every_key_by_the_contract(tmp_path, kind, writer):
    source = str(tmp_path / "source")
    location = writer(source) or source
    r = bitlake.convert(location, str(tmp_path / "t"), primary_key=["id"], delta_column="mod")
    assert r.source_kind == kind and r.rows == 6 and r.duplicates == 2
    assert r.counts == {"inserted": 4, "updated": 2, "deleted": 0, "stale": 0, "ignored_deletes": 0}
    assert current(r.table) == EXPECTED
    assert r.table.version == 1 and r.table.history()[0]["batch_id"] == "convert"
    if writer is write_hive:
        assert r.table.metadata.partition_by == ("region",)
        assert sorted(os.listdir(tmp_path / "t" / "data")) == ["region=eu", "region=us"]
    else:  # pyarrow's Hive discovery names every column of an unpartitioned folder: none may become a partition
        assert r.table.metadata.partition_by == (), r.table.metadata.partition_by
    # The table goes on as any other: an upsert after the conversion.
    r.table.ingest(pa.table({"id": [4], "region": ["us"], "value": [41], "mod": [5]}))
    assert current(r.table) == {**EXPECTED, 4: 41}


def test_convert_a_single_parquet_file(tmp_path):
    pq.write_table(ROWS, tmp_path / "rows.parquet")
    r = bitlake.convert(str(tmp_path / "rows.parquet"), str(tmp_path / "t"), primary_key=["id"], delta_column="mod")
    assert r.source_kind == "parquet" and r.table.metadata.partition_by == () and r.duplicates == 2
    assert current(r.table) == EXPECTED


def test_convert_an_iceberg_metadata_file_and_an_unkeyed_table(tmp_path):
    folder = write_iceberg(str(tmp_path / "source"))
    metadata = sorted((pathlib.Path(folder) / "metadata").glob("*.metadata.json"))[-1]
    r = bitlake.convert(f"file://{metadata}", str(tmp_path / "t"))  # a file:// URI as well as a path
    assert r.source_kind == "iceberg" and not r.table.metadata.keyed and r.rows == 6 and r.duplicates == 0
    assert sorted(r.table.to_arrow().column("value").to_pylist()) == sorted(ROWS.column("value").to_pylist())


def test_a_failed_conversion_leaves_nothing(tmp_path):
    source = str(tmp_path / "source")
    write_parquet_folder(source)
    pq.write_table(pa.table({"id": pa.array([None], pa.int64()), "region": ["eu"], "value": [1], "mod": [1]}),
                   os.path.join(source, "part-2.parquet"))
    with pytest.raises(bitlake.NullValueError, match="primary key column 'id'"):
        bitlake.convert(source, str(tmp_path / "t"), primary_key=["id"], delta_column="mod")
    assert not os.path.exists(tmp_path / "t")
    with pytest.raises(bitlake.InvalidInputError, match="not in the source's schema"):
        bitlake.convert(source, str(tmp_path / "t"), primary_key=["key"], delta_column="mod")
    with pytest.raises(bitlake.InvalidInputError, match="no such source"):
        bitlake.convert(str(tmp_path / "nothing"), str(tmp_path / "t"))
    os.makedirs(tmp_path / "full")
    (tmp_path / "full" / "mine.txt").write_text("keep me")
    with pytest.raises(bitlake.InvalidInputError, match="not empty"):
        bitlake.convert(source, str(tmp_path / "full"))
    assert (tmp_path / "full" / "mine.txt").read_text() == "keep me"


def test_the_convert_command(tmp_path, capsys):
    source = str(tmp_path / "source")
    write_delta(source)
    assert cli(["convert", source, str(tmp_path / "t"), "--primary-key", "id", "--delta-column", "mod"]) == 0
    out = capsys.readouterr().out
    assert "converted the delta dataset" in out and "6 rows read, 2 duplicate key record(s) resolved" in out
    assert current(bitlake.open_table(str(tmp_path / "t"))) == EXPECTED
