"""Automatic upkeep: maintain() runs what the table's metrics call for, and nothing when nothing is due;
the upkeep after each commit stays within its budget; every view reads the same after either."""

from __future__ import annotations

import pytest

import bitlake
from bitlake.cli import main as cli
from bitlake.engine.maintain import upkeep
from tests.oracle import rows_key
from tests.test_compaction import COLUMNS, SCHEMA, batch, churned, views


def test_maintain_compacts_what_is_due_then_nothing(tmp_path):
    t = churned(str(tmp_path / "t"))
    before = views(t, t.version)
    plan = t.maintain(dry_run=True)
    assert [task.name for task in plan.tasks] == [upkeep.MINOR, upkeep.CLEANUP] and plan.dry_run
    assert plan.metrics.compactable_files == t.compact(dry_run=True)["files"] > 0
    assert plan.metrics.superseded_rows_read > 0 and t.history()[0]["operation"] != "COMPACT"

    r = t.maintain(min_age_seconds=0)
    assert r.compaction.version == t.version and t.history()[0]["operation"] == "COMPACT"
    assert not [p for p in r.removed if p.startswith("data/")], "versions before the compaction read them"
    assert views(t, t.version - 1) == before
    # Tiers may take one more round; then nothing is due but cleanup, and maintain commits nothing.
    t.maintain()
    again = t.maintain()
    assert [task.name for task in again.tasks] == [upkeep.CLEANUP] and again.compaction is None
    assert again.metrics.compactable_files == 0 and t.describe()["maintenance"] == again.metrics.to_json()


def test_maintain_runs_a_major_compaction_when_the_window_moves(tmp_path):
    t = churned(str(tmp_path / "t"))
    t.metagen()
    current = rows_key(t.to_arrow().to_pylist(), COLUMNS)
    t.set_properties({"compact.look_back": str(t.version + 1), "maintain.major_interval": "0s"})
    plan = t.maintain(dry_run=True)
    assert plan.tasks[0].name == upkeep.MAJOR and f"to {t.version}" in plan.tasks[0].reason
    r = t.maintain(min_age_seconds=0)
    assert r.compaction.purged_rows > 0 and t.state().window.version == r.compaction.version  # at the latest
    assert r.removed, "cleanup releases what only versions before the window read"
    assert rows_key(t.to_arrow().to_pylist(), COLUMNS) == current
    with pytest.raises(bitlake.VersionExpiredError):
        t.to_arrow(version=1)
    # The window cannot move again until newer versions are old enough.
    assert upkeep.MAJOR not in [task.name for task in t.maintain().tasks]


def test_the_major_interval_holds_the_window_back(tmp_path):
    t = churned(str(tmp_path / "t"))
    t.set_properties({"compact.look_back": "2"})
    t.compact(major=True, look_back=1)
    assert upkeep.MAJOR not in [task.name for task in t.maintain(dry_run=True).tasks], "commits a moment apart"
    t.set_properties({"maintain.major_interval": "0s"})
    assert t.maintain(dry_run=True).tasks[0].name == upkeep.MAJOR


def test_upkeep_after_each_commit_stays_within_its_budget(tmp_path):
    auto = bitlake.create_table(str(tmp_path / "auto"), SCHEMA, primary_key=["k"], delta_column="mod",
                                properties={"maintain.auto": "true", "maintain.auto_budget": "6"})
    plain = bitlake.create_table(str(tmp_path / "plain"), SCHEMA, primary_key=["k"], delta_column="mod")
    auto.ingest(batch(range(2000), 1, 0), op_column="op")  # one big file: never worth a small batch's budget
    plain.ingest(batch(range(2000), 1, 0), op_column="op")
    big = auto.state().data_files()[0].path
    for i in range(12):
        b = batch(range(i * 7, i * 7 + 10), 2 + i, 100 * i)
        for t in (auto, plain):
            t.ingest(b, op_column="op", batch_id=f"b{i}")
    compactions = [h for h in auto.history() if h["operation"] == "COMPACT"]
    assert compactions and not any(h["operation"] == "COMPACT" for h in plain.history())
    for h in compactions:
        c = bitlake.format.commitlog.read(auto.io, h["version"])
        batch_bytes = sum(f.bytes for f in bitlake.format.commitlog.read(auto.io, h["version"] - 1).add_files)
        removed = sum(auto.state(h["version"] - 1).files[p].bytes for p in c.remove_files)
        assert removed <= 6 * batch_bytes and big not in c.remove_files
    assert len(auto.state().data_files()) < len(plain.state().data_files())
    assert rows_key(auto.to_arrow().to_pylist(), COLUMNS) == rows_key(plain.to_arrow().to_pylist(), COLUMNS)
    for at in (3, 8, None):
        assert (rows_key(auto.to_arrow(valid_at=at).to_pylist(), COLUMNS)
                == rows_key(plain.to_arrow(valid_at=at).to_pylist(), COLUMNS))


def test_the_maintain_command_and_bad_properties(tmp_path, capsys):
    t = churned(str(tmp_path / "t"))
    assert cli(["maintain", t.path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would run compact:" in out and "expected:" in out and t.history()[0]["operation"] != "COMPACT"
    assert cli(["maintain", t.path]) == 0
    assert "ran compact:" in capsys.readouterr().out and t.history()[0]["operation"] == "COMPACT"
    with pytest.raises(bitlake.InvalidInputError, match="true or false"):
        t.set_properties({"maintain.auto": "yes"})
    with pytest.raises(bitlake.InvalidInputError, match="'maintain.major_interval' must be an age.*'often'"):
        t.set_properties({"maintain.major_interval": "often", "compact.look_back": "3"})
    with pytest.raises(bitlake.InvalidInputError, match="'compact.look_back' must be a version, an age"):
        t.set_properties({"compact.look_back": "xyz"})
    t.maintain()  # the refused properties left nothing behind


def test_cleanup_drops_the_commits_before_the_window(tmp_path):
    import datetime as dt

    from bitlake.format import commitlog
    from bitlake.triggers.publisher import publish
    from bitlake.triggers.store import TriggerStore
    from tests import spec_reader

    t = churned(str(tmp_path / "t"))
    t.metagen()
    opened_at = dt.datetime.now(dt.UTC)
    with TriggerStore(f"sqlite:///{tmp_path}/triggers.db") as store:
        publish(t, store)  # the cursor is at the latest version: nothing is lost below
        r = t.compact(major=True, look_back=t.version - 2)
        t.ingest(batch(range(100, 110), 40, 0), op_column="op", batch_id="after")
        w = t.state().window.version
        current = rows_key(t.to_arrow().to_pylist(), COLUMNS)
        removed = t.cleanup(min_age_seconds=0)
        assert sorted(commitlog.list_versions(t.io))[0] == w and f"_bitlake/commits/{0:020d}.json" in removed
        assert [h["version"] for h in t.history()][-1] == w and r.version in [h["version"] for h in t.history()]

        again = bitlake.open_table(t.path)  # loads from the checkpoint at the window's start
        assert rows_key(again.to_arrow().to_pylist(), COLUMNS) == current
        assert rows_key(again.to_arrow(version=w).to_pylist(), COLUMNS) == rows_key(
            spec_reader.read_view(t.path, w), COLUMNS)
        with pytest.raises(bitlake.VersionExpiredError):
            again.to_arrow(as_of=opened_at - dt.timedelta(hours=1))
        with pytest.raises(bitlake.VersionExpiredError):
            again.state(w - 1)
        # Writers and the key index go on from the new start; a retried batch id stays a no-op.
        assert again.ingest(batch([100, 200], 50, 1), op_column="op", batch_id="later").counts["inserted"] == 1
        assert not again.ingest(batch(range(40), 1, 0), op_column="op", batch_id="b0").committed
        assert rows_key(again.to_arrow().to_pylist(), COLUMNS) == rows_key(spec_reader.read_view(t.path), COLUMNS)
        assert publish(again, store)  # the cursor was inside the window

    with TriggerStore(f"sqlite:///{tmp_path}/fresh.db") as fresh:
        with pytest.raises(bitlake.VersionExpiredError, match="skip_expired"):
            publish(again, fresh)
        assert {int(x.event.snapshot_id) for x in publish(again, fresh, skip_expired=True)} <= set(
            range(w, again.version + 1))
