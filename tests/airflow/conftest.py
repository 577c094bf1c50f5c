"""Fixtures of the Airflow provider's tests: a real Airflow (metadata DB migrated on SQLite) and a real
trigger service (uvicorn on loopback).

These tests need Apache Airflow, which lives in its own virtual environment (``make test-airflow``, set up
by scripts/setup-airflow.sh); tests/conftest.py leaves this folder out where Airflow is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from airflow_env import AIRFLOW_HOME, CONN_ID, HERE, TriggerService, free_port  # sets Airflow's environment


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).is_relative_to(HERE):
            item.add_marker(pytest.mark.airflow)
            # A hung trigger must not hang the run; Airflow handles SIGALRM/SIGTERM itself, hence a thread.
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(180, method="thread"))


def pytest_unconfigure(config):
    shutil.rmtree(AIRFLOW_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """Airflow's metadata database, created by ``airflow db migrate`` (SQLite in AIRFLOW_HOME)."""
    airflow = Path(sys.executable).parent / "airflow"
    result = subprocess.run([str(airflow), "db", "migrate"], capture_output=True, text=True, timeout=300,
                            env=os.environ.copy())
    assert result.returncode == 0, f"airflow db migrate failed:\n{result.stdout}\n{result.stderr}"
    return AIRFLOW_HOME / "airflow.db"


@pytest.fixture(scope="session")
def trigger_service(tmp_path_factory) -> TriggerService:
    """bitlake's trigger service on uvicorn in a background thread, on a free loopback port, with a SQLite
    store; a producer and a consumer token for the tables ``db.*``; the Airflow connection
    ``bitlake_triggers_default`` (an AIRFLOW_CONN_ variable) pointing at it with the consumer token."""
    import uvicorn

    from bitlake.triggers import TriggerConfig, create_app
    from bitlake.triggers.store import create_token

    db_url = f"sqlite:///{tmp_path_factory.mktemp('triggers')}/triggers.db"
    # embedded in the Airflow test process, as the docs say to run it there: no gc.freeze() of that process
    app = create_app(TriggerConfig(db_url=db_url, token_cache_seconds=0, freeze_gc=False))
    producer = create_token("producer", ["db.*"], name="producer", db_url=db_url)
    consumer = create_token("consumer", ["db.*"], name="airflow", db_url=db_url)
    server = thread = None
    for _ in range(3):  # the port is free when picked, but another process may take it meanwhile
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                               lifespan="on"))
        thread = threading.Thread(target=server.run, daemon=True, name="trigger-service")
        thread.start()
        deadline = time.monotonic() + 15
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if server.started:
            break
        server.should_exit = True
        thread.join(5)
    assert server is not None and server.started, "uvicorn did not start"
    service = TriggerService(f"http://127.0.0.1:{port}", producer, consumer, db_url)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", json.dumps(
            {"conn_type": "bitlake_triggers", "host": service.url, "password": consumer}))
        yield service
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def table() -> str:
    """A table name of its own for each test (the service is shared by the session)."""
    return f"db.t_{uuid.uuid4().hex[:12]}"


