"""A Python client of the trigger service (httpx): every endpoint, with the service's own models.

>>> client = Client("http://127.0.0.1:8400", token)            # doctest: +SKIP
>>> client.register(commit.events)                              # doctest: +SKIP
>>> fired = client.snapshot_trigger("daily_agg", "db.orders")   # doctest: +SKIP
>>> if fired.fired:                                             # doctest: +SKIP
...     run(fired.events)
...     client.ack("daily_agg", "db.orders", fired.events[-1].event_id)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import email.utils
import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import httpx
from pydantic import BaseModel

from bitlake.triggers.errors import TriggerServiceError
from bitlake.triggers.event import MAX_EVENTS_PER_REQUEST, Event, EventIn, format_timestamp, parse_timestamp
from bitlake.triggers.models import ANY_PARTITION, EventPage, Registration, RegistrationResult
from bitlake.triggers.trigger import FlowCursor, PartitionTriggerResult, SnapshotTriggerResult

log = logging.getLogger(__name__)
Timestampish = dt.datetime | str | int
# Answers worth another attempt: throttled (429), the service or its database unavailable or too slow (5xx).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
RETRY_SECONDS_ENV = "BITLAKE_TRIGGERS_RETRY_SECONDS"


@dataclasses.dataclass(frozen=True)
class Retry:
    """How a :class:`Client` retries a request that failed on the way (a connection refused or cut, a
    timeout) or was answered with a status of :data:`RETRY_STATUSES`.

    Every request of the service is safe to repeat (registration is idempotent, triggers read, an ack to the
    same event is a no-op), so every one is retried: after ``backoff`` seconds, doubling up to
    ``max_backoff``, each wait drawn at random between half and all of it (so that clients a restart
    disconnected together do not come back together), or after the ``Retry-After`` the service sent when
    that is longer. Once the next attempt would start more than ``deadline`` seconds after the first, the
    last error is raised: :class:`TriggerServiceError` for a status, ``httpx.TransportError`` otherwise.

    ``Retry(deadline=0)`` makes one attempt only. A client built without ``retry`` takes the deadline from
    ``$BITLAKE_TRIGGERS_RETRY_SECONDS`` when it is set (so the command line's ``bitlake events`` follows it too).
    """

    deadline: float = 60.0
    backoff: float = 0.1
    max_backoff: float = 5.0

    def wait(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (``attempt`` counts from 1)."""
        step = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
        step = random.uniform(step / 2, step)
        return max(step, retry_after) if retry_after is not None else step

    @classmethod
    def from_env(cls) -> Retry:
        value = os.environ.get(RETRY_SECONDS_ENV)
        return cls() if value is None else cls(deadline=float(value))


NO_RETRY = Retry(deadline=0)


def retry_after(response: httpx.Response) -> float | None:
    """The seconds of the answer's ``Retry-After`` (a number or an HTTP date), None without a valid one."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


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
        timeout: seconds per attempt.
        http_client: an ``httpx.Client`` to send through instead of a new one (e.g. FastAPI's TestClient).
        retry: how failed attempts are retried (:class:`Retry`: for up to 60 s by default; ``NO_RETRY``: never).
            :meth:`health` never retries: it is a probe.
        on_retry: called before each wait with what failed (the answer's status, or the ``httpx`` error) and
            the seconds it will wait; each retry is also logged (``bitlake.triggers.client``, INFO).
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0, http_client: httpx.Client | None = None,
                 retry: Retry | None = None,
                 on_retry: Callable[[int | httpx.TransportError, float], Any] | None = None):
        self.retry = retry or Retry.from_env()
        self.on_retry = on_retry
        self.attempts = 0  # every attempt this client made, retries included (the soak test counts them)
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
        return parse_response(self._send(method, path, headers=self._headers, **kwargs), model)

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The answer to the request, retried as :attr:`retry` says; raises the last failure when it gives up."""
        give_up = time.monotonic() + self.retry.deadline
        attempt = 0
        while True:
            attempt += 1
            self.attempts += 1
            wait_at_least = None
            try:
                response = self._http.request(method, self.base_url + path, **kwargs)
                if response.status_code not in RETRY_STATUSES:
                    return response
                wait_at_least = retry_after(response)
                failure: httpx.Response | httpx.TransportError = response
            except httpx.TransportError as e:
                failure = e
            wait = self.retry.wait(attempt, wait_at_least)
            if time.monotonic() + wait > give_up:
                if isinstance(failure, httpx.Response):
                    return failure
                raise failure
            what = failure.status_code if isinstance(failure, httpx.Response) else failure
            log.info("%s %s: %s; attempt %d in %.2f s", method, path, what, attempt + 1, wait)
            if self.on_retry is not None:
                self.on_retry(what, wait)
            time.sleep(wait)

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
