"""Everything that runs on one machine works where pyspark (and pandas) is not installed: a fresh virtual
environment with bitlake's core dependencies, DuckDB and Polars runs tests/nospark/check.py against a local
folder, memory:// and moto's S3 server (writes, reads with projection and filters, streaming batches, time
travel, the change feed, DuckDB and Polars scans, compaction, restatements, DML)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.s3]


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    venv = tmp_path_factory.mktemp("nospark") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-e", str(ROOT), "duckdb", "polars"], check=True, timeout=600)
    return str(venv / "bin" / "python")


def test_reads_and_writes_without_pyspark(bare_python, s3_server):
    out = subprocess.run([bare_python, str(ROOT / "tests" / "nospark" / "check.py"), s3_server.uri("nospark")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().endswith("ok")
