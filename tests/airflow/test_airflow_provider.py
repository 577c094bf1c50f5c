"""bitlake's Airflow provider against a real Apache Airflow and a real trigger service (conftest.py).

Run with ``make test-airflow`` (Airflow's own virtual environment).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time

import pytest
from airflow.sdk import Connection
from airflow.sdk.exceptions import AirflowException, TaskDeferred
from airflow_env import CONN_ID, DAGS_FOLDER, EXAMPLE_DAG, run_dag, states, xcom

from bitlake.airflow import DataChangeEventSensor, DataChangeEventTrigger, get_provider_info
from bitlake.airflow.hooks import BitlakeTriggersHook, ServiceSettings, events_json, trigger_params
from bitlake.airflow.operators import DataChangeEventAckOperator, DataChangeEventOperator


def _register_later(service, table: str, n: int, delay: float, **kw) -> threading.Thread:
    def go():
        time.sleep(delay)
        service.register(table, n, **kw)

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


async def _first_event(trigger, timeout: float):
    """The first TriggerEvent the trigger's run() yields, within ``timeout`` seconds (TimeoutError if none)."""
    async def first():
        async for event in trigger.run():
            return event
        raise AssertionError("the trigger stopped without yielding an event")

    return await asyncio.wait_for(first(), timeout)


# --- the provider ---------------------------------------------------------------------------------------

def test_providers_manager_discovers_the_provider():
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    assert "bitlake" in manager.providers
    info = manager.providers["bitlake"]
    assert info.data["package-name"] == "bitlake" and info.version == get_provider_info()["versions"][0]
    assert any(t.package_name == "bitlake" and "bitlake.airflow.triggers" in t.trigger_class_name
               for t in manager.trigger)
    # The connection form of the UI (API server side).
    [ui] = [m for m in manager.iter_connection_type_hook_ui_metadata() if m.connection_type == "bitlake_triggers"]
    assert ui.hook_class_name == "bitlake.airflow.hooks.BitlakeTriggersHook"
    assert ui.field_behaviour["relabeling"]["password"] == "Token"

    # The hook as tasks find it (task SDK side).
    from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime

    hook = ProvidersManagerTaskRuntime().hooks["bitlake_triggers"]
    assert hook is not None and hook.hook_class_name == "bitlake.airflow.hooks.BitlakeTriggersHook"
    assert hook.connection_id_attribute_name == "bitlake_triggers_conn_id"
    assert Connection(conn_id="c", conn_type="bitlake_triggers").get_hook().__class__.__name__ == "BitlakeTriggersHook"


def test_connection_settings():
    def settings(**fields):
        return ServiceSettings.from_connection(Connection(conn_id="c", conn_type="bitlake_triggers", **fields))

    assert settings(host="http://svc:8400", password="t") == ServiceSettings("http://svc:8400", "t", 30.0)
    assert settings(host="https://svc", port=9000, schema="triggers/", password="t",
                    extra='{"timeout": 5}') == ServiceSettings("https://svc:9000/triggers", "t", 5.0)
    assert settings(host="svc", port=8400, password="t", extra='{"scheme": "https"}').base_url == "https://svc:8400"
    uri = Connection.from_uri("bitlake-triggers://:blt_a-b_c@svc:8400/api?timeout=2", conn_id="c")
    assert uri.conn_type == "bitlake_triggers"
    assert ServiceSettings.from_connection(uri) == ServiceSettings("http://svc:8400/api", "blt_a-b_c", 2.0)
    with pytest.raises(ValueError, match="no token"):
        settings(host="http://svc")
    with pytest.raises(ValueError, match="no host"):
        settings(password="t")
    assert "blt_" not in repr(ServiceSettings("http://x", "blt_secret"))


def test_hook_reads_the_airflow_connection(trigger_service):
    hook = BitlakeTriggersHook(CONN_ID)
    assert hook.service_settings() == ServiceSettings(trigger_service.url, trigger_service.consumer_token)
    assert asyncio.run(hook.aservice_settings()) == hook.service_settings()
    assert hook.test_connection()[0]
    with hook.get_conn() as client:
        assert client.health()["status"] == "ok"


# --- the operator ---------------------------------------------------------------------------------------

def test_operator_dag_returns_the_events_and_short_circuits_without(airflow_db, trigger_service, table):
    before = dt.datetime.now(dt.UTC)
    events = trigger_service.register(table, 3)
    run = run_dag("bitlake_test_range", table=table)
    assert states(run) == {"changes": "success", "any_changes": "success", "process": "success"}
    assert xcom(run, "changes") == events_json(events)
    assert xcom(run, "process") == 3

    # A time range: [start, end) of event_ts.
    run = run_dag("bitlake_test_range", table=table, start=before.isoformat(),
                  end=(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).isoformat())
    assert [e["event_id"] for e in xcom(run, "changes")] == [e.event_id for e in events]

    # Nothing in the range, or nothing at all: the rest of the run is skipped.
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    for conf in ({"table": table, "start": later.isoformat()}, {"table": table + "_empty"}):
        run = run_dag("bitlake_test_range", **conf)
        assert xcom(run, "changes") == []
        assert states(run) == {"changes": "success", "any_changes": "success", "process": "skipped"}
        assert str(run.state) == "success"


def test_operator_reads_every_page_and_filters(airflow_db, trigger_service, table):
    events = trigger_service.register(table, 5, partition=["2024-01-01"])
    trigger_service.register(table, 2, first=6, partition=["2024-01-02"])
    op = DataChangeEventOperator(task_id="t", table=table, partition=["2024-01-01"])
    assert [e["event_id"] for e in op.execute({})] == [e.event_id for e in events]
    assert len(DataChangeEventOperator(task_id="t", table=table).execute({})) == 7
    with pytest.raises(AirflowException, match="max_events=6"):
        DataChangeEventOperator(task_id="t", table=table, max_events=6).execute({})


def test_operator_flow_mode_and_ack(airflow_db, trigger_service, table):
    events = trigger_service.register(table, 3)
    pending = DataChangeEventOperator(task_id="t", table=table, flow="f", max_events=2).execute({})
    assert [e["event_id"] for e in pending] == [e.event_id for e in events[:2]]
    cursor = DataChangeEventAckOperator(task_id="a", flow="f", table=table, events=pending).execute({})
    assert cursor["last_event_id"] == events[1].event_id
    assert [e["event_id"] for e in DataChangeEventOperator(task_id="t", table=table, flow="f").execute({})] \
        == [events[2].event_id]
    assert DataChangeEventAckOperator(task_id="a", flow="f", table=table, events=[]).execute({}) is None
    with pytest.raises(ValueError, match="no end_time"):
        DataChangeEventOperator(task_id="t", table=table, flow="f", end_time="2024-01-01").execute({})


# --- the sensor and its trigger -------------------------------------------------------------------------

def test_sensor_defers_instead_of_waiting_and_its_trigger_fires(airflow_db, trigger_service, table):
    sensor = DataChangeEventSensor(task_id="wait", trigger_type="snapshot", table=table, flow="f",
                                   poke_interval=0.2, timeout=60)
    started = time.monotonic()
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    assert time.monotonic() - started < 5  # it evaluated once and handed the wait over
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.timeout == dt.timedelta(seconds=60)
    trigger = deferred.value.trigger
    assert isinstance(trigger, DataChangeEventTrigger)

    # The triggerer rebuilds the trigger from serialize(); run that copy against the live service.
    classpath, kwargs = trigger.serialize()
    assert classpath == "bitlake.airflow.triggers.DataChangeEventTrigger"
    rebuilt = DataChangeEventTrigger(**kwargs)
    with pytest.raises(TimeoutError):  # nothing registered: it keeps polling
        asyncio.run(_first_event(rebuilt, timeout=1.0))
    writer = _register_later(trigger_service, table, 2, delay=0.5)
    event = asyncio.run(_first_event(rebuilt, timeout=20))
    writer.join()
    assert event.payload["status"] == "fired" and len(event.payload["events"]) == 2
    assert event.payload["result"]["cursor"]["flow"] == "f"
    assert sensor.execute_complete({}, event.payload) == event.payload["events"]

    # Now that events exist, the sensor returns them without deferring.
    assert sensor.execute({}) == event.payload["events"]


def test_partition_trigger_renders_templates_at_the_scheduled_time(airflow_db, trigger_service, table):
    params = trigger_params("partition", table=table, partition=["{{ ds - 1d }}"], scheduled_time="2024-03-01")
    trigger = DataChangeEventTrigger("partition", params, conn_id=CONN_ID, poll_interval=0.2)
    with pytest.raises(TimeoutError):
        asyncio.run(_first_event(trigger, timeout=1.0))
    trigger_service.register(table, 1, partition=["2024-02-28"])  # another day: still waiting
    with pytest.raises(TimeoutError):
        asyncio.run(_first_event(trigger, timeout=1.0))
    [expected] = trigger_service.register(table, 1, first=2, partition=["2024-02-29"])
    event = asyncio.run(_first_event(trigger, timeout=20))
    assert event.payload["events"] == events_json([expected])
    assert event.payload["result"]["partition"] == ["2024-02-29"]

    # The sensor's default scheduled time is the run's logical date, rendered by Airflow.
    sensor = DataChangeEventSensor(task_id="wait", table=table, partition=["{{ ds - 1d }}"], deferrable=False)
    assert sensor.scheduled_time == "{{ logical_date }}" and "partition" not in sensor.template_fields
    sensor.scheduled_time = "2024-03-01 00:00:00+00:00"
    poked = sensor.poke({})
    assert poked.is_done and poked.xcom_value == events_json([expected])
    sensor.scheduled_time = "2024-03-05 00:00:00+00:00"
    assert not sensor.poke({}).is_done


def test_trigger_reports_a_refused_request(airflow_db, trigger_service):
    # The consumer token is scoped to db.*: the service answers 403, which no retry can fix.
    params = trigger_params("snapshot", table="other.t", flow="f")
    event = asyncio.run(_first_event(DataChangeEventTrigger("snapshot", params, conn_id=CONN_ID), timeout=20))
    assert event.payload["status"] == "error" and event.payload["status_code"] == 403
    sensor = DataChangeEventSensor(task_id="wait", trigger_type="snapshot", table="other.t", flow="f")
    with pytest.raises(AirflowException, match="403"):
        sensor.execute_complete({}, event.payload)


def test_unreachable_service_is_waited_for_not_fatal(airflow_db, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_BITLAKE_DOWN", '{"conn_type": "bitlake_triggers", '
                                                     '"host": "http://127.0.0.1:9", "password": "t"}')
    sensor = DataChangeEventSensor(task_id="wait", trigger_type="snapshot", table="db.t", flow="f",
                                   conn_id="bitlake_down", poke_interval=0.1)
    with pytest.raises(TaskDeferred) as deferred:  # the first check failed to connect: defer anyway
        sensor.execute({})
    with pytest.raises(TimeoutError):  # connection refused is logged and retried, not fatal
        asyncio.run(_first_event(deferred.value.trigger, timeout=1.0))


def test_sensor_arguments_are_checked_when_the_dag_loads():
    with pytest.raises(ValueError, match="trigger_type"):
        DataChangeEventSensor(task_id="s", table="db.t", trigger_type="files")
    with pytest.raises(ValueError, match="flow"):
        DataChangeEventSensor(task_id="s", table="db.t", trigger_type="snapshot")
    with pytest.raises(ValueError, match="partition"):
        DataChangeEventSensor(task_id="s", table="db.t", trigger_type="snapshot", flow="f", partition=["x"])
    sensor = DataChangeEventSensor(task_id="s", table="db.t", partition=["{{ ds }}"], start="2024-01-01",
                                   frequency=1, frequency_unit="DAYS")
    assert sensor.scheduled_time is None  # a schedule replaces the logical date


def test_dag_with_a_deferred_sensor_resumes_when_events_arrive(airflow_db, trigger_service, table, monkeypatch):
    """dag.test() runs a deferred task's trigger in line, as the triggerer would, then resumes the task."""
    runs = []
    run_trigger = DataChangeEventTrigger.run

    async def recorded_run(self):  # the real run(), noting that Airflow ran it
        runs.append(self.serialize()[1])
        async for event in run_trigger(self):
            yield event

    monkeypatch.setattr(DataChangeEventTrigger, "run", recorded_run)

    def register_after_the_first_evaluation():
        try:
            trigger_service.wait_for_flow("f", table)  # the sensor's own check found nothing
            time.sleep(1.0)  # the trigger polls meanwhile
        finally:  # register in any case, or the trigger would poll forever
            trigger_service.register(table, 2)

    writer = threading.Thread(target=register_after_the_first_evaluation, daemon=True)
    writer.start()
    run = run_dag("bitlake_test_sensor", table=table, flow="f")
    writer.join()
    assert states(run) == {"wait": "success", "process": "success"}
    assert [e["table"] for e in xcom(run, "wait")] == [table, table]
    assert xcom(run, "process") == 2
    # The events came from the trigger, which Airflow ran after the sensor deferred.
    assert [r["params"]["table"] for r in runs] == [table]


# --- the example DAG ------------------------------------------------------------------------------------

def test_example_dag_parses():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(EXAMPLE_DAG.parent))
    assert not bag.import_errors
    dag = bag.get_dag("example_bitlake_changes")
    assert dag is not None and (DAGS_FOLDER / EXAMPLE_DAG.name).exists()
    assert set(dag.task_dict) == {"changes", "any_changes", "read_changes", "ack"}
    assert type(dag.task_dict["any_changes"]).__name__ == "ShortCircuitOperator"
    assert dag.task_dict["read_changes"].upstream_task_ids == {"changes", "any_changes"}
    assert dag.task_dict["ack"].upstream_task_ids == {"changes", "read_changes"}
    assert dag.max_active_runs == 1


def test_example_dag_acknowledges_the_flow(airflow_db, trigger_service, table):
    """The loop without Spark (read_changes marked successful): events -> ack -> nothing -> new event."""
    events = trigger_service.register(table, 3)
    conf = {"table": table, "flow": "example"}
    run = run_dag("example_bitlake_changes", mark_success="read_changes", **conf)
    assert states(run) == {"changes": "success", "any_changes": "success", "read_changes": "success",
                           "ack": "success"}
    assert xcom(run, "changes") == events_json(events)
    assert xcom(run, "ack")["last_event_id"] == events[-1].event_id

    run = run_dag("example_bitlake_changes", mark_success="read_changes", **conf)
    assert states(run) == {"changes": "success", "any_changes": "success", "read_changes": "skipped",
                           "ack": "skipped"}

    [new] = trigger_service.register(table, 1, first=4)
    run = run_dag("example_bitlake_changes", mark_success="read_changes", **conf)
    assert xcom(run, "changes") == events_json([new])
    assert xcom(run, "ack")["last_event_id"] == new.event_id



@pytest.mark.spark
@pytest.mark.timeout(360, method="thread")  # Spark's start-up is slow on a loaded 2-core machine
def test_example_dag_reads_the_changed_range_with_spark(airflow_db, trigger_service, table, tmp_path):
    """The whole loop on a real bitlake table: commits -> events -> the DAG reads exactly the changed rows
    (Spark, local[1]) -> acknowledges -> the next run reads only what came after."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import bitlake
    from bitlake.triggers import publish

    path, output = str(tmp_path / "orders"), str(tmp_path / "changed")
    schema = pa.schema([("id", pa.int64()), ("v", pa.string()), ("ts", pa.int64())])
    orders = bitlake.create_table(path, schema, primary_key=["id"], delta_column="ts",
                                  name=table)

    spark = bitlake.spark_session("local[1]")  # the DAG's task uses it too (tasks run in-process here)

    try:
        def commit(rows):
            orders.ingest(pa.Table.from_pylist(rows, schema), spark=spark)
            with trigger_service.producer() as producer:
                publish(orders, producer)

        commit([{"id": i, "v": "a", "ts": 1} for i in (1, 2, 3)])
        commit([{"id": 1, "v": "b", "ts": 2}, {"id": 4, "v": "a", "ts": 2}])
        conf = {"table": table, "flow": "spark", "location": path, "spark_master": "local[1]", "output": output}
        run = run_dag("example_bitlake_changes", **conf)
        assert states(run) == {"changes": "success", "any_changes": "success", "read_changes": "success",
                               "ack": "success"}
        result = xcom(run, "read_changes")
        assert result["counts"] == {"insert": 4, "update_preimage": 1, "update_postimage": 1}
        assert pq.read_table(output).num_rows == 6
        assert xcom(run, "ack")["last_event_id"] == xcom(run, "changes")[-1]["event_id"]

        commit([{"id": 2, "v": "c", "ts": 3}])
        run = run_dag("example_bitlake_changes", **conf)
        result = xcom(run, "read_changes")
        assert result["counts"] == {"update_preimage": 1, "update_postimage": 1}
        assert result["start_snapshot_id"] == xcom(run, "changes")[0]["prev_snapshot_id"]
        assert pq.read_table(output).num_rows == 8
    finally:
        spark.stop()
