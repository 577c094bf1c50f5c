"""Database change streams into a table: Debezium change events (docs/cdc.md).

A Debezium message is a key and a value; the value is the change envelope (``op`` c/u/d/r/t, ``before``,
``after``, ``source``, ``ts_ms``), with or without the JSON converter's ``schema`` section; a value of null
is a tombstone (Kafka's log-compaction marker after a delete) and carries nothing to apply. Each change
becomes one record:

* ``c`` (insert), ``u`` (update), ``r`` (a snapshot read): an upsert of ``after``;
* ``d``: a delete of ``before``'s key (``before`` holds at least the key under any replica identity);
* ``t`` (TRUNCATE): a delete of every key the table holds at that point.

The delta column takes the change's position in the source: ``position="lsn"`` (PostgreSQL's
``source.lsn``: a row's changes are totally ordered by it, since a row is locked until its transaction
ends; snapshot reads are at 0, older than every streamed change), or ``position="ts_ms"`` (the change's
commit time in ms; ties go to the later arrival, as the contract orders any tie). Values are converted by
the envelope's schema section where it has one (Debezium's logical types: ``Decimal`` as base64 bytes,
``Date`` as days, ``MicroTimestamp``, ``ZonedTimestamp``...), else by the table's column types.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import json
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from bitlake import batches as batches_mod
from bitlake.errors import InvalidInputError, NullValueError, SchemaMismatchError
from bitlake.format.metadata import TableMetadata

OP = "_cdc_op"
POSITIONS = ("lsn", "ts_ms")
# Debezium's decimal.handling.mode, for messages without a schema section: "precise" sends a decimal as base64
# bytes, "string" and "double" as the number.
DECIMAL_HANDLING = ("precise", "string", "double")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def changes(messages: Iterable[Any]) -> Iterator[dict]:
    """The change envelopes of ``messages`` (Kafka-style ``{"key", "value"}`` dicts or JSON lines of them,
    envelopes with or without their ``schema``/``payload`` wrapper, as dicts or JSON text); tombstones and
    messages without an ``op`` (heartbeats, schema changes) are skipped."""
    for m in messages:
        if isinstance(m, (bytes, str)):
            m = json.loads(m) if m.strip() else None
        if m is None:
            continue
        if "value" in m and "op" not in m and "payload" not in m:
            m = m["value"]
            if m is None:
                continue  # a tombstone
            if isinstance(m, (bytes, str)):
                m = json.loads(m)
        envelope = m.get("payload", m) if isinstance(m, dict) else None
        if not isinstance(envelope, dict) or "op" not in envelope:
            continue
        schema = m.get("schema") if "payload" in m else None
        yield {**envelope, "_schema": schema}


def _fields(schema: dict | None, side: str) -> dict[str, dict]:
    """The Connect schema of each column of ``before`` or ``after``, from the envelope's schema section."""
    if not schema:
        return {}
    for f in schema.get("fields", ()):
        if f.get("field") == side:
            return {c["field"]: c for c in f.get("fields", ())}
    return {}


# Debezium's unavailable.value.placeholder (its default, and as base64 for a binary column).
_UNAVAILABLE = ("__debezium_unavailable_value", base64.b64encode(b"__debezium_unavailable_value").decode())
# Units of the integer times of Debezium's and Kafka Connect's logical types (time.precision.mode adaptive or
# connect), per second.
_PER_SECOND = {"io.debezium.time.Timestamp": 1_000, "io.debezium.time.NanoTimestamp": 1_000_000_000,
               "io.debezium.time.Time": 1_000, "io.debezium.time.NanoTime": 1_000_000_000,
               "org.apache.kafka.connect.data.Timestamp": 1_000, "org.apache.kafka.connect.data.Time": 1_000}


def _unscaled(unscaled: int, scale: int) -> decimal.Decimal:
    """The decimal ``unscaled * 10^-scale``, exactly (scaleb rounds to the context's 28 digits)."""
    sign, digits = (1 if unscaled < 0 else 0), tuple(int(d) for d in str(abs(unscaled)))
    return decimal.Decimal((sign, digits, -scale))


def convert(value: Any, target: pa.DataType, connect: dict | None, decimal_handling: str = "precise") -> Any:
    """A Debezium JSON value as a Python value of Arrow type ``target``: by its Connect logical type when
    the schema section names one, else by the target type (a decimal's text as base64 bytes when
    ``decimal_handling`` is Debezium's default, "precise": "0000" is both, and means the bytes)."""
    if value is None:
        return None
    name = (connect or {}).get("name", "")
    if name == "org.apache.kafka.connect.data.Decimal" or (
            not connect and decimal_handling == "precise" and pa.types.is_decimal(target) and isinstance(value, str)):
        scale = int((connect or {}).get("parameters", {}).get("scale", getattr(target, "scale", 0)))
        try:
            raw = base64.b64decode(value, validate=True)
        except binascii.Error:
            raise ValueError("not base64 bytes (decimal.handling.mode=precise); if the connector sends decimals "
                             "as numbers, pass decimal_handling='string'") from None
        return _unscaled(int.from_bytes(raw, "big", signed=True), scale)
    if name == "io.debezium.data.VariableScaleDecimal":
        unscaled = int.from_bytes(base64.b64decode(value["value"]), "big", signed=True)
        return _unscaled(unscaled, int(value["scale"]))
    if pa.types.is_decimal(target):  # decimal.handling.mode=string or double
        return decimal.Decimal(str(value))
    if pa.types.is_date(target):
        if isinstance(value, int):  # io.debezium.time.Date: days since the epoch
            return dt.date(1970, 1, 1) + dt.timedelta(days=value)
        return dt.date.fromisoformat(str(value))
    if pa.types.is_timestamp(target):
        if isinstance(value, (int, float)):
            unit = _PER_SECOND.get(name, 1_000_000)  # MicroTimestamp, and an integer without a schema
            return _EPOCH + dt.timedelta(microseconds=value * 1_000_000 // unit)
        text = str(value).replace("Z", "+00:00")
        stamp = dt.datetime.fromisoformat(text)
        return stamp if stamp.tzinfo is not None or target.tz is None else stamp.replace(tzinfo=dt.UTC)
    if pa.types.is_time(target) and isinstance(value, int):
        unit = _PER_SECOND.get(name, 1_000_000)  # MicroTime, and an integer without a schema
        return (dt.datetime.min + dt.timedelta(microseconds=value * 1_000_000 // unit)).time()
    if (pa.types.is_binary(target) or pa.types.is_large_binary(target)) and isinstance(value, str):
        return base64.b64decode(value)
    if (pa.types.is_string(target) or pa.types.is_large_string(target)) and not isinstance(value, str):
        return json.dumps(value)
    return value


def position_of(change: dict, position: str) -> int:
    """The change's position in the source, as the delta column's int64. With ``lsn``, a snapshot read is at 0:
    older than every streamed change (a transaction in progress during the snapshot writes its changes at
    LSNs before the snapshot's, and commits after it)."""
    if position == "lsn":
        if change.get("op") == "r":
            return 0
        lsn = (change.get("source") or {}).get("lsn")
        if lsn is None:
            raise InvalidInputError("position='lsn' needs source.lsn in every change (a PostgreSQL connector's); "
                                    "use position='ts_ms' for other sources")
        return int(lsn)
    ts = change.get("ts_ms") if change.get("ts_ms") is not None else (change.get("source") or {}).get("ts_ms")
    if ts is None:
        raise InvalidInputError("position='ts_ms' needs ts_ms in every change")
    return int(ts)


def _delta_value(pos: int, meta: TableMetadata, position: str) -> Any:
    t = meta.delta_type
    if pa.types.is_timestamp(t) and position == "ts_ms":
        return _EPOCH + dt.timedelta(milliseconds=pos)
    if pa.types.is_integer(t):
        return pos
    raise InvalidInputError(f"the delta column {meta.delta_column!r} is {t}: position={position!r} needs an integer "
                            "column (or, for ts_ms, a timestamp)")


def records(changes_in: Iterable[dict], meta: TableMetadata, position: str = "lsn",
            decimal_handling: str = "precise") -> Iterator[dict | str]:
    """Table records (the table's columns and :data:`OP`) of the changes; the text ``"truncate"`` where a
    TRUNCATE stands (its position follows, as the next record's ``_position``)."""
    if position not in POSITIONS:
        raise InvalidInputError(f"position must be one of {POSITIONS}, not {position!r}")
    if decimal_handling not in DECIMAL_HANDLING:
        raise InvalidInputError(f"decimal_handling must be one of {DECIMAL_HANDLING}, not {decimal_handling!r}")
    if not meta.keyed:
        raise InvalidInputError("change events need a keyed table (primary_key and delta_column)")
    columns = [c for c in meta.column_names if c != meta.delta_column]
    types = {c: meta.schema.field(c).type for c in meta.column_names}
    for change in changes_in:
        op = change["op"]
        pos = position_of(change, position)
        delta = _delta_value(pos, meta, position)
        if op == "t":
            yield "truncate"
            yield {"_position": delta}
            continue
        if op in ("c", "u", "r"):
            row, side, kind = change.get("after"), "after", "upsert"
        elif op == "d":
            row, side, kind = change.get("before"), "before", "delete"
        else:
            raise InvalidInputError(f"unknown Debezium op {op!r} (known: c, u, d, r, t)")
        if not isinstance(row, dict):
            raise InvalidInputError(f"a change with op {op!r} has no {side!r} row: {json.dumps(change)[:300]}")
        missing = [k for k in meta.primary_key if k not in row]
        if missing:
            raise InvalidInputError(f"a change's {side!r} row lacks key columns {missing} (table "
                                    f"{(change.get('source') or {}).get('table')!r}): is it this table's stream?")
        unknown = set(row) - set(meta.column_names)
        if unknown and kind == "upsert":
            raise InvalidInputError(f"the source has columns {sorted(unknown)} the table lacks: add them "
                                    "(Table.add_columns) before applying these changes")
        unavailable = sorted(c for c, v in row.items() if v in _UNAVAILABLE)
        if unavailable and kind == "upsert":
            raise InvalidInputError(
                f"columns {unavailable} of a change carry Debezium's placeholder for a value it did not send (a "
                "PostgreSQL TOASTed column an UPDATE left unchanged); storing it would overwrite the real value. "
                "Set REPLICA IDENTITY FULL on the source table so that every change carries every column")
        connect = _fields(change.get("_schema"), side)
        out = {}
        for c in columns:
            try:
                out[c] = convert(row.get(c), types[c], connect.get(c), decimal_handling)
            except (ValueError, TypeError, ArithmeticError, binascii.Error) as e:
                raise SchemaMismatchError(f"column {c!r}: {row.get(c)!r} is not a {types[c]} value ({e})") from None
        out[str(meta.delta_column)] = delta
        out[OP] = kind
        yield out


def batches(changes_in: Iterable[dict], meta: TableMetadata, position: str = "lsn", decimal_handling: str = "precise"
            ) -> Iterator[tuple[str, pa.Table | Any]]:
    """The changes as ``("records", table)`` pieces to ingest, split at TRUNCATEs: ``("truncate", delta)``."""
    schema = pa.schema([*meta.schema, pa.field(OP, pa.string())])
    pending: list[dict] = []
    it = records(changes_in, meta, position, decimal_handling)
    for r in it:
        if r == "truncate":
            if pending:
                yield "records", _table(pending, schema, meta)
                pending = []
            yield "truncate", next(it)["_position"]  # type: ignore[index]
            continue
        pending.append(r)  # type: ignore[arg-type]
    if pending:
        yield "records", _table(pending, schema, meta)


def _table(rows: list[dict], schema: pa.Schema, meta: TableMetadata) -> pa.Table:
    """Records as a table of ``schema``; a value its column cannot hold is refused naming the column, and a null
    key or delta value before anything of the call is committed."""
    try:
        table = pa.Table.from_pylist(rows, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        for field in schema:
            try:
                pa.array([r.get(field.name) for r in rows], field.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as bad:
                raise SchemaMismatchError(f"column {field.name!r} cannot hold a change's value: "
                                          f"{str(bad).splitlines()[0]}") from None
        raise SchemaMismatchError(f"a change's values do not fit the table: {str(e).splitlines()[0]}") from None
    for c in [*meta.primary_key, meta.delta_column]:
        nulls = table.column(c).null_count
        if nulls:
            role = "delta column" if c == meta.delta_column else "primary key column"
            raise NullValueError(f"{role} {c!r} holds {nulls} null value(s) in the changes; nothing was written")
    return table


def truncation(table, delta: Any) -> pa.Table:
    """A TRUNCATE as records: a delete of every key ``table``'s current view holds, at delta value ``delta``."""
    meta = table.metadata
    keys = table.to_arrow(columns=list(meta.primary_key))
    n = keys.num_rows
    return keys.append_column(meta.delta_column, pa.array([delta] * n, meta.delta_type)).append_column(
        OP, pa.array(["delete"] * n, pa.string()))


def ingest(table, messages: Iterable[Any], *, batch_id: str | None = None, position: str = "lsn",
           decimal_handling: str = "precise") -> list:
    """Applies Debezium ``messages`` to ``table`` (a keyed :class:`bitlake.Table`): one ingestion of their
    records, with ``batch_id`` (a retry with the same id is a no-op), or more around TRUNCATEs (their batch
    ids suffixed ``-1``, ``-2``...). ``decimal_handling``: the connector's ``decimal.handling.mode``, for
    messages without a schema section. Returns the :class:`bitlake.IngestResult` of each ingestion."""
    meta = table.metadata
    results = []
    # Every message converted and checked (values, null keys) before the first commit: one that names a problem
    # leaves nothing written.
    pieces = list(batches(changes(messages), meta, position, decimal_handling))
    for i, (kind, piece) in enumerate(pieces):
        bid = None if batch_id is None else (batch_id if i == 0 else f"{batch_id}-{i}")
        if kind == "truncate":
            done = bid is not None and batches_mod.already_committed(table.io, table.state(), bid)
            if done:  # a retry: its deletes were of the rows then, not now
                results.append(done)
                continue
            piece = truncation(table, piece)
        # A TRUNCATE of an empty table commits too: its batch id is taken, and a retry of the call is a no-op.
        results.append(table.ingest(piece, op_column=OP, batch_id=bid))
    return results
