"""The trigger service: the store behind an HTTP API (FastAPI), with bearer tokens scoped to tables.

``create_app()`` returns the ASGI application, so any ASGI server runs it::

    uvicorn --factory bitlake.triggers:create_app --host 127.0.0.1 --port 8400

Every request a client gets wrong is answered with a 4xx and a ``detail`` that says why: 401 without a
valid token, 403 for a role or a table the token does not cover, 413 for a body over the size limit, 422
for input that does not validate, 400 for a cursor the service did not hand out, 404 and 409 from the
store. A batch is registered in one transaction, so a refused request writes nothing.
"""


import gc
import os
import time
from collections.abc import Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from sqlalchemy.exc import OperationalError

from bitlake.triggers.config import TriggerConfig
from bitlake.triggers.errors import TriggerError
from bitlake.triggers.event import (
    MAX_EVENTS_PER_REQUEST,
    MAX_PARTITION_JSON_BYTES,
    EventIn,
    PartitionValues,
    TableName,
    Tags,
    Timestamp,
)
from bitlake.triggers.store import (
    ANY_PARTITION,
    EventPage,
    RegistrationResult,
    Role,
    TriggerStore,
)
from bitlake.triggers.storecalls import GroupCommit, StoreCalls
from bitlake.triggers.tokens import TokenInfo, hash_token
from bitlake.triggers.trigger import (
    FlowCursor,
    PartitionTrigger,
    PartitionTriggerResult,
    SnapshotAck,
    SnapshotTrigger,
    SnapshotTriggerResult,
)

API_VERSION = "1"
MAX_PAGE = 1000
_PARTITION = TypeAdapter(PartitionValues | None)
_TAGS = TypeAdapter(Tags)


def _printable(value: Any) -> Any:
    """``value`` with every string made encodable: a lone surrogate in the input must not turn a 422 into a 500."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, list | tuple):
        return [_printable(v) for v in value]
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    return value


def _json(body: BaseModel | bytes) -> Response:
    """``body`` as the response, JSON serialised once: by pydantic, or already by the store.

    Returning a model would make FastAPI validate it again against the response model and then serialise
    it; the store's ``*_json`` methods go further and have the database write the JSON of the events they
    return, so no Python object is built per event. The routes keep ``response_model`` for the OpenAPI spec.
    """
    return Response(body if isinstance(body, bytes) else body.model_dump_json(), media_type="application/json")


def _reasons(error: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in error.errors())


class EventBatch(BaseModel):
    """Events to register in one transaction."""

    model_config = ConfigDict(extra="forbid")

    events: list[EventIn] = Field(min_length=1, max_length=MAX_EVENTS_PER_REQUEST)


async def _read_messages(receive, max_bytes: int | None = None) -> list[dict] | None:
    """Every message of the request's body, or None once the body passes ``max_bytes``."""
    messages, size = [], 0
    while True:
        message = await receive()
        messages.append(message)
        size += len(message.get("body", b""))
        if max_bytes is not None and size > max_bytes:
            return None
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


def _replay(messages: list[dict], receive):
    """A ``receive`` that hands out ``messages`` again, then the real ones (a disconnect, say)."""
    async def replay():
        return messages.pop(0) if messages else await receive()

    return replay


class BodyLimit:
    """Refuses (413) a request body over ``max_bytes`` before anything parses it, chunked uploads included."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            return await self._refuse(scope, receive, send)
        messages = await _read_messages(receive, self.max_bytes)
        if messages is None:
            return await self._refuse(scope, receive, send)
        return await self.app(scope, _replay(messages, receive), send)

    async def _refuse(self, scope, receive, send):
        response = JSONResponse({"detail": f"request body larger than {self.max_bytes} bytes"}, status_code=413)
        await response(scope, receive, send)


class TokenCache:
    """Verified tokens for a few seconds, so a request costs no token lookup; revocation waits that long."""

    def __init__(self, calls: StoreCalls, ttl: float, max_entries: int = 10_000):
        self.calls, self.ttl, self.max_entries = calls, ttl, max_entries
        self._entries: dict[str, tuple[float, TokenInfo]] = {}

    async def get(self, token: str) -> TokenInfo | None:
        key = hash_token(token)
        hit = self._entries.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        now = time.monotonic()
        info = await self.calls(lambda store: store.authenticate(token))
        if info is not None and self.ttl > 0:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (now + self.ttl, info)
        return info


PRODUCING = (Role.PRODUCER, Role.ADMIN)
CONSUMING = (Role.CONSUMER, Role.ADMIN)


def _error_response(exc: TriggerError | OperationalError) -> JSONResponse:
    """The answer to a store error: the TriggerError's status, or 503 while the database is unreachable."""
    if isinstance(exc, TriggerError):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code)
    return JSONResponse({"detail": f"the event store is unavailable: {exc.orig}"}, status_code=503,
                        headers={"Retry-After": "1"})


class FastRegistration:
    """``POST /events`` without FastAPI's routing, dependency and body machinery, for the requests it accepts.

    A registration of 100 events cost the service 2.7 ms of CPU through the route and 2.0 ms here (A/B in one
    run, interleaved; docs/benchmarks.md): the route's machinery cost as much as validating the events. This
    path answers only what the route would answer with a 200 or with the store's own error (a 409 conflict, a
    503): a JSON body that is a valid batch, sent with a producer or admin token that covers every table. Any
    other request (no or unknown token, a role or table the token does not cover, a body the batch model
    refuses, another content type) goes to the route unchanged, body replayed, so every refusal, and the
    OpenAPI description, stays the route's.
    """

    def __init__(self, app, tokens: TokenCache, registrations: GroupCommit):
        self.app, self.tokens, self.registrations = app, tokens, registrations

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/events":
            return await self.app(scope, receive, send)
        messages = await _read_messages(receive) or []  # already in memory: BodyLimit, outside this, read it
        body = b"".join(m.get("body", b"") for m in messages)
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:  # the first of repeated headers, as Starlette's Request reads them
            headers.setdefault(name, value)
        response = await self._answer(headers, body)
        if response is None:
            return await self.app(scope, _replay(messages, receive), send)
        await response(scope, receive, send)

    async def _answer(self, headers: dict[bytes, bytes], body: bytes) -> Response | None:
        content_type = headers.get(b"content-type", b"").partition(b";")[0].strip().lower()
        authorization = headers.get(b"authorization", b"")
        if content_type != b"application/json" or authorization[:7].lower() != b"bearer ":
            return None
        try:
            info = await self.tokens.get(authorization[7:].decode("latin-1"))
            if info is None or info.role not in PRODUCING:
                return None
            try:
                batch = EventBatch.model_validate_json(body)
            except ValidationError:
                return None
            if not all(info.allows(table) for table in {e.table for e in batch.events}):
                return None
            return _json(await self.registrations.register(batch.events))
        except (TriggerError, OperationalError) as exc:  # the database down during the token lookup too: 503
            return _error_response(exc)


def _config(config: TriggerConfig | Mapping[str, Any] | str | os.PathLike | None) -> TriggerConfig:
    if config is None or isinstance(config, str | os.PathLike):
        return TriggerConfig.load(config)
    if isinstance(config, TriggerConfig):
        return config
    return TriggerConfig.model_validate(config)


def create_app(config: TriggerConfig | Mapping[str, Any] | str | os.PathLike | None = None) -> FastAPI:
    """The trigger service as a FastAPI application; opening its store migrates the schema.

    Args:
        config: a :class:`TriggerConfig`, a mapping of its fields, or the path of a TOML file; by default the
            file named by ``$BITLAKE_TRIGGERS_CONFIG`` and ``BITLAKE_TRIGGERS_*`` variables, else an SQLite
            database ``./bitlake-triggers.db``.
    """
    config = _config(config)
    store = TriggerStore.from_config(config)
    calls = StoreCalls(store, config)
    tokens = TokenCache(calls, config.token_cache_seconds)
    registrations = GroupCommit(calls)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        # Everything loaded so far lives as long as the service: out of the collector's sight, a request's
        # garbage collection no longer walks the modules, schemas and routes (A/B: 1.73 -> 1.33 ms of CPU per
        # 100-event registration). It freezes the whole process: see docs/triggers.md.
        if config.freeze_gc:
            gc.collect()
            gc.freeze()
        await calls.start()
        yield
        await calls.stop()
        store.close()

    app = FastAPI(
        title="bitlake trigger service", version=API_VERSION, lifespan=lifespan,
        description="Data Change Events, partition triggers and snapshot triggers (LakeChime). See docs/triggers.md.",
    )
    app.state.store = store
    app.state.config = config
    app.state.registrations = registrations
    if config.fast_registration:
        app.add_middleware(FastRegistration, tokens=tokens, registrations=registrations)
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)  # added last: the outer one

    @app.exception_handler(TriggerError)
    async def _trigger_error(_request: Request, exc: TriggerError):
        return _error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError):
        # FastAPI's own handler echoes each input back; that input may be huge or not encodable.
        errors = [{"type": e["type"], "loc": _printable(list(e["loc"])), "msg": _printable(e["msg"])}
                  for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    @app.exception_handler(OperationalError)
    async def _database_down(_request: Request, exc: OperationalError):
        return _error_response(exc)

    bearer = HTTPBearer(auto_error=False, description="A token from bitlake.triggers.store.create_token")

    # Every dependency and endpoint is a coroutine: FastAPI would run a plain function in its thread pool, and
    # a thread hop costs more than the work of most requests (see storecalls.py).
    async def caller(credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]) -> TokenInfo:
        if credentials is None:
            raise HTTPException(401, "missing bearer token (Authorization: Bearer ...)",
                                headers={"WWW-Authenticate": "Bearer"})
        info = await tokens.get(credentials.credentials)
        if info is None:
            raise HTTPException(401, "unknown or revoked token", headers={"WWW-Authenticate": "Bearer"})
        return info

    async def producer(info: Annotated[TokenInfo, Depends(caller)]) -> TokenInfo:
        if info.role not in PRODUCING:
            raise HTTPException(403, f"a {info.role} token cannot register events")
        return info

    async def consumer(info: Annotated[TokenInfo, Depends(caller)]) -> TokenInfo:
        if info.role not in CONSUMING:
            raise HTTPException(403, f"a {info.role} token cannot query events or evaluate triggers")
        return info

    def in_scope(info: TokenInfo, table: str) -> None:
        if not info.allows(table):
            raise HTTPException(403, f"token {info.name or info.token_id!r} does not cover table {table!r}")

    @app.get("/health", tags=["service"])
    async def health() -> dict[str, str]:  # no thread hop: it touches nothing that blocks
        """Liveness without authentication."""
        return {"status": "ok", "api_version": API_VERSION}

    @app.post("/events", tags=["events"], response_model=RegistrationResult)
    async def register(batch: EventBatch, info: Annotated[TokenInfo, Depends(producer)]) -> Response:
        """Register 1 to 1000 events in one transaction (all or nothing); retries return the existing events."""
        for table in sorted({e.table for e in batch.events}):
            in_scope(info, table)
        return _json(await registrations.register(batch.events))

    @app.get("/events", tags=["events"], response_model=EventPage)
    async def list_events(
        info: Annotated[TokenInfo, Depends(consumer)],
        table: Annotated[TableName, Query(description="The table (exact name)")],
        partition: Annotated[str | None, Query(
            description='JSON: a list of values (["2024-01-01","05"]) or null for unpartitioned events')] = None,
        tag: Annotated[list[str] | None, Query(description="key=value; repeat for several; all must match")] = None,
        since: Annotated[Timestamp | None, Query(description="event_ts >= since")] = None,
        until: Annotated[Timestamp | None, Query(description="event_ts < until")] = None,
        min_event_id: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
        max_event_id: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
        cursor: Annotated[str | None, Query(max_length=200, description="next_cursor of the previous page")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    ) -> Response:
        """Events of a table in event-id order, filtered and paged."""
        in_scope(info, table)
        wanted: Any = ANY_PARTITION
        if partition is not None:
            try:
                wanted = _PARTITION.validate_json(partition)
            except ValidationError as e:
                raise HTTPException(422, f"partition must be JSON: a list of strings (or nulls), at most "
                                         f"{MAX_PARTITION_JSON_BYTES} bytes, or null; "
                                         f"{_printable(_reasons(e))}") from None
        tags: dict[str, str] = {}
        for item in tag or []:
            key, sep, value = item.partition("=")
            if not sep:
                raise HTTPException(422, f"tag {item[:100]!r} is not key=value")
            tags[key] = value
        try:
            tags = _TAGS.validate_python(tags)
        except ValidationError as e:
            raise HTTPException(422, f"bad tag filter: {_printable(_reasons(e))}") from None
        return _json(await calls(lambda s: s.events_json(
            table, partition=wanted, tags=tags, since=since, until=until, min_event_id=min_event_id,
            max_event_id=max_event_id, cursor=cursor, limit=limit)))

    @app.post("/triggers/partition", tags=["triggers"], response_model=PartitionTriggerResult)
    async def partition_trigger(trigger: PartitionTrigger, info: Annotated[TokenInfo, Depends(consumer)]) -> Response:
        """Has the partition (templates rendered at the scheduled time) arrived by the evaluation time?"""
        in_scope(info, trigger.table)
        return _json(await calls(lambda s: s.evaluate_partition_trigger_json(trigger)))

    @app.post("/triggers/snapshot", tags=["triggers"], response_model=SnapshotTriggerResult)
    async def snapshot_trigger(trigger: SnapshotTrigger, info: Annotated[TokenInfo, Depends(consumer)]) -> Response:
        """The flow's events after its last acknowledged one; does not move the cursor."""
        in_scope(info, trigger.table)
        return _json(await calls(lambda s: s.evaluate_snapshot_trigger_json(trigger)))

    @app.post("/triggers/snapshot/ack", tags=["triggers"], response_model=FlowCursor)
    async def snapshot_ack(ack: SnapshotAck, info: Annotated[TokenInfo, Depends(consumer)]) -> Response:
        """Move the flow's cursor to event_id after a successful run; repeating it is a no-op, going back a 409."""
        in_scope(info, ack.table)
        return _json(await calls(lambda s: s.ack(ack.flow, ack.table, ack.event_id)))

    return app
