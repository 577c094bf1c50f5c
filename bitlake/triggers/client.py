"""A Python client of the trigger service (httpx): every endpoint, with the service's own models.

>>> client = Client("http://127.0.0.1:8400", token)            # doctest: +SKIP
>>> client.register(commit.events)                              # doctest: +SKIP
>>> fired = client.snapshot_trigger("daily_agg", "db.orders")   # doctest: +SKIP
>>> if fired.fired:                                             # doctest: +SKIP
...     run(fired.events)
...     client.ack("daily_agg", "db.orders", fired.events[-1].event_id)
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import httpx
from pydantic import BaseModel

from bitlake.triggers.errors import TriggerServiceError
from bitlake.triggers.event import MAX_EVENTS_PER_REQUEST, Event, EventIn, format_timestamp, parse_timestamp
from bitlake.triggers.models import ANY_PARTITION, EventPage, Registration, RegistrationResult
from bitlake.triggers.trigger import FlowCursor, PartitionTriggerResult, SnapshotTriggerResult

Timestampish = dt.datetime | str | int


def _ts(value: Timestampish | None) -> str | None:
    return None if value is None else format_timestamp(parse_timestamp(value))


def parse_response(response: httpx.Response, model: type[BaseModel]) -> Any:
    """The service's answer as ``model``; an error status raises :class:`TriggerServiceError` with its reason.

    Shared by this client and the Airflow provider's async client (a read response is the same object).
    """
    if response.status_code >= 400:
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text
        raise TriggerServiceError(response.status_code, detail)
    return model.model_validate_json(response.content)


class Client:
    """Talks to one trigger service with one token.

    Args:
        base_url: the service's root, e.g. ``http://127.0.0.1:8400``.
        token: a bearer token from :func:`bitlake.triggers.store.create_token`.
        timeout: seconds per request.
        http_client: an ``httpx.Client`` to send through instead of a new one (e.g. FastAPI's TestClient).
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0, http_client: httpx.Client | None = None):
        self._owned = http_client is None
        self._http = http_client if http_client is not None else httpx.Client(timeout=timeout)
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"}

    def close(self) -> None:
        if self._owned:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, path: str, model: type[BaseModel], **kwargs: Any) -> Any:
        response = self._http.request(method, self.base_url + path, headers=self._headers, **kwargs)
        return parse_response(response, model)

    def register(self, events: EventIn | Mapping[str, Any] | Iterable[EventIn | Mapping[str, Any]]
                 ) -> list[Registration]:
        """Register one event or many. Up to 1000 go in one request (one transaction); more are sent in
        requests of 1000, each atomic on its own. Retrying is safe: registration is idempotent."""
        items = [events] if isinstance(events, EventIn | Mapping) else list(events)
        batch = [e if isinstance(e, EventIn) else EventIn.model_validate(e) for e in items]
        out: list[Registration] = []
        for i in range(0, len(batch), MAX_EVENTS_PER_REQUEST):
            body = {"events": [e.model_dump(mode="json") for e in batch[i:i + MAX_EVENTS_PER_REQUEST]]}
            out.extend(self._call("POST", "/events", RegistrationResult, json=body).events)
        return out

    def events(self, table: str, *, partition: Sequence[str | None] | None = ANY_PARTITION,
               tags: Mapping[str, str] | None = None, since: Timestampish | None = None,
               until: Timestampish | None = None, min_event_id: int | None = None, max_event_id: int | None = None,
               cursor: str | None = None, limit: int = 100) -> EventPage:
        """One page of a table's events (GET /events); ``partition=None`` asks for unpartitioned events."""
        params: list[tuple[str, Any]] = [("table", table), ("limit", limit)]
        if partition is not ANY_PARTITION:
            params.append(("partition", json.dumps(None if partition is None else list(partition))))
        params += [("tag", f"{k}={v}") for k, v in (tags or {}).items()]
        for name, value in (("since", _ts(since)), ("until", _ts(until)), ("min_event_id", min_event_id),
                            ("max_event_id", max_event_id), ("cursor", cursor)):
            if value is not None:
                params.append((name, value))
        return self._call("GET", "/events", EventPage, params=params)

    def iter_events(self, table: str, **filters: Any) -> Iterator[Event]:
        """Every event matching the filters of :meth:`events`, following the cursors."""
        cursor = None
        while True:
            page = self.events(table, cursor=cursor, **filters)
            yield from page.events
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def partition_trigger(self, table: str, partition: Sequence[str | None] | None, *,
                          tags: Mapping[str, str] | None = None, start: Timestampish | None = None,
                          frequency: int | None = None, frequency_unit: str | None = None,
                          scheduled_time: Timestampish | None = None, at: Timestampish | None = None,
                          timezone: str = "UTC", limit: int | None = None) -> PartitionTriggerResult:
        """Evaluate a partition trigger (POST /triggers/partition); see docs/triggers.md for the semantics."""
        body: dict[str, Any] = {"table": table, "partition": None if partition is None else list(partition),
                                "tags": dict(tags or {}), "timezone": timezone}
        for name, value in (("start", _ts(start)), ("frequency", frequency), ("frequency_unit", frequency_unit),
                            ("scheduled_time", _ts(scheduled_time)), ("at", _ts(at)), ("limit", limit)):
            if value is not None:
                body[name] = value
        return self._call("POST", "/triggers/partition", PartitionTriggerResult, json=body)

    def snapshot_trigger(self, flow: str, table: str, *, tags: Mapping[str, str] | None = None,
                         start: Timestampish | None = None, limit: int | None = None) -> SnapshotTriggerResult:
        """The flow's events after its acknowledged cursor (POST /triggers/snapshot); moves nothing."""
        body: dict[str, Any] = {"flow": flow, "table": table, "tags": dict(tags or {})}
        if start is not None:
            body["start"] = _ts(start)
        if limit is not None:
            body["limit"] = limit
        return self._call("POST", "/triggers/snapshot", SnapshotTriggerResult, json=body)

    def ack(self, flow: str, table: str, event_id: int) -> FlowCursor:
        """Acknowledge the flow's successful run over the events up to ``event_id`` (POST /triggers/snapshot/ack)."""
        return self._call("POST", "/triggers/snapshot/ack", FlowCursor,
                          json={"flow": flow, "table": table, "event_id": event_id})

    def health(self) -> dict[str, str]:
        response = self._http.get(self.base_url + "/health")
        response.raise_for_status()
        return response.json()
