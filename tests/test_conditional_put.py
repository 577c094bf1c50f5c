"""A store that ignores conditional puts gets no commit: an S3-compatible endpoint that drops the
``If-None-Match`` header (a real HTTP proxy in front of moto's server) makes bitlake refuse to create or
commit, with an error that says why, and nothing is left half-written."""

from __future__ import annotations

import http.client
import http.server
import threading
from urllib.parse import urlparse

import pyarrow as pa
import pytest

import bitlake
from bitlake import ConditionalPutUnsupportedError
from bitlake.fs import file_io

pytestmark = pytest.mark.s3


class _DroppingProxy(http.server.BaseHTTPRequestHandler):
    """Forwards every request to the S3 server without its conditional headers, as a store that does not
    implement them would treat them."""

    target: tuple[str, int]

    def _forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("if-none-match", "if-match")}
        conn = http.client.HTTPConnection(*self.target, timeout=30)
        conn.request(self.command, self.path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        self.send_response(response.status)
        for k, v in response.getheaders():
            if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def lax_endpoint(s3_server):
    parsed = urlparse(s3_server.endpoint)
    handler = type("Proxy", (_DroppingProxy,), {"target": (parsed.hostname, parsed.port)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_store_that_ignores_conditional_puts_gets_no_commit(s3_server, lax_endpoint):
    uri = s3_server.uri("lax")
    options = {**s3_server.options, "AWS_ENDPOINT_URL": lax_endpoint}
    with pytest.raises(ConditionalPutUnsupportedError, match="second conditional put"):
        bitlake.create_table(uri, pa.schema([("k", pa.int64())]), storage_options=options)
    assert file_io(uri, options).walk() == [], "no commit, no probe left behind"
    # The same bucket through the honest endpoint takes the table.
    t = bitlake.create_table(uri, pa.schema([("k", pa.int64())]))
    t.ingest(pa.table({"k": [1, 2]}))
    assert t.to_arrow().num_rows == 2


def test_a_store_failure_is_a_storage_error_in_one_line(s3_server, tmp_path):
    """A bucket that does not exist is the store's refusal, reported as a StorageError naming the path and the
    store's cause in one line (not obstore's exception and debug dump); a URI without a bucket is bad input."""
    schema = pa.schema([("id", pa.int64()), ("ts", pa.int64())])
    for call in (lambda: bitlake.open_table("s3://no-such-bucket/t", storage_options=s3_server.options),
                 lambda: bitlake.create_table("s3://no-such-bucket/t", schema, primary_key=["id"], delta_column="ts",
                                              storage_options=s3_server.options)):
        with pytest.raises(bitlake.StorageError, match=r"^s3://no-such-bucket/t\S*: \w+Error: ") as e:
            call()
        assert "\n" not in str(e.value)
    assert issubclass(ConditionalPutUnsupportedError, bitlake.StorageError)
    with pytest.raises(bitlake.InvalidInputError, match="names no bucket"):
        bitlake.open_table("s3://", storage_options=s3_server.options)
    (tmp_path / "a-file").write_text("not a folder")
    for path in (tmp_path / "a-file", tmp_path / "a-file" / "t"):
        with pytest.raises(bitlake.InvalidInputError, match="is, or is under, a file"):
            bitlake.create_table(str(path), schema, primary_key=["id"], delta_column="ts")
