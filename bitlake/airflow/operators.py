"""Operators of bitlake's trigger service: fetch Data Change Events, acknowledge a flow's run."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException

from bitlake.airflow.hooks import DEFAULT_CONN_ID, BitlakeTriggersHook, events_json
from bitlake.errors import InvalidSettingError
from bitlake.triggers.event import MAX_EVENTS_PER_REQUEST

ANY = "*"  # ``partition`` of DataChangeEventOperator: events of every partition


def _unset(value: Any) -> bool:
    """Unset, or a rendered template that produced nothing (Jinja renders None as 'None')."""
    return value is None or (isinstance(value, str) and value.strip() in ("", "None"))


class DataChangeEventOperator(BaseOperator):
    """Returns a table's Data Change Events as XCom: a list of JSON objects in the documented encoding.

    Two ways to choose the events:

    - **a time range** (no ``flow``): the events registered in ``[start_time, end_time)`` (``GET /events``,
      every page), e.g. the run's data interval: ``start_time="{{ data_interval_start }}",
      end_time="{{ data_interval_end }}"``. ``None`` leaves that side open.
    - **a flow** (``flow="name"``): the events after the flow's acknowledged cursor (a snapshot trigger
      evaluated once, without waiting; ``start_time`` is the trigger's ``start``). The cursor does not move:
      acknowledge the run at its end with :class:`DataChangeEventAckOperator`, and the next run gets what
      came after. With more than ``max_events`` pending, the first ones are returned and the next run gets
      the rest; the service never ends a batch inside a commit (one event per partition it touched), so a
      batch holds whole commits: at most ``max_events`` events, or one commit that has more.

    An empty list means nothing changed: put a ``ShortCircuitOperator`` after it to skip the rest of the run.
    ``bitlake.triggers.decode_events(json.dumps(xcom))`` gives :class:`bitlake.triggers.Event` objects.

    Args:
        table: the table (templated).
        start_time, end_time: the range of ``event_ts`` (templated; datetime, ISO-8601 text or epoch ms).
        partition: only the events of this partition (a list of values, one per level; templated by
            Airflow); ``None`` or ``"*"``: every partition; ``[]`` is refused. Not with ``flow``.
        tags: the tags every event must carry (templated).
        flow: read the flow's pending events instead of a time range (templated).
        max_events: the most events returned; in a time range, more is an error (narrow the range), for a
            flow at most 1000 are read per run (more only when one commit has more events).
        conn_id: the ``bitlake_triggers`` Airflow connection.
    """

    template_fields: Sequence[str] = ("table", "start_time", "end_time", "partition", "tags", "flow", "conn_id")
    ui_color = "#d8f0e8"

    def __init__(self, *, table: str, start_time: dt.datetime | str | int | None = None,
                 end_time: dt.datetime | str | int | None = None,
                 partition: Sequence[str | None] | str | None = None, tags: Mapping[str, str] | None = None,
                 flow: str | None = None, max_events: int = 10_000, conn_id: str = DEFAULT_CONN_ID,
                 **kwargs: Any):
        super().__init__(**kwargs)
        if max_events < 1:
            raise InvalidSettingError("max_events must be at least 1")
        self.table = table
        self.start_time = start_time
        self.end_time = end_time
        self.partition = partition
        self.tags = dict(tags or {})
        self.flow = flow
        self.max_events = max_events
        self.conn_id = conn_id

    def execute(self, context: Any) -> list[dict[str, Any]]:
        start = None if _unset(self.start_time) else self.start_time
        end = None if _unset(self.end_time) else self.end_time
        with BitlakeTriggersHook(self.conn_id).get_conn() as client:
            flow = None if _unset(self.flow) else str(self.flow)
            if flow is not None:
                # Checked here, after rendering: a template such as "{{ params.flow }}" may render empty.
                if end is not None:
                    raise InvalidSettingError("with a flow, the events are those after its acknowledged cursor: "
                                     "no end_time")
                if not _unset(self.partition) and self.partition != ANY:
                    raise InvalidSettingError("with a flow, the events are those of its snapshot trigger: no partition")
                result = client.snapshot_trigger(flow, self.table, tags=self.tags, start=start,
                                                  limit=min(self.max_events, MAX_EVENTS_PER_REQUEST))
                events = result.events
                self.log.info("flow %r on %r: %d pending event(s) after event id %d%s", flow, self.table,
                              len(events), result.cursor.last_event_id,
                              "; more are pending, the next run gets them" if result.has_more else "")
            else:
                filters: dict[str, Any] = {"tags": self.tags, "since": start, "until": end}
                if not _unset(self.partition) and self.partition != ANY:
                    partition = self.partition
                    if isinstance(partition, str):  # a rendered template of a list: JSON
                        partition = json.loads(partition)
                    filters["partition"] = partition
                events = []
                for event in client.iter_events(self.table, limit=MAX_EVENTS_PER_REQUEST, **filters):
                    if len(events) == self.max_events:
                        raise AirflowException(
                            f"more than max_events={self.max_events} events of {self.table!r} in "
                            f"[{start}, {end}): narrow the range or raise max_events")
                    events.append(event)
                self.log.info("%d event(s) of %r in [%s, %s)", len(events), self.table, start, end)
        return events_json(events)


class DataChangeEventAckOperator(BaseOperator):
    """Acknowledges a flow's successful run: moves its cursor on ``table`` to the last processed event.

    Put it last in the run, after the job that processed the events, so a failed run leaves the cursor where
    it was and the next run gets the same events again. Acknowledging the same id twice changes nothing.

    Args:
        flow: the consumer flow (templated).
        table: the table (templated).
        events: the events the run processed, e.g. ``DataChangeEventOperator(...).output`` (a list of event
            objects or their JSON text); the highest ``event_id`` of ``table`` among them is acknowledged,
            nothing when there are none.
        event_id: acknowledge this id instead of reading ``events``.
        conn_id: the ``bitlake_triggers`` Airflow connection.

    Returns the flow's cursor after the ack (XCom), or None when there was nothing to acknowledge.
    """

    template_fields: Sequence[str] = ("flow", "table", "events", "event_id", "conn_id")
    ui_color = "#d8f0e8"

    def __init__(self, *, flow: str, table: str, events: Any = None, event_id: int | str | None = None,
                 conn_id: str = DEFAULT_CONN_ID, **kwargs: Any):
        super().__init__(**kwargs)
        if events is None and event_id is None:
            raise InvalidSettingError("give the events the run processed (events=...) or the event id to acknowledge")
        self.flow = flow
        self.table = table
        self.events = events
        self.event_id = event_id
        self.conn_id = conn_id

    def _last_event_id(self) -> int | None:
        if not _unset(self.event_id):
            return int(self.event_id)  # type: ignore[arg-type]
        events = self.events
        if isinstance(events, str | bytes):
            events = json.loads(events) if not _unset(events) else []
        ids = [int(e["event_id"]) for e in events or [] if e.get("table", self.table) == self.table]
        return max(ids) if ids else None

    def execute(self, context: Any) -> dict[str, Any] | None:
        event_id = self._last_event_id()
        if event_id is None:
            self.log.info("no event of %r to acknowledge for flow %r", self.table, self.flow)
            return None
        with BitlakeTriggersHook(self.conn_id).get_conn() as client:
            cursor = client.ack(self.flow, self.table, event_id)
        self.log.info("flow %r acknowledged %r up to event id %d", self.flow, self.table, cursor.last_event_id)
        return cursor.model_dump(mode="json")
