"""Format v1 tables (tests/fixtures/v1, written by bitlake 0.1 with tests/fixtures/make_v1_tables.py): read as
they are, refused for writes, upgraded by `bitlake upgrade` in one commit, then written as v2."""

from __future__ import annotations

import json
import pathlib
import shutil

import pyarrow as pa
import pytest

import bitlake
from bitlake.cli import main
from bitlake.format import commitlog
from bitlake.format.protocol import V1_HISTORY

pytestmark = pytest.mark.spark

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "v1"


@pytest.fixture
def keyed(tmp_path):
    shutil.copytree(FIXTURES / "keyed", tmp_path / "keyed")
    return tmp_path / "keyed"


def _expected():
    return json.loads((FIXTURES / "keyed" / "expected.json").read_text())


def _rows(rows):
    return sorted(rows, key=lambda r: (r["k"], r.get("_change_type", "")))


def test_a_v1_table_reads_as_bitlake_0_1_read_it(keyed, spark):
    expected = _expected()
    t = bitlake.open_table(str(keyed))
    assert t.describe()["protocol"]["min_reader_version"] == 1
    for v in range(t.version + 1):
        assert _rows(t.to_arrow(version=v).to_pylist()) == expected["views"][str(v)]
        assert _rows(t.to_arrow(version=v, valid_at=25).to_pylist()) == expected["views_at_25"][str(v)]
        got = [r.asDict() for r in t.to_spark(spark, version=v).collect()]
        assert _rows(got) == expected["views"][str(v)]
        if v:
            feed = t.changes(spark, starting_version=v, ending_version=v).drop("_commit_timestamp").collect()
            assert _rows([r.asDict() for r in feed]) == expected["changes"][str(v)]


def test_writes_to_a_v1_table_are_refused_until_it_is_upgraded(keyed, spark, capsys):
    t = bitlake.open_table(str(keyed))
    before = t.version
    with pytest.raises(bitlake.UnsupportedFormatVersionError, match="bitlake upgrade"):
        t.ingest(pa.table({"k": [1], "grp": ["g1"], "value": [7], "mod": [100]}), spark=spark)
    assert t.version == before

    assert main(["upgrade", str(keyed)]) == 0
    assert "upgraded" in capsys.readouterr().out
    t = bitlake.open_table(str(keyed))
    assert t.version == before + 1
    c = commitlog.read(t.io, t.version)
    assert c.operation == "UPGRADE" and V1_HISTORY in c.protocol.reader_features
    # The v1 files get their column statistics in the upgrade: filters prune them.
    files = t.state().data_files()
    assert files and all(f.stats is not None and f.stats["nulls"].keys() == {"k", "value", "mod"} for f in files)
    assert t.analyze().version is None
    assert main(["upgrade", str(keyed)]) == 0  # a second upgrade does nothing
    assert bitlake.open_table(str(keyed)).version == before + 1

    expected = _expected()
    for v in range(before + 1):
        assert _rows(t.to_arrow(version=v).to_pylist()) == expected["views"][str(v)]
    assert _rows(t.to_arrow().to_pylist()) == expected["views"][str(before)]

    # The re-bucketed key store still knows every key: an older record is stale, a newer one updates,
    # a delete removes, and a deleted key's late record stays out.
    current = {r["k"]: r for r in expected["views"][str(before)]}
    batch = pa.table({"k": [1, 4, 7, 2, 100], "grp": ["g1", "g0", "g1", "g0", "g0"], "value": [-1, 4000, None, -2, 1],
                      "mod": [1, 100, 100, 5, 100], "op": ["upsert", "upsert", "delete", "upsert", "upsert"]})
    r = t.ingest(batch, op_column="op", batch_id="after-upgrade", spark=spark)
    assert r.counts == {"inserted": 1, "updated": 1, "deleted": 1, "stale": 2, "ignored_deletes": 0}
    want = dict(current)
    want[4] = {"k": 4, "grp": "g0", "value": 4000, "mod": 100}
    want.pop(7)
    want[100] = {"k": 100, "grp": "g0", "value": 1, "mod": 100}
    assert _rows(t.to_arrow().to_pylist()) == _rows(want.values())
    feed = t.changes(spark, starting_version=t.version).drop("_commit_timestamp").collect()
    assert sorted((r["_change_type"], r["k"]) for r in feed) == [
        ("delete", 7), ("insert", 100), ("update_postimage", 4), ("update_preimage", 4)]


def test_an_unkeyed_v1_table_upgrades_and_appends(tmp_path, spark):
    shutil.copytree(FIXTURES / "unkeyed", tmp_path / "u")
    t = bitlake.open_table(str(tmp_path / "u"))
    assert sorted(t.to_arrow().column("x").to_pylist()) == [1, 2, 3, 4]
    t.upgrade()
    t.ingest(pa.table({"x": [5], "s": ["e"]}), batch_id="u3", spark=spark)
    assert sorted(t.to_arrow().column("x").to_pylist()) == [1, 2, 3, 4, 5]
    feed = t.changes(spark, starting_version=1).collect()
    assert sorted(r["x"] for r in feed) == [1, 2, 3, 4, 5]


def test_the_spec_reader_agrees_with_bitlake_across_an_upgrade(keyed, spark):
    """tests/spec_reader.py was written from docs/FORMAT.md alone; it must read what bitlake reads."""
    from tests import spec_reader

    t = bitlake.open_table(str(keyed))
    t.upgrade()
    t.ingest(pa.table({"k": [1, 3, 50], "grp": ["g1", "g1", "g0"], "value": [9, None, 5], "mod": [60, 60, 60],
                       "op": ["upsert", "delete", "upsert"]}), op_column="op", batch_id="after", spark=spark)
    for v in range(t.version + 1):
        for at in (None, 15, 25, 45, 100):
            got = spec_reader.read_view(str(keyed), version=v, valid_at=at)
            assert _rows(got) == _rows(t.to_arrow(version=v, valid_at=at).to_pylist())
        if v:
            mine = [r.asDict() for r in t.changes(spark, starting_version=v, ending_version=v).drop("_commit_timestamp")
                    .collect()]
            assert _rows(spec_reader.read_changes(str(keyed), v - 1, v)) == _rows(mine)
