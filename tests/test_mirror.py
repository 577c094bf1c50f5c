"""The PostgreSQL mirror against a real server (wal_level=logical, wal2json) and pgbench: SIGKILLed at random
points while pgbench runs and restarted, it ends with the table equal to the database row for row, its
event-time view at a quiet LSN equals a copy taken at that LSN, and schema changes, TRUNCATE and tables
without a primary key are handled as docs/cdc.md says."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pytest

import bitlake
from bitlake.mirror import PostgresMirror, SchemaChangedError, lsn_int
from bitlake.triggers.pgserver import PostgresServer

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture(scope="module")
def server():
    s = PostgresServer({"wal_level": "logical", "max_replication_slots": "10", "max_wal_senders": "10",
                        "fsync": "off"}).start()
    yield s
    s.stop()


def _pgbench(server, *args, check=True):
    return subprocess.run([str(server.bin / "pgbench"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "bitlake",
                           *args, "postgres"], check=check, capture_output=True, timeout=300)


def _accounts(server) -> list[tuple]:
    with server.connect() as c:
        return sorted(c.execute("SELECT aid, bid, abalance, filler FROM pgbench_accounts").fetchall())


def _rows(table, **view) -> list[tuple]:
    return sorted((r["aid"], r["bid"], r["abalance"], r["filler"]) for r in table.to_arrow(**view).to_pylist())


def _mirror_process(server, path: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bitlake.cli", "mirror", server.dsn(), path,
                             "--table", "public.pgbench_accounts", "--interval", "0.1", "--batch-changes", "2000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_a_mirror_killed_at_random_points_under_pgbench_equals_the_database(server, tmp_path):
    _pgbench(server, "-i", "-s", "1", "-q")
    path = str(tmp_path / "accounts")
    rng = random.Random(11)
    load = subprocess.Popen([str(server.bin / "pgbench"), "-h", "127.0.0.1", "-p", str(server.port), "-U", "bitlake",
                             "-c", "4", "-T", "14", "postgres"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kills = 0
    try:
        while load.poll() is None:
            mirror = _mirror_process(server, path)
            time.sleep(rng.uniform(0.3, 2.5))  # the first may die in its snapshot, the others mid-step
            mirror.send_signal(signal.SIGKILL)
            mirror.wait(timeout=60)
            kills += 1
    finally:
        load.wait(timeout=120)
    assert kills >= 4
    # Quiet now: catch up, then compare row for row.
    final = subprocess.run([sys.executable, "-m", "bitlake.cli", "mirror", server.dsn(), path, "--table",
                            "public.pgbench_accounts", "--until-caught-up", "--interval", "0.1"],
                           capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-3000:]
    t = bitlake.open_table(path)
    quiet = _accounts(server)
    assert _rows(t) == quiet
    history = t.history()
    ids = [h["batch_id"] for h in history if h["batch_id"]]
    assert len(ids) == len(set(ids)), "no batch applied twice"
    with server.connect() as c:
        quiet_lsn = lsn_int(c.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
    # More load, caught up again: the view at the quiet LSN is the copy taken then.
    _pgbench(server, "-c", "2", "-T", "2")
    m = PostgresMirror(server.dsn(), "public.pgbench_accounts", path)
    try:
        m.run(until_caught_up=True, interval=0.1)
    finally:
        m.close()
    assert _rows(t) == _accounts(server) != quiet
    assert _rows(t, valid_at=quiet_lsn) == quiet


def test_schema_changes_truncate_and_tables_without_a_key(server, tmp_path):
    with server.connect() as c:
        c.execute("CREATE TABLE shop (id int PRIMARY KEY, name text, price numeric(8,2), seen timestamptz, "
                  "ok boolean, raw bytea)")
        c.execute("INSERT INTO shop VALUES (1, 'a', 1.50, '2024-01-01 00:00:00+00', true, '\\x01'), "
                  "(2, 'b', NULL, NULL, NULL, NULL)")
    m = PostgresMirror(server.dsn(), "public.shop", str(tmp_path / "shop"), slot="shop_slot")
    try:
        m.run(until_caught_up=True, interval=0.1)
        assert sorted(r["id"] for r in m.table.to_arrow().to_pylist()) == [1, 2]
        with server.connect() as c:
            c.execute("ALTER TABLE shop ADD COLUMN note text")  # nullable: the table follows
            c.execute("INSERT INTO shop VALUES (3, 'c', 2.25, now(), false, '\\xff', 'new')")
            c.execute("TRUNCATE shop")
            c.execute("INSERT INTO shop VALUES (4, 'd', 3.00, now(), true, NULL, 'after')")
        m.run(until_caught_up=True, interval=0.1)
        rows = m.table.to_arrow().to_pylist()
        assert [(r["id"], r["note"]) for r in rows] == [(4, "after")]
        assert "note" in m.table.metadata.column_names
        version = m.table.version
        with server.connect() as c:
            c.execute("ALTER TABLE shop ALTER COLUMN price TYPE numeric(12,4)")
            c.execute("INSERT INTO shop VALUES (5, 'e', 1.2345, now(), true, NULL, NULL)")
        with pytest.raises(SchemaChangedError, match="price"):
            m.run(until_caught_up=True, interval=0.1)
        assert m.table.version == version, "nothing of the step was written"
    finally:
        m.close()
    with server.connect() as c:
        c.execute("CREATE TABLE log (at timestamptz, msg text)")
    with pytest.raises(bitlake.InvalidInputError, match="no primary key"):
        PostgresMirror(server.dsn(), "public.log", str(tmp_path / "log"))
    with pytest.raises(bitlake.InvalidInputError, match="REPLICA IDENTITY FULL"):
        PostgresMirror(server.dsn(), "public.log", str(tmp_path / "log"), key=["at", "msg"])
    with server.connect() as c:
        c.execute("ALTER TABLE log REPLICA IDENTITY FULL")
        c.execute("INSERT INTO log VALUES ('2024-01-01 00:00:00+00', 'x'), ('2024-01-02 00:00:00+00', 'y')")
    m = PostgresMirror(server.dsn(), "public.log", str(tmp_path / "log"), key=["at", "msg"])
    try:
        m.run(until_caught_up=True, interval=0.1)
        with server.connect() as c:
            c.execute("DELETE FROM log WHERE msg = 'x'")
        m.run(until_caught_up=True, interval=0.1)
        assert [r["msg"] for r in m.table.to_arrow().to_pylist()] == ["y"]
    finally:
        m.close()
    assert os.path.isdir(tmp_path / "log")


def test_a_mirror_creates_its_table_in_a_folder_a_killed_creation_left_without_a_commit(server, tmp_path):
    """Killed between making the table's folder and writing its commit 0, a mirror left a folder that is no table
    yet (the random kills above once hit it): the next mirror creates the table there."""
    from bitlake.format import layout

    with server.connect() as c:
        c.execute("CREATE TABLE crashed (id int PRIMARY KEY, v text)")
        c.execute("INSERT INTO crashed VALUES (1, 'a'), (2, 'b')")
    path = tmp_path / "crashed"
    commits = path / layout.COMMITS_DIR
    commits.mkdir(parents=True)
    (commits / ".tmp-0123").write_bytes(b"{")  # a commit 0 cut short before its link
    with pytest.raises(bitlake.NotATableError):
        bitlake.open_table(str(path))
    m = PostgresMirror(server.dsn(), "public.crashed", str(path), slot="crashed_slot")
    try:
        m.run(until_caught_up=True, interval=0.1)
        assert sorted((r["id"], r["v"]) for r in m.table.to_arrow().to_pylist()) == [(1, "a"), (2, "b")]
    finally:
        m.close()


def test_values_of_every_mapped_type_survive_snapshot_and_changes(server, tmp_path):
    with server.connect() as c:
        c.execute("CREATE TABLE kinds (id bigint PRIMARY KEY, b boolean, d date, ts timestamptz, n numeric(10,3), "
                  "f double precision, r real, raw bytea, j jsonb, s smallint)")
        c.execute("INSERT INTO kinds VALUES (1, true, '2024-01-02', '2024-01-02 03:04:05.123456+00', 12.345, 1.5, "
                  "2.5, '\\x0a0b', '{\"a\": 1}', 7), (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)")
    m = PostgresMirror(server.dsn(), "public.kinds", str(tmp_path / "kinds"))
    try:
        m.run(until_caught_up=True, interval=0.1)
        snap = {r["id"]: r for r in m.table.to_arrow().to_pylist()}
        with server.connect() as c:
            c.execute("INSERT INTO kinds SELECT id + 10, b, d, ts, n, f, r, raw, j, s FROM kinds")
        m.run(until_caught_up=True, interval=0.1)
        rows = {r["id"]: r for r in m.table.to_arrow().to_pylist()}
    finally:
        m.close()
    for k in (1, 2):
        via_wal = {c: v for c, v in rows[k + 10].items() if c not in ("id", "_lsn")}
        via_snapshot = {c: v for c, v in snap[k].items() if c not in ("id", "_lsn")}
        assert via_wal == via_snapshot, k
    assert snap[1]["raw"] == b"\x0a\x0b" and str(snap[1]["n"]) == "12.345" and snap[1]["b"] is True
    assert m.table.metadata.schema.field("n").type == pa.decimal128(10, 3)


def test_key_updates_messages_toast_and_exact_text(server, tmp_path):
    """An update that changes the key deletes the old key; a logical decoding message in the slot is skipped;
    an update leaving a TOASTed value unchanged (wal2json leaves it out) keeps it; an unconstrained numeric
    keeps its digits as PostgreSQL writes them; a timestamp with a precision maps like one without. (wal2json 2.5 prints a double's NaN and
    infinities as JSON null: through changes they arrive as null, docs/cdc.md.)"""
    big = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(40_000))  # not compressible: stored out of line
    with server.connect() as c:
        c.execute("CREATE TABLE notes (id int PRIMARY KEY, v text, doc text, n numeric, f double precision, "
                  "at timestamp(3) with time zone)")
        c.execute("INSERT INTO notes VALUES (1, 'a', %s, 0.0000001, 'NaN', '2024-01-01 00:00:00.123+00')", (big,))
    m = PostgresMirror(server.dsn(), "public.notes", str(tmp_path / "notes"), slot="notes_slot")
    try:
        m.run(until_caught_up=True, interval=0.1)
        snap = {r["id"]: r for r in m.table.to_arrow().to_pylist()}
        with server.connect() as c:
            c.execute("UPDATE notes SET v = 'b' WHERE id = 1")  # doc unchanged: left out of the change
            c.execute("UPDATE notes SET v = 'b2' WHERE id = 1")  # again, in the same step
            c.execute("SELECT pg_logical_emit_message(true, 'app', 'hello')")
            c.execute("INSERT INTO notes VALUES (2, 'c', 'small', 0.00000010, 'Infinity', NULL), "
                      "(3, 'd', NULL, -0.000000123, '-Infinity', NULL)")
            c.execute("UPDATE notes SET id = 4 WHERE id = 2")
        m.run(until_caught_up=True, interval=0.1)
        rows = {r["id"]: r for r in m.table.to_arrow().to_pylist()}
    finally:
        m.close()
    assert sorted(rows) == [1, 3, 4]
    assert rows[1]["v"] == "b2" and rows[1]["doc"] == big and rows[1]["n"] == snap[1]["n"] == "0.0000001"
    assert rows[4]["doc"] == "small" and rows[4]["n"] == "0.00000010" and rows[3]["n"] == "-0.000000123"
    assert snap[1]["f"] != snap[1]["f"]  # NaN through the snapshot
    assert m.table.metadata.schema.field("at").type == pa.timestamp("us", tz="UTC")
