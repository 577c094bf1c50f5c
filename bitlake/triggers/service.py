"""The trigger service: the store behind an HTTP API (FastAPI), with bearer tokens scoped to tables.

``create_app()`` returns the ASGI application, so any ASGI server runs it::

    uvicorn --factory bitlake.triggers:create_app --host 127.0.0.1 --port 8400

Every request a client gets wrong is answered with a 4xx and a ``detail`` that says why: 401 without a
valid token, 403 for a role or a table the token does not cover, 413 for a body over the size limit, 422
for input that does not validate (a page over ``max_page_size`` too), 400 for a cursor the service did not
hand out, 404 and 409 from the store, 429 (with ``Retry-After``) for a token over its rate. A 503 (with
``Retry-After``) is the service's own trouble: its database unreachable, a request over its time limit.
A batch is registered in one transaction, so a refused request writes nothing.

This module assembles the application: its parts on ``app.state`` (the store, the store calls, the token
cache, the group commit), the routers of :mod:`bitlake.triggers.routes`, the error handlers, and two ASGI
middlewares in front of FastAPI (:class:`BodyLimit`, :class:`FastRegistration`), behind the rate and time
limits (:class:`bitlake.triggers.limits.Limits`).
"""

import gc
import os
from collections.abc import Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError

from bitlake.triggers.config import TriggerConfig
from bitlake.triggers.errors import TriggerError
from bitlake.triggers.limits import Limits
from bitlake.triggers.routes import ROUTERS
from bitlake.triggers.routes.deps import PRODUCING, TokenCache
from bitlake.triggers.routes.events import EventBatch
from bitlake.triggers.routes.health import API_VERSION
from bitlake.triggers.routes.responses import json_response, printable
from bitlake.triggers.store import TriggerStore
from bitlake.triggers.storecalls import GroupCommit, StoreCalls


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


def _error_response(exc: TriggerError | OperationalError) -> JSONResponse:
    """The answer to a store error: the TriggerError's status, or 503 while the database is unreachable."""
    if isinstance(exc, TriggerError):
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code)
    return JSONResponse({"detail": f"the event store is unavailable: {exc.orig}"}, status_code=503,
                        headers={"Retry-After": "1"})


class FastRegistration:
    """``POST /events`` without FastAPI's routing, dependency and body machinery, for the requests it accepts.

    The route's machinery costs about as much as validating the events (docs/triggers.md has the A/B). This
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
            return json_response(await self.registrations.register(batch.events))
        except (TriggerError, OperationalError) as exc:  # the database down during the token lookup too: 503
            return _error_response(exc)


def _config(config: TriggerConfig | Mapping[str, Any] | str | os.PathLike | None) -> TriggerConfig:
    if config is None or isinstance(config, str | os.PathLike):
        return TriggerConfig.load(config)
    if isinstance(config, TriggerConfig):
        return config
    return TriggerConfig.model_validate(config)


@asynccontextmanager
async def _lifespan(app: FastAPI):
    state = app.state
    # Everything loaded so far lives as long as the service: out of the collector's sight, a request's garbage
    # collection no longer walks the modules, schemas and routes. It freezes the whole process: see
    # docs/triggers.md, which also has the measurement.
    if state.config.freeze_gc:
        gc.collect()
        gc.freeze()
    await state.calls.start()
    yield
    await state.calls.stop()
    state.store.close()


async def _store_error(_request: Request, exc: TriggerError | OperationalError) -> JSONResponse:
    return _error_response(exc)


async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI's own handler echoes each input back; that input may be huge or not encodable.
    errors = [{"type": e["type"], "loc": printable(list(e["loc"])), "msg": printable(e["msg"])}
              for e in exc.errors()]
    return JSONResponse({"detail": errors}, status_code=422)


def create_app(config: TriggerConfig | Mapping[str, Any] | str | os.PathLike | None = None, *,
               console: Sequence[str] | None = None) -> FastAPI:
    """The trigger service as a FastAPI application; opening its store migrates the schema.

    Args:
        config: a :class:`TriggerConfig`, a mapping of its fields, or the path of a TOML file; by default the
            file named by ``$BITLAKE_TRIGGERS_CONFIG`` and ``BITLAKE_TRIGGERS_*`` variables, else an SQLite
            database ``./bitlake-triggers.db``.
        console: lake folders or URIs: also serve the console (:mod:`bitlake.console`, docs/console.md) for the
            bitlake tables under them.
    """
    config = _config(config)
    store = TriggerStore.from_config(config)
    calls = StoreCalls(store, config)
    tokens = TokenCache(calls, config.token_cache_seconds)
    registrations = GroupCommit(calls)
    app = FastAPI(
        title="bitlake trigger service", version=API_VERSION, lifespan=_lifespan,
        description="Data Change Events, partition triggers and snapshot triggers (LakeChime). See docs/triggers.md.",
        exception_handlers={TriggerError: _store_error, OperationalError: _store_error,
                            RequestValidationError: _invalid},
    )
    # What the lifespan and the routes' dependencies (routes/deps.py) take.
    app.state.config, app.state.store, app.state.calls = config, store, calls
    app.state.tokens, app.state.registrations = tokens, registrations
    for router in ROUTERS:
        app.include_router(router)
    if console:
        from bitlake.console import mount  # Jinja2: only a service with a console loads it

        mount(app, console)
    if config.fast_registration:
        app.add_middleware(FastRegistration, tokens=tokens, registrations=registrations)
    app.add_middleware(BodyLimit, max_bytes=config.max_request_bytes)
    app.add_middleware(Limits, timeout=config.request_timeout_seconds, rate=config.rate_limit_per_second,
                       burst=config.rate_limit_burst)  # added last: the outer one
    return app
