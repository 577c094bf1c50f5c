"""Soak: the trigger service and the PostgreSQL mirror under load while their processes and PostgreSQL fail.

**The service** (:func:`soak_service`): a throwaway PostgreSQL, the service as ``uvicorn --factory
bitlake.triggers:create_app`` in a subprocess on a loopback port, ``producers`` threads registering commits
(1 to 4 events each, chained by ``prev_snapshot_id``, over ``tables`` tables) and ``consumers`` threads, each
a snapshot-trigger flow on every table (evaluate, "run", ack) that also evaluates a partition trigger on a random
partition each round, all through :class:`bitlake.triggers.Client`
and its retries. Every ``fault_every`` seconds one fault, in turn: the service SIGKILLed and started again;
PostgreSQL crashed (``pg_ctl stop -m immediate``, recovery at start); PostgreSQL restarted (``-m fast``);
every connection of the service terminated (``pg_terminate_backend``). After ``seconds`` the producers stop,
the consumers drain, and the checks run: every event a producer registered is in the database exactly once,
with the id the producer was answered; every flow fired over each table's events exactly once each, in
event-id order, each firing starting right after the previous ack; a partition trigger never went back
(fewer events than before, or events of another partition).

**The mirror** (:func:`soak_mirror`): a table written by ``writers`` threads (inserts, updates, deletes in
transactions of 1 to 5 statements, reconnecting after any failure) mirrored by :class:`PostgresMirror` in a
thread, while the mirror's connection is terminated and PostgreSQL crashed and restarted. At the end the
mirror catches up and its table is compared with the database's, row for row; no batch is applied twice.

Figures: events/s held over the whole run (faults included), request latency p50/p99 outside and during
faults, and each fault's recovery time (from the fault to every producer registering again; for the mirror,
to its next step that applied changes).

    .venv/bin/python benchmarks/soak.py                 # what `make bench-soak` runs (about 2 minutes)
    .venv/bin/python benchmarks/soak.py --seconds 120   # longer

tests/triggers/test_soak.py and tests/test_mirror_restarts.py run the same functions, shorter.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime as dt
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import core  # noqa: E402
from bitlake.triggers.pgserver import PostgresServer, free_port  # noqa: E402

SERVICE_FAULTS = ("service-kill", "postgres-crash", "terminate-connections", "postgres-restart")
MIRROR_FAULTS = ("terminate-connection", "postgres-crash", "postgres-restart")
# fsync off: the soak crashes PostgreSQL, never the machine, so what reached the OS survives. synchronous_commit
# stays on: off, a crash loses commits the service already answered (the first soak lost events and acks so).
PG_SETTINGS = {"fsync": "off", "full_page_writes": "off"}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclasses.dataclass
class Fault:
    kind: str
    started: float
    ended: float = 0.0  # when the fault's action finished (the process or the server is back)
    recovered: float | None = None  # when the system worked again (see the soak functions)

    seen: dict[str, int] = dataclasses.field(default_factory=dict)  # what the clients' retries met, by kind

    def as_dict(self, t0: float) -> dict:
        return {"kind": self.kind, "at_s": round(self.started - t0, 2), "action_s": round(self.ended - self.started, 2),
                "recovery_s": None if self.recovered is None else round(self.recovered - self.started, 2),
                "clients_saw": self.seen}


class ServiceProcess:
    """The service in a subprocess on a fixed loopback port, so that a restart comes back at the same address."""

    def __init__(self, db_url: str, work: Path):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = dict(os.environ, BITLAKE_TRIGGERS_DB_URL=db_url)
        self.log = (work / "service.log").open("ab")
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "bitlake.triggers:create_app", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning", "--no-access-log"],
            env=self.env, cwd=ROOT, stdout=self.log, stderr=self.log)
        core.wait_for_health(self.process, self.base_url, timeout, interval=0.05)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        self.kill()
        self.log.close()


def _terminate(server: PostgresServer, where: str) -> int:
    """Terminates the server processes of the connections ``where`` selects (SQL on pg_stat_activity)."""
    with server.connect() as conn:
        rows = conn.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {where} "
                            "AND pid <> pg_backend_pid()").fetchall()
    return len(rows)


def _inject(kinds: tuple[str, ...], every: float, seconds: float, act: Callable[[str], None]) -> list[Fault]:
    """Faults of ``kinds`` in turn, one every ``every`` seconds (``act`` makes one), on a thread, for ``seconds``
    (a fault under way then ends first); returns them."""
    faults: list[Fault] = []
    stop = threading.Event()

    def loop() -> None:
        i = 0
        while not stop.wait(every):
            fault = Fault(kinds[i % len(kinds)], time.monotonic())
            act(fault.kind)
            fault.ended = time.monotonic()
            faults.append(fault)
            i += 1

    thread = threading.Thread(target=loop, name="faults")
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    return faults


# ------------------------------------------------------------------------------------------ the service


@dataclasses.dataclass
class Call:
    who: str
    started: float
    ended: float


def soak_service(*, producers: int = 3, consumers: int = 2, tables: int = 3, seconds: float = 40.0,
                 fault_every: float = 5.0, faults: tuple[str, ...] = SERVICE_FAULTS, max_commits: int = 1_000_000,
                 retry_seconds: float = 120, seed: int = 7, log: Callable[[str], None] = print) -> dict:
    """Runs the service's soak (module docstring); returns its figures and ``problems`` (empty: all checks held)."""
    from bitlake.triggers import Client
    from bitlake.triggers.client import Retry
    from bitlake.triggers.store import TriggerStore

    work = Path(tempfile.mkdtemp(prefix="bitlake-soak-"))
    server = PostgresServer({**PG_SETTINGS, "max_connections": "100"}, stop_mode="immediate").start()
    service = None
    result: dict | None = None
    try:
        db_url = server.create_database("soak")
        with TriggerStore(db_url) as store:
            producer_token = store.create_token("producer", ["soak.*"], name="soak producers")
            consumer_token = store.create_token("consumer", ["soak.*"], name="soak consumers")
        service = ServiceProcess(db_url, work)
        service.start()
        names = [f"soak.t{i}" for i in range(tables)]
        retry = Retry(deadline=retry_seconds, backoff=0.05, max_backoff=1.0)  # 0: no retries (to compare)
        stop_producing = threading.Event()
        calls: list[Call] = []
        registered: dict[tuple, int] = {}  # (table, partition, snapshot id) -> event id answered
        answers = {"created": 0, "existing": 0}
        errors: list[str] = []
        attempts = [0]
        retries: list[tuple[float, str]] = []  # (when, what failed: a status or an httpx error) of every retry
        lock = threading.Lock()

        def note(what, _wait: float) -> None:
            retries.append((time.monotonic(), str(what) if isinstance(what, int) else type(what).__name__))

        def produce(p: int) -> None:
            rng = random.Random(seed * 1000 + p)
            prev: dict[str, str | None] = {t: None for t in names}
            try:
                with Client(service.base_url, producer_token, timeout=10, retry=retry, on_retry=note) as client:
                    for k in range(max_commits):
                        if stop_producing.is_set():
                            break
                        table = names[rng.randrange(tables)]
                        snapshot = f"p{p}-{k}"
                        events = [{"table": table, "partition": [f"2026-01-{d:02d}"], "snapshot_id": snapshot,
                                   "prev_snapshot_id": prev[table], "table_format": "BITLAKE",
                                   "operation_type": "APPEND", "tags": {"producer": str(p)}}
                                  for d in rng.sample(range(1, 29), rng.randint(1, 4))]
                        started = time.monotonic()
                        out = client.register(events)
                        ended = time.monotonic()
                        prev[table] = snapshot
                        with lock:
                            calls.append(Call(f"producer {p}", started, ended))
                            for r in out:
                                registered[(r.event.table, tuple(r.event.partition or ()), r.event.snapshot_id)] = \
                                    r.event.event_id
                                answers["created" if r.created else "existing"] += 1
                    with lock:
                        attempts[0] += client.attempts
            except Exception as e:  # noqa: BLE001 - reported as a problem
                errors.append(f"producer {p}: {type(e).__name__}: {e}")

        fired: dict[tuple[str, str], list[list[int]]] = {}  # (flow, table) -> the event ids of each firing
        acked: dict[tuple[str, str], int] = {}
        targets: dict[str, int] = {}  # table -> the last event id, once the producers stopped
        drained = threading.Event()

        def consume(c: int) -> None:
            flow = f"flow{c}"
            rng = random.Random(seed * 1000 + 500 + c)
            seen_in: dict[tuple[str, str], int] = {}  # (table, day) -> events the partition trigger returned
            client = Client(service.base_url, consumer_token, timeout=10, retry=retry, on_retry=note)
            try:
                with client:
                    while not drained.is_set():
                        # A partition trigger too: once a partition's events are there, they stay there.
                        table, day = names[rng.randrange(tables)], f"2026-01-{rng.randint(1, 28):02d}"
                        started = time.monotonic()
                        part = client.partition_trigger(table, [day])
                        with lock:
                            calls.append(Call(f"consumer {c}", started, time.monotonic()))
                        count = len(part.events)
                        if count < seen_in.get((table, day), 0) or part.fired != bool(count) or any(
                                e.partition != [day] for e in part.events):
                            errors.append(f"the partition trigger on {table} {day} answered {count} events "
                                          f"(fired {part.fired}) after {seen_in.get((table, day))}")
                        seen_in[(table, day)] = max(count, seen_in.get((table, day), 0))
                        idle = True
                        for table in names:
                            started = time.monotonic()
                            result = client.snapshot_trigger(flow, table, limit=200)
                            if result.fired:
                                idle = False
                                ids = [e.event_id for e in result.events]
                                if ids[0] <= result.cursor.last_event_id:
                                    errors.append(f"{flow} on {table} fired {ids[0]} at or before its cursor "
                                                  f"{result.cursor.last_event_id}")
                                client.ack(flow, table, ids[-1])
                                with lock:
                                    fired.setdefault((flow, table), []).append(ids)
                                    acked[(flow, table)] = ids[-1]
                            with lock:
                                calls.append(Call(f"consumer {c}", started, time.monotonic()))
                        if targets and all(acked.get((flow, t), 0) >= targets[t] for t in names if targets[t]):
                            return
                        if idle:
                            time.sleep(0.05)
            except Exception as e:  # noqa: BLE001 - reported as a problem
                errors.append(f"consumer {c}: {type(e).__name__}: {e}")
            finally:
                with lock:
                    attempts[0] += client.attempts

        def act(kind: str) -> None:
            log(f"  fault: {kind}")
            if kind == "service-kill":
                service.kill()
                service.start()
            elif kind == "postgres-crash":
                server.restart("immediate", pause=0.5)
            elif kind == "postgres-restart":
                server.restart("fast")
            elif kind == "terminate-connections":
                _terminate(server, "datname = 'soak'")
            else:
                raise ValueError(kind)

        threads = [threading.Thread(target=produce, args=(p,), name=f"producer-{p}") for p in range(producers)]
        threads += [threading.Thread(target=consume, args=(c,), name=f"consumer-{c}") for c in range(consumers)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        injected = _inject(faults, fault_every, seconds, act)
        stop_producing.set()
        for t in threads[:producers]:
            t.join()
        produced_until = time.monotonic()
        with TriggerStore(db_url) as store, store.engine.connect() as conn:
            from sqlalchemy import text

            rows = conn.execute(text("SELECT table_name, partition_json, snapshot_id, event_id FROM events")).all()
        by_table: dict[str, list[int]] = {t: [] for t in names}
        stored: dict[tuple, int] = {}
        for table, partition, snapshot, event_id in rows:
            by_table[table].append(event_id)
            stored[(table, tuple(json.loads(partition) or ()), snapshot)] = event_id
        for t in names:
            by_table[t].sort()
        targets.update({t: by_table[t][-1] if by_table[t] else 0 for t in names})  # at once: consumers read it
        for t in threads[producers:]:
            t.join(timeout=120)
        drained.set()
        for t in threads[producers:]:
            t.join(timeout=30)
        problems = list(errors)
        if len(rows) != len(stored):
            problems.append(f"{len(rows) - len(stored)} duplicate events in the store")
        if stored != registered:
            lost = set(registered) - set(stored)
            extra = set(stored) - set(registered)
            moved = [k for k in set(stored) & set(registered) if stored[k] != registered[k]]
            problems.append(f"store and producers disagree: {len(lost)} lost, {len(extra)} never answered, "
                            f"{len(moved)} with another id")
        for c in range(consumers):
            for t in names:
                ranges = fired.get((f"flow{c}", t), [])
                seen = [i for r in ranges for i in r]
                if seen != by_table[t]:
                    problems.append(f"flow{c} on {t}: fired {len(seen)} events ({len(set(seen))} distinct) of "
                                    f"{len(by_table[t])}")
        # Recovery: from the fault until every producer got a registration through after the fault's action
        # (the service or the database back).
        for f in injected:
            after = [min((c.ended for c in calls if c.who == f"producer {p}" and c.ended > f.ended),
                         default=None) for p in range(producers)]
            f.recovered = None if None in after else max(a for a in after if a is not None)
        windows = [(f.started, f.recovered or f.ended) for f in injected]
        for f, (start, end) in zip(injected, windows, strict=True):
            f.seen = dict(collections.Counter(what for at, what in retries if start <= at <= end + 1))
        quiet_retries = collections.Counter(what for at, what in retries
                                            if not any(start <= at <= end + 1 for start, end in windows))
        produce_calls = [c for c in calls if c.who.startswith("producer")]

        def during(c: Call) -> bool:
            return any(c.started < end and c.ended > start for start, end in windows)

        faulty = [(c.ended - c.started) * 1000 for c in produce_calls if during(c)]
        quiet = [(c.ended - c.started) * 1000 for c in produce_calls if not during(c)]
        recoveries = [f.recovered - f.started for f in injected if f.recovered is not None]
        result = {
            "producers": producers, "consumers": consumers, "tables": tables, "seconds": round(produced_until - t0, 1),
            "events": len(stored), "commits": len(produce_calls), "attempts": attempts[0],
            "answers": answers, "events_per_s": round(len(stored) / (produced_until - t0), 1),
            "firings": sum(len(v) for v in fired.values()),
            "latency_ms": {"quiet_p50": percentile(quiet, 0.5), "quiet_p99": percentile(quiet, 0.99),
                           "faults_p50": percentile(faulty, 0.5), "faults_p99": percentile(faulty, 0.99),
                           "max": max(quiet + faulty, default=None)},
            "recovery_s": {"max": round(max(recoveries), 2) if recoveries else None,
                           "by_kind": {k: round(max((f.recovered - f.started for f in injected
                                                     if f.kind == k and f.recovered), default=0), 2)
                                       for k in faults}},
            "retries_outside_faults": dict(quiet_retries),
            "faults": [f.as_dict(t0) for f in injected], "problems": problems,
        }
        if any(f.recovered is None for f in injected):
            problems.append("a fault after which some producer never registered again")
        if problems:
            result["work"] = str(work)  # the service's log, kept to look into
        return result
    finally:
        if service is not None:
            service.stop()
        server.stop()
        if result is not None and not result["problems"]:  # else kept to look into
            shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------ the mirror


def soak_mirror(*, writers: int = 2, rows: int = 2000, seconds: float = 30.0, fault_every: float = 5.0,
                faults: tuple[str, ...] = MIRROR_FAULTS, seed: int = 7, log: Callable[[str], None] = print) -> dict:
    """Runs the mirror's soak (module docstring); returns its figures and ``problems`` (empty: all checks held)."""
    import psycopg

    import bitlake
    from bitlake.mirror import PostgresMirror

    work = Path(tempfile.mkdtemp(prefix="bitlake-soak-mirror-"))
    server = PostgresServer({**PG_SETTINGS, "wal_level": "logical", "max_replication_slots": "4",
                             "max_wal_senders": "4"}, stop_mode="immediate").start()
    result: dict | None = None
    try:
        with server.connect() as conn:
            conn.execute("CREATE TABLE soak (id int PRIMARY KEY, v bigint NOT NULL, note text)")
            conn.execute("INSERT INTO soak SELECT i, 0, 'row ' || i FROM generate_series(1, %s) i", (rows,))
        path = str(work / "soak")
        stop_writing, stop_mirror = threading.Event(), threading.Event()
        errors: list[str] = []
        steps: list[tuple[float, int]] = []  # (time, changes) of each mirror step that applied changes
        transactions = [0]
        lock = threading.Lock()

        def write(w: int) -> None:
            rng = random.Random(seed * 1000 + w)
            next_id = rows + 1 + w * 10_000_000
            conn = None
            while not stop_writing.is_set():
                try:
                    if conn is None or conn.closed:
                        conn = psycopg.connect(server.dsn(), autocommit=False, connect_timeout=5)
                    for _ in range(rng.randint(1, 5)):
                        op = rng.random()
                        if op < 0.6:
                            conn.execute("UPDATE soak SET v = v + 1, note = %s WHERE id = %s",
                                         (f"w{w}", rng.randint(1, next_id)))
                        elif op < 0.85:
                            conn.execute("INSERT INTO soak VALUES (%s, 0, %s)", (next_id, f"new w{w}"))
                            next_id += 1
                        else:
                            conn.execute("DELETE FROM soak WHERE id = %s", (rng.randint(1, next_id),))
                    conn.commit()
                    with lock:
                        transactions[0] += 1
                except psycopg.OperationalError:  # the server restarting, the connection cut: the outcome
                    if conn is not None:          # does not matter, the end compares with the database
                        conn.close()
                    conn = None
                    time.sleep(0.1)
            if conn is not None:
                conn.close()

        mirror = PostgresMirror(server.dsn(), "public.soak", path, batch_changes=2000, reconnect_seconds=120,
                                progress=lambda p: p.changes and steps.append((time.monotonic(), p.changes)))

        def run_mirror() -> None:
            try:
                mirror.run(interval=0.1, stop=stop_mirror)
            except Exception as e:  # noqa: BLE001 - reported as a problem
                errors.append(f"mirror: {type(e).__name__}: {e}")

        def act(kind: str) -> None:
            log(f"  fault: {kind}")
            if kind == "terminate-connection":
                if not _terminate(server, "application_name = 'bitlake-mirror'"):
                    log("    (the mirror had no connection open)")
            elif kind == "postgres-crash":
                server.restart("immediate", pause=0.5)
            elif kind == "postgres-restart":
                server.restart("fast")
            else:
                raise ValueError(kind)

        threads = [threading.Thread(target=write, args=(w,), name=f"writer-{w}") for w in range(writers)]
        mirror_thread = threading.Thread(target=run_mirror, name="mirror")
        t0 = time.monotonic()
        mirror_thread.start()
        for t in threads:
            t.start()
        injected = _inject(faults, fault_every, seconds, act)
        stop_writing.set()
        for t in threads:
            t.join()
        written_until = time.monotonic()
        stop_mirror.set()
        mirror_thread.join(timeout=120)
        caught_up_from = time.monotonic()
        mirror.run(interval=0.1, until_caught_up=True)
        catch_up = time.monotonic() - caught_up_from
        mirror.close()
        table = bitlake.open_table(path)
        with server.connect() as conn:
            expected = sorted(conn.execute("SELECT id, v, note FROM soak").fetchall())
        got = sorted((r["id"], r["v"], r["note"]) for r in table.to_arrow().to_pylist())
        problems = list(errors)
        if got != expected:
            gk, ek = {r[0]: r for r in got}, {r[0]: r for r in expected}
            problems.append(f"the lake differs from the database: {len(set(ek) - set(gk))} rows missing, "
                            f"{len(set(gk) - set(ek))} extra, {sum(gk[k] != ek[k] for k in set(gk) & set(ek))} "
                            "with other values")
        ids = [h["batch_id"] for h in table.history() if h["batch_id"]]
        if len(ids) != len(set(ids)):
            problems.append("a batch applied twice")
        for f in injected:
            f.recovered = min((at for at, _ in steps if at > f.ended), default=None)
        recoveries = [f.recovered - f.started for f in injected if f.recovered is not None]
        applied = sum(n for _, n in steps)
        result = {
            "writers": writers, "seconds": round(written_until - t0, 1), "transactions": transactions[0],
            "rows": len(expected), "changes_applied": applied, "batches": len(ids),
            "changes_per_s": round(applied / (written_until - t0), 1), "final_catch_up_s": round(catch_up, 2),
            "recovery_s": {"max": round(max(recoveries), 2) if recoveries else None,
                           "by_kind": {k: round(max((f.recovered - f.started for f in injected
                                                     if f.kind == k and f.recovered), default=0), 2)
                                       for k in faults}},
            "faults": [f.as_dict(t0) for f in injected], "problems": problems,
        }
        if problems:
            result["work"] = str(work)  # the lake table, kept to look into
        return result
    finally:
        server.stop()
        if result is not None and not result["problems"]:  # else kept to look into
            shutil.rmtree(work, ignore_errors=True)


def summary(service: dict | None, mirror: dict | None) -> list[str]:
    """The figures as the lines of docs/benchmarks.md's section."""
    lines = []
    if service is not None:
        lat, rec = service["latency_ms"], service["recovery_s"]
        kinds = ", ".join(f"{k} {v} s" for k, v in rec["by_kind"].items())
        lines.append(
            f"- Service: {service['producers']} producers, {service['consumers']} consumers, "
            f"{service['tables']} tables, {service['seconds']} s, {len(service['faults'])} faults: "
            f"**{service['events_per_s']:,} events/s held** ({service['events']:,} events in "
            f"{service['commits']:,} registrations, {service['attempts']:,} attempts, "
            f"{service['answers']['existing']} answered as already registered); registration latency p50/p99 "
            f"{lat['quiet_p50']:.1f}/{lat['quiet_p99']:.1f} ms outside faults, "
            f"{lat['faults_p50']:.0f}/{lat['faults_p99']:.0f} ms during them; recovery (every producer registering "
            f"again) at most **{rec['max']} s** ({kinds}). Checks: "
            + ("all held" if not service["problems"] else "; ".join(service["problems"])))
    if mirror is not None:
        rec = mirror["recovery_s"]
        kinds = ", ".join(f"{k} {v} s" for k, v in rec["by_kind"].items())
        lines.append(
            f"- Mirror: {mirror['writers']} writers, {mirror['seconds']} s, {len(mirror['faults'])} faults: "
            f"**{mirror['changes_per_s']:,} changes/s held** ({mirror['changes_applied']:,} changes in "
            f"{mirror['batches']} batches, {mirror['transactions']:,} transactions); recovery (the next step that "
            f"applied changes) at most **{rec['max']} s** ({kinds}); final catch-up {mirror['final_catch_up_s']} s. "
            "Checks: " + ("the lake table equals the database's, no batch twice" if not mirror["problems"]
                          else "; ".join(mirror["problems"])))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--fault-every", type=float, default=5)
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--consumers", type=int, default=2)
    ap.add_argument("--only", choices=["service", "mirror"])
    args = ap.parse_args(argv)
    service = mirror = None
    if args.only in (None, "service"):
        print(f"service soak: {args.seconds:g} s, a fault every {args.fault_every:g} s", flush=True)
        service = soak_service(producers=args.producers, consumers=args.consumers, seconds=args.seconds,
                               fault_every=args.fault_every)
    if args.only in (None, "mirror"):
        print(f"mirror soak: {args.seconds:g} s, a fault every {args.fault_every:g} s", flush=True)
        mirror = soak_mirror(seconds=args.seconds, fault_every=args.fault_every)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d-%H%M")
    out = ROOT / "benchmarks" / "results" / f"soak-{stamp}.json"
    out.write_text(json.dumps({"date": stamp, "command": "benchmarks/soak.py " + " ".join(argv or sys.argv[1:]),
                               "service": service, "mirror": mirror}, indent=2) + "\n")
    print("\n".join(summary(service, mirror)))
    print(f"raw results: {out.relative_to(ROOT)}")
    return 1 if (service and service["problems"]) or (mirror and mirror["problems"]) else 0


if __name__ == "__main__":
    sys.exit(main())
