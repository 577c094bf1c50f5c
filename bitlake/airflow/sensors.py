"""A sensor that waits for a partition trigger or a snapshot trigger of bitlake's service to fire."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowException

from bitlake.airflow.hooks import (
    DEFAULT_CONN_ID,
    PARTITION,
    SNAPSHOT,
    TRIGGER_TYPES,
    BitlakeTriggersHook,
    events_json,
    trigger_params,
)
from bitlake.airflow.triggers import RETRYABLE_STATUS, DataChangeEventTrigger
from bitlake.errors import InvalidSettingError
from bitlake.triggers import TriggerServiceError

#: The default ``scheduled_time`` of a partition trigger: the run's logical date, so ``{{ ds }}`` in a
#: partition template is the day Airflow's own ``{{ ds }}`` is.
LOGICAL_DATE = "{{ logical_date }}"


def _unset(value: Any) -> bool:
    """A rendered template that produced nothing: Jinja renders None as 'None'."""
    return value is None or (isinstance(value, str) and value.strip() in ("", "None"))


class DataChangeEventSensor(BaseSensorOperator):
    """Waits until a partition trigger or a snapshot trigger fires, and returns its events (XCom).

    Deferrable by default: it evaluates the trigger once, and if it has not fired, defers to
    :class:`~bitlake.airflow.triggers.DataChangeEventTrigger`, which polls the service from Airflow's
    triggerer every ``poke_interval`` seconds without holding a worker slot (run ``airflow triggerer``).
    With ``deferrable=False`` it is a classic sensor (``mode="poke"`` or ``"reschedule"``).

    The XCom is the list of fired events as JSON objects (the documented encoding; ``decode_events(
    json.dumps(xcom))`` gives :class:`bitlake.triggers.Event` objects), at most ``limit`` (1000 by default).

    Args:
        table: the table (templated).
        trigger_type: ``"partition"`` (has this partition arrived?) or ``"snapshot"`` (what changed since the
            flow's last acknowledged run?). (``mode`` remains Airflow's poke/reschedule.)
        partition: partition trigger: the partition values, one per level; each may hold the service's
            templates such as ``"{{ ds }}"`` or ``"{{ ds - 1d }}"``, rendered by the service at the scheduled
            time, so this field is *not* rendered by Airflow. ``None``: the table is unpartitioned.
        tags: the tags every event must carry (templated).
        flow: snapshot trigger: the consumer flow's name (templated). Acknowledge a successful run with
            :class:`~bitlake.airflow.operators.DataChangeEventAckOperator`.
        start: partition trigger: the schedule's first tick (with ``frequency`` and ``frequency_unit``);
            snapshot trigger: events registered before it are ignored when the flow is first created.
        frequency, frequency_unit: partition trigger: the schedule (``MINUTES``, ``HOURS``, ``DAYS``).
        scheduled_time: partition trigger without a schedule: when the templates are rendered; defaults to
            the run's logical date (the service's clock when the run has none). Templated.
        timezone: IANA zone the partition templates and daily schedules use.
        limit: the most events returned (1 to 1000).
        conn_id: the ``bitlake_triggers`` Airflow connection.
        deferrable: wait in the triggerer (True) or in the task (False).
    """

    template_fields: Sequence[str] = ("table", "tags", "flow", "start", "scheduled_time", "timezone", "conn_id")
    ui_color = "#d8f0e8"

    def __init__(self, *, table: str, trigger_type: str = PARTITION,
                 partition: Sequence[str | None] | None = None, tags: Mapping[str, str] | None = None,
                 flow: str | None = None, start: dt.datetime | str | int | None = None,
                 frequency: int | None = None, frequency_unit: str | None = None,
                 scheduled_time: dt.datetime | str | None = LOGICAL_DATE, timezone: str = "UTC",
                 limit: int | None = None, conn_id: str = DEFAULT_CONN_ID, deferrable: bool = True,
                 **kwargs: Any):
        super().__init__(**kwargs)
        if trigger_type not in TRIGGER_TYPES:
            raise InvalidSettingError(f"trigger_type must be one of {', '.join(TRIGGER_TYPES)}, not {trigger_type!r}")
        if scheduled_time == LOGICAL_DATE and (trigger_type == SNAPSHOT or start is not None):
            scheduled_time = None  # the default only applies to unscheduled partition triggers
        self.table = table
        self.trigger_type = trigger_type
        self.partition = None if partition is None else list(partition)
        self.tags = dict(tags or {})
        self.flow = flow
        self.start = start
        self.frequency = frequency
        self.frequency_unit = frequency_unit
        self.scheduled_time = scheduled_time
        self.timezone = timezone
        self.limit = limit
        self.conn_id = conn_id
        self.deferrable = deferrable
        # Check the combination now, so a DAG with a wrong one fails to load rather than at run time.
        trigger_params(trigger_type, table=table, partition=self.partition, tags=self.tags, flow=flow,
                       frequency=frequency, frequency_unit=frequency_unit,
                       scheduled_time=None if trigger_type == PARTITION else scheduled_time)

    def _params(self) -> dict[str, Any]:
        return trigger_params(
            self.trigger_type, table=self.table, partition=self.partition, tags=self.tags, flow=self.flow,
            start=None if _unset(self.start) else self.start, frequency=self.frequency,
            frequency_unit=self.frequency_unit,
            scheduled_time=None if _unset(self.scheduled_time) else self.scheduled_time,
            timezone=self.timezone, limit=self.limit)

    def _fired(self, result: Any) -> list[dict[str, Any]]:
        events = events_json(result.events)
        self.log.info("%s trigger on %r fired with %d event(s) (ids %s..%s)%s", self.trigger_type, self.table,
                      len(events), events[0]["event_id"], events[-1]["event_id"],
                      "; more are pending beyond the limit" if result.has_more else "")
        return events

    def poke(self, context: Any) -> PokeReturnValue:
        result = BitlakeTriggersHook(self.conn_id).evaluate(self.trigger_type, self._params())
        if not result.fired:
            self.log.info("%s trigger on %r has not fired", self.trigger_type, self.table)
            return PokeReturnValue(is_done=False)
        return PokeReturnValue(is_done=True, xcom_value=self._fired(result))

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        params = self._params()
        try:
            result = BitlakeTriggersHook(self.conn_id).evaluate(self.trigger_type, params)
        except (httpx.TransportError, TriggerServiceError) as exc:
            if isinstance(exc, TriggerServiceError) and exc.status_code not in RETRYABLE_STATUS:
                raise  # a bad parameter or token: no wait can fix it
            self.log.warning("cannot evaluate the %s trigger on %r now (%s); the trigger will retry",
                             self.trigger_type, self.table, exc)
        else:
            if result.fired:  # no need to defer
                return self._fired(result)
        self.log.info("%s trigger on %r has not fired; deferring (polling every %ss)", self.trigger_type,
                      self.table, self.poke_interval)
        self.defer(trigger=DataChangeEventTrigger(self.trigger_type, params, conn_id=self.conn_id,
                                                  poll_interval=self.poke_interval),
                   method_name="execute_complete", timeout=dt.timedelta(seconds=self.timeout))

    def execute_complete(self, context: Any, event: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Resumes the task when the trigger yields: the fired events, or the service's refusal as an error."""
        if event.get("status") != "fired":
            raise AirflowException(event.get("message", f"unexpected trigger event {event!r}"))
        events = list(event["events"])
        self.log.info("%s trigger on %r fired with %d event(s)%s", self.trigger_type, self.table, len(events),
                      "; more are pending beyond the limit" if event.get("has_more") else "")
        return events
