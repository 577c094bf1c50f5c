"""A bare ASGI app for ``benchmarks/triggers.py --wake-ab``: answers every request after ``WAKE_DELAY_MS``.

No FastAPI, no validation, no database: it measures what uvicorn and the machine cost per request when the
process waits between requests (as the trigger service waits for PostgreSQL's commit) against when it answers
at once.
"""

import asyncio
import os

DELAY_S = float(os.environ.get("WAKE_DELAY_MS", "0")) / 1000
ANSWER = b'{"events":[]}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(ANSWER)).encode())]


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    while (await receive()).get("more_body"):
        pass
    if DELAY_S:
        await asyncio.sleep(DELAY_S)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": ANSWER})
