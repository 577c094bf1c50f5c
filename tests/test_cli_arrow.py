"""The ``bitlake`` command line without Spark: ingest of CSV and JSON lines, delete and update by SQL, ``show`` and
``changes`` with ``--json``, ``--columns`` and ``--where``, output piped to another program, help texts and messages
in the command line's words. The commands that must not need Spark run in a subprocess where ``import pyspark``
fails, so a command that reached for Spark fails the test."""

from __future__ import annotations

import argparse
import datetime
import decimal
import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest

import bitlake
from bitlake.cli import build_parser, main, parse_schema
from bitlake.cli.output import json_value

# `import pyspark` (and so any Spark session) fails in this interpreter.
NO_SPARK = "import sys; sys.modules['pyspark'] = None; from bitlake.cli import main; sys.exit(main(sys.argv[1:]))"

SCHEMA = "aid:int64,name:string,bal:double,mod:timestamp"
BASE_CSV = """\
aid,name,bal,mod
1,alice,1.5,2024-01-01T00:00:00Z
2,,2.5,2024-01-01T00:00:00Z
3,carol,3.5,2024-01-01T00:00:00Z
"""
# An update, a delete carrying only key and delta, an insert; the column names' case differs from the table's.
CHANGES_JSONL = """\
{"AID": 1, "name": "alice-2", "bal": 10.0, "mod": "2024-02-01T00:00:00Z", "op": "upsert"}
{"AID": 2, "mod": "2024-02-01T00:00:00Z", "op": "delete"}
{"AID": 4, "name": "dave", "bal": 4.0, "mod": "2024-02-01T00:00:00Z", "op": "upsert"}
"""


def cli(*argv, columns: str | None = None, without: str = "pyspark") -> subprocess.CompletedProcess:
    """``bitlake ARGV`` in a subprocess where ``import pyspark`` (or another package) fails, its stdout and stderr
    piped (not a terminal)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    return subprocess.run([sys.executable, "-c", NO_SPARK.replace("'pyspark'", repr(without)), *map(str, argv)],
                          capture_output=True, text=True, timeout=120, env=env)


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def records(text: str) -> list[dict]:
    """The records of BASE_CSV or CHANGES_JSONL, as the table holds them."""
    if text.startswith("{"):
        rows = [{k.lower(): v for k, v in json.loads(line).items()} for line in text.splitlines()]
    else:
        header, *lines = [line.split(",") for line in text.splitlines()]
        rows = [dict(zip(header, values, strict=True)) for values in lines]
    return [{"aid": int(r["aid"]), "name": r.get("name") or None, "bal": None if r.get("bal") is None else float(r["bal"]),
             "mod": datetime.datetime.fromisoformat(r["mod"]), **({"op": r["op"]} if "op" in r else {})} for r in rows]


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """A keyed table: version 1 the records of BASE_CSV, version 2 those of CHANGES_JSONL (made with the library,
    so that each command's test fails on that command alone)."""
    root = tmp_path_factory.mktemp("cli-arrow")
    (root / "base.csv").write_text(BASE_CSV)
    path = root / "accounts"
    table = bitlake.create_table(str(path), parse_schema(SCHEMA), primary_key=["aid"], delta_column="mod")
    table.ingest(pa.Table.from_pylist(records(BASE_CSV)), batch_id="base")
    table.ingest(pa.Table.from_pylist(records(CHANGES_JSONL)), op_column="op", batch_id="changes")
    return path


def test_ingest_of_csv_and_json_lines_runs_without_spark(lake, tmp_path):
    (tmp_path / "base.csv").write_text(BASE_CSV)
    (tmp_path / "changes.jsonl").write_text(CHANGES_JSONL)
    path = tmp_path / "accounts"
    for argv in (["create", path, "--schema", SCHEMA, "--primary-key", "aid", "--delta-column", "mod"],
                 ["ingest", path, tmp_path / "base.csv", "--batch-id", "base"],
                 ["ingest", path, tmp_path / "changes.jsonl", "--op-column", "op", "--batch-id", "changes"]):
        r = cli(*argv)
        assert r.returncode == 0, r.stderr
    table, expected = bitlake.open_table(str(path)), bitlake.open_table(str(lake))
    assert table.version == 2
    assert table.to_arrow(version=1).sort_by("aid").to_pylist() == [
        {"aid": 1, "name": "alice", "bal": 1.5, "mod": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)},
        {"aid": 2, "name": None, "bal": 2.5, "mod": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)},  # "" is null
        {"aid": 3, "name": "carol", "bal": 3.5, "mod": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)},
    ]
    assert table.to_arrow().sort_by("aid") == expected.to_arrow().sort_by("aid")


def test_ingest_reads_csv_and_json_as_spark_would(tmp_path, capsys):
    """Times without a zone offset are UTC, an integer in a double column is a double, a folder's files are read
    but not Spark's markers, and files may order and spell their columns differently."""
    path = tmp_path / "t"
    assert main(["create", str(path), "--schema", SCHEMA, "--primary-key", "aid", "--delta-column", "mod"]) == 0
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.csv").write_text("aid,name,bal,mod\n1,a,1,2024-03-01 00:00:00\n2,b,2.5,2024-03-01\n")
    (folder / "b.csv").write_text("MOD,Bal,name,AID\n2024-03-01T02:00:00+02:00,3,c,3\n")
    (folder / "_SUCCESS").write_text("")
    (tmp_path / "c.jsonl").write_text('{"aid": 4, "name": "d", "bal": 4, "mod": "2024-03-01T00:00:00"}\n'
                                      '{"aid": 5, "mod": "2024-03-01T00:00:00Z", "name": "e", "bal": 5.5}\n')
    code, _, err = run(capsys, "ingest", path, folder, "--input-format", "csv")
    assert code == 0, err
    code, _, err = run(capsys, "ingest", path, tmp_path / "c.jsonl")
    assert code == 0, err
    march = datetime.datetime(2024, 3, 1, tzinfo=datetime.UTC)
    assert bitlake.open_table(str(path)).to_arrow().sort_by("aid").to_pylist() == [
        {"aid": 1, "name": "a", "bal": 1.0, "mod": march}, {"aid": 2, "name": "b", "bal": 2.5, "mod": march},
        {"aid": 3, "name": "c", "bal": 3.0, "mod": march}, {"aid": 4, "name": "d", "bal": 4.0, "mod": march},
        {"aid": 5, "name": "e", "bal": 5.5, "mod": march}]
    (folder / "c.csv").write_text("aid,name,mod\n6,f,2024-03-01\n")
    code, _, err = run(capsys, "ingest", path, folder, "--input-format", "csv")
    assert code == 2 and "c.csv has the columns ['aid', 'name', 'mod']" in err


def test_ingest_of_a_value_that_does_not_parse_is_one_line(lake, tmp_path):
    (tmp_path / "bad.csv").write_text("aid,name,bal,mod\nx,zed,1.0,2024-03-01T00:00:00Z\n")
    r = cli("ingest", lake, tmp_path / "bad.csv")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("bitlake ingest: error:") and "'x'" in r.stderr
    assert bitlake.open_table(str(lake)).version == 2


def test_delete_and_update_run_without_spark(tmp_path):
    (tmp_path / "base.csv").write_text(BASE_CSV)
    path = tmp_path / "t"
    assert cli("create", path, "--schema", SCHEMA, "--primary-key", "aid", "--delta-column", "mod").returncode == 0
    assert cli("ingest", path, tmp_path / "base.csv").returncode == 0
    r = cli("delete", path, "--where", "aid = 3")
    assert r.returncode == 0 and "1 row(s) deleted" in r.stdout, r.stderr
    r = cli("update", path, "--where", "aid = 1", "--set", "bal=bal * 2", "--set", "name='x'")
    assert r.returncode == 0 and "1 row(s) updated" in r.stdout, r.stderr
    rows = bitlake.open_table(str(path)).to_arrow(columns=["aid", "name", "bal"]).sort_by("aid").to_pylist()
    assert rows == [{"aid": 1, "name": "x", "bal": 3.0}, {"aid": 2, "name": None, "bal": 2.5}]


def test_a_command_that_needs_spark_says_how_to_install_it(tmp_path):
    (tmp_path / "base.csv").write_text(BASE_CSV)
    path = tmp_path / "t"
    assert cli("create", path, "--schema", SCHEMA, "--primary-key", "aid", "--delta-column", "mod").returncode == 0
    assert cli("ingest", path, tmp_path / "base.csv", "--no-metagen").returncode == 0  # landing needs no Spark
    r = cli("metagen", path, "--metagen-mode", "spark")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("bitlake metagen: error:") and "pip install 'bitlake[spark]'" in last


def test_a_command_that_needs_another_extra_says_which(lake):
    r = cli("events", "publish", lake, "--url", "http://127.0.0.1:9", "--token", "t", without="httpx")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == "bitlake events: error: this needs httpx, which is not installed: " \
                               "pip install 'bitlake[client]'"


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_show_json_columns_where(lake, capsys):
    code, out, _ = run(capsys, "show", lake, "--json")
    assert code == 0
    assert json_lines(out) == [
        {"aid": 1, "name": "alice-2", "bal": 10.0, "mod": "2024-02-01T00:00:00+00:00"},
        {"aid": 3, "name": "carol", "bal": 3.5, "mod": "2024-01-01T00:00:00+00:00"},
        {"aid": 4, "name": "dave", "bal": 4.0, "mod": "2024-02-01T00:00:00+00:00"},
    ]
    # The projection leaves the key out; the rows are still in key order.
    code, out, _ = run(capsys, "show", lake, "--json", "--columns", "name,bal", "--where", "bal > 3.6")
    assert code == 0 and json_lines(out) == [{"name": "alice-2", "bal": 10.0}, {"name": "dave", "bal": 4.0}]
    code, out, _ = run(capsys, "show", lake, "--json", "--version", "1", "--where", "name is null")
    assert code == 0 and json_lines(out) == [{"aid": 2, "name": None, "bal": 2.5, "mod": "2024-01-01T00:00:00+00:00"}]
    code, out, _ = run(capsys, "show", lake, "--columns", "aid,name", "--where", "aid >= 3", "--limit", "1")
    assert code == 0 and "2 rows, first 1" in out and "carol" in out and "dave" not in out and "bal" not in out


def test_show_refuses_unknown_columns_and_bad_conditions(lake, capsys):
    code, _, err = run(capsys, "show", lake, "--columns", "aid,nope")
    assert code == 2 and "'nope'" in err and err.count("\n") == 1
    code, _, err = run(capsys, "show", lake, "--where", "nope > 1")
    assert code == 2 and "nope" in err and "Traceback" not in err


def test_changes_json_columns_where(lake, capsys):
    code, out, _ = run(capsys, "changes", lake, "--json", "--starting-version", "2", "--ending-version", "2")
    rows = json_lines(out)
    assert code == 0 and [(r["aid"], r["_change_type"]) for r in rows] == [
        (1, "update_preimage"), (1, "update_postimage"), (2, "delete"), (4, "insert")]
    assert {r["_commit_version"] for r in rows} == {2}
    assert datetime.datetime.fromisoformat(rows[0]["_commit_timestamp"]).tzinfo is not None  # ISO text
    code, out, _ = run(capsys, "changes", lake, "--json", "--columns", "aid,_change_type,_commit_version",
                       "--where", "_change_type = 'insert' and bal > 2")
    assert code == 0 and json_lines(out) == [
        {"aid": 2, "_change_type": "insert", "_commit_version": 1},
        {"aid": 3, "_change_type": "insert", "_commit_version": 1},
        {"aid": 4, "_change_type": "insert", "_commit_version": 2}]
    # Both ends are included and default to the first and the latest version.
    code, out, _ = run(capsys, "changes", lake, "--json", "--ending-version", "1", "--columns", "aid")
    assert code == 0 and json_lines(out) == [{"aid": 1}, {"aid": 2}, {"aid": 3}]
    code, _, err = run(capsys, "changes", lake, "--columns", "aid,nope")
    assert code == 2 and "--columns" in err and "'nope'" in err


def test_changes_by_timestamp(lake, capsys):
    history = {h["version"]: h["timestamp"] for h in bitlake.open_table(str(lake)).history()}
    code, out, _ = run(capsys, "changes", lake, "--json", "--columns", "_commit_version",
                       "--starting-timestamp", history[2], "--ending-timestamp", history[2])
    assert code == 0 and {r["_commit_version"] for r in json_lines(out)} == {2}


def test_piped_output_is_plain_and_full_width(lake):
    """Off a terminal a table is neither cut nor folded at 80 columns (nor at $COLUMNS): a header line and one
    line per row, every value whole."""
    for columns in (None, "40"):
        r = cli("changes", lake, "--starting-version", "2", columns=columns)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].endswith("changes from version 2 to the latest: 4 rows, first 4")
        assert lines[1].split() == ["aid", "name", "bal", "mod", "_change_type", "_commit_version",
                                    "_commit_timestamp"]
        assert len(lines) == 6 and max(map(len, lines)) > 80
        assert lines[2].split()[:6] == ["1", "alice", "1.5", "2024-01-01", "00:00:00+00:00", "update_preimage"]
        assert not any(c in r.stdout for c in "│┃━─")  # no box drawing
    r = cli("history", lake, columns="40")
    assert r.returncode == 0 and r.stdout.splitlines()[1].split()[:4] == ["version", "time", "(UTC)", "operation"]


def test_piped_compact_and_maintain_log_no_empty_lines(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), parse_schema(SCHEMA), primary_key=["aid"], delta_column="mod")
    t.ingest(pa.Table.from_pylist(records(BASE_CSV)))
    for command in ("compact", "maintain"):
        r = cli(command, t.path)
        assert r.returncode == 0 and "\n\n" not in "\n" + r.stderr and "\n\n" not in r.stdout, (command, r.stderr)


def test_major_compaction_says_its_window_in_times(tmp_path, capsys):
    t = bitlake.create_table(str(tmp_path / "t"), parse_schema(SCHEMA), primary_key=["aid"], delta_column="mod")
    t.ingest(pa.Table.from_pylist(records(BASE_CSV)))
    t.ingest(pa.Table.from_pylist(records(CHANGES_JSONL)), op_column="op")
    code, out, _ = run(capsys, "compact", t.path, "--major", "--look-back", "2")
    assert code == 0 and out.splitlines()[-1].endswith(", event times from 2024-02-01T00:00:00+00:00"), out
    u = bitlake.create_table(str(tmp_path / "u"), pa.schema([("a", pa.int64())]))
    for _ in range(2):
        u.ingest(pa.table({"a": [1]}))
    code, out, _ = run(capsys, "compact", u.path, "--major", "--look-back", "1")
    assert code == 0 and out.splitlines()[-1] == "retention window: versions from 1"  # no event time: no key


def test_compact_cluster_by_rewrites_into_ranges_and_names_a_bad_column(tmp_path, capsys):
    t = bitlake.create_table(str(tmp_path / "t"), pa.schema([("a", pa.int64()), ("b", pa.int64())]))
    for i in range(3):
        t.ingest(pa.table({"a": list(range(i, 3000, 3)), "b": [1] * 1000}))
    code, out, _ = run(capsys, "compact", t.path, "--cluster-by", "a", "--target-file-bytes", "4000")
    assert code == 0 and out.startswith("version 4: 3 file(s)"), out
    spans = sorted((f.stats["min"]["a"], f.stats["max"]["a"]) for f in bitlake.open_table(t.path).state().data_files())
    assert len(spans) > 1 and all(x[1] < y[0] for x, y in zip(spans, spans[1:], strict=False))
    code, _, err = run(capsys, "compact", t.path, "--cluster-by", "c")
    assert code == 2 and "--cluster-by: 'c' is not a column of the table" in err


def test_a_reused_batch_id_points_to_the_commands(lake, tmp_path, capsys):
    (tmp_path / "other.csv").write_text("aid,name,bal,mod\n1,zed,1.0,2024-01-01T00:00:00Z\n")
    code, _, err = run(capsys, "ingest", lake, tmp_path / "other.csv", "--batch-id", "base")
    line = err.splitlines()[-1]
    assert code == 2 and line.startswith("bitlake ingest: error: batch 'base' was committed"), err
    assert f"`bitlake replace {lake} 'base' INPUT...`" in line and f"`bitlake revert {lake} 'base'`" in line
    assert "replace_batch" not in line and "revert_batch" not in line


def test_compact_look_back_needs_major(lake, capsys):
    code, _, err = run(capsys, "compact", lake, "--look-back", "7d")
    assert code == 2 and err.strip() == "bitlake compact: error: --look-back needs --major: it sets the retention " \
                                        "window of a major compaction"
    assert bitlake.open_table(str(lake)).version == 2


@pytest.mark.parametrize(("argv", "message"), [
    (["compact", "{k}", "--major", "--look-back", "last week"], "argument --look-back: 'last week': give a version"),
    (["cleanup", "{k}", "--min-age-seconds", "-1"], "argument --min-age-seconds: '-1': give a number of seconds"),
])
def test_option_values_are_checked_before_the_table_is_touched(lake, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main([a.format(k=lake) for a in argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["show", "{t}", "--valid-at", "2024-01-01T00:00:00Z"], "--valid-at needs a keyed table"),
    (["show", "{k}", "--valid-at", "soon"], "--valid-at: 'soon' is not an ISO-8601 time"),
    (["update", "{k}", "--where", "aid = 1", "--set", "aid=5"], "update: error: cannot set the primary key"),
    (["changes", "{k}", "--starting-version", "2", "--ending-version", "1"],
     "--starting-version 2 is after --ending-version 1"),
    (["changes", "{k}", "--starting-version", "7"], "--starting-version 7 does not exist"),
    (["ingest", "{k}", "{k}/../base.csv", "--op-column", "kind"], "--op-column 'kind' is not a column"),
])
def test_errors_name_the_options_not_the_arguments(lake, tmp_path, capsys, argv, message):
    assert main(["create", str(tmp_path / "t"), "--schema", "id:int64"]) == 0
    capsys.readouterr()
    code, _, err = run(capsys, *[a.format(t=tmp_path / "t", k=lake) for a in argv])
    errors = [line for line in err.splitlines() if line.startswith("bitlake ")]  # the others log steps
    assert code == 2 and len(errors) == 1 and message in errors[0], err
    assert "_version" not in errors[0] and "_column" not in errors[0] and "valid_at" not in errors[0]


def subcommands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[prefix + name] = sub
                found.update(subcommands(sub, f"{prefix}{name} "))
    return found


def test_help_names_the_uris_a_path_takes_and_every_default():
    commands = subcommands(build_parser())
    with_path = [name for name, p in commands.items() if any(a.dest == "path" for a in p._actions)]
    assert {"create", "ingest", "show", "changes", "delete", "update", "compact", "events publish"} <= set(with_path)
    for name in with_path:
        text = commands[name].format_help()
        assert "s3://" in " ".join(text.split()) and "memory://" in text, name
    for name, p in commands.items():
        for a in p._actions:
            if a.option_strings and a.default not in (None, False, "", argparse.SUPPRESS) and a.dest != "help":
                entry = p._get_formatter()._expand_help(a) if a.help else ""
                assert "default" in entry, (name, a.option_strings, entry)
    assert "(default: parquet)" in " ".join(commands["create"].format_help().split())


def test_json_values_are_json_typed():
    row = {"i": 1, "f": 1.5, "nan": float("nan"), "inf": float("-inf"), "d": decimal.Decimal("12345678901234567.89"),
           "t": datetime.datetime(2024, 1, 2, 3, 4, 5, 600, tzinfo=datetime.UTC), "day": datetime.date(2024, 1, 2),
           "dur": datetime.timedelta(seconds=90, microseconds=5), "b": b"\x00\xff", "s": "ü\n", "n": None,
           "l": [1, None], "st": {"x": True}}
    text = json_value(row)
    assert "\n" not in text
    assert json.loads(text, parse_float=decimal.Decimal) == {
        "i": 1, "f": decimal.Decimal("1.5"), "nan": "NaN", "inf": "-Infinity", "d": decimal.Decimal("12345678901234567.89"),
        "t": "2024-01-02T03:04:05.000600+00:00", "day": "2024-01-02", "dur": "PT90.000005S", "b": "AP8=", "s": "ü\n",
        "n": None, "l": [1, None], "st": {"x": True}}
    table = pa.table({"m": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64()))})
    assert json.loads(json_value(table.to_pylist()[0])) == {"m": [["k", 1]]}


def test_a_spark_struct_type_schema_file_needs_no_spark(tmp_path):
    struct = {"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": False, "metadata": {}},
        {"name": "amount", "type": "decimal(10,2)", "nullable": True, "metadata": {}},
        {"name": "ts", "type": "timestamp", "nullable": True, "metadata": {}}]}
    (tmp_path / "schema.json").write_text(json.dumps(struct))
    r = cli("create", tmp_path / "t", "--schema", tmp_path / "schema.json")
    assert r.returncode == 0, r.stderr
    assert bitlake.open_table(str(tmp_path / "t")).metadata.schema == pa.schema([
        pa.field("id", pa.int64(), False), ("amount", pa.decimal128(10, 2)), ("ts", pa.timestamp("us", tz="UTC"))])


def test_a_piped_table_keeps_a_line_per_row():
    import io

    from rich.console import Console

    from bitlake.cli.output import print_grid, render_rows

    file = io.StringIO()
    print_grid(Console(file=file, width=20), render_rows(["k", "note"], [(1, "two\nlines\tand a tab"), (2, None)],
                                                         title="t"))
    assert file.getvalue().splitlines() == ["t", "k  note", "1  two\\nlines\\tand a tab", "2  ∅"]


def test_mirror_from_a_database_it_cannot_reach_is_one_line(tmp_path):
    r = cli("mirror", "postgresql://nobody@127.0.0.1:9/db", tmp_path / "m", "--table", "public.x")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("bitlake mirror: error: the database: OperationalError:")
