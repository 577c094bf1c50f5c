"""DAGs of the Airflow provider's tests (tests/airflow/conftest.py copies them into the DAGs folder)."""

from __future__ import annotations

import datetime as dt

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import DAG, task

from bitlake.airflow import DataChangeEventOperator, DataChangeEventSensor

START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


@task
def process(events: list[dict]) -> int:
    """Stands for the job that reads the changes."""
    return len(events)


with DAG("bitlake_test_range", schedule=None, start_date=START,
         params={"table": "db.none", "start": "", "end": ""}):
    changes = DataChangeEventOperator(task_id="changes", table="{{ params.table }}",
                                      start_time="{{ params.start }}", end_time="{{ params.end }}")
    any_changes = ShortCircuitOperator(task_id="any_changes", python_callable=lambda events: bool(events),
                                       op_args=[changes.output])
    any_changes >> process(changes.output)


with DAG("bitlake_test_sensor", schedule=None, start_date=START, params={"table": "db.none", "flow": "f"}):
    waited = DataChangeEventSensor(task_id="wait", trigger_type="snapshot", table="{{ params.table }}",
                                   flow="{{ params.flow }}", poke_interval=0.5, timeout=120)
    process(waited.output)
