"""What the concurrency and crash tests share: the table, the oracle, and running writer processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
from oracle import Oracle, Record, rows_key

import bitlake
from bitlake.format import commitlog

WRITER = Path(__file__).with_name("writer.py")
TABLE_SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("mod", pa.int64())])
INPUT_SCHEMA = pa.schema(list(TABLE_SCHEMA) + [pa.field("op", pa.string())])
# Generous: on a loaded 2-core machine one writer's first MetaGen alone can take half a minute.
SUBPROCESS_TIMEOUT = 600


def create(path, num_buckets: int = 4, properties: dict[str, str] | None = None) -> bitlake.Table:
    return bitlake.create_table(str(path), TABLE_SCHEMA, primary_key=["id"], delta_column="mod",
                                num_buckets=num_buckets, properties=properties)


def batch_table(rows: list[list]) -> pa.Table:
    """Rows ``[id, v, mod, op]`` as the input table of one batch."""
    records = [dict(zip(INPUT_SCHEMA.names, r, strict=True)) for r in rows]
    return pa.Table.from_pylist(records, schema=INPUT_SCHEMA)


def records(rows: list[list]) -> list[Record]:
    """Rows ``[id, v, mod, op]`` as the oracle's records."""
    return [Record((k,), d, op, {"id": k, "v": v, "mod": d} if op == "upsert" else None) for k, v, d, op in rows]


def oracle(batches: list[list[list]]) -> tuple[list[tuple], list[dict[str, int]]]:
    """The current view after applying ``batches`` (each a list of ``[id, v, mod, op]``) in order, as
    sorted ``(id, v, mod)`` tuples, and each batch's counts, by the project's model (tests/oracle.py)."""
    model = Oracle()
    counts = [model.apply(records(rows)) for rows in batches]
    return rows_key(model.view(), TABLE_SCHEMA.names), counts


RESTATEMENTS = ("REVERT", "REPLACE")


def applied_order(table: bitlake.Table) -> list[tuple[int, str]]:
    """(version, batch id) of every batch made visible by an ingest or a MetaGen, in the order the commit
    log applied them (the new incarnations of REPLACE commits left out)."""
    out = []
    for c in reversed(table.history()):
        if c["operation"] not in RESTATEMENTS:
            out.extend((c["version"], b) for b in c["processed"])
    return out


def arrow_rows(table: bitlake.Table, version: int | None = None) -> list[tuple]:
    t = table.to_arrow(version=version)
    return sorted(zip(*(t.column(c).to_pylist() for c in TABLE_SCHEMA.names), strict=True))


def spark_rows(table: bitlake.Table, spark) -> list[tuple]:
    return sorted(tuple(r) for r in table.to_spark(spark).select(*TABLE_SCHEMA.names).collect())


def change_counts(changes: list[tuple]) -> dict[str, int]:
    """The counts of a restatement (its change rows) from the oracle's change rows of its version."""
    kinds = [c[0] for c in changes]
    return {"inserted": kinds.count("insert"), "updated": kinds.count("update_preimage"),
            "deleted": kinds.count("delete"), "stale": 0, "ignored_deletes": 0}


def expected_view(table: bitlake.Table, batches: dict[str, list[list]], *,
                  replacements: dict[str, list[list]] | None = None,
                  tombstones: list[tuple[str, list]] | None = None) -> tuple[list[tuple], dict[tuple, dict]]:
    """The oracle applied in the commit log's order: every batch an ingest or a MetaGen made visible (its
    rows in ``batches``), every REVERT, every REPLACE (the new rows of a batch id in ``replacements``) and
    every TOMBSTONE (``tombstones``, ``(column, values)`` in commit order: it hides the rows of incarnations
    made live before its version whose column holds one of the values). Returns the sorted ``(id, v, mod)``
    rows of the current view, and the expected counts by ``(version, batch id)``: an applied batch's
    (``batch_counts``), a restatement's change rows (its commit's ``counts``)."""
    model = Oracle()
    hidden: list[tuple[int, str, list]] = []
    counts: dict[tuple, dict] = {}
    stones = list(tombstones or [])
    for c in reversed(table.history()):
        v, op, batch_id = c["version"], c["operation"], c["batch_id"]
        if op in RESTATEMENTS:
            seen = len(model.changes)
            if op == "REVERT":
                model.revert(batch_id, v)
            else:
                model.replace(batch_id, records((replacements or {})[batch_id]), v)
            counts[(v, batch_id)] = change_counts(model.changes[seen:])
        elif op == "TOMBSTONE":
            assert stones, f"an unexpected tombstone at version {v}"
            column, values = stones.pop(0)
            assert commitlog.read(table.io, v).parameters["column"] == column
            hidden.append((v, column, list(values)))
        else:
            for b in c["processed"]:
                counts[(v, b)] = model.apply(records(batches[b]), v, b)
    assert not stones, f"tombstones never committed: {stones}"
    live_at = {id(r.row): inc.version for inc in model.incarnations for r in inc.records if r.row is not None}
    rows = [r for r in model.view()
            if not any(live_at[id(r)] < w and r[column] in values for w, column, values in hidden)]
    return rows_key(rows, TABLE_SCHEMA.names), counts


def check_view(table: bitlake.Table, batches: dict[str, list[list]], spark, *,
               replacements: dict[str, list[list]] | None = None,
               tombstones: list[tuple[str, list]] | None = None) -> list[tuple]:
    """Asserts the table's current view (Arrow, and Spark unless ``spark`` is None) and its per-batch counts
    match the oracle applied in the commit log's order (:func:`expected_view`); returns the expected rows."""
    expected, counts = expected_view(table, batches, replacements=replacements, tombstones=tombstones)
    assert arrow_rows(table) == expected
    if spark is not None:
        assert spark_rows(table, spark) == expected
    restated = {c["version"]: c for c in table.history() if c["operation"] in RESTATEMENTS}
    for (version, batch_id), want in counts.items():
        if version in restated:
            got = restated[version]["counts"]
        else:
            got = commitlog.read(table.io, version).batch_counts[batch_id]
        assert got == want, f"counts of batch {batch_id} at version {version}"
    return expected


def check_log(table: bitlake.Table) -> list[dict]:
    """Asserts the commit log is gap-free from 0, no batch landed or became visible twice (a REPLACE's new
    incarnation aside), and every REVERT and REPLACE names a batch visible before it; returns the history
    oldest first."""
    history = list(reversed(table.history()))
    assert [c["version"] for c in history] == list(range(len(history)))
    assert table.version == len(history) - 1
    writes = [c for c in history if c["operation"] not in RESTATEMENTS]
    landed = [c["batch_id"] for c in writes if c["batch_id"] is not None]
    processed = [b for c in writes for b in c["processed"]]
    assert len(landed) == len(set(landed)), f"a batch landed twice: {landed}"
    assert len(processed) == len(set(processed)), f"a batch was applied twice: {processed}"
    assert set(processed) <= set(landed)
    for c in history:
        if c["operation"] in RESTATEMENTS:
            visible_before = {b for e in history[:c["version"]] for b in e["processed"]}
            assert c["batch_id"] in visible_before, f"version {c['version']} restates a batch never visible"
            want = [c["batch_id"]] if c["operation"] == "REPLACE" else []
            assert c["processed"] == want, c
    return history


def orphans(table: bitlake.Table) -> list[str]:
    """Unreferenced files other than segment-part claims, and other than the commits and checkpoints before a
    retention window (cleanup's dry run)."""
    from bitlake.format import layout

    def expired_log(p: str) -> bool:
        folder, name = p.rsplit("/", 1)
        return folder in (layout.COMMITS_DIR, layout.CHECKPOINTS_DIR) and not name.startswith(layout.TMP_PREFIX)

    return [p for p in table.cleanup(min_age_seconds=0, dry_run=True)
            if not p.startswith("_bitlake/parts/") and not expired_log(p)]


# ---------------------------------------------------------------------------------- writer processes


def writer_env(crash_at: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("BITLAKE_CRASH_AT", None)
    env.update({
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "BITLAKE_SHUFFLE_PARTITIONS": "2",
        "BITLAKE_DRIVER_MEMORY": "1g",
        "BITLAKE_SPARK_MASTER": "local[1]",
    })
    if crash_at is not None:
        env["BITLAKE_CRASH_AT"] = crash_at
    return env


class Writer:
    """One writer process running ``writer.py`` on a spec."""

    def __init__(self, workdir: Path, name: str, table_path, steps: list[dict], *,
                 crash_at: str | None = None, barrier: bool = False):
        self.name = name
        self.ack = workdir / f"{name}.ack"
        self.ready = workdir / f"{name}.ready"
        self.log = workdir / f"{name}.log"
        spec = {"table": str(table_path), "ack": str(self.ack), "steps": steps}
        if barrier:
            spec.update(ready=str(self.ready), go=str(workdir / "go"))
        self.started = time.monotonic()
        spec_path = workdir / f"{name}.json"
        spec_path.write_text(json.dumps(spec))
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, str(WRITER), str(spec_path)],
                                         env=writer_env(crash_at), stdout=log, stderr=subprocess.STDOUT,
                                         cwd=str(workdir))

    def wait(self, timeout: float = SUBPROCESS_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)  # writer.py dumps its Python stacks to its log
            time.sleep(2)
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"writer {self.name} timed out; its output:\n{self.output()}") from None

    def running(self) -> bool:
        """Whether the writer still runs; fails (with its stacks in the message) once it ran too long."""
        if self.proc.poll() is not None:
            return False
        if time.monotonic() - self.started > SUBPROCESS_TIMEOUT:
            self.wait(timeout=0)
        return True

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def acks(self) -> list[dict]:
        if not self.ack.exists():
            return []
        return [json.loads(line) for line in self.ack.read_text().splitlines() if line.strip()]


def release(workdir: Path, writers: list[Writer], timeout: float = SUBPROCESS_TIMEOUT) -> None:
    """Waits until every writer's SparkSession is up, then lets them all go at once."""
    deadline = time.monotonic() + timeout
    while not all(w.ready.exists() for w in writers):
        for w in writers:
            if w.proc.poll() is not None and not w.ready.exists():
                raise AssertionError(f"writer {w.name} exited with {w.proc.returncode}:\n{w.output()}")
        if time.monotonic() > deadline:
            for w in writers:
                w.proc.kill()
            raise AssertionError("writers never became ready")
        time.sleep(0.1)
    (workdir / "go").touch()


def run_all(writers: list[Writer]) -> None:
    """Waits for every writer and asserts each exited cleanly."""
    codes = [w.wait() for w in writers]
    for w, code in zip(writers, codes, strict=True):
        assert code == 0, f"writer {w.name} exited with {code}:\n{w.output()}"


def kill_all(writers: list[Writer]) -> None:
    """Teardown: kills (by pid) every writer of this test that is still running."""
    for w in writers:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait()
