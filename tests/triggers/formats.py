"""Small real tables of the other formats for the adapter and incremental-read tests: a Hive-style folder
(pyarrow), an Iceberg table (pyiceberg, SqlCatalog on SQLite) and a Delta table (deltalake)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("ds", pa.string()),
                    pa.field("v", pa.string())])


def rows(*items: tuple) -> pa.Table:
    """``(id, ds, v)`` tuples as a table of SCHEMA."""
    return pa.Table.from_pylist([dict(zip(SCHEMA.names, r, strict=True)) for r in items], schema=SCHEMA)


# ------------------------------------------------------------------------------------------------- Hive


def land_hive(root: Path, partition: str, values: list[tuple], *, success: bool = True, name: str = "part-0"):
    """Writes ``values`` (``(id, v)``) as a Parquet file of partition folder ``partition`` (``k=v/...``),
    then its ``_SUCCESS`` marker unless ``success`` is False."""
    folder = root / partition
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": pa.array([i for i, _ in values], pa.int64()), "v": [v for _, v in values]})
    pq.write_table(table, folder / f"{name}.parquet")
    if success:
        mark_success(folder)
    return folder


def mark_success(folder: Path, *, mtime_ns: int | None = None) -> None:
    marker = folder / "_SUCCESS"
    marker.touch()
    if mtime_ns is not None:
        os.utime(marker, ns=(mtime_ns, mtime_ns))


# ---------------------------------------------------------------------------------------------- Iceberg


def iceberg_catalog(root: Path):
    from pyiceberg.catalog.sql import SqlCatalog

    root.mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog("test", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}")
    catalog.create_namespace_if_not_exists("db")
    return catalog


def iceberg_table(catalog, name: str = "db.orders", *, partitioned: bool = True):
    table = catalog.create_table(name, schema=SCHEMA)
    if partitioned:
        with table.update_spec() as spec:
            spec.add_identity("ds")
    return catalog.load_table(name)


# ------------------------------------------------------------------------------------------------ Delta


def delta_table(path: Path, data: pa.Table, *, cdf: bool = True):
    from deltalake import DeltaTable, write_deltalake

    configuration = {"delta.enableChangeDataFeed": "true"} if cdf else None
    write_deltalake(str(path), data, partition_by=["ds"], configuration=configuration)
    return DeltaTable(str(path))


def delta_append(path: Path, data: pa.Table) -> None:
    from deltalake import write_deltalake

    write_deltalake(str(path), data, mode="append")
