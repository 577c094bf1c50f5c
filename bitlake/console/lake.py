"""What the console's pages show, read from a table's snapshot (checkpoint plus commits), its commit log and its
metrics; never from its data files, except the change feed and past views a page asks for.

``Table.history()`` reads every commit of the window; the timeline reads only the commits of the page it shows
(:func:`timeline`), and the plot replays those commits on the snapshot of the page's oldest version.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from typing import Any

import bitlake
from bitlake.format import commitlog
from bitlake.format import state as state_mod

PAGE = 25


def when(ms: int | None) -> str:
    if not ms:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


@dataclasses.dataclass
class Summary:
    """One table of the lake page."""

    path: str
    name: str = ""
    error: str = ""
    version: int = 0
    rows: int = 0
    stored_rows: int = 0
    data_bytes: int = 0
    data_files: int = 0
    last_commit: str = ""
    superseded: float = 0.0
    small_files: int = 0
    tombstones: int = 0
    pending: int = 0
    window: str = ""
    tasks: list[str] = dataclasses.field(default_factory=list)

    @property
    def attention(self) -> tuple:
        """Sorts the table that needs attention first: errors, work maintain would do, tombstones, pending
        batches, superseded rows."""
        work = [t for t in self.tasks if not t.startswith("cleanup")]
        return (not self.error, -len(work), -self.tombstones, -self.pending, -self.superseded, self.path)


SUMMARY_SECONDS = 60.0  # how long a table's summary is shown again while its version stays the same
_summaries: dict[str, tuple[int, float, Summary]] = {}
_summaries_lock = threading.Lock()


def summary(path: str) -> Summary:
    """A table's size, versions and health, from describe() and maintain(dry_run=True); kept for
    :data:`SUMMARY_SECONDS` while the table's version stays the same (maintain's dry run lists the table's
    files for cleanup: the lake page of many tables would list them all at every load)."""
    s = Summary(path)
    try:
        t = bitlake.open_table(path)
        with _summaries_lock:
            cached = _summaries.get(path)
        if cached is not None and cached[0] == t.version and time.monotonic() - cached[1] < SUMMARY_SECONDS:
            return cached[2]
        d = t.describe()
        plan = t.maintain(dry_run=True)
    except Exception as e:  # one broken table must not hide the others
        s.error = f"{type(e).__name__}: {e}"
        return s
    m = d["maintenance"]
    s.name, s.version, s.rows, s.stored_rows = d["name"], d["version"], d["valid_rows"], d["stored_rows"]
    s.data_bytes, s.data_files = d["data_bytes"], d["data_files"]
    s.last_commit = when(t.state().timestamp_ms)
    s.superseded = (m["stored_rows"] - m["valid_rows"]) / m["stored_rows"] if m["stored_rows"] else 0.0
    s.small_files, s.tombstones, s.pending = m["small_files"], len(d["tombstones"]), len(d["pending_batches"])
    s.window = _window(d["window"])
    s.tasks = [f"{task.name}: {task.reason}" for task in plan.tasks]
    with _summaries_lock:
        _summaries[path] = (s.version, time.monotonic(), s)
    return s


def forget(path: str) -> None:
    """Drops the table's kept summary (after an action on it)."""
    with _summaries_lock:
        _summaries.pop(path, None)


def _window(window: dict | None) -> str:
    if not window:
        return ""
    return ", ".join(f"{k} {v}" for k, v in window.items())


def overview(t: bitlake.Table) -> dict[str, Any]:
    d = t.describe()
    d["window"] = _window(d["window"])
    d["last_commit"] = when(t.state().timestamp_ms)
    d["earliest_version"] = state_mod.earliest_version(t.io)
    return d


@dataclasses.dataclass
class Entry:
    """One commit of the timeline."""

    version: int
    time: str
    operation: str
    batches: str
    counts: dict[str, Any]
    files_added: int
    bytes_added: int
    files_removed: int
    events: list[dict]
    user: str = ""
    duration_ms: int | None = None


def _entry(c) -> Entry:
    ids = list(dict.fromkeys([*(b.batch_id for b in c.batches), *([c.parameters["batch_id"]]
                                                                   if c.parameters.get("batch_id") else [])]))
    statuses = {b.batch_id: b.status for b in c.batches}
    batches = ", ".join(f"{i} ({statuses[i]})" if i in statuses else i for i in ids)
    return Entry(c.version, when(c.timestamp_ms), c.operation, batches, dict(c.counts), len(c.add_files),
                 sum(f.bytes for f in c.add_files), len(c.remove_files), list(c.events), c.info.get("user", ""),
                 c.info.get("duration_ms"))


@dataclasses.dataclass
class Page:
    entries: list[Entry]
    page: int
    pages: int
    plot: tuple[list[int], list[int], list[int]]  # versions, valid rows, data bytes (oldest first)


def timeline(t: bitlake.Table, page: int = 0, *, size: int = PAGE, plot: bool = True) -> Page:
    """Commits ``page * size`` to ``(page + 1) * size`` counted back from the latest, newest first: only those
    commits are read, and the plot replays them on the snapshot of the page's oldest version."""
    latest, earliest = t.version, state_mod.earliest_version(t.io)
    pages = max(1, -(-(latest - earliest + 1) // size))
    page = min(max(page, 0), pages - 1)
    hi = latest - page * size
    lo = max(earliest, hi - size + 1)
    commits = [commitlog.read(t.io, v) for v in range(lo, hi + 1)]
    xs: list[int] = []
    rows: list[int] = []
    size_bytes: list[int] = []
    if plot:
        s = t.state(lo)
        for c in commits:
            if c.version > lo:
                s = s.applied(c)
            xs.append(s.version)
            rows.append(sum(seg.cardinality for seg in s.segments.values()))
            size_bytes.append(sum(f.bytes for f in s.data_files()))
    return Page([_entry(c) for c in reversed(commits)], page, pages, (xs, rows, size_bytes))


def batches(t: bitlake.Table) -> list[dict[str, Any]]:
    """Every batch incarnation of the snapshot, newest first, with its status and versions."""
    out = []
    for b in sorted(t.state().parts.values(), key=lambda b: (b.landed_version, b.part), reverse=True):
        out.append({"batch_id": b.batch_id, "part": b.part, "status": b.status, "records": b.records,
                    "landed": b.landed_version, "live": b.live_version, "restated": b.restated_version})
    return out


def segments(t: bitlake.Table) -> list[dict[str, Any]]:
    out = []
    for (part, seq), seg in sorted(t.state().segments.items()):
        out.append({"part": part, "seq": seq, "offsets": seg.offsets, "valid": seg.cardinality,
                    "fraction": seg.cardinality / seg.offsets if seg.offsets else 0.0})
    return out


def files(t: bitlake.Table) -> list[dict[str, Any]]:
    """The data files of the snapshot, each with the valid fraction of its rows, estimated from its segments'
    (exact when a segment lies in one file, as it does until a compaction splits it)."""
    state = t.state()
    out = []
    for f in state.data_files():
        valid = 0.0
        for sr in f.segments:
            seg = state.segments.get((sr.part, sr.seq))
            if seg is not None and seg.offsets:
                valid += sr.rows * seg.cardinality / seg.offsets
        out.append({"path": f.path, "rows": f.rows, "bytes": f.bytes, "partition": f.partition or "",
                    "segments": len(f.segments), "fraction": valid / f.rows if f.rows else 0.0})
    return out


def keystore(t: bitlake.Table) -> list[dict[str, Any]]:
    """The key store of the snapshot by bucket (bucket -1: the shared files of small tables), from the commit
    log's file entries: files, rows and bytes (docs/FORMAT.md, "Key store")."""
    out = []
    for bucket, entries in sorted(t.state().keystore.items()):
        out.append({"bucket": bucket, "files": len(entries), "rows": sum(f.rows for f in entries),
                    "bytes": sum(f.bytes for f in entries)})
    return out


def batch_detail(t: bitlake.Table, batch_id: str) -> dict[str, Any] | None:
    """A batch's incarnation and the counts of the commit that made it live (what reverting it undoes)."""
    b = t.state().batch(batch_id)
    if b is None:
        return None
    counts: dict[str, int] = {}
    if b.live_version is not None:
        counts = commitlog.read(t.io, b.live_version).batch_counts.get(batch_id, {})
    return {"batch_id": b.batch_id, "status": b.status, "records": b.records, "landed": b.landed_version,
            "live": b.live_version, "restated": b.restated_version, "counts": counts}
