"""An independent writer of bitlake tables, written from docs/FORMAT.md alone.

It writes what FORMAT.md says a writer must write, without importing bitlake: a second implementation's
reference. Section names quoted below ("Commit files", "Bucket hash", "Writing", ...) are FORMAT.md's. Public API:

    w = SpecWriter(base, schema, primary_key, delta_column, num_buckets=16, name=None)
    w.create() -> 0                           commit 0 (CREATE)
    w.ingest(batch_id, records) -> version    one INGEST commit: the batch landed and made live (MetaGen)
    w.checkpoint() -> version                 the state at the latest version, as a checkpoint

`records` are dicts of the table's columns plus `_op` ("upsert" or "delete"; a delete needs only the key and
delta columns), in input order. Also usable alone: `key_encoding`, `key_hash`, `bucket_of`, `envelope`.

Scope: a keyed, unpartitioned Parquet table; one writer, which keeps the state it wrote in memory (a writer that
shares the table replays the commit log before each commit and rebuilds its commit when its put-if-absent loses,
"Writing"); one landing task a batch (seq 0); whole bitmaps (no `bitmapDeltas`), no shared key-store files, no
restatements, tombstones or compaction. Only pyarrow, pyroaring and the standard library are used.
"""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import os
import uuid
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap

SET_VALID_UNTIL = 2                          # "Segment logs": event = 2
ROW_ID_COLUMNS = ("_segment_part", "_segment_seq", "_segment_offset")
COUNTS = ("inserted", "updated", "deleted", "stale", "ignored_deletes")
MASK64 = (1 << 64) - 1
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MICROS_PER_DAY = 86_400_000_000


# ------------------------------------------------------------------------------------- files and envelopes

def envelope(body: dict) -> bytes:
    """"Commit files": `{"crc32":N,"body":B}`, N the CRC-32 of exactly the bytes B. B is written as bitlake
    writes it (sorted keys, no whitespace, `\\u` escapes), which format v1 readers also verify."""
    b = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()
    return b'{"crc32":%d,"body":%s}' % (zlib.crc32(b), b)


def put_if_absent(path: str, data: bytes) -> None:
    """"Layout": an atomic put-if-absent of a complete file. On a local file system: a `.tmp-` file, then
    link(2), which fails with FileExistsError when the name is taken (O_EXCL alone could leave a torn file)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex}")
    with open(tmp, "wb") as f:
        f.write(data)
    try:
        os.link(tmp, path)
    finally:
        os.unlink(tmp)


def pack(part: int, seq: int, offset: int) -> int:
    """"Row ids": `part << 39 | seq << 23 | offset`."""
    assert 0 <= part < 1 << 24 and 0 <= seq < 1 << 16 and 0 <= offset < 1 << 23
    return part << 39 | seq << 23 | offset


def unpack(row_id: int) -> tuple[int, int, int]:
    return row_id >> 39, (row_id >> 23) & 0xFFFF, row_id & 0x7FFFFF


# ------------------------------------------------------------------------------- delta values, bucket hash

def micros(value: dt.datetime) -> int:
    """Microseconds since 1970-01-01 UTC; a datetime without time zone is read as UTC ("Delta values")."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    d = value - EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


def delta_int64(value, t: pa.DataType) -> int:
    """"Delta values": integers as they are, timestamps in microseconds, dates as their midnight UTC."""
    if pa.types.is_timestamp(t):
        out = micros(value)
    elif pa.types.is_date32(t):
        out = (value - dt.date(1970, 1, 1)).days * MICROS_PER_DAY
    else:
        out = int(value)
    if not -(1 << 63) <= out < (1 << 63) - 1:   # the largest int64 is +infinity: refused as a delta value
        raise ValueError(f"delta value {value!r} is out of range")
    return out


def decimal_text(value: decimal.Decimal, scale: int) -> str:
    """"Bucket hash": digits with exactly `scale` decimals, `-` for negatives, never an exponent; zero has no
    sign."""
    q = decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-scale))
    return format(abs(q) if q == 0 else q, "f")


def key_encoding(key: tuple, types: list[pa.DataType]) -> bytes:
    """"Bucket hash": each key column in `primary_key` order. Integers, booleans, dates (days) and timestamps
    (microseconds) as the 8 big-endian bytes of their int64 (two's complement; a uint64 its own 8 bytes);
    strings (UTF-8), binaries and decimals (their text) as a 4-byte big-endian length and the bytes."""
    out = bytearray()
    for value, t in zip(key, types, strict=True):
        if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_decimal(t):
            if pa.types.is_decimal(t):
                data = decimal_text(value, t.scale).encode()
            else:
                data = value.encode() if isinstance(value, str) else bytes(value)
            out += len(data).to_bytes(4, "big") + data
            continue
        if pa.types.is_timestamp(t):
            n = micros(value)
        elif pa.types.is_date32(t):
            n = (value - dt.date(1970, 1, 1)).days
        else:                                   # integers, booleans (0 or 1)
            n = int(value)
        out += (n & MASK64).to_bytes(8, "big")
    return bytes(out)


def key_hash(encoding: bytes) -> int:
    """"Bucket hash": fmix64(FNV-1a-64(encoding)), on unsigned 64-bit integers."""
    h = 0xCBF29CE484222325
    for b in encoding:
        h = ((h ^ b) * 0x100000001B3) & MASK64
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & MASK64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & MASK64
    return h ^ (h >> 33)


def bucket_of(key: tuple, types: list[pa.DataType], num_buckets: int) -> int:
    return key_hash(key_encoding(key, types)) % num_buckets


def key_order(key: tuple) -> tuple:
    """"Key store": ascending by the key columns in `primary_key` order; strings and binaries by their bytes."""
    return tuple(v.encode() if isinstance(v, str) else v for v in key)


# -------------------------------------------------------------------------------------------- the writer

class SpecWriter:
    def __init__(self, base: str, schema: pa.Schema, primary_key: list[str], delta_column: str,
                 num_buckets: int = 16, name: str | None = None):
        self.base, self.schema = base, schema
        self.pk, self.delta_column, self.num_buckets = list(primary_key), delta_column, num_buckets
        self.key_types = [schema.field(c).type for c in self.pk]
        self.name = name or os.path.basename(os.path.normpath(base)) or "table"
        # The state ("State and replay"), in the form a checkpoint stores it.
        self.version, self.timestamp_ms = -1, 0
        self.protocol: dict = {}
        self.metadata: dict = {}
        self.incarnations: list[dict] = []      # checkpoint `batches`, in landing order
        self.current: dict[str, int] = {}       # batch id -> part
        self.files: list[dict] = []             # add_files entries
        self.segments: dict[tuple[int, int], dict] = {}
        self.keystore: list[dict] = []          # keystore_add entries, each bucket's in their order
        self.logs: list[list] = []              # [version, log file entry]
        self.last_event_version = 0             # no commit with events yet
        self.max_part = 0

    def path(self, rel: str) -> str:
        return os.path.join(self.base, *rel.split("/"))

    # ---- commits

    def _next_timestamp_ms(self) -> int:
        """"Commit files": `timestamp_ms` strictly increases across versions."""
        return max(int(dt.datetime.now(dt.UTC).timestamp() * 1000), self.timestamp_ms + 1)

    def _commit(self, body: dict, ts: int | None = None) -> int:
        """"Commit files": the next version, created with put-if-absent."""
        version = self.version + 1
        ts = self._next_timestamp_ms() if ts is None else ts
        body = {"format_version": 2, "version": version, "timestamp_ms": ts, **body}
        body = {k: v for k, v in body.items() if v not in ([], {}, None)}  # absent keys are empty
        put_if_absent(self.path(f"_bitlake/commits/{version:020d}.json"), envelope(body))
        self.version, self.timestamp_ms = version, ts
        return version

    def create(self) -> int:
        """Commit 0: `CREATE` with the protocol and the metadata ("Protocol and features", "Metadata")."""
        self.protocol = {"min_reader_version": 2, "min_writer_version": 2, "reader_features": [],
                         "writer_features": []}
        self.metadata = {
            "name": self.name,
            "table_id": uuid.uuid4().hex,
            # one encapsulated Arrow IPC schema message, base64
            "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
            "columns": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in self.schema],
            "primary_key": self.pk,
            "delta_column": self.delta_column,
            "partition_by": [],
            "file_format": "parquet",
            "num_buckets": self.num_buckets,
            "properties": {},
        }
        return self._commit({"operation": "CREATE", "protocol": self.protocol, "metadata": self.metadata})

    def _claim_part(self) -> int:
        """"Row ids": `_bitlake/parts/<part:08d>` created with put-if-absent, from one more than the largest part
        known (the state's `max_part` and the claim files present), counting up on collision."""
        folder = self.path("_bitlake/parts")
        listed = [int(n) for n in os.listdir(folder) if n.isdigit()] if os.path.isdir(folder) else []
        part = max([self.max_part, *listed]) + 1
        while True:
            try:
                put_if_absent(os.path.join(folder, f"{part:08d}"), b"")
                return part
            except FileExistsError:
                part += 1

    # ---- ingest: landing, then MetaGen, in one INGEST commit

    def ingest(self, batch_id: str, records: list[dict]) -> int | None:
        """Lands `records` as batch `batch_id` and makes it live in one `INGEST` commit ("Writing", steps 2 to 5);
        None when the id is taken ("State and replay": ingesting it again is a no-op)."""
        if batch_id in self.current:
            return None
        self._check(records)
        part, seq = self._claim_part(), 0
        recs, add_files, keys_files = self._land(records, part, seq)
        version = self.version + 1
        events, counts, entries, valid = self._metagen(recs)
        # Segment states: the landed segment (even when all its rows are valid), and those whose valid offsets changed.
        data_rows = sum(f["rows"] for f in add_files)
        states = [{"part": part, "seq": seq, "offsets": len(records), "data_rows": data_rows}]
        states += [dict(self.segments[s]) for s in sorted(set(valid) - {(part, seq)})]
        segments = self._write_bitmaps(states, valid)
        logs = [self._write_log(events)] if events else []
        keystore_add = self._write_keystore(entries, version)
        ts = self._next_timestamp_ms()
        # "Commit files", Events: one (the table is unpartitioned) when a row's validity changed.
        data_events = [{
            "table": self.name, "partition": None, "snapshot_id": str(version),
            "snapshot_ts": dt.datetime.fromtimestamp(ts / 1000, dt.UTC).isoformat(),
            "prev_snapshot_id": str(self.last_event_version) if self.last_event_version else None,
            "table_format": "BITLAKE", "operation_type": operation_type(counts), "tags": {"batch_ids": batch_id},
        }] if any(counts[k] for k in ("inserted", "updated", "deleted")) else []
        record = {"id": batch_id, "part": part, "status": "live", "records": len(records), "keys_files": keys_files}
        v = self._commit({"operation": "INGEST", "parameters": {"batch_id": batch_id}, "batches": [record],
                          "add_files": add_files, "segments": segments, "logs": logs, "keystore_add": keystore_add,
                          "counts": counts, "batch_counts": {batch_id: counts}, "events": data_events}, ts)
        # The state after the commit ("State and replay").
        self.incarnations.append({**record, "landed_version": v, "live_version": v})
        self.current[batch_id] = part
        self.max_part = max(self.max_part, part)
        self.files += add_files
        self.segments.update({(s["part"], s["seq"]): s for s in segments})
        self.logs += [[v, f] for f in logs]
        self.keystore += keystore_add
        self.last_event_version = v if data_events else self.last_event_version
        return v

    def _check(self, records: list[dict]) -> None:
        """"Writing", step 2: a null key or delta value, +infinity, or an unknown operation refuses the batch."""
        if not records:
            raise ValueError("a batch has at least one record")
        for i, r in enumerate(records):
            if r.get("_op") not in ("upsert", "delete"):
                raise ValueError(f"record {i}: unknown operation {r.get('_op')!r}")
            for c in [*self.pk, self.delta_column]:
                if r.get(c) is None:
                    raise ValueError(f"record {i}: null in column {c!r}")
            delta_int64(r[self.delta_column], self.schema.field(self.delta_column).type)

    def _land(self, records: list[dict], part: int, seq: int) -> tuple[list[tuple], list[dict], list[dict]]:
        """"Writing", step 3: row ids (offsets count the records, upserts and deletes alike, in input order), the
        upserts' data file and the deletes' keys file. Returns the records as (delta, row id, key, is delete) and
        the files' entries."""
        dtype = self.schema.field(self.delta_column).type
        recs, upserts, deletes = [], [], []
        for offset, r in enumerate(records):
            key, rid = tuple(r[c] for c in self.pk), pack(part, seq, offset)
            d = delta_int64(r[self.delta_column], dtype)
            recs.append((d, rid, key, r["_op"] == "delete"))
            if r["_op"] == "delete":
                deletes.append({**dict(zip(self.pk, key, strict=True)), "_delta": d, "_row_id": rid,
                                "_deleted": True, "_bucket": bucket_of(key, self.key_types, self.num_buckets)})
            else:
                upserts.append({**{f.name: r.get(f.name) for f in self.schema},
                                "_segment_part": part, "_segment_seq": seq, "_segment_offset": offset})
        stem = f"{part:08d}-{seq:05d}-{uuid.uuid4().hex[:12]}"
        add_files = [self._write_data(f"data/{stem}.parquet", upserts, part, seq)] if upserts else []
        keys_files = [self._write_keys(f"_bitlake/keys/{stem}.parquet", deletes, seq)] if deletes else []
        return recs, add_files, keys_files

    def _metagen(self, recs: list[tuple]) -> tuple[list[tuple], dict, dict, dict]:
        """"Writing", step 4: the records in order of (delta value, row id) against the key store. A record older
        than its key's entry is stale; any other is accepted, ends the entry's row if that is a visible row (not a
        delete marker), and becomes the key's entry. Returns the SET_VALID_UNTIL events (target, t, cause), the
        counts, the new entry of each key with an accepted record, and the new valid offsets of each segment
        whose valid offsets changed (the landed one always)."""
        entries = self._stored_entries({key for _, _, key, _ in recs})
        events, counts, changed = [], dict.fromkeys(COUNTS, 0), {}
        landed = unpack(recs[0][1])[:2]
        valid: dict[tuple[int, int], BitMap] = {landed: BitMap()}

        def offsets_of(segment: tuple[int, int]) -> BitMap:
            if segment not in valid:
                valid[segment] = self._valid_offsets(self.segments[segment])
            return valid[segment]

        for d, rid, key, is_delete in sorted(recs, key=lambda r: (r[0], r[1])):
            last = entries.get(key)                      # (delta, row id, deleted)
            if last is not None and d < last[0]:
                counts["stale"] += 1
                continue
            ends = last is not None and not last[2]
            if ends:
                events.append((last[1], d, rid))
                p, s, o = unpack(last[1])
                offsets_of((p, s)).discard(o)
            if not is_delete:
                p, s, o = unpack(rid)
                offsets_of((p, s)).add(o)
            if is_delete:
                counts["deleted" if ends else "ignored_deletes"] += 1
            else:
                counts["updated" if ends else "inserted"] += 1
            entries[key] = changed[key] = (d, rid, is_delete)
        return events, counts, changed, valid

    def _valid_offsets(self, state: dict) -> BitMap:
        """"Bitmaps": `0 .. cardinality - 1` when `bitmap` is null, else the segment's row of the bitmap file (the
        offsets of `0 .. n - 1` it does not hold when `complement_of` is `n`), XOR its `delta` file's row."""
        if state.get("bitmap") is None:
            return BitMap(range(state["cardinality"]))

        def row(rel: str) -> BitMap:
            t = pq.read_table(self.path(rel)).to_pylist()
            r = next(r for r in t if (r["_segment_part"], r["_segment_seq"]) == (state["part"], state["seq"]))
            bm = BitMap.deserialize(r["bitmap"])
            return BitMap(range(r["complement_of"])) - bm if r.get("complement_of") is not None else bm

        valid = row(state["bitmap"])
        return valid ^ row(state["delta"]) if state.get("delta") else valid

    def _stored_entries(self, keys: set) -> dict:
        """"Key store": a key's entry is its row of the highest `_ks_version` across its bucket's files (and the
        shared files, bucket -1)."""
        wanted = {bucket_of(k, self.key_types, self.num_buckets) for k in keys} | {-1}
        best: dict[tuple, tuple] = {}
        for f in self.keystore:
            if f["bucket"] not in wanted:
                continue
            for row in pq.read_table(self.path(f["path"]), schema=self._keystore_schema()).to_pylist():
                key = tuple(row[c] for c in self.pk)
                if key in keys and (key not in best or row["_ks_version"] > best[key][3]):
                    best[key] = (row["_delta"], row["_row_id"], row["_deleted"], row["_ks_version"])
        return {k: v[:3] for k, v in best.items()}

    # ---- the files of a commit

    def _data_schema(self) -> pa.Schema:
        """"Data files": the table's columns, then the row-id columns (int32)."""
        return pa.schema(list(self.schema) + [pa.field(c, pa.int32(), False) for c in ROW_ID_COLUMNS])

    def _keystore_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c, t, False) for c, t in zip(self.pk, self.key_types, strict=True)] + [
            pa.field("_delta", pa.int64(), False), pa.field("_row_id", pa.int64(), False),
            pa.field("_deleted", pa.bool_(), False), pa.field("_ks_version", pa.int64(), False)])

    def _write(self, rel: str, table: pa.Table, **options) -> int:
        """Writes a Parquet file (never modified afterwards); returns its size, the `bytes` of its entry."""
        os.makedirs(os.path.dirname(self.path(rel)), exist_ok=True)
        pq.write_table(table, self.path(rel), **options)
        return os.path.getsize(self.path(rel))

    def _write_data(self, rel: str, rows: list[dict], part: int, seq: int) -> dict:
        """A data file of one segment, in offset order, and its `add_files` entry."""
        size = self._write(rel, pa.Table.from_pylist(rows, schema=self._data_schema()))
        return {"path": rel, "rows": len(rows), "bytes": size, "partition": None,
                "segments": [[part, seq, len(rows)]]}

    def _write_keys(self, rel: str, rows: list[dict], seq: int) -> dict:
        """"Keys files": the delete records of a segment, in offset order; its `keys_files` entry."""
        schema = pa.schema([self.schema.field(c).with_nullable(True) for c in self.pk] + [
            pa.field("_delta", pa.int64()), pa.field("_row_id", pa.int64(), False),
            pa.field("_deleted", pa.bool_(), False), pa.field("_bucket", pa.int32())])
        size = self._write(rel, pa.Table.from_pylist(rows, schema=schema), compression="zstd")
        return {"path": rel, "seq": seq, "rows": len(rows), "bytes": size}

    def _write_bitmaps(self, states: list[dict], valid: dict) -> list[dict]:
        """"Bitmaps": each state's valid offsets, `bitmap` null when they are `0 .. cardinality - 1`, else a row of
        one bitmap file for the commit (the valid offsets themselves: `complement_of` null; no `delta`)."""
        rel, rows = f"_bitlake/bitmaps/{uuid.uuid4().hex}.parquet", []
        for s in states:
            offsets = valid[(s["part"], s["seq"])]
            s["cardinality"], s["bitmap"] = len(offsets), None
            s.pop("delta", None)
            if len(offsets) and offsets.max() != len(offsets) - 1:   # not a prefix
                s["bitmap"] = rel
                offsets.run_optimize()
                rows.append({"_segment_part": s["part"], "_segment_seq": s["seq"], "bitmap": offsets.serialize(),
                             "cardinality": len(offsets), "complement_of": None})
        if rows:
            schema = pa.schema([pa.field("_segment_part", pa.int32(), False),
                                pa.field("_segment_seq", pa.int32(), False), pa.field("bitmap", pa.binary(), False),
                                pa.field("cardinality", pa.int64(), False), pa.field("complement_of", pa.int64())])
            self._write(rel, pa.Table.from_pylist(rows, schema=schema), compression="zstd", use_dictionary=False,
                        write_statistics=False)
        return states

    def _write_log(self, events: list[tuple]) -> dict:
        """"Segment logs": the commit's SET_VALID_UNTIL events, sorted by row id; its `logs` entry."""
        rel = f"_bitlake/logs/{uuid.uuid4().hex}.parquet"
        rows = [{**dict(zip(ROW_ID_COLUMNS, unpack(target), strict=True)), "event": SET_VALID_UNTIL, "t": t,
                 "cause": cause, "batch_index": 0} for target, t, cause in sorted(events)]
        schema = pa.schema([pa.field(c, pa.int32(), False) for c in ROW_ID_COLUMNS] + [
            pa.field("event", pa.int8(), False), pa.field("t", pa.int64(), False),
            pa.field("cause", pa.int64(), False), pa.field("batch_index", pa.int32(), False)])
        size = self._write(rel, pa.Table.from_pylist(rows, schema=schema), compression="zstd")
        ts = [r["t"] for r in rows]
        return {"path": rel, "events": len(rows), "bytes": size, "min_t": min(ts), "max_t": max(ts)}

    def _write_keystore(self, entries: dict, version: int) -> list[dict]:
        """"Key store": one file for each bucket the commit changes, its keys' new entries in key order, each
        with `_ks_version` = this version; a bucket's first file is its base."""
        by_bucket: dict[int, list] = {}
        for key, (d, rid, deleted) in entries.items():
            row = {**dict(zip(self.pk, key, strict=True)), "_delta": d, "_row_id": rid, "_deleted": deleted,
                   "_ks_version": version}
            by_bucket.setdefault(bucket_of(key, self.key_types, self.num_buckets), []).append(row)
        out = []
        for b in sorted(by_bucket):
            rel = f"_bitlake/keystore/bucket-{b:05d}/{uuid.uuid4().hex}.parquet"
            rows = sorted(by_bucket[b], key=lambda r: key_order(tuple(r[c] for c in self.pk)))
            size = self._write(rel, pa.Table.from_pylist(rows, schema=self._keystore_schema()), compression="zstd")
            base = not any(f["bucket"] == b for f in self.keystore)
            out.append({"bucket": b, "path": rel, "rows": len(rows), "bytes": size, "base": base})
        return out

    # ---- checkpoint

    def checkpoint(self) -> int:
        """"State and replay", Checkpoints: the state at the latest version, every key present, in the commit
        envelope; replaceable (written with a rename, not put-if-absent). `keystore` only needs each bucket's
        files in their order; grouped by bucket (in the order of each bucket's first file) as bitlake lists it."""
        buckets = list(dict.fromkeys(f["bucket"] for f in self.keystore))
        keystore = [f for b in buckets for f in self.keystore if f["bucket"] == b]
        body = {
            "protocol": self.protocol, "metadata": self.metadata, "version": self.version,
            "timestamp_ms": self.timestamp_ms, "batches": self.incarnations, "current": self.current,
            "files": self.files, "segments": list(self.segments.values()), "keystore": keystore,
            "logs": self.logs, "tombstones": [], "last_event_version": self.last_event_version,
            "max_part": self.max_part, "window": None, "rewritten": [], "purged": [],
        }
        path = self.path(f"_bitlake/state/{self.version:020d}.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex}")
        with open(tmp, "wb") as f:
            f.write(envelope(body))
        os.replace(tmp, path)
        return self.version


def operation_type(counts: dict) -> str:
    """"Commit files", Events: APPEND without updates or deletes, DELETE without inserts or updates, else UPDATE."""
    if not counts["updated"] and not counts["deleted"]:
        return "APPEND"
    if not counts["inserted"] and not counts["updated"]:
        return "DELETE"
    return "UPDATE"
