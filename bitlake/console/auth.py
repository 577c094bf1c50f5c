"""Who may see the console: the trigger service's own tokens (:mod:`bitlake.triggers.tokens`), a consumer or
admin token to read, an admin token to act, each within its table globs.

``bitlake serve ROOT...`` prints the address with a token in it, as Jupyter does; the first request moves the
token into an HttpOnly, SameSite=Strict cookie and redirects to the same address without it, so the token
leaves the address bar and the browser history, and another site cannot make the browser post an action.
"""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import Request
from fastapi.responses import RedirectResponse

from bitlake.triggers.models import Role
from bitlake.triggers.tokens import TokenInfo

COOKIE = "bitlake_console"
READERS = (Role.CONSUMER, Role.ADMIN)
WRITERS = (Role.ADMIN,)


class ConsoleError(Exception):
    """A refusal the console answers with an HTML page: its status and what to do."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        return header[7:]
    return request.cookies.get(COOKIE)


async def _info(request: Request, token: str | None) -> TokenInfo | None:
    if not token:
        return None
    return await request.app.state.tokens.get(token)


class LoginRedirect(Exception):
    """The answer to an address with ``?token=``: a redirect to it without the token, setting the cookie."""

    def __init__(self, response: RedirectResponse):
        super().__init__("login")
        self.response = response


async def _login(request: Request, token: str) -> RedirectResponse:
    if await _info(request, token) is None:
        raise ConsoleError(401, "unknown or revoked token: open the address `bitlake serve` printed")
    rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
    target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=request.url.scheme == "https",
                        path="/")
    return response


async def reader(request: Request) -> TokenInfo:
    """The session's token when it may read; 401 without one, 403 for a producer token. An address with
    ``?token=`` answers with the redirect that moves the token into the cookie (GET only)."""
    token = request.query_params.get("token")
    if token is not None and request.method == "GET":
        raise LoginRedirect(await _login(request, token))
    info = await _info(request, _token(request))
    if info is None:
        raise ConsoleError(401, "this console needs a token: open the address with ?token=... that `bitlake serve` "
                                "printed")
    if info.role not in READERS:
        raise ConsoleError(403, f"a {info.role} token cannot read tables: use a consumer or admin token")
    return info


async def writer(request: Request) -> TokenInfo:
    """The session's token when it may change tables (admin); 403 otherwise."""
    info = await reader(request)
    if info.role not in WRITERS:
        raise ConsoleError(403, f"this session is read-only (a {info.role} token): actions need a write token; "
                                "start the console with `bitlake serve ROOT --allow-writes` and open the write "
                                "address it prints")
    return info


def check_table(info: TokenInfo, name: str) -> None:
    if not info.allows(name):
        raise ConsoleError(403, f"the session's token does not cover table {name!r}")
