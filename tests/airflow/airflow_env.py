"""The test environment of the Airflow provider's tests: Airflow's settings, the DAGs folder, helpers.

Airflow reads its configuration when first imported, so importing this module sets AIRFLOW_HOME and the
settings below, before anything imports Airflow (conftest.py imports it first): a temporary home, the
metadata database in SQLite there, no example DAGs, and a DAGs folder holding the test DAGs
(tests/airflow/dags) and bitlake's example DAG, because ``dag.test()`` runs only DAGs that the DAG
processor finds in a bundle.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
EXAMPLE_DAG = HERE.parents[1] / "bitlake" / "airflow" / "example_dags" / "example_bitlake_changes.py"
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="bitlake-airflow-"))
DAGS_FOLDER = AIRFLOW_HOME / "dags"
CONN_ID = "bitlake_triggers_default"

os.environ.update({
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME}/airflow.db",
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__UNIT_TEST_MODE": "True",  # operators' execute() may be called directly in tests
})
os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")
DAGS_FOLDER.mkdir()
for source in [*sorted((HERE / "dags").glob("*.py")), EXAMPLE_DAG]:
    shutil.copy(source, DAGS_FOLDER / source.name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TriggerService:
    url: str
    producer_token: str
    consumer_token: str
    db_url: str

    def producer(self):
        from bitlake.triggers import Client
        return Client(self.url, self.producer_token, timeout=10)

    def consumer(self):
        from bitlake.triggers import Client
        return Client(self.url, self.consumer_token, timeout=10)

    def register(self, table: str, n: int, *, first: int = 1, partition: list | None = None) -> list:
        """``n`` chained commits of ``table`` registered; the stored events."""
        events = [{"table": table, "partition": partition, "snapshot_id": str(v),
                   "snapshot_ts": "2024-01-01T00:00:00Z", "prev_snapshot_id": str(v - 1) if v > 1 else None,
                   "table_format": "BITLAKE", "operation_type": "APPEND", "tags": {"batch_ids": f"b{v}"}}
                  for v in range(first, first + n)]
        with self.producer() as client:
            return [r.event for r in client.register(events)]

    def wait_for_flow(self, flow: str, table: str, timeout: float = 60) -> None:
        """Until the flow has evaluated its snapshot trigger on the table once (read from the store)."""
        from bitlake.triggers import TriggerStore

        deadline = time.monotonic() + timeout
        with TriggerStore(self.db_url) as store:
            while store.flow(flow, table) is None:
                assert time.monotonic() < deadline, f"flow {flow!r} never evaluated {table!r}"
                time.sleep(0.05)


def run_dag(dag_id: str, *, mark_success: str | None = None, **conf):
    """``dag.test()`` of a DAG of the DAGs folder with ``conf`` as its params (tasks matching the regex
    ``mark_success`` are marked successful instead of run); the DagRun."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert not bag.import_errors, bag.import_errors
    return bag.get_dag(dag_id).test(run_conf=conf, mark_success_pattern=mark_success)


def states(dag_run) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances()}


def xcom(dag_run, task_id: str):
    return dag_run.get_task_instance(task_id).xcom_pull(task_ids=task_id)
