"""A reader in another process that planned on a snapshot keeps reading it while a major compaction and a
cleanup run beside it (docs/maintenance.md, "Cleanup"): cleanup keeps every file a version that was the latest
within its grace period names, as Delta keeps removed files for its retention period. On local disk and on
S3 (moto)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import bitlake
from bitlake.fs import file_io
from tests.oracle import rows_key
from tests.test_compaction import COLUMNS, churned

READER = r"""
import json, sys
import bitlake
t = bitlake.open_table(sys.argv[1])
view = t.view()  # planned: the snapshot's files are fixed from here on
print(json.dumps({"version": view.version}), flush=True)
sys.stdin.readline()  # the upkeep ran meanwhile
try:
    rows = view.to_table().to_pylist()
    print(json.dumps({"rows": sorted(map(json.dumps, rows))}), flush=True)
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
"""

GRACE = 3.0  # seconds: the cleanup's min_age_seconds


class Reader:
    """A process that plans a view of the table at ``path`` (its latest version), then reads it when told."""

    def __init__(self, path: str):
        self.process = subprocess.Popen([sys.executable, "-c", READER, path], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
        self.version = json.loads(self.process.stdout.readline())["version"]

    def read(self) -> dict:
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        out = json.loads(self.process.stdout.readline())
        self.process.wait(timeout=60)
        return out


def _aged(t: bitlake.Table) -> None:
    """Waits until every file of the table is older than the grace period (object stores keep no settable
    modification time), so only the versions' protection keeps a file."""
    io = file_io(t.path)
    newest = max(io.mtime(f) for f in io.walk())
    time.sleep(max(0.0, newest + GRACE + 0.2 - time.time()))


@pytest.mark.parametrize("store", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_reader_keeps_reading_its_snapshot_through_a_major_compaction_and_a_cleanup(tmp_path, store, request):
    path = str(tmp_path / "t") if store == "local" else request.getfixturevalue("s3_uri")
    t = churned(path)
    expected = sorted(rows_key(t.to_arrow().to_pylist(), COLUMNS))
    _aged(t)
    reader = Reader(path)
    assert reader.version == t.version
    c = t.compact(major=True, look_back=t.version)  # the window moves past the reader's version
    assert c.version == t.version and t.state().window.version > reader.version
    removed = t.cleanup(min_age_seconds=GRACE)  # the reader's version was the latest less than GRACE ago
    planned = file_io(path)
    old_files = {f.path for f in t.state(reader.version).data_files()} - {f.path for f in t.state().data_files()}
    assert old_files and not old_files & set(removed)  # files only the reader's version names
    out = reader.read()
    assert "error" not in out, out
    assert sorted(rows_key([json.loads(r) for r in out["rows"]], COLUMNS)) == expected
    # Once the compaction's commit is older than the grace period, the reader's version is protected no more.
    time.sleep(GRACE + 0.2)
    removed = t.cleanup(min_age_seconds=GRACE)
    assert old_files <= set(removed) and not any(planned.exists(f) for f in old_files)
    assert sorted(rows_key(t.to_arrow().to_pylist(), COLUMNS)) == expected


def test_without_the_grace_a_cleanup_removes_what_a_reader_planned_on(tmp_path):
    # The control: a cleanup with no grace removes the files the reader planned on; its read fails, naming one.
    path = str(tmp_path / "t")
    t = churned(path)
    reader = Reader(path)
    t.compact(major=True, look_back=t.version)
    t.cleanup(min_age_seconds=0)
    out = reader.read()
    assert "FileNotFoundError" in out.get("error", "") and "data/" in out["error"]
