"""Data landing: the first of Opal's two steps. Executors write the batch as data files that carry
the row-id columns, and report back what they wrote; nothing becomes visible here.

Each task assigns ``segment_seq`` = its partition index and ``segment_offset`` = the row's position in
the task, so a batch's row-id order is its input order (the contract's "position in the batch").
Upserts go to data files (in the table's format, under Hive-style partition folders when the table is
partitioned; partition columns also stay in the file). In a keyed table every record, upsert or
delete, also goes to the task's keys file: key, delta as int64, packed row id, delete flag and
key-store bucket, which is all MetaGen reads. File names start with the batch's segment part, so a
failed landing can remove everything it wrote.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bitlake import rowid
from bitlake.commitlog import DataFile
from bitlake.errors import NullValueError, UnknownOperationError
from bitlake.schema import OP_COLUMN, OPERATIONS, TableMetadata

OUTPUT_SCHEMA = (
    "kind string, path string, seq int, rows long, bytes long, partition string, "
    "nulls string, bad_ops long, bad_op_sample string"
)
DATA_DIR = "data"
KEYS_DIR = "_bitlake/keys"
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def partition_dir(values: dict[str, str | None]) -> str:
    """Hive-style ``col=value`` folders, escaped as Hive does, so plain Spark discovers them."""
    parts = []
    for col, value in values.items():
        text = NULL_PARTITION if value is None else quote(value, safe=" ")
        parts.append(f"{quote(col, safe='')}={text}")
    return "/".join(parts)


def _partition_text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "isoformat"):
        return value.isoformat(sep=" ") if hasattr(value, "hour") else value.isoformat()
    return str(value)


def keys_schema(meta: TableMetadata) -> pa.Schema:
    """A keys file: what MetaGen needs of every landed record, in landing (row id) order."""
    from bitlake import keystore

    return pa.schema(
        [meta.schema.field(c).with_nullable(True) for c in meta.primary_key]
        + [
            pa.field(keystore.DELTA, pa.int64()),
            pa.field(keystore.ROW_ID, pa.int64(), False),
            pa.field(keystore.DELETED, pa.bool_(), False),
            pa.field(keystore.BUCKET, pa.int32()),
        ]
    )


def data_schema(meta: TableMetadata) -> pa.Schema:
    return pa.schema(list(meta.schema) + [pa.field(c, pa.int32(), False) for c in rowid.ROW_ID_COLUMNS])


# Row groups hold up to this many rows / bytes of Arrow data. Spark hands a task 10,000-row Arrow batches;
# writing each as its own row group made files ~1.5x larger (a dictionary per column per row group) and
# slower to scan, so a writer buffers batches into row groups of Parquet's usual size.
ROW_GROUP_ROWS = 1 << 20
ROW_GROUP_BYTES = 128 << 20
# A task flushes every writer once their buffers hold this much together (many partition folders).
TASK_BUFFER_BYTES = 512 << 20


def _parquet_options(schema: pa.Schema) -> dict:
    """Writer options: snappy, dictionaries as usual, except ``_segment_offset`` (distinct, ascending
    values) in DELTA_BINARY_PACKED, which stores it in almost nothing instead of ~5 bytes a row."""
    buf = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), buf)
    pschema = pq.ParquetFile(pa.BufferReader(buf.getvalue())).schema
    leaves = [pschema.column(i).path for i in range(len(pschema))]
    if rowid.OFFSET_COLUMN not in leaves:
        return {"compression": "snappy"}
    return {
        "compression": "snappy",
        "use_dictionary": [c for c in leaves if c != rowid.OFFSET_COLUMN],
        "column_encoding": {rowid.OFFSET_COLUMN: "DELTA_BINARY_PACKED"},
    }


def _keys_parquet_options(schema: pa.Schema) -> dict:
    """Keys files are read only by MetaGen, so they take zstd; row ids ascend and deltas and integer
    keys are mostly close to their neighbours, which DELTA_BINARY_PACKED stores in a few bits (on TPC-H
    lineitem: 0.9 bytes a record against 7.2 with snappy and dictionaries)."""
    from bitlake import keystore

    def delta_packed(f: pa.Field) -> bool:
        t = f.type
        return pa.types.is_integer(t) or pa.types.is_date32(t) or pa.types.is_timestamp(t)

    packed = [f.name for f in schema if f.name not in (keystore.DELETED, keystore.BUCKET) and delta_packed(f)]
    return {
        "compression": "zstd",
        "use_dictionary": [n for n in schema.names if n not in packed],
        "column_encoding": dict.fromkeys(packed, "DELTA_BINARY_PACKED"),
    }


class _Writer:
    """One open output file of a task; buffers incoming batches into full-size row groups."""

    def __init__(self, path: str, schema: pa.Schema, file_format: str, options: dict | None = None):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        self.partition: dict | None = None
        self.rows = 0
        self._buffer: list[pa.Table] = []
        self._buffered_rows = 0
        self.buffered_bytes = 0
        if file_format == "orc":
            import pyarrow.orc as orc

            self._orc = orc.ORCWriter(path)
            self._pq = None
        else:
            self._orc = None
            self._pq = pq.ParquetWriter(path, schema, **(options or _parquet_options(schema)))

    def write(self, table: pa.Table) -> None:
        self.rows += table.num_rows
        self._buffer.append(table)
        self._buffered_rows += table.num_rows
        self.buffered_bytes += table.nbytes
        if self._buffered_rows >= ROW_GROUP_ROWS or self.buffered_bytes >= ROW_GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        table = pa.concat_tables(self._buffer)
        self._buffer, self._buffered_rows, self.buffered_bytes = [], 0, 0
        if self._pq is not None:
            self._pq.write_table(table, row_group_size=ROW_GROUP_ROWS)
        else:
            self._orc.write(table)

    def close(self) -> int:
        self.flush()
        (self._pq or self._orc).close()
        return os.path.getsize(self.path)


@dataclasses.dataclass
class LandTask:
    """The function each landing task runs (``mapInArrow``); picklable, holds only plain values."""

    base: str
    metadata: dict
    part: int
    num_partitions: int
    has_op: bool

    def __call__(self, batches):
        from pyspark import TaskContext

        from bitlake.schema import TableMetadata

        meta = TableMetadata.from_json(self.metadata)
        task = TaskContext.get().partitionId()
        attempt = uuid.uuid4().hex[:12]
        out_schema = data_schema(meta)
        key_schema = keys_schema(meta) if meta.keyed else None
        checked = list(meta.primary_key) + ([meta.delta_column] if meta.delta_column else [])
        nulls = dict.fromkeys(checked, 0)
        bad_ops, bad_sample = 0, None
        writers: dict[tuple, _Writer] = {}
        seq, offset = task, 0

        def writer(kind: str, pdir: str, partition) -> _Writer:
            key = (kind, pdir, seq)
            if key not in writers:
                name = f"{self.part:08d}-{seq:05d}-{attempt}"
                if kind == "data":
                    folder = os.path.join(self.base, DATA_DIR, pdir) if pdir else os.path.join(self.base, DATA_DIR)
                    path = os.path.join(folder, f"{name}.{meta.file_format}")
                    writers[key] = _Writer(path, out_schema, meta.file_format)
                else:
                    path = os.path.join(self.base, KEYS_DIR, f"{name}.parquet")
                    writers[key] = _Writer(path, key_schema, "parquet", _keys_parquet_options(key_schema))
                writers[key].partition = partition
            return writers[key]

        for rb in batches:
            table = pa.Table.from_batches([rb])
            start = 0
            while start < table.num_rows:
                # A task with more rows than one segment holds rolls over to a fresh segment_seq.
                if offset > rowid.MAX_OFFSET:
                    seq += self.num_partitions
                    offset = 0
                    if seq > rowid.MAX_SEQ:
                        raise ValueError("batch too large: more segments than segment_seq can number")
                n = min(table.num_rows - start, rowid.MAX_OFFSET + 1 - offset)
                chunk = table.slice(start, n)
                start += n
                for c in checked:
                    nulls[c] += chunk.column(c).null_count
                chunk = chunk.append_column(rowid.PART_COLUMN, pa.array(np.full(n, self.part, np.int32)))
                chunk = chunk.append_column(rowid.SEQ_COLUMN, pa.array(np.full(n, seq, np.int32)))
                offsets = np.arange(offset, offset + n, dtype=np.int32)
                chunk = chunk.append_column(rowid.OFFSET_COLUMN, pa.array(offsets))
                offset += n
                is_delete = None
                if self.has_op:
                    op = chunk.column(OP_COLUMN)
                    known = pc.fill_null(pc.is_in(op, pa.array(OPERATIONS)), False)
                    if not pc.all(known).as_py():
                        unknown = chunk.filter(pc.invert(known)).column(OP_COLUMN)
                        bad_ops += len(unknown)
                        if bad_sample is None:
                            bad_sample = repr(unknown[0].as_py())
                    is_delete = pc.fill_null(pc.equal(op, "delete"), False)
                if key_schema is not None:
                    writer("keys", "", None).write(
                        _keys(chunk, rowid.segment_key(self.part, seq), key_schema, is_delete, meta)
                    )
                if is_delete is not None:
                    chunk = chunk.filter(pc.invert(is_delete))
                chunk = chunk.select(out_schema.names)
                if chunk.num_rows == 0:
                    continue
                if not meta.partition_by:
                    writer("data", "", None).write(chunk.cast(out_schema))
                    continue
                groups = chunk.group_by(list(meta.partition_by), use_threads=False).aggregate([])
                for values in groups.to_pylist():
                    mask = None
                    for col, value in values.items():
                        m = pc.is_null(chunk.column(col)) if value is None else pc.equal(chunk.column(col), value)
                        m = pc.fill_null(m, False)
                        mask = m if mask is None else pc.and_(mask, m)
                    texts = {c: _partition_text(v) for c, v in values.items()}
                    part_rows = chunk.filter(mask)
                    writer("data", partition_dir(texts), texts).write(part_rows.cast(out_schema))
            if sum(w.buffered_bytes for w in writers.values()) > TASK_BUFFER_BYTES:
                for w in writers.values():
                    w.flush()

        rows = []
        for (kind, _, file_seq), w in writers.items():
            size = w.close()
            rows.append({
                "kind": kind,
                "path": os.path.relpath(w.path, self.base),
                "seq": file_seq,
                "rows": w.rows,
                "bytes": size,
                "partition": json.dumps(w.partition) if w.partition is not None else None,
                "nulls": None,
                "bad_ops": 0,
                "bad_op_sample": None,
            })
        rows.append({
            "kind": "check", "path": None, "seq": task, "rows": 0, "bytes": 0, "partition": None,
            "nulls": json.dumps(nulls), "bad_ops": bad_ops, "bad_op_sample": bad_sample,
        })
        yield pa.RecordBatch.from_pylist(rows, schema=_OUTPUT_ARROW)


def _keys(chunk: pa.Table, segment_key: int, schema: pa.Schema, is_delete, meta: TableMetadata) -> pa.Table:
    """The keys-file rows of a chunk of one segment (``segment_key``: :func:`bitlake.rowid.segment_key`)."""
    from bitlake import keystore

    packed = chunk.column(rowid.OFFSET_COLUMN).to_numpy().astype(np.int64) | np.int64(segment_key)
    deleted = is_delete if is_delete is not None else pa.array(np.zeros(chunk.num_rows, dtype=bool))
    columns = [chunk.column(c) for c in meta.primary_key] + [
        chunk.column(keystore.DELTA), pa.array(packed), deleted, chunk.column(keystore.BUCKET),
    ]
    return pa.Table.from_arrays(columns, schema=schema)


_OUTPUT_ARROW = pa.schema([
    ("kind", pa.string()), ("path", pa.string()), ("seq", pa.int32()), ("rows", pa.int64()),
    ("bytes", pa.int64()), ("partition", pa.string()), ("nulls", pa.string()), ("bad_ops", pa.int64()),
    ("bad_op_sample", pa.string()),
])


def land(df, meta: TableMetadata, base: str, part: int, has_op: bool) -> list[DataFile]:
    """Writes ``df`` (already conformed to the table schema) as the files of segment part ``part``.

    Raises NullValueError / UnknownOperationError after removing every file the job wrote.
    """
    from bitlake import keystore
    from bitlake.schema import spark_delta_as_long

    num_partitions = max(df.rdd.getNumPartitions(), 1)
    if meta.keyed:
        # The key-store bucket and the int64 delta are computed by Spark, so that they are exactly
        # what a Spark MetaGen would compute; the task writes them to the keys file.
        df = df.withColumn(keystore.DELTA, spark_delta_as_long(meta)).withColumn(
            keystore.BUCKET, keystore.spark_bucket(meta)
        )
    task = LandTask(base, meta.to_json(), part, num_partitions, has_op)
    try:
        out = [r.asDict() for r in df.mapInArrow(task, OUTPUT_SCHEMA).collect()]
    except Exception:
        remove_part_files(base, part)
        raise
    nulls: dict[str, int] = {}
    bad_ops, bad_sample = 0, None
    files = []
    for r in out:
        if r["kind"] == "check":
            for c, n in json.loads(r["nulls"]).items():
                nulls[c] = nulls.get(c, 0) + n
            bad_ops += r["bad_ops"]
            bad_sample = bad_sample or r["bad_op_sample"]
            continue
        files.append(DataFile(
            path=r["path"], kind=r["kind"], segment_part=part, segment_seq=r["seq"], rows=r["rows"],
            bytes=r["bytes"], partition=json.loads(r["partition"]) if r["partition"] else None,
        ))
    error: Exception | None = None
    for c, n in nulls.items():
        if n:
            role = "delta column" if c == meta.delta_column else "primary key column"
            error = NullValueError(f"{role} {c!r} holds {n} null value(s); nothing of this batch was written")
            break
    if error is None and bad_ops:
        error = UnknownOperationError(
            f"op column holds {bad_ops} value(s) other than {list(OPERATIONS)}, e.g. {bad_sample}; "
            "nothing of this batch was written"
        )
    if error is not None:
        remove_part_files(base, part)
        raise error
    files.sort(key=lambda f: (f.segment_seq, f.kind, f.path))
    return files


def remove_part_files(base: str, part: int) -> None:
    """Removes every file a landing job of segment part ``part`` wrote (committed ones never qualify:
    a part is claimed by exactly one job, and this runs only when that job failed)."""
    prefix = f"{part:08d}-"
    for folder in (os.path.join(base, DATA_DIR), os.path.join(base, KEYS_DIR)):
        for dirpath, _, names in os.walk(folder):
            for name in names:
                if name.startswith(prefix):
                    os.unlink(os.path.join(dirpath, name))
