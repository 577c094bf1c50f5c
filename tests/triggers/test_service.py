"""The HTTP service: every endpoint, authentication and scopes, malformed input, the Python client."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from bitlake.triggers import Client, TriggerConfig, TriggerServiceError, create_app
from bitlake.triggers.__main__ import main as admin
from bitlake.triggers.config import DEFAULT_DB_URL
from bitlake.triggers.event import EventIn
from bitlake.triggers.pgserver import free_port
from bitlake.triggers.service import FastRegistration
from bitlake.triggers.store import (
    REGISTRATION_LOCK,
    EventPage,
    PlannedRegistration,
    RegistrationResult,
    TriggerStore,
    make_engine,
)
from bitlake.triggers.storecalls import DirectInsert, GroupCommit, StoreCalls
from bitlake.triggers.tables import EVENTS
from bitlake.triggers.trigger import PartitionTriggerResult, SnapshotTriggerResult
from tests.triggers.samples import commits, event

ENDPOINTS = [("POST", "/events"), ("GET", "/events"), ("POST", "/triggers/partition"),
             ("POST", "/triggers/snapshot"), ("POST", "/triggers/snapshot/ack")]


class Service:
    """A TestClient on an app plus one token per role; ``count()`` reads the store directly."""

    def __init__(self, db_url: str, **config):
        # the test process is not frozen: it outlives the app and makes far more garbage than a service
        self.app = create_app(TriggerConfig(db_url=db_url, token_cache_seconds=0, freeze_gc=False, **config))
        self.store = self.app.state.store
        self.http = TestClient(self.app).__enter__()  # one event loop, the lifespan run: as a server runs it
        self.admin = self.store.create_token("admin", ["*"], name="admin")
        self.producer = self.store.create_token("producer", ["db.*"], name="producer")
        self.consumer = self.store.create_token("consumer", ["db.*"], name="consumer")
        self.outsider = self.store.create_token("consumer", ["other.*"], name="outsider")

    def request(self, method: str, path: str, token: str | None = None, **kw) -> httpx.Response:
        headers = kw.pop("headers", {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        response = self.http.request(method, path, headers=headers, **kw)
        assert response.status_code < 500, response.text
        return response

    def register(self, events: list[dict], token: str | None = None) -> httpx.Response:
        return self.request("POST", "/events", token or self.producer, json={"events": events})

    def count(self) -> int:
        """Events in the store, of any table."""
        with self.store.engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(EVENTS)).scalar_one()

    def close(self) -> None:
        self.http.__exit__(None, None, None)


@pytest.fixture
def service(db_url):
    s = Service(db_url)
    yield s
    s.close()


def sample_request(service: Service, method: str, path: str, table: str = "db.orders") -> dict:
    """A valid request of each endpoint, as keyword arguments of Service.request."""
    if path == "/events":
        return {"json": {"events": [event(table=table)]}} if method == "POST" else {"params": {"table": table}}
    if path == "/triggers/partition":
        return {"json": {"table": table, "partition": ["2024-01-01"]}}
    if path == "/triggers/snapshot":
        return {"json": {"flow": "f", "table": table}}
    return {"json": {"flow": "f", "table": table, "event_id": 1}}


def test_openapi_describes_every_endpoint_with_bearer_auth(service):
    spec = service.request("GET", "/openapi.json").json()
    assert {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops} >= set(ENDPOINTS)
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    event_schema = spec["components"]["schemas"]["Event"]["properties"]
    assert set(event_schema) == {"event_id", "event_ts", "table", "partition", "snapshot_id", "snapshot_ts",
                                 "prev_snapshot_id", "table_format", "operation_type", "tags"}
    assert event_schema["event_ts"]["format"] == "date-time"
    assert service.request("GET", "/health").json()["status"] == "ok"


def test_register_one_or_many_retry_and_read_back_in_the_documented_encoding(service):
    one = service.register([event()])
    assert one.status_code == 200
    (item,) = one.json()["events"]
    assert item["created"] is True
    e = item["event"]
    assert e["event_id"] == 1 and e["snapshot_ts"] == "2024-01-01T00:00:00.000000Z"
    assert len(e["event_ts"]) == len("2024-01-01T00:00:00.000000Z") and e["event_ts"].endswith("Z")
    assert {k: e[k] for k in ("table", "partition", "snapshot_id", "prev_snapshot_id", "table_format",
                              "operation_type", "tags")} == {k: v for k, v in event().items() if k != "snapshot_ts"}
    many = service.register([event(), *commits("db.orders", 3, first=2, partition=["2024-01-01"])])
    assert [i["created"] for i in many.json()["events"]] == [False, True, True, True]
    assert many.json()["events"][0]["event"] == e
    page = service.request("GET", "/events", service.consumer, params={"table": "db.orders"}).json()
    # ids increase, with gaps where a retry's insert was skipped
    assert [x["event_id"] for x in page["events"]] == [1] + [i["event"]["event_id"] for i in many.json()["events"][1:]]
    assert [x["snapshot_id"] for x in page["events"]] == ["1", "2", "3", "4"] and page["next_cursor"] is None
    # the admin may do both
    assert service.register([event(snapshot_id="9")], service.admin).status_code == 200
    assert service.request("GET", "/events", service.admin, params={"table": "db.orders"}).status_code == 200


def test_answers_with_events_are_their_response_models_json(service):
    """The events in these answers are JSON the database wrote, spliced into the rest: each answer must be
    exactly what its response model (the OpenAPI spec's schema) writes, no key more or less."""
    service.register(commits("db.a", 3, partition=["p1"], tags={"k": "v"}))
    answers = {
        "POST /events": (service.register([event(table="db.a", snapshot_id="9", partition=None)]),
                         RegistrationResult),
        "GET /events": (service.request("GET", "/events", service.consumer, params={"table": "db.a", "limit": 2}),
                        EventPage),
        "POST /triggers/partition": (service.request("POST", "/triggers/partition", service.consumer,
                                                     json={"table": "db.a", "partition": ["p1"]}),
                                     PartitionTriggerResult),
        "POST /triggers/snapshot": (service.request("POST", "/triggers/snapshot", service.consumer,
                                                    json={"flow": "f", "table": "db.a", "limit": 2}),
                                    SnapshotTriggerResult),
    }
    for name, (response, model) in answers.items():
        assert response.status_code == 200 and response.headers["content-type"] == "application/json", name
        written = response.json()
        assert written == model.model_validate_json(response.content).model_dump(mode="json"), name
        assert written["events"], name


def test_get_events_filters_and_pages(service):
    service.register(commits("db.a", 3, partition=["p1"], tags={"freq": "hourly", "k": "a=b"}) +
                     commits("db.a", 2, first=4, partition=None))

    def ids(**params):
        response = service.request("GET", "/events", service.consumer, params={"table": "db.a", **params})
        assert response.status_code == 200, response.text
        return [e["event_id"] for e in response.json()["events"]]

    assert ids(partition='["p1"]') == [1, 2, 3] and ids(partition="null") == [4, 5]
    assert ids(tag="freq=hourly") == [1, 2, 3] and ids(tag=["freq=hourly", "k=a=b"]) == [1, 2, 3]
    assert ids(tag="freq=daily") == []
    assert ids(min_event_id=2, max_event_id=4) == [2, 3, 4]
    assert ids(since="2000-01-01T00:00:00Z", until=str(int(time.time() * 1000) + 60_000)) == [1, 2, 3, 4, 5]
    assert ids(until="2000-01-01") == []
    first = service.request("GET", "/events", service.consumer, params={"table": "db.a", "limit": 2}).json()
    second = service.request("GET", "/events", service.consumer,
                             params={"table": "db.a", "limit": 2, "cursor": first["next_cursor"]}).json()
    assert [e["event_id"] for e in first["events"] + second["events"]] == [1, 2, 3, 4]


def test_partition_trigger_over_http(service):
    service.register([event(table="db.a", partition=["2024-03-01", "23"])])
    body = {"table": "db.a", "partition": ["{{ ds - 1h }}", "{{ hour - 1h }}"], "scheduled_time": "2024-03-02"}
    fired = service.request("POST", "/triggers/partition", service.consumer, json=body).json()
    assert fired["fired"] and fired["partition"] == ["2024-03-01", "23"]
    assert fired["scheduled_time"] == "2024-03-02T00:00:00.000000Z" and fired["next_scheduled_time"] is None
    assert [e["event_id"] for e in fired["events"]] == [1]
    not_yet = service.request("POST", "/triggers/partition", service.consumer,
                              json={**body, "at": "2024-03-02T00:00:00Z"}).json()
    assert not not_yet["fired"] and not_yet["events"] == [] and not_yet["evaluated_at"] == "2024-03-02T00:00:00.000000Z"
    scheduled = service.request("POST", "/triggers/partition", service.consumer, json={
        "table": "db.a", "partition": ["{{ ds }}", "{{ hour }}"], "start": "2024-01-01T00:00:00Z", "frequency": 1,
        "frequency_unit": "HOURS", "at": "2024-03-01T23:59:00Z", "tags": {}}).json()
    assert scheduled["partition"] == ["2024-03-01", "23"] and scheduled["scheduled_time"].startswith("2024-03-01T23:00")


def test_snapshot_trigger_fires_acks_and_does_not_fire_again(service):
    def evaluate():
        response = service.request("POST", "/triggers/snapshot", service.consumer, json={"flow": "f", "table": "db.a"})
        assert response.status_code == 200, response.text
        return response.json()

    assert not evaluate()["fired"]
    service.register(commits("db.a", 2))
    fired = evaluate()
    assert fired["fired"] and [e["snapshot_id"] for e in fired["events"]] == ["1", "2"]
    assert evaluate()["events"] == fired["events"]
    ack = {"flow": "f", "table": "db.a", "event_id": fired["events"][-1]["event_id"]}
    cursor = service.request("POST", "/triggers/snapshot/ack", service.consumer, json=ack)
    assert cursor.status_code == 200 and cursor.json()["last_event_id"] == 2
    assert service.request("POST", "/triggers/snapshot/ack", service.consumer, json=ack).json() == cursor.json()
    assert not evaluate()["fired"]
    service.register(commits("db.a", 1, first=3))
    assert [e["snapshot_id"] for e in evaluate()["events"]] == ["3"]
    back = service.request("POST", "/triggers/snapshot/ack", service.consumer, json={**ack, "event_id": 1})
    assert back.status_code == 409 and "never moves back" in back.json()["detail"]
    unknown = service.request("POST", "/triggers/snapshot/ack", service.consumer, json={**ack, "flow": "nope"})
    assert unknown.status_code == 404
    missing = service.request("POST", "/triggers/snapshot/ack", service.consumer, json={**ack, "event_id": 99})
    assert missing.status_code == 404
    other_tags = service.request("POST", "/triggers/snapshot", service.consumer,
                                 json={"flow": "f", "table": "db.a", "tags": {"x": "y"}})
    assert other_tags.status_code == 409


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_every_endpoint_needs_a_valid_token(service, method, path):
    request = sample_request(service, method, path)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {service.admin}"},
                    {"Authorization": "Bearer"}):
        response = service.request(method, path, headers=headers, **request)
        assert response.status_code == 401, (headers, response.text)
        assert response.headers["www-authenticate"] == "Bearer" and response.json()["detail"]
    revoked = service.store.create_token("admin", ["*"])
    service.store.revoke_token(service.store.authenticate(revoked).token_id)
    assert service.request(method, path, revoked, **request).status_code == 401
    assert service.count() == 0


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_roles_and_table_scopes_are_enforced(service, method, path):
    request = sample_request(service, method, path)
    wrong_role = service.consumer if (method, path) == ("POST", "/events") else service.producer
    response = service.request(method, path, wrong_role, **request)
    assert response.status_code == 403 and "token cannot" in response.json()["detail"]
    out_of_scope = service.request(method, path, service.outsider, **request)
    if (method, path) != ("POST", "/events"):
        assert out_of_scope.status_code == 403 and "does not cover table 'db.orders'" in out_of_scope.json()["detail"]
    outside = service.request(method, path, service.producer if method == "POST" and path == "/events"
                              else service.consumer, **sample_request(service, method, path, table="hr.salaries"))
    assert outside.status_code == 403 and "hr.salaries" in outside.json()["detail"]
    assert service.count() == 0


def test_a_batch_with_one_table_out_of_scope_writes_nothing(service):
    response = service.register([event(), event(table="hr.salaries")])
    assert response.status_code == 403
    assert service.count() == 0 and service.store.events("hr.salaries").events == []


def test_concurrent_registrations_commit_together_each_answered_as_alone(db_url, monkeypatch):
    """Requests that arrive while the store is busy go to it as one group; a conflicting one gets its 409 alone.
    On PostgreSQL the store runs in the event loop (asyncio connections), on SQLite in the thread pool."""
    app = create_app(TriggerConfig(db_url=db_url))
    store, producer = app.state.store, app.state.store.create_token("producer", ["db.*"])
    store.register([event(snapshot_id="old")])
    registrations, groups = app.state.registrations, []
    store_call = registrations.calls

    register = store_call.register_together_json

    async def slow_first(requests):
        groups.append(len(requests))
        if len(groups) == 1:
            await asyncio.sleep(0.3)  # the others arrive meanwhile
        return await register(requests)

    monkeypatch.setattr(store_call, "register_together_json", slow_first)
    bodies = [{"events": [event(snapshot_id=f"n{i}")]} for i in range(12)]
    bodies[5] = {"events": [event(snapshot_id="n5"), event(snapshot_id="old", operation_type="DELETE")]}

    async def send_all():
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {producer}"}
        async with app.router.lifespan_context(app), \
                httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as http:
            assert store_call.in_loop() == (store.dialect == "postgresql")
            first = asyncio.ensure_future(http.post("/events", json=bodies[0]))
            await asyncio.sleep(0.1)
            rest = await asyncio.gather(*(http.post("/events", json=b) for b in bodies[1:]))
            return [await first, *rest]

    responses = asyncio.run(send_all())
    assert groups[0] == 1 and max(groups[1:]) > 1, groups
    assert [r.status_code for r in responses] == [200] * 5 + [409] + [200] * 6
    assert "nothing of this request" in responses[5].json()["detail"]
    created = [RegistrationResult.model_validate_json(r.content).events[0] for i, r in enumerate(responses) if i != 5]
    assert all(r.created for r in created) and len({r.event.event_id for r in created}) == 11
    with TriggerStore(db_url, migrate=False) as reopened:  # the lifespan closed the app's store
        assert len(reopened.events("db.orders").events) == 12  # "old" and the eleven; not the conflicting one


def _bad_bodies() -> list[tuple[str, object]]:
    many = [event(snapshot_id=str(i)) for i in range(1001)]
    return [
        ("oversized batch", {"events": many}),
        ("empty batch", {"events": []}),
        ("no events key", event()),
        ("a list, not an object", [event()]),
        ("too long partition", {"events": [event(snapshot_id="a"), event(partition=["x" * 300] * 6)]}),
        ("too deep partition", {"events": [event(partition=[""] * 600)]}),
        ("snapshot_ts before year 1 in UTC", {"events": [event(snapshot_ts="0001-01-01T00:00:00+01:00")]}),
        ("snapshot_ts after year 9999 in UTC", {"events": [event(snapshot_ts="9999-12-31T23:30:00-01:00")]}),
        ("partition not a list", {"events": [event(partition="2024-01-01")]}),
        ("partition of numbers", {"events": [event(partition=[20240101])]}),
        ("table not a string", {"events": [event(table=["db.orders"])]}),
        ("snapshot id a number", {"events": [event(snapshot_id=7)]}),
        ("unknown format", {"events": [event(table_format="parquet")]}),
        ("unknown operation", {"events": [event(operation_type="MERGE")]}),
        ("tags not strings", {"events": [event(tags={"a": 1})]}),
        ("too many tags", {"events": [event(tags={f"k{i}": "v" for i in range(33)})]}),
        ("bad tag key", {"events": [event(tags={"a b": "v"})]}),
        ("long table", {"events": [event(table="db." + "x" * 600)]}),
        ("NUL in table", {"events": [event(table="db.a\x00")]}),
        ("bad snapshot_ts", {"events": [event(snapshot_ts="soon")]}),
        ("event_id given", {"events": [event(event_id=5)]}),
        ("unknown field", {"events": [event(colour="red")]}),
        ("missing table", {"events": [{k: v for k, v in event().items() if k != "table"}]}),
    ]


@pytest.mark.parametrize(("reason", "body"), _bad_bodies(), ids=[r for r, _ in _bad_bodies()])
def test_malformed_registrations_get_422_and_write_nothing(service, reason, body):
    response = service.request("POST", "/events", service.producer, json=body)
    assert response.status_code == 422, (reason, response.text)
    assert response.json()["detail"]
    assert service.count() == 0


def test_unparseable_too_large_and_conflicting_bodies_write_nothing(db_url):
    service = Service(db_url, max_request_bytes=64 * 1024)
    try:
        for raw in (b"{not json", b"", b"\xff\xfe", b"[" * 100_000, b"[" * 30_000,
                    b'{"events": [{"table": "\\ud800"}]}'):
            response = service.request("POST", "/events", service.producer, content=raw,
                                       headers={"Content-Type": "application/json"})
            assert response.status_code in (400, 413, 422), response.text
        big = {"events": [event(snapshot_id=str(i), tags={"pad": "x" * 4000}) for i in range(20)]}
        assert service.request("POST", "/events", service.producer, json=big).status_code == 413

        def chunks():  # no Content-Length: the limit holds while streaming too
            yield b'{"events": ['
            for i in range(40):
                yield json.dumps(event(snapshot_id=str(i), tags={"pad": "x" * 4000})).encode() + b","
            yield json.dumps(event()).encode() + b"]}"

        response = service.request("POST", "/events", service.producer, content=chunks(),
                                   headers={"Content-Type": "application/json"})
        assert response.status_code == 413
        assert service.count() == 0
        service.register([event()])
        conflict = service.register([event(snapshot_id="2"), event(operation_type="DELETE")])
        assert conflict.status_code == 409 and "operation_type" in conflict.json()["detail"]
        assert service.count() == 1
    finally:
        service.close()


@pytest.mark.parametrize(("path", "request_kw", "status"), [
    ("/events", {"params": {}}, 422),
    ("/events", {"params": {"table": "db.a", "partition": "[1]"}}, 422),
    ("/events", {"params": {"table": "db.a", "partition": "not json"}}, 422),
    ("/events", {"params": {"table": "db.a", "partition": json.dumps(["x" * 300] * 6)}}, 422),
    ("/events", {"params": {"table": "db.a", "since": "0001-01-01T00:00:00+01:00"}}, 422),
    ("/events", {"params": {"table": "db.a", "cursor": "eyJhZnRlciI6IDkyMjMzNzIwMzY4NTQ3NzU4MDh9"}}, 400),  # 2**63
    ("/events", {"params": {"table": "db.a", "tag": "novalue"}}, 422),
    ("/events", {"params": {"table": "db.a", "tag": "bad key=v"}}, 422),
    ("/events", {"params": {"table": "db.a", "limit": 0}}, 422),
    ("/events", {"params": {"table": "db.a", "limit": 1001}}, 422),
    ("/events", {"params": {"table": "db.a", "since": "whenever"}}, 422),
    ("/events", {"params": {"table": "db.a", "min_event_id": "one"}}, 422),
    ("/events", {"params": {"table": "db.a", "cursor": "forged"}}, 400),
    ("/triggers/partition", {"json": {"table": "db.a"}}, 422),
    ("/triggers/partition", {"json": {"table": "db.a", "partition": ["{{ dss }}"]}}, 422),
    ("/triggers/partition", {"json": {"table": "db.a", "partition": ["x"] * 600}}, 422),
    ("/triggers/partition", {"json": {"table": "db.a", "partition": ["x"], "at": "0001-01-01T00:00:00+01:00"}}, 422),
    ("/triggers/partition", {"json": {"table": "db.a", "partition": ["{{ ds - 999999d }}"]}}, 422),
    ("/triggers/partition", {"json": {"table": "db.a", "partition": ["{{ ds + 1d }}"], "scheduled_time": "9999-12-31"}},
     422),
    ("/triggers/partition", {"json": {"table": "db.a", "partition": ["x"], "start": "2024-01-01", "frequency": 1,
                                      "frequency_unit": "DAYS", "at": "9999-12-31T12:00:00"}}, 422),
    ("/triggers/partition", {"json": {"table": "db.a", "partition": ["x"], "start": "2024-01-01",
                                      "frequency": 1_000_000, "frequency_unit": "DAYS", "at": "9000-01-01"}}, 422),
    ("/triggers/partition", {"json": {"table": "db.a", "partition": None, "start": "2024-01-01"}}, 422),
    ("/triggers/partition", {"json": {"table": "db.a", "partition": None, "frequency": "daily"}}, 422),
    ("/triggers/partition", {"json": {"table": "db.a", "partition": None, "timezone": "Nowhere/City"}}, 422),
    ("/triggers/partition", {"json": {"table": "db.a", "partition": None, "limit": 5000}}, 422),
    ("/triggers/snapshot", {"json": {"table": "db.a"}}, 422),
    ("/triggers/snapshot", {"json": {"flow": "", "table": "db.a"}}, 422),
    ("/triggers/snapshot", {"json": {"flow": "f", "table": "db.a", "tags": {"k": ["v"]}}}, 422),
    ("/triggers/snapshot", {"json": {"flow": "f", "table": "db.a", "start": "0001-01-01T00:00:00+05:00"}}, 422),
    ("/triggers/snapshot/ack", {"json": {"flow": "f", "table": "db.a"}}, 422),
    ("/triggers/snapshot/ack", {"json": {"flow": "f", "table": "db.a", "event_id": -1}}, 422),
    ("/triggers/snapshot/ack", {"json": {"flow": "f", "table": "db.a", "event_id": 2**64}}, 422),
    ("/triggers/snapshot/ack", {"json": {"flow": "f", "table": "db.a", "event_id": "1"}}, 422),
])
def test_malformed_queries_and_trigger_requests_get_4xx_with_a_reason(service, path, request_kw, status):
    method = "GET" if "params" in request_kw else "POST"
    response = service.request(method, path, service.consumer, **request_kw)
    assert response.status_code == status, response.text
    assert response.json()["detail"]


def test_times_out_of_range_are_refused_naming_the_field_or_the_template(service):
    at = service.request("POST", "/triggers/partition", service.consumer,
                         json={"table": "db.a", "partition": ["x"], "at": "0001-01-01T00:00:00+01:00"})
    [error] = at.json()["detail"]
    assert error["loc"] == ["body", "at"] and "out of range in UTC" in error["msg"]
    since = service.request("GET", "/events", service.consumer,
                            params={"table": "db.a", "since": "0001-01-01T00:00:00+01:00"})
    assert since.json()["detail"][0]["loc"] == ["query", "since"]
    template = service.request("POST", "/triggers/partition", service.consumer,
                               json={"table": "db.a", "partition": ["{{ ds - 999999d }}"]})
    assert "'{{ ds - 999999d }}'" in template.json()["detail"] and "range of dates" in template.json()["detail"]
    assert service.count() == 0


def test_client_covers_every_endpoint(service):
    with Client("http://testserver", service.producer, http_client=service.http) as producer, \
            Client("http://testserver", service.consumer, http_client=service.http) as consumer:
        assert producer.health()["status"] == "ok"
        assert producer.register(event())[0].created
        registered = producer.register(commits("db.orders", 3, first=2, partition=["2024-01-01"]))
        assert [r.event.event_id for r in registered] == [2, 3, 4]
        page = consumer.events("db.orders", partition=["2024-01-01"], limit=3)
        assert [e.event_id for e in page.events] == [1, 2, 3] and page.next_cursor
        assert [e.event_id for e in consumer.iter_events("db.orders", limit=3)] == [1, 2, 3, 4]
        assert consumer.events("db.orders", partition=None).events == []
        assert [e.event_id for e in consumer.events("db.orders", min_event_id=2, max_event_id=3).events] == [2, 3]
        assert consumer.events("db.orders", since="2000-01-01", until=10**13).events
        fired = consumer.partition_trigger("db.orders", ["{{ ds - 1d }}"], scheduled_time="2024-01-02")
        assert fired.fired and len(fired.events) == 4
        scheduled = consumer.partition_trigger("db.orders", ["{{ ds }}"], start="2024-01-01", frequency=1,
                                               frequency_unit="DAYS", at="2024-01-01T12:00:00Z", limit=1)
        assert scheduled.partition == ["2024-01-01"] and not scheduled.fired  # registered after "at"
        snap = consumer.snapshot_trigger("flow", "db.orders", limit=2)
        assert [e.event_id for e in snap.events] == [1, 2] and snap.has_more
        assert consumer.ack("flow", "db.orders", 2).last_event_id == 2
        assert [e.event_id for e in consumer.snapshot_trigger("flow", "db.orders").events] == [3, 4]
        with pytest.raises(TriggerServiceError) as err:
            consumer.register(event(snapshot_id="x"))
        assert err.value.status_code == 403
        with pytest.raises(TriggerServiceError) as err:
            consumer.ack("flow", "db.orders", 1)
        assert err.value.status_code == 409 and "never moves back" in str(err.value)


def test_client_splits_more_than_1000_events_into_requests(service):
    with Client("http://testserver", service.producer, http_client=service.http) as producer:
        result = producer.register(commits("db.a", 1005))
    assert len(result) == 1005 and all(r.created for r in result)


def test_client_over_a_real_server(tmp_path):
    """The client's own httpx transport against uvicorn on loopback."""
    app = create_app({"db_url": f"sqlite:///{tmp_path}/t.db"})
    token = app.state.store.create_token("admin")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)
        with Client(f"http://127.0.0.1:{port}", token, timeout=10) as client:
            client.register(commits("db.a", 2))
            fired = client.snapshot_trigger("f", "db.a")
            assert fired.fired
            client.ack("f", "db.a", fired.events[-1].event_id)
            assert not client.snapshot_trigger("f", "db.a").fired
        with Client(f"http://127.0.0.1:{port}", "wrong") as client, pytest.raises(TriggerServiceError) as err:
            client.events("db.a")
        assert err.value.status_code == 401
    finally:
        server.should_exit = True
        thread.join(10)


_TEXT = st.text(max_size=20) | st.sampled_from(["\ud800", "a\x00b", "\x1f", "é" * 300, "{{ ds }}"])
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TEXT,
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
                     max_leaves=10)
_FIELD_VALUES = {
    "table": st.one_of(st.just("db.a"), _TEXT, _JSON),
    "partition": st.one_of(st.none(), st.lists(st.one_of(st.none(), st.text(max_size=10)), max_size=10), _JSON),
    "snapshot_id": st.one_of(st.none(), st.text(max_size=10), _JSON),
    "snapshot_ts": st.one_of(st.none(), st.integers(), st.text(max_size=30), _JSON),
    "table_format": st.one_of(st.sampled_from(["BITLAKE", "HIVE", "ICEBERG", "DELTA"]), _JSON),
    "operation_type": st.one_of(st.sampled_from(["APPEND", "DELETE", "UPDATE"]), _JSON),
    "tags": st.one_of(st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=4), _JSON),
}


@pytest.fixture(scope="module")
def fuzz_service(tmp_path_factory):
    s = Service(f"sqlite:///{tmp_path_factory.mktemp('fuzz')}/t.db")
    yield s
    s.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries({}, optional=_FIELD_VALUES), min_size=1, max_size=3))
def test_arbitrary_registrations_never_get_a_5xx(fuzz_service, events):
    before = fuzz_service.count()
    body = json.dumps({"events": events}).encode()  # ASCII escapes carry lone surrogates too
    response = fuzz_service.request("POST", "/events", fuzz_service.admin, content=body,
                                    headers={"Content-Type": "application/json"})
    assert response.status_code in (200, 409, 422)
    if response.status_code != 200:
        assert fuzz_service.count() == before


@pytest.fixture(scope="module")
def fast_and_routed(tmp_path_factory):
    """Two services on databases of their own: one answers valid registrations on its fast path, one only
    through the FastAPI route."""
    folder = tmp_path_factory.mktemp("fast")
    fast, routed = Service(f"sqlite:///{folder}/fast.db"), Service(f"sqlite:///{folder}/routed.db",
                                                                   fast_registration=False)
    yield fast, routed
    fast.close()
    routed.close()


def _without_registration_times(answer: object) -> object:
    if isinstance(answer, dict) and isinstance(answer.get("events"), list):
        return [{**r, "event": {k: v for k, v in r["event"].items() if k != "event_ts"}} for r in answer["events"]]
    return answer


_VALID = [event(table="db.a", snapshot_id=str(i)) for i in range(4)] + [
    event(table="db.a", snapshot_id="1", operation_type="DELETE"), event(table="other.a")]  # a conflict, a scope


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.lists(st.fixed_dictionaries({}, optional=_FIELD_VALUES), min_size=1, max_size=3),
                 st.lists(st.sampled_from(_VALID), min_size=1, max_size=3)),
       st.lists(st.sampled_from(["producer", "admin", "consumer", "outsider", "garbage"]), max_size=2),
       st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", None]))
def test_the_fast_path_answers_every_registration_as_the_route_does(fast_and_routed, events, roles, content_type):
    """Arbitrary bodies, no token, one, or two Authorization headers (the first counts), several content types."""
    answers = []
    for service in fast_and_routed:
        headers = [("Authorization", f"Bearer {getattr(service, role, 'blt_garbage')}") for role in roles]
        if content_type is not None:
            headers.append(("Content-Type", content_type))
        response = service.request("POST", "/events", content=json.dumps({"events": events}).encode(),
                                   headers=headers)
        answers.append((response.status_code, _without_registration_times(response.json())))
    assert answers[0] == answers[1]


def test_the_fast_path_answers_valid_registrations_and_conflicts(service, monkeypatch):
    answered = []
    answer = FastRegistration._answer

    async def spy(self, headers, body):
        response = await answer(self, headers, body)
        answered.append(None if response is None else response.status_code)
        return response

    monkeypatch.setattr(FastRegistration, "_answer", spy)
    assert service.register([event()]).status_code == 200
    assert service.register([event(operation_type="DELETE")]).status_code == 409
    assert service.register([event(table="other.t")]).status_code == 403  # out of scope: the route refuses
    assert service.register([{"table": ""}]).status_code == 422
    assert answered == [200, 409, None, None]


def test_create_app_configuration_defaults_file_and_environment(tmp_path, monkeypatch):
    for name in ("BITLAKE_TRIGGERS_CONFIG", "BITLAKE_TRIGGERS_DB_URL", "BITLAKE_TRIGGERS_TOKEN_CACHE_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert TriggerConfig.load().db_url == DEFAULT_DB_URL
    app = create_app()
    app.state.store.close()
    assert (tmp_path / "bitlake-triggers.db").exists()  # the embedded default
    config_file = tmp_path / "triggers.toml"
    config_file.write_text(f'db_url = "sqlite:///{tmp_path}/from-file.db"\ntoken_cache_seconds = 1.5\n')
    monkeypatch.setenv("BITLAKE_TRIGGERS_CONFIG", str(config_file))
    assert TriggerConfig.load().db_url.endswith("from-file.db") and TriggerConfig.load().token_cache_seconds == 1.5
    monkeypatch.setenv("BITLAKE_TRIGGERS_DB_URL", f"sqlite:///{tmp_path}/from-env.db")
    config = TriggerConfig.load()
    assert config.db_url.endswith("from-env.db") and config.token_cache_seconds == 1.5  # env wins, per field
    create_app(str(config_file)).state.store.close()
    assert (tmp_path / "from-env.db").exists()
    config_file.write_text('db_url = "sqlite:///x.db"\ncolour = "red"\n')
    with pytest.raises(ValueError, match="colour"):
        create_app(str(config_file))
    with pytest.raises(ValueError, match="SQLite or PostgreSQL"):
        create_app({"db_url": "mysql://localhost/x"})


@pytest.mark.parametrize("freeze", [True, False])
def test_the_lifespan_freezes_start_up_objects_only_when_configured(tmp_path, freeze):
    app = create_app(TriggerConfig(db_url=f"sqlite:///{tmp_path}/t.db", freeze_gc=freeze))
    gc.unfreeze()  # whatever an earlier app of this test process froze
    with TestClient(app) as http:
        assert http.get("/health").status_code == 200
        frozen = gc.get_freeze_count()
    gc.unfreeze()
    assert (frozen > 0) == freeze


def test_admin_command_creates_lists_and_revokes_tokens(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/t.db"
    assert admin(["--db-url", url, "token", "create", "--role", "producer", "--table", "db.*", "--name", "ingest"]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("blt_")
    service = Service(url)
    try:
        assert service.register([event()], token).status_code == 200
        assert admin(["--db-url", url, "token", "list"]) == 0
        listing = capsys.readouterr().out
        assert "producer\tactive\tdb.*\tingest" in listing and token not in listing
        assert admin(["--db-url", url, "token", "revoke", "1"]) == 0
        assert service.register([event()], token).status_code == 401
        assert admin(["--db-url", url, "token", "revoke", "1"]) == 1
    finally:
        service.close()


@pytest.mark.postgres
@pytest.mark.parametrize("fast", [True, False])
def test_an_unreachable_database_is_a_503_on_both_registration_paths(postgres, fast):
    """The token lookup and the registration both fail with the database gone: 503 with Retry-After, not 500."""
    name = f"down_{int(fast)}"
    service = Service(postgres.create_database(name), fast_registration=fast)
    try:
        assert service.register([event()]).status_code == 200
        with postgres.connect() as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        response = service.http.post("/events", json={"events": [event(snapshot_id="2")]},
                                     headers={"Authorization": f"Bearer {service.producer}"})
        assert response.status_code == 503 and response.headers["Retry-After"] == "1"
        assert "the event store is unavailable" in response.json()["detail"]
    finally:
        service.close()


@pytest.fixture
def direct_outcomes(monkeypatch) -> list[bool]:
    """Whether each direct insert answered (True) or handed its group to the store (False), in call order."""
    outcomes: list[bool] = []
    insert = DirectInsert.insert

    async def spy(self, plan):
        answers = await insert(self, plan)
        outcomes.append(answers is not None)
        return answers

    monkeypatch.setattr(DirectInsert, "insert", spy)
    return outcomes


@pytest.mark.postgres
def test_new_events_go_to_the_direct_insert_and_everything_else_to_the_store(postgres, direct_outcomes):
    """New events are inserted on the direct connection; a retry, and a registration whose connection the
    server killed, go to the store and are answered as ever; the next registration reconnects."""
    name = "direct"
    service = Service(postgres.create_database(name))
    try:
        def registered(snapshot_id: str) -> bool:
            response = service.register([event(snapshot_id=snapshot_id)])
            assert response.status_code == 200, response.text
            return RegistrationResult.model_validate_json(response.content).events[0].created

        assert registered("1") and direct_outcomes == [True]
        with postgres.connect(name) as conn:  # every connection of the service, the direct one included
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
        assert registered("2") and direct_outcomes == [True, False]
        assert registered("3") and direct_outcomes == [True, False, True]
        assert not registered("1") and direct_outcomes == [True, False, True, False]  # a retry: the unique key
        assert [e.snapshot_id for e in service.store.events("db.orders").events] == ["1", "2", "3"]
    finally:
        service.close()


@pytest.mark.postgres
def test_the_direct_insert_closes_a_busy_connection_when_it_returns_after_close(postgres):
    """The service stopping while a group is inserting: the insert is answered, and its connection closed."""
    name = "direct_close"
    url = postgres.create_database(name)

    async def scenario():
        with TriggerStore(url) as store, postgres.connect(name) as blocker:
            direct = DirectInsert(store, keep=2)
            blocker.execute("SELECT pg_advisory_lock(%s)", [REGISTRATION_LOCK])  # the insert waits for it
            plan = PlannedRegistration.of([[event(snapshot_id="1")]])
            inserting = asyncio.ensure_future(direct.insert(plan))
            await asyncio.sleep(0.3)
            await direct.close()
            blocker.execute("SELECT pg_advisory_unlock(%s)", [REGISTRATION_LOCK])
            answers = await inserting
            # A closed connection's backend exits a moment after the client closes it (later on a busy machine).
            for _ in range(50):
                others = blocker.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                                         "AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
                                         [name]).fetchone()[0]
                if others <= 1:
                    break
                await asyncio.sleep(0.1)
            return answers, direct._idle, others, store.events("db.orders").events

    answers, idle, others, stored = asyncio.run(scenario())
    assert RegistrationResult.model_validate_json(answers[0]).events[0].created
    assert idle == [] and [e.snapshot_id for e in stored] == ["1"]
    assert others <= 1  # the store's own pooled connection at most; the direct one is closed


def test_the_direct_insert_pauses_its_connection_attempts_while_the_database_is_unreachable(monkeypatch):
    store = TriggerStore(make_engine(f"postgresql://bitlake@127.0.0.1:{free_port()}/nothing"), migrate=False)
    direct = DirectInsert(store, keep=2)
    attempts = []
    connect = direct._connect

    async def counted():
        attempts.append(1)
        return await connect()

    monkeypatch.setattr(direct, "_connect", counted)
    plan = PlannedRegistration.of([[event()]])

    async def twice():
        return [await direct.insert(plan), await direct.insert(plan)]

    assert asyncio.run(twice()) == [None, None] and len(attempts) == 1
    monkeypatch.setattr(DirectInsert, "RECONNECT_PAUSE", 0.0)
    direct._connect_after = 0.0
    assert asyncio.run(twice()) == [None, None] and len(attempts) == 3
    store.close()


@pytest.mark.postgres
def test_services_racing_to_register_the_same_events_register_each_once(postgres, direct_outcomes):
    """Four service processes' worth of store calls, each with its direct insert and one producer, all sending
    the same batches at once: the first insert of each batch wins, the others fail on the unique index and
    go to the store; every event is created once, and every answer carries its one id."""
    url = postgres.create_database("direct_race")
    events = [EventIn.model_validate(e) for e in commits("db.a", 40)]

    async def scenario():
        with TriggerStore(url) as store:
            calls = [StoreCalls(store, TriggerConfig(db_url=url)) for _ in range(4)]
            for c in calls:
                await c.start()
            try:
                async def producer(group: GroupCommit) -> list[bytes]:
                    return [await group.register(events[i:i + 8]) for i in range(0, 40, 8)]

                answers = await asyncio.gather(*(producer(GroupCommit(c)) for c in calls))
            finally:
                for c in calls:
                    await c.stop()
            return answers, store.events("db.a", limit=1000).events

    answers, stored = asyncio.run(scenario())
    assert True in direct_outcomes and False in direct_outcomes  # both paths ran
    results = [r for producer in answers for answer in producer
               for r in RegistrationResult.model_validate_json(answer).events]
    assert len(results) == 160 and sum(r.created for r in results) == 40
    ids = {r.event.snapshot_id: r.event.event_id for r in results if r.created}
    assert all(ids[r.event.snapshot_id] == r.event.event_id for r in results)
    assert [e.snapshot_id for e in stored] == [str(v) for v in range(1, 41)] == sorted(ids, key=int)
