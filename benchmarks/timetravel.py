"""The time-travel and change-feed benchmark: past views and change feeds against the current-view scan.

It builds the core benchmark's table (``benchmarks/core.py``: TPC-H ``lineitem`` keyed by
``(l_orderkey, l_linenumber)``, integer delta column ``l_delta`` = 0 for the base and ``k`` for batch ``k``):
the base, change batches of 0.1 %, 1 % and 10 % (95 % updates, 0.1 % deletes, the rest new keys), then
``--small-batches`` (50) more small batches of ``--small-fraction`` (0.01 %) each, made the same way. Then:

1. after the 10 % batch and again after the small batches, it times a full aggregate over all columns
   (the one ``core.py`` uses) of the current view, of a past version (the version after the 1 % batch),
   of a ``valid_at`` view at the latest version (``valid_at`` = the 1 % batch's delta value) and of both
   together (the version after the 10 % batch, ``valid_at`` = the 1 % batch): one warm-up each, then
   ``--runs`` runs interleaved (order rotating), medians. Ratios to the current view; target: at most 1.5;
2. it ingests a batch of new keys only (0.1 % of the base rows) at version ``v`` and times the change
   feed ``t.changes(spark, starting_version=v, ending_version=v)`` consumed by an aggregate over all its
   columns, interleaved with the current-view scan. Ratio to the scan; target: at most 0.05;
3. it ingests a batch of random updates only (0.1 %), whose preimages lie all over the table, and times
   its change feed with all columns, with only the key columns and ``_change_type``, and written in
   order (Spark's ``noop`` sink: every row, in the feed's order), each against the scan. Target: never
   more than one full scan (ratio at most 1).

Beside the wall times it gives each run's executor CPU time, rows read and Spark jobs (Spark's event log).
Results go to ``benchmarks/results/timetravel-<date>-sf<sf>.json`` and to the section
"## Time travel and change feed" of ``docs/benchmarks.md`` (other sections are kept).

    .venv/bin/python benchmarks/timetravel.py --scale-factor 1      # what `make bench-timetravel` runs
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shlex
import shutil
import statistics
import sys
import time
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core  # noqa: E402  (benchmarks/core.py: data, change batches, the aggregate, event-log spans)
from core import (  # noqa: E402
    BATCHES,
    DELTA,
    OP,
    PRIMARY_KEY,
    RESULTS_DIR,
    ROOT,
    WORK_DIR,
    ChangeMaker,
    aggregate,
    code_version,
    lineitem,
    load_base,
    log,
    machine,
    mb,
    sf_text,
    write_parquet,
)

SECTION = "## Time travel and change feed"
VIEW_TARGET = 1.5
NEW_KEYS_TARGET = 0.05
UPDATES_TARGET = 1.0
FEED_FRACTION = 0.001
PLAIN_NEW = "baseline: plain Spark, aggregate of the batch's data file alone"
CHANGE_COLUMNS = [("_change_type", pa.string()), ("_commit_version", pa.int64()),
                  ("_commit_timestamp", pa.timestamp("us", tz="UTC"))]


# ------------------------------------------------------------------------------------------ data


class Maker(ChangeMaker):
    """core.ChangeMaker with batches of a given mix (updates, new keys, deletes)."""

    def make_mix(self, k: int, updates: int, inserts: int, deletes: int) -> pa.Table:
        live = np.flatnonzero(~self.deleted)
        chosen = self.rng.choice(live, size=updates + deletes, replace=False)
        upd_idx, del_idx = np.sort(chosen[:updates]), np.sort(chosen[updates:])
        self.deleted[del_idx] = True
        upd = self.base.take(pa.array(upd_idx, pa.int64()))
        qty = upd.column("l_quantity")
        one = pa.scalar(Decimal("1.00"), qty.type)
        upd = upd.set_column(upd.schema.get_field_index("l_quantity"), "l_quantity",
                             pc.add(qty, one).cast(qty.type))
        ins = self.base.take(pa.array(self.rng.integers(0, self.base.num_rows, size=inserts), pa.int64()))
        keys = np.arange(self.next_orderkey, self.next_orderkey + inserts, dtype=np.int64)
        self.next_orderkey += inserts
        ins = ins.set_column(ins.schema.get_field_index("l_orderkey"), "l_orderkey", pa.array(keys))
        ins = ins.set_column(ins.schema.get_field_index("l_linenumber"), "l_linenumber",
                             pa.array(np.ones(inserts, dtype=np.int32)))
        dele = self.base.take(pa.array(del_idx, pa.int64()))
        parts = []
        for table, op in ((upd, "upsert"), (ins, "upsert"), (dele, "delete")):
            table = table.set_column(table.schema.get_field_index(DELTA), DELTA,
                                     pa.array(np.full(table.num_rows, k, dtype=np.int32)))
            table = table.append_column(OP, pa.array([op] * table.num_rows, pa.string()))
            parts.append(table.cast(self.schema.append(pa.field(OP, pa.string(), True))))
        batch = pa.concat_tables(parts)
        return batch.take(pa.array(self.rng.permutation(batch.num_rows)))


def small_mix(n: int) -> tuple[int, int, int]:
    """A small batch of ``n`` records as core.py mixes them: 95 % updates, >= 1 delete, the rest new keys."""
    n = max(3, n)
    deletes = max(1, round(core.DELETE_SHARE * n))
    updates = round(core.UPDATE_SHARE * n)
    return updates, n - updates - deletes, deletes


# ------------------------------------------------------------------------------------- measuring


class Spans(core.Windows):
    """core.Windows plus, per span, the bytes and records its tasks read and a summary of its stages."""

    def profile(self, event_log: Path) -> dict[str, dict]:
        job_span: dict[int, str] = {}
        stage_span: dict[int, str] = {}
        out = {name: {"executor_cpu_s": 0.0, "task_run_s": 0.0, "tasks": 0, "input_bytes": 0, "input_records": 0,
                      "shuffle_read_bytes": 0, "jobs": 0, "stages": []} for name, _, _ in self.spans}
        stage_acc: dict[int, dict] = {}
        with open(event_log) as f:
            for line in f:
                e = json.loads(line)
                kind = e.get("Event")
                if kind == "SparkListenerJobStart":
                    at = e["Submission Time"]
                    name = next((n for n, a, b in self.spans if a <= at <= b), None)
                    if name is not None:
                        job_span[e["Job ID"]] = name
                        out[name]["jobs"] += 1
                        for sid in e.get("Stage IDs", []):
                            stage_span[sid] = name
                elif kind == "SparkListenerTaskEnd" and e.get("Stage ID") in stage_span:
                    m = e.get("Task Metrics") or {}
                    d = out[stage_span[e["Stage ID"]]]
                    inp = m.get("Input Metrics") or {}
                    shr = m.get("Shuffle Read Metrics") or {}
                    cpu = m.get("Executor CPU Time", 0) / 1e9
                    d["executor_cpu_s"] += cpu
                    d["task_run_s"] += m.get("Executor Run Time", 0) / 1e3
                    d["tasks"] += 1
                    d["input_bytes"] += inp.get("Bytes Read", 0)
                    d["input_records"] += inp.get("Records Read", 0)
                    d["shuffle_read_bytes"] += shr.get("Remote Bytes Read", 0) + shr.get("Local Bytes Read", 0)
                    s = stage_acc.setdefault(e["Stage ID"], {"tasks": 0, "cpu_s": 0.0, "input_bytes": 0,
                                                             "input_records": 0})
                    s["tasks"] += 1
                    s["cpu_s"] += cpu
                    s["input_bytes"] += inp.get("Bytes Read", 0)
                    s["input_records"] += inp.get("Records Read", 0)
                elif kind == "SparkListenerStageCompleted":
                    info = e["Stage Info"]
                    sid = info["Stage ID"]
                    if sid in stage_span and sid in stage_acc:
                        acc = stage_acc[sid]
                        out[stage_span[sid]]["stages"].append({
                            "stage": sid, "name": info.get("Stage Name", "")[:80], "tasks": acc["tasks"],
                            "wall_s": round((info.get("Completion Time", 0) - info.get("Submission Time", 0)) / 1e3, 3),
                            "cpu_s": round(acc["cpu_s"], 3), "input_bytes": acc["input_bytes"],
                            "input_records": acc["input_records"],
                        })
        return out


def feed_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema(list(schema) + [pa.field(n, t) for n, t in CHANGE_COLUMNS])


def measure(cases: list[tuple[str, object]], runs: int, spans: Spans, phase: str) -> dict:
    """Each case once as a warm-up, then ``runs`` rounds with the order rotating; wall times and rows."""
    out: dict[str, dict] = {name: {"s": [], "groups": []} for name, _ in cases}
    for name, fn in cases:
        with spans.span(f"warmup|{phase}|{name}"):
            t0 = time.perf_counter()
            out[name]["row"] = fn()
            out[name]["warmup_s"] = time.perf_counter() - t0
        log(f"  warm-up {name}: {out[name]['warmup_s']:.2f} s")
    for i in range(runs):
        order = cases[i % len(cases):] + cases[:i % len(cases)]
        for name, fn in order:
            group = f"run|{phase}|{name}|{i}"
            with spans.span(group):
                t0 = time.perf_counter()
                fn()
                seconds = time.perf_counter() - t0
            out[name]["s"].append(seconds)
            out[name]["groups"].append(group)
            log(f"  run {i + 1}: {name} {seconds:.2f} s")
    for d in out.values():
        d["median_s"] = statistics.median(d["s"])
    return out


def feed_files(table, start: int, end: int, types: set[str] | None = None) -> dict:
    """What the change feed of ``(start, end]`` opens, computed on the driver the way bitlake.spark.changes
    does: the range's log files, the data files of the batches it made live, and the data files of the
    segments its SET_VALID_UNTIL events name."""
    state = table.state(end)
    logs = [f for v, f in state.logs if start < v <= end]
    live = {p for p, b in state.parts.items() if b.live_version is not None and start < b.live_version <= end}
    segments: set[tuple[int, int]] = set()
    events = 0
    for f in logs:
        ev = pq.read_table(table.io.local_path(f.path))
        events += ev.num_rows
        if types is not None and types != {"insert", "update_preimage", "update_postimage", "delete"}:
            raise ValueError("only the full feed is supported here")
        parts = ev.column("_segment_part").to_numpy()
        seqs = ev.column("_segment_seq").to_numpy()
        segments |= set(zip(parts.tolist(), seqs.tolist(), strict=True))
    files = [f for f in state.data_files()
             if f.segments[0].part in live or any(r.segment in segments for r in f.segments)]
    all_files = state.data_files()
    return {
        "log_files": len(logs), "log_bytes": sum(f.bytes for f in logs), "events": events,
        "data_files": len(files), "data_bytes": sum(f.bytes for f in files),
        "data_rows": sum(f.rows for f in files),
        "table_data_files": len(all_files), "table_data_bytes": sum(f.bytes for f in all_files),
    }


# ------------------------------------------------------------------------------------------ report


def listing(case: dict) -> int:
    """Jobs of a read that only list its files (DataFrameReader.load/parquet with many paths)."""
    return sum(1 for st in case.get("stages", []) if st["name"].startswith(("load at", "parquet at")))


def explain(view_phases: list[dict], feeds: list[dict]) -> list[str]:
    """What each result comes from, in numbers of the run (files, rows read, jobs, CPU)."""
    notes = []
    for ph in view_phases:
        c, cur = ph["cases"], ph["cases"]["current"]
        tb = ph["table"]
        notes.append(
            f"{ph['label'].capitalize()} ({tb['data_files']} data files, {tb['log_files']} log files): a past "
            f"version reads its own bitmaps with the current view's plan, {c['version']['input_records']:,} rows "
            f"read against {cur['input_records']:,}; `valid_at {ph['valid_at']}` also opens the "
            f"{ph['valid_at_log_files']} log files whose events reach past {ph['valid_at']} to bring back the rows "
            f"superseded after it ({c['valid_at']['input_records']:,} rows and log events read, "
            f"{c['valid_at']['jobs']} Spark jobs against {cur['jobs']}; {listing(c['valid_at'])} and "
            f"{listing(cur)} of them list files, as Spark does in a job for more than 32 paths); CPU ratios "
            f"{c['version']['cpu_ratio']:.2f}, {c['valid_at']['cpu_ratio']:.2f} and "
            f"{c['version+valid_at']['cpu_ratio']:.2f}."
        )
    for fd in feeds:
        files, scan = fd["files"], fd["cases"]["scan"]
        full = fd["cases"]["all columns"]
        opened = (f"{files['data_files']} of {files['table_data_files']} data files "
                  f"({mb(files['data_bytes'])} of {mb(files['table_data_bytes'])})")
        if "keys + _change_type" not in fd["cases"]:
            met_wall = full["ratio"] <= fd["target"]
            met_cpu = full["cpu_ratio"] <= fd["target"]
            verdict = ("met" if met_wall else
                       "missed in wall time" + (" but met in executor CPU time" if met_cpu else " and in CPU time"))
            steps = ""
            if full["jobs"] == 4:
                steps = (" (reading the events; counting them per cause and broadcasting them; scanning the new "
                         "file joined with them; the aggregate)")
            plain = fd["cases"].get(PLAIN_NEW)
            floor = ""
            if plain is not None:
                floor = (f" Plain Spark aggregating the batch's data file alone, the least any Spark query over "
                         f"this change costs, took {plain['median_s']:.2f} s ({ratio_text(plain['ratio'])} of the "
                         f"scan, {plain['jobs']} jobs).")
            notes.append(
                f"The {fd['label']} feed opens {files['log_files']} log file{'s' if files['log_files'] != 1 else ''} "
                f"({files['events']:,} events) and {opened}; its tasks read {full['input_records']:,} rows against "
                f"{scan['input_records']:,} for the scan, executor CPU {ratio_text(full['cpu_ratio'])} of the "
                f"scan's. Its {full['median_s']:.2f} s are a fixed cost per query, not data: "
                f"{full['build_median_s']:.2f} s building the DataFrame on the driver (commit log, the segment "
                f"lookup in the log file, Py4J calls), then {full['jobs']} small Spark jobs{steps}.{floor} "
                f"Target {fd['target']:g}: {verdict}; the ratio falls as the "
                "table grows, since the scan grows and the feed does not."
            )
        else:
            keys, ordered = fd["cases"]["keys + _change_type"], fd["cases"]["all columns, in order, to a noop sink"]
            worst = max(c["ratio"] for n, c in fd["cases"].items() if n != "scan")
            notes.append(
                f"The {fd['label']} have their preimages in {opened}: the feed scans those files whole "
                f"({full['input_records']:,} rows read against {scan['input_records']:,} for the current view), "
                f"which is the one scan of the table it may cost. The range's {files['events']:,} events are "
                f"broadcast to that scan, so only the {full['rows']:,} matching rows leave it "
                f"({full['shuffle_read_bytes'] / 1e6:.2f} MB shuffled). All columns: "
                f"{ratio_text(full['ratio'])} of the full-table aggregate (CPU {ratio_text(full['cpu_ratio'])}); "
                f"keys and `_change_type` only: {ratio_text(keys['ratio'])} (CPU {ratio_text(keys['cpu_ratio'])}), "
                "since Parquet then decodes only the key and row-id columns of those files; all columns in the "
                f"feed's order to a sink: {ratio_text(ordered['ratio'])} (CPU {ratio_text(ordered['cpu_ratio'])}). "
                f"Target {fd['target']:g}: {'met' if worst <= fd['target'] else 'missed'}."
            )
    return notes


def ratio_text(x: float) -> str:
    return f"{x:.3f}" if x < 0.1 else f"{x:.2f}"


def markdown(result: dict) -> str:
    m, cfg, code = result["machine"], result["config"], result["code"]
    note = f" ({code['note']})" if code.get("note") else ""
    if not note and code["bitlake_dirty"]:
        note = " (with uncommitted changes in bitlake/)"
    make = f"`make bench-timetravel SF={cfg['scale_factor']}`"
    make_note = f"what {make} runs" if result.get("plain_make") else f"{make} runs it without the other options"
    lines = [
        core.heading(cfg["scale_factor"], SECTION),
        "",
        f"Command: `{result['command']}` ({make_note}; `make bench` runs it after the core benchmark), "
        f"{result['date']}.",
        "",
        f"Machine: {m['cores']} cores, {m['memory_gib']} GiB RAM ({m['platform']}); Spark `{cfg['master']}`, "
        f"driver memory {cfg['driver_memory']}, {cfg['shuffle_partitions']} shuffle partitions. "
        f"Python {m['python']}, PySpark {m['pyspark']}, pyarrow {m['pyarrow']}.",
        "",
        f"Code: bitlake at commit {code['git_head']}{note}.",
        "",
        f"Table: the core benchmark's ({result['base_rows']:,} base rows at scale factor {cfg['scale_factor']}): "
        f"base (`l_delta` 0), change batches of 0.1 %, 1 % and 10 % (`l_delta` 1, 2, 3; 95 % updates, "
        f"0.1 % deletes, the rest new keys), then {cfg['small_batches']} small batches of "
        f"{cfg['small_fraction'] * 100:g} % ({result['small_batch_mix']}), `l_delta` 4 to "
        f"{3 + cfg['small_batches']}: {result['table_after_small']['versions']} versions, "
        f"{result['table_after_small']['data_files']} data files, "
        f"{result['table_after_small']['log_files']} segment-log files.",
        "",
        "Each read is a full aggregate over every column (core.py's: sum of numbers, max of strings and "
        f"dates, count) collected on the driver; one warm-up each, then {cfg['runs']} runs interleaved (order "
        "rotating); medians. Beside the wall-time ratio: the executors' CPU time (JVM task threads, from "
        "Spark's event log; Python workers and the driver are not in it), the rows its tasks read (data rows and log "
        "events) and its Spark jobs.",
        "",
        "### Past views",
        "",
        f"Past version: the version after the 1 % batch. `valid_at`: 2 (the 1 % batch's delta value) at the "
        f"latest version. Both: the version after the 10 % batch with `valid_at` 2. All three are the same "
        f"rows (checked). Target: each at most {VIEW_TARGET:g} x the current-view read.",
        "",
        "| table | read | rows | wall s (median) | / current | target ≤ 1.5 | executor CPU s (median) "
        "| CPU / current | rows read by tasks |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for ph in result["views"]:
        for name, label in (("current", "current view"), ("version", f"version {ph['past_version']}"),
                            ("valid_at", f"valid_at {ph['valid_at']}"),
                            ("version+valid_at", f"version {ph['both_version']}, valid_at {ph['valid_at']}")):
            c = ph["cases"][name]
            target = "—" if name == "current" else ("met" if c["ratio"] <= VIEW_TARGET else "MISSED")
            ratio = "1" if name == "current" else f"{c['ratio']:.2f}"
            cpu_ratio = "1" if name == "current" else (f"{c['cpu_ratio']:.2f}" if c.get("cpu_ratio") else "—")
            cpu = f"{c['cpu_median_s']:.1f}" if c.get("cpu_median_s") is not None else "—"
            read = f"{c['input_records']:,}" if c.get("input_records") is not None else "—"
            lines.append(
                f"| {ph['label']} (v{ph['at_version']}) | {label} | {c['rows']:,} | {c['median_s']:.2f} | {ratio} "
                f"| {target} | {cpu} | {cpu_ratio} | {read} |"
            )
    lines += [
        "",
        "### Change feed",
        "",
        "`t.changes(spark, starting_version=v, ending_version=v)` of one batch, consumed by the aggregate over "
        "all its columns (table columns, `_change_type`, `_commit_version`, `_commit_timestamp`), or over "
        "the keys and `_change_type` only, or written in the feed's order to Spark's `noop` sink (every row "
        "produced, sorted), each interleaved with the full current-view scan. Files opened: data files of "
        "the segments the range's events name (from the log files on the driver), of all the table's.",
        "",
        "| batch | feed | rows | wall s (median) | of which building the DataFrame | scan s (median) | / scan "
        "| target | executor CPU s: feed / scan, ratio | rows read by tasks: feed / scan | Spark jobs "
        "| data files opened |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for fd in result["feeds"]:
        files = fd["files"]
        opened = (f"{files['data_files']} of {files['table_data_files']} "
                  f"({mb(files['data_bytes'])} of {mb(files['table_data_bytes'])})")
        scan = fd["cases"]["scan"]
        for name, c in fd["cases"].items():
            if name == "scan":
                continue
            target = f"≤ {fd['target']:g}: " + ("met" if c["ratio"] <= fd["target"] else "MISSED")
            if name == PLAIN_NEW:
                target = "—"
            cpu = read = jobs = "—"
            if c.get("cpu_median_s") is not None:
                cpu = f"{c['cpu_median_s']:.2f} / {scan['cpu_median_s']:.2f}, {ratio_text(c['cpu_ratio'])}"
                read = f"{c['input_records']:,} / {scan['input_records']:,}"
                jobs = f"{c['jobs']} (scan {scan['jobs']})"
            build = f"{c['build_median_s']:.2f}" if "build_median_s" in c else "—"
            lines.append(
                f"| {fd['label']} (v{fd['version']}) | {c['label']} | {c['rows']:,} | {c['median_s']:.2f} "
                f"| {build} | {scan['median_s']:.2f} | {ratio_text(c['ratio'])} | {target} | {cpu} "
                f"| {read} | {jobs} | {opened} |"
            )
    if result.get("peak_rss"):
        lines += [
            "",
            "### Peak memory",
            "",
            "Resident set sizes of the benchmark's process tree, sampled every 0.25 s, peaks over each step's "
            "spans: the driver's Python process (the caller of bitlake: the inline MetaGen and the driver path "
            "run in it), Spark's JVM (in local mode the driver and the executors are one JVM), and PySpark's "
            "Python workers (landing tasks and the Python parts of reads; summed, an upper bound: workers forked "
            "from one daemon share pages). Before the load the driver's Python held "
            f"{mb(result['rss_before_load']['driver_python'])} and the JVM {mb(result['rss_before_load']['jvm'])}: "
            f"the benchmark keeps the base as an Arrow table ({mb(result['base_arrow_bytes'])}) to draw the "
            "batches from, which bitlake's own figures do not need.",
            "",
            "| step | driver Python | JVM (driver and executors) | Python workers (sum) | the three at once |",
            "| --- | --- | --- | --- | --- |",
        ]
        lines += [f"| {step} | {mb(p['driver_python'])} | {mb(p['jvm'])} | {mb(p['python_workers'])} "
                  f"| {mb(p['tree']) if 'tree' in p else '—'} |" for step, p in result["peak_rss"].items()]
    notes = result.get("notes") or []
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    lines += ["", f"Raw results: `{result['json_path']}`.", ""]
    return "\n".join(lines)


def write_doc(section: str, scale_factor: str) -> None:
    core.write_doc(section, core.heading(scale_factor, SECTION))


def rss_group(span: str) -> str | None:
    """The step a span of the run belongs to, for the peak-RSS table (None: not reported)."""
    kind, _, rest = span.partition("|")
    if kind == "ingest":
        return {"base": "load (a Spark DataFrame of the base file)", "0.1 %": "0.1 % batch", "1 %": "1 % batch",
                "10 %": "10 % batch"}.get(rest, "small batches" if rest.startswith("small") else "feed batches")
    case = rest.split("|")[1]
    if case in ("current", "scan"):
        return "current-view scans"
    return "time travel reads" if rest.startswith("views") else "change feeds"


def rss_table(peaks: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """:meth:`core.TreeRss.peaks` by span, pooled into :func:`rss_group`'s steps (in the run's order)."""
    out: dict[str, dict[str, int]] = {}
    for span, peak in peaks.items():
        group = rss_group(span)
        if group is not None:
            pooled = out.setdefault(group, dict.fromkeys(peak, 0))
            for role, size in peak.items():
                pooled[role] = max(pooled[role], size)
    return out


# -------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale-factor", type=float, default=1.0, help="TPC-H scale factor (1 = 6M rows)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs of each read (after one warm-up)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--num-buckets", type=int, default=16)
    ap.add_argument("--small-batches", type=int, default=50)
    ap.add_argument("--small-fraction", type=float, default=0.0001, help="size of each small batch (of the base)")
    ap.add_argument("--no-doc", action="store_true", help="do not touch docs/benchmarks.md")
    ap.add_argument("--keep-table", action="store_true",
                    help="keep the built table (before the change-feed batches) under benchmarks/work/")
    ap.add_argument("--reuse-table", action="store_true",
                    help="start from a table kept by an earlier --keep-table run with the same options")
    ap.add_argument("--code-note", default="", help="a line saying which bitlake code ran, for the doc")
    ap.add_argument("--render", metavar="JSON", help="only rewrite the doc section from a results file")
    args = ap.parse_args(argv)
    if args.render:
        result = json.loads(Path(args.render).read_text())
        if result["feeds"] and "jobs" in result["feeds"][0]["cases"]["scan"]:
            result["notes"] = [n for n in result["notes"][:1] if n.startswith("During")]
            result["notes"] += explain(result["views"], result["feeds"])
        if not args.no_doc:
            write_doc(markdown(result), result["config"]["scale_factor"])
        print(markdown(result))
        return 0

    os.environ.setdefault("BITLAKE_DRIVER_MEMORY", "8g")
    os.environ.setdefault("BITLAKE_SHUFFLE_PARTITIONS", "16")
    import bitlake
    from bitlake.spark.schema import spark_schema

    sf = args.scale_factor
    date = dt.datetime.now(dt.UTC)
    work = WORK_DIR / f"timetravel-sf{sf_text(sf)}"
    kept = work / "kept"
    build_key = {"scale_factor": sf_text(sf), "seed": args.seed, "num_buckets": args.num_buckets,
                 "small_batches": args.small_batches, "small_fraction": args.small_fraction}
    reuse = (args.reuse_table and (kept / "build.json").exists()
             and json.loads((kept / "build.json").read_text()).get("key") == build_key)
    if args.reuse_table and not reuse:
        log("no matching kept table: building it")
    for name in ("table", "batches", "eventlog"):
        shutil.rmtree(work / name, ignore_errors=True)
    table_path = work / "table"
    given = sys.argv[1:] if argv is None else argv
    command = shlex.join([".venv/bin/python", "benchmarks/timetravel.py", *given])
    plain_make = all(a.startswith("--scale-factor") or a.replace(".", "").isdigit() for a in given)

    code = code_version()
    source = lineitem(sf)
    base = load_base(source)
    log(f"base: {base.num_rows:,} rows from {source.relative_to(ROOT)}")

    event_dir = work / "eventlog"
    event_dir.mkdir(parents=True, exist_ok=True)
    conf = {"spark.eventLog.enabled": "true", "spark.eventLog.dir": "file://" + str(event_dir.resolve()),
            "spark.eventLog.compress": "false", "spark.eventLog.rolling.enabled": "false"}
    spark = bitlake.spark_session(args.master, app_name="bitlake-bench-timetravel", **conf)
    app_id = spark.sparkContext.applicationId
    spans = Spans()
    rss = core.TreeRss().start()
    before_load = dict(zip(core.TreeRss.ROLES, core.TreeRss.sample(), strict=True))
    log(f"spark {spark.version} {args.master}")

    maker = Maker(base, args.seed)
    versions: dict[str, int] = {}
    k = 0

    def ingest(table, batch: pa.Table | None, name: str, k: int) -> int:
        if batch is None:
            path = work / "batches" / "0-base.parquet"
            write_parquet(base, path)
            op = None
        else:
            path = work / "batches" / f"{k}.parquet"
            write_parquet(batch, path)
            op = OP
        with spans.span(f"ingest|{name}"):
            t0 = time.perf_counter()
            r = table.ingest(spark.read.parquet(str(path)), op_column=op, batch_id=f"bench-{k}")
            wall = time.perf_counter() - t0
        log(f"ingest {name} (l_delta {k}): version {r.version}, {wall:.1f} s, {r.counts}")
        path.unlink()
        return r.version

    small = small_mix(round(args.small_fraction * base.num_rows))
    core_batches = [(name, fraction) for name, fraction in BATCHES]
    at_1pct = 2  # l_delta of the 1 % batch
    table = None
    schema = fschema = None

    def view(**kw):
        return lambda: aggregate(table.to_spark(spark, **kw), schema).collect()[0]

    def describe(version: int) -> dict:
        st = table.state(version)
        return {"versions": version + 1, "data_files": len(st.data_files()), "log_files": len(st.logs),
                "stored_rows": sum(s.data_rows for s in st.segments.values()),
                "valid_rows": sum(s.cardinality for s in st.segments.values())}

    view_phases = []

    def views(label: str):
        at_version = table.version
        v_1pct, v_10pct = versions["1 %"], versions["10 %"]
        log(f"past views on the table {label} (version {at_version})")
        cases = [("current", view()), ("version", view(version=v_1pct)), ("valid_at", view(valid_at=at_1pct)),
                 ("version+valid_at", view(version=v_10pct, valid_at=at_1pct))]
        res = measure(cases, args.runs, spans, f"views {label}")
        same = {res[n]["row"] for n in ("version", "valid_at", "version+valid_at")}
        if len(same) != 1:
            raise SystemExit(f"the past views differ: {[res[n]['row'] for n in res]}")
        for c in res.values():
            c["rows"] = c.pop("row")["_rows"]
            c["ratio"] = c["median_s"] / res["current"]["median_s"]
        latest = table.state()
        view_phases.append({"label": label, "at_version": at_version, "past_version": v_1pct,
                            "both_version": v_10pct, "valid_at": at_1pct, "table": describe(at_version),
                            "valid_at_log_files": sum(1 for _, f in latest.logs if f.max_t > at_1pct),
                            "cases": res})
        log("  " + ", ".join(f"{n} {c['median_s']:.2f} s ({c['ratio']:.2f})" for n, c in res.items()))

    if reuse:
        log(f"reusing the kept table {kept / 'table'} (the views after the 10 % batch are not measured)")
        shutil.copytree(kept / "table", table_path)
        versions = json.loads((kept / "build.json").read_text())["versions"]
        # Replays the batch maker so the feed batches continue the same key space and deleted set.
        for k, (_, fraction) in enumerate(core_batches, start=1):
            maker.make(k, fraction)
        for i in range(args.small_batches):
            maker.make_mix(len(core_batches) + 1 + i, *small)
        k = len(core_batches) + args.small_batches
        table = bitlake.open_table(str(table_path))
        schema = table.metadata.schema
    else:
        table = bitlake.create_table(str(table_path), base.schema, primary_key=PRIMARY_KEY,
                                     delta_column=DELTA, num_buckets=args.num_buckets)
        schema = table.metadata.schema
        versions["base"] = ingest(table, None, "base", 0)
        for k, (name, fraction) in enumerate(core_batches, start=1):
            batch, _ = maker.make(k, fraction)
            versions[name] = ingest(table, batch, name, k)
            del batch
        views("after the 10 % batch")
        for i in range(args.small_batches):
            k = len(core_batches) + 1 + i
            versions[f"small {i + 1}"] = ingest(table, maker.make_mix(k, *small), f"small {i + 1}", k)
        if args.keep_table:
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(table_path, kept / "table")
            (kept / "build.json").write_text(json.dumps({"key": build_key, "versions": versions}, indent=1))
    fschema = feed_schema(schema)
    views(f"after {args.small_batches} more small batches")

    # ------------------------------------------------------------------------------ change feeds
    feeds = []

    def scan():
        return aggregate(table.to_spark(spark), schema).collect()[0]

    build_s: dict[str, list[float]] = {}

    def built(name: str, v: int):
        t0 = time.perf_counter()
        df = table.changes(spark, starting_version=v, ending_version=v)
        build_s.setdefault(name, []).append(time.perf_counter() - t0)
        return df

    def feed(v: int, name: str, keys_only: bool = False):
        def run():
            df = built(name, v)
            if keys_only:
                df = df.select(*PRIMARY_KEY, "_change_type")
                sch = pa.schema([fschema.field(n) for n in [*PRIMARY_KEY, "_change_type"]])
                return aggregate(df, sch).collect()[0]
            return aggregate(df, fschema).collect()[0]
        return run

    def feed_noop(v: int, name: str):
        def run():
            built(name, v).write.format("noop").mode("overwrite").save()
            return None
        return run

    def feed_phase(label: str, batch: pa.Table, k: int, expect: dict[str, int], with_variants: bool, target: float):
        v = ingest(table, batch, label, k)
        log(f"change feed of the {label} batch (version {v})")
        build_s.clear()
        cases = [("scan", scan), ("all columns", feed(v, "all columns"))]
        if not with_variants:
            # The floor of any Spark query over this change: plain Spark aggregating the batch's new data file(s).
            before = {f.path for f in table.state(v - 1).data_files()}
            new_files = [table.io.local_path(f.path) for f in table.state(v).data_files() if f.path not in before]
            struct = spark_schema(schema)

            def plain_new():
                df = spark.read.schema(struct).parquet(*new_files).select(schema.names)
                return aggregate(df, schema).collect()[0]

            cases.append((PLAIN_NEW, plain_new))
        if with_variants:
            cases += [("keys + _change_type", feed(v, "keys + _change_type", keys_only=True)),
                      ("all columns, in order, to a noop sink", feed_noop(v, "all columns, in order, to a noop sink"))]
        res = measure(cases, args.runs, spans, f"feed {label}")
        rows = res["all columns"]["row"]["_rows"]
        if PLAIN_NEW in res and res[PLAIN_NEW]["row"]["_rows"] != rows:
            raise SystemExit(f"the new data files hold {res[PLAIN_NEW]['row']['_rows']} rows, the feed {rows}")
        want = sum(expect.values())
        if rows != want:
            raise SystemExit(f"the {label} feed has {rows} rows, expected {want}")
        got = {r["_change_type"]: r["n"] for r in
               table.changes(spark, starting_version=v, ending_version=v).groupBy("_change_type")
               .count().withColumnRenamed("count", "n").collect()}
        if got != expect:
            raise SystemExit(f"the {label} feed has {got}, expected {expect}")
        for name, c in res.items():
            row = c.pop("row")
            c["rows"] = row["_rows"] if row is not None else rows
            c["label"] = name
            c["ratio"] = c["median_s"] / res["scan"]["median_s"]
            if name in build_s:
                c["build_s"] = build_s[name][1:]  # the timed runs, after the warm-up
                c["build_median_s"] = statistics.median(c["build_s"])
        feeds.append({"label": label, "version": v, "target": target, "change_types": got,
                      "files": feed_files(table, v - 1, v), "cases": res})
        log("  " + ", ".join(f"{n} {c['median_s']:.2f} s ({c['ratio']:.3f})" for n, c in res.items()))

    n_feed = round(FEED_FRACTION * base.num_rows)
    k += 1
    feed_phase("0.1 % new keys", maker.make_mix(k, 0, n_feed, 0), k, {"insert": n_feed}, False, NEW_KEYS_TARGET)
    k += 1
    feed_phase("0.1 % random updates", maker.make_mix(k, n_feed, 0, 0), k,
               {"update_preimage": n_feed, "update_postimage": n_feed}, True, UPDATES_TARGET)

    rss.stop()
    spark.stop()
    event_log = event_dir / app_id
    notes: list[str] = []
    if event_log.exists():
        prof = spans.profile(event_log)

        def attach(c: dict):
            groups = c.pop("groups")
            c["executor_cpu_s"] = [prof[g]["executor_cpu_s"] for g in groups]
            c["task_run_s"] = [prof[g]["task_run_s"] for g in groups]
            c["cpu_median_s"] = statistics.median(c["executor_cpu_s"])
            c["input_bytes"] = int(statistics.median(prof[g]["input_bytes"] for g in groups))
            c["input_records"] = int(statistics.median(prof[g]["input_records"] for g in groups))
            c["shuffle_read_bytes"] = int(statistics.median(prof[g]["shuffle_read_bytes"] for g in groups))
            c["jobs"] = prof[groups[0]]["jobs"]
            c["stages"] = prof[groups[0]]["stages"]

        for ph in view_phases:
            for c in ph["cases"].values():
                attach(c)
            for c in ph["cases"].values():
                c["cpu_ratio"] = c["cpu_median_s"] / ph["cases"]["current"]["cpu_median_s"]
        for fd in feeds:
            for c in fd["cases"].values():
                attach(c)
            for c in fd["cases"].values():
                c["cpu_ratio"] = c["cpu_median_s"] / fd["cases"]["scan"]["cpu_median_s"]
        cpu = sum(sum(c["executor_cpu_s"]) for ph in view_phases + feeds for c in ph["cases"].values())
        run = sum(sum(c["task_run_s"]) for ph in view_phases + feeds for c in ph["cases"].values())
        if run:
            notes.append(
                f"During the timed reads the executor task threads were on a CPU {cpu / run:.0%} of their run "
                f"time (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the end of the run), "
                "so wall times vary with the machine's other jobs; the CPU-time ratios are steadier."
            )
        notes += explain(view_phases, feeds)
    else:
        log(f"no event log at {event_log}: CPU figures left out")

    result = {
        "benchmark": "timetravel",
        "date": date.strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "plain_make": plain_make,
        "machine": machine(),
        "config": {"scale_factor": sf_text(sf), "master": args.master, "runs": args.runs, "seed": args.seed,
                   "num_buckets": args.num_buckets, "small_batches": args.small_batches,
                   "small_fraction": args.small_fraction, "driver_memory": os.environ["BITLAKE_DRIVER_MEMORY"],
                   "shuffle_partitions": os.environ["BITLAKE_SHUFFLE_PARTITIONS"], "reused_table": bool(reuse)},
        "code": {**code, "note": args.code_note},
        "base_rows": base.num_rows,
        "small_batch_mix": f"{small[0]:,} updates, {small[1]:,} new keys, {small[2]:,} delete each",
        "versions": versions,
        "table_after_small": describe(versions[f"small {args.small_batches}"] if args.small_batches
                                      else versions["10 %"]),
        "views": view_phases,
        "feeds": feeds,
        "notes": notes,
        "peak_rss": rss_table(rss.peaks(spans.spans)),
        "rss_before_load": before_load,
        "base_arrow_bytes": base.nbytes,
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"timetravel-{date.strftime('%Y-%m-%d')}-sf{sf_text(sf)}.json"
    result["json_path"] = str(out.relative_to(ROOT))
    out.write_text(json.dumps(result, indent=1) + "\n")
    section = markdown(result)
    if not args.no_doc:
        write_doc(section, sf_text(sf))
    print(section)
    shutil.rmtree(table_path, ignore_errors=True)
    shutil.rmtree(work / "batches", ignore_errors=True)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
