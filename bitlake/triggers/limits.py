"""Limits that protect the service from its clients: a per-token rate limit and a time limit per request.

:class:`Limits` is one ASGI middleware in front of the application (one layer: each layer costs every
request its call). The other limits are where the request is parsed: the body size in
:class:`bitlake.triggers.service.BodyLimit` (413), the page sizes in the routes (422), the sizes of an event's
fields in :mod:`bitlake.triggers.event`. docs/triggers.md ("Limits") lists them with their defaults.
"""

from __future__ import annotations

import asyncio
import math
import time

from fastapi.responses import JSONResponse


class TokenBuckets:
    """A token bucket per key: ``rate`` requests per second sustained, ``burst`` at once.

    ``take(key)`` spends one request of ``key``'s bucket and returns 0, or returns the seconds until the
    bucket holds one again (the request is refused and spends nothing). Buckets of idle keys are forgotten
    once there are ``max_entries`` of them: a forgotten key starts again with a full bucket, which costs at
    most one burst per key.
    """

    def __init__(self, rate: float, burst: int, max_entries: int = 10_000):
        self.rate, self.burst, self.max_entries = rate, float(burst), max_entries
        self._buckets: dict[bytes, tuple[float, float]] = {}  # key -> (requests left, at monotonic time)

    def take(self, key: bytes, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        left, at = self._buckets.get(key, (self.burst, now))
        left = min(self.burst, left + (now - at) * self.rate)
        if left >= 1:
            if len(self._buckets) >= self.max_entries and key not in self._buckets:
                self._forget(now)
            self._buckets[key] = (left - 1, now)
            return 0.0
        self._buckets[key] = (left, now)
        return (1 - left) / self.rate

    def _forget(self, now: float) -> None:
        """Drops the buckets that refilled (their keys lose nothing), or every bucket when none did."""
        full = [k for k, (left, at) in self._buckets.items() if left + (now - at) * self.rate >= self.burst]
        for k in full:
            del self._buckets[k]
        if not full:
            self._buckets.clear()


class Limits:
    """Refuses a token over its rate (429 with ``Retry-After``) and answers 503 (with ``Retry-After: 1``) to a
    request that is not answered within ``timeout`` seconds.

    The rate is counted per bearer token as sent (before any lookup: a token's requests cost the service
    nothing once refused); requests without one (``/health``, refused with 401 anyway) are not counted. A
    request that times out is cancelled: a registration it was part of either committed or did not, and a
    retry finds out (registration is idempotent). Once the answer has started, the time limit no longer
    applies: a response cannot be taken back.
    """

    def __init__(self, app, *, timeout: float, rate: float, burst: int):
        self.app, self.timeout = app, timeout
        self.buckets = TokenBuckets(rate, burst) if rate > 0 else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.buckets is not None:
            authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            wait = self.buckets.take(authorization) if authorization else 0.0
            if wait:
                response = JSONResponse(
                    {"detail": f"too many requests with this token (over {self.buckets.rate:g} per second, "
                               f"bursts of {self.buckets.burst:g}): retry after {wait:.3f} s"},
                    status_code=429, headers={"Retry-After": str(max(1, math.ceil(wait)))})
                return await response(scope, receive, send)
        # A timer per request that cancels the request's task, rather than asyncio.timeout(): the same effect at a
        # third of the cost, which every request pays (docs/triggers.md, "Limits").
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        state = _State()
        timer = loop.call_at(loop.time() + self.timeout, _expire, task, state)

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                state.started = True
            await send(message)

        try:
            return await self.app(scope, receive, sending)
        except asyncio.CancelledError:
            if not state.expired or task is None:
                raise
            task.uncancel()
            if state.started:  # the answer is on its way: it cannot be taken back, and the server ends it
                return
        finally:
            timer.cancel()
        response = JSONResponse({"detail": f"the request took longer than {self.timeout:g} s (the service's "
                                           "request_timeout_seconds); retry"},
                                status_code=503, headers={"Retry-After": "1"})
        await response(scope, receive, send)


class _State:
    __slots__ = ("started", "expired")

    def __init__(self):
        self.started = self.expired = False


def _expire(task: asyncio.Task | None, state: _State) -> None:
    if task is not None and not task.done():
        state.expired = True
        task.cancel()
