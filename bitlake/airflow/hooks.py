"""The Airflow connection to bitlake's trigger service and the clients built from it.

A connection of type ``bitlake_triggers`` holds the service URL in ``host`` and the token in ``password``::

    AIRFLOW_CONN_BITLAKE_TRIGGERS_DEFAULT='{"conn_type": "bitlake_triggers",
        "host": "http://127.0.0.1:8400", "password": "blt_..."}'

``host`` may also be a bare host name with ``port`` (and ``extra`` ``{"scheme": "https"}``); ``schema`` is a
path prefix (a service behind a proxy at ``/triggers``); ``extra`` ``{"timeout": 30}`` sets the seconds per
request.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from airflow.sdk import BaseHook
from pydantic import BaseModel

from bitlake.airflow import CONNECTION_FIELD_BEHAVIOUR
from bitlake.errors import InvalidSettingError
from bitlake.triggers import Client, Event
from bitlake.triggers.client import NO_RETRY, Timestampish, parse_response
from bitlake.triggers.event import format_timestamp, parse_timestamp
from bitlake.triggers.trigger import PartitionTriggerResult, SnapshotTriggerResult

DEFAULT_CONN_ID = "bitlake_triggers_default"
DEFAULT_TIMEOUT = 30.0

PARTITION = "partition"
SNAPSHOT = "snapshot"
TRIGGER_TYPES = (PARTITION, SNAPSHOT)
_OPTIONAL = frozenset({"start", "frequency", "frequency_unit", "scheduled_time", "at", "limit"})


@dataclass(frozen=True)
class ServiceSettings:
    """Where the service is and how to authenticate, as read from an Airflow connection."""

    base_url: str
    token: str
    timeout: float = DEFAULT_TIMEOUT

    def __repr__(self) -> str:  # never show the token in logs
        return f"ServiceSettings(base_url={self.base_url!r}, timeout={self.timeout})"

    @classmethod
    def from_connection(cls, conn: Any) -> ServiceSettings:
        """Settings from an Airflow ``Connection``; ValueError says what is missing."""
        extra = conn.extra_dejson if conn.extra else {}
        host = (conn.host or "").strip()
        if not host:
            raise InvalidSettingError(f"connection {conn.conn_id!r} has no host: set it to the trigger service's URL, "
                             "e.g. http://127.0.0.1:8400")
        if "://" in host:
            url = urlsplit(host)
            scheme, netloc, path = url.scheme, url.netloc, url.path
            if conn.port and url.port is None:
                netloc = f"{netloc}:{conn.port}"
        else:
            scheme, netloc, path = str(extra.get("scheme", "http")), host, ""
            if conn.port:
                netloc = f"{netloc}:{conn.port}"
        if conn.schema:
            path = f"{path.rstrip('/')}/{conn.schema.strip('/')}"
        if not conn.password:
            raise InvalidSettingError(f"connection {conn.conn_id!r} has no token: put a consumer token of the trigger "
                             "service in its password")
        try:
            timeout = float(extra.get("timeout", DEFAULT_TIMEOUT))
        except (TypeError, ValueError):
            raise InvalidSettingError(
                f"connection {conn.conn_id!r}: extra 'timeout' must be a number of seconds") from None
        return cls(f"{scheme}://{netloc}{path}".rstrip("/"), conn.password, timeout)


class BitlakeTriggersHook(BaseHook):
    """Reads a ``bitlake_triggers`` connection and gives a :class:`bitlake.triggers.Client` for it.

    Args:
        bitlake_triggers_conn_id: the Airflow connection id.
        timeout: seconds per request, over the connection's ``extra`` ``timeout``.
    """

    conn_name_attr = "bitlake_triggers_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "bitlake_triggers"
    hook_name = "bitlake trigger service"

    def __init__(self, bitlake_triggers_conn_id: str = DEFAULT_CONN_ID, *, timeout: float | None = None):
        super().__init__()
        self.bitlake_triggers_conn_id = bitlake_triggers_conn_id
        self.timeout = timeout

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return copy.deepcopy(CONNECTION_FIELD_BEHAVIOUR)

    def _with_timeout(self, settings: ServiceSettings) -> ServiceSettings:
        if self.timeout is None:
            return settings
        return ServiceSettings(settings.base_url, settings.token, self.timeout)

    def service_settings(self) -> ServiceSettings:
        return self._with_timeout(ServiceSettings.from_connection(self.get_connection(self.bitlake_triggers_conn_id)))

    async def aservice_settings(self) -> ServiceSettings:
        """The same, read without blocking the event loop (in Airflow's triggerer)."""
        conn = await self.aget_connection(self.bitlake_triggers_conn_id)
        return self._with_timeout(ServiceSettings.from_connection(conn))

    def get_conn(self) -> Client:
        """A new :class:`bitlake.triggers.Client`; close it (or use it in ``with``)."""
        settings = self.service_settings()
        # Airflow retries a task and polls a sensor on its own schedule: the client's own retries would only hold a
        # worker slot (a deferrable sensor facing a dead service would block up to their deadline before deferring).
        return Client(settings.base_url, settings.token, timeout=settings.timeout, retry=NO_RETRY)

    def test_connection(self) -> tuple[bool, str]:
        """Airflow's "Test" button: the service answers ``/health``."""
        try:
            with self.get_conn() as client:
                health = client.health()
        except Exception as exc:  # Airflow shows the message
            return False, str(exc)
        return True, f"bitlake trigger service is up (API version {health.get('api_version')})"

    def evaluate(self, trigger_type: str, params: Mapping[str, Any]) -> PartitionTriggerResult | SnapshotTriggerResult:
        """Evaluate a partition or snapshot trigger with :func:`trigger_params`' parameters."""
        with self.get_conn() as client:
            if trigger_type == PARTITION:
                return client.partition_trigger(**params)
            if trigger_type == SNAPSHOT:
                return client.snapshot_trigger(**params)
        raise InvalidSettingError(f"unknown trigger type {trigger_type!r}: {' or '.join(TRIGGER_TYPES)}")


def _ts(value: Timestampish | None) -> str | None:
    return None if value is None else format_timestamp(parse_timestamp(value))


def trigger_params(trigger_type: str, *, table: str, partition: Sequence[str | None] | None = None,
                   tags: Mapping[str, str] | None = None, flow: str | None = None,
                   start: Timestampish | None = None, frequency: int | None = None,
                   frequency_unit: str | None = None, scheduled_time: Timestampish | None = None,
                   timezone: str = "UTC", limit: int | None = None) -> dict[str, Any]:
    """The keyword arguments of ``Client.partition_trigger`` or ``Client.snapshot_trigger``, checked.

    Timestamps become ISO-8601 text, so the result is JSON (an Airflow trigger's serialized kwargs).
    """
    if trigger_type == PARTITION:
        if flow is not None:
            raise InvalidSettingError("a partition trigger has no flow (flows belong to snapshot triggers)")
        if scheduled_time is not None and start is not None:
            raise InvalidSettingError("give either scheduled_time or the schedule (start, frequency, frequency_unit)")
        return {"table": table, "partition": None if partition is None else list(partition),
                "tags": dict(tags or {}), "start": _ts(start), "frequency": frequency,
                "frequency_unit": frequency_unit, "scheduled_time": _ts(scheduled_time), "timezone": timezone,
                "limit": limit}
    if trigger_type == SNAPSHOT:
        if not flow:
            raise InvalidSettingError("a snapshot trigger needs the name of its consumer flow (flow=...)")
        if partition is not None or frequency is not None or frequency_unit is not None \
                or scheduled_time is not None:
            raise InvalidSettingError("a snapshot trigger takes table, flow, tags, start and limit only "
                             "(partition and schedule belong to partition triggers)")
        return {"flow": flow, "table": table, "tags": dict(tags or {}), "start": _ts(start), "limit": limit}
    raise InvalidSettingError(f"unknown trigger type {trigger_type!r}: {' or '.join(TRIGGER_TYPES)}")


def events_json(events: Sequence[Event]) -> list[dict[str, Any]]:
    """Events as JSON objects in the documented encoding (what ``encode_events`` writes, one object each).

    ``bitlake.triggers.decode_events(json.dumps(value))`` turns an XCom of them back into events.
    """
    return [e.model_dump(mode="json") for e in events]


class AsyncTriggerClient:
    """The two trigger evaluations over ``httpx.AsyncClient``, for Airflow's triggerer (one event loop for
    every deferred task: nothing here may block). Same requests and answers as :class:`bitlake.triggers.Client`.
    """

    def __init__(self, settings: ServiceSettings):
        self.settings = settings
        self._http = httpx.AsyncClient(base_url=settings.base_url, timeout=settings.timeout,
                                       headers={"Authorization": f"Bearer {settings.token}"})

    async def __aenter__(self) -> AsyncTriggerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: dict[str, Any], model: type[BaseModel]) -> Any:
        # Unset options are left out; ``partition: null`` (an unpartitioned table) is a value and is sent.
        body = {k: v for k, v in body.items() if v is not None or k not in _OPTIONAL}
        response = await self._http.post(path, json=body)
        return parse_response(response, model)

    async def evaluate(self, trigger_type: str, params: Mapping[str, Any]
                       ) -> PartitionTriggerResult | SnapshotTriggerResult:
        body = dict(params)
        if trigger_type == PARTITION:
            return await self._post("/triggers/partition", body, PartitionTriggerResult)
        if trigger_type == SNAPSHOT:
            return await self._post("/triggers/snapshot", body, SnapshotTriggerResult)
        raise InvalidSettingError(f"unknown trigger type {trigger_type!r}: {' or '.join(TRIGGER_TYPES)}")
