"""The bitlake console: the lake's tables, their timelines, batches, change feeds, past views and events, and
maintenance actions, as server-rendered pages of the trigger service (``bitlake serve ROOT...``,
docs/console.md).

:func:`mount` adds it to a service application built by :func:`bitlake.triggers.service.create_app`: the pages
read tables through the Table API and the commit log, and check the caller with the service's own tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.responses import Response

from bitlake.console.auth import ConsoleError, LoginRedirect
from bitlake.console.roots import Roots

__all__ = ["mount"]


def mount(app: FastAPI, roots: Sequence[str]) -> None:
    """Serves the console at ``/`` and ``/console/...`` of ``app`` for the tables under ``roots`` (local folders
    or URIs)."""
    from bitlake.console import actions, pages

    app.state.console_roots = Roots(roots)
    app.include_router(pages.router)
    app.include_router(actions.router)

    async def refused(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ConsoleError)
        return pages.templates.TemplateResponse(request, "error.html", {"status": exc.status,
                                                                        "message": exc.message},
                                                status_code=exc.status)

    async def redirect(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, LoginRedirect)
        return exc.response

    app.add_exception_handler(ConsoleError, refused)
    app.add_exception_handler(LoginRedirect, redirect)

