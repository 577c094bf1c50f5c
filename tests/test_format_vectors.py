"""docs/FORMAT.md's test vectors and lists, checked against bitlake's code: the bucket hash (key encodings,
hashes, buckets), the commit envelope's checksum, the schema message, the table properties, the checkpoint's
keys and the tombstone matching rule. The vectors are written out here as in FORMAT.md (and compared with it),
so a change of bitlake's hash fails here even if FORMAT.md were changed with it."""
from __future__ import annotations

import base64
import datetime as dt
import decimal
import importlib
import pathlib
import zlib

import pyarrow as pa
import pytest

import bitlake
from tests.spec_writer import envelope, key_encoding, key_hash

# Where bitlake keeps what these tests check: when a module moves, its path changes here, in one line.
_WHERE = {
    "key_hash": "bitlake.format.bucket:key_hash",
    "buckets": "bitlake.format.bucket:buckets",
    "encode_commit": "bitlake.format.commitlog:encode",
    "TableMetadata": "bitlake.format.metadata:TableMetadata",
    "DEFAULT_PROPERTIES": "bitlake.format.metadata:DEFAULT_PROPERTIES",
}


def _bitlake(name: str):
    """bitlake's object `name` (see _WHERE), imported when a test asks for it."""
    module, attr = _WHERE[name].split(":")
    return getattr(importlib.import_module(module), attr)


FORMAT_MD = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "FORMAT.md").read_text()
UTC = dt.UTC
D = decimal.Decimal
NUM_BUCKETS = (16, 64, 1000, 65536)

# label (FORMAT.md's first column), key columns (name -> Arrow array of one value), encoding, FNV-1a-64, hash,
# buckets of 16, 64, 1000 and 65536
VECTORS = [
    ("int64 1", {"k": pa.array([1], pa.int64())},
     "00 00 00 00 00 00 00 01", "a8c7f732281a3812", "0d4ad0eb39c50357", (7, 23, 439, 855)),
    ("int64 -1", {"k": pa.array([-1], pa.int64())},
     "ff ff ff ff ff ff ff ff", "8cf51a8bfca3883d", "6a92c0228678c02e", (14, 46, 510, 49198)),
    ("int32 42", {"k": pa.array([42], pa.int32())},
     "00 00 00 00 00 00 00 2a", "a8c7de32281a0d97", "641dede4f0973e8c", (12, 12, 812, 16012)),
    ("int64 -9223372036854775808", {"k": pa.array([-2**63], pa.int64())},
     "80 00 00 00 00 00 00 00", "262b7cb79fbf4a45", "7c58ca505305a910", (0, 16, 112, 43280)),
    ("uint64 18446744073709551615", {"k": pa.array([2**64 - 1], pa.uint64())},
     "ff ff ff ff ff ff ff ff", "8cf51a8bfca3883d", "6a92c0228678c02e", (14, 46, 510, 49198)),
    ("bool true", {"k": pa.array([True])},
     "00 00 00 00 00 00 00 01", "a8c7f732281a3812", "0d4ad0eb39c50357", (7, 23, 439, 855)),
    ("string ''", {"k": pa.array([""])},
     "00 00 00 00", "4d25767f9dce13f5", "4d33a93727192487", (7, 7, 127, 9351)),
    ("string 'bitlake'", {"k": pa.array(["bitlake"])},
     "00 00 00 07 62 69 74 6c 61 6b 65", "5e1ff7872def5a70", "3197a6010a449923", (3, 35, 843, 39203)),
    ("string 'é'", {"k": pa.array(["é"])},
     "00 00 00 02 c3 a9", "c5aebdfa1f0cb297", "7b7c4f690a2f12ec", (12, 44, 52, 4844)),
    ("binary 00ff", {"k": pa.array([b"\x00\xff"])},
     "00 00 00 02 00 ff", "c6910bfa1fcbc966", "9d2ffa57deefd4bb", (11, 59, 51, 54459)),
    ("decimal(10,2) 1.10", {"k": pa.array([D("1.10")], pa.decimal128(10, 2))},
     "00 00 00 04 31 2e 31 30", "da7cfefb0caba6cb", "2d5fbb20fbcb8ca5", (5, 37, 53, 36005)),
    ("decimal(10,2) -0.05", {"k": pa.array([D("-0.05")], pa.decimal128(10, 2))},
     "00 00 00 05 2d 30 2e 30 35", "829dd03a7859e210", "b4e0203369e71b2f", (15, 47, 807, 6959)),
    ("decimal(10,2) 0.00", {"k": pa.array([D("-0.00")], pa.decimal128(10, 2))},
     "00 00 00 04 30 2e 30 30", "2d02f90214e2ac07", "e0f8cd358138170e", (14, 14, 902, 5902)),
    ("decimal(20,10) 1E-10", {"k": pa.array([D("1E-10")], pa.decimal128(20, 10))},
     "00 00 00 0c 30 2e 30 30 30 30 30 30 30 30 30 31", "056009b55e672f1c", "38bd5d9e2fd490f2", (2, 50, 226, 37106)),
    ("date32 2024-01-02", {"k": pa.array([dt.date(2024, 1, 2)], pa.date32())},
     "00 00 00 00 00 00 4d 0c", "a975563228ad8f54", "320ed79d3f35fccc", (12, 12, 28, 64716)),
    ("timestamp[us, UTC] 2024-01-02T03:04:05.000006Z",
     {"k": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC)], pa.timestamp("us", "UTC"))},
     "00 06 0d ed c0 4d d3 46", "0f47fe2154e968c3", "3dda464a72e8a1ea", (10, 42, 754, 41450)),
    ("timestamp[us, America/New_York] 2024-01-01T22:04:05.000006-05:00",
     {"k": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC)], pa.timestamp("us", "America/New_York"))},
     "00 06 0d ed c0 4d d3 46", "0f47fe2154e968c3", "3dda464a72e8a1ea", (10, 42, 754, 41450)),
    ("timestamp[us] 1969-12-31T23:59:59.999999",
     {"k": pa.array([dt.datetime(1969, 12, 31, 23, 59, 59, 999999)], pa.timestamp("us"))},
     "ff ff ff ff ff ff ff ff", "8cf51a8bfca3883d", "6a92c0228678c02e", (14, 46, 510, 49198)),
    ("(string 'eu', int64 7)", {"a": pa.array(["eu"]), "b": pa.array([7], pa.int64())},
     "00 00 00 02 65 75 00 00 00 00 00 00 00 07", "462ef94a17bdec24", "41757151fec9c64b", (11, 11, 619, 50763)),
    ("(int64 7, string 'eu')", {"b": pa.array([7], pa.int64()), "a": pa.array(["eu"])},
     "00 00 00 00 00 00 00 07 00 00 00 02 65 75", "398d890cc699ac64", "8406e224d6a60a46", (6, 6, 350, 2630)),
    ("(string 'eu', date32 2024-01-02, decimal(10,2) 1.10)",
     {"a": pa.array(["eu"]), "d": pa.array([dt.date(2024, 1, 2)], pa.date32()),
      "m": pa.array([D("1.10")], pa.decimal128(10, 2))},
     "00 00 00 02 65 75 00 00 00 00 00 00 4d 0c 00 00 00 04 31 2e 31 30", "8cbeac876dd22fda", "e25cca3f7f5c4b07",
     (7, 7, 239, 19207)),
]
IDS = [v[0] for v in VECTORS]
ENVELOPE_BODY = {"format_version": 2, "operation": "CREATE", "timestamp_ms": 1700000000000, "version": 0}
ENVELOPE = b'{"crc32":2533519449,"body":{"format_version":2,"operation":"CREATE","timestamp_ms":1700000000000,"version":0}}'


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) % 2**64
    return h


@pytest.mark.parametrize("label, columns, encoding, fnv, hashed, buckets", VECTORS, ids=IDS)
def test_bitlake_hashes_keys_as_the_vectors_say(label, columns, encoding, fnv, hashed, buckets):
    table = pa.table(columns)
    names = list(columns)
    assert fnv1a64(bytes.fromhex(encoding)) == int(fnv, 16)
    assert int(_bitlake("key_hash")(table, names)[0]) == int(hashed, 16)
    for n, b in zip((1, *NUM_BUCKETS), (0, *buckets), strict=True):
        assert int(_bitlake("buckets")(table, names, n)[0]) == b, f"{n} buckets"


@pytest.mark.parametrize("label, columns, encoding, fnv, hashed, buckets", VECTORS, ids=IDS)
def test_spec_writer_encodes_keys_as_the_vectors_say(label, columns, encoding, fnv, hashed, buckets):
    """tests/spec_writer.py's encoding, written from FORMAT.md, gives the vectors' bytes and hash."""
    table = pa.table(columns)
    key = tuple(table.column(c)[0].as_py() for c in columns)
    got = key_encoding(key, [table.schema.field(c).type for c in columns])
    assert got == bytes.fromhex(encoding)
    assert key_hash(got) == int(hashed, 16)


def test_format_md_holds_these_vectors():
    rows = {}
    for line in FORMAT_MD.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[0] in IDS:
            rows[cells[0]] = (cells[1], cells[2], cells[3], tuple(int(c) for c in cells[4:]))
    assert rows == {label: (enc, fnv, h, b) for label, _, enc, fnv, h, b in VECTORS}


def test_commit_envelope_checksum():
    assert zlib.crc32(b"123456789") == 0xCBF43926 == 3421780262  # CRC-32/ISO-HDLC's check value
    assert _bitlake("encode_commit")(ENVELOPE_BODY) == ENVELOPE == envelope(ENVELOPE_BODY)
    assert ENVELOPE.decode() in FORMAT_MD


def test_schema_is_one_encapsulated_ipc_message():
    schema = pa.schema([pa.field("k", pa.int64(), False), pa.field("s", pa.string())])
    meta = _bitlake("TableMetadata")(schema=schema, primary_key=("k",), delta_column=None)
    raw = base64.b64decode(meta.to_json()["schema"], validate=True)
    assert raw[:4] == b"\xff\xff\xff\xff"
    length = int.from_bytes(raw[4:8], "little")
    assert len(raw) == 8 + length and length % 8 == 0  # no body, no end-of-stream marker
    message = pa.ipc.read_message(pa.py_buffer(raw))
    assert (message.type, message.body.size) == ("schema", 0)
    assert pa.ipc.read_schema(pa.py_buffer(raw)).equals(schema)
    sink = pa.BufferOutputStream()
    pa.ipc.new_stream(sink, schema).close()
    assert sink.getvalue().to_pybytes() == raw + b"\xff\xff\xff\xff\x00\x00\x00\x00"  # a stream's first message


def _md_table(after: str) -> list[list[str]]:
    """The rows of the first Markdown table after the line `after` in FORMAT.md."""
    lines = FORMAT_MD[FORMAT_MD.index(after):].splitlines()[1:]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
    return rows


def test_format_md_lists_every_table_property_with_its_default():
    listed = {r[0].strip("`"): r[1].strip("`") for r in _md_table("### Table properties")}
    assert listed == dict(_bitlake("DEFAULT_PROPERTIES"))


def test_format_md_lists_every_checkpoint_key(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), pa.schema([("k", pa.int64()), ("d", pa.int64())]),
                             primary_key=["k"], delta_column="d")
    listed = [r[0].strip("`") for r in _md_table("Checkpoints: `_bitlake/state/")]
    assert listed == list(t.state().to_json())


FLOATS = [0.0, -0.0, float("nan"), -float("nan"), 1.0]


def _float_table(tmp_path):
    schema = pa.schema([("k", pa.int64()), ("d", pa.int64()), ("x", pa.float64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["k"], delta_column="d")
    t.ingest(pa.table({"k": range(len(FLOATS)), "d": [1] * len(FLOATS), "x": FLOATS}, schema=schema))
    return t


def test_tombstones_match_floats_by_their_bits(tmp_path):
    """FORMAT.md, "Tombstones": -0.0 is not 0.0, and a NaN matches a NaN of the same bits only."""
    t = _float_table(tmp_path)
    t.tombstone("x", [-0.0, float("nan")])  # Python's NaN: 0x7ff8000000000000; -nan has its sign bit set
    assert sorted(r["k"] for r in t.to_arrow().to_pylist()) == [0, 3, 4]


def test_vacuum_removes_the_nan_rows_a_tombstone_hides(tmp_path):
    t = _float_table(tmp_path)
    t.tombstone("x", [float("nan")])
    t.vacuum()
    assert sorted(r["k"] for r in t.to_arrow().to_pylist()) == [0, 1, 3, 4]


def test_a_keys_hash_does_not_depend_on_the_rows_hashed_with_it(monkeypatch):
    """Rows are hashed in chunks (for the CPU's caches): every chunking, and each row alone, gives the same hashes,
    for keys of fixed and variable width."""
    from bitlake.format import bucket

    n = 50
    table = pa.table({"s": [("ab" * (i % 7))[: i % 11] for i in range(n)],
                      "d": pa.array([decimal.Decimal(i * 37 - 900) / 100 for i in range(n)], pa.decimal128(9, 2)),
                      "i": pa.array([(i * 7919) % 1000 - 500 for i in range(n)], pa.int32())})
    names = ["s", "d", "i"]
    whole = bucket.key_hash(table, names).tolist()
    assert whole == [int(bucket.key_hash(table.slice(i, 1), names)[0]) for i in range(n)]
    for rows in (1, 3, 16):
        monkeypatch.setattr(bucket, "_CHUNK_ROWS", rows)
        assert bucket.key_hash(table, names).tolist() == whole
        assert bucket.key_hash(pa.Table.from_batches(table.to_batches(max_chunksize=7)), names).tolist() == whole
