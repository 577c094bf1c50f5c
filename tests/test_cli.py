"""The ``bitlake`` command line, run in-process through ``main([...])`` so every test shares one Spark."""

import importlib.util
import json
import pathlib

import pyarrow as pa
import pytest

import bitlake
from bitlake.cli import main

SCHEMA = "aid:int64,name:string,mod:timestamp"
BASE_CSV = """\
name,aid,mod,op
alice,1,2024-01-01T00:00:00Z,upsert
bob,2,2024-01-01T00:00:00Z,upsert
carol,3,2024-01-01T00:00:00Z,upsert
"""
# An update, a delete carrying only key and delta, and a record older than the stored one (stale).
CHANGES_JSONL = """\
{"aid": 1, "name": "alice-2", "mod": "2024-02-01T00:00:00Z", "op": "upsert"}
{"aid": 2, "mod": "2024-02-01T00:00:00Z", "op": "delete"}
{"aid": 3, "name": "carol-old", "mod": "2023-06-01T00:00:00Z", "op": "upsert"}
{"aid": 4, "name": "dave", "mod": "2024-02-01T00:00:00Z", "op": "upsert"}
"""


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """A keyed table after a CSV base batch and a JSON-lines change batch landed, then MetaGen'd."""
    root = tmp_path_factory.mktemp("cli")
    (root / "base.csv").write_text(BASE_CSV)
    (root / "changes.jsonl").write_text(CHANGES_JSONL)
    path = root / "accounts"
    steps = [
        ["create", path, "--schema", SCHEMA, "--primary-key", "aid", "--delta-column", "mod", "--buckets=2"],
        ["ingest", path, root / "base.csv", "--op-column=op", "--batch-id=base", "--metagen-mode=spark"],
        ["ingest", path, root / "changes.jsonl", "--op-column=op", "--batch-id=changes", "--no-metagen"],
    ]
    for argv in steps:
        assert main([str(a) for a in argv]) == 0
    assert bitlake.open_table(str(path)).describe()["pending_batches"] == ["changes"]
    assert main(["metagen", str(path), "--metagen-mode=inline"]) == 0
    return root


@pytest.mark.spark
def test_ingest_and_metagen_apply_the_batches(lake):
    table = bitlake.open_table(str(lake / "accounts"))
    view = {r["aid"]: r["name"] for r in table.to_arrow().to_pylist()}
    assert view == {1: "alice-2", 3: "carol", 4: "dave"}
    assert table.version == 3
    assert table.describe()["pending_batches"] == []


@pytest.mark.spark
def test_retried_batch_id_is_a_no_op(lake, capsys):
    path = lake / "accounts"
    code, out, _ = run(capsys, "ingest", path, lake / "changes.jsonl", "--op-column=op", "--batch-id=changes")
    assert code == 0
    assert "already committed at version 3" in out
    assert bitlake.open_table(str(path)).version == 3


@pytest.mark.spark
def test_metagen_without_pending_batches(lake, capsys):
    code, out, _ = run(capsys, "metagen", lake / "accounts")
    assert (code, out.strip()) == (0, "no pending batches: nothing to do")


@pytest.mark.spark
def test_show_prints_the_current_view(lake, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run(capsys, "show", lake / "accounts", "--limit", "2", "--row-ids")
    assert code == 0
    assert "3 rows, first 2" in out
    assert "alice-2" in out and "carol" in out and "dave" not in out  # ordered by key, limited to 2
    assert "_segment_offset" in out
    assert "reading the current view" in err


@pytest.mark.spark
def test_show_travels_by_version_and_event_time(lake, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(capsys, "show", lake / "accounts", "--version", "1")
    assert code == 0 and "version 1: 3 rows" in out and "bob" in out and "alice-2" not in out
    code, out, _ = run(capsys, "show", lake / "accounts", "--valid-at", "2024-01-15T00:00:00Z")
    assert code == 0 and "3 rows" in out and "bob" in out and "alice-2" not in out and "dave" not in out
    code, _, err = run(capsys, "show", lake / "accounts", "--version", "9")
    assert code == 2 and "version 9 does not exist" in err


@pytest.mark.spark
def test_changes_prints_the_feed(lake, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(capsys, "changes", lake / "accounts", "--starting-version", "2")  # included, as in Delta
    assert code == 0
    for kind in ("update_preimage", "update_postimage", "delete", "insert"):
        assert kind in out
    assert "carol" not in out  # version 1's insert is before the range
    code, out, _ = run(capsys, "changes", lake / "accounts", "--starting-version", "2", "--change-types", "delete")
    assert code == 0 and "bob" in out and "alice" not in out


@pytest.mark.spark
def test_history_lists_commits_newest_first(lake, capsys, monkeypatch):
    code, out, _ = run(capsys, "history", lake / "accounts", "--json")
    assert code == 0
    history = json.loads(out)
    assert [h["operation"] for h in history] == ["METAGEN", "LAND", "INGEST", "CREATE"]
    assert history[0]["processed"] == ["changes"]
    assert {k: v for k, v in history[0]["counts"].items() if v} == {
        "inserted": 1, "updated": 1, "deleted": 1, "stale": 1}

    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(capsys, "history", lake / "accounts")
    assert code == 0
    assert "METAGEN" in out and "inserted=3" in out


@pytest.mark.spark
def test_describe_prints_json(lake, capsys):
    code, out, _ = run(capsys, "describe", lake / "accounts")
    assert code == 0
    d = json.loads(out)
    assert d["primary_key"] == ["aid"] and d["delta_column"] == "mod" and d["num_buckets"] == 2
    assert (d["version"], d["valid_rows"], d["stored_rows"]) == (3, 3, 6)


@pytest.mark.spark
def test_cleanup_keeps_young_files_and_lists_old_ones(lake, capsys):
    path = lake / "accounts"
    orphan = path / "data" / "00000099-orphan.parquet"
    orphan.write_bytes(b"left by a job that never committed")
    code, out, _ = run(capsys, "cleanup", path)
    assert code == 0 and "removed 0 unreferenced file(s)" in out
    code, out, _ = run(capsys, "cleanup", path, "--min-age-seconds", "0", "--dry-run")
    assert code == 0 and "data/00000099-orphan.parquet" in out and orphan.exists()
    code, out, _ = run(capsys, "cleanup", path, "--min-age-seconds", "0")
    assert code == 0 and not orphan.exists()
    assert bitlake.open_table(str(path)).to_arrow().num_rows == 3


@pytest.mark.spark
def test_ingest_parquet_input(spark, tmp_path, capsys):
    path = tmp_path / "events"
    assert main(["create", str(path), "--schema", "id:int64,v:double,seq:int64", "--primary-key", "id",
                 "--delta-column", "seq"]) == 0
    df = spark.createDataFrame([(1, 1.5, 7), (2, 2.5, 7)], "id int, v double, seq int")  # int widens to int64
    df.write.parquet(str(tmp_path / "in.parquet"))
    code, out, _ = run(capsys, "ingest", path, tmp_path / "in.parquet")
    assert code == 0 and "inserted=2" in out
    assert sorted(bitlake.open_table(str(path)).to_arrow()["id"].to_pylist()) == [1, 2]


@pytest.mark.spark
def test_bad_input_exits_2_with_one_clear_line(lake, capsys):
    bad = lake / "null-key.csv"
    bad.write_text("aid,name,mod\n,nobody,2024-03-01T00:00:00Z\n")
    path = lake / "accounts"
    code, out, err = run(capsys, "ingest", path, bad, "--batch-id", "bad")
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("bitlake ")]
    assert len(lines) == 1 and lines[0].startswith("bitlake ingest: error:") and "'aid'" in lines[0]
    assert "Traceback" not in err
    assert bitlake.open_table(str(path)).version == 3


def test_create_parses_compact_and_json_schemas(tmp_path, capsys):
    spec = "id:int64, d:date, p:decimal(10,2), f:bool, t:timestamp, n:TIMESTAMP_NTZ"
    code, out, _ = run(capsys, "create", tmp_path / "a", "--schema", spec, "--partition-by=d", "--format=orc")
    assert code == 0 and "append-only" in out
    meta = bitlake.open_table(str(tmp_path / "a")).metadata
    assert meta.schema == pa.schema([("id", pa.int64()), ("d", pa.date32()), ("p", pa.decimal128(10, 2)),
                                     ("f", pa.bool_()), ("t", pa.timestamp("us", tz="UTC")),
                                     ("n", pa.timestamp("us"))])
    assert (meta.partition_by, meta.file_format) == (("d",), "orc")

    # `describe` output (or its column list) is accepted as a schema file, so a table's schema round-trips.
    code, out, _ = run(capsys, "describe", tmp_path / "a")
    (tmp_path / "schema.json").write_text(out)
    assert main(["create", str(tmp_path / "b"), "--schema", str(tmp_path / "schema.json")]) == 0
    assert bitlake.open_table(str(tmp_path / "b")).metadata.schema == meta.schema


@pytest.mark.parametrize(("argv", "message"), [
    (["create", "{t}", "--schema", "id:uuid"], "unknown column type 'uuid'"),
    (["create", "{t}", "--schema", "id"], "is not name:type"),
    (["create", "{t}", "--schema", "id:int64", "--primary-key=id"], "needs both --primary-key and --delta-column"),
    (["show", "{t}/missing"], "no such table"),
    (["history", "{t}/missing"], "no such table"),
    (["ingest", "{t}", "nope.csv"], "no such table"),
])
def test_errors_exit_2_without_traceback(tmp_path, capsys, argv, message):
    code, out, err = run(capsys, *[a.format(t=tmp_path / "t") for a in argv])
    assert code == 2
    assert err.count("\n") == 1 and message in err and err.startswith(f"bitlake {argv[0]}: error:")


def test_missing_input_file_fails_before_spark_starts(tmp_path, capsys):
    assert main(["create", str(tmp_path / "t"), "--schema", "id:int64"]) == 0
    code, _, err = run(capsys, "ingest", tmp_path / "t", tmp_path / "nope.csv")
    assert code == 2 and "no such input file" in err and "Spark" not in err


def test_usage_errors_exit_2():
    with pytest.raises(SystemExit) as e:
        main(["create"])
    assert e.value.code == 2


@pytest.mark.spark
def test_demo_runs_end_to_end(spark, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location(
        "demo", pathlib.Path(__file__).parents[1] / "examples" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    table = demo.main(str(tmp_path / "demo-lake"))
    out = capsys.readouterr().out
    assert "3050 rows" in out and "already committed" in out
    assert [h["operation"] for h in table.history()] == ["VACUUM", "TOMBSTONE", "REVERT", "METAGEN", "LAND",
                                                          "INGEST", "INGEST", "CREATE"]
    assert table.describe()["valid_rows"] == 3049  # account 7 is erased


def test_input_that_is_not_what_it_claims_exits_2_without_traceback(tmp_path, capsys):
    assert main(["create", str(tmp_path / "t"), "--schema", "k:int64,v:string,mod:int64", "--primary-key", "k",
                 "--delta-column", "mod"]) == 0
    (tmp_path / "garbage.parquet").write_text("not parquet")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    (tmp_path / "file").write_text("")
    for argv, message in [
        (["ingest", tmp_path / "t", tmp_path / "garbage.parquet"], "ArrowInvalid"),
        (["cdc", tmp_path / "t", tmp_path / "bad.jsonl"], "JSONDecodeError"),
        (["cdc", tmp_path / "t", tmp_path / "nope.jsonl"], "FileNotFoundError"),
        (["create", "weird://x/y", "--schema", "k:int64"], "unsupported storage scheme 'weird'"),
        (["create", tmp_path / "file" / "x", "--schema", "k:int64"], "it is, or is under, a file"),
    ]:
        code, _, err = run(capsys, *argv)
        assert code == 2 and "Traceback" not in err and message in " ".join(err.split()), (argv, err)
    assert bitlake.open_table(str(tmp_path / "t")).version == 0
