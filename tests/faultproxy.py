"""A faulty S3 for the tests: an HTTP proxy on loopback in front of moto's S3 server that fails requests the
ways real object stores do (docs/storage.md, "Faults").

Faults are injected at a rate (each request draws from a seeded ``random.Random``) and by schedule (the next
``count`` requests whose method and path match get a given fault). Every request is otherwise forwarded as
it came, its conditional headers (``If-None-Match``, ``If-Match``) included, unless the proxy is told to drop
them (a store that ignores conditional puts, tests/test_conditional_put.py).

The faults:

* ``slow_down``: 503 with S3's ``SlowDown`` XML body; the request is not forwarded.
* ``internal_error``: 500 with S3's ``InternalError`` XML body; not forwarded.
* ``reset_before``: the connection is reset (RST) after the request is read, before it is forwarded.
* ``reset_during``: forwarded; the answer's head and half its body are sent, then the connection is reset.
* ``truncate``: forwarded; the head (with the full ``Content-Length``) and half the body are sent, then the
  connection is closed cleanly: the client gets fewer bytes than announced.
* ``delay``: forwarded after ``delay`` seconds (beyond the client's timeout, a timeout).
* ``lost_answer``: forwarded (a PUT lands), then the connection is reset before any answer is sent.
* ``landed_500``: forwarded (a PUT lands), then answered 500 ``InternalError``: a client that retries finds
  its own object there.
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import random
import re
import socket
import struct
import threading
import time
import uuid
from urllib.parse import unquote, urlparse

FAULTS = ("slow_down", "internal_error", "reset_before", "reset_during", "truncate", "delay", "lost_answer",
          "landed_500")
_ERRORS = {
    "slow_down": (503, "SlowDown", "Please reduce your request rate."),
    "internal_error": (500, "InternalError", "We encountered an internal error. Please try again."),
}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


@dataclasses.dataclass
class Rule:
    """The next ``count`` requests with ``method`` (any when None) whose decoded path matches ``path`` (a regular
    expression, searched) get ``fault``."""

    fault: str
    method: str | None = None
    path: str = ""
    count: int = 1


class FaultProxy:
    """The proxy, serving on ``endpoint`` until :meth:`close`. ``rate``: the share of requests that get a fault
    drawn from ``faults``; ``methods``: the methods the rate applies to (all when None)."""

    def __init__(self, target: str, *, rate: float = 0.0, faults: tuple[str, ...] = FAULTS, seed: int = 0,
                 delay: float = 0.3, methods: tuple[str, ...] | None = None, drop_conditional_headers: bool = False):
        unknown = set(faults) - set(FAULTS)
        assert not unknown, f"unknown faults {unknown}"
        parsed = urlparse(target)
        self.target = (parsed.hostname, parsed.port)
        self.rate = rate
        self.faults = tuple(faults)
        self.delay = delay
        self.methods = methods
        self.drop_conditional_headers = drop_conditional_headers
        self.rules: list[Rule] = []
        self.injected: list[tuple[str, str, str]] = []  # (method, path, fault) of every fault injected
        self.requests = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"proxy": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def schedule(self, fault: str, *, method: str | None = None, path: str = "", count: int = 1) -> Rule:
        """The next ``count`` requests matching ``method`` and ``path`` get ``fault`` (before any rate draw)."""
        assert fault in FAULTS, fault
        rule = Rule(fault, method, path, count)
        with self._lock:
            self.rules.append(rule)
        return rule

    def pending(self) -> int:
        """How many scheduled faults have not been injected yet."""
        with self._lock:
            return sum(r.count for r in self.rules)

    def quiet(self) -> None:
        """No more faults: the rate goes to 0 and the schedule is emptied."""
        with self._lock:
            self.rate = 0.0
            self.rules.clear()

    def count(self, fault: str | None = None) -> int:
        with self._lock:
            return sum(1 for _, _, f in self.injected if fault is None or f == fault)

    def _choose(self, method: str, path: str) -> str | None:
        with self._lock:
            self.requests += 1
            fault = None
            for rule in self.rules:
                if (rule.method is None or rule.method == method) and re.search(rule.path, path):
                    fault = rule.fault
                    rule.count -= 1
                    if rule.count <= 0:
                        self.rules.remove(rule)
                    break
            if fault is None and self.rate and (self.methods is None or method in self.methods):
                if self._random.random() < self.rate:
                    fault = self._random.choice(self.faults)
            if fault is not None:
                self.injected.append((method, path, fault))
            return fault

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass  # a client that gave up (its timeout) or a connection the proxy reset on purpose


class _Handler(http.server.BaseHTTPRequestHandler):
    proxy: FaultProxy
    protocol_version = "HTTP/1.1"  # keep-alive, as a real endpoint: a reset can hit a pooled connection
    disable_nagle_algorithm = True  # the head and the body go in two writes: no delayed-ACK stall between them

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        body = self._body()
        path = unquote(urlparse(self.path).path)
        fault = self.proxy._choose(self.command, path)
        if fault in _ERRORS:
            return self._error(*_ERRORS[fault], path)
        if fault == "reset_before":
            return self._reset()
        if fault == "delay":
            time.sleep(self.proxy.delay)
        status, reason, headers, data = self._forward(body)
        if fault == "lost_answer":
            return self._reset()
        if fault == "landed_500":
            return self._error(*_ERRORS["internal_error"], path)
        if fault in ("reset_during", "truncate") and len(data) >= 2:
            self._head(status, reason, headers, len(data))
            self.wfile.write(data[:len(data) // 2])
            self.wfile.flush()
            return self._reset() if fault == "reset_during" else self._close()
        self._head(status, reason, headers, len(data))
        if self.command != "HEAD":
            self.wfile.write(data)

    def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        drop = set(_HOP_BY_HOP)
        if self.proxy.drop_conditional_headers:
            drop |= {"if-none-match", "if-match"}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in drop}
        conn = http.client.HTTPConnection(*self.proxy.target, timeout=60)
        try:
            conn.request(self.command, self.path, body=body if body or self.command in ("PUT", "POST") else None,
                         headers=headers)
            response = conn.getresponse()
            data = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            if self.command != "HEAD":
                kept = [(k, v) for k, v in kept if k.lower() != "content-length"]
            return response.status, response.reason, kept, data
        finally:
            conn.close()

    def _head(self, status: int, reason: str, headers: list[tuple[str, str]], length: int) -> None:
        self.send_response_only(status, reason)
        for k, v in headers:
            self.send_header(k, v)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _error(self, status: int, code: str, message: str, path: str) -> None:
        request_id = uuid.uuid4().hex[:16].upper()
        data = ('<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Error><Code>{code}</Code><Message>{message}</Message><Resource>{path}</Resource>"
                f"<RequestId>{request_id}</RequestId><HostId>faultproxy</HostId></Error>").encode()
        self._head(status, code, [("Content-Type", "application/xml"), ("x-amz-request-id", request_id)], len(data))
        if self.command != "HEAD":
            self.wfile.write(data)

    def _reset(self) -> None:
        """Closes the connection with a TCP reset (SO_LINGER 0), not a clean FIN."""
        self.close_connection = True
        self.wfile.flush()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()

    def _close(self) -> None:
        self.close_connection = True
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.connection.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    def log_message(self, *args) -> None:
        pass
