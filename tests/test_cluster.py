"""A Spark standalone cluster started from the pyspark package (a master and two workers on loopback) runs
ingestion, the Spark MetaGen and reads of a table on moto's S3 server (tests/cluster/check.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sparkservers import start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.s3]

CHECK = Path(__file__).parent / "cluster" / "check.py"


def test_a_standalone_cluster_ingests_and_reads_a_table_on_s3(tmp_path, s3_server):
    cluster = start_cluster(tmp_path, workers=2, cores=1, memory="1g")
    try:
        out = subprocess.run([sys.executable, str(CHECK), cluster.url, s3_server.uri("cluster")],
                             capture_output=True, text=True, timeout=900, cwd=tmp_path)
    finally:
        cluster.stop()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert out.stdout.strip().endswith("ok")
