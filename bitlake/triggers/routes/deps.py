"""What the routes depend on: the caller's token, its role and tables checked, and the app's parts.

:func:`~bitlake.triggers.service.create_app` keeps the parts on ``app.state`` (``calls``, ``registrations``,
``tokens``); a dependency hands a route the one it needs. Every dependency is a coroutine: FastAPI would run
a plain function in its thread pool, and a thread hop costs more than the work of most requests (see
storecalls.py).
"""

import time
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from bitlake.triggers.models import Role
from bitlake.triggers.storecalls import GroupCommit, StoreCalls
from bitlake.triggers.tokens import TokenInfo, hash_token

PRODUCING = (Role.PRODUCER, Role.ADMIN)
CONSUMING = (Role.CONSUMER, Role.ADMIN)

bearer = HTTPBearer(auto_error=False, description="A token from bitlake.triggers.store.create_token")


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


async def store_calls(request: Request) -> StoreCalls:
    return request.app.state.calls


async def group_commit(request: Request) -> GroupCommit:
    return request.app.state.registrations


async def caller(request: Request,
                 credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]) -> TokenInfo:
    if credentials is None:
        raise HTTPException(401, "missing bearer token (Authorization: Bearer ...)",
                            headers={"WWW-Authenticate": "Bearer"})
    tokens: TokenCache = request.app.state.tokens
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


async def max_page(request: Request) -> int:
    return request.app.state.config.max_page_size


def page_limit(limit: int, largest: int, *, given: bool = True) -> int:
    """``limit`` when the service allows it; a 422 naming the maximum when it was given above it, else the maximum."""
    if limit <= largest:
        return limit
    if given:
        raise HTTPException(422, f"limit {limit} is over the service's largest page, {largest} (max_page_size): "
                                 "page through the rest")
    return largest


def in_scope(info: TokenInfo, table: str) -> None:
    """Refuses (403) a table ``info``'s token does not cover."""
    if not info.allows(table):
        raise HTTPException(403, f"token {info.name or info.token_id!r} does not cover table {table!r}")


Calls = Annotated[StoreCalls, Depends(store_calls)]
Registrations = Annotated[GroupCommit, Depends(group_commit)]
Producer = Annotated[TokenInfo, Depends(producer)]
Consumer = Annotated[TokenInfo, Depends(consumer)]
MaxPage = Annotated[int, Depends(max_page)]
