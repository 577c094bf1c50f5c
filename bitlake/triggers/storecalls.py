"""How the service's event loop calls the store: without a thread on PostgreSQL, and registrations grouped.

The store's methods are synchronous (SQLAlchemy Core, shared with the CLI, the producers and the tests).
A FastAPI service would run each call in its thread pool, and on this path a thread hop costs more than
the work: under load, handing the GIL between the loop and a worker costs more than the store's own Python in
a one-event registration (docs/triggers.md). :class:`StoreCalls` runs the same methods in the loop instead,
on a twin of the store whose engine uses psycopg's asyncio connections: SQLAlchemy's greenlet bridge turns
each wait for the database into an ``await``.

:class:`GroupCommit` then makes concurrent registrations share one transaction (PostgreSQL's commit, its
round trips and the call's fixed costs), each still answered as if it had run alone. On PostgreSQL a group
of new events first goes to :class:`DirectInsert`: the store's statement on a psycopg connection of its own.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import psycopg
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn

from bitlake.triggers.config import TriggerConfig
from bitlake.triggers.errors import EventConflictError
from bitlake.triggers.event import MAX_EVENTS_PER_REQUEST, EventIn
from bitlake.triggers.registration import PlannedRegistration
from bitlake.triggers.statements import PG_INSERT_NEW
from bitlake.triggers.store import TriggerStore

T = TypeVar("T")

# Registration groups in flight at once per service process (GroupCommit), each on one direct connection.
GROUPS_IN_FLIGHT = 2


class StoreCalls:
    """``await calls(lambda store: store.method(...))``: a store call for the event loop.

    On PostgreSQL, once :meth:`start` ran (the app's lifespan, on the loop that serves), the function runs in
    the loop on the asyncio twin of the store. On SQLite (no asyncio driver here), before :meth:`start` and
    on any other loop (a test client that starts a loop per request), it runs on the store in the thread pool.
    Both run the same store code; only the waiting differs.
    """

    def __init__(self, store: TriggerStore, config: TriggerConfig):
        self.store, self.config = store, config
        self._engine: AsyncEngine | None = None
        self._twin: TriggerStore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._direct: DirectInsert | None = None

    async def start(self) -> None:
        if self.store.dialect != "postgresql" or self._engine is not None:
            return
        self._engine = create_async_engine(self.store.engine.url, pool_size=self.config.pool_size,
                                           max_overflow=self.config.max_overflow, echo=self.config.sql_echo)
        self._twin = TriggerStore(self._engine.sync_engine, migrate=False)
        self._direct = DirectInsert(self.store, keep=GROUPS_IN_FLIGHT)
        self._loop = asyncio.get_running_loop()

    async def stop(self) -> None:
        engine, direct = self._engine, self._direct
        self._engine, self._twin, self._loop, self._direct = None, None, None, None
        if direct is not None:
            await direct.close()
        if engine is not None:
            await engine.dispose()

    def in_loop(self) -> bool:
        """Whether a call from the running loop runs in it (else in the thread pool)."""
        return self._twin is not None and asyncio.get_running_loop() is self._loop

    async def __call__(self, fn: Callable[[TriggerStore], T]) -> T:
        if self.in_loop():
            return await greenlet_spawn(fn, self._twin)
        return await run_in_threadpool(fn, self.store)

    async def register_together_json(self, requests: list[list[EventIn]]) -> list[bytes | EventConflictError]:
        """:meth:`TriggerStore.register_together_json`, trying :class:`DirectInsert` first when it runs in the loop."""
        if self._direct is None or not self.in_loop():
            return await run_in_threadpool(TriggerStore.register_together_json, self.store, requests)
        plan = PlannedRegistration.of(requests)
        if plan.unique and plan.distinct:
            answers = await self._direct.insert(plan)
            if answers is not None:
                return list(answers)
        register = functools.partial(TriggerStore.register_together_json, requests=requests, insert_new_first=False)
        return await greenlet_spawn(register, self._twin)


class DirectInsert:
    """New events inserted by a psycopg asyncio connection itself, not through SQLAlchemy.

    For this one statement, SQLAlchemy's greenlet bridge, pool, execution context and result objects cost the
    service more than the round trip (docs/triggers.md has the A/B against the store on its asyncio twin). It
    runs the store's statement (:data:`PG_INSERT_NEW`, one autocommit round trip) and answers as the store does
    (:meth:`PlannedRegistration.answers_inserted`). Any failure (a key registered already, a deadlock, a lost
    connection or database) returns None, and the caller hands the requests to the store, whose transaction
    handles every case. Nothing is written then, except when the connection died after the server committed:
    the store then finds the events and answers as to a retry (``created`` false), as on its own path.

    After a failed connection attempt it makes none for :attr:`RECONNECT_PAUSE` seconds, so that while the
    database is unreachable each request waits for the store's attempt only.
    """

    RECONNECT_PAUSE = 1.0

    def __init__(self, store: TriggerStore, keep: int):
        args, kwargs = store.engine.dialect.create_connect_args(store.engine.url)
        self._connect = functools.partial(psycopg.AsyncConnection.connect, *args, **kwargs, autocommit=True)
        self._sql = str(PG_INSERT_NEW.compile(dialect=store.engine.dialect))
        self._idle: list[psycopg.AsyncConnection] = []
        self._connect_after = 0.0  # loop time
        self._closed = False
        self.keep = keep

    async def insert(self, plan: PlannedRegistration) -> list[bytes] | None:
        """The answers of ``plan``'s requests when all its events were new and are now registered, else None."""
        conn = self._idle.pop() if self._idle else None
        try:
            if conn is None:
                conn = await self._open()
                if conn is None:
                    return None
            cursor = await conn.execute(self._sql, plan.pg_params, prepare=True)
            inserted = await cursor.fetchall()
        except psycopg.Error:
            return None
        finally:
            if conn is not None:
                await self._release(conn)
        return plan.answers_inserted(inserted)

    async def _open(self) -> psycopg.AsyncConnection | None:
        loop = asyncio.get_running_loop()
        if self._closed or loop.time() < self._connect_after:
            return None
        try:
            return await self._connect()
        except psycopg.Error:
            self._connect_after = loop.time() + self.RECONNECT_PAUSE
            return None

    async def _release(self, conn: psycopg.AsyncConnection) -> None:
        if not self._closed and not conn.closed and len(self._idle) < self.keep \
                and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            self._idle.append(conn)
        else:
            await conn.close()

    async def close(self) -> None:
        """Closes the idle connections now, and each busy one when its insert returns."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await conn.close()


class GroupCommit:
    """Registration requests that arrive while the store is busy go to it together, in one transaction.

    The first request runs at once, alone; those that arrive while it runs wait and then run as one group
    (at most ``max_events`` events, and at least one request), and so on, with up to ``concurrency`` groups
    in flight. Each request is answered as if it had run alone
    (:meth:`TriggerStore.register_together_json`): its own events, its own 409.
    """

    def __init__(self, calls: StoreCalls, max_events: int = MAX_EVENTS_PER_REQUEST,
                 concurrency: int = GROUPS_IN_FLIGHT):
        self.calls, self.max_events, self.concurrency = calls, max_events, concurrency
        self._waiting: deque[tuple[list[EventIn], asyncio.Future]] = deque()
        self._runners: set[asyncio.Task] = set()

    async def register(self, events: list[EventIn]) -> bytes:
        """The answer of ``POST /events`` for ``events``; raises what :meth:`TriggerStore.register_json` raises."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting.append((events, future))
        self._runners = {t for t in self._runners if not t.done() and t.get_loop() is loop}
        if len(self._runners) < self.concurrency:
            self._runners.add(loop.create_task(self._run()))
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            group: list[tuple[list[EventIn], asyncio.Future]] = []
            size = 0
            while self._waiting and (not group or size + len(self._waiting[0][0]) <= self.max_events):
                events, future = self._waiting.popleft()
                if future.get_loop() is loop and not future.done():  # not given up by its client
                    group.append((events, future))
                    size += len(events)
            if not group:
                continue
            answers: list[bytes | Exception]
            try:
                answers = list(await self.calls.register_together_json([e for e, _ in group]))
            except Exception as error:  # noqa: BLE001 - each request of the group gets it
                answers = [error] * len(group)
            for (_, future), answer in zip(group, answers, strict=True):
                if future.done():
                    continue
                if isinstance(answer, Exception):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
