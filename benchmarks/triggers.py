"""The trigger service benchmark: event registration and trigger evaluation over HTTP against pgbench.

Everything runs against one real PostgreSQL server that the script starts (Debian's package, as
``scripts/setup-postgres.sh`` installs it; default durability: ``fsync`` and ``synchronous_commit`` on)
in a database of its own, migrated by the store's Alembic migrations, and the service runs as
``uvicorn --factory bitlake.triggers:create_app`` in subprocesses (one worker each), on loopback. Every
measurement runs in ``--rounds`` (3) rounds that interleave the ways being compared, so that each sees the
same share of whatever else the machine is doing; the load average and the service's CPU time per request
are recorded beside each figure. The run:

1. **Registration.** ``--clients`` (4) processes register events for ``--duration`` seconds each way:
   through HTTP (``POST /events`` with a producer token, JSON bodies built in the client and sent on a
   keep-alive connection with plain socket calls: a load generator as light as pgbench's C client)
   to one service process and to ``--instances`` of them (the clients spread over them),
   with the store called directly in each process (``register_json``, no HTTP: what the service costs on
   top of it), and as
   pgbench clients running the equivalent plain ``INSERT`` into a copy of the events table (same columns,
   indexes and constraints): batched (``--batch``, 100 events per request / 100-row ``INSERT``) and one
   by one. Every event is new (a random table of ``--tables``, a new snapshot id). Events per second
   (medians of the rounds), and service / pgbench.
2. **Trigger evaluation.** For each size of ``--events`` (1 and 10 million) the events table is loaded
   directly in PostgreSQL (``INSERT ... SELECT generate_series``, indexes dropped and rebuilt, then
   ``VACUUM ANALYZE``): ``--tables`` (10,000) tables, events spread round-robin over them in event-id
   order, 100 events (``--hits``) per daily partition, one flow per table whose cursor leaves the last
   100 events of the table pending. Then one client evaluates, one request after the other, a partition
   trigger (``{{ ds }}`` of a random scheduled day of a random table: 100 events fire) and a snapshot
   trigger of the flow on a random table (100 events fire): through HTTP (consumer token), through the
   store in the benchmark's process (no HTTP; its ``*_json`` methods, which the service calls), and as
   pgbench (one client) running the trigger's main lookup (the same ``WHERE``, ``ORDER BY`` and ``LIMIT``,
   the stored columns as they are). Median and p99 latency.

Targets (issue 5): through HTTP at least 25 % of pgbench's batched rate and 50 % of its single-row rate;
p99 of each trigger evaluation under 10 ms at 10 million events.

Results go to ``benchmarks/results/triggers-<date>.json`` and to the section "## Trigger service" of
``docs/benchmarks.md`` (other sections are kept).

    .venv/bin/python benchmarks/triggers.py      # what `make bench-triggers` runs (1M and 10M events)
    .venv/bin/python benchmarks/triggers.py --quick --no-doc      # a smoke run (about a minute)
    .venv/bin/python benchmarks/triggers.py --render benchmarks/results/triggers-DATE.json --note "..."
    .venv/bin/python benchmarks/triggers.py --stack-ab --rounds 6   # uvloop + httptools against asyncio + h11
    .venv/bin/python benchmarks/triggers.py --wake-ab    # uvicorn's CPU per request: answered at once or after a wait
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core  # noqa: E402  (benchmarks/core.py: machine(), code_version(), write_doc())
from core import RESULTS_DIR, ROOT, code_version, log, machine  # noqa: E402

from bitlake.triggers.pgserver import PostgresServer, free_port  # noqa: E402

SECTION = "## Trigger service"
BATCHED_TARGET = 0.25
SINGLE_TARGET = 0.5
P99_TARGET_MS = 10.0
FIRST_DAY = dt.date(2024, 1, 1)
# Registration times of the preloaded events: 2024-01-01 plus the event id in microseconds.
BASE_TS = 1_704_067_200_000_000
TAGS_JSON = '{"source":"bench"}'
FLOW = "bench"
PGBENCH_TABLE = "pgbench_events"


def table_name(t: int) -> str:
    return f"bench.t{t}"


def partition_json(day: int) -> str:
    return f'["{(FIRST_DAY + dt.timedelta(days=day)).isoformat()}"]'


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (Linux /proc), to charge the service per request."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def latency_summary(ms: list[float]) -> dict:
    return {"n": len(ms), "mean_ms": statistics.fmean(ms), "p50_ms": percentile(ms, 50),
            "p99_ms": percentile(ms, 99), "max_ms": max(ms)}


# ------------------------------------------------------------------------------------------ PostgreSQL


class Postgres(PostgresServer):
    """The benchmark's PostgreSQL server: default durability, memory for ten million events, and pgbench."""

    def __init__(self, shared_buffers: str):
        super().__init__({"max_connections": "100", "shared_buffers": shared_buffers, "maintenance_work_mem": "1GB",
                          "max_wal_size": "8GB", "max_parallel_maintenance_workers": "2",
                          "checkpoint_timeout": "30min"})
        if not (self.bin / "pgbench").exists():
            raise SystemExit(f"pgbench is missing from {self.bin}: run bash scripts/setup-postgres.sh")

    def pgbench(self, database: str, script: str, *, clients: int, duration: float | None = None,
                transactions: int | None = None) -> dict:
        """Runs pgbench with ``script`` (prepared statements, no vacuum); per-transaction latencies from its log."""
        work = Path(tempfile.mkdtemp(prefix="pgbench-", dir=self.root))
        (work / "script.sql").write_text(script)
        command = [str(self.bin / "pgbench"), "-n", "-M", "prepared", "-h", "127.0.0.1", "-p", str(self.port),
                   "-U", "bitlake", "-c", str(clients), "-j", str(clients), "-f", "script.sql", "-l",
                   "--log-prefix", "tx"]
        command += ["-T", str(round(duration))] if duration is not None else ["-t", str(transactions)]
        command.append(database)
        result = subprocess.run(command, capture_output=True, text=True, cwd=work, timeout=3600)
        if result.returncode != 0:
            raise RuntimeError(f"pgbench failed:\n{result.stdout}\n{result.stderr}\n{script[:2000]}")
        out = result.stdout
        tps = float(re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)[1])
        done = int(re.search(r"number of transactions actually processed: (\d+)", out)[1])
        failed = re.search(r"number of failed transactions: (\d+)", out)
        latencies = []
        for logfile in work.glob("tx.*"):
            for line in logfile.read_text().splitlines():
                latencies.append(int(line.split()[2]) / 1000)
        shutil.rmtree(work, ignore_errors=True)
        return {"tps": tps, "transactions": done, "failed": int(failed[1]) if failed else 0,
                "latency": latency_summary(latencies), "latencies": latencies,
                "command": " ".join(command[:1] + command[2:])}


# ------------------------------------------------------------------------------------------ the service


class Service:
    """``uvicorn --factory bitlake.triggers:create_app`` in a subprocess (one worker), on the benchmark's database.

    Several instances are separate processes on their own ports, the clients spread over them, as behind a
    load balancer. Not ``uvicorn --workers N``: its workers serve a socket handed over by the supervisor, on
    which asyncio does not set TCP_NODELAY (the socket's protocol reads 0), and every response then waits
    about 40 ms for the client's delayed ACK (uvloop sets it; separate processes work with either loop).
    uvicorn's defaults pick uvloop and httptools when installed (``uvicorn[standard]``, a bitlake dependency);
    ``--pure-python-http`` runs it with ``--loop asyncio --http h11`` instead.
    """

    def __init__(self, db_url: str, *, pure_python: bool = False, app: str = "--factory bitlake.triggers:create_app",
                 env: dict[str, str] | None = None):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, BITLAKE_TRIGGERS_DB_URL=db_url, **(env or {}))
        self.command = [sys.executable, "-m", "uvicorn", *app.split(),
                        "--host", "127.0.0.1", "--port", str(self.port),
                        "--log-level", "warning", "--no-access-log"]
        if pure_python:  # uvicorn's own fallbacks, whatever is installed (A/B against uvloop and httptools)
            self.command += ["--loop", "asyncio", "--http", "h11"]
        self.process = subprocess.Popen(self.command, env=env, cwd=ROOT)

    def wait_ready(self, timeout: float = 60) -> None:
        core.wait_for_health(self.process, self.base_url, timeout)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# ------------------------------------------------------------------------------------------ registration


def event_batch(rng, tables: int, size: int, tag: str) -> list[dict]:
    """``size`` new events of one random table (a producer's commits), each with its own snapshot id."""
    t = rng.randrange(tables)
    return [{"table": table_name(t), "partition": [(FIRST_DAY + dt.timedelta(days=k % 28)).isoformat()],
             "snapshot_id": f"{tag}.{k}", "table_format": "BITLAKE", "operation_type": "APPEND",
             "tags": {"source": "bench"}} for k in range(size)]


class RawHttp:
    """``post(path, body) -> (status, body)`` on one keep-alive HTTP/1.1 connection, written and read with plain
    socket calls. pgbench is a C client; the load generator should cost the shared cores as little, and httpx
    took 0.2-0.3 ms of CPU per request, as much as the service's own work on a single event."""

    def __init__(self, base_url: str, token: str):
        host, port = base_url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.head = (f"Host: {host}\r\nAuthorization: Bearer {token}\r\n"
                     "Content-Type: application/json\r\nContent-Length: ").encode()

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.sock.sendall(b"POST %s HTTP/1.1\r\n%s%d\r\n\r\n%s" % (path.encode(), self.head, len(body), body))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the service closed the connection")
            data += chunk
        header, data = data.split(b"\r\n\r\n", 1)
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", header)
        if length is None:
            raise RuntimeError(f"no Content-Length in the answer: {header[:500]!r}")
        while len(data) < int(length[1]):
            data += self.sock.recv(65536)
        return int(header.split(b" ", 2)[1]), data

    def close(self) -> None:
        self.sock.close()


def _raw_http_sender(base_url: str, token: str):
    """``send(events) -> ok``: ``POST /events`` through :class:`RawHttp`."""
    import pydantic_core

    http = RawHttp(base_url, token)

    def send(batch: list[dict]) -> bool:
        return http.post("/events", pydantic_core.to_json({"events": batch}))[0] == 200

    return send


def _register_client(how: str, target: str, token: str, size: int, tables: int, seed: int,
                     start_at: float, end_at: float, results) -> None:
    """One registering client: sends new events from ``start_at`` until ``end_at`` (wall clock)."""
    import random

    rng = random.Random(seed)
    events = requests = errors = 0
    n = 0

    def batches():
        nonlocal n
        while True:
            n += 1
            yield event_batch(rng, tables, size, f"c{seed}.{n}")

    source = batches()
    if how == "http":
        send = _raw_http_sender(target, token)
    else:
        from bitlake.triggers.store import TriggerStore

        store = TriggerStore(target, migrate=False)

        def send(batch: list[dict]) -> bool:
            store.register_json(batch)  # what the service calls: the answer as JSON, written by the database
            return True

    send(next(source))  # connection set up and first-call costs outside the window
    while time.time() < start_at:
        time.sleep(0.001)
    while True:
        batch = next(source)
        ok = send(batch)
        if time.time() > end_at:
            break
        requests += 1
        events += len(batch) if ok else 0
        errors += 0 if ok else 1
    results.put({"events": events, "requests": requests, "errors": errors})


def register_rate(how: str, targets: list[str], token: str, *, clients: int, size: int, tables: int,
                  duration: float) -> dict:
    """Events per second registered by ``clients`` processes, each one request after the other (client ``i``
    talks to ``targets[i % len(targets)]``)."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    start_at = time.time() + 3.0  # every process started and warmed up
    end_at = start_at + duration
    procs = [ctx.Process(target=_register_client, args=(how, targets[i % len(targets)], token, size, tables,
                                                         int(time.time() * 1000) * 100 + i, start_at, end_at,
                                                         results)) for i in range(clients)]
    for p in procs:
        p.start()
    parts = [results.get(timeout=duration + 120) for _ in procs]
    for p in procs:
        p.join()
    events = sum(p["events"] for p in parts)
    errors = sum(p["errors"] for p in parts)
    if errors:
        raise RuntimeError(f"{errors} registration requests failed ({how}, {size} per request)")
    return {"events": events, "requests": sum(p["requests"] for p in parts), "seconds": duration,
            "events_per_s": events / duration}


def pgbench_insert_script(size: int, tables: int) -> str:
    rows = ",\n".join(
        f"  ({BASE_TS}, 'bench.t' || :t, '[\"{(FIRST_DAY + dt.timedelta(days=k % 28)).isoformat()}\"]', "
        f":s || '.{k}', NULL, NULL, 'BITLAKE', 'APPEND', '{TAGS_JSON}')" for k in range(size))
    return (f"\\set t random(0, {tables - 1})\n\\set s random(1, 9000000000000000000)\n"
            f"INSERT INTO {PGBENCH_TABLE} (event_ts, table_name, partition_json, snapshot_id, snapshot_ts, "
            "prev_snapshot_id, table_format, operation_type, tags) VALUES\n" + rows + ";\n")


def registration(pg: Postgres, db: str, services: list[Service], producer: str, args) -> dict:
    """Registration rates, each way measured ``--rounds`` times, the ways interleaved so that each sees the
    same share of whatever else the machine is doing; medians."""
    out = {}
    for label, size in (("batched", args.batch), ("single", 1)):
        target = BATCHED_TARGET if size > 1 else SINGLE_TARGET
        runs: dict[str, list[dict]] = {}
        ways = ["pgbench", "store"] + [f"http{n}" for n in args.instances]
        for r in range(args.rounds):
            for way in ways:
                with pg.connect(db) as conn:
                    conn.execute(f"TRUNCATE events, {PGBENCH_TABLE} RESTART IDENTITY")
                if way == "pgbench":
                    run = pg.pgbench(db, pgbench_insert_script(size, args.tables), clients=args.clients,
                                     duration=args.duration)
                    del run["latencies"]
                    run["events_per_s"] = run["tps"] * size
                elif way == "store":
                    run = register_rate("store", [pg.url(db)], "", clients=args.clients, size=size,
                                        tables=args.tables, duration=args.duration)
                else:
                    n = int(way[4:])
                    cpu = sum(cpu_seconds(svc.process.pid) for svc in services[:n])
                    run = register_rate("http", [svc.base_url for svc in services[:n]], producer,
                                        clients=args.clients, size=size, tables=args.tables, duration=args.duration)
                    # Every request the service answered in the call, the clients' warm-up ones included.
                    cpu = sum(cpu_seconds(svc.process.pid) for svc in services[:n]) - cpu
                    run["service_cpu_ms_per_request"] = cpu * 1000 / (run["requests"] + 2 * args.clients)
                run["load_average"] = os.getloadavg()[0]
                runs.setdefault(way, []).append(run)
                log(f"registration {label}, round {r + 1}: {way} {run['events_per_s']:,.0f} events/s "
                    f"(load average {run['load_average']:.1f})")
        rate = {way: statistics.median(x["events_per_s"] for x in rs) for way, rs in runs.items()}
        http = {str(n): {"events_per_s": rate[f"http{n}"], "ratio": rate[f"http{n}"] / rate["pgbench"],
                         "met": rate[f"http{n}"] / rate["pgbench"] >= target,
                         "service_cpu_ms_per_request": statistics.median(
                             x["service_cpu_ms_per_request"] for x in runs[f"http{n}"])} for n in args.instances}
        for n, h in http.items():
            log(f"  {label}: HTTP with {n} instance(s) {h['events_per_s']:,.0f} events/s = {h['ratio']:.2f} of "
                f"pgbench's {rate['pgbench']:,.0f} (target {target:.2f})")
        out[label] = {"events_per_request": size, "target": target, "pgbench_events_per_s": rate["pgbench"],
                      "store_events_per_s": rate["store"], "store_ratio": rate["store"] / rate["pgbench"],
                      "http": http, "runs": runs,
                      "load_average": statistics.median(x["load_average"] for rs in runs.values() for x in rs)}
    with pg.connect(db) as conn:
        conn.execute(f"TRUNCATE events, flows, {PGBENCH_TABLE} RESTART IDENTITY")
    return out


# ------------------------------------------------------------------------------------------ preload


def _parallel(pg: Postgres, db: str, statements: list[str]) -> None:
    """Runs the statements two at a time (one connection each): the machine's cores, used for loading."""
    errors: list[BaseException] = []

    def work(chunk: list[str]) -> None:
        try:
            with pg.connect(db) as conn:
                conn.execute("SET synchronous_commit = off")
                for s in chunk:
                    conn.execute(s)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(statements[i::2],)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]


def preload(pg: Postgres, db: str, *, have: int, want: int, tables: int, hits: int) -> dict:
    """Grows the events table from ``have`` to ``want`` events straight in PostgreSQL, as the store lays them out.

    Event ``i`` (1-based) is the ``j``-th (``(i - 1) // tables``) event of table ``(i - 1) % tables``, snapshot
    ``j + 1`` chained to ``j``, in partition day ``j // hits``. The indexes and constraints the migrations
    made are dropped for the load and rebuilt as they were.
    """
    started = time.perf_counter()
    with pg.connect(db) as conn:
        constraints = conn.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = 'events'::regclass AND contype IN ('p', 'u')").fetchall()
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'events' AND indexname NOT IN "
            "(SELECT conname FROM pg_constraint WHERE conrelid = 'events'::regclass)").fetchall()
        for name, _ in indexes:
            conn.execute(f'DROP INDEX "{name}"')
        for name, _ in constraints:
            conn.execute(f'ALTER TABLE events DROP CONSTRAINT "{name}"')
    step = 1_000_000
    inserts = [
        "INSERT INTO events (event_id, event_ts, table_name, partition_json, snapshot_id, snapshot_ts, "
        "prev_snapshot_id, table_format, operation_type, tags) "
        f"SELECT i, {BASE_TS} + i, 'bench.t' || ((i - 1) % {tables}), "
        f"'[\"' || to_char(date '{FIRST_DAY.isoformat()}' + ((i - 1) / {tables} / {hits})::int, 'YYYY-MM-DD') "
        f"|| '\"]', ((i - 1) / {tables} + 1)::text, {BASE_TS} + i, "
        f"nullif(((i - 1) / {tables})::text, '0'), 'BITLAKE', 'APPEND', '{TAGS_JSON}'::jsonb "
        f"FROM generate_series({lo}::bigint, {min(lo + step - 1, want)}::bigint) AS i"
        for lo in range(have + 1, want + 1, step)
    ]
    _parallel(pg, db, inserts)
    loaded = time.perf_counter()
    _parallel(pg, db, [f'ALTER TABLE events ADD CONSTRAINT "{name}" {definition}'
                       for name, definition in constraints] + [definition for _, definition in indexes])
    indexed = time.perf_counter()
    per_table = want // tables
    with pg.connect(db) as conn:
        conn.execute("SELECT setval(pg_get_serial_sequence('events', 'event_id'), %s)", (want,))
        conn.execute("DELETE FROM flows")
        # Each flow acknowledged all but its table's last ``hits`` events.
        conn.execute(
            "INSERT INTO flows (flow_name, table_name, tags_json, start_ts, last_event_id, created_at, acked_at) "
            f"SELECT '{FLOW}', 'bench.t' || t, '{{}}', NULL, "
            f"greatest(0, ({per_table} - {hits} - 1)::bigint * {tables} + t + 1), {BASE_TS}, {BASE_TS} "
            f"FROM generate_series(0, {tables - 1}) AS t")
        conn.execute("VACUUM ANALYZE events")
        conn.execute("VACUUM ANALYZE flows")
        size = conn.execute("SELECT pg_total_relation_size('events'), pg_relation_size('events')").fetchone()
    done = time.perf_counter()
    return {"events": want, "added": want - have, "load_s": loaded - started, "index_s": indexed - loaded,
            "vacuum_s": done - indexed, "total_bytes": size[0], "heap_bytes": size[1]}


# ------------------------------------------------------------------------------------------ triggers


def trigger_requests(rng, kind: str, tables: int, days: int) -> dict:
    t = rng.randrange(tables)
    if kind == "partition":
        day = FIRST_DAY + dt.timedelta(days=rng.randrange(days))
        return {"table": table_name(t), "partition": ["{{ ds }}"], "scheduled_time": f"{day.isoformat()}T00:00:00Z"}
    return {"flow": FLOW, "table": table_name(t)}


def pgbench_lookup_script(kind: str, tables: int, days: int, per_table: int, hits: int) -> str:
    """The trigger's main lookup as the store sends it (WHERE, ORDER BY, LIMIT), selecting the stored columns
    (the store has the database write each event's JSON instead)."""
    columns = ("event_id, event_ts, table_name, partition_json, snapshot_id, snapshot_ts, prev_snapshot_id, "
               "table_format, operation_type, tags")
    if kind == "partition":
        return (f"\\set t random(0, {tables - 1})\n\\set d random(0, {days - 1})\n"
                f"SELECT {columns} FROM events WHERE table_name = 'bench.t' || :t "
                f"AND partition_json = '[\"' || to_char(date '{FIRST_DAY.isoformat()}' + :d::int, 'YYYY-MM-DD') "
                "|| '\"]' "
                f"AND event_ts <= {BASE_TS * 2} ORDER BY event_id LIMIT 1001;\n")
    return (f"\\set t random(0, {tables - 1})\n"
            f"\\set c greatest(0, ({per_table} - {hits} - 1) * {tables} + :t + 1)\n"
            f"SELECT {columns} FROM events WHERE table_name = 'bench.t' || :t AND event_id > :c "
            f"AND event_id <= {10 ** 12} ORDER BY event_id LIMIT 1001;\n")


TRIGGER_CLIENTS = {"sockets": "sent and read with plain socket calls on a keep-alive connection, like the "
                              "registering clients", "httpx": "sent with an httpx client"}


def _over_http(http: RawHttp, path: str, bodies: list[dict], hits: int) -> list[float]:
    import pydantic_core

    ms = []
    for body in bodies:
        request = pydantic_core.to_json(body)
        start = time.perf_counter()
        status, answer = http.post(path, request)
        ms.append((time.perf_counter() - start) * 1000)
        if status != 200:
            raise RuntimeError(f"{path}: {status} {answer[:500]!r}")
        fired = len(json.loads(answer)["events"])
        if fired != hits:
            raise RuntimeError(f"{path} {body}: {fired} events fired, not {hits}")
    return ms


def _in_process(model, evaluate, bodies: list[dict], hits: int) -> list[float]:
    ms = []
    for body in bodies:
        trigger = model.model_validate(body)
        start = time.perf_counter()
        result = evaluate(trigger)
        ms.append((time.perf_counter() - start) * 1000)
        fired = len(json.loads(result)["events"])
        if fired != hits:
            raise RuntimeError(f"{body}: {fired} events fired, not {hits}")
    return ms


def trigger_latency(pg: Postgres, db: str, service: Service, consumer: str, *, events: int, tables: int,
                    hits: int, requests: int, rounds: int) -> dict:
    """Latency of each trigger through HTTP, through the store and as pgbench's lookup: ``requests`` of each
    after a tenth as many of warm-up, in ``rounds`` interleaved chunks; percentiles over all of them."""
    import random

    from bitlake.triggers.store import TriggerStore
    from bitlake.triggers.trigger import PartitionTrigger, SnapshotTrigger

    per_table = events // tables
    days = per_table // hits
    out = {}
    store = TriggerStore(pg.url(db), migrate=False)
    http = RawHttp(service.base_url, consumer)
    try:
        for kind in ("partition", "snapshot"):
            path = "/triggers/partition" if kind == "partition" else "/triggers/snapshot"
            model = PartitionTrigger if kind == "partition" else SnapshotTrigger
            evaluate = (store.evaluate_partition_trigger_json if kind == "partition"
                        else store.evaluate_snapshot_trigger_json)
            rng = random.Random(7)
            script = pgbench_lookup_script(kind, tables, days, per_table, hits)

            warm = [trigger_requests(rng, kind, tables, days) for _ in range(max(1, requests // 10))]
            _over_http(http, path, warm, hits)
            _in_process(model, evaluate, warm, hits)
            pg.pgbench(db, script, clients=1, transactions=len(warm))
            http_ms: list[float] = []
            store_ms: list[float] = []
            bench_ms: list[float] = []
            load = []
            chunk = max(1, requests // rounds)
            service_cpu = 0.0
            for r in range(rounds):
                log(f"{events:,} events, {kind} trigger, round {r + 1}: {chunk} evaluations each through HTTP, "
                    "the store and pgbench")
                bodies = [trigger_requests(rng, kind, tables, days) for _ in range(chunk)]
                cpu = cpu_seconds(service.process.pid)
                http_ms += _over_http(http, path, bodies, hits)
                service_cpu += cpu_seconds(service.process.pid) - cpu
                store_ms += _in_process(model, evaluate, bodies, hits)
                bench_ms += pg.pgbench(db, script, clients=1, transactions=chunk)["latencies"]
                load.append(os.getloadavg()[0])
            h, st, b = latency_summary(http_ms), latency_summary(store_ms), latency_summary(bench_ms)
            log(f"  p50/p99 ms: HTTP {h['p50_ms']:.2f}/{h['p99_ms']:.2f}, store {st['p50_ms']:.2f}/{st['p99_ms']:.2f}, "
                f"pgbench {b['p50_ms']:.2f}/{b['p99_ms']:.2f}")
            out[kind] = {"fired_events": hits, "http": h, "store": st, "pgbench": b,
                         "pgbench_script": script, "load_average": statistics.median(load),
                         "service_cpu_ms_per_request": service_cpu * 1000 / len(http_ms),
                         "p99_ratio": h["p99_ms"] / b["p99_ms"], "p50_ratio": h["p50_ms"] / b["p50_ms"]}
    finally:
        http.close()
        store.close()
    return out


# ------------------------------------------------------------------------------------------ the HTTP stack


def stack_ab(args) -> int:
    """``--stack-ab``: the service's CPU time per request with uvicorn's defaults (uvloop and httptools when
    installed) against its pure-Python stack (``--loop asyncio --http h11``). Both services run at once on
    one PostgreSQL (20,000 events preloaded in 100 tables); one client sends each kind of request to one
    service and then the other, in ``--rounds`` rounds that alternate the order; CPU from /proc, medians."""
    import random

    import httpx

    from bitlake.triggers.store import TriggerStore

    if not server_stack(False)["loop"].startswith("uvloop") or not server_stack(False)["http"].startswith("httptools"):
        raise SystemExit("--stack-ab needs uvloop and httptools installed (pip install 'uvicorn[standard]')")
    tables, events, hits = 100, 20_000, 100
    date = dt.datetime.now(dt.UTC)
    pg = Postgres("256MB")
    services: dict[str, Service] = {}
    try:
        pg.start()
        db = "bitlake_stack_ab"
        pg.create_database(db)
        with TriggerStore(pg.url(db)) as store:
            producer = store.create_token("producer", ["bench.*"], name="bench producer")
            consumer = store.create_token("consumer", ["bench.*"], name="bench consumer")
        preload(pg, db, have=0, want=events, tables=tables, hits=hits)
        services = {"uvloop+httptools": Service(pg.url(db)), "asyncio+h11": Service(pg.url(db), pure_python=True)}
        for svc in services.values():
            svc.wait_ready()
        rng = random.Random(11)
        n = 0

        def registration_body(size: int) -> str:
            nonlocal n
            n += 1
            batch = event_batch(rng, tables, size, f"ab{n}")
            for event in batch:  # tables of their own: the partition triggers keep firing 100 events
                event["table"] = event["table"].replace("bench.t", "bench.r")
            return json.dumps({"events": batch})

        kinds = {  # (method, path, token, body maker, requests per round)
            "GET /health": ("GET", "/health", producer, lambda: None, 2000),
            "POST /events, 1 event": ("POST", "/events", producer, lambda: registration_body(1), 600),
            "POST /events, 100 events": ("POST", "/events", producer, lambda: registration_body(100), 150),
            "POST /triggers/partition, 100 fire": (
                "POST", "/triggers/partition", consumer,
                lambda: json.dumps(trigger_requests(rng, "partition", tables, events // tables // hits)), 600),
        }
        runs: dict[str, dict[str, list[dict]]] = {k: {w: [] for w in services} for k in kinds}
        for r in range(args.rounds):
            for kind, (method, path, token, body, count) in kinds.items():
                for way in (list(services) if r % 2 == 0 else list(services)[::-1]):
                    svc = services[way]
                    bodies = [body() for _ in range(count + count // 10)]
                    with httpx.Client(base_url=svc.base_url, timeout=60, headers={
                            "Authorization": f"Bearer {token}", "Content-Type": "application/json"}) as http:
                        for b in bodies[count:]:  # warm-up
                            http.request(method, path, content=b)
                        cpu, start = cpu_seconds(svc.process.pid), time.perf_counter()
                        for b in bodies[:count]:
                            response = http.request(method, path, content=b)
                            if response.status_code != 200:
                                raise RuntimeError(f"{way} {path}: {response.status_code} {response.text[:500]}")
                        wall = time.perf_counter() - start
                        cpu = cpu_seconds(svc.process.pid) - cpu
                    runs[kind][way].append({"cpu_ms_per_request": cpu * 1000 / count,
                                            "wall_ms_per_request": wall * 1000 / count,
                                            "load_average": os.getloadavg()[0]})
            log(f"round {r + 1} of {args.rounds} (load average {os.getloadavg()[0]:.1f})")
    finally:
        for svc in services.values():
            svc.stop()
        pg.stop()
    summary = {kind: {way: {"cpu_ms_per_request": statistics.median(x["cpu_ms_per_request"] for x in rs),
                            "wall_ms_per_request": statistics.median(x["wall_ms_per_request"] for x in rs)}
                      for way, rs in ways.items()} for kind, ways in runs.items()}
    loads = [x["load_average"] for ways in runs.values() for rs in ways.values() for x in rs]
    lines = ["| request | service CPU ms per request: uvloop + httptools | asyncio + h11 | saved "
             "| wall ms per request (one client): uvloop + httptools | asyncio + h11 |",
             "| --- | --- | --- | --- | --- | --- |"]
    for kind, ways in summary.items():
        a, b = ways["uvloop+httptools"], ways["asyncio+h11"]
        lines.append(f"| {kind} | {a['cpu_ms_per_request']:.3f} | {b['cpu_ms_per_request']:.3f} "
                     f"| {1 - a['cpu_ms_per_request'] / b['cpu_ms_per_request']:.0%} "
                     f"| {a['wall_ms_per_request']:.2f} | {b['wall_ms_per_request']:.2f} |")
    lines.append(f"\n{args.rounds} rounds, load average {min(loads):.1f} to {max(loads):.1f}.")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"triggers-stack-ab-{date.strftime('%Y-%m-%d-%H%M')}.json"
    out.write_text(json.dumps({
        "benchmark": "triggers --stack-ab", "date": date.strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([".venv/bin/python", "benchmarks/triggers.py", *map(shlex.quote, sys.argv[1:])]),
        "machine": machine(), "code": code_version(), "stacks": {w: svc.command for w, svc in services.items()},
        "stack": server_stack(False), "rounds": args.rounds, "summary": summary, "runs": runs,
        "load_average": [min(loads), max(loads)]}, indent=2) + "\n")
    print("\n".join(lines))
    log(f"{out}")
    return 0


def wake_ab(args) -> int:
    """``--wake-ab``: uvicorn's CPU time per request when its process answers at once and when it waits
    before answering, as the service waits for PostgreSQL. A bare ASGI app (benchmarks/wake_app.py: no FastAPI,
    no validation, no database) in one uvicorn process per delay, all running; the registering clients
    (``--clients``, one event per request) load each in turn, in ``--rounds`` rounds; CPU from /proc, medians."""
    delays = [0.0, 1.0, 2.0]  # uvloop's timers count whole milliseconds
    services = {d: Service("", app="benchmarks.wake_app:app", env={"WAKE_DELAY_MS": str(d)}) for d in delays}
    runs: dict[float, list[dict]] = {d: [] for d in delays}
    try:
        for svc in services.values():
            svc.wait_ready()
        for r in range(args.rounds):
            for d, svc in services.items():
                cpu = cpu_seconds(svc.process.pid)
                run = register_rate("http", [svc.base_url], "", clients=args.clients, size=1, tables=args.tables,
                                    duration=args.duration)
                run["service_cpu_ms_per_request"] = (cpu_seconds(svc.process.pid) - cpu) * 1000 / (
                    run["requests"] + 2 * args.clients)
                run["load_average"] = os.getloadavg()[0]
                runs[d].append(run)
                log(f"round {r + 1}: answered after {d:g} ms: {run['requests'] / run['seconds']:,.0f} requests/s, "
                    f"{run['service_cpu_ms_per_request']:.3f} ms of CPU per request")
    finally:
        for svc in services.values():
            svc.stop()
    lines = ["| answered after | requests/s | uvicorn CPU ms per request | load average |", "| --- | --- | --- | --- |"]
    for d, rs in runs.items():
        lines.append(f"| {d:g} ms | {statistics.median(x['requests'] / x['seconds'] for x in rs):,.0f} | "
                     f"{statistics.median(x['service_cpu_ms_per_request'] for x in rs):.3f} | "
                     f"{statistics.median(x['load_average'] for x in rs):.1f} |")
    out = RESULTS_DIR / f"triggers-wake-ab-{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d-%H%M')}.json"
    out.write_text(json.dumps({"benchmark": "triggers --wake-ab", "date": dt.datetime.now(dt.UTC).isoformat(),
                               "code": code_version(), "clients": args.clients, "duration": args.duration,
                               "runs": {str(d): rs for d, rs in runs.items()}}, indent=2) + "\n")
    print("\n".join(lines))
    log(f"raw results: {out}")
    return 0


# ------------------------------------------------------------------------------------------ the doc


def server_stack(pure_python: bool) -> dict:
    """The event loop and HTTP parser that uvicorn's ``--loop auto --http auto`` (its defaults, and what
    ``bitlake serve`` uses) picks in this environment: uvloop and httptools when importable."""
    import importlib.metadata
    import importlib.util

    def installed(name: str) -> str | None:
        if pure_python or importlib.util.find_spec(name) is None:
            return None
        return importlib.metadata.version(name)

    uvloop, httptools = installed("uvloop"), installed("httptools")
    return {"pure_python": pure_python,
            "loop": f"uvloop {uvloop}" if uvloop else "asyncio",
            "http": f"httptools {httptools}" if httptools else "h11"}


def stack_text(result: dict) -> str:
    stack = result.get("server")
    if stack is None:  # results from before the stack was recorded: uvicorn[standard] was not installed
        return "pure-Python HTTP parser and event loop, as `make setup` installed it then"
    if stack["pure_python"]:
        return "forced to its pure-Python stack with `--loop asyncio --http h11`"
    if stack["loop"] == "asyncio" and stack["http"] == "h11":
        return "its pure-Python stack: asyncio event loop, h11 HTTP parser"
    return (f"event loop {stack['loop']}, HTTP parser {stack['http']}: what its default `--loop auto "
            "--http auto` picks with `uvicorn[standard]`, as `make setup` installs it and `bitlake serve` runs")


def markdown(result: dict) -> str:
    m, cfg, code = result["machine"], result["config"], result["code"]
    note = " (with uncommitted changes in bitlake/)" if code["bitlake_dirty"] else ""
    make_note = ("what `make bench-triggers` runs; `make bench` runs it after the others"
                 if result.get("plain_make") else "`make bench-triggers` runs it with the default options")
    lines = [
        SECTION,
        "",
        f"Command: `{result['command']}` ({make_note}), {result['date']}.",
        "",
        f"Machine: {m['cores']} cores, {m['memory_gib']} GiB RAM ({m['platform']}). Python {m['python']}; "
        f"{result['postgres']} (started by the benchmark: default durability, `fsync` and `synchronous_commit` "
        f"on, shared_buffers {cfg['shared_buffers']}); uvicorn {result['versions']['uvicorn']} ("
        f"{stack_text(result)}; one worker per process, no access log), "
        f"FastAPI {result['versions']['fastapi']}, SQLAlchemy {result['versions']['sqlalchemy']}, "
        f"psycopg {result['versions']['psycopg']}, pydantic {result['versions']['pydantic']}. The clients, "
        "the service and PostgreSQL share the machine's cores, and so did whatever else ran on the machine: "
        "the load average is given beside each measurement.",
        "",
        f"Code: bitlake at commit {code['git_head']}{note}.",
        "",
        "### Registration",
        "",
        f"{cfg['clients']} client processes on loopback, each sending one request after the other for "
        f"{cfg['duration']:g} s; {cfg['rounds']} rounds, each round running every way in turn (so that each sees "
        "the same share of the machine), medians; every event new "
        f"(a random table of {cfg['tables']:,}, a new snapshot id, one "
        f"daily partition, one tag). HTTP: `POST /events` with a producer token (the JSON built in the client, "
        "sent with plain socket calls on a keep-alive connection: a load generator about as light as pgbench) "
        "to one service process (`bitlake serve` runs one) or to two, the clients spread over them; requests "
        "that reach a service process while it is busy share one transaction (group commit). "
        "Store: `TriggerStore.register_json` (the store's part of the service's work: the input checked, one "
        "transaction, the answer written) called in each client process, no HTTP. pgbench: "
        f"{cfg['clients']} clients running a plain `INSERT` of as many rows into a copy of the events table "
        "(same columns, indexes and constraints; `-M prepared`), the limit. The service does more per "
        "request than that `INSERT`: it checks the token and the input, takes the registration lock, "
        "inserts (new events in one autocommit statement; a batch holding a registered key again with "
        "`ON CONFLICT DO NOTHING`, so that a retry is a no-op and gets the stored events back), and answers "
        "with every event. "
        f"Targets: HTTP at least {BATCHED_TARGET:.0%} of pgbench batched and {SINGLE_TARGET:.0%} one by one.",
        "",
        "| events per request | pgbench events/s | store events/s (/ pgbench) | service processes | HTTP events/s "
        "| HTTP / pgbench | target | service CPU ms per request | load average |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["registration"].values():
        for n, h in r["http"].items():
            verdict = "met" if h["met"] else "MISSED"
            lines.append(
                f"| {r['events_per_request']} | {r['pgbench_events_per_s']:,.0f} "
                f"| {r['store_events_per_s']:,.0f} ({r['store_ratio']:.2f}) | {n} "
                f"| {h['events_per_s']:,.0f} | {h['ratio']:.2f} | ≥ {r['target']:.2f}: {verdict} "
                f"| {h['service_cpu_ms_per_request']:.2f} | {r['load_average']:.1f} |")
    lines += [
        "",
        "### Trigger evaluation",
        "",
        f"The events table loaded straight in PostgreSQL: {cfg['tables']:,} tables, events round-robin over "
        f"them in event-id order, {cfg['hits']} events per daily partition; one flow per table, its cursor "
        f"{cfg['hits']} events before the table's last. One client, one request after the other, "
        f"{cfg['requests']:,} evaluations after {cfg['requests'] // 10:,} of warm-up, random tables: the "
        f"partition trigger of a random day (`{{{{ ds }}}}` rendered at `scheduled_time`) and the flow's "
        f"snapshot trigger each fire {cfg['hits']} events. HTTP: `POST /triggers/partition` and "
        f"`/triggers/snapshot` (consumer token; {TRIGGER_CLIENTS[cfg.get('trigger_client', 'httpx')]}); "
        "store: `evaluate_partition_trigger_json` and "
        "`evaluate_snapshot_trigger_json` (what the service calls: the events' JSON written by the database) "
        "called in the benchmark's process; pgbench: one client running the trigger's main lookup (same "
        "`WHERE`, `ORDER BY` and `LIMIT`, the stored columns as they are) with random tables and days. "
        f"Target: HTTP p99 under {P99_TARGET_MS:g} ms at 10 million events.",
        "",
        "| events (size) | trigger | pgbench p50 / p99 ms | store p50 / p99 ms | HTTP p50 / p99 ms "
        "| HTTP / pgbench (p50, p99) | target | service CPU ms per request | load average |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for size in result["triggers"]:
        load = size["preload"]
        for kind, r in size["latency"].items():
            p, s, h = r["pgbench"], r["store"], r["http"]
            verdict = "—"
            if size["events"] >= 10_000_000:
                verdict = f"p99 < {P99_TARGET_MS:g} ms: " + ("met" if h["p99_ms"] < P99_TARGET_MS else "MISSED")
            lines.append(
                f"| {size['events']:,} ({load['total_bytes'] / 1e9:.1f} GB) | {kind} "
                f"| {p['p50_ms']:.2f} / {p['p99_ms']:.2f} | {s['p50_ms']:.2f} / {s['p99_ms']:.2f} "
                f"| {h['p50_ms']:.2f} / {h['p99_ms']:.2f} | {r['p50_ratio']:.1f}, {r['p99_ratio']:.1f} | {verdict} "
                f"| {r.get('service_cpu_ms_per_request', float('nan')):.2f} | {r['load_average']:.1f} |")
    lines += ["", "Loading (straight in PostgreSQL, not measured against anything): " + "; ".join(
        f"{s['preload']['added']:,} events in {s['preload']['load_s']:.0f} s, indexes {s['preload']['index_s']:.0f} s, "
        f"VACUUM ANALYZE {s['preload']['vacuum_s']:.0f} s" for s in result["triggers"]) + "."]
    notes = result.get("notes") or []
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += ["", f"Raw results: `{result['json_path']}`.", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", default="1000000,10000000", help="stored event counts for the trigger latencies")
    ap.add_argument("--tables", type=int, default=10_000)
    ap.add_argument("--hits", type=int, default=100, help="events each trigger evaluation fires")
    ap.add_argument("--clients", type=int, default=4, help="concurrent registering clients (processes)")
    ap.add_argument("--batch", type=int, default=100, help="events per batched registration request")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds of each registration run")
    ap.add_argument("--requests", type=int, default=2000, help="trigger evaluations per kind, size and way")
    ap.add_argument("--instances", default="1,2",
                    help="service process counts for the HTTP registrations (the clients spread over them); "
                         "one serves the trigger latencies, as `bitlake serve` runs")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every measurement; medians")
    ap.add_argument("--shared-buffers", default="2GB")
    ap.add_argument("--quick", action="store_true", help="a smoke run: few events, tables, seconds and requests")
    ap.add_argument("--no-doc", action="store_true", help="do not touch docs/benchmarks.md")
    ap.add_argument("--note", action="append", default=[],
                    help="a line for the doc's notes (repeatable; with --render they replace the file's notes)")
    ap.add_argument("--render", metavar="JSON", help="only rewrite the doc section from a results file")
    ap.add_argument("--pure-python-http", action="store_true",
                    help="run uvicorn with --loop asyncio --http h11 even when uvloop and httptools are "
                         "installed (an A/B of its C-accelerated stack)")
    ap.add_argument("--stack-ab", action="store_true",
                    help="only the A/B of the service's CPU per request: uvloop + httptools against asyncio + h11")
    ap.add_argument("--wake-ab", action="store_true",
                    help="only uvicorn's CPU per request answering at once against after a wait (a bare ASGI app)")
    args = ap.parse_args(argv)
    if args.render:
        result = json.loads(Path(args.render).read_text())
        if args.note:  # kept with the figures they explain
            result["notes"] = args.note
            Path(args.render).write_text(json.dumps(result, indent=2) + "\n")
        if not args.no_doc:
            core.write_doc(markdown(result), SECTION)
        print(markdown(result))
        return 0
    if args.stack_ab:
        return stack_ab(args)
    if args.wake_ab:
        return wake_ab(args)
    plain_make = argv is None and len(sys.argv) == 1
    if args.quick:
        args.events, args.tables, args.duration, args.requests, args.rounds = "20000", 100, 2.0, 100, 1
        args.shared_buffers = "128MB"
    sizes = sorted(int(n) for n in args.events.split(","))
    args.instances = [int(n) for n in args.instances.split(",")]
    for n in sizes:
        if n % args.tables or (n // args.tables) % args.hits:
            raise SystemExit(f"--events {n}: needs a multiple of tables x hits ({args.tables * args.hits:,})")

    import fastapi
    import psycopg
    import pydantic
    import sqlalchemy
    import uvicorn

    from bitlake.triggers.store import TriggerStore

    date = dt.datetime.now(dt.UTC)
    started = time.perf_counter()
    code = code_version()  # at the start: the run imported this code
    pg = Postgres(args.shared_buffers)
    services: list[Service] = []
    try:
        pg.start()
        log(f"{pg.version} on port {pg.port}")
        db = "bitlake_bench"
        pg.create_database(db)
        with TriggerStore(pg.url(db)) as store:  # the store's own migrations make the schema
            producer = store.create_token("producer", ["bench.*"], name="bench producer")
            consumer = store.create_token("consumer", ["bench.*"], name="bench consumer")
        with pg.connect(db) as conn:
            conn.execute(f"CREATE TABLE {PGBENCH_TABLE} (LIKE events INCLUDING ALL)")
            conn.execute(f"CREATE SEQUENCE {PGBENCH_TABLE}_id OWNED BY {PGBENCH_TABLE}.event_id")
            conn.execute(f"ALTER TABLE {PGBENCH_TABLE} ALTER event_id SET DEFAULT nextval('{PGBENCH_TABLE}_id')")
        services = [Service(pg.url(db), pure_python=args.pure_python_http) for _ in range(max(args.instances))]
        for svc in services:
            svc.wait_ready()
        reg = registration(pg, db, services, producer, args)
        triggers = []
        have = 0
        for n in sizes:
            log(f"loading {n - have:,} events straight into PostgreSQL ({n:,} in all)")
            loaded = preload(pg, db, have=have, want=n, tables=args.tables, hits=args.hits)
            log(f"  {loaded['load_s']:.0f} s rows, {loaded['index_s']:.0f} s indexes, {loaded['vacuum_s']:.0f} s "
                f"vacuum; {loaded['total_bytes'] / 1e9:.2f} GB")
            have = n
            latency = trigger_latency(pg, db, services[0], consumer, events=n, tables=args.tables, hits=args.hits,
                                      requests=args.requests, rounds=args.rounds)
            triggers.append({"events": n, "preload": loaded, "latency": latency})
    finally:
        for svc in services:
            svc.stop()
        pg.stop()

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"triggers-{date.strftime('%Y-%m-%d')}{'-quick' if args.quick else ''}.json"
    result = {
        "benchmark": "triggers",
        "date": date.strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([".venv/bin/python", "benchmarks/triggers.py", *map(shlex.quote, sys.argv[1:])]),
        "plain_make": plain_make,
        "machine": machine(),
        "code": code,
        "postgres": pg.version,
        "versions": {"uvicorn": uvicorn.__version__, "fastapi": fastapi.__version__,
                     "sqlalchemy": sqlalchemy.__version__, "psycopg": psycopg.__version__,
                     "pydantic": pydantic.VERSION},
        "server": server_stack(args.pure_python_http),
        "config": {"events": sizes, "tables": args.tables, "hits": args.hits, "clients": args.clients,
                   "batch": args.batch, "duration": args.duration, "requests": args.requests,
                   "instances": args.instances, "rounds": args.rounds, "shared_buffers": args.shared_buffers,
                   "quick": args.quick, "trigger_client": "sockets"},
        "registration": reg,
        "triggers": triggers,
        "wall_s": time.perf_counter() - started,
        "notes": args.note,
        "json_path": str(out.relative_to(ROOT)),
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    section = markdown(result)
    print(section)
    if not args.no_doc:
        core.write_doc(section, SECTION)
    log(f"done in {result['wall_s']:.0f} s; {out}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
