"""snapshot_range chains events into one range (or refuses); read_changes reads exactly that range for
Delta (change data feed), Iceberg (appended files; deletes refused) and Hive (the landed partitions).
The bitlake change feed is read in test_producers.py's end-to-end test."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from bitlake.triggers import (
    BrokenChainError,
    DeltaAdapter,
    HiveFolderAdapter,
    IcebergAdapter,
    IncrementalReadError,
    TriggerStore,
    encode_events,
    read_changes,
    snapshot_range,
)
from tests.triggers.formats import delta_append, delta_table, iceberg_catalog, iceberg_table, land_hive, rows
from tests.triggers.samples import event


def chained(*pairs, table="db.t", table_format="BITLAKE", partition=None) -> list[dict]:
    return [event(table=table, snapshot_id=s, prev_snapshot_id=p, table_format=table_format, partition=partition)
            for s, p in pairs]


# ------------------------------------------------------------------------------------------ snapshot_range


def test_snapshot_range_chains_events_in_any_order():
    rng = snapshot_range(chained(("7", "5"), ("5", "4"), ("8", "7")))
    assert (rng.table, rng.table_format.value) == ("db.t", "BITLAKE")
    assert (rng.start_snapshot_id, rng.end_snapshot_id, rng.snapshot_ids) == ("4", "8", ("5", "7", "8"))


def test_several_partition_events_of_a_snapshot_count_once():
    events = chained(("2", "1"), partition=["eu"]) + chained(("2", "1"), partition=["us"]) + \
        chained(("3", "2"), partition=["eu"])
    rng = snapshot_range(events)
    assert (rng.start_snapshot_id, rng.end_snapshot_id, rng.snapshot_ids) == ("1", "3", ("2", "3"))
    assert rng.partitions == (("eu",), ("us",))


def test_the_first_snapshot_of_a_table_starts_from_the_beginning():
    rng = snapshot_range(chained(("1", None), ("2", "1")))
    assert (rng.start_snapshot_id, rng.end_snapshot_id) == (None, "2")


def test_events_as_json_registered_dicts_or_models():
    with TriggerStore("sqlite://") as store:
        registered = [r.event for r in store.register(chained(("2", "1"), ("3", "2")))]
    for given in (registered, encode_events(registered), [e.model_dump(mode="json") for e in registered]):
        assert snapshot_range(given).snapshot_ids == ("2", "3")


def test_a_missing_event_breaks_the_chain():
    with pytest.raises(BrokenChainError, match=r"do not form one chain.*4 follows 3.*missing"):
        snapshot_range(chained(("2", "1"), ("4", "3")))


def test_forks_disagreements_and_cycles_are_refused():
    with pytest.raises(BrokenChainError, match="both follow '1'"):
        snapshot_range(chained(("2", "1"), ("3", "1")))
    disagree = chained(("2", "1"), partition=["eu"]) + chained(("2", "0"), partition=["us"])
    with pytest.raises(BrokenChainError, match="disagree"):
        snapshot_range(disagree)
    with pytest.raises(BrokenChainError, match="cycle"):
        snapshot_range(chained(("2", "3"), ("3", "2")))
    with pytest.raises(BrokenChainError, match="cycle"):
        snapshot_range(chained(("1", None), ("2", "3"), ("3", "2")))
    with pytest.raises(BrokenChainError, match="no snapshot_id"):
        snapshot_range(chained((None, None)))


def test_one_table_per_range():
    with pytest.raises(IncrementalReadError, match="several tables"):
        snapshot_range(chained(("2", "1")) + chained(("3", "2"), table="db.u"))
    with pytest.raises(IncrementalReadError, match="no events"):
        snapshot_range([])


def test_hive_events_are_landings_not_a_chain():
    events = [event(table="t", table_format="HIVE", snapshot_id=s, partition=[p]) for s, p in
              (("10", "a"), ("11", "b"), ("12", "a"))]
    rng = snapshot_range(events)
    assert (rng.start_snapshot_id, rng.end_snapshot_id) == (None, None)
    assert rng.partitions == (("a",), ("b",)) and rng.snapshot_ids == ("10", "11", "12")


# ----------------------------------------------------------------------------------------------- reads


def collected(df, *columns) -> list[tuple]:
    return sorted(tuple(r) for r in df.select(*columns).collect())


@pytest.mark.spark
def test_read_changes_of_delta_is_its_change_data_feed(spark, tmp_path):
    path = tmp_path / "orders"
    delta_table(path, rows((1, "a", "x"), (2, "b", "y")))  # 0
    store = TriggerStore("sqlite://")
    adapter = DeltaAdapter(str(path), state_path=tmp_path / "s.json", table="db.orders")
    first = [r.event for r in adapter.emit(store)]
    delta_append(path, rows((3, "a", "z")))  # 1
    DeltaTable(str(path)).update({"v": "'x2'"}, predicate="id = 1")  # 2
    DeltaTable(str(path)).delete("id = 2")  # 3
    later = [r.event for r in adapter.emit(store)]

    df = read_changes(spark, first)
    assert collected(df, "id", "v", "_change_type", "_commit_version") == [(1, "x", "insert", 0), (2, "y", "insert", 0)]
    df = read_changes(spark, later)
    assert df.columns[-3:] == ["_change_type", "_commit_version", "_commit_timestamp"]
    assert collected(df, "id", "v", "_change_type", "_commit_version") == [
        (1, "x", "update_preimage", 2), (1, "x2", "update_postimage", 2), (2, "y", "delete", 3), (3, "z", "insert", 1)]
    assert [r._commit_version for r in df.select("_commit_version").collect()] == [1, 2, 2, 3]  # commit order
    store.close()


@pytest.mark.spark
def test_read_changes_of_delta_without_change_data_feed_is_refused(spark, tmp_path):
    path = tmp_path / "plain"
    delta_table(path, rows((1, "a", "x")), cdf=False)
    events = DeltaAdapter(str(path), state_path=tmp_path / "s.json").pending()
    with pytest.raises(IncrementalReadError, match="enableChangeDataFeed"):
        read_changes(spark, events)


@pytest.mark.spark
def test_read_changes_of_iceberg_reads_the_appended_files(spark, tmp_path):
    catalog = iceberg_catalog(tmp_path / "wh")
    table = iceberg_table(catalog)
    table.append(rows((1, "a", "x"), (2, "b", "y")))
    adapter = IcebergAdapter(table, state_path=tmp_path / "s.json")
    first = adapter.pending()
    adapter.emit(TriggerStore("sqlite://"))
    table = table.refresh()
    table.append(rows((3, "a", "z")))
    table.refresh().append(rows((4, "c", "w")))
    later = adapter.pending()
    snaps = [s.snapshot_id for s in table.refresh().snapshots()]

    df = read_changes(spark, first)  # from the table's folder: the events carry its location
    assert collected(df, "id", "ds", "v", "_change_type") == [(1, "a", "x", "insert"), (2, "b", "y", "insert")]
    df = read_changes(spark, later, catalog=catalog)  # by identifier from the catalog
    assert df.columns == ["id", "ds", "v", "_change_type", "_commit_snapshot_id", "_commit_timestamp"]
    assert collected(df, "id", "_commit_snapshot_id") == [(3, snaps[1]), (4, snaps[2])]


@pytest.mark.spark
def test_read_changes_of_iceberg_refuses_a_range_with_deletes(spark, tmp_path):
    catalog = iceberg_catalog(tmp_path / "wh")
    table = iceberg_table(catalog, partitioned=False)
    table.append(rows((1, "a", "x"), (2, "a", "y")))
    adapter = IcebergAdapter(table, state_path=tmp_path / "s.json")
    adapter.emit(TriggerStore("sqlite://"))
    table = table.refresh()
    table.append(rows((3, "a", "z")))
    table.refresh().delete("id = 1")
    with_delete = adapter.pending()
    with pytest.raises(IncrementalReadError, match="cannot return deletes"):
        read_changes(spark, with_delete)
    adapter.emit(TriggerStore("sqlite://"))
    table.refresh().append(rows((5, "b", "v")))
    after = adapter.pending()  # a range after the delete reads again
    assert collected(read_changes(spark, after), "id") == [(5,)]


@pytest.mark.spark
def test_read_changes_of_hive_reads_the_landed_partitions(spark, tmp_path):
    from pyspark.sql import functions as F

    root = tmp_path / "sales"
    land_hive(root, "ds=2024-01-01", [(1, "a")])
    adapter = HiveFolderAdapter(str(root), state_path=tmp_path / "s.json")
    adapter.emit(TriggerStore("sqlite://"))
    land_hive(root, "ds=2024-01-02", [(2, "b"), (3, "c")])
    land_hive(root, "ds=2024-01-03", [(4, "d")])
    events = adapter.pending()
    df = read_changes(spark, events)  # with the partition column, typed as Spark infers it
    assert collected(df, "id", "v", F.col("ds").cast("string")) == [
        (2, "b", "2024-01-02"), (3, "c", "2024-01-02"), (4, "d", "2024-01-03")]


def test_read_changes_needs_to_know_where_the_table_is():
    with pytest.raises(IncrementalReadError, match="cannot tell where table 'db.t' is"):
        read_changes(None, chained(("2", "1"), table_format="DELTA"))
