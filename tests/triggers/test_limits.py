"""The limits that protect the service (body size, page sizes, request time, a rate per token) and the client's
retries: backoff, a deadline, ``Retry-After`` honoured."""

from __future__ import annotations

import time

import httpx
import pytest
from fastapi.testclient import TestClient

from bitlake.triggers import Client, TriggerConfig, TriggerServiceError, create_app
from bitlake.triggers import client as client_module
from bitlake.triggers.client import NO_RETRY, Retry
from bitlake.triggers.limits import TokenBuckets
from tests.triggers.samples import event


class Service:
    def __init__(self, tmp_path, **config):
        self.app = create_app(TriggerConfig(db_url=f"sqlite:///{tmp_path}/triggers.db", token_cache_seconds=0,
                                            freeze_gc=False, **config))
        self.store = self.app.state.store
        self.http = TestClient(self.app).__enter__()
        self.producer = self.store.create_token("producer", ["db.*"])
        self.consumer = self.store.create_token("consumer", ["db.*"])

    def request(self, method: str, path: str, token: str, **kw) -> httpx.Response:
        return self.http.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kw)

    def close(self) -> None:
        self.http.__exit__(None, None, None)


@pytest.fixture
def make_service(tmp_path):
    services = []

    def make(**config) -> Service:
        folder = tmp_path / str(len(services))
        folder.mkdir()
        services.append(Service(folder, **config))
        return services[-1]

    yield make
    for s in services:
        s.close()


def _events(n: int) -> list[dict]:
    return [event(table="db.orders", snapshot_id=f"s{i}", partition=[f"2024-01-{1 + i % 28:02d}"]) for i in range(n)]


def test_a_body_over_the_configured_size_is_a_413_and_writes_nothing(make_service):
    s = make_service(max_request_bytes=2048)
    r = s.request("POST", "/events", s.producer, json={"events": _events(40)})
    assert r.status_code == 413 and "2048 bytes" in r.json()["detail"]
    assert s.store.events("db.orders").events == []
    assert s.request("POST", "/events", s.producer, json={"events": _events(1)}).status_code == 200


def test_pages_over_the_largest_are_refused_and_defaults_lowered(make_service):
    s = make_service(max_page_size=10)
    assert s.request("POST", "/events", s.producer, json={"events": _events(25)}).status_code == 200
    over = s.request("GET", "/events", s.consumer, params={"table": "db.orders", "limit": 11})
    assert over.status_code == 422 and "max_page_size" in over.json()["detail"] and "10" in over.json()["detail"]
    page = s.request("GET", "/events", s.consumer, params={"table": "db.orders"}).json()  # default 100: lowered
    assert len(page["events"]) == 10 and page["next_cursor"]
    for path, body in (("/triggers/snapshot", {"flow": "f", "table": "db.orders"}),
                       ("/triggers/partition", {"table": "db.orders", "partition": None})):
        over = s.request("POST", path, s.consumer, json={**body, "limit": 11})
        assert over.status_code == 422 and "max_page_size" in over.json()["detail"], path
        assert s.request("POST", path, s.consumer, json={**body, "limit": 10}).status_code == 200
    fired = s.request("POST", "/triggers/snapshot", s.consumer, json={"flow": "f", "table": "db.orders"}).json()
    assert len(fired["events"]) == 10 and fired["has_more"]
    # The service's hard maximum holds whatever the configuration says.
    big = make_service()
    r = big.request("GET", "/events", big.consumer, params={"table": "db.orders", "limit": 1001})
    assert r.status_code == 422 and "limit" in str(r.json()["detail"])
    with pytest.raises(ValueError, match="max_page_size"):
        TriggerConfig(max_page_size=5000)


def test_a_token_over_its_rate_gets_429_with_retry_after_and_others_do_not(make_service):
    s = make_service(rate_limit_per_second=0.5, rate_limit_burst=3)
    answers = [s.request("GET", "/events", s.consumer, params={"table": "db.orders"}).status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429]
    r = s.request("POST", "/events", s.consumer, json={"events": _events(1)})  # whatever the route: counted first
    assert r.status_code == 429 and r.headers["Retry-After"] == "2" and "per second" in r.json()["detail"]
    assert s.request("POST", "/events", s.producer, json={"events": _events(1)}).status_code == 200
    for _ in range(5):
        assert s.http.get("/health").status_code == 200  # no token: not counted
    unlimited = make_service(rate_limit_per_second=0)
    assert {unlimited.request("GET", "/events", unlimited.consumer, params={"table": "db.orders"}).status_code
            for _ in range(30)} == {200}


def test_token_buckets_refill_at_the_rate_and_forget_idle_keys():
    b = TokenBuckets(rate=10, burst=2, max_entries=2)
    assert [b.take(b"a", now=0.0) for _ in range(2)] == [0, 0]
    assert b.take(b"a", now=0.0) == pytest.approx(0.1)
    assert b.take(b"a", now=0.05) == pytest.approx(0.05)  # refused: spends nothing
    assert b.take(b"a", now=0.1) == 0
    assert b.take(b"b", now=0.1) == 0
    assert b.take(b"c", now=1.0) == 0  # a and b refilled: forgotten to make room
    assert set(b._buckets) == {b"c"}


def test_a_request_over_its_time_limit_is_a_503_with_retry_after(make_service):
    s = make_service(request_timeout_seconds=0.3)
    slow = s.store.events_json

    def events_json(*args, **kwargs):
        time.sleep(1.0)
        return slow(*args, **kwargs)

    s.store.events_json = events_json
    started = time.monotonic()
    r = s.request("GET", "/events", s.consumer, params={"table": "db.orders"})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1" and "0.3 s" in r.json()["detail"]
    assert time.monotonic() - started < 0.9
    assert s.request("POST", "/events", s.producer, json={"events": _events(1)}).status_code == 200


# ------------------------------------------------------------------------------------------ the client's retries


class FakeTime:
    """The client module's clock: ``sleep`` records the wait and moves ``monotonic`` on at once."""

    def __init__(self):
        self.now, self.waits = 1000.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    fake = FakeTime()
    monkeypatch.setattr(client_module, "time", fake)
    return fake.waits


def _client(answers: list, *, retry: Retry | None = None) -> tuple[Client, list[httpx.Request]]:
    """A client whose transport answers from ``answers`` (a status with headers, or an exception to raise)."""
    sent: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        answer = answers.pop(0) if answers else (200, {})
        if isinstance(answer, Exception):
            raise answer
        status, headers = answer
        body = {"detail": "busy"} if status >= 400 else {"next_cursor": None, "events": []}
        return httpx.Response(status, json=body, headers=headers)

    http = httpx.Client(transport=httpx.MockTransport(handle))
    return Client("http://svc", "token", http_client=http, retry=retry or Retry(deadline=30)), sent


def test_the_client_retries_connection_errors_and_5xx_with_growing_waits(waits):
    refused = httpx.ConnectError("connection refused")
    client, sent = _client([refused, refused, (503, {}), (502, {}), (500, {}), (200, {})],
                                  retry=Retry(deadline=30, backoff=0.1, max_backoff=0.3))
    assert client.events("db.t").events == []
    assert len(sent) == 6 and client.attempts == 6
    caps = [0.1, 0.2, 0.3, 0.3, 0.3]
    assert all(cap / 2 <= w <= cap for w, cap in zip(waits, caps, strict=True)), waits


def test_the_client_honours_retry_after_on_429_and_503(waits):
    client, _ = _client([(429, {"Retry-After": "3"}), (503, {"Retry-After": "1"}), (200, {})])
    client.events("db.t")
    assert waits[0] == 3 and waits[1] >= 1


def test_the_client_gives_up_at_its_deadline_with_the_last_error(waits):
    client, sent = _client([(503, {"Retry-After": "10"})] * 10, retry=Retry(deadline=25))
    with pytest.raises(TriggerServiceError) as err:
        client.events("db.t")
    assert err.value.status_code == 503 and len(sent) == 3 and waits == [10, 10]
    client, sent = _client([httpx.ConnectError("refused")] * 3, retry=NO_RETRY)
    with pytest.raises(httpx.ConnectError):
        client.events("db.t")
    assert len(sent) == 1
    client, sent = _client([(400, {}), (200, {})])
    with pytest.raises(TriggerServiceError):  # a client error is not retried
        client.events("db.t")
    assert len(sent) == 1


def test_the_retry_deadline_follows_the_environment(monkeypatch):
    monkeypatch.setenv("BITLAKE_TRIGGERS_RETRY_SECONDS", "0")
    assert Client("http://svc", "t").retry.deadline == 0
    monkeypatch.delenv("BITLAKE_TRIGGERS_RETRY_SECONDS")
    assert Client("http://svc", "t").retry.deadline == 60
