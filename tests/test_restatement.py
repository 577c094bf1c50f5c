"""Value tombstones: rows committed before the tombstone are hidden from its version on, in the Arrow and the
Spark readers and in the spec reader; later rows and earlier versions are unaffected; no data file is read or
written; bad input is refused with nothing committed."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

import bitlake
from bitlake.cli import main as cli
from bitlake.format import protocol
from tests import spec_reader
from tests.oracle import rows_key
from tests.test_compaction import COLUMNS, SCHEMA, TIMES, batch


def table(path, **options):
    t = bitlake.create_table(path, SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2, **options)
    t.ingest(batch(range(20), 1, 0), op_column="op", batch_id="b0")  # grp g0 / g1 alternate; value = k
    t.ingest(batch(range(0, 20, 4), 5, 100), op_column="op", batch_id="b1")
    t.ingest(batch([21, 22], 2, 0), op_column="op", batch_id="pending", metagen=False)
    return t


def expected(rows: list[dict], hidden_values: set, column: str) -> list[tuple]:
    return rows_key([r for r in rows if r[column] not in hidden_values], COLUMNS)


@pytest.mark.spark
def test_a_tombstone_hides_what_was_committed_before_it(tmp_path, spark, monkeypatch):
    t = table(str(tmp_path / "t"))
    before = t.version
    views = {at: t.to_arrow(valid_at=at).to_pylist() for at in TIMES}
    files = sorted(t.io.walk("data"))
    opened: list[str] = []
    open_input = t.io.open_input
    monkeypatch.setattr(t.io, "open_input", lambda rel: (opened.append(rel), open_input(rel))[1])

    w = t.tombstone("value", [104, 5, 5, 999, None]).version  # 104: key 4 of b1; 5: key 5 of b0; 999: no row
    assert not [p for p in opened if p.startswith("data/")] and sorted(t.io.walk("data")) == files
    monkeypatch.undo()
    c = t.history()[0]
    assert (c["version"], c["operation"]) == (w, "TOMBSTONE")
    params = bitlake.format.commitlog.read(t.io, w).parameters
    assert params == {"column": "value", "tombstones_added": 3, "tombstones_removed": 0, "tombstones_total": 3}
    assert protocol.TOMBSTONES in t.state().protocol.reader_features

    for at in TIMES:
        want = expected(views[at], {104, 5}, "value")
        assert rows_key(t.to_arrow(valid_at=at).to_pylist(), COLUMNS) == want, at
        assert rows_key(spec_reader.read_view(t.path, valid_at=at), COLUMNS) == want, at
        assert rows_key(t.to_arrow(version=before, valid_at=at).to_pylist(), COLUMNS) == rows_key(views[at], COLUMNS)
    assert rows_key([r.asDict() for r in t.to_spark(spark).collect()], COLUMNS) == expected(views[None], {104, 5},
                                                                                             "value")
    # Rows committed later with a tombstoned value are visible, including a batch landed before the tombstone
    # and made live after it; a second tombstone on another column adds to the first.
    t.ingest(batch([5], 9, 0), op_column="op", batch_id="later")  # value 5 + 0 = 5 again
    t.metagen()
    rows = t.to_arrow().to_pylist()
    assert {r["k"] for r in rows} >= {5, 21, 22} and 4 not in {r["k"] for r in rows}
    t.tombstone("grp", ["g1"])
    left = t.to_arrow().to_pylist()
    assert {r["grp"] for r in left} == {"g0"} and bitlake.format.commitlog.read(t.io, t.version).parameters[
        "tombstones_total"] == 4
    assert rows_key([r.asDict() for r in t.to_spark(spark).collect()], COLUMNS) == rows_key(left, COLUMNS)
    assert rows_key(spec_reader.read_view(t.path), COLUMNS) == rows_key(left, COLUMNS)
    # Compaction keeps tombstoned rows hidden (a row keeps its batch's part, whichever file holds it).
    t.set_properties({"compact.min_input_files": "2"})
    assert t.compact().version is not None
    assert rows_key(t.to_arrow().to_pylist(), COLUMNS) == rows_key(left, COLUMNS)


def test_bad_tombstones_are_refused_with_nothing_committed(tmp_path):
    t = table(str(tmp_path / "t"))
    version = t.version
    with pytest.raises(bitlake.InvalidInputError, match="no column 'nope'"):
        t.tombstone("nope", [1])
    with pytest.raises(bitlake.InvalidInputError, match="not 'value' values"):
        t.tombstone("value", ["not a number"])
    with pytest.raises(bitlake.InvalidInputError, match="at least one non-null value"):
        t.tombstone("value", [None])
    with pytest.raises(bitlake.InvalidInputError, match="must be a list"):
        t.tombstone("grp", "g1")
    assert t.version == version and t.io.walk("_bitlake/tombstones") == []


def test_tombstones_on_an_unkeyed_table_and_the_command(tmp_path, capsys):
    schema = pa.schema([("user", pa.string()), ("n", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "events"), schema)
    t.ingest(pa.table({"user": ["ann", "bob", "ann", "cy"], "n": [1, 2, 3, 4]}))
    assert cli(["tombstone", t.path, "--column", "user", "--values", "ann,cy"]) == 0
    assert "hidden" in capsys.readouterr().out
    t.ingest(pa.table({"user": ["ann"], "n": [5]}))
    assert sorted((r["user"], r["n"]) for r in t.to_arrow().to_pylist()) == [("ann", 5), ("bob", 2)]
    assert len(t.to_arrow(version=1).to_pylist()) == 4
    assert t.describe()["tombstones"] == [{"version": 2, "column": "user", "values": 2}]


# ------------------------------------------------------------------------------------- revert and replace


def test_a_revert_rewrites_no_data_file_and_brings_back_what_the_batch_hid(tmp_path, monkeypatch):
    t = table(str(tmp_path / "t"))  # b0: keys 0..19 at mod 1; b1: keys 0, 4, .., 16 at mod 5; pending: 21, 22
    t.ingest(batch([4, 30], 3, 200), op_column="op", batch_id="late")  # key 4 at mod 3: stale behind b1
    before = t.version
    at_before = rows_key(t.to_arrow().to_pylist(), COLUMNS)
    files = sorted(t.io.walk("data"))
    everything = sorted(t.io.walk())
    dry = t.revert_batch("b1", dry_run=True)  # what the revert below does, committing and leaving nothing
    assert not dry.committed and dry.version == before == t.version and sorted(t.io.walk()) == everything
    r = t.revert_batch("b1")
    assert dry.counts == r.counts
    assert r.committed and r.version == before + 1 and sorted(t.io.walk("data")) == files
    assert r.counts == {"inserted": 0, "updated": 5, "deleted": 0, "stale": 0, "ignored_deletes": 0}
    rows = {x["k"]: x["value"] for x in t.to_arrow().to_pylist()}
    assert rows[0] == 0 and rows[8] == 8 and rows[4] == 204 and rows[30] == 230  # b0's, and late's key 4
    assert rows_key(t.to_arrow(version=before).to_pylist(), COLUMNS) == at_before
    assert rows_key(spec_reader.read_view(t.path), COLUMNS) == rows_key(t.to_arrow().to_pylist(), COLUMNS)
    c = bitlake.format.commitlog.read(t.io, r.version)
    assert c.operation == "REVERT" and protocol.RESTATEMENTS in t.state().protocol.reader_features
    assert t.state().batch("b1").status == "reverted"
    # A retry is a no-op; the id stays taken; the pending batch is refused; an unknown id is refused.
    again = t.revert_batch("b1")
    assert not again.committed and t.version == r.version
    assert t.revert_batch("b1", dry_run=True).counts == {}
    assert not t.ingest(batch(range(0, 20, 4), 5, 100), op_column="op", batch_id="b1").committed  # its records
    with pytest.raises(bitlake.BatchIdReusedError):  # other records under the taken id
        t.ingest(batch([1], 9, 0), op_column="op", batch_id="b1")
    t.ingest(batch([40], 1, 0), op_column="op", batch_id="landed", metagen=False)
    with pytest.raises(bitlake.InvalidInputError, match="pending MetaGen"):
        t.revert_batch("landed")
    with pytest.raises(bitlake.InvalidInputError, match="no batch 'nope'"):
        t.revert_batch("nope")
    assert t.version == r.version + 1


def test_replace_is_one_commit_and_bad_input_leaves_nothing(tmp_path):
    t = table(str(tmp_path / "t"))
    version = t.version
    with pytest.raises(bitlake.SchemaMismatchError):
        t.replace_batch("b1", pa.table({"k": [1]}))
    assert t.version == version and t.cleanup(min_age_seconds=0, dry_run=True) == [
        p for p in t.cleanup(min_age_seconds=0, dry_run=True) if p.startswith("_bitlake/parts/")]
    r = t.replace_batch("b1", batch([0, 99], 7, 500), op_column="op")
    assert r.committed and r.version == version + 1 and r.processed == ("b1",)
    rows = {x["k"]: x["value"] for x in t.to_arrow().to_pylist()}
    assert rows[0] == 500 and rows[99] == 599 and rows[4] == 4  # b1's other keys are back to b0's
    assert t.state().batch("b1").status == "live" and len(
        [b for b in t.state().parts.values() if b.batch_id == "b1"]) == 2
    r2 = t.replace_batch("b1", batch([0], 8, 700), op_column="op")  # replaces the current content
    rows = {x["k"]: x["value"] for x in t.to_arrow().to_pylist()}
    assert r2.committed and rows[0] == 700 and 99 not in rows


@pytest.mark.spark
def test_unkeyed_revert_and_the_commands(tmp_path, spark, capsys):
    schema = pa.schema([("user", pa.string()), ("n", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "events"), schema)
    t.ingest(pa.table({"user": ["ann", "bob"], "n": [1, 2]}), batch_id="a")
    t.ingest(pa.table({"user": ["cy"], "n": [3]}), batch_id="b")
    assert cli(["revert", t.path, "a"]) == 0
    assert "reverted" in capsys.readouterr().out
    assert [r["user"] for r in t.to_arrow().to_pylist()] == ["cy"]
    changes = t.changes(spark, starting_version=1).collect()
    assert sorted((r["_change_type"], r["_commit_version"], r["user"]) for r in changes) == [
        ("delete", 3, "ann"), ("delete", 3, "bob"), ("insert", 1, "ann"), ("insert", 1, "bob"), ("insert", 2, "cy")]
    path = tmp_path / "fix.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"user": ["dee"], "n": [4]}), path)
    assert cli(["replace", t.path, "b", str(path)]) == 0
    assert "replaced" in capsys.readouterr().out
    assert [r["user"] for r in t.to_arrow().to_pylist()] == ["dee"]
    assert sorted((r["_change_type"], r["user"]) for r in t.changes(spark, starting_version=4).collect()) == [
        ("delete", "cy"), ("insert", "dee")]


def test_a_batch_older_than_the_retention_window_is_not_reverted(tmp_path):
    t = table(str(tmp_path / "t"))
    t.compact(major=True, look_back=t.version)
    with pytest.raises(bitlake.VersionExpiredError, match="retention window"):
        t.revert_batch("b1")


# ------------------------------------------------------------------------------------------------- vacuum

SECRET_SCHEMA = pa.schema([("k", pa.int64()), ("user", pa.string()), ("secret", pa.string()), ("mod", pa.int64())])


def secret_batch(keys, users, mod):
    return pa.table({"k": pa.array(keys, pa.int64()), "user": users,
                     "secret": [f"SECRET-{u}-{k}#" for k, u in zip(keys, users, strict=True)],
                     "mod": pa.array([mod] * len(keys), pa.int64())})


def files_holding(path, marker: str) -> list[str]:
    """Every file under ``path`` whose raw bytes, or whose decoded Parquet columns, contain ``marker``."""
    import os

    import pyarrow.parquet as pq

    out = []
    for root, _, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                if marker.encode() in f.read():
                    out.append(full)
                    continue
            if name.endswith(".parquet"):
                t = pq.read_table(full)
                text = [str(v) for c in t.columns for v in c.to_pylist()]
                if any(marker in v for v in text):
                    out.append(full)
    return out


def test_vacuum_leaves_no_byte_of_a_purged_row_and_time_travel_follows(tmp_path, capsys):
    path = str(tmp_path / "t")
    t = bitlake.create_table(path, SECRET_SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2,
                             properties={"compact.min_input_files": "2"})
    t.ingest(secret_batch(list(range(10)), ["ann", "bob"] * 5, 1))
    t.ingest(secret_batch([0, 1, 20], ["ann", "zed", "ann"], 2))  # ann's key 0 updated; key 1 becomes zed's
    t.compact()  # older versions now read the landed files, later ones the compacted files: both hold ann's rows
    t.ingest(secret_batch([40], ["ann"], 1), batch_id="pending", metagen=False)
    w = t.tombstone("user", ["ann"]).version
    t.metagen()  # made live after the tombstone: not hidden, not purged
    t.ingest(secret_batch([30], ["ann"], 3))  # after the tombstone too
    views = {v: rows_key(t.to_arrow(version=v).to_pylist(), SECRET_SCHEMA.names) for v in range(t.version + 1)}
    assert files_holding(path, "SECRET-ann-2#")  # the control: before the vacuum, files hold ann's rows
    everything, before = sorted(t.io.walk()), t.version
    writes = []
    open_output = t.io.open_output
    t.io.open_output = lambda path, *a, **k: writes.append(path) or open_output(path, *a, **k)
    dry = t.vacuum(dry_run=True)  # the vacuum's figures, writing and committing nothing
    t.io.open_output = open_output
    assert writes == [] and dry.version is None and t.version == before and sorted(t.io.walk()) == everything
    r = t.vacuum()
    assert dataclasses.replace(dry, version=r.version) == r
    assert r.version == t.version and r.tombstones_retired == 1 and r.rows_purged > 0
    assert r.files_read <= r.files_considered and r.files_rewritten >= 2
    for k in (0, 2, 4, 6, 8, 20):
        assert files_holding(path, f"SECRET-ann-{k}#") == [], k
    assert files_holding(path, "SECRET-ann-40#") and files_holding(path, "SECRET-ann-30#")
    purged = {0, 2, 4, 6, 8, 20}
    for v, rows in views.items():
        # Every version now lacks the purged rows: those the tombstone hid, and, before it, ann's rows of the
        # batches made live before it.
        want = [row for row in rows if not (row[1] == "ann" and row[0] in purged)]
        assert rows_key(t.to_arrow(version=v).to_pylist(), SECRET_SCHEMA.names) == want, v
        assert rows_key(spec_reader.read_view(path, version=v), SECRET_SCHEMA.names) == want, v
    assert t.state().tombstones == [] and t.describe()["tombstones"] == []
    params = bitlake.format.commitlog.read(t.io, r.version).parameters
    assert (params["tombstones_removed"], params["tombstones_total"]) == (1, 0)
    assert {x["k"] for x in t.to_arrow().to_pylist()} == {1, 3, 5, 7, 9, 30, 40}
    assert not [p for p in t.cleanup(min_age_seconds=0) if p.startswith("data/")]  # the vacuum deleted them
    assert w < r.version and cli(["vacuum", path]) == 0 and "nothing done" in capsys.readouterr().out


def test_vacuum_reads_only_the_files_whose_statistics_admit_a_value(tmp_path):
    t = bitlake.create_table(str(tmp_path / "t"), SECRET_SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2)
    for i, users in enumerate((["a1", "a2"], ["m1", "m2"], ["z1", "z2"])):
        t.ingest(secret_batch([2 * i, 2 * i + 1], users, 1))
    t.tombstone("user", ["m2"])
    r = t.vacuum()
    assert (r.files_considered, r.files_read, r.files_rewritten, r.rows_purged) == (3, 1, 1, 1)
    assert sorted(x["user"] for x in t.to_arrow().to_pylist()) == ["a1", "a2", "m1", "z1", "z2"]


def test_a_vacuum_killed_after_its_commit_leaves_its_files_to_the_next_one(tmp_path, monkeypatch):
    t = bitlake.create_table(str(tmp_path / "t"), SECRET_SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2)
    t.ingest(secret_batch([1, 2], ["ann", "bob"], 1))
    t.tombstone("user", ["ann"])
    delete = t.io.delete
    monkeypatch.setattr(t.io, "delete", lambda rel: (_ for _ in ()).throw(OSError("killed")) if rel.startswith(
        "data/") else delete(rel))
    with pytest.raises(OSError, match="killed"):
        t.vacuum()
    monkeypatch.undo()
    assert t.state().tombstones == [] and files_holding(t.path, "SECRET-ann-1#")  # committed, files left
    assert t.vacuum().version is None and files_holding(t.path, "SECRET-ann-1#") == []
    assert [x["user"] for x in t.to_arrow().to_pylist()] == ["bob"]


def test_a_restatement_across_a_vacuum_folds_the_purged_records(tmp_path):
    """A vacuum keeps the keys and delta values of the rows it erases (its purged file): a later revert folds
    them again, so a late, older record that an erased record made stale stays stale, and a key whose last
    record was erased has no row (a delete marker at that record's delta value)."""
    schema = pa.schema([("k", pa.int64()), ("grp", pa.string()), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["k"], delta_column="mod")

    def batch(k, grp, mod):
        return pa.table({"k": [k], "grp": [grp], "mod": [mod]}, schema=schema)

    t.ingest(batch(1, "a", 1), batch_id="b1")
    t.ingest(batch(1, "secret", 3), batch_id="b2")
    t.ingest(batch(1, "c", 5), batch_id="b3")
    t.ingest(batch(1, "late", 2), batch_id="b4")  # stale: older than b2's record and b3's
    t.tombstone("grp", ["secret"])
    tombstone = f"{t.path}/{t.state().tombstones[0][1].path}"  # the values stay in the tombstone file
    assert t.vacuum().rows_purged == 1
    assert files_holding(t.path, "secret") == [tombstone]
    before = t.version
    assert t.revert_batch("b3").committed  # b2's record is the key's last again, and its row is gone
    assert t.to_arrow().num_rows == 0 and t.describe()["valid_rows"] == 0
    assert [(r["_change_type"], r["grp"]) for r in t.changes_to_arrow(starting_version=before + 1).to_pylist()] == \
        [("delete", "c")]
    assert t.to_arrow(valid_at=2).to_pylist() == [{"k": 1, "grp": "a", "mod": 1}]  # b1's; b4's stays stale
    assert t.to_arrow(valid_at=3).num_rows == 0
    assert t.ingest(batch(1, "older", 2), batch_id="b5").counts["stale"] == 1
    assert t.ingest(batch(1, "newer", 4), batch_id="b6").counts["inserted"] == 1  # no row to update
    t.replace_batch("b2", batch(1, "fixed", 3))  # the erased record itself replaced: b6's stays the last
    assert [r["grp"] for r in t.to_arrow().to_pylist()] == ["newer"]
    assert files_holding(t.path, "secret") == [tombstone]


def test_a_restatement_across_an_old_vacuum_is_refused(tmp_path):
    """A vacuum committed without a purged file (by a version of bitlake before vacuums kept one) may have erased
    records a fold needs: a restatement across it is refused, nothing is committed, and a batch made live after
    it is reverted as usual."""
    from bitlake.format import commitlog, layout

    schema = pa.schema([("k", pa.int64()), ("grp", pa.string()), ("mod", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["k"], delta_column="mod")

    def batch(k, grp, mod):
        return pa.table({"k": [k], "grp": [grp], "mod": [mod]}, schema=schema)

    t.ingest(batch(1, "a", 3), batch_id="b1")
    t.ingest(batch(1, "b", 1), batch_id="b2")  # stale
    t.tombstone("grp", ["b"])
    assert t.vacuum().rows_purged == 1
    path = tmp_path / "t" / layout.commit_path(t.version)
    body = commitlog.decode(path.read_bytes(), "commit")
    assert body.pop("purged")
    path.write_bytes(commitlog.encode(body))
    for checkpoint in (tmp_path / "t" / layout.CHECKPOINTS_DIR).glob("*"):
        checkpoint.unlink()
    t = bitlake.open_table(str(tmp_path / "t"))
    version = t.version
    with pytest.raises(bitlake.VersionExpiredError, match="vacuumed at version 4"):
        t.revert_batch("b1")
    with pytest.raises(bitlake.VersionExpiredError, match="vacuumed"):
        t.replace_batch("b1", batch(1, "c", 5))
    assert t.version == version
    t.ingest(batch(2, "a", 1), batch_id="b3")
    assert t.revert_batch("b3").committed
    assert [r["k"] for r in t.to_arrow().to_pylist()] == [1]


def test_an_event_time_view_after_a_revert_that_wrote_no_event(tmp_path):
    """Reverting the delete that ended a row makes it valid again by its bitmap alone (no event): a later record
    that ends it at a smaller delta value decides event-time views from then on, not the reverted delete's
    event."""
    schema = pa.schema([("k", pa.int64()), ("mod", pa.int64()), ("value", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["k"], delta_column="mod")
    t.ingest(pa.table({"k": [1], "mod": [1], "value": [10]}, schema=schema), batch_id="b1")
    t.ingest(pa.table({"k": [1], "mod": [10], "value": [None], "op": ["delete"]}), op_column="op", batch_id="b2")
    t.revert_batch("b2")
    t.ingest(pa.table({"k": [1], "mod": [5], "value": [11]}, schema=schema), batch_id="b3")
    for at, expected in ((4, [(1, 1, 10)]), (5, [(1, 5, 11)]), (7, [(1, 5, 11)]), (None, [(1, 5, 11)])):
        assert [tuple(r.values()) for r in t.to_arrow(valid_at=at).to_pylist()] == expected, at


def test_reverting_a_vacuums_deletes_brings_no_erased_row_back(tmp_path):
    """The vacuum's own batch of deletes is restatable like any: the keys whose rows it erased stay without a
    row, and a later record of such a key is an insert."""
    schema = pa.schema([("k", pa.int64()), ("mod", pa.int64()), ("value", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["k"], delta_column="mod")
    t.ingest(pa.table({"k": [1, 2], "mod": [1, 1], "value": [10, 20]}, schema=schema), batch_id="b1")
    t.tombstone("value", [10])
    t.vacuum()
    vacuum_batch = next(b for b in t.state().batches if "-vacuum-" in b)
    r = t.revert_batch(vacuum_batch)
    assert r.committed and r.counts["inserted"] == 0 and t.describe()["valid_rows"] == 1
    assert [tuple(r.values()) for r in t.to_arrow().to_pylist()] == [(2, 1, 20)]
    before = t.version
    assert t.ingest(pa.table({"k": [1], "mod": [2], "value": [11]}, schema=schema)).counts["inserted"] == 1
    assert [(r["_change_type"], r["value"]) for r in t.changes_to_arrow(starting_version=before + 1).to_pylist()] == \
        [("insert", 11)]


def test_a_vacuums_deletes_take_the_purged_rows_as_their_keys_entries(tmp_path, monkeypatch):
    """The keys whose current rows a vacuum purges are deleted without reading the key store (their entries are
    the purged rows'), and the key store ends as a scan would leave it: a later record of such a key is an
    insert, a late one older than the erased row stays stale, and a key whose row was older history keeps its
    current row."""
    from bitlake.engine.write import restate

    schema = pa.schema([("k", pa.int64()), ("mod", pa.int64()), ("value", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["k"], delta_column="mod", num_buckets=2)
    t.ingest(pa.table({"k": [1, 2, 3, 4], "mod": [1, 1, 1, 1], "value": [10, 10, 30, 40]}, schema=schema))
    t.ingest(pa.table({"k": [2], "mod": [5], "value": [21]}, schema=schema))  # key 2's erased row is history
    t.tombstone("value", [10])

    def no_scan(*args, **kwargs):
        raise AssertionError("the vacuum scanned the key store")

    monkeypatch.setattr(restate.metagen, "scan_keystore", no_scan)
    r = t.vacuum()
    monkeypatch.undo()
    assert r.rows_purged == 2 and t.describe()["valid_rows"] == 3
    assert sorted(tuple(x.values()) for x in t.to_arrow().to_pylist()) == [(2, 5, 21), (3, 1, 30), (4, 1, 40)]
    late = t.ingest(pa.table({"k": [1], "mod": [0], "value": [9]}, schema=schema))
    assert late.counts["stale"] == 1
    again = t.ingest(pa.table({"k": [1, 2], "mod": [2, 6], "value": [11, 22]}, schema=schema))
    assert (again.counts["inserted"], again.counts["updated"]) == (1, 1)


@pytest.mark.parametrize("meanwhile", ["revert", "equal delta"])
def test_a_vacuum_starts_over_when_the_rows_it_deletes_stop_being_current(tmp_path, monkeypatch, meanwhile):
    """Another writer commits between the vacuum's planning and its commit: a revert of the batch whose row the
    vacuum would delete, or a record of the key at the same delta value (a later arrival wins the tie). The
    vacuum starts over on the new state, so the table is as if the commits had run one after the other."""
    from bitlake import restatement

    schema = pa.schema([("id", pa.int64()), ("ts", pa.int64()), ("grp", pa.int64())])
    t = bitlake.create_table(str(tmp_path / "t"), schema, primary_key=["id"], delta_column="ts")
    t.ingest(pa.table({"id": [1], "ts": [10], "grp": [6]}, schema=schema), batch_id="a")
    t.tombstone("grp", [6])
    other = bitlake.open_table(t.path)
    planned = restatement._current_purged
    done = []

    def racing(io, state, purged):
        out = planned(io, state, purged)
        if not done:
            done.append(other.revert_batch("a") if meanwhile == "revert" else
                        other.ingest(pa.table({"id": [1], "ts": [10], "grp": [0]}, schema=schema), batch_id="b"))
        return out

    monkeypatch.setattr(restatement, "_current_purged", racing)
    t.vacuum()
    monkeypatch.undo()
    if meanwhile == "revert":
        assert t.ingest(pa.table({"id": [1], "ts": [5], "grp": [0]}, schema=schema)).counts["inserted"] == 1
        assert t.to_arrow().to_pylist() == [{"id": 1, "ts": 5, "grp": 0}]
    else:
        assert t.to_arrow().to_pylist() == [{"id": 1, "ts": 10, "grp": 0}]
