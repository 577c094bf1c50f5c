"""``bitlake serve`` and ``bitlake events publish|watch|list|token``, run in-process through ``main([...])``
(``serve`` in a subprocess on a loopback port)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pyarrow as pa
import pytest

import bitlake
from bitlake.cli import main, watch_state_path
from bitlake.triggers import TriggerStore, decode_events
from bitlake.triggers.__main__ import main as admin
from tests.triggers.formats import land_hive


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_token_create_list_revoke(tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/t.db"
    code, out, _ = run(capsys, "events", "token", "create", "--role", "producer", "--table", "db.*", "--db-url", db)
    assert code == 0 and out.startswith("blt_")
    code, out, _ = run(capsys, "events", "token", "list", "--db-url", db)
    assert code == 0 and out.split("\t")[:4] == ["1", "producer", "active", "db.*"]
    assert run(capsys, "events", "token", "revoke", "1", "--db-url", db)[0] == 0
    code, _, err = run(capsys, "events", "token", "revoke", "1", "--db-url", db)
    assert code == 1 and "no active token 1" in err


def test_watch_hive_once_then_list(tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/t.db"
    root = tmp_path / "sales"
    land_hive(root, "ds=2024-01-01", [(1, "a")])
    state = tmp_path / "state.json"
    watch = ["events", "watch", "hive", root, "--db-url", db, "--table", "db.sales", "--state", state, "--once"]
    code, out, _ = run(capsys, *watch)
    assert code == 0 and 'registered event 1: db.sales snapshot' in out and '["2024-01-01"] APPEND' in out
    assert run(capsys, *watch)[1] == "no new changes\n"
    land_hive(root, "ds=2024-01-02", [(2, "b")])
    assert "registered event 2" in run(capsys, *watch)[1]

    code, out, _ = run(capsys, "events", "list", "--db-url", db, "--table", "db.sales", "--json")
    assert code == 0
    assert [e.partition for e in decode_events(out)] == [["2024-01-01"], ["2024-01-02"]]
    code, out, _ = run(capsys, "events", "list", "--db-url", db, "--table", "db.sales", "--limit", "1")
    assert code == 0 and "events of db.sales (first 1)" in out and "more events follow: --min-event-id 2" in out


def test_watch_loop_registers_landings_as_they_come(tmp_path):
    db = f"sqlite:///{tmp_path}/t.db"
    root = tmp_path / "sales"
    root.mkdir()
    watcher = subprocess.Popen([sys.executable, "-m", "bitlake.cli", "events", "watch", "hive", str(root),
                                "--db-url", db, "--state", str(tmp_path / "s.json"), "--interval", "0.2"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with TriggerStore(db) as store:
            for day in ("2024-01-01", "2024-01-02"):
                land_hive(root, f"ds={day}", [(1, "a")])
                deadline = time.monotonic() + 60
                while [day] not in [e.partition for e in store.events(f"file://{root}").events]:
                    assert watcher.poll() is None, watcher.stdout.read().decode()
                    assert time.monotonic() < deadline, "the watcher did not register the landing"
                    time.sleep(0.1)
            assert len(store.events(f"file://{root}").events) == 2
    finally:
        watcher.terminate()
        watcher.wait(10)


def test_events_errors_are_one_line_with_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("BITLAKE_TRIGGERS_URL", raising=False)
    monkeypatch.delenv("BITLAKE_TRIGGERS_TOKEN", raising=False)
    monkeypatch.setenv("BITLAKE_TRIGGERS_RETRY_SECONDS", "0")  # the unreachable service: no minute of retries
    (tmp_path / "t").mkdir()
    cases = [
        (["events", "watch", "hive", tmp_path / "t", "--once"], "--url and a producer --token"),
        (["events", "watch", "delta", tmp_path / "missing", "--db-url", "sqlite://", "--once"], "no such delta table"),
        (["events", "watch", "delta", tmp_path / "t", "--db-url", "sqlite://", "--state", tmp_path / "s.json",
          "--once"], "no Delta table at"),
        (["events", "list", "--table", "x", "--url", "http://127.0.0.1:9", "--token", "t"],
         "cannot reach the trigger service"),
        (["events", "list", "--table", "x", "--db-url", "sqlite://", "--since", "yesterday"], "--since/--until"),
        (["events", "publish", tmp_path / "missing", "--db-url", "sqlite://"], "no such table"),
        # a database URL that does not parse, a PostgreSQL server that is not there
        (["events", "list", "--table", "x", "--db-url", "notaurl"], "bad database URL (--db-url)"),
        (["events", "token", "list", "--db-url", "notaurl"], "bad database URL (--db-url)"),
        (["events", "list", "--table", "x", "--db-url", f"postgresql+psycopg://bitlake@127.0.0.1:{_free_port()}/none"],
         "the trigger store's database failed: connection failed"),
    ]
    for argv, message in cases:
        code, out, err = run(capsys, *argv)
        assert code == 2, (argv, out, err)
        assert message in err and err.count("\n") == 1 and err.startswith("bitlake events: error:"), err


def test_the_token_command_reports_a_bad_database_in_one_line(capsys):
    assert admin(["--db-url", "notaurl", "token", "list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: bad database URL (--db-url): ") and err.count("\n") == 1, err


def test_watch_refuses_a_negative_interval_up_front(tmp_path, capsys):
    (tmp_path / "t").mkdir()
    for interval in ("-1", "nan", "soon"):
        with pytest.raises(SystemExit) as exit_:
            main(["events", "watch", "hive", str(tmp_path / "t"), "--db-url", "sqlite://", "--interval", interval])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"argument --interval: {interval!r}" in err and "Traceback" not in err, err


def test_publish_skip_expired_goes_on_from_the_oldest_commit_left(tmp_path, capsys):
    schema = pa.schema([("id", pa.int64()), ("ts", pa.int64())])
    table = bitlake.create_table(str(tmp_path / "t"), schema, name="db.exp", primary_key=["id"], delta_column="ts")
    for i in range(3):
        table.ingest(pa.table({"id": [1], "ts": [i]}, schema=schema))
    table.compact(major=True, look_back=table.version)
    table.cleanup(min_age_seconds=0)
    db = f"sqlite:///{tmp_path}/t.db"
    code, _, err = run(capsys, "events", "publish", table.path, "--db-url", db)
    assert code == 2 and "bitlake events publish --skip-expired" in err, err
    code, out, err = run(capsys, "events", "publish", table.path, "--db-url", db, "--skip-expired")
    assert code == 0 and out.startswith("published 0 event(s)"), err
    table.ingest(pa.table({"id": [2], "ts": [0]}, schema=schema))
    code, out, err = run(capsys, "events", "publish", table.path, "--db-url", db)  # the cursor moved on
    assert code == 0 and out.startswith("published 1 event(s), 1 new"), err


def test_what_a_table_commits_the_service_registers(tmp_path, capsys):
    """A commit the service refused would stop publishing for good (the publisher retries it first): the
    table's name is checked when it is created, and partitions of many columns and long values register."""
    cols = [f"c{i}" for i in range(10)]  # more partition columns than the service once took (8)
    schema = pa.schema([("x", pa.int64())] + [(c, pa.string()) for c in cols])
    table = bitlake.create_table(str(tmp_path / "wide"), schema, name="db.wide", partition_by=cols)
    table.ingest(pa.table({"x": [1], **{c: ["v" * 120] for c in cols}}, schema=schema))  # 1,231 bytes of JSON
    table.ingest(pa.table({"x": [2], **{c: ["small"] for c in cols}}, schema=schema))
    db = f"sqlite:///{tmp_path}/t.db"
    code, out, err = run(capsys, "events", "publish", table.path, "--db-url", db)
    assert code == 0 and out.startswith("published 2 event(s), 2 new"), err
    with TriggerStore(db) as store:
        assert [e.partition for e in store.events("db.wide").events] == [["v" * 120] * 10, ["small"] * 10]

    one = pa.schema([("x", pa.int64())])
    for name in ("db\tweird", "db.\x85", "x" * 513, "é" * 257, "a\ud800"):
        with pytest.raises(bitlake.InvalidInputError, match="at most 512 bytes of UTF-8 without control"):
            bitlake.create_table(str(tmp_path / "named"), one, name=name)
    with pytest.raises(bitlake.InvalidInputError, match="give another with name="):  # the folder's name
        bitlake.create_table(str(tmp_path / "a\x01b"), one)
    assert bitlake.create_table(str(tmp_path / "a\x01b"), one, name="é" * 256).name == "é" * 256

    # A partition beyond the service's limit is still written; publishing says which commit and why.
    long = bitlake.create_table(str(tmp_path / "long"), schema, name="db.long", partition_by=cols)
    long.ingest(pa.table({"x": [1], **{c: ["v" * 200] for c in cols}}, schema=schema))
    code, _, err = run(capsys, "events", "publish", long.path, "--db-url", db)
    assert code == 2 and "the event of version 1 of " in err and "longer than 1536 bytes" in err, err


def test_watch_keeps_its_state_per_table_and_target_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    a = watch_state_path("hive", "/data/a", None, "http://h:1")
    assert a.startswith(f"{tmp_path}/bitlake/watch/hive-") and a.endswith(".json")
    assert a != watch_state_path("hive", "/data/a", None, "http://h:2")
    assert a != watch_state_path("hive", "/data/b", None, "http://h:1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.spark
def test_serve_and_publish_a_bitlake_table_over_http(spark, tmp_path, capsys):
    db = f"sqlite:///{tmp_path}/service.db"
    code, token, _ = run(capsys, "events", "token", "create", "--role", "admin", "--db-url", db)
    token = token.strip()
    table = bitlake.create_table(str(tmp_path / "t"), pa.schema([("id", pa.int64())]))
    table.ingest(pa.table({"id": pa.array([1, 2], pa.int64())}), batch_id="b1", spark=spark)

    port = _free_port()
    env = {**os.environ, "BITLAKE_TRIGGERS_CONFIG": ""}
    server = subprocess.Popen([sys.executable, "-m", "bitlake.cli", "serve", "--port", str(port), "--db-url", db,
                               "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).json()["status"] == "ok":
                    break
            except httpx.TransportError:
                pass
            assert server.poll() is None, server.stdout.read().decode()
            assert time.monotonic() < deadline, "bitlake serve did not start"
            time.sleep(0.2)
        code, out, err = run(capsys, "events", "publish", table.path, "--url", url, "--token", token)
        assert code == 0, err
        assert out == f"published 1 event(s), 1 new, 0 already registered of versions 1..1 of {table.name} (version 1)\n"
        out = run(capsys, "events", "publish", table.path, "--url", url, "--token", token)[1]
        assert out == f"published 0 event(s), 0 new, 0 already registered of {table.name} (version 1)\n"
        code, out, _ = run(capsys, "events", "list", "--url", url, "--token", token, "--table", table.name, "--json")
        assert code == 0
        assert [(e.snapshot_id, e.tags) for e in decode_events(out)] == [("1", {"batch_ids": "b1", "location": table.io.uri()})]
        code, _, err = run(capsys, "events", "list", "--url", url, "--token", "blt_wrong", "--table", table.name)
        assert code == 2 and "401" in err
    finally:
        server.terminate()
        server.wait(10)
    [cursor] = table.io.listdir("_bitlake/published")
    assert json.loads(table.io.read_bytes(f"_bitlake/published/{cursor}")) == {"target": url, "version": 1}
