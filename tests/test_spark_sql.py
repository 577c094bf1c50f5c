"""bitlake tables by name in Spark SQL (the session extension and catalog of bitlake/spark/jvm, docs/spark-sql.md):
``SELECT`` of current and past views returns the rows of ``Table.to_arrow`` with the same columns and filter; the
physical plan reads only the columns a query needs and pushes its filters into the Parquet scans; SQL writes
(``INSERT``, ``DELETE``, ``UPDATE``, ``MERGE``) each make one commit equal to the Python call they map to."""

from __future__ import annotations

import datetime as dt
import itertools
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import bitlake
from tests.oracle import rows_key
from tests.test_datasource import COLUMNS, _build, _rows

pytestmark = pytest.mark.spark
_names = itertools.count()


def executed(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def arrow_rows(t, columns, **view) -> list[tuple]:
    return rows_key([_utc(r) for r in t.to_arrow(columns=columns, **view).to_pylist()], columns)


def _utc(row: dict) -> dict:
    return {k: v.replace(tzinfo=dt.UTC) if isinstance(v, dt.datetime) and v.tzinfo is None else v
            for k, v in row.items()}


def spark_rows(df, columns) -> list[tuple]:
    return rows_key([_utc(r.asDict()) for r in df.collect()], columns)


def register(spark, t) -> str:
    name = f"bl_{next(_names)}"
    spark.sql(f"CREATE TABLE {name} USING bitlake LOCATION '{t.path}'")
    return name


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return _build(str(tmp_path_factory.mktemp("sql") / "t"))


@pytest.fixture(scope="module")
def named(spark, table):
    t, _ = table
    return register(spark, t)


VIEWS = ["current", "version 1", "version 2", "timestamp 1", "timestamp 2", "event time", "version 2 event time"]
AT = "2026-01-01T15:00:00Z"


def _view(spark, table, view):
    """(the SQL clause of ``view``, the to_arrow keywords of the same view)."""
    t, times = table
    if view == "current":
        return "", {}
    if view.endswith("event time"):  # an option of the table reference: bitlake's valid_at
        clause, keywords = _view(spark, table, view.removesuffix("event time").strip() or "current")
        return f"{clause} WITH ('validAt' = '{AT}')", {**keywords, "valid_at": AT}
    kind, n = view.split()
    if kind == "version":
        return f"VERSION AS OF {n}", {"version": int(n)}
    return f"TIMESTAMP AS OF '{times[int(n) - 1]}'", {"as_of": times[int(n) - 1]}


@pytest.mark.parametrize("view", VIEWS)
def test_select_by_name_returns_the_rows_to_arrow_returns(spark, table, named, view):
    t, _ = table
    clause, keywords = _view(spark, table, view)
    assert spark_rows(spark.sql(f"SELECT * FROM {named} {clause}"), COLUMNS) == arrow_rows(t, COLUMNS, **keywords)
    df = spark.sql(f"SELECT k, name FROM {named} {clause} WHERE score > 10 AND name IS NOT NULL")
    expected = rows_key(t.to_arrow(columns=["k", "name"], filter=(pc.field("score") > 10) & pc.field("name").is_valid(),
                                   **keywords).to_pylist(), ["k", "name"])
    assert spark_rows(df, ["k", "name"]) == expected and expected


def test_an_aggregate_by_name_counts_the_view(spark, table, named):
    t, _ = table
    got = spark.sql(f"SELECT flag, count(*) AS n, sum(score) AS s FROM {named} GROUP BY flag").collect()
    view = t.to_arrow().group_by("flag").aggregate([("k", "count"), ("score", "sum")])
    assert sorted((r["flag"], r["n"], r["s"]) for r in got) == sorted(
        zip(view["flag"].to_pylist(), view["k_count"].to_pylist(), view["score_sum"].to_pylist(), strict=True))


@pytest.mark.parametrize("clause", ["", "VERSION AS OF 2"])
def test_a_one_column_query_reads_that_column_and_pushes_its_filter(spark, table, named, clause):
    df = spark.sql(f"SELECT name FROM {named} {clause} WHERE k > 40")
    plan = executed(df)
    schemas = re.findall(r"ReadSchema: (struct<[^>]*>)", plan)
    # The files the row filter reads also give it the row ids; no other column is read.
    assert schemas and all(s in ("struct<k:bigint,name:string>", "struct<k:bigint,name:string,_segment_part:int,"
                                 "_segment_seq:int,_segment_offset:int>") for s in schemas), plan
    assert len(re.findall(r"PushedFilters: \[[^]]*GreaterThan\(k,40\)", plan)) == len(schemas), plan
    # Version 2 has superseded rows in files of rows still valid: the row filter drops them, after the query's
    # own condition (so it looks up only the ids of the rows that condition keeps).
    assert ("bitlake_keep" in plan) == (clause != ""), plan
    for line in plan.splitlines():
        if "Filter" in line and "bitlake_keep" in line:
            assert -1 < line.index(" > 40)") < line.index("bitlake_keep"), line


def test_format_bitlake_reads_prune_and_match_the_table_api(spark, table):
    t, times = table
    for options, keywords in [({}, {}), ({"versionAsOf": 2}, {"version": 2}),
                              ({"timestampAsOf": times[0]}, {"as_of": times[0]}),
                              ({"validAt": "2026-01-01T15:00:00Z"}, {"valid_at": "2026-01-01T15:00:00Z"})]:
        df = spark.read.format("bitlake").options(**options).load(t.path)
        assert _rows(df) == arrow_rows(t, COLUMNS, **keywords), options
        one = df.where("k < 30").select("score")
        assert "ReadSchema: struct<k:bigint,score:double" in executed(one), options
        assert sorted(r["score"] for r in one.collect()) == sorted(
            t.to_arrow(columns=["score"], filter=pc.field("k") < 30, **keywords)["score"].to_pylist())


def test_a_table_named_by_its_path(spark, table):
    t, _ = table
    df = spark.sql(f"SELECT k FROM bitlake.`{t.path}` VERSION AS OF 1 WHERE k < 10")
    assert sorted(r["k"] for r in df.collect()) == sorted(
        t.to_arrow(version=1, columns=["k"], filter=pc.field("k") < 10)["k"].to_pylist())


def test_tombstones_and_deletes_hide_rows_by_name(spark, tmp_path):
    schema = pa.schema([("id", pa.int64()), ("who", pa.string()), ("ts", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id"], delta_column="ts")
    t.ingest(pa.table({"id": [1, 2, 3, 4], "who": ["ann", "o'neil", "bob", "ann"], "ts": [1, 1, 1, 1]}))
    t.tombstone("who", ["ann", "o'neil"])
    t.ingest(pa.table({"id": [5, 3], "who": ["ann", "cy"], "ts": [2, 2]}))
    name = register(spark, t)
    for clause, keywords in [("", {}), ("VERSION AS OF 2", {"version": 2}), ("VERSION AS OF 1", {"version": 1})]:
        got = spark_rows(spark.sql(f"SELECT * FROM {name} {clause}"), schema.names)
        assert got == arrow_rows(t, schema.names, **keywords), clause
    assert sorted(r["id"] for r in spark.sql(f"SELECT id FROM {name}").collect()) == [3, 5]


def test_the_schema_is_the_table_s_and_a_table_is_not_created_twice(spark, table, named):
    t, _ = table
    assert spark.table(named).columns == COLUMNS
    with pytest.raises(Exception, match="TableExistsError"):
        spark.sql(f"CREATE TABLE bl_twice (k bigint) USING bitlake LOCATION '{t.path}'")


def test_create_table_with_columns_makes_a_new_bitlake_table(spark, tmp_path):
    path = tmp_path / "new"
    spark.sql(f"CREATE TABLE bl_new (id BIGINT, region STRING, amount DOUBLE, ts BIGINT) USING bitlake "
              f"PARTITIONED BY (region) LOCATION '{path}' TBLPROPERTIES ('primary_key' = 'id', 'delta_column' = 'ts')")
    t = bitlake.open_table(str(path))
    assert (t.metadata.primary_key, t.metadata.delta_column, t.metadata.partition_by) == (("id",), "ts", ("region",))
    spark.sql("INSERT INTO bl_new VALUES (1, 'eu', 1.5, 1), (2, 'us', 2.5, 1), (1, 'eu', 3.0, 2)").collect()
    assert t.version == 1 and sorted(t.to_arrow().to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "region": "eu", "amount": 3.0, "ts": 2}, {"id": 2, "region": "us", "amount": 2.5, "ts": 1}]
    assert [tuple(r) for r in spark.sql("SELECT id, amount FROM bl_new WHERE region = 'eu'").collect()] == [(1, 3.0)]


def test_a_table_that_is_not_there_is_named_in_the_error(spark, tmp_path):
    with pytest.raises(Exception, match="TableNotFoundError"):
        spark.sql(f"CREATE TABLE bl_missing USING bitlake LOCATION '{tmp_path / 'nothing'}'")


WRITE_SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("ts", pa.int64())])
MERGE_SOURCE = pa.table({"id": [1, 50, 4], "v": ["m", "n", "x"], "ts": [5, 5, 5]}, schema=WRITE_SCHEMA)
# Each SQL write, and the Python call it maps to.
WRITES = [
    ("INSERT INTO {t} VALUES (4, 'd', 2), (1, 'A', 2)",
     lambda t: t.ingest(pa.table({"id": [4, 1], "v": ["d", "A"], "ts": [2, 2]}, schema=WRITE_SCHEMA))),
    ("INSERT INTO {t} SELECT id + 10, v, ts FROM {t} WHERE id < 3",
     lambda t: t.ingest(pa.table({"id": [11, 12], "v": ["A", "b"], "ts": [2, 1]}, schema=WRITE_SCHEMA))),
    ("DELETE FROM {t} WHERE id = 2 OR v = 'c'", lambda t: t.delete("id = 2 OR v = 'c'")),
    ("UPDATE {t} SET v = upper(v), ts = ts + 1 WHERE id > 10",
     lambda t: t.update("id > 10", set={"v": "upper(v)", "ts": "ts + 1"})),
    ("MERGE INTO {t} AS t USING (SELECT * FROM VALUES (1L, 'm', 5L), (50L, 'n', 5L), (4L, 'x', 5L) AS s(id, v, ts)) s "
     "ON t.id = s.id WHEN MATCHED AND s.id = 4 THEN DELETE WHEN MATCHED THEN UPDATE SET * "
     "WHEN NOT MATCHED THEN INSERT * WHEN NOT MATCHED BY SOURCE AND t.id > 11 THEN UPDATE SET v = 'gone'",
     lambda t: t.merge(MERGE_SOURCE, "target.id = source.id").when_matched_delete("source.id = 4")
     .when_matched_update_all().when_not_matched_insert_all()
     .when_not_matched_by_source_update({"v": "'gone'"}, "target.id > 11").execute()),
]


def test_each_sql_write_is_one_commit_equal_to_the_python_call(spark, tmp_path):
    tables = []
    for side in ("sql", "python"):
        t = bitlake.create_table(str(tmp_path / side), WRITE_SCHEMA, primary_key=["id"], delta_column="ts")
        t.ingest(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"], "ts": [1, 1, 1]}, schema=WRITE_SCHEMA))
        tables.append(t)
    by_sql, by_python = tables
    name = register(spark, by_sql)
    for statement, call in WRITES:
        before = by_sql.version
        spark.sql(statement.format(t=name)).collect()
        call(by_python)
        assert by_sql.version == before + 1 == by_python.version, statement
        assert by_sql.history()[0]["operation"] == by_python.history()[0]["operation"], statement
        assert rows_key(by_sql.to_arrow().to_pylist(), WRITE_SCHEMA.names) == rows_key(
            by_python.to_arrow().to_pylist(), WRITE_SCHEMA.names), statement
        assert spark_rows(spark.sql(f"SELECT * FROM {name}"), WRITE_SCHEMA.names) == rows_key(
            by_python.to_arrow().to_pylist(), WRITE_SCHEMA.names), statement


def test_writes_that_do_not_map_are_refused_by_name(spark, tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), WRITE_SCHEMA, primary_key=["id"], delta_column="ts")
    t.ingest(pa.table({"id": [1, 2], "v": ["a", "b"], "ts": [1, 1]}, schema=WRITE_SCHEMA))
    name = register(spark, t)
    with pytest.raises(Exception, match="INSERT OVERWRITE"):
        spark.sql(f"INSERT OVERWRITE {name} VALUES (3, 'c', 2)")
    with pytest.raises(Exception, match="has a subquery"):
        spark.sql(f"DELETE FROM {name} WHERE id IN (SELECT id FROM {name} WHERE v = 'a')")
    with pytest.raises(Exception, match="primary key"):
        spark.sql(f"UPDATE {name} SET id = id + 1")
    assert t.version == 1


@pytest.mark.slow
def test_a_spark_connect_client_names_tables_in_sql(tmp_path):
    from tests.sparkservers import start_connect_server

    server = start_connect_server(tmp_path)
    try:
        out = subprocess.run([sys.executable, str(Path(__file__).parent / "connect" / "sql.py"), server.url,
                              str(tmp_path)], capture_output=True, text=True, timeout=600)
    finally:
        server.stop()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert out.stdout.strip().endswith("ok")


TYPED = pa.schema([("k", pa.int64()), ("day", pa.date32()), ("at", pa.timestamp("us", tz="UTC")),
                   ("score", pa.float64()), ("amount", pa.decimal128(10, 2)), ("seq", pa.int64())])


def _typed(k, day, at, score, amount, seq) -> pa.Table:
    return pa.table({"k": [k], "day": [day], "at": [at], "score": [score], "amount": [amount], "seq": [seq]},
                    schema=TYPED)


def test_sql_writes_of_dates_timestamps_and_decimals_equal_the_python_calls(spark, tmp_path):
    from decimal import Decimal

    tables = [bitlake.create_table(str(tmp_path / side), TYPED, primary_key=["k"], delta_column="seq")
              for side in ("sql", "python")]
    by_sql, by_python = tables
    name = register(spark, by_sql)
    first = (1, dt.date(2026, 1, 2), dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC), 1.5, Decimal("10.25"), 1)
    later = (1, dt.date(2026, 2, 1), dt.datetime(2026, 2, 1, tzinfo=dt.UTC), 2.5, Decimal("5.50"), 2)
    steps = [
        (f"INSERT INTO {name} VALUES (1, DATE'2026-01-02', TIMESTAMP'2026-01-02 03:04:05', 1.5, 10.25, 1)",
         lambda t: t.ingest(_typed(*first))),
        (f"UPDATE {name} SET score = score + 1, amount = amount * 2 WHERE at < TIMESTAMP'2026-01-03 00:00:00' "
         "AND day = DATE'2026-01-02'",
         lambda t: t.update("at < TIMESTAMP'2026-01-03 00:00:00' AND day = DATE'2026-01-02'",
                            set={"score": "score + 1", "amount": "amount * 2"})),
        (f"MERGE INTO {name} t USING (SELECT 1L AS k, DATE'2026-02-01' AS day, TIMESTAMP'2026-02-01 00:00:00' AS at, "
         "2.5D AS score, CAST(5.5 AS DECIMAL(10, 2)) AS amount, 2L AS seq) s ON t.k = s.k "
         "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *",
         lambda t: t.merge(_typed(*later), "target.k = source.k").when_matched_update_all()
         .when_not_matched_insert_all().execute()),
    ]
    for statement, call in steps:
        spark.sql(statement).collect()
        call(by_python)
        assert by_sql.version == by_python.version, statement
        assert by_sql.to_arrow().to_pylist() == by_python.to_arrow().to_pylist(), statement
    assert by_sql.to_arrow().to_pylist() == [dict(zip(TYPED.names, later, strict=True))]


def test_a_named_table_describes_itself_takes_writes_by_path_and_by_writer_and_drops_without_its_data(spark, tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), WRITE_SCHEMA, primary_key=["id"], delta_column="ts")
    t.ingest(pa.table({"id": [1, 2], "v": ["a", "b"], "ts": [1, 1]}, schema=WRITE_SCHEMA))
    name = register(spark, t)
    described = {r["col_name"]: r["data_type"] for r in spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()}
    assert (described["Provider"], described["Type"], described["id"]) == ("bitlake", "EXTERNAL", "bigint")
    spark.sql(f"INSERT INTO bitlake.`{t.path}` VALUES (3, 'c', 2)").collect()
    spark.createDataFrame([(4, "d", 3)], "id long, v string, ts long").writeTo(name).append()
    assert t.version == 3 and sorted(r["id"] for r in t.to_arrow().to_pylist()) == [1, 2, 3, 4]
    spark.sql(f"DROP TABLE {name}")
    assert bitlake.open_table(t.path).to_arrow().num_rows == 4


def test_by_name_reads_compacted_files_and_revived_rows_as_the_arrow_reader(spark, tmp_path):
    from tests.test_compaction import COLUMNS as CHURNED
    from tests.test_compaction import TIMES, batch, churned

    t = churned(str(tmp_path / "churned"))
    t.metagen()
    t.compact()
    t.ingest(batch(range(0, 40, 2), 30, 500), op_column="op", batch_id="b5")  # compacted files now hold old rows
    name = register(spark, t)
    for v in (t.version - 2, t.version - 1, t.version):
        for at in TIMES:
            clause = f"VERSION AS OF {v}" + ("" if at is None else f" WITH ('validAt' = '{at}')")
            got = spark_rows(spark.sql(f"SELECT * FROM {name} {clause}"), CHURNED)
            assert got == arrow_rows(t, CHURNED, version=v, valid_at=at), clause
