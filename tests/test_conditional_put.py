"""A store that ignores conditional puts gets no commit: an S3-compatible endpoint that drops the
``If-None-Match`` header (tests/faultproxy.py in front of moto's server) makes bitlake refuse to create or
commit, with an error that says why, and nothing is left half-written."""

from __future__ import annotations

import pyarrow as pa
import pytest

import bitlake
from bitlake import ConditionalPutUnsupportedError
from bitlake.fs import file_io
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.s3


@pytest.fixture
def lax_endpoint(s3_server):
    """The S3 server behind a proxy that drops every request's conditional headers, as a store that does not
    implement them would treat them."""
    with FaultProxy(s3_server.endpoint, drop_conditional_headers=True) as proxy:
        yield proxy.endpoint


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
