"""The Airflow trigger that waits for a partition or snapshot trigger of bitlake's service to fire.

:class:`~bitlake.airflow.sensors.DataChangeEventSensor` defers to it: the task gives up its worker slot and
Airflow's triggerer (``airflow triggerer``), which runs every deferred task's trigger in one asyncio loop,
polls the service until the trigger fires, then resumes the task with the fired events.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx
from airflow.triggers.base import BaseTrigger, TriggerEvent

from bitlake.airflow.hooks import (
    DEFAULT_CONN_ID,
    TRIGGER_TYPES,
    AsyncTriggerClient,
    BitlakeTriggersHook,
    events_json,
)
from bitlake.errors import InvalidSettingError
from bitlake.triggers import TriggerServiceError

# Statuses worth retrying: a timeout, throttling, or the service or its database being unavailable.
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class DataChangeEventTrigger(BaseTrigger):
    """Polls a partition or snapshot trigger every ``poll_interval`` seconds until it fires.

    Args:
        trigger_type: ``partition`` or ``snapshot``.
        params: the trigger's parameters, as :func:`bitlake.airflow.hooks.trigger_params` returns them.
        conn_id: the ``bitlake_triggers`` Airflow connection.
        poll_interval: seconds between evaluations.

    It yields one :class:`TriggerEvent` and stops: ``{"status": "fired", "trigger_type", "events" (the
    JSON encoding), "has_more", "result" (the rest of the service's answer: rendered partition, scheduled time,
    the flow's cursor...)}``, or ``{"status": "error",
    "status_code", "message"}`` when the service refuses the request (a 4xx other than throttling: a bad
    parameter, a token without the scope). Network errors and retryable statuses (408, 429, 5xx) are logged
    and retried at the next poll; the sensor's ``timeout`` bounds the wait.
    """

    def __init__(self, trigger_type: str, params: Mapping[str, Any], conn_id: str = DEFAULT_CONN_ID,
                 poll_interval: float = 60.0):
        super().__init__()
        if trigger_type not in TRIGGER_TYPES:
            raise InvalidSettingError(f"unknown trigger type {trigger_type!r}: {' or '.join(TRIGGER_TYPES)}")
        if poll_interval <= 0:
            raise InvalidSettingError("poll_interval must be a positive number of seconds")
        self.trigger_type = trigger_type
        self.params = dict(params)
        self.conn_id = conn_id
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"trigger_type": self.trigger_type, "params": self.params, "conn_id": self.conn_id,
                 "poll_interval": self.poll_interval})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        settings = await BitlakeTriggersHook(self.conn_id).aservice_settings()
        what = f"{self.trigger_type} trigger on {self.params.get('table')!r}"
        async with AsyncTriggerClient(settings) as client:
            polls = 0
            while True:
                polls += 1
                try:
                    result = await client.evaluate(self.trigger_type, self.params)
                except TriggerServiceError as exc:
                    if exc.status_code not in RETRYABLE_STATUS:
                        yield TriggerEvent({"status": "error", "status_code": exc.status_code,
                                            "message": f"{what}: the service refused the request: {exc}"})
                        return
                    self.log.warning("%s: the service answered %s; retrying in %ss", what, exc, self.poll_interval)
                except httpx.TransportError as exc:
                    self.log.warning("%s: cannot reach %s (%s: %s); retrying in %ss", what, settings.base_url,
                                     type(exc).__name__, exc, self.poll_interval)
                else:
                    if result.fired:
                        self.log.info("%s fired with %d event(s) after %d poll(s)", what, len(result.events), polls)
                        yield TriggerEvent({"status": "fired", "trigger_type": self.trigger_type,
                                            "events": events_json(result.events), "has_more": result.has_more,
                                            "result": result.model_dump(mode="json", exclude={"events"})})
                        return
                    self.log.info("%s has not fired; next poll in %ss", what, self.poll_interval)
                await asyncio.sleep(self.poll_interval)
