"""Loopback ports for the servers the tests start: a free one, and waiting until a started server listens."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable

from bitlake.triggers.pgserver import free_port

__all__ = ["free_port", "wait_for_port"]


def wait_for_port(port: int, process: subprocess.Popen, what: str, *, timeout: float = 120,
                  interval: float = 0.5, output: Callable[[], str] = lambda: "") -> None:
    """Returns once ``127.0.0.1:port`` accepts connections; kills ``process`` and raises RuntimeError (with
    ``output()``) when it exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"{what} did not start" + (f":\n{output()}" if output() else "")) from None
            time.sleep(interval)
