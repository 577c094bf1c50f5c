"""Process exactly what changed in a table since this pipeline's last successful run.

    changes ──> any_changes ──> read_changes ──> ack
    (flow's pending    (skip the rest    (Spark reads     (move the flow's cursor
     events, XCom)      when none)        that range)       past those events)

- ``changes`` asks bitlake's trigger service for the events of ``table`` after the cursor of the consumer
  flow ``flow`` (a snapshot trigger; it does not wait). Swap it for ``DataChangeEventSensor(
  trigger_type="snapshot", ...)`` to wait for changes in the triggerer instead of skipping.
- ``any_changes`` short-circuits the run when there are none.
- ``read_changes`` runs a Spark job that reads exactly the changed range with
  ``bitlake.triggers.read_changes(spark, events)`` (for a bitlake table its change feed: one row per
  insert, update pre/post image or delete) and, with ``output`` set, appends the rows there as Parquet.
- ``ack`` acknowledges the run; a failed run acknowledges nothing, so the next run gets the same events.

``max_active_runs=1``: the flow has one cursor, so runs must not overlap. Needs a ``bitlake_triggers``
connection (docs/airflow.md); the table, flow, location, Spark master and output are DAG params.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.providers.standard.operators.python import ShortCircuitOperator
from airflow.sdk import DAG, Param, task

from bitlake.airflow import DataChangeEventAckOperator, DataChangeEventOperator


def _any_events(events: list[dict[str, Any]] | None) -> bool:
    return bool(events)


with DAG(
    dag_id="example_bitlake_changes",
    description="Read what changed in a bitlake table since the last successful run (trigger service)",
    schedule="@hourly",
    start_date=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    tags=["bitlake", "example"],
    params={
        "table": Param("db.orders", type="string", description="the table, as its events name it"),
        "flow": Param("example_bitlake_changes", type="string", description="the consumer flow (its cursor)"),
        "location": Param("", type="string",
                          description="the table's path when its events do not say (no 'location' tag, and "
                                      "the events were registered without the publisher)"),
        "spark_master": Param("local[*]", type="string"),
        "output": Param("", type="string", description="where to append the changed rows (Parquet); '' = nowhere"),
    },
) as dag:
    changes = DataChangeEventOperator(task_id="changes", table="{{ params.table }}", flow="{{ params.flow }}")

    any_changes = ShortCircuitOperator(task_id="any_changes", python_callable=_any_events,
                                       op_args=[changes.output])

    @task
    def read_changes(events: list[dict[str, Any]], params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The Spark job: the changed rows of exactly the range the events cover."""
        assert params is not None  # Airflow passes the run's params
        # Imported in the task, as Airflow advises: the scheduler parses this file often, and only the worker
        # running the task needs Spark (and bitlake's read_changes, whose name this task takes).
        from pyspark.sql import SparkSession

        import bitlake
        from bitlake.triggers import read_changes, snapshot_range

        changed = snapshot_range(events)  # refuses events that do not chain into one range
        ours = SparkSession.getActiveSession() is None  # stop only a session this task started
        spark = bitlake.spark_session(params["spark_master"], app_name="example_bitlake_changes")
        try:
            rows = read_changes(spark, events, location=params["location"] or None)
            if params["output"]:
                rows.write.mode("append").parquet(params["output"])
            counts = ({r["_change_type"]: r["count"] for r in rows.groupBy("_change_type").count().collect()}
                      if "_change_type" in rows.columns else {"rows": rows.count()})
        finally:
            if ours:
                spark.stop()
        return {"table": changed.table, "start_snapshot_id": changed.start_snapshot_id,
                "end_snapshot_id": changed.end_snapshot_id, "counts": counts}

    ack = DataChangeEventAckOperator(task_id="ack", flow="{{ params.flow }}", table="{{ params.table }}",
                                     events=changes.output)

    any_changes >> read_changes(changes.output) >> ack
