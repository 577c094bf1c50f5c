"""The table API through Spark: bad input, idempotence, unkeyed tables, interop with plain Spark."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import bitlake
from bitlake.format import rowid

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("mod", pa.int64())])


def batch(ids, names, mods, ops=None):
    cols = {"id": pa.array(ids, pa.int64()), "name": pa.array(names, pa.string()), "mod": pa.array(mods, pa.int64())}
    if ops is not None:
        cols["op"] = pa.array(ops, pa.string())
    return pa.table(cols)


@pytest.fixture
def table(tmp_path, spark):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod", num_buckets=2)
    t.ingest(batch([1, 2], ["a", "b"], [1, 1]), batch_id="base", spark=spark)
    return t


def files_under(path):
    """The files under ``path`` at rest: the flush a key index starts after a commit, on RocksDB's thread, is
    waited for first (its file belongs to that commit, not to what comes next)."""
    from bitlake.engine.keys.indexsession import flush_idle

    flush_idle()
    return sorted(os.path.relpath(os.path.join(d, n), path) for d, _, ns in os.walk(path) for n in ns)


def view(t):
    return sorted((r["id"], r["name"], r["mod"]) for r in t.to_arrow().to_pylist())


@pytest.mark.parametrize(
    "data, error, message",
    [
        (batch([3, None], ["c", "d"], [2, 2], ["upsert", "upsert"]), bitlake.NullValueError, "primary key column 'id'"),
        (batch([3, 4], ["c", "d"], [2, None], ["upsert", "upsert"]), bitlake.NullValueError, "delta column 'mod'"),
        (batch([3, 4], ["c", "d"], [2, 2], ["upsert", "upsrt"]), bitlake.UnknownOperationError, "'upsrt'"),
        (batch([3, 4], ["c", "d"], [2, 2], ["upsert", None]), bitlake.UnknownOperationError, "None"),
        (batch([3], ["c"], [2], ["upsert"]).append_column("extra", pa.array([1])), bitlake.SchemaMismatchError, "'extra'"),
        (pa.table({"name": ["c"], "mod": [2], "op": ["upsert"]}), bitlake.SchemaMismatchError, "missing column 'id'"),
        (pa.table({"id": ["x"], "name": ["c"], "mod": [2], "op": ["upsert"]}), bitlake.SchemaMismatchError, "column 'id' has type string"),
        (pa.table({"id": [3], "name": ["c"], "mod": [2]}), bitlake.SchemaMismatchError, "op_column 'op' is not a column"),
    ],
)
@pytest.mark.parametrize("landing", ["driver", "spark-job", "spark-files"])
def test_bad_batches_change_nothing(table, spark, data, error, message, landing, tmp_path):
    """``spark-files``: the batch as a Parquet file Spark reads, which the landing tasks read themselves (or, for
    columns that do not conform, Spark's rows do)."""
    if landing != "driver":
        table.set_properties({"ingest.driver_max_bytes": "0"})
        if landing == "spark-files":
            pq.write_table(data, tmp_path / "batch.parquet", row_group_size=1)
            data = spark.read.parquet(str(tmp_path / "batch.parquet"))
        else:
            data = spark.createDataFrame(data)
    before_files, before_version, before_view = files_under(table.path), table.version, view(table)
    with pytest.raises(error, match=message):
        table.ingest(data, op_column="op", batch_id="bad", spark=spark)
    assert table.version == before_version and view(table) == before_view
    # Only the claimed segment-part marker may remain: no data or metadata file of the batch.
    leftovers = [p for p in files_under(table.path) if p not in before_files and not p.startswith("_bitlake/parts/")]
    assert leftovers == []
    # The rejected batch id is free for a corrected retry.
    r = table.ingest(batch([3], ["c"], [2], ["upsert"]), op_column="op", batch_id="bad", spark=spark)
    assert r.committed and (3, "c", 2) in view(table)


def test_a_retried_batch_id_is_a_no_op(table, spark):
    first = table.ingest(batch([3], ["c"], [2]), batch_id="b", spark=spark)
    again = table.ingest(batch([3], ["c"], [2]), batch_id="b", spark=spark)
    assert first.committed and not again.committed and again.version == first.version
    assert again.counts == first.counts == {"inserted": 1, "updated": 0, "deleted": 0, "stale": 0, "ignored_deletes": 0}
    with pytest.raises(bitlake.BatchIdReusedError, match="'b'"):  # other records under the id
        table.ingest(batch([3], ["other"], [9]), batch_id="b", spark=spark)
    # A Spark DataFrame is not read again to compare: its retry is a no-op whatever its records.
    other = spark.createDataFrame([(3, "other", 9)], "id long, name string, mod long")
    assert not table.ingest(other, batch_id="b", spark=spark).committed
    assert view(table) == [(1, "a", 1), (2, "b", 1), (3, "c", 2)]


def test_inputs_may_be_spark_pandas_or_arrow(table, spark):
    table.ingest(spark.createDataFrame([(3, "c", 2)], "id long, name string, mod long"), batch_id="s", spark=spark)
    table.ingest(batch([4], ["d"], [2]).to_pandas(), batch_id="p", spark=spark)
    with pytest.raises(bitlake.InvalidInputError, match="cannot ingest a list"):
        table.ingest([1, 2], spark=spark)
    assert [r[0] for r in view(table)] == [1, 2, 3, 4]


def test_narrower_types_widen_and_missing_nullable_columns_are_null(table, spark):
    data = pa.table({"id": pa.array([5, 1], pa.int32()), "mod": pa.array([3, 3], pa.int32()), "op": ["upsert", "delete"]})
    r = table.ingest(data, op_column="op", spark=spark)
    assert r.counts["inserted"] == 1 and r.counts["deleted"] == 1
    assert view(table) == [(2, "b", 1), (5, None, 3)]


def test_pending_batches_are_invisible_until_metagen(table, spark):
    r = table.ingest(batch([1, 9], ["late", "new"], [5, 5]), batch_id="p1", metagen=False, spark=spark)
    assert r.committed and not r.visible
    assert view(table) == [(1, "a", 1), (2, "b", 1)]
    assert table.describe()["pending_batches"] == ["p1"]
    done = table.metagen(spark=spark)
    assert done.version == r.version + 1 and view(table) == [(1, "late", 5), (2, "b", 1), (9, "new", 5)]
    assert not table.metagen(spark=spark).committed


def test_unkeyed_tables_append(tmp_path, spark):
    t = bitlake.create_table(str(tmp_path / "log"), SCHEMA)
    t.ingest(batch([1, 1], ["a", "a"], [1, 1]), spark=spark)
    t.ingest(batch([1], ["a"], [1]), spark=spark)
    assert len(t.to_arrow()) == 3 and t.to_spark(spark).count() == 3
    with pytest.raises(bitlake.InvalidInputError, match="takes no op_column"):
        t.ingest(batch([1], ["a"], [1], ["delete"]), op_column="op", spark=spark)


def test_opening_what_is_not_a_table(tmp_path):
    with pytest.raises(bitlake.TableNotFoundError, match="does not exist"):
        bitlake.open_table(str(tmp_path / "missing"))
    with pytest.raises(bitlake.NotATableError, match="not a bitlake table"):
        bitlake.open_table(str(tmp_path))
    (tmp_path / "file").write_text("x")
    with pytest.raises(bitlake.NotATableError, match="is a file"):
        bitlake.open_table(str(tmp_path / "file"))


def test_creating_over_a_table_fails(table):
    with pytest.raises(bitlake.TableExistsError):
        bitlake.create_table(table.path, SCHEMA, primary_key=["id"], delta_column="mod")


def test_plain_spark_reads_the_data_files_and_agrees_with_arrow(table, spark):
    table.ingest(batch([1, 3], ["a2", "c"], [2, 2]), batch_id="u", spark=spark)
    files = [os.path.join(table.path, f.path) for f in table.state().data_files()]
    plain = spark.read.parquet(*files)
    assert set(rowid.ROW_ID_COLUMNS) <= set(plain.columns) and plain.count() == 4  # all stored rows
    with_ids = table.to_spark(spark, include_row_ids=True)
    ids = [tuple(r[c] for c in rowid.ROW_ID_COLUMNS) for r in with_ids.collect()]
    assert len(ids) == len(set(ids)) == 3
    from_spark = sorted(tuple(r) for r in table.to_spark(spark).collect())
    assert from_spark == view(table) == [(1, "a2", 2), (2, "b", 1), (3, "c", 2)]
    arrow_ids = table.to_arrow(include_row_ids=True)
    assert sorted(zip(*[arrow_ids.column(c).to_pylist() for c in rowid.ROW_ID_COLUMNS], strict=True)) == sorted(ids)


def test_partitioned_table_writes_hive_folders_and_prunes(tmp_path, spark):
    schema = pa.schema([("id", pa.int64()), ("region", pa.string()), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "p"), schema, primary_key=["id"], delta_column="mod", partition_by=["region"])
    t.ingest(pa.table({"id": [1, 2, 3], "region": ["eu", "us", None], "mod": [1, 1, 1]}), spark=spark)
    t.ingest(pa.table({"id": [2], "region": ["eu"], "mod": [2]}), spark=spark)  # a key moves partition
    folders = {os.path.dirname(f.path) for f in t.state().data_files()}
    assert folders == {"data/region=eu", "data/region=us", "data/region=__HIVE_DEFAULT_PARTITION__"}
    df = t.to_spark(spark)
    assert sorted(tuple(r) for r in df.collect()) == [(1, "eu", 1), (2, "eu", 2), (3, None, 1)]
    eu = df.filter("region = 'eu'")
    assert sorted(r.id for r in eu.collect()) == [1, 2]
    assert "PushedFilters: [IsNotNull(region), EqualTo(region,eu)]" in eu._jdf.queryExecution().executedPlan().toString()


def test_spark_reads_partition_values_from_the_files(tmp_path, spark):
    """A folder name escapes every byte of a value's UTF-8 text that is not plain ASCII; Spark would decode each
    escaped byte as one character, refuse an empty value and read the null folder's name as null: its reads
    take the values from the files, which hold them, and a Spark SQL update keeps them."""
    schema = pa.schema([("id", pa.int64()), ("city", pa.string()), ("n", pa.int64()), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "p"), schema, primary_key=["id"], delta_column="mod", partition_by=["city"])
    cities = ["München", "", "__HIVE_DEFAULT_PARTITION__", None, "a b=c%d"]
    t.ingest(pa.table({"id": list(range(5)), "city": cities, "n": [0] * 5, "mod": [1] * 5}, schema=schema))
    rows = sorted((r.id, r.city) for r in t.to_spark(spark).collect())
    assert rows == sorted(enumerate(cities))
    assert t.update("city = 'München'", {"n": "n + 1"}, spark=spark).matched == 1
    assert sorted((r["id"], r["city"], r["n"]) for r in t.to_arrow().to_pylist()) == \
        sorted((i, c, 1 if i == 0 else 0) for i, c in enumerate(cities))


def test_a_spark_schema_defines_the_table(tmp_path, spark):
    import datetime as dt

    df = spark.createDataFrame([(1, "a", dt.datetime(2026, 1, 1))], "id long, name string, mod timestamp")
    t = bitlake.create_table(str(tmp_path / "s"), df.schema, primary_key=["id"], delta_column="mod")
    assert str(t.metadata.schema.field("mod").type) == "timestamp[us, tz=UTC]"
    t.ingest(df, spark=spark)
    assert [r["id"] for r in t.to_arrow().to_pylist()] == [1]


@pytest.mark.parametrize("file_format", ["parquet", "orc"])
def test_added_columns_read_as_null_in_older_rows(tmp_path, spark, file_format):
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod",
                             file_format=file_format)
    t.ingest(batch([1, 2], ["a", "b"], [1, 1]), batch_id="before", spark=spark)
    v = t.add_columns([pa.field("score", pa.float64())]).version
    assert t.version == v and t.metadata.column_names == ["id", "name", "mod", "score"]
    t.ingest(pa.table({"id": [2, 3], "name": ["b2", "c"], "mod": [2, 2], "score": [0.5, None]}), batch_id="after",
             spark=spark)
    expected = [(1, "a", 1, None), (2, "b2", 2, 0.5), (3, "c", 2, None)]
    assert sorted(tuple(r.values()) for r in t.to_arrow().to_pylist()) == expected
    assert sorted(tuple(r) for r in t.to_spark(spark).collect()) == expected
    assert t.to_arrow(version=1).column_names == ["id", "name", "mod"]  # the schema as of that version
    with pytest.raises(bitlake.SchemaMismatchError, match="must be nullable"):
        t.add_columns([pa.field("strict", pa.int64(), nullable=False)])
    with pytest.raises(bitlake.SchemaMismatchError, match="already exists"):
        t.add_columns([pa.field("Score", pa.int64())])


def test_properties_change_in_a_commit(table):
    v = table.set_properties({"checkpoint.interval": "5"}).version
    assert table.metadata.properties == {"checkpoint.interval": "5"}
    assert table.history()[0]["operation"] == "SET_METADATA" and table.version == v
    table.set_properties({"checkpoint.interval": ""})
    assert table.metadata.properties == {}
    with pytest.raises(bitlake.InvalidInputError, match="unknown table property"):
        table.set_properties({"no.such": "1"})
    with pytest.raises(bitlake.InvalidInputError, match="must be a whole number"):
        table.set_properties({"checkpoint.interval": "often"})


def test_the_table_name_is_logical_and_events_carry_it(tmp_path, spark):
    t = bitlake.create_table(str(tmp_path / "folder"), SCHEMA, primary_key=["id"], delta_column="mod")
    assert t.name == "folder"
    named = bitlake.create_table(str(tmp_path / "other"), SCHEMA, name="crm.accounts")
    named.ingest(pa.table({"id": [1], "name": ["a"], "mod": [1]}), spark=spark)
    from bitlake.format import commitlog

    assert [e["table"] for e in commitlog.read(named.io, 1).events] == ["crm.accounts"]


def test_a_tombstone_hides_rows_committed_before_it_in_every_later_view(tmp_path, spark):
    """The format's tombstone action, written by hand here (the API that writes it is restatement's): rows of
    batches made live before it whose column holds a value are hidden at its version and later only."""
    import pyarrow.parquet as pq

    from bitlake import transaction
    from bitlake.format import commitlog, layout
    from bitlake.format.commit import Commit, Tombstone
    from bitlake.format.protocol import TOMBSTONES

    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod")
    t.ingest(batch([1, 2, 3], ["erase", "keep", None], [1, 1, 1]), batch_id="b1", spark=spark)
    path = layout.tombstone_path()
    with t.io.open_output(path) as out:
        pq.write_table(pa.table({"name": ["erase", "gone", None]}), out)  # a null never matches

    def build(state):
        protocol = state.protocol.with_features(TOMBSTONES)
        return Commit(state.version + 1, "TOMBSTONE", commitlog.now_ms(state.timestamp_ms), protocol=protocol,
                      tombstones=(Tombstone("name", path, 2),))

    c = transaction.run(t.io, t.refresh, lambda state: transaction.Attempt(build(state), (path,)))
    t.ingest(batch([4], ["erase"], [2]), batch_id="b2", spark=spark)  # committed after it: visible as usual
    assert view(t) == [(2, "keep", 1), (3, None, 1), (4, "erase", 2)]
    assert sorted(tuple(r) for r in t.to_spark(spark).collect()) == [(2, "keep", 1), (3, None, 1), (4, "erase", 2)]
    assert sorted(r["id"] for r in t.to_arrow(version=c.version - 1).to_pylist()) == [1, 2, 3]
    assert sorted(r["id"] for r in t.to_arrow(version=c.version, valid_at=1).to_pylist()) == [2, 3]
    assert path not in t.cleanup(min_age_seconds=0, dry_run=True)


@pytest.mark.parametrize("kwargs, message", [
    ({"primary_key": ["id", "mod"], "delta_column": "mod"}, "delta column 'mod' cannot be a key column"),
    ({"primary_key": ["id", "id"], "delta_column": "mod"}, r"names a column twice"),
    ({"partition_by": ["name", "name"]}, r"names a column twice"),
    ({"properties": {"compact.look_back": "a week"}}, "must be a version, an age"),
    ({"properties": {"maintain.major_interval": "daily"}}, "must be an age"),
    ({"properties": {"checkpoint.interval": "0"}}, "whole number of at least 1"),
    ({"properties": {"keystore.max_increments": "1.5"}}, "whole number"),
    ({"properties": {"maintain.auto_budget": "inf"}}, "number of at least 0"),
    ({"properties": {"keystore.index": "bogus"}}, "must be one of"),
])
def test_a_table_that_cannot_work_is_refused_at_creation(tmp_path, kwargs, message):
    with pytest.raises(bitlake.InvalidInputError, match=message):
        bitlake.create_table(str(tmp_path / "t"), SCHEMA, **kwargs)
    assert not (tmp_path / "t").exists() or not any((tmp_path / "t").rglob("*.json"))


def test_a_null_in_a_non_nullable_column_is_refused_by_name(tmp_path):
    schema = pa.schema([("id", pa.int64()), pa.field("name", pa.string(), nullable=False), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id"], delta_column="mod")
    with pytest.raises(bitlake.NullValueError, match="non-nullable column 'name' holds 1 null"):
        t.ingest(pa.table({"id": [1, 2], "name": pa.array(["a", None]), "mod": [1, 1]}))
    assert t.version == 0 and [p for p in files_under(t.path) if p.startswith("data/")] == []
    r = t.ingest(pa.table({"id": [1], "name": pa.array([None], pa.string()), "mod": [1], "op": ["delete"]}),
                 op_column="op")  # a delete stores no row: its other columns may be null
    assert r.counts["ignored_deletes"] == 1
    strict = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("mod", pa.int64(), nullable=False)])
    s = bitlake.create_table(str(tmp_path / "s"), strict, primary_key=["id"], delta_column="mod")
    for data, column in ((pa.table({"id": [1, None], "mod": [1, 1]}), "primary key column 'id'"),
                         (pa.table({"id": [1, 2], "mod": [1, None]}), "delta column 'mod'")):
        with pytest.raises(bitlake.NullValueError, match=column):  # not the cast's ValueError
            s.ingest(data)
    assert s.version == 0
    for ok in ("7d", "12", "2026-11-01T00:00:00Z"):
        t.set_properties({"compact.look_back": ok})
    with pytest.raises(bitlake.InvalidInputError, match="at least one column"):
        t.add_columns([])
    with pytest.raises(bitlake.InvalidInputError, match="must not be empty"):
        t.add_columns([pa.field(" ", pa.int64())])


def test_a_filter_that_does_not_apply_is_refused_by_name(tmp_path):
    import pyarrow.compute as pc

    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key=["id"], delta_column="mod")
    t.ingest(pa.table({"id": [1, 2], "name": ["a", "b"], "mod": [1, 1]}))
    with pytest.raises(bitlake.InvalidInputError, match=r"filter \(nope > 1\) does not apply.*No match"):
        t.to_arrow(filter=pc.field("nope") > 1)
    with pytest.raises(bitlake.InvalidInputError, match="does not apply.*no kernel"):
        t.view(filter=pc.field("id") > "a")
    assert t.to_arrow(filter=pc.field("id") > 1).column("name").to_pylist() == ["b"]


def test_nested_types_are_normalised_and_conformed(tmp_path):
    """Large, view and dictionary types inside lists, maps and structs are stored as Spark stores them, and an
    input of either form goes in."""
    large = pa.schema([("id", pa.int64()), ("tags", pa.large_list(pa.large_string())),
                       ("who", pa.struct([("n", pa.dictionary(pa.int32(), pa.string()))])),
                       ("attrs", pa.map_(pa.large_string(), pa.large_binary())), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), large, primary_key=["id"], delta_column="mod")
    assert t.metadata.schema.field("tags").type == pa.list_(pa.string())
    assert t.metadata.schema.field("who").type == pa.struct([("n", pa.string())])
    assert t.metadata.schema.field("attrs").type == pa.map_(pa.string(), pa.binary())
    t.ingest(pa.table({"id": [1], "tags": [["a"]], "who": [{"n": "x"}], "attrs": [[("k", b"v")]], "mod": [1]},
                      schema=large))
    t.ingest(pa.table({"id": [2], "tags": [["b"]], "who": [{"n": "y"}], "attrs": [[("k", b"w")]], "mod": [1]},
                      schema=t.metadata.schema))
    assert [r["tags"] for r in sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"])] == [["a"], ["b"]]
    with pytest.raises(bitlake.SchemaMismatchError, match="column 'who'"):
        t.ingest(pa.table({"id": [3], "tags": [[]], "who": [{"m": "z"}], "attrs": [None], "mod": [1]}))


def test_small_refusals_and_an_empty_projection(tmp_path):
    import pandas as pd

    schema = pa.schema([("id", pa.int64()), ("tags", pa.list_(pa.string())), ("at", pa.timestamp("us", tz="UTC"))])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id"], delta_column="at")
    t.ingest(pa.table({"id": [1, 2, 3], "tags": [["a"], [], None],
                       "at": pa.array([1_000_000] * 3, pa.timestamp("us", tz="UTC"))}))
    assert t.to_arrow(columns=[]).num_rows == 3 and t.to_arrow(columns=[]).num_columns == 0
    assert t.to_batches(columns=[]).read_all().num_rows == 3  # a streamed projection of nothing keeps the count
    for bad in (float("nan"), float("inf")):
        with pytest.raises(bitlake.InvalidInputError, match="finite number of seconds"):
            t.to_arrow(valid_at=bad)
    with pytest.raises(bitlake.InvalidInputError, match="column 'tags' has type list"):
        t.tombstone("tags", [["a"]])
    twice = pd.DataFrame([[4, None, pd.Timestamp("2026-01-01", tz="UTC")]], columns=["id", "id", "at"])
    with pytest.raises(bitlake.SchemaMismatchError, match="Duplicate column names"):
        t.ingest(twice)
    assert t.version == 1


def test_a_type_the_file_format_cannot_store_is_refused_at_creation(tmp_path):
    with pytest.raises(bitlake.InvalidInputError, match="'u' has type uint32, which orc files cannot store"):
        bitlake.create_table(str(tmp_path / "o"), pa.schema([("k", pa.int64()), ("u", pa.uint32())]),
                             file_format="orc")
    t = bitlake.create_table(str(tmp_path / "p"), pa.schema([("k", pa.int64())]))
    with pytest.raises(bitlake.InvalidInputError, match="'iv' has type month_day_nano_interval, which parquet"):
        t.add_columns([pa.field("iv", pa.month_day_nano_interval())])
    assert t.version == 0


def test_one_key_column_may_be_given_by_its_name(tmp_path):
    """``primary_key="id"`` (lance's habit) is the column id, not the columns i and d."""
    t = bitlake.create_table(str(tmp_path / "t"), SCHEMA, primary_key="id", delta_column="mod", partition_by="name")
    assert (t.metadata.primary_key, t.metadata.partition_by) == (("id",), ("name",))
    t.ingest(batch([1, 2], ["a", "b"], [1, 1]))
    assert sorted(r["id"] for r in t.to_arrow().to_pylist()) == [1, 2]


def test_history_with_a_limit_lists_the_newest_commits_only(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), pa.schema([("x", pa.int64())]))
    for i in range(4):
        t.ingest(pa.table({"x": [i]}))
    everything = t.history()
    assert [h["version"] for h in everything] == [4, 3, 2, 1, 0]
    assert t.history(limit=2) == everything[:2] and t.history(limit=10) == everything and t.history(limit=0) == []
    with pytest.raises(bitlake.InvalidInputError, match="limit must be a count"):
        t.history(limit=-1)
