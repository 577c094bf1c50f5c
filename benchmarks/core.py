"""The core benchmark: ingestion (wall time, bytes written, write amplification) and current-view scans.

TPC-H ``lineitem`` (from ``tpchgen-cli``) keyed by ``(l_orderkey, l_linenumber)`` with an integer delta
column ``l_delta`` (0 for the base, ``k`` for change batch ``k``). The run:

1. ingests the base, then change batches of 0.1 %, 1 % and 10 % of the base rows, each made of 95 %
   updates of random existing keys (``l_quantity + 1``), new keys beyond the largest ``l_orderkey``, and
   a few deletes (0.1 % of the batch, at least one);
2. per batch measures the wall time of ``Table.ingest``, every byte it added under the table path
   (a walk of the table folder before and after) and the write amplification: those bytes over the
   size of the batch alone written as one Parquet file with the same codec (snappy) in the same run;
3. after the base, after the 1 % batch and after the 10 % batch, times a full aggregate over all
   columns of the current view against plain Spark reading the same committed data files without
   filtering: one warm-up each, then ``--runs`` interleaved runs, medians compared.

Results go to ``benchmarks/results/core-<date>-sf<sf>.json`` and to the section
"## Core: ingestion and current-view scan" of ``docs/benchmarks.md`` (other sections are kept).

    .venv/bin/python benchmarks/core.py --scale-factor 1      # what `make bench` runs
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "benchmarks" / "data"
WORK_DIR = ROOT / "benchmarks" / "work"
RESULTS_DIR = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Core: ingestion and current-view scan"

PRIMARY_KEY = ["l_orderkey", "l_linenumber"]
DELTA = "l_delta"
OP = "op"
CODEC = "snappy"
BATCHES = [("0.1 %", 0.001), ("1 %", 0.01), ("10 %", 0.10)]
UPDATE_SHARE = 0.95
DELETE_SHARE = 0.001
SCAN_AFTER = ("base", "1 %", "10 %")
WRITE_AMP_TARGET = 5.0
SCAN_TARGET = 0.85


def sf_text(sf: float) -> str:
    return f"{sf:g}"


def log(msg: str) -> None:
    print(f"[{dt.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------------ data


def tpchgen() -> str:
    local = Path(sys.executable).parent / "tpchgen-cli"
    found = str(local) if local.exists() else shutil.which("tpchgen-cli")
    if not found:
        sys.exit("tpchgen-cli is missing: .venv/bin/pip install -e '.[bench]' (or pip install tpchgen-cli)")
    return found


def lineitem(sf: float) -> Path:
    """The generated lineitem Parquet file, cached in benchmarks/data/sf<sf>/ across runs."""
    folder = DATA_DIR / f"sf{sf_text(sf)}"
    target = folder / "lineitem.parquet"
    if target.exists():
        return target
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    log(f"generating TPC-H lineitem at SF {sf_text(sf)} with tpchgen-cli")
    subprocess.run(
        [tpchgen(), "parquet", "-s", sf_text(sf), "--tables=lineitem", f"--output-dir={tmp}", "--quiet"],
        check=True,
    )
    folder.mkdir(parents=True, exist_ok=True)
    os.replace(tmp / "lineitem.parquet", target)
    shutil.rmtree(tmp, ignore_errors=True)
    return target


def table_schema(source: pa.Schema) -> pa.Schema:
    """lineitem's columns as the table stores them (plain strings, nullable as Spark reads them) + l_delta."""
    fields = []
    for f in source:
        t = f.type
        if pa.types.is_string_view(t) or pa.types.is_large_string(t):
            t = pa.string()
        fields.append(pa.field(f.name, t, True))
    return pa.schema(fields + [pa.field(DELTA, pa.int32(), True)])


def load_base(path: Path) -> pa.Table:
    raw = pq.read_table(path)
    schema = table_schema(raw.schema)
    return pa.Table.from_arrays(base_columns(raw, schema), schema=schema)


def base_columns(raw: pa.Table | pa.RecordBatch, schema: pa.Schema) -> list:
    """The generator's ``raw`` rows as the columns of ``schema`` (:func:`table_schema`): cast, delta 0."""
    columns = [raw.column(f.name).cast(f.type) for f in schema if f.name != DELTA]
    columns.append(pa.array(np.zeros(raw.num_rows, dtype=np.int32)))
    return columns


def fresh_work(name: str) -> Path:
    """An empty work folder ``benchmarks/work/<name>`` (what a previous run left there is removed)."""
    work = WORK_DIR / name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def write_parquet(table: pa.Table, path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression=CODEC)
    return path.stat().st_size


class ChangeMaker:
    """Builds change batches: updates and deletes of random live base keys, inserts of new keys."""

    def __init__(self, base: pa.Table, seed: int):
        self.base = base
        self.rng = np.random.default_rng(seed)
        self.deleted = np.zeros(base.num_rows, dtype=bool)
        self.next_orderkey = int(pc.max(base.column("l_orderkey")).as_py()) + 1
        self.schema = base.schema

    def make(self, k: int, fraction: float) -> tuple[pa.Table, dict[str, int]]:
        n = max(3, round(fraction * self.base.num_rows))
        deletes = max(1, round(DELETE_SHARE * n))
        updates = round(UPDATE_SHARE * n)
        inserts = n - updates - deletes
        live = np.flatnonzero(~self.deleted)
        chosen = self.rng.choice(live, size=updates + deletes, replace=False)
        upd_idx, del_idx = np.sort(chosen[:updates]), np.sort(chosen[updates:])
        self.deleted[del_idx] = True

        upd = self.base.take(pa.array(upd_idx))
        qty = upd.column("l_quantity")
        one = pa.scalar(Decimal("1.00"), qty.type)
        upd = upd.set_column(upd.schema.get_field_index("l_quantity"), "l_quantity",
                             pc.add(qty, one).cast(qty.type))

        ins = self.base.take(pa.array(self.rng.integers(0, self.base.num_rows, size=inserts)))
        keys = np.arange(self.next_orderkey, self.next_orderkey + inserts, dtype=np.int64)
        self.next_orderkey += inserts
        ins = ins.set_column(ins.schema.get_field_index("l_orderkey"), "l_orderkey", pa.array(keys))
        ins = ins.set_column(ins.schema.get_field_index("l_linenumber"), "l_linenumber",
                             pa.array(np.ones(inserts, dtype=np.int32)))

        dele = self.base.take(pa.array(del_idx))
        parts = []
        for table, op in ((upd, "upsert"), (ins, "upsert"), (dele, "delete")):
            table = table.set_column(table.schema.get_field_index(DELTA), DELTA,
                                     pa.array(np.full(table.num_rows, k, dtype=np.int32)))
            table = table.append_column(OP, pa.array([op] * table.num_rows, pa.string()))
            parts.append(table.cast(self.schema.append(pa.field(OP, pa.string(), True))))
        batch = pa.concat_tables(parts)
        batch = batch.take(pa.array(self.rng.permutation(batch.num_rows)))  # a change stream is unordered
        return batch, {"records": n, "updates": updates, "inserts": inserts, "deletes": deletes}


# ------------------------------------------------------------------------------------- measuring


# Files up to this size are fingerprinted by a snapshot, so that one that only grew is told apart from one
# rewritten: an appended file (RocksDB's LOG and MANIFEST) counts the bytes appended, not its whole size.
APPEND_CHECK_BYTES = 1 << 20


class Snapshot(dict):
    """A folder's files: relative path -> size; ``digests`` holds the SHA-1 of each small file's content."""

    def __init__(self, base: Path):
        super().__init__()
        self.base = base
        self.digests: dict[str, bytes] = {}

    def digest_of_start(self, rel: str, size: int) -> bytes | None:
        """The SHA-1 of the first ``size`` bytes of ``rel`` now; None when it is gone."""
        try:
            with open(os.path.join(self.base, rel), "rb") as f:
                return hashlib.sha1(f.read(size)).digest()
        except FileNotFoundError:
            return None


def snapshot(base: Path) -> Snapshot:
    out = Snapshot(base)
    for dirpath, _, names in os.walk(base):
        for name in names:
            p = os.path.join(dirpath, name)
            with contextlib.suppress(FileNotFoundError):
                rel = os.path.relpath(p, base)
                out[rel] = os.path.getsize(p)
                if out[rel] <= APPEND_CHECK_BYTES:
                    digest = out.digest_of_start(rel, out[rel])
                    if digest is not None:
                        out.digests[rel] = digest
    return out


def category(rel: str) -> str:
    parts = rel.split(os.sep)
    if parts[0] == "data":
        return "data"
    if parts[0] == "_bitlake" and len(parts) > 1:
        return {"keys": "keys", "logs": "logs", "bitmaps": "bitmaps", "keystore": "keystore", "index": "index",
                "commits": "commits", "checkpoints": "commits", "parts": "commits"}.get(parts[1], "other")
    return "other"


def written_between(before: Snapshot, after: Snapshot) -> tuple[int, dict[str, int], int]:
    """Bytes of files that are new or changed in ``after`` (for a file that only grew, what was appended); by
    category; number of files."""
    by_cat: dict[str, int] = {}
    files = 0
    for rel, size in after.items():
        old = before.get(rel)
        if old == size:
            continue
        files += 1
        appended = old is not None and size > old and rel in before.digests and \
            after.digest_of_start(rel, old) == before.digests[rel]
        written = size - old if appended else size
        by_cat[category(rel)] = by_cat.get(category(rel), 0) + written
    return sum(by_cat.values()), dict(sorted(by_cat.items())), files


class PhaseTimer:
    """Times bitlake's ingestion steps (by default landing and MetaGen, either way) by wrapping the functions that
    run them."""

    def __init__(self):
        self.times: dict[str, float] = {}

    @staticmethod
    def ingestion_steps() -> list[tuple[object, str, str]]:
        from bitlake import batches

        return [(batches, "land", "landing"),  # any landing: a Spark job or the driver's
                (batches, "_run", "metagen")]

    @contextlib.contextmanager
    def installed(self, steps: list[tuple[object, str, str]] | None = None):
        """Wraps each (owner, attribute name, label) of ``steps`` (default :meth:`ingestion_steps`) while open."""
        steps = self.ingestion_steps() if steps is None else steps
        originals = [(owner, name, getattr(owner, name)) for owner, name, _ in steps]

        def wrap(label, fn):
            def timed(*a, **kw):
                t0 = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    self.times[label] = self.times.get(label, 0.0) + time.perf_counter() - t0
            return timed

        for owner, name, label in steps:
            setattr(owner, name, wrap(label, getattr(owner, name)))
        try:
            yield self
        finally:
            for owner, name, fn in originals:
                setattr(owner, name, fn)

    def take(self) -> dict[str, float]:
        out, self.times = self.times, {}
        return out


class Windows:
    """Named spans of wall-clock time; Spark jobs are attributed to the span they were submitted in
    (the driver runs one thing at a time, and broadcast jobs run under their own job group)."""

    def __init__(self):
        self.spans: list[tuple[str, float, float]] = []

    @contextlib.contextmanager
    def span(self, name: str):
        start = time.time() * 1000
        try:
            yield
        finally:
            self.spans.append((name, start, time.time() * 1000))

    def executor_times(self, event_log: Path) -> dict[str, dict[str, float]]:
        """Per span: executor CPU seconds and task run seconds, summed over its jobs' tasks, from the
        event log. JVM task time only: Python workers (landing, MetaGen writers, the invalid-row
        expansion of a read) count in wall time but not here."""
        job_span: dict[int, str] = {}
        stage_span: dict[int, str] = {}
        out = {name: {"executor_cpu_s": 0.0, "task_run_s": 0.0, "tasks": 0} for name, _, _ in self.spans}
        with open(event_log) as f:
            for line in f:
                e = json.loads(line)
                kind = e.get("Event")
                if kind == "SparkListenerJobStart":
                    at = e["Submission Time"]
                    name = next((n for n, a, b in self.spans if a <= at <= b), None)
                    if name is not None:
                        job_span[e["Job ID"]] = name
                        for sid in e.get("Stage IDs", []):
                            stage_span[sid] = name
                elif kind == "SparkListenerTaskEnd" and e.get("Stage ID") in stage_span:
                    m = e.get("Task Metrics") or {}
                    d = out[stage_span[e["Stage ID"]]]
                    d["executor_cpu_s"] += m.get("Executor CPU Time", 0) / 1e9
                    d["task_run_s"] += m.get("Executor Run Time", 0) / 1e3
                    d["tasks"] += 1
        return out


def wait_for_health(process: subprocess.Popen, base_url: str, timeout: float = 60, interval: float = 0.1) -> None:
    """Waits until the trigger service ``process`` started answers ``/health`` at ``base_url``; raises when it
    exits or does not answer within ``timeout`` seconds."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the service exited with {process.returncode}")
        try:
            if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the service did not answer /health in time")
        time.sleep(interval)


def processes() -> tuple[dict[int, tuple[int, str, int]], dict[int, list[int]]]:
    """The machine's processes now, as {pid: (parent, command, resident bytes)}, and each one's children."""
    page = os.sysconf("SC_PAGE_SIZE")
    procs: dict[int, tuple[int, str, int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    stat = f.read()
            except OSError:
                continue  # gone meanwhile
            command, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            procs[int(entry.name)] = (int(rest[1]), command, int(rest[21]) * page)
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in procs.items():
        children.setdefault(parent, []).append(pid)
    return procs, children


def descendants(pid: int, children: dict[int, list[int]], skip: set[int] = frozenset()) -> list[int]:
    """The processes below ``pid`` (not itself), leaving out those in ``skip`` and everything below them."""
    out, todo = [], [c for c in children.get(pid, []) if c not in skip]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += [c for c in children.get(p, []) if c not in skip]
    return out


class TreeRss:
    """Resident set sizes of this process tree, sampled every ``interval`` seconds on a thread while it is
    entered: this process (the driver's Python), its Java descendants (Spark's JVM: in local mode the driver
    and the executors) and its other descendants (PySpark's Python workers, summed: workers forked from one
    daemon share pages, so the sum is an upper bound). :meth:`peaks` gives each span's peaks."""

    ROLES = ("driver_python", "jvm", "python_workers", "tree")  # tree: the three at once

    def __init__(self, interval: float = 0.25):
        self.interval = interval
        self.samples: list[tuple[float, int, int, int, int]] = []  # (time ms, then bytes per role)
        self._stop = None

    @staticmethod
    def sample() -> tuple[int, int, int, int]:
        procs, children = processes()
        me = os.getpid()
        out = [procs.get(me, (0, "", 0))[2], 0, 0]
        for pid in descendants(me, children):
            out[1 if procs[pid][1] == "java" else 2] += procs[pid][2]
        return out[0], out[1], out[2], sum(out)

    def mark(self) -> None:
        """Takes a sample now (an operation shorter than the interval gets one at its start and end)."""
        self.samples.append((time.time() * 1000, *self.sample()))

    def start(self) -> TreeRss:
        import threading

        self._stop = threading.Event()

        def run():
            while not self._stop.wait(self.interval):
                self.mark()

        threading.Thread(target=run, name="bench-rss", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def __enter__(self) -> TreeRss:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def peaks(self, spans: list[tuple[str, float, float]]) -> dict[str, dict[str, int]]:
        """Per span name (``Windows.spans``: name, start ms, end ms; a name's spans pooled): the peak bytes
        of each role in the samples taken inside it."""
        out: dict[str, dict[str, int]] = {}
        for name, start, end in spans:
            peak = out.setdefault(name, dict.fromkeys(self.ROLES, 0))
            for at, *sizes in self.samples:
                if start <= at <= end:
                    for role, size in zip(self.ROLES, sizes, strict=True):
                        peak[role] = max(peak[role], size)
        return out


def aggregate(df, schema: pa.Schema):
    """A full aggregate over every column: sum of the numbers, max of the rest, and count(*)."""
    from pyspark.sql import functions as F

    exprs = [F.count(F.lit(1)).alias("_rows")]
    for f in schema:
        t = f.type
        if pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_floating(t):
            exprs.append(F.sum(f.name).alias(f"sum_{f.name}"))
        else:
            exprs.append(F.max(f.name).alias(f"max_{f.name}"))
    return df.agg(*exprs)


def plain_spark_write(spark, source: Path, target: Path, windows: Windows) -> dict:
    """The base load's baseline: the same DataFrame (``spark.read.parquet`` of the base file) written by
    plain Spark as Parquet (snappy, Spark's defaults), timed like the load; the folder is removed after.
    It runs after the load, on a warm JVM, which favours it."""
    with windows.span("plain-load"):
        t0 = time.perf_counter()
        spark.read.parquet(str(source)).write.mode("overwrite").parquet(str(target))
        wall = time.perf_counter() - t0
    written = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    shutil.rmtree(target, ignore_errors=True)
    return {"wall_s": wall, "bytes_written": written}


def scan_compare(spark, table, schema: pa.Schema, runs: int, after: str, windows: Windows) -> dict:
    """Current view vs plain Spark over the committed data files: warm-up, then interleaved runs."""
    from bitlake.spark.schema import spark_schema

    state = table.state()
    files = state.data_files()
    paths = [table.io.local_path(f.path) for f in files]
    columns = schema.names
    stored = sum(s.data_rows for s in state.segments.values())
    valid = sum(s.cardinality for s in state.segments.values())
    struct = spark_schema(schema)

    def plain():
        df = spark.read.schema(struct).parquet(*paths).select(columns)
        return aggregate(df, schema).collect()[0]

    def current():
        return aggregate(table.to_spark(spark), schema).collect()[0]

    def timed(fn, group):
        with windows.span(group):
            t0 = time.perf_counter()
            row = fn()
            seconds = time.perf_counter() - t0
        return seconds, row

    _, plain_row = timed(plain, f"warmup|{after}|plain")
    _, view_row = timed(current, f"warmup|{after}|bitlake")
    times: dict[str, list[float]] = {"plain": [], "bitlake": []}
    groups: dict[str, list[str]] = {"plain": [], "bitlake": []}
    for i in range(runs):
        order = [("plain", plain), ("bitlake", current)]
        if i % 2:
            order.reverse()
        for name, fn in order:
            group = f"scan|{after}|{name}|{i}"
            seconds, _ = timed(fn, group)
            times[name].append(seconds)
            groups[name].append(group)
            log(f"  scan run {i + 1}: {name} {seconds:.2f} s")
    med_plain, med_view = statistics.median(times["plain"]), statistics.median(times["bitlake"])
    paired = [p / v for p, v in zip(times["plain"], times["bitlake"], strict=True)]
    return {
        "data_files": len(files),
        "data_bytes": sum(f.bytes for f in files),
        "stored_rows": stored,
        "valid_rows": valid,
        "invalid_rows": stored - valid,
        "invalid_fraction": (stored - valid) / stored if stored else 0.0,
        "plain_rows": plain_row["_rows"],
        "view_rows": view_row["_rows"],
        "plain_s": times["plain"],
        "bitlake_s": times["bitlake"],
        "plain_median_s": med_plain,
        "bitlake_median_s": med_view,
        "relative_speed": med_plain / med_view,
        "paired_relative_speed_median": statistics.median(paired),
        "job_groups": groups,
    }


# ------------------------------------------------------------------------------------------ report


def machine() -> dict:
    mem_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    import pyspark

    return {
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "pyarrow": pa.__version__,
    }


def compile_bitlake() -> None:
    """Writes bitlake's bytecode into its ``__pycache__`` folders, as installing a wheel does. An editable install
    run with ``PYTHONDONTWRITEBYTECODE`` set (this machine's environment) has none, so each process compiled every
    module it imported again: 0.1-0.15 s of the first operation of a system's process, where the peers' packages
    come compiled (docs/benchmarks.md, "Design measurements", "Import")."""
    import compileall

    import bitlake

    compileall.compile_dir(str(Path(bitlake.__file__).parent), quiet=1)


def code_version() -> dict:
    """Which bitlake ran: the imported package's folder, the repository's HEAD and whether it was dirty."""
    import bitlake

    def git(*cmd):
        out = subprocess.run(["git", "-C", str(ROOT), *cmd], capture_output=True, text=True)
        return out.stdout.strip()

    return {
        "bitlake": str(Path(bitlake.__file__).parent),
        "git_head": git("rev-parse", "--short", "HEAD"),
        "bitlake_dirty": bool(git("status", "--porcelain", "--", "bitlake")),
    }


def mb(n: int) -> str:
    return f"{n / 1e6:,.2f} MB"


def heading(scale_factor: str, section: str = SECTION) -> str:
    """The doc section of a run at ``scale_factor`` (as :func:`sf_text` writes it): SF 1 under ``section``,
    others under a heading of their own."""
    return section if scale_factor == "1" else f"{section}, SF {scale_factor}"


def markdown(result: dict) -> str:
    m, cfg, code = result["machine"], result["config"], result["code"]
    code_note = f" ({code['note']})" if code.get("note") else ""
    make = f"`make bench SF={cfg['scale_factor']}`"
    make_note = f"what {make} runs" if result.get("plain_make") else f"{make} runs it without the other options"
    if not code_note and code["bitlake_dirty"]:
        code_note = " (with uncommitted changes in bitlake/)"
    lines = [
        heading(cfg["scale_factor"]),
        "",
        f"Command: `{result['command']}` ({make_note}), {result['date']}.",
        "",
        f"Machine: {m['cores']} cores, {m['memory_gib']} GiB RAM ({m['platform']}); Spark `{cfg['master']}`, "
        f"driver memory {cfg['driver_memory']}, {cfg['shuffle_partitions']} shuffle partitions. "
        f"Python {m['python']}, PySpark {m['pyspark']}, pyarrow {m['pyarrow']}.",
        "",
        f"Code: bitlake at commit {code['git_head']}{code_note}.",
        "",
        f"Data: TPC-H `lineitem` at scale factor {cfg['scale_factor']} ({result['base_rows']:,} rows, "
        f"tpchgen-cli), keyed by (l_orderkey, l_linenumber), delta column `l_delta` "
        f"(0 for the base, k for change batch k), {cfg['num_buckets']} key-store buckets. A change batch of "
        f"x % holds x % of the base row count: {UPDATE_SHARE:.0%} updates of random live keys "
        f"(`l_quantity + 1`), {DELETE_SHARE:.1%} deletes (at least one), the rest new keys beyond the "
        "largest `l_orderkey`.",
        "",
        "### Ingestion",
        "",
        "Bytes written: every file the batch added under the table path (data, keys files, segment logs, "
        "bitmaps, key store, the RocksDB key index, commit and claim files), from a walk of the folder "
        "before and after (a file of at most 1 MB that only grew, such as RocksDB's LOG, counts the bytes "
        "appended). "
        f"Write amplification: those bytes / the batch alone written as one Parquet file ({CODEC}) by "
        f"pyarrow in the same run. Target: under {WRITE_AMP_TARGET:g} for every change batch.",
        "",
        "| batch | records (upd / ins / del) | wall s (landing / MetaGen; then index, after the call) | "
        "bytes written | "
        "batch as Parquet | write amp. | target < 5 | written: data / keys / logs / bitmaps / key store / "
        "index / other |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b in result["batches"]:
        c = b["composition"]
        comp = (f"{c['records']:,}" if b["name"] == "base"
                else f"{c['records']:,} ({c['updates']:,} / {c['inserts']:,} / {c['deletes']:,})")
        ph = b["phases_s"]
        cat = b["written_by_kind"]
        kinds = ("data", "keys", "logs", "bitmaps", "keystore", "index")
        other = sum(v for k, v in cat.items() if k not in kinds)
        split = " / ".join([*(mb(cat.get(k, 0)) for k in kinds), mb(other)])
        target = "—"
        if b["name"] != "base":
            target = "met" if b["write_amplification"] < WRITE_AMP_TARGET else "MISSED"
        phases = f"{ph.get('landing', 0):.1f} / {ph.get('metagen', 0):.1f}; then {ph.get('index', 0):.1f}"
        lines.append(
            f"| {b['name']} | {comp} | {b['wall_s']:.1f} ({phases}) "
            f"| {mb(b['bytes_written'])} | {mb(b['batch_parquet_bytes'])} | {b['write_amplification']:.2f} "
            f"| {target} | {split} |"
        )
    plain = result.get("plain_load")
    if plain:
        load = result["batches"][0]
        lines += [
            "",
            f"Plain Spark writing the same DataFrame (`spark.read.parquet(base).write.parquet(...)`, snappy, "
            f"after the load on a warm JVM) took {plain['wall_s']:.1f} s and wrote {mb(plain['bytes_written'])}: "
            f"the load is {load['wall_s'] / plain['wall_s']:.2f}x its time (target: at most 1).",
        ]
    lines += [
        "",
        "### Current-view scan",
        "",
        "A full aggregate over all 17 columns (sum of numbers, max of strings and dates, count) collected "
        "on the driver: the current view (`Table.to_spark`, broadcast left-anti join on the packed row id "
        "for files with invalid rows) against plain Spark reading the same committed data files without "
        f"filtering. One warm-up each, then {cfg['runs']} runs interleaved (order alternating); medians. "
        f"Relative speed = plain / bitlake; target: at least {SCAN_TARGET:g} with 1 % of the rows invalid. "
        "Two figures that noisy neighbours disturb less are given beside it: the median over the "
        "interleaved pairs of plain / bitlake (each pair ran back to back), and the executors' CPU time "
        "(JVM task threads, from Spark's event log; the Python task that expands the invalid row ids "
        "is not in it but is in the wall time).",
        "",
        "| after | data files | stored rows | invalid rows | plain s (median) | bitlake s (median) | "
        "relative speed | target ≥ 0.85 | paired runs: median of plain/bitlake | executor CPU s: "
        "plain / bitlake (medians), ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in result["scans"]:
        target = "—"
        if s["after"] == "1 %":
            target = "met" if s["relative_speed"] >= SCAN_TARGET else "MISSED"
        cpu = s.get("executor_cpu_s")
        cpu_text = "—"
        if cpu:
            cpu_text = (f"{statistics.median(cpu['plain']):.1f} / {statistics.median(cpu['bitlake']):.1f}, "
                        f"{s['cpu_relative_speed']:.2f}")
        lines.append(
            f"| {s['after']} batch | {s['data_files']} | {s['stored_rows']:,} | {s['invalid_rows']:,} "
            f"({s['invalid_fraction']:.2%}) | {s['plain_median_s']:.2f} | {s['bitlake_median_s']:.2f} "
            f"| {s['relative_speed']:.2f} | {target} | {s['paired_relative_speed_median']:.2f} | {cpu_text} |"
        )
    notes = result.get("notes") or []
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += ["", f"Raw results: `{result['json_path']}`.", ""]
    return "\n".join(lines)


def save_results(result: dict, stem: str, markdown, heading: str, no_doc: bool) -> None:
    """Writes ``result`` to ``benchmarks/results/<stem>.json`` (its path kept as ``json_path``), its
    ``markdown(result)`` under ``heading`` in docs/benchmarks.md unless ``no_doc``, and prints the markdown."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"{stem}.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    result["json_path"] = str(out.relative_to(ROOT))
    if not no_doc:
        write_doc(markdown(result), heading)
    print(markdown(result))


def write_doc(section: str, heading: str = SECTION) -> None:
    """Replaces the section under ``heading`` in docs/benchmarks.md (appends it if missing)."""
    intro = "# Benchmarks\n\nEvery figure is a ratio against a baseline measured in the same run.\n\n"
    text = DOC.read_text() if DOC.exists() else intro
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        if not text.endswith("\n\n"):
            text = text.rstrip("\n") + "\n\n"
        DOC.write_text(text + section)
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    tail = "".join(lines[end:])
    DOC.write_text("".join(lines[:start]) + section + ("\n" + tail if tail else ""))


# -------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale-factor", type=float, default=1.0, help="TPC-H scale factor (1 = 6M rows)")
    ap.add_argument("--runs", type=int, default=3, help="timed scan runs of each side (after one warm-up)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--num-buckets", type=int, default=16)
    ap.add_argument("--scans-after", default=",".join(SCAN_AFTER),
                    help="after which batches the scans run (comma-separated of: %(default)s)")
    ap.add_argument("--no-doc", action="store_true", help="do not touch docs/benchmarks.md")
    ap.add_argument("--keep-table", action="store_true", help="keep the table under benchmarks/work/")
    ap.add_argument("--event-log", metavar="DIR", help="keep Spark's event log there (default: the work folder)")
    ap.add_argument("--code-note", default="", help="a line saying which bitlake code ran, for the doc")
    ap.add_argument("--render", metavar="JSON", help="only rewrite the doc section from a results file")
    args = ap.parse_args(argv)
    if args.render:
        result = json.loads(Path(args.render).read_text())
        write_doc(markdown(result), heading(result["config"]["scale_factor"]))
        print(markdown(result))
        return 0

    os.environ.setdefault("BITLAKE_DRIVER_MEMORY", "8g")
    os.environ.setdefault("BITLAKE_SHUFFLE_PARTITIONS", "16")
    import bitlake
    from bitlake.engine.keys.indexsession import flush_idle

    sf = args.scale_factor
    scan_after = {a.strip() for a in args.scans_after.split(",") if a.strip()}
    if not scan_after <= set(SCAN_AFTER):
        ap.error(f"--scans-after: {sorted(scan_after - set(SCAN_AFTER))} not among {', '.join(SCAN_AFTER)}")
    date = dt.datetime.now(dt.UTC)
    work = WORK_DIR / f"sf{sf_text(sf)}"
    shutil.rmtree(work, ignore_errors=True)
    table_path = work / "table"
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join([".venv/bin/python", "benchmarks/core.py", *given])
    plain_make = all(a.startswith("--scale-factor") or a.replace(".", "").isdigit() for a in given)

    code = code_version()  # before the run: others may commit while it runs
    source = lineitem(sf)
    base = load_base(source)
    log(f"base: {base.num_rows:,} rows from {source.relative_to(ROOT)}")
    base_file = work / "batches" / "0-base.parquet"
    base_bytes = write_parquet(base, base_file)

    # Spark's event log gives each timed run's executor CPU time, a figure that noisy neighbours on a
    # shared machine disturb far less than wall time.
    event_dir = Path(args.event_log) if args.event_log else work / "eventlog"
    event_dir.mkdir(parents=True, exist_ok=True)
    conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": "file://" + str(event_dir.resolve()),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}
    spark = bitlake.spark_session(args.master, app_name="bitlake-bench-core", **conf)
    app_id = spark.sparkContext.applicationId
    windows = Windows()
    log(f"spark {spark.version} {args.master}")
    # The table schema is the pyarrow schema the batch files are written with (create_table takes a
    # pyarrow.Schema or a Spark StructType).
    table = bitlake.create_table(str(table_path), base.schema, primary_key=PRIMARY_KEY,
                                 delta_column=DELTA, num_buckets=args.num_buckets)
    schema = table.metadata.schema
    timer = PhaseTimer()
    batches, scans, notes = [], [], []
    expected_rows = base.num_rows

    def ingest(name, path, parquet_bytes, composition, op_column, k):
        before = snapshot(table_path)
        with timer.installed(), windows.span(f"ingest|{name}"):
            t0 = time.perf_counter()
            r = table.ingest(spark.read.parquet(str(path)), op_column=op_column, batch_id=f"bench-{k}")
            wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        # The key index's update after the commit, on a thread of this process, and its flush on RocksDB's: its
        # bytes are the batch's, its time is spent after the call.
        flush_idle()
        phases = {**timer.take(), "index": time.perf_counter() - t1}
        written, by_kind, nfiles = written_between(before, snapshot(table_path))
        entry = {
            "name": name, "batch_id": f"bench-{k}", "version": r.version, "composition": composition,
            "counts": r.counts, "wall_s": wall, "phases_s": phases, "bytes_written": written,
            "files_written": nfiles, "written_by_kind": by_kind, "batch_parquet_bytes": parquet_bytes,
            "write_amplification": written / parquet_bytes,
        }
        log(f"{name}: {wall:.1f} s {entry['phases_s']}, wrote {mb(written)} in {nfiles} files {by_kind}, "
            f"batch as Parquet {mb(parquet_bytes)}, amplification {entry['write_amplification']:.2f}, "
            f"counts {r.counts}")
        batches.append(entry)
        return r

    def scan(after):
        log(f"scan after the {after} batch")
        s = {"after": after, **scan_compare(spark, table, schema, args.runs, after, windows)}
        log(f"scan after {after}: plain {s['plain_median_s']:.2f} s, bitlake {s['bitlake_median_s']:.2f} s, "
            f"relative {s['relative_speed']:.2f}, invalid {s['invalid_rows']:,} "
            f"({s['invalid_fraction']:.2%})")
        if s["view_rows"] != expected_rows:
            raise SystemExit(f"current view has {s['view_rows']} rows, expected {expected_rows}")
        scans.append(s)

    ingest("base", base_file, base_bytes, {"records": base.num_rows}, None, 0)
    plain_load = plain_spark_write(spark, base_file, work / "plain-load", windows)
    log(f"plain Spark write of the base: {plain_load['wall_s']:.1f} s")
    if "base" in scan_after:
        scan("base")

    maker = ChangeMaker(base, args.seed)
    for k, (name, fraction) in enumerate(BATCHES, start=1):
        batch, composition = maker.make(k, fraction)
        path = work / "batches" / f"{k}-{fraction:g}.parquet"
        parquet_bytes = write_parquet(batch, path)
        del batch
        r = ingest(name, path, parquet_bytes, composition, OP, k)
        want = {"inserted": composition["inserts"], "updated": composition["updates"],
                "deleted": composition["deletes"]}
        got = {key: r.counts.get(key) for key in want}
        if got != want:
            raise SystemExit(f"batch {name}: counts {r.counts} differ from the batch's composition {want}")
        expected_rows += composition["inserts"] - composition["deletes"]
        if name in scan_after:
            scan(name)

    spark.stop()
    event_log = event_dir / app_id
    if event_log.exists():
        spans = windows.executor_times(event_log)
        for b in batches:
            b["executor"] = spans.get(f"ingest|{b['name']}")
        for s in scans:
            groups = s.pop("job_groups")
            cpu = {side: [spans[g]["executor_cpu_s"] for g in groups[side]] for side in ("plain", "bitlake")}
            s["executor_cpu_s"] = cpu
            s["task_run_s"] = {side: [spans[g]["task_run_s"] for g in groups[side]] for side in ("plain", "bitlake")}
            s["cpu_relative_speed"] = statistics.median(cpu["plain"]) / statistics.median(cpu["bitlake"])
    else:
        log(f"no event log at {event_log}: CPU figures left out")

    after_1 = next((s for s in scans if s["after"] == "1 %"), None)
    if scans and "task_run_s" in scans[0]:
        cpu_total = sum(sum(s["executor_cpu_s"][side]) for s in scans for side in ("plain", "bitlake"))
        run_total = sum(sum(s["task_run_s"][side]) for s in scans for side in ("plain", "bitlake"))
        if run_total:
            notes.append(
                f"During the timed scans the executor task threads were on a CPU {cpu_total / run_total:.0%} "
                f"of their run time (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the "
                "end of the run: other jobs shared the machine), which is why the wall times vary from run to "
                "run and the CPU-time ratio is given beside them."
            )
    if after_1 is not None:
        notes.append(
            f"After the 1 % batch the invalid rows are the updates and deletes of the 0.1 % and 1 % batches: "
            f"{after_1['invalid_rows']:,} of {after_1['stored_rows']:,} stored rows "
            f"({after_1['invalid_fraction']:.2%}); every base data file holds some, so every base file "
            "goes through the anti-join."
        )
    result = {
        "benchmark": "core",
        "date": date.strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "plain_make": plain_make,
        "machine": machine(),
        "config": {
            "scale_factor": sf_text(sf), "master": args.master, "runs": args.runs, "seed": args.seed,
            "num_buckets": args.num_buckets, "driver_memory": os.environ["BITLAKE_DRIVER_MEMORY"],
            "shuffle_partitions": os.environ["BITLAKE_SHUFFLE_PARTITIONS"], "codec": CODEC,
        },
        "code": {**code, "note": args.code_note},
        "base_rows": base.num_rows,
        "plain_load": plain_load,
        "batches": batches,
        "scans": scans,
        "notes": notes,
        "targets": {
            "write_amplification_below": WRITE_AMP_TARGET,
            "write_amplification_met": all(b["write_amplification"] < WRITE_AMP_TARGET
                                           for b in batches if b["name"] != "base"),
            "scan_relative_speed_at_1pct_at_least": SCAN_TARGET,
            "scan_met": after_1 is not None and after_1["relative_speed"] >= SCAN_TARGET,
        },
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"core-{date.strftime('%Y-%m-%d')}-sf{sf_text(sf)}.json"
    result["json_path"] = str(out.relative_to(ROOT))
    out.write_text(json.dumps(result, indent=1) + "\n")
    section = markdown(result)
    if not args.no_doc:
        DOC.parent.mkdir(parents=True, exist_ok=True)
        write_doc(section, heading(sf_text(sf)))
    print(section)
    if not args.keep_table:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
