"""The key index's blocks (bitlake.engine.keys.keyblocks): what a load into an empty index writes for fixed-width
keys, answered as entries of their own would be, and shadowed by the entries later commits write."""

from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pytest

import bitlake
from bitlake.engine.keys import keyblocks, keyindex, sstwrite
from bitlake.engine.keys.keyencoding import encode_keys, fixed_key_array, int64_values
from bitlake.format import keystore
from tests.test_keyindex import opened

KEY = ["a", "b", "c"]


def _rows(rng: np.random.Generator, n: int) -> pa.Table:
    """Key-store rows of distinct random keys of three fixed-width columns (extremes included), in the index's
    order, with random buckets, row ids, deltas and delete markers."""
    a = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n, dtype=np.int64, endpoint=True)
    a[:4] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0, -1][:n]
    b = rng.integers(-3, 3, n, dtype=np.int32)
    c = rng.integers(-20_000, 20_000, n, dtype=np.int32)
    table = pa.table({"a": a, "b": b, "c": pa.array(c).cast(pa.int32()).cast(pa.date32()),
                      keystore.DELTA: rng.choice([0, 1, -(2**62), 2**63 - 1], n).astype(np.int64),
                      keystore.ROW_ID: rng.integers(0, 2**62, n, dtype=np.int64),
                      keystore.DELETED: rng.random(n) < 0.2,
                      keystore.BUCKET: rng.integers(0, 16, n, dtype=np.int32)})
    keys = np.array(encode_keys(table, KEY, table.column(keystore.BUCKET).to_numpy().astype(np.uint16)), dtype=bytes)
    keys, first = np.unique(keys, return_index=True)  # distinct keys, in the index's order
    return table.take(pa.array(first))


def _encode(table: pa.Table, primary_key: list[str], buckets: np.ndarray, order: np.ndarray):
    """Every block of ``keyblocks.chunks`` at once: their first keys and their values."""
    pieces = list(keyblocks.chunks(table, primary_key, buckets, order))
    return np.concatenate([first for first, _ in pieces]), [v for _, values in pieces for v in values]


@pytest.mark.parametrize("n", [1, 63, 64, 65, 1000])
def test_blocks_answer_every_key_they_hold_and_no_other(n):
    rng = np.random.default_rng(n)
    rows = _rows(rng, n)
    buckets = rows.column(keystore.BUCKET).to_numpy().astype(np.uint16)
    # Two SST files' worth: the directory is their blocks' first keys end to end.
    cut = rows.num_rows // 2
    stored, pieces = {}, []
    for part, part_buckets in ((rows.slice(0, cut), buckets[:cut]), (rows.slice(cut), buckets[cut:])):
        if part.num_rows:
            first, values = _encode(part, KEY, part_buckets, np.arange(part.num_rows))
            assert len(values) == -(-part.num_rows // keyblocks.BLOCK_ENTRIES) == len(first)
            stored.update(zip((keyblocks.BLOCK_PREFIX + k for k in first.tolist()), values, strict=True))
            pieces.append(first.tobytes())
    blocks = keyblocks.Blocks.of(pieces, len(KEY))
    present = np.array(encode_keys(rows, KEY, buckets), dtype=bytes)
    absent = np.array(encode_keys(_rows(np.random.default_rng(n + 1), 50), KEY, np.arange(50) % 17), dtype=bytes)
    absent = absent[~np.isin(absent, present)]
    edges = fixed_key_array(np.array([0, 17]), [np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max])] * 3)
    wanted = np.concatenate([present[::-1], absent, edges])
    found, delta, rid, deleted = blocks.find(lambda keys: [stored.get(k) for k in keys], wanted)
    m = len(present)
    assert found[:m].all() and not found[m:].any()
    expected = rows.take(pa.array(np.arange(m)[::-1]))
    assert delta[:m].tolist() == expected.column(keystore.DELTA).to_pylist()
    assert rid[:m].tolist() == expected.column(keystore.ROW_ID).to_pylist()
    assert deleted[:m].tolist() == expected.column(keystore.DELETED).to_pylist()


def test_a_block_of_another_encoding_or_missing_is_refused():
    rows = _rows(np.random.default_rng(7), 100)
    first, values = _encode(rows, KEY, rows.column(keystore.BUCKET).to_numpy().astype(np.uint16),
                            np.arange(rows.num_rows))
    blocks = keyblocks.Blocks.of([first.tobytes()], len(KEY))
    keys = first[:1]
    with pytest.raises(ValueError, match="another encoding"):
        blocks.find(lambda k: [b"\x00" * 10] * len(k), keys)
    with pytest.raises(ValueError, match="lacks a block"):
        blocks.find(lambda k: [None] * len(k), keys)
    with pytest.raises(ValueError, match="out of order"):
        keyblocks.Blocks.of([first[::-1].tobytes()], len(KEY))


def test_blocks_compress_keys_in_order(tmp_path):
    """A load's keys, close together and in order, with row ids that grow: stored byte-transposed, the bytes the
    entries share make runs, so that 52 bytes of an entry (a key of three columns) take under 5 in the SST file."""
    n = 200_000
    rows = pa.table({"a": np.arange(n, dtype=np.int64) * 4, "b": np.zeros(n, np.int32),
                     "c": pa.array(np.zeros(n, np.int32)).cast(pa.date32()),
                     keystore.DELTA: np.zeros(n, np.int64), keystore.ROW_ID: np.arange(n, dtype=np.int64) * 3,
                     keystore.DELETED: np.zeros(n, bool)})
    first, values = _encode(rows, KEY, np.zeros(n, np.uint16), np.arange(n))
    path = str(tmp_path / "blocks.sst")
    sstwrite.write_blocks([(first, values)], path)
    assert (tmp_path / "blocks.sst").stat().st_size < 5 * n


def test_a_load_goes_into_the_index_as_blocks_that_later_commits_shadow(tmp_path, monkeypatch):
    """A load into an empty index is written as blocks; the keys later commits update, delete or add have entries of
    their own, which a lookup takes over the block's; a rebuild whose runs overlap in key ranges writes the later ones
    as blocks too. Every lookup agrees with the table."""
    monkeypatch.setattr(keyindex, "_SST_MIN_ROWS", 1)
    schema = pa.schema([("id", pa.int64()), ("line", pa.int32()), ("v", pa.string()), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id", "line"], delta_column="mod",
                             num_buckets=4)
    n = 3000
    ids = np.arange(n, dtype=np.int64) * 7 - 5000
    t.ingest(pa.table({"id": ids, "line": (ids % 5).astype(np.int32), "v": ["a"] * n, "mod": np.ones(n, np.int64)}))
    with opened(t) as index:
        kinds = {f["start_key"][:1] for f in index.db.live_files() if f["start_key"] >= b"\x01"}
        assert kinds == {keyblocks.BLOCK_PREFIX}
    update = ids[::3]
    t.ingest(pa.table({"id": update, "line": (update % 5).astype(np.int32), "v": ["b"] * len(update),
                       "mod": np.full(len(update), 2, np.int64)}))
    t.ingest(pa.table({"id": ids[1::10], "line": (ids[1::10] % 5).astype(np.int32), "mod": np.full(300, 3),
                       "op": ["delete"] * 300}), op_column="op")

    def check(index) -> None:
        wanted = pa.table({"id": np.concatenate([ids, [-5001, 10**9]]),
                           "line": np.concatenate([ids % 5, [4, 0]]).astype(np.int32)})
        found, delta, _, deleted = index.lookup(wanted)
        assert found[:n].all() and not found[n:].any()
        expected = np.ones(n, np.int64)
        expected[::3] = 2
        expected[1::10] = 3
        assert delta[:n].tolist() == expected.tolist()
        gone = np.zeros(n, bool)
        gone[1::10] = True
        assert deleted[:n].tolist() == gone.tolist()

    with opened(t) as index:
        assert index.blocked and index._directory is None  # told by one directory entry, the directory unread
        check(index)
    monkeypatch.setattr(keyindex, "RUN_ROWS", 500)  # a run a bucket
    shutil.rmtree(tmp_path / "t" / "_bitlake" / "index")
    with opened(t) as index:
        index.catch_up(t.state())
        kinds = [f["start_key"][:1] for f in index.db.live_files() if f["start_key"] >= b"\x01"]
        assert set(kinds) == {keyblocks.BLOCK_PREFIX} and len(kinds) >= 4  # a file or more a run (one a thread)
        known = index._directory[0].directory  # the runs' blocks, kept as they went in
        check(index)
        index._directory = None
        assert index._blocks().directory.tolist() == known.tolist()  # as read back from the database
    assert sorted(t.to_arrow().column("id").to_pylist()) == sorted(set(ids.tolist()) - set(ids[1::10].tolist()))


def test_runs_of_a_put_whose_key_ranges_overlap_go_in_as_blocks_then_as_entries(tmp_path, monkeypatch):
    """Blocks cover the key range from their first key on: a run of a put into an empty index whose keys fall among
    those of blocks already written goes in as entries of their own, and every key is answered."""
    monkeypatch.setattr(keyindex, "_SST_MIN_ROWS", 1)
    monkeypatch.setattr(keyindex, "RUN_ROWS", 100)
    schema = pa.schema([("id", pa.int64()), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id"], delta_column="mod", num_buckets=1)

    def rows(ids) -> pa.Table:
        return pa.table({"id": pa.array(ids, pa.int64()), keystore.DELTA: pa.array(ids, pa.int64()),
                         keystore.ROW_ID: pa.array(ids, pa.int64()), keystore.DELETED: [False] * len(ids)})

    runs = [rows(range(0, 400, 2)), rows(range(1, 400, 2)), rows(range(1000, 1200))]  # the second among the first
    with opened(t) as index:
        index.put(runs, 0)
        kinds = sorted(f["start_key"][:1] for f in index.db.live_files() if f["start_key"] >= b"\x01")
        assert kinds[0] == b"\x01" and set(kinds[1:]) == {keyblocks.BLOCK_PREFIX}  # entries, then blocks of two runs
        assert len(kinds) >= 3
        found, delta, rid, deleted = index.lookup(pa.table({"id": pa.array(range(-1, 1201), pa.int64())}))
    ids = np.arange(-1, 1201)
    assert found.tolist() == (((ids >= 0) & (ids < 400)) | ((ids >= 1000) & (ids < 1200))).tolist()
    assert delta[found].tolist() == rid[found].tolist() == ids[found].tolist() and not deleted.any()


def test_int64_values_of_a_block_round_trip_through_the_key_encoding():
    values = np.array([np.iinfo(np.int64).min, -1, 0, 1, np.iinfo(np.int64).max], dtype=np.int64)
    table = pa.table({"a": values})
    assert fixed_key_array(None, [int64_values(table.column("a"))]).tolist() == encode_keys(table, ["a"])
