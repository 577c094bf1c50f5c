"""The adapters for Hive-style folders, Iceberg tables (pyiceberg) and Delta tables (deltalake), on real
tables: what they emit, that each change is emitted once, and that a crash before saving the state is a
harmless retry. No Spark."""

from __future__ import annotations

import json

import pytest
from deltalake import DeltaTable

from bitlake.triggers import AdapterError, DeltaAdapter, HiveFolderAdapter, IcebergAdapter, TriggerStore, snapshot_range
from tests.triggers.formats import (
    delta_append,
    delta_table,
    iceberg_catalog,
    iceberg_table,
    land_hive,
    mark_success,
    rows,
)


@pytest.fixture
def store(tmp_path):
    with TriggerStore(f"sqlite:///{tmp_path}/triggers.db") as s:
        yield s


def summary(registrations) -> list[tuple]:
    return [(r.event.snapshot_id, r.event.prev_snapshot_id, r.event.partition, r.event.operation_type.value)
            for r in registrations]


def stored(store, table: str) -> list:
    return store.events(table, limit=1000).events


# ------------------------------------------------------------------------------------------------- Hive


def test_hive_emits_a_partition_once_its_success_marker_is_there(tmp_path, store):
    root = tmp_path / "sales"
    land_hive(root, "ds=2024-01-01", [(1, "a"), (2, "b")])
    land_hive(root, "ds=2024-01-02", [(3, "c")], success=False)  # still being written
    land_hive(root, "_temporary/ds=2024-01-03", [(9, "x")])  # a job's staging folder: not data
    adapter = HiveFolderAdapter(str(root), state_path=tmp_path / "state.json", table="db.sales")

    first = adapter.emit(store)
    assert [(r.created, r.event.partition) for r in first] == [(True, ["2024-01-01"])]
    event = first[0].event
    assert (event.table, event.table_format.value, event.operation_type.value) == ("db.sales", "HIVE", "APPEND")
    assert event.tags == {"location": f"file://{root}", "partition_path": "ds=2024-01-01", "format": "parquet"}
    assert event.snapshot_id == str((root / "ds=2024-01-01" / "_SUCCESS").stat().st_mtime_ns)
    assert adapter.emit(store) == []

    mark_success(root / "ds=2024-01-02")
    assert [r.event.partition for r in adapter.emit(store)] == [["2024-01-02"]]
    # A new process with the same state file knows what was emitted.
    again = HiveFolderAdapter(str(root), state_path=tmp_path / "state.json", table="db.sales")
    assert again.pending() == [] and again.emit(store) == []
    assert len(stored(store, "db.sales")) == 2


def test_hive_relanding_a_partition_is_a_new_event(tmp_path, store):
    root = tmp_path / "t"
    folder = land_hive(root, "ds=2024-01-01", [(1, "a")])
    mark_success(folder, mtime_ns=1_700_000_000_000_000_000)
    adapter = HiveFolderAdapter(str(root), state_path=tmp_path / "s.json")
    assert [r.event.snapshot_id for r in adapter.emit(store)] == ["1700000000000000000"]
    mark_success(folder, mtime_ns=1_700_000_100_000_000_000)  # the job ran again and replaced the data
    landed = adapter.emit(store)
    assert [(r.event.snapshot_id, r.event.partition) for r in landed] == [("1700000100000000000", ["2024-01-01"])]
    assert landed[0].event.snapshot_ts.isoformat() == "2023-11-14T22:15:00+00:00"
    assert adapter.table == f"file://{root}"


def test_hive_multi_level_partitions_escapes_and_nulls(tmp_path, store):
    root = tmp_path / "t"
    land_hive(root, "ds=2024-01-01/hr=05", [(1, "a")])
    land_hive(root, "ds=2024-01-01/hr=__HIVE_DEFAULT_PARTITION__", [(2, "b")])
    land_hive(root, "ds=2024-01-01/hr=a%3Ab", [(3, "c")])
    adapter = HiveFolderAdapter(str(root), state_path=tmp_path / "s.json")
    partitions = sorted((r.event.partition for r in adapter.emit(store)), key=json.dumps)
    assert partitions == [["2024-01-01", "05"], ["2024-01-01", "a:b"], ["2024-01-01", None]]


def test_hive_crash_after_registering_before_saving_state_emits_once(tmp_path, store):
    root = tmp_path / "t"
    land_hive(root, "ds=2024-01-01", [(1, "a")])
    land_hive(root, "ds=2024-01-02", [(2, "b")])
    adapter = HiveFolderAdapter(str(root), state_path=tmp_path / "s.json")
    store.register(adapter.pending())  # the crashed run registered, and died before saving its state
    assert not (tmp_path / "s.json").exists()
    retry = HiveFolderAdapter(str(root), state_path=tmp_path / "s.json")
    assert [r.created for r in retry.emit(store)] == [False, False]
    assert len(stored(store, retry.table)) == 2
    assert retry.emit(store) == []


def test_an_adapter_refuses_another_tables_state_and_missing_folders(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    state = tmp_path / "s.json"
    HiveFolderAdapter(str(tmp_path / "a"), state_path=state).emit(TriggerStore("sqlite://"))
    with pytest.raises(AdapterError, match="belongs to HIVE table"):
        HiveFolderAdapter(str(tmp_path / "b"), state_path=state)
    state.write_text("{not json")
    with pytest.raises(AdapterError, match="cannot read the adapter state"):
        HiveFolderAdapter(str(tmp_path / "a"), state_path=state)
    with pytest.raises(AdapterError, match="no such folder"):
        HiveFolderAdapter(str(tmp_path / "missing"), state_path=tmp_path / "other.json")


# ---------------------------------------------------------------------------------------------- Iceberg


def test_iceberg_emits_each_snapshot_once_per_partition_chained(tmp_path, store):
    catalog = iceberg_catalog(tmp_path / "wh")
    table = iceberg_table(catalog)
    table.append(rows((1, "a", "x"), (2, "a", "y"), (3, "b", "z")))
    adapter = IcebergAdapter(table, state_path=tmp_path / "s.json")
    assert adapter.table == "db.orders"
    s1 = table.refresh().current_snapshot().snapshot_id
    first = adapter.emit(store)
    assert summary(first) == [(str(s1), None, ["a"], "APPEND"), (str(s1), None, ["b"], "APPEND")]
    assert first[0].event.tags == {"location": table.location()}
    assert adapter.emit(store) == []

    table = table.refresh()
    table.append(rows((4, "c", "w")))
    table.delete("id = 3")  # the whole file of partition b goes: an Iceberg DELETE snapshot
    table.delete("id = 1")  # rewrites partition a's file: an OVERWRITE
    snaps = [s.snapshot_id for s in table.refresh().snapshots()]
    operations = [s.summary.operation.value for s in table.refresh().snapshots()]
    assert operations == ["append", "append", "delete", "overwrite"]
    second = adapter.emit(store)
    assert summary(second) == [(str(snaps[1]), str(snaps[0]), ["c"], "APPEND"),
                               (str(snaps[2]), str(snaps[1]), ["b"], "DELETE"),
                               (str(snaps[3]), str(snaps[2]), ["a"], "UPDATE")]
    rng = snapshot_range(stored(store, "db.orders"))
    assert (rng.start_snapshot_id, rng.end_snapshot_id) == (None, str(snaps[3]))

    # Without a catalog, from the table's folder: the same snapshots (named by the location).
    by_path = IcebergAdapter(table.location(), state_path=tmp_path / "p.json")
    assert by_path.table == table.location()
    assert [(e.snapshot_id, e.partition) for e in by_path.pending()] == \
        [(r.event.snapshot_id, r.event.partition) for r in first + second]


def test_iceberg_unpartitioned_crash_before_state_is_a_retry(tmp_path, store):
    catalog = iceberg_catalog(tmp_path / "wh")
    table = iceberg_table(catalog, "db.flat", partitioned=False)
    table.append(rows((1, "a", "x")))
    table.append(rows((2, "a", "y")))
    adapter = IcebergAdapter(table, state_path=tmp_path / "s.json")
    store.register(adapter.pending()[:1])  # a run that registered part of it, then died
    out = adapter.emit(store)
    assert [(r.created, r.event.partition) for r in out] == [(False, None), (True, None)]
    assert len(stored(store, "db.flat")) == 2


# ------------------------------------------------------------------------------------------------ Delta


def test_delta_emits_versions_with_data_changes_chained(tmp_path, store):
    path = tmp_path / "orders"
    delta_table(path, rows((1, "a", "x"), (2, "b", "y")))  # version 0
    delta_append(path, rows((3, "a", "z")))  # 1
    DeltaTable(str(path)).delete("id = 2")  # 2: removes partition b's only file
    DeltaTable(str(path)).optimize.compact()  # 3: partition a's two files become one; no row changes
    delta_append(path, rows((4, "c", "w")))  # 4
    adapter = DeltaAdapter(str(path), state_path=tmp_path / "s.json", table="db.orders")
    out = adapter.emit(store)
    assert summary(out) == [("0", None, ["a"], "APPEND"), ("0", None, ["b"], "APPEND"), ("1", "0", ["a"], "APPEND"),
                            ("2", "1", ["b"], "DELETE"), ("4", "2", ["c"], "APPEND")]
    assert out[0].event.tags == {"location": f"file://{path}"}
    assert adapter.emit(store) == []

    DeltaTable(str(path)).update({"v": "'q'"}, predicate="id = 1")  # 5: rewrites a file of partition a
    again = DeltaAdapter(str(path), state_path=tmp_path / "s.json", table="db.orders")
    assert summary(again.emit(store)) == [("5", "4", ["a"], "UPDATE")]
    assert snapshot_range(stored(store, "db.orders")).snapshot_ids == ("0", "1", "2", "4", "5")


def test_delta_missing_table_is_a_clear_error(tmp_path, store):
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match="no Delta table"):
        DeltaAdapter(str(tmp_path / "empty"), state_path=tmp_path / "s.json").emit(store)
