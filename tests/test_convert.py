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


def _with_deletion_vector(path: str, deleted: list[int]) -> None:
    """Deletes rows of a one-file Delta table by an inline deletion vector (Delta's PROTOCOL.md: the magic number
    and a portable 64-bit roaring bitmap, in Z85), committed as version 1, since deltalake writes none."""
    import json
    import struct
    import time

    from pyroaring import BitMap

    alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
    data = struct.pack("<iqi", 1681511377, 1, 0) + BitMap(deleted).serialize()
    data += b"\0" * (-len(data) % 4)
    z85 = ""
    for i in range(0, len(data), 4):
        n = int.from_bytes(data[i:i + 4], "big")
        z85 += "".join(alphabet[n // 85 ** k % 85] for k in range(4, -1, -1))
    log = pathlib.Path(path) / "_delta_log"
    first = [json.loads(line) for line in (log / f"{0:020d}.json").read_text().splitlines()]
    add = next(a["add"] for a in first if "add" in a)
    meta = next(a for a in first if "metaData" in a)
    meta["metaData"]["configuration"] = {"delta.enableDeletionVectors": "true"}
    now = int(time.time() * 1000)
    dv = {"storageType": "i", "pathOrInlineDv": z85, "sizeInBytes": len(data), "cardinality": len(deleted)}
    actions = [{"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"],
                             "writerFeatures": ["deletionVectors"]}}, meta,
               {"remove": {"path": add["path"], "deletionTimestamp": now, "dataChange": True,
                           "extendedFileMetadata": True, "partitionValues": add["partitionValues"], "size": add["size"]}},
               {"add": {**add, "deletionVector": dv, "dataChange": True}},
               {"commitInfo": {"timestamp": now, "operation": "DELETE"}}]
    (log / f"{1:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def test_convert_a_folder_whose_files_differ_in_columns(tmp_path):
    """Every file's columns make the table's (a column only later files hold is null in the earlier ones); files
    that disagree on a column's type are refused, naming the column."""
    source = tmp_path / "source"
    source.mkdir()
    pq.write_table(pa.table({"id": [1], "mod": [1]}), source / "a.parquet")
    pq.write_table(pa.table({"id": [2], "mod": [1], "email": ["x@y.z"]}), source / "b.parquet")
    r = bitlake.convert(str(source), str(tmp_path / "t"), primary_key=["id"], delta_column="mod")
    assert sorted(r.table.to_arrow().to_pylist(), key=lambda row: row["id"]) == [
        {"id": 1, "mod": 1, "email": None}, {"id": 2, "mod": 1, "email": "x@y.z"}]
    pq.write_table(pa.table({"id": [3], "mod": [1], "email": [7]}), source / "c.parquet")
    with pytest.raises(bitlake.InvalidInputError, match="disagree on a column's type.*email"):
        bitlake.convert(str(source), str(tmp_path / "u"), primary_key=["id"], delta_column="mod")
    assert not (tmp_path / "u").exists()


def test_convert_a_delta_table_with_deletion_vectors(tmp_path):
    from deltalake import write_deltalake

    source = str(tmp_path / "source")
    write_deltalake(source, pa.table({"id": list(range(10)), "mod": [1] * 10, "v": [f"r{i}" for i in range(10)]}))
    _with_deletion_vector(source, [2, 5])
    r = bitlake.convert(source, str(tmp_path / "t"), primary_key=["id"], delta_column="mod")
    assert r.source_kind == "delta" and r.rows == 8
    assert sorted(r.table.to_arrow().column("id").to_pylist()) == [0, 1, 3, 4, 6, 7, 8, 9]
    assert r.table.metadata.schema.field("v").type == pa.string()  # DataFusion's string_view, stored as string


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
