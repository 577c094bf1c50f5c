"""Tables on object storage (``s3://``, ``gs://``, ``az://``, and ``memory://`` for tests) through obstore,
the Python binding of the Rust ``object_store`` crate (docs/storage.md).

Configuration comes from the environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``, as obstore reads it) and from a
``storage_options`` dict in delta-rs's convention (``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``, ``endpoint``,
``region``...; case and the scheme's prefix do not matter). The environment is read once, where the table is
opened, and travels with the instance, so Spark executors on other machines reach the same store.

``put_if_absent`` is the store's conditional put (S3 ``If-None-Match: *``, GCS and Azure preconditions).
Before its first commit to a store, a process checks that the store really refuses a second conditional put
of one key (a probe object under ``_bitlake/``): an S3-compatible store that ignores the header would let two
writers own one version, so bitlake refuses to commit to it (:class:`ConditionalPutUnsupportedError`).
"""

from __future__ import annotations

import functools
import os
import re
import threading
import uuid
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa

from bitlake.errors import ConditionalPutUnsupportedError, InvalidInputError, StorageError
from bitlake.fs import FileIO

SCHEMES = {"s3": "aws_", "s3a": "aws_", "gs": "google_", "az": "azure_", "abfs": "azure_", "abfss": "azure_",
           "memory": ""}
# obstore's HTTP client options; every other key configures the store itself.
_CLIENT_KEYS = {
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type", "http1_only",
    "http2_keep_alive_interval", "http2_keep_alive_timeout", "http2_keep_alive_while_idle", "http2_only",
    "pool_idle_timeout", "pool_max_idle_per_host", "proxy_url", "proxy_ca_certificate", "proxy_excludes",
    "randomize_addresses", "read_timeout", "timeout", "user_agent",
}
_ALIASES = {"endpoint_url": "endpoint"}
# The options most asked for, by delta-rs's names, for messages (obstore's S3Config, GCSConfig, AzureConfig hold
# every key; case and the scheme's prefix do not matter).
_COMMON = {
    "aws_": ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
             "AWS_ALLOW_HTTP", "AWS_S3_CONDITIONAL_PUT", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "AWS_SKIP_SIGNATURE"),
    "google_": ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_KEY", "GOOGLE_APPLICATION_CREDENTIALS",
                "GOOGLE_BUCKET"),
    "azure_": ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_KEY",
               "AZURE_STORAGE_CLIENT_ID", "AZURE_STORAGE_CLIENT_SECRET", "AZURE_STORAGE_TENANT_ID",
               "AZURE_STORAGE_USE_EMULATOR"),
}
_ENV_PREFIXES = {"aws_": "AWS_", "google_": "GOOGLE_", "azure_": "AZURE_"}
# Files up to this size are read with one request; larger ones by ranges as a reader asks for them.
WHOLE_READ_BYTES = 8 << 20
_WRITE_BUFFER = 8 << 20
_PROBE = "_bitlake/.conditional-put-probe-"

_memory_stores: dict[str, Any] = {}
_checked: dict[tuple, bool] = {}
_lock = threading.Lock()


class _UnknownOption(Exception):
    """obstore refused a configuration key (its normalized name)."""


def unknown_option_message(scheme: str, key: str, given: dict[str, Any]) -> str:
    """Names the storage option ``key`` (obstore's name; the caller's spelling when it gave one) that ``scheme``
    stores do not know, and the options they take."""
    prefix = SCHEMES[scheme]
    named = next((k for k in given if _normalize(scheme, {k: ""})[0].keys() == {key}), key)
    common = ", ".join(_COMMON.get(prefix, ()))
    return (f"unknown storage option {named!r} for {scheme}:// stores; they take the store's keys ({common}... as "
            f"delta-rs names them, or obstore's names without the {prefix.upper()} prefix; "
            f"case does not matter) and the client options {', '.join(sorted(_CLIENT_KEYS))} (docs/storage.md)")


def _normalize(scheme: str, options: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """``options`` as obstore's store config and client options."""
    prefix = SCHEMES[scheme]
    config, client = {}, {}
    for key, value in options.items():
        k = key.lower()
        bare = k[len(prefix):] if prefix and k.startswith(prefix) else k
        bare = _ALIASES.get(bare, bare)
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if bare in _CLIENT_KEYS:
            client[bare] = text
        else:
            config[bare] = text
    return config, client


def _configuration(base: str, scheme: str, options: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The store config and client options: the environment's variables for the scheme that obstore takes,
    overridden by ``options``."""
    from obstore.store import from_url

    prefix = _ENV_PREFIXES.get(SCHEMES[scheme])
    env = {k: v for k, v in os.environ.items() if k.startswith(prefix)} if prefix else {}
    env_config, env_client = _normalize(scheme, env)
    taken = {}
    for key, value in env_config.items():  # AWS_PROFILE and the like configure other tools
        try:
            from_url(base, config={key: value})  # type: ignore[call-overload]  # one store's keys or another's
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException:  # noqa: BLE001 - UnknownConfigurationKeyError, or a pyo3 panic on an odd key
            continue
        taken[key] = value
    config, client = _normalize(scheme, {k: v for k, v in options.items() if v is not None})
    return {**taken, **config}, {**env_client, **client}


class ObjectStoreFileIO(FileIO):
    """A prefix of an object store bucket (or of an in-process memory store)."""

    spark_readable = False
    failed_put_may_land_later = True

    def __init__(self, base: str, storage_options: dict[str, Any] | None = None):
        parsed = urlparse(base)
        scheme = parsed.scheme.lower()
        if scheme not in SCHEMES:
            raise InvalidInputError(f"{base!r}: object stores are {sorted(SCHEMES)}")
        if not parsed.netloc and scheme != "memory":
            raise InvalidInputError(f"{base!r} names no bucket: give {scheme}://<bucket>/<path>")
        self.base = base.rstrip("/")
        self.scheme = scheme
        self.process_local = scheme == "memory"
        if scheme == "memory" and storage_options:
            raise InvalidInputError(f"memory:// stores take no storage options, not {sorted(storage_options)}")
        self._config, self._client = _configuration(base, scheme, storage_options or {})
        try:
            self._store = self._open()
        except _UnknownOption as e:
            raise InvalidInputError(unknown_option_message(scheme, str(e), storage_options or {})) from None

    def _open(self):
        from obstore.exceptions import BaseError, UnknownConfigurationKeyError
        from obstore.store import MemoryStore, from_url

        if self.scheme == "memory":
            with _lock:  # one store per base in this process: memory:// tables live as long as it does
                return _memory_stores.setdefault(self.base, MemoryStore())
        try:
            return from_url(self.base, config=self._config or None,  # type: ignore[call-overload]
                            client_options=self._client or None)  # type: ignore[arg-type]
        except UnknownConfigurationKeyError as e:
            found = re.search(r"key: '([^']+)'", str(e))
            raise _UnknownOption(found.group(1) if found else str(e).splitlines()[0]) from None
        except BaseError as e:
            raise _storage_error(self.base, e) from None

    def __getstate__(self) -> dict:
        return {"base": self.base, "scheme": self.scheme, "process_local": self.process_local,
                "_config": self._config, "_client": self._client}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._store = self._open()

    def __repr__(self) -> str:
        return f"ObjectStoreFileIO({self.base!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectStoreFileIO) and other.base == self.base

    def __hash__(self) -> int:
        return hash(self.base)

    def uri(self, rel: str = "") -> str:
        return f"{self.base}/{rel}" if rel else self.base

    def local_path(self, rel: str = "") -> None:
        return None

    def exists(self, rel: str = "") -> bool:
        import obstore

        if rel:
            try:
                obstore.head(self._store, rel)
                return True
            except FileNotFoundError:
                pass
        prefix = f"{rel}/" if rel else None
        for chunk in obstore.list(self._store, prefix=prefix, chunk_size=1):
            return bool(chunk)
        return False

    def read_bytes(self, rel: str) -> bytes:
        import obstore

        return obstore.get(self._store, rel).bytes().to_bytes()

    def size(self, rel: str) -> int:
        import obstore

        return int(obstore.head(self._store, rel)["size"])

    def mtime(self, rel: str) -> float:
        import obstore

        return obstore.head(self._store, rel)["last_modified"].timestamp()

    def put_if_absent(self, rel: str, data: bytes) -> None:
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError

        self._check_conditional_put()
        try:
            obstore.put(self._store, rel, data, mode="create")
        except (AlreadyExistsError, PreconditionError):
            raise FileExistsError(f"{self.uri(rel)} exists") from None
        except NotSupportedError as e:
            raise ConditionalPutUnsupportedError(
                f"{self.uri()}: the store cannot put a file only if it is absent ({e}); bitlake commits only to "
                "stores that can (docs/storage.md)") from None

    def _check_conditional_put(self) -> None:
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError

        key = (self.scheme, urlparse(self.base).netloc, tuple(sorted(self._config.items())))
        if _checked.get(key):
            return
        probe = _PROBE + uuid.uuid4().hex
        try:
            obstore.put(self._store, probe, b"1", mode="create")
            try:
                obstore.put(self._store, probe, b"2", mode="create")
                refused = False
            except (AlreadyExistsError, PreconditionError):
                refused = True
        except NotSupportedError:
            refused = False
        finally:
            obstore.delete(self._store, probe)
        if not refused:
            raise ConditionalPutUnsupportedError(
                f"{self.uri()}: the store accepted a second conditional put (If-None-Match: *) of one key, so two "
                "writers could both commit one version; bitlake refuses to commit to it (docs/storage.md lists the "
                "stores that qualify)")
        _checked[key] = True

    def write_atomic(self, rel: str, data: bytes) -> None:
        import obstore

        obstore.put(self._store, rel, data)  # an object appears whole or not at all

    def open_input(self, rel: str) -> pa.NativeFile:
        import obstore

        result = obstore.get(self._store, rel)
        if result.meta["size"] <= WHOLE_READ_BYTES:  # one request for the metadata files and small data files
            return pa.BufferReader(result.bytes().to_bytes())
        del result  # a large file is read by ranges: a Parquet reader wants its footer and some columns
        return pa.PythonFile(_Reader(obstore.open_reader(self._store, rel, buffer_size=1 << 20)), mode="r")

    def open_output(self, rel: str) -> pa.NativeFile:
        import obstore

        # A multipart upload: the object appears when the stream closes, never torn.
        writer = obstore.open_writer(self._store, rel, buffer_size=_WRITE_BUFFER)
        return pa.PythonFile(_Writer(writer), mode="w")

    def listdir(self, rel: str) -> list[str]:
        import obstore

        rel = rel.strip("/")
        listed = obstore.list_with_delimiter(self._store, prefix=rel or None)
        start = len(rel) + 1 if rel else 0
        names = [p[start:].rstrip("/") for p in listed["common_prefixes"]]
        names += [o["path"][start:] for o in listed["objects"]]
        return sorted(set(names), key=lambda n: n.encode())

    def walk(self, rel: str = "") -> list[str]:
        import obstore

        rel = rel.strip("/")
        out = [o["path"] for chunk in obstore.list(self._store, prefix=f"{rel}/" if rel else None) for o in chunk]
        return sorted(out, key=lambda n: n.encode())

    def delete(self, rel: str) -> None:
        import obstore

        try:
            obstore.delete(self._store, rel)
        except FileNotFoundError:
            pass


class _Reader:
    """A file-like view of obstore's range reader with what ``pyarrow.PythonFile`` asks of one."""

    def __init__(self, reader):
        self._r = reader
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        data = self._r.read(n) if n is not None and n >= 0 else self._r.read()
        return data.to_bytes()

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._r.seek(offset, whence)

    def tell(self) -> int:
        return self._r.tell()

    def size(self) -> int:
        return self._r.size

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True
        self._r.close()


class _Writer:
    """obstore's multipart writer with the position ``pyarrow.PythonFile`` asks for."""

    def __init__(self, writer):
        self._w = writer
        self._pos = 0
        self.closed = False

    def write(self, data) -> int:
        view = memoryview(data).cast("B")  # obstore takes unsigned bytes; pyarrow hands signed ones
        self._w.write(view)
        self._pos += len(view)
        return len(view)

    def tell(self) -> int:
        return self._pos

    def flush(self) -> None:
        pass  # obstore uploads parts as its buffer fills; close completes the upload

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._w.close()


def _storage_error(where: str, e: Exception) -> StorageError:
    """An obstore error as a :class:`StorageError`: its first line (the rest is the client's debug dump)."""
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return StorageError(f"{where}: {type(e).__name__}: {first[:400]}")


def _mapped(method):
    """``method`` raising the store's failures (obstore errors: no bucket, refused credentials, an endpoint that
    cannot be reached) as :class:`StorageError`; a missing object stays a ``FileNotFoundError``."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        from obstore.exceptions import BaseError

        try:
            return method(self, *args, **kwargs)
        except BaseError as e:
            where = self.uri(args[0]) if args and isinstance(args[0], str) else self.uri()
            raise _storage_error(where, e) from None

    return call


for _name in ("exists", "read_bytes", "size", "mtime", "put_if_absent", "write_atomic", "open_input", "open_output",
              "listdir", "walk", "delete"):
    setattr(ObjectStoreFileIO, _name, _mapped(getattr(ObjectStoreFileIO, _name)))
