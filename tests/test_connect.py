"""Spark Connect: a Connect server started from the pyspark package, and a client session in another process
that reads and writes bitlake tables (tests/connect/check.py), on a local folder and on moto's S3 server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sparkservers import start_connect_server

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.s3]

CHECK = Path(__file__).parent / "connect" / "check.py"


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory, s3_server):
    server = start_connect_server(tmp_path_factory.mktemp("connect"))
    yield server
    server.stop()


def test_a_connect_client_reads_and_writes(connect_server, s3_server, tmp_path):
    out = subprocess.run([sys.executable, str(CHECK), connect_server.url, str(tmp_path), s3_server.uri("connect")],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    assert out.stdout.strip().endswith("ok")
