"""The PostgreSQL mirror through a cut connection (``pg_terminate_backend``), a PostgreSQL crash and a restart,
while writers change the table: it reconnects, resumes from its slot, and ends with the lake table equal to the
database's, no batch applied twice. The harness is benchmarks/soak.py; it starts its own PostgreSQL, so the
restarts touch no other test's server."""

from __future__ import annotations

import psycopg
import pytest

from benchmarks.soak import MIRROR_FAULTS, soak_mirror
from bitlake.mirror import PostgresMirror
from bitlake.triggers.pgserver import PostgresServer

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_the_mirror_resumes_from_its_slot_through_cut_connections_and_restarts():
    result = soak_mirror(writers=2, seconds=16, fault_every=3.5)
    assert result["problems"] == []
    assert [f["kind"] for f in result["faults"]][:3] == list(MIRROR_FAULTS)
    assert result["changes_applied"] > 1000 and all(f["recovery_s"] is not None for f in result["faults"])


def test_the_mirror_gives_up_once_the_source_stays_away_longer_than_its_reconnect_time(tmp_path):
    server = PostgresServer({"wal_level": "logical", "max_replication_slots": "2", "fsync": "off"}).start()
    try:
        with server.connect() as c:
            c.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
            c.execute("INSERT INTO t VALUES (1, 'a')")
        m = PostgresMirror(server.dsn(), "public.t", str(tmp_path / "t"), reconnect_seconds=1.5)
        m.run(until_caught_up=True, interval=0.1)
        server.down()
        with pytest.raises(psycopg.OperationalError):
            m.run(until_caught_up=True, interval=0.1)
        server.up()
        with server.connect() as c:
            c.execute("INSERT INTO t VALUES (2, 'b')")
        m.run(until_caught_up=True, interval=0.1)
        assert sorted(r["id"] for r in m.table.to_arrow().to_pylist()) == [1, 2]
        m.close()
    finally:
        server.stop()
