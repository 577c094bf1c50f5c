"""An independent reader of bitlake tables, written from docs/FORMAT.md alone.

It reads what FORMAT.md says a reader must read and nothing else: it does not import bitlake and was
written without reading bitlake's code. Section names quoted below ("Commit files", "State and replay",
"Views", ...) are FORMAT.md's. Public API:

    read_view(base, version=None, valid_at=None) -> list[dict]     the view's rows ("Views")
    table_versions(base) -> list[int]                              the versions of the commit log
    read_changes(base, start, end) -> list[dict]                   the change feed of (start, end]

Only pyarrow, pyroaring, numpy and the standard library are used. Readability comes before speed: every
data file of a state is read in full, and an event-time view reads every log file of the state.

Spec gaps
---------
The 17 gaps this reader found in FORMAT.md when it was first written have been folded into FORMAT.md, which
now answers each one as bitlake behaves, in "Protocol and features", "Bucket hash", "Segment logs", "Commit
files", "State and replay", "Views", "Tombstones", "Change feed" and "Format v1 tables"; this reader follows
those answers.
"""
from __future__ import annotations

import base64
import json
import os
import re
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap

READER_VERSION = 2                          # "Protocol and features": R
READER_FEATURES = {"v1History", "tombstones", "restatements", "bitmapDeltas", "deletePositions"}  # "Protocol and features": F
INFINITY = 2**63 - 1                        # "Delta values": the largest int64 means +infinity
SET_VALID_UNTIL = 2                         # "Segment logs": event = 2
ROW_ID_COLUMNS = ("_segment_part", "_segment_seq", "_segment_offset")
_COMMIT_NAME = re.compile(r"^(\d{20})\.json$")


class CorruptTableError(Exception):
    """A commit or checkpoint file whose checksum or envelope is wrong ("Commit files")."""


class UnsupportedFormatVersionError(Exception):
    """A table this reader may not read ("Protocol and features")."""


def pack(part: int, seq: int, offset: int) -> int:
    """"Row ids": the packed form `part << 39 | seq << 23 | offset`."""
    return (int(part) << 39) | (int(seq) << 23) | int(offset)


def unpack(row_id: int) -> tuple[int, int, int]:
    return row_id >> 39, (row_id >> 23) & 0xFFFF, row_id & 0x7FFFFF


# ---------------------------------------------------------------------------------------------- envelope

def _read_envelope(path: str) -> dict:
    """"Commit files": `{"crc32":` N `,"body":` B `}` with N the CRC-32 of exactly the bytes B. Any other
    file must be the v1 envelope ("Format v1 tables"), N over `json.dumps(body, sort_keys=True,
    separators=(",", ":"))`; the body's `format_version` is checked by the caller."""
    with open(path, "rb") as f:
        data = f.read()
    m = re.match(rb'\{"crc32":(\d+),"body":', data)
    if m and data.endswith(b"}"):
        body_bytes = data[m.end():-1]
        if zlib.crc32(body_bytes) != int(m.group(1)):
            raise CorruptTableError(f"{path}: crc32 mismatch over the body bytes")
        try:
            return json.loads(body_bytes)
        except ValueError as e:
            raise CorruptTableError(f"{path}: body is not JSON: {e}") from None
    # Not the v2 form: it must be the v1 envelope ("Commit files").
    try:
        env = json.loads(data)
        body, crc = env["body"], int(env["crc32"])
    except (ValueError, KeyError, TypeError):
        raise CorruptTableError(f"{path}: not a commit envelope") from None
    if not isinstance(body, dict):
        raise CorruptTableError(f"{path}: the body is not a JSON object")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    if zlib.crc32(canonical) != crc:
        raise CorruptTableError(f"{path}: crc32 mismatch (format v1 canonical form)")
    return body


def _check_protocol(protocol: dict) -> None:
    """"Protocol and features": refuse `min_reader_version > R` or a reader feature outside F."""
    lacks = []
    need = int(protocol.get("min_reader_version", 0) or 0)
    if need > READER_VERSION:
        lacks.append(f"reader version {need} (this reader implements up to {READER_VERSION})")
    unknown = sorted(set(protocol.get("reader_features") or []) - READER_FEATURES)
    if unknown:
        lacks.append("reader features " + ", ".join(unknown))
    if lacks:
        raise UnsupportedFormatVersionError("table requires " + "; ".join(lacks))


# ------------------------------------------------------------------------------------------------- state

class Incarnation:
    """One landing of a batch id ("Glossary"; "State and replay" step 3)."""

    def __init__(self, rec: dict, version: int):
        self.id, self.part, self.status = rec["id"], int(rec["part"]), rec["status"]
        self.records = rec.get("records")
        self.keys_files = list(rec.get("keys_files") or [])
        self.landed_version = rec.get("landed_version", version)
        self.live_version = rec.get("live_version")


class State:
    """What commits 0..v replay to ("State and replay")."""

    def __init__(self):
        self.version = -1
        self.timestamp_ms = None
        self.protocol: dict | None = None
        self.metadata: dict | None = None
        self.schema: pa.Schema | None = None
        self.incarnations: dict[int, Incarnation] = {}   # part -> incarnation, in landing order
        self.current: dict[str, int] = {}                # batch id -> part
        self.files: dict[str, dict] = {}                 # path -> add_files entry, in the order added
        self.segments: dict[tuple[int, int], dict] = {}  # (part, seq) -> segment state
        self.logs: list[tuple[int, dict]] = []           # (version, log file entry)
        self.keystore: dict[int, list[str]] = {}         # bucket -> key-store file paths
        self.tombstones: list[tuple[int, dict]] = []     # (version, tombstone entry)
        self.last_event_version = None
        self.max_part = 0
        self.made_live: list[int] = []                   # parts the last applied commit made live, in order
        self.body: dict = {}                             # the last applied commit
        self.rewritten: dict[str, dict | None] = {}      # "Vacuum": data file path -> its rewrite

    def read_through(self, rewritten: dict) -> None:
        """"Vacuum": every version reads, in place of a data file a vacuum rewrote, the rewrite (or nothing)."""
        for path in [p for p in self.files if p in rewritten]:
            entry = self.files.pop(path)
            while entry is not None and entry["path"] in rewritten:
                entry = rewritten[entry["path"]]
            if entry is not None:
                self.files[entry["path"]] = entry

    def set_metadata(self, metadata: dict) -> None:
        """"Metadata": `schema` is an Arrow IPC schema message, base64, and authoritative."""
        self.metadata = metadata
        self.schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(metadata["schema"])))

    def apply(self, body: dict) -> None:
        """"State and replay", "Applying a commit", steps 1 to 9."""
        v = int(body["version"])
        if v != self.version + 1:
            raise CorruptTableError(f"commit {v} follows version {self.version}")
        self.version, self.timestamp_ms = v, body.get("timestamp_ms")
        if body.get("protocol"):
            _check_protocol(body["protocol"])
            self.protocol = body["protocol"]
        if body.get("metadata"):
            self.set_metadata(body["metadata"])
        self.made_live = []
        for rec in body.get("batches") or []:
            part = int(rec["part"])
            inc = self.incarnations.get(part)
            if inc is None:
                inc = self.incarnations[part] = Incarnation(rec, v)
                inc.landed_version, inc.live_version = v, None
            else:
                inc.status = rec["status"]
            if inc.status == "live" and inc.live_version is None:
                inc.live_version = v
                self.made_live.append(part)
            if inc.status != "replaced":
                self.current[inc.id] = part
            self.max_part = max(self.max_part, part)
        # "State and replay": the batch index orders the batches made live by landed version, then part.
        self.made_live.sort(key=lambda p: (self.incarnations[p].landed_version, p))
        for path in body.get("remove_files") or []:
            self.files.pop(path, None)
        for entry in body.get("add_files") or []:
            self.files[entry["path"]] = entry
        for seg in body.get("segments") or []:
            self.segments[(int(seg["part"]), int(seg["seq"]))] = seg
        removed_logs = set(body.get("remove_logs") or [])  # "Commit files": log files a major compaction folded
        self.logs = [(lv, log) for lv, log in self.logs if log["path"] not in removed_logs]
        self.logs.extend((v, log) for log in body.get("logs") or [])
        removed = set(body.get("keystore_remove") or [])
        for bucket, paths in self.keystore.items():
            self.keystore[bucket] = [p for p in paths if p not in removed]
        for ks in body.get("keystore_add") or []:
            self.keystore.setdefault(int(ks["bucket"]), []).append(ks["path"])
        self.tombstones.extend((v, tomb) for tomb in body.get("tombstones") or [])
        retired = set(body.get("remove_tombstones") or [])   # "Vacuum": tombstones a vacuum applied
        self.tombstones = [(tv, tomb) for tv, tomb in self.tombstones if tomb["path"] not in retired]
        for r in body.get("rewrites") or []:                  # "Vacuum": a file is read as its rewrite
            self.rewritten[r["path"]] = r.get("to")
        self.read_through({r["path"]: r.get("to") for r in body.get("rewrites") or []})
        if body.get("events"):
            self.last_event_version = v
        self.body = body


def _v1_as_v2(body: dict, state: State, base: str) -> dict:
    """"Format v1 tables": a v1 commit read as v2 actions."""
    out = {k: body.get(k) for k in ("version", "operation", "timestamp_ms", "segments", "logs",
                                    "keystore_add", "keystore_remove", "counts", "batch_counts", "events")}
    out["format_version"] = 1
    if body.get("metadata"):
        md = dict(body["metadata"])
        md.pop("format_version", None)
        props = dict(md.get("properties") or {})
        md["name"] = props.pop("table.name", None) or os.path.basename(os.path.normpath(base)) or "table"
        if "keystore.max_deltas" in props:
            props["keystore.max_increments"] = props.pop("keystore.max_deltas")
        md["properties"] = props
        out["metadata"] = md
        out["protocol"] = {"min_reader_version": 1, "min_writer_version": 1,
                           "reader_features": [], "writer_features": []}
    processed = list(body.get("processed") or [])
    landed = body.get("landed")
    batches, add_files = [], []
    landed_rec = None
    if landed:
        files = landed.get("files") or []
        keys = [{"path": f["path"], "seq": f["segment_seq"], "rows": f["rows"], "bytes": f.get("bytes")}
                for f in files if f.get("kind") == "keys"]
        data = [f for f in files if f.get("kind") == "data"]
        add_files = [{"path": f["path"], "rows": f["rows"], "bytes": f.get("bytes"),
                      "partition": f.get("partition"),
                      "segments": [[f["segment_part"], f["segment_seq"], f["rows"]]]} for f in data]
        landed_rec = {"id": landed["batch_id"], "part": landed["segment_part"],
                      "status": "live" if landed["batch_id"] in processed else "pending",
                      "records": sum(f["rows"] for f in (keys or data)), "keys_files": keys}
        batches.append(landed_rec)               # the landed record first, then `processed` in order
    for bid in processed:
        if landed_rec is not None and bid == landed_rec["id"]:
            continue
        if bid in state.current:
            batches.append({"id": bid, "part": state.current[bid], "status": "live"})
        else:
            raise CorruptTableError(f"v1 commit {body['version']} processes unknown batch {bid!r}")
    out["batches"], out["add_files"] = batches, add_files
    return out


def _commit_path(base: str, v: int) -> str:
    return os.path.join(base, "_bitlake", "commits", f"{v:020d}.json")


def table_versions(base: str) -> list[int]:
    """The versions of the commit log ("Layout": `_bitlake/commits/<version:020d>.json`; `.tmp-` names are
    writes in progress and are not matched)."""
    folder = os.path.join(base, "_bitlake", "commits")
    if not os.path.isdir(folder):
        return []
    return sorted(int(m.group(1)) for m in map(_COMMIT_NAME.match, os.listdir(folder)) if m)


def _read_commit(base: str, v: int, state: State) -> dict:
    """"Commit files": the body's `format_version` alone says how the commit is read."""
    body = _read_envelope(_commit_path(base, v))
    fv = body.get("format_version")
    if fv == 1:
        return _v1_as_v2(body, state, base)
    if fv != 2:
        raise UnsupportedFormatVersionError(f"commit {v} has format_version {fv} (this reader reads 1 and 2)")
    return body


def _load_checkpoint(base: str, target: int) -> State:
    """"State and replay", Checkpoints: start from the newest `_bitlake/state/<v>.json` with v <= target.
    `_bitlake/checkpoints/` (format v1) is ignored. Returns an empty state when there is none."""
    state = State()
    folder = os.path.join(base, "_bitlake", "state")
    found = sorted(int(m.group(1)) for m in map(_COMMIT_NAME.match, os.listdir(folder)) if m) \
        if os.path.isdir(folder) else []
    found = [v for v in found if v <= target]
    if not found:
        return state
    body = _read_envelope(os.path.join(folder, f"{found[-1]:020d}.json"))
    if int(body["version"]) != found[-1]:
        raise CorruptTableError(f"checkpoint {found[-1]} states version {body['version']}")
    _check_protocol(body["protocol"])
    values = lambda x: list(x.values()) if isinstance(x, dict) else list(x or [])  # noqa: E731 (lists; objects tolerated)
    state.version, state.timestamp_ms, state.protocol = int(body["version"]), body.get("timestamp_ms"), body["protocol"]
    state.set_metadata(body["metadata"])
    for rec in body.get("batches") or []:
        state.incarnations[int(rec["part"])] = Incarnation(rec, rec.get("landed_version"))
    state.current = {k: int(p) for k, p in (body.get("current") or {}).items()}
    state.files = {f["path"]: f for f in values(body.get("files"))}
    state.segments = {(int(s["part"]), int(s["seq"])): s for s in values(body.get("segments"))}
    state.logs = [(int(v), log) for v, log in body.get("logs") or []]
    state.tombstones = [(int(v), t) for v, t in body.get("tombstones") or []]
    state.rewritten = {path: f for path, f in body.get("rewritten") or []}
    state.last_event_version = body.get("last_event_version")
    state.max_part = int(body.get("max_part") or 0)
    return state


def replay(base: str, version: int | None = None, start: int | None = None):
    """Yield the state after each commit from the newest checkpoint <= `start` (default: `version`) up to
    `version` (default: the latest). The same State object is mutated and yielded each time."""
    versions = table_versions(base)
    if not versions:
        raise FileNotFoundError(f"{base}: no commits")
    latest = versions[-1]
    version = latest if version is None else int(version)
    if not 0 <= version <= latest:
        raise ValueError(f"version {version} does not exist (latest is {latest})")
    state = _load_checkpoint(base, version if start is None else max(min(start, version), 0))
    if state.version >= 0:
        yield state
    for v in range(state.version + 1, version + 1):
        if not os.path.exists(_commit_path(base, v)):
            raise CorruptTableError(f"commit {v} is missing")
        state.apply(_read_commit(base, v, state))
        yield state
    _check_later_protocols(base, state, latest)


def _check_later_protocols(base: str, state: State, latest: int) -> None:
    """"Protocol and features": a read of any version loads the latest state too, so it also checks the
    protocols committed after it: from the newest checkpoint after the version read, if any, then each later
    commit's `format_version` and `protocol`."""
    folder = os.path.join(base, "_bitlake", "state")
    later = [v for v in (int(m.group(1)) for m in map(_COMMIT_NAME.match, os.listdir(folder)) if m)
             if state.version < v <= latest] if os.path.isdir(folder) else []
    first = state.version + 1
    if later:
        ck = _read_envelope(os.path.join(folder, f"{max(later):020d}.json"))
        _check_protocol(ck["protocol"])
        first = max(later) + 1
    for v in range(first, latest + 1):
        body = _read_envelope(_commit_path(base, v))
        if body.get("format_version") not in (1, 2):
            raise UnsupportedFormatVersionError(f"commit {v} has format_version {body.get('format_version')}")
        if body.get("format_version") == 2 and body.get("protocol"):
            _check_protocol(body["protocol"])


def state_at(base: str, version: int | None = None) -> State:
    state = None
    for state in replay(base, version):  # noqa: B007 - the last state is the one wanted
        pass
    if version is not None and int(version) < table_versions(base)[-1]:
        state.read_through(state_at(base).rewritten)  # "Vacuum": the latest state's rewrites
    return state


# ------------------------------------------------------------------------------------------- file reads

class _Files:
    """Cached reads of the files a state names, relative to `base`."""

    def __init__(self, base: str):
        self.base = base
        self._data: dict[str, pa.Table] = {}
        self._bitmaps: dict[str, dict] = {}
        self._deletes: dict[str, set] = {}

    def data(self, path: str, file_format: str) -> pa.Table:
        """"Data files": Parquet or ORC, the table's columns then the row-id columns."""
        if path not in self._data:
            full = os.path.join(self.base, path)
            if file_format == "orc":
                from pyarrow import orc
                self._data[path] = orc.ORCFile(full).read()
            else:
                self._data[path] = pq.ParquetFile(full).read()
        return self._data[path]

    def conformed(self, path: str, file_format: str, schema: pa.Schema) -> pa.Table:
        """The file's rows in `schema` (a file lacking a column added later reads it as null) plus the
        row-id columns."""
        raw = self.data(path, file_format)
        cols = []
        for field in schema:
            if field.name in raw.column_names:
                cols.append(raw[field.name].cast(field.type))
            else:
                cols.append(pa.nulls(raw.num_rows, field.type))
        cols += [raw[c].cast(pa.int32()) for c in ROW_ID_COLUMNS]
        return pa.table(cols, names=list(schema.names) + list(ROW_ID_COLUMNS))

    def bitmap(self, path: str, part: int, seq: int) -> BitMap:
        """"Bitmaps": one row per segment, `bitmap` the portable Roaring serialization of the valid offsets, or,
        when `complement_of` is `n`, of the offsets of `[0, n)` that are not valid."""
        if path not in self._bitmaps:
            t = pq.read_table(os.path.join(self.base, path))
            universes = t["complement_of"].to_pylist() if "complement_of" in t.column_names else [None] * t.num_rows
            self._bitmaps[path] = {(p, s): (b, n) for p, s, b, n in zip(t["_segment_part"].to_pylist(),
                                                                         t["_segment_seq"].to_pylist(),
                                                                         t["bitmap"].to_pylist(), universes,
                                                                         strict=False)}
        raw = self._bitmaps[path].get((part, seq))
        if raw is None:
            raise CorruptTableError(f"bitmap file {path} has no segment ({part}, {seq})")
        stored, n = raw
        bm = BitMap.deserialize(stored)
        return bm if n is None else BitMap(range(n)) - bm

    def deleted_row_ids(self, path: str) -> set:
        """"Keys files": the packed row ids of the delete records (`_deleted`)."""
        if path not in self._deletes:
            t = pq.read_table(os.path.join(self.base, path), columns=["_row_id", "_deleted"])
            self._deletes[path] = {r for r, d in zip(t["_row_id"].to_pylist(), t["_deleted"].to_pylist(), strict=False) if d}
        return self._deletes[path]

    def until_events(self, logs) -> list[tuple[int, int, int, int, int]]:
        """"Segment logs": the SET_VALID_UNTIL events (event = 2) of `logs` ((listing version, entry) pairs) as
        (version, target packed row id, t, cause, batch_index); `event = 1` (v1 only) is ignored. An event's
        version is its file's `version` column where the file has one (a regrouped or folded file), else -1
        in a folded file (older than any other), else the version that lists the file."""
        out = []
        for v, log in logs:
            t = pq.read_table(os.path.join(self.base, log["path"]))
            n = t.num_rows
            bidx = t["batch_index"].to_pylist() if "batch_index" in t.column_names else [0] * n
            listed = -1 if log.get("folded") else v
            versions = t["version"].to_pylist() if "version" in t.column_names else [listed] * n
            for p, s, o, ev, tt, cause, bi, ver in zip(*(t[c].to_pylist() for c in ROW_ID_COLUMNS),
                                                         t["event"].to_pylist(), t["t"].to_pylist(),
                                                         t["cause"].to_pylist(), bidx, versions, strict=False):
                if ev == SET_VALID_UNTIL:
                    out.append((ver, pack(p, s, o), tt, cause, bi))
        return out


def delta_int64(arr) -> np.ndarray:
    """"Delta values": integers as they are, timestamps as microseconds since 1970-01-01 UTC (a timestamp
    without time zone read as UTC: the stored number is the same), dates as their midnight UTC in
    microseconds."""
    t = arr.type
    if pa.types.is_integer(t):
        out = arr.cast(pa.int64())
    elif pa.types.is_timestamp(t):
        out = arr.cast(pa.timestamp("us", t.tz)).cast(pa.int64())
    elif pa.types.is_date32(t):
        out = pc.multiply(arr.cast(pa.int32()).cast(pa.int64()), 86_400_000_000)
    elif pa.types.is_date64(t):
        out = pc.multiply(arr.cast(pa.int64()), 1000)
    else:
        raise UnsupportedFormatVersionError(f"delta column of type {t}")
    return np.asarray(out.to_numpy(zero_copy_only=False), dtype=np.int64)


def _is_valid(files: _Files, seg: dict, offset: int, cache: dict) -> bool:
    """"Bitmaps": the valid offsets are the named bitmap, or `0 .. cardinality - 1` when `bitmap` is null; with a
    `delta` ("Deltas"), the bitmap's valid offsets XOR the offsets the delta file's row holds."""
    if seg.get("bitmap") is None:
        return offset < int(seg["cardinality"])
    key = (seg["bitmap"], seg.get("delta"), int(seg["part"]), int(seg["seq"]))
    if key not in cache:
        valid = files.bitmap(seg["bitmap"], *key[2:])
        cache[key] = valid ^ files.bitmap(seg["delta"], *key[2:]) if seg.get("delta") else valid
    return offset in cache[key]


def _row_ids(tbl: pa.Table) -> list[tuple[int, int, int]]:
    return list(zip(*(tbl[c].to_pylist() for c in ROW_ID_COLUMNS), strict=False))


def _tombstone_sets(files: _Files, state: State) -> list[tuple[int, str, set]]:
    """"Tombstones": (version w, column, values) with the values of the file's first column, whatever its
    name; applied whether or not the protocol lists the feature."""
    out = []
    for w, tomb in state.tombstones:
        t = pq.read_table(os.path.join(files.base, tomb["path"]))
        col = t.column(0).cast(state.schema.field(tomb["column"]).type)
        out.append((w, tomb["column"], {x for x in col.to_pylist() if x is not None}))
    return out


# ---------------------------------------------------------------------------------------------- views

def read_view(base: str, version: int | None = None, valid_at: int | None = None) -> list[dict]:
    """The rows of the view at `version` (default: latest) and event time `valid_at` (an int64 delta value,
    see "Delta values"; None = +infinity), following "Views" rule by rule, then "Tombstones"."""
    state = state_at(base, version)
    md, schema = state.metadata, state.schema
    delta_col = md.get("delta_column")
    if valid_at is not None and not delta_col:
        raise ValueError("valid_at needs a keyed table (\"Views\": unkeyed tables have no event time)")
    t = INFINITY if valid_at is None else int(valid_at)
    files = _Files(base)
    # Latest SET_VALID_UNTIL event per row: the one of the highest version, the first of several in one
    # commit ("Segment logs"). Only needed for a finite t (for t = +infinity, `t < u` never holds). All log
    # files are read, not only those with `max_t > t` or `resets` ("Views": the same view).
    latest_until: dict[int, tuple[int, int]] = {}
    if t != INFINITY and delta_col:
        for v, target, u, _cause, _bi in files.until_events(state.logs):
            if target not in latest_until or v > latest_until[target][0]:
                latest_until[target] = (v, u)
    tombs = _tombstone_sets(files, state)
    bitmaps: dict = {}
    rows = []
    for path in state.files:
        tbl = files.conformed(path, md.get("file_format", "parquet"), schema)
        deltas = delta_int64(tbl[delta_col]) if delta_col else None
        keep = []
        for i, (p, s, o) in enumerate(_row_ids(tbl)):
            seg = state.segments.get((p, s))
            if seg is None:                       # pending: in no view
                continue
            d = int(deltas[i]) if deltas is not None else None
            if _is_valid(files, seg, o, bitmaps):
                ok = d is None or d <= t
            elif pack(p, s, o) in latest_until:
                u = latest_until[pack(p, s, o)][1]
                ok = d is not None and d <= t < u
            else:                                  # stale, or superseded in the commit that landed it
                ok = False
            if ok:
                keep.append(i)
        if not keep:
            continue
        taken = tbl.take(keep)
        out = taken.select(schema.names).to_pylist()
        for row, p in zip(out, taken["_segment_part"].to_pylist(), strict=False):
            inc = state.incarnations.get(p)
            live = inc.live_version if inc is not None else None
            if any(live is not None and live < w and row.get(col) in values for w, col, values in tombs):
                continue
            rows.append(row)
    return rows


# --------------------------------------------------------------------------------------- change feed

def read_changes(base: str, start: int, end: int) -> list[dict]:
    """The change feed of versions (start, end] ("Change feed"): the table's columns (schema at `end`)
    plus `_change_type` and `_commit_version`, ordered by (commit version, batch index, delta value, cause,
    preimages/deletes before inserts/postimages). Row values come from the data files of the state at `end`."""
    start = max(int(start), -1)
    per_commit = []                 # (c, parts made live, in batch-index order, c's body)
    state = None
    for state in replay(base, end, start=start):
        if state.version > start:
            per_commit.append((state.version, list(state.made_live), state.body))
    if state is None or state.version <= start:
        return []
    if end < table_versions(base)[-1]:
        state.read_through(state_at(base).rewritten)  # "Vacuum": the latest state's rewrites
    end_state, schema, md = state, state.schema, state.metadata
    delta_col, fmt = md.get("delta_column"), md.get("file_format", "parquet")
    files = _Files(base)
    # Every log file of the state at `end` but folded ones (which hold no event of a range inside the window);
    # only the events of versions in (start, end] are changes of the range.
    range_logs = [(v, log) for v, log in end_state.logs if not log.get("folded")]
    events = [e for e in files.until_events(range_logs) if start < e[0] <= end] if delta_col else []
    bitmaps: dict = {}

    def rows_of(paths: list[str], wanted) -> dict[tuple, tuple[dict, int]]:
        """Rows of `paths` whose row id satisfies `wanted`: row id -> (row dict, delta int64)."""
        found = {}
        for path in paths:
            tbl = files.conformed(path, fmt, schema)
            ids = _row_ids(tbl)
            idx = [i for i, rid in enumerate(ids) if wanted(rid) and rid not in found]
            if not idx:
                continue
            taken = tbl.take(idx)
            deltas = delta_int64(taken[delta_col]) if delta_col else np.zeros(len(idx), dtype=np.int64)
            for row, rid, d in zip(taken.select(schema.names).to_pylist(), _row_ids(taken), deltas, strict=False):
                found[rid] = (row, int(d))
        return found

    def files_holding(segs: set) -> list[str]:
        """Files of the state at `end` listing one of `segs` in their data-to-segment mapping."""
        holds = lambda e: any((int(p), int(s)) in segs for p, s, _ in e.get("segments") or [])  # noqa: E731
        return [p for p, e in end_state.files.items() if holds(e)]

    out = []
    for c, made_live, body in per_commit:
        if body.get("change_files"):
            # A restatement: its change rows are its change files' rows, in their `_order`.
            for cf in body["change_files"]:
                t = pq.read_table(os.path.join(base, cf["path"]))
                if len(t.column_names) > 3:
                    # A vacuum's: the rows carry their key and delta columns (no data file holds them).
                    for rec in t.to_pylist():
                        kind, order = rec.pop("_change_type"), rec.pop("_order")
                        rec.pop("_row_id")
                        row = {n: rec.get(n) for n in schema.names}
                        first = 0 if kind in ("update_preimage", "delete") else 1
                        out.append(((c, 0, order, 0, first), row, kind, c))
                    continue
                wanted = {unpack(r): (kind, order) for r, kind, order in
                          zip(t["_row_id"].to_pylist(), t["_change_type"].to_pylist(), t["_order"].to_pylist(),
                              strict=True)}
                found = rows_of(files_holding({(p, s) for p, s, _ in wanted}), lambda rid: rid in wanted)  # noqa: B023
                for rid, (kind, order) in wanted.items():
                    if rid in found:
                        first = 0 if kind in ("update_preimage", "delete") else 1
                        out.append(((c, 0, order, 0, first), found[rid][0], kind, c))
            continue
        own_segments = {(int(x["part"]), int(x["seq"])): x for x in body.get("segments") or []}
        batch_index = {part: i for i, part in enumerate(made_live)}
        # New rows: the rows of the segments of the batches c made live.
        segs = {seg for seg in end_state.segments if seg[0] in batch_index} | \
               {(int(p), int(s)) for e in end_state.files.values() for p, s, _ in e.get("segments") or []
                if int(p) in batch_index}
        new_rows = rows_of(files_holding(segs), lambda rid: rid[0] in batch_index)  # noqa: B023 - called within the iteration
        c_events = [e for e in events if e[0] == c]
        causes = {e[3] for e in c_events}
        targeted = {e[1] for e in c_events}
        for (p, s, o), (row, d) in new_rows.items():
            rid = pack(p, s, o)
            if delta_col:
                # Valid in the segment state c wrote, or superseded by an event of c: accepted.
                seg = own_segments.get((p, s)) or end_state.segments.get((p, s))
                valid_then = seg is not None and _is_valid(files, seg, o, bitmaps)
                if not valid_then and rid not in targeted:
                    continue                      # stale
                kind = "update_postimage" if rid in causes else "insert"
            else:
                kind = "insert"                   # unkeyed: ordered by (version, batch index, row id)
            out.append(((c, batch_index[p], d if delta_col else 0, rid, 1), row, kind, c))
        # Event targets: delete when the cause is a delete record (keys files of its batch), else preimage.
        targets = {unpack(e[1]) for e in c_events}
        target_rows = rows_of(files_holding({(p, s) for p, s, _ in targets}),
                              lambda rid: rid in targets)  # noqa: B023 - called within the iteration
        for _v, target, tt, cause, bi in c_events:
            tp = unpack(target)
            if tp not in target_rows:
                continue                          # in no data file of the state at `end`: no change row
            inc = end_state.incarnations.get(unpack(cause)[0])
            deletes = set().union(*(files.deleted_row_ids(k["path"]) for k in inc.keys_files)) if inc else set()
            kind = "delete" if cause in deletes else "update_preimage"
            out.append(((c, bi, tt, cause, 0), target_rows[tp][0], kind, c))
    out.sort(key=lambda x: x[0])
    return [dict(row, _change_type=kind, _commit_version=c) for _key, row, kind, c in out]


# ------------------------------------------------------------------------------------------ self-check

def _canon(rows: list[dict]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)


if __name__ == "__main__":
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    fixtures = os.path.join(here, "fixtures", "v1")
    failures = 0
    for name in sorted(os.listdir(fixtures)):
        base = os.path.join(fixtures, name)
        exp_path = os.path.join(base, "expected.json")
        versions = table_versions(base)
        if not os.path.exists(exp_path):
            for v in versions:                    # no expectations: the reads must at least succeed
                read_view(base, v)
            print(f"{name}: read {len(versions)} versions (no expected.json)")
            continue
        expected = json.load(open(exp_path))
        checks = []
        for v, rows in expected.get("views", {}).items():
            checks.append((f"view v{v}", read_view(base, int(v)), rows))
        for v, rows in expected.get("views_at_25", {}).items():
            checks.append((f"view v{v} valid_at=25", read_view(base, int(v), valid_at=25), rows))
        all_changes = []
        for v, rows in expected.get("changes", {}).items():
            checks.append((f"changes ({int(v) - 1}, {v}]", read_changes(base, int(v) - 1, int(v)), rows))
            all_changes += rows
        checks.append((f"changes (0, {versions[-1]}]", read_changes(base, 0, versions[-1]), all_changes))
        for label, got, want in checks:
            ok = _canon(got) == _canon(want)
            failures += not ok
            print(f"{name}: {label}: {'ok' if ok else 'MISMATCH'}")
            if not ok:
                print("  got ", _canon(got))
                print("  want", _canon(want))
    sys.exit(1 if failures else 0)
