"""Tables on Azure Blob Storage (Azurite) and Google Cloud Storage (fake-gcs-server), tests/emulators.py: the
conditional put each honours, a store that ignores it getting no commit, and the options by delta-rs's names.
The FileIO contract, the model test and crash cases run on both too (tests/test_fileio_contract.py,
tests/test_model.py, tests/test_crash.py)."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

import bitlake
from bitlake import ConditionalPutUnsupportedError
from bitlake.fs import file_io
from bitlake.fs.objectstore import _normalize
from tests import emulators

STORES = [pytest.param("azure", marks=pytest.mark.azure, id="azure"),
          pytest.param("gcs", marks=pytest.mark.gcs, id="gcs")]


@pytest.fixture(params=STORES)
def store(request) -> emulators.Emulator:
    return emulators.azurite() if request.param == "azure" else emulators.gcs()


def test_the_store_refuses_a_second_conditional_put_of_one_key(store):
    """What obstore sends for ``mode="create"`` (Azure: ``If-None-Match: *``; GCS: ``x-goog-if-generation-match:
    0``) is refused by the emulator the second time (Azurite: 409 BlobAlreadyExists; fake-gcs-server: 412), which
    bitlake reports as FileExistsError; of writers racing for one name exactly one wins."""
    io = file_io(store.uri("claims"), store.options)
    io.put_if_absent("_bitlake/log/1.json", b"first")
    with pytest.raises(FileExistsError):
        io.put_if_absent("_bitlake/log/1.json", b"second")
    assert io.read_bytes("_bitlake/log/1.json") == b"first"
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def claim(writer: int) -> None:
        barrier.wait(timeout=30)
        try:
            io.put_if_absent("_bitlake/log/2.json", str(writer).encode())
            outcomes.append("won")
        except FileExistsError:
            outcomes.append("lost")

    threads = [threading.Thread(target=claim, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["lost"] * 7 + ["won"]


def test_a_store_that_ignores_conditional_puts_gets_no_commit(store):
    """Through an endpoint that drops the preconditions, the second conditional put of the probe is accepted:
    bitlake refuses to create or commit, leaves nothing behind, and the same bucket through the emulator's own
    endpoint takes the table."""
    uri = store.uri("lax")
    schema = pa.schema([("k", pa.int64()), ("d", pa.int64())])
    with emulators.without_preconditions(store) as lax:
        sent = "If-None-Match: \\*" if store.scheme == "az" else "x-goog-if-generation-match: 0"
        with pytest.raises(ConditionalPutUnsupportedError, match=f"second conditional put \\({sent}\\) of one key"):
            bitlake.create_table(uri, schema, primary_key=["k"], delta_column="d", storage_options=lax)
        assert file_io(uri, lax).walk() == [], "no commit, no probe left behind"
    t = bitlake.create_table(uri, schema, primary_key=["k"], delta_column="d", storage_options=store.options)
    t.ingest(pa.table({"k": [1, 2], "d": [1, 1]}))
    t.ingest(pa.table({"k": [2, 3], "d": [2, 2]}))
    reopened = bitlake.open_table(uri, storage_options=store.options)
    assert sorted(reopened.to_arrow().column("k").to_pylist()) == [1, 2, 3]
    assert reopened.to_arrow(version=1).num_rows == 2


def test_two_writers_commit_one_version_each(store):
    """Two table handles ingesting at once: each commit lands once, in its own version."""
    uri = store.uri("writers")
    schema = pa.schema([("k", pa.int64()), ("d", pa.int64())])
    bitlake.create_table(uri, schema, primary_key=["k"], delta_column="d", storage_options=store.options)
    errors: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            t = bitlake.open_table(uri, storage_options=store.options)
            for i in range(3):
                t.ingest(pa.table({"k": [writer * 10 + i], "d": [1]}), batch_id=f"w{writer}-{i}")
        except BaseException as e:  # noqa: BLE001 - reported in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    t = bitlake.open_table(uri, storage_options=store.options)
    assert t.version == 6
    assert sorted(t.to_arrow().column("k").to_pylist()) == [0, 1, 2, 10, 11, 12]
    assert sorted(c["batch_id"] for c in t.history() if c["batch_id"]) == sorted(
        f"w{w}-{i}" for w in range(2) for i in range(3))


def test_a_store_failure_is_a_storage_error_in_one_line(store):
    """A container or bucket that does not exist (Azurite: 404; fake-gcs-server: 500 on the XML listing, retried
    by obstore for a few seconds, where GCS answers 404) and, on Azure, a key the account refuses (403): a
    StorageError naming the path and the store's cause in one line."""
    schema = pa.schema([("id", pa.int64()), ("ts", pa.int64())])
    missing = store.uri("t").replace(f"//{emulators.BUCKET}/", "//no-such-bucket/")
    for call in (lambda: bitlake.open_table(missing, storage_options=store.options),
                 lambda: bitlake.create_table(missing, schema, primary_key=["id"], delta_column="ts",
                                              storage_options=store.options)):
        with pytest.raises(bitlake.StorageError, match=rf"^{store.scheme}://no-such-bucket/t-\S*: \w+Error: ") as e:
            call()
        assert "\n" not in str(e.value)
    if store.scheme == "az":
        key = store.options["AZURE_STORAGE_ACCOUNT_KEY"]
        wrong = {**store.options, "AZURE_STORAGE_ACCOUNT_KEY": "A" * 8 + key[8:]}
        with pytest.raises(bitlake.StorageError, match="403 Forbidden") as e:
            bitlake.create_table(store.uri("t"), schema, primary_key=["id"], delta_column="ts", storage_options=wrong)
        assert "\n" not in str(e.value)


def test_a_large_file_is_a_multipart_upload(store):
    """More than obstore's 8 MiB buffer: Azure's blocks, GCS's XML multipart upload; the object appears whole on
    close."""
    io = file_io(store.uri("large"), store.options)
    chunk = bytes(range(256)) * 4096  # 1 MiB
    with io.open_output("data/big.bin") as out:
        for i in range(9):
            out.write(bytes([i]) + chunk[1:])
        assert not io.exists("data/big.bin"), "visible before the upload completes"
    assert io.size("data/big.bin") == 9 * len(chunk)
    with io.open_input("data/big.bin") as f:
        f.seek(8 * len(chunk))
        assert f.read(2) == bytes([8, 1])


@pytest.mark.azure
def test_azure_use_emulator_takes_the_endpoint_from_azurite_blob_storage_url(monkeypatch):
    """``AZURE_STORAGE_USE_EMULATOR``: obstore's own account and key for Azurite, and its URL from
    ``AZURITE_BLOB_STORAGE_URL``, not from ``AZURE_STORAGE_ENDPOINT``."""
    server = emulators.azurite()
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", server.endpoint.rsplit("/", 1)[0])
    for key in server.options:
        monkeypatch.delenv(key)
    io = file_io(server.uri("emulator"), {"AZURE_STORAGE_USE_EMULATOR": "true"})
    io.put_if_absent("claim", b"1")
    with pytest.raises(FileExistsError):
        io.put_if_absent("claim", b"2")
    assert file_io(io.uri(), server.options).read_bytes("claim") == b"1"


def test_azure_options_by_delta_rs_names():
    """obstore takes AZURE_STORAGE_ACCOUNT_NAME or account_name, not storage_account_name: bitlake hands it the
    bare name for delta-rs's spelling, with or without the AZURE_ prefix."""
    config, client = _normalize("az", {"AZURE_STORAGE_ACCOUNT_NAME": "a", "azure_storage_account_key": "k",
                                       "AZURE_STORAGE_ENDPOINT": "http://e", "AZURE_STORAGE_USE_EMULATOR": True,
                                       "AZURE_ALLOW_HTTP": "true", "storage_sas_key": "s", "container_name": "c"})
    assert config == {"account_name": "a", "account_key": "k", "endpoint": "http://e", "use_emulator": "true",
                      "sas_key": "s", "container_name": "c"}
    assert client == {"allow_http": "true"}
    assert _normalize("gs", {"GOOGLE_SERVICE_ACCOUNT_KEY": "{}", "GOOGLE_ALLOW_HTTP": "true"}) == (
        {"service_account_key": "{}"}, {"allow_http": "true"})


def test_unknown_azure_and_gcs_options_are_refused_naming_them():
    for uri, key in (("az://c/t", "AZURE_STORAGE_NO_SUCH_KEY"), ("gs://b/t", "GOOGLE_NO_SUCH_KEY")):
        with pytest.raises(bitlake.InvalidInputError, match=key):
            file_io(uri, {key: "1"})
