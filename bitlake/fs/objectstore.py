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

A failed request is retried (:mod:`bitlake.fs.retries`: obstore's retries, and bitlake's for what obstore does
not retry); what still fails is a :class:`StorageError` naming the path and the operation. A conditional put
retried after a try whose answer was lost, and that finds the object holding exactly its bytes, counts as
created: the lost try landed (docs/storage.md, "Faults").
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import threading
import uuid
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa

from bitlake.errors import ConditionalPutUnsupportedError, InvalidInputError, StorageError
from bitlake.fs import FileIO, retries

log = logging.getLogger(__name__)

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
# obstore takes Azure's keys as AZURE_STORAGE_ACCOUNT_NAME or account_name, not storage_account_name: after its
# scheme's prefix, a key loses this one too.
_SUBPREFIXES = {"azure_": "storage_"}
# What obstore's conditional put (mode="create") sends, by scheme, for messages.
_PRECONDITIONS = {"s3": "If-None-Match: *", "s3a": "If-None-Match: *", "gs": "x-goog-if-generation-match: 0",
                  "az": "If-None-Match: *", "abfs": "If-None-Match: *", "abfss": "If-None-Match: *"}
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
            f"case does not matter), the client options {', '.join(sorted(_CLIENT_KEYS))} and the retry options "
            f"{', '.join(retries.KEYS)} (docs/storage.md)")


def _normalize(scheme: str, options: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """``options`` as obstore's store config and client options."""
    prefix = SCHEMES[scheme]
    config, client = {}, {}
    for key, value in options.items():
        k = key.lower()
        bare = k[len(prefix):] if prefix and k.startswith(prefix) else k
        sub = _SUBPREFIXES.get(prefix, "")
        bare = bare[len(sub):] if sub and bare.startswith(sub) else bare
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
        options, self._retry = retries.split_options(storage_options or {})
        self._config, self._client = _configuration(base, scheme, options)
        try:
            self._store = self._open()
        except _UnknownOption as e:
            raise InvalidInputError(unknown_option_message(scheme, str(e), storage_options or {})) from None

    def _open(self, retry: retries.RetryPolicy | None = None):
        from obstore.exceptions import BaseError, UnknownConfigurationKeyError
        from obstore.store import MemoryStore, from_url

        if self.scheme == "memory":
            with _lock:  # one store per base in this process: memory:// tables live as long as it does
                return _memory_stores.setdefault(self.base, MemoryStore())
        try:
            return from_url(self.base, config=self._config or None,  # type: ignore[call-overload]
                            client_options=self._client or None,  # type: ignore[arg-type]
                            retry_config=(retry or self._retry).obstore())
        except UnknownConfigurationKeyError as e:
            found = re.search(r"key: '([^']+)'", str(e))
            raise _UnknownOption(found.group(1) if found else str(e).splitlines()[0]) from None
        except BaseError as e:
            raise _storage_error(self.base, e) from None

    def __getstate__(self) -> dict:
        return {"base": self.base, "scheme": self.scheme, "process_local": self.process_local,
                "_config": self._config, "_client": self._client, "_retry": self._retry}

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

        return _whole(obstore.get(self._store, rel))

    def size(self, rel: str) -> int:
        import obstore

        return int(obstore.head(self._store, rel)["size"])

    def mtime(self, rel: str) -> float:
        import obstore

        return obstore.head(self._store, rel)["last_modified"].timestamp()

    def put_if_absent(self, rel: str, data: bytes) -> None:
        from obstore.exceptions import NotSupportedError

        self._check_conditional_put()
        try:
            created = self._create(rel, data)
        except NotSupportedError as e:
            raise ConditionalPutUnsupportedError(
                f"{self.uri()}: the store cannot put a file only if it is absent ({e}); bitlake commits only to "
                "stores that can (docs/storage.md)") from None
        if not created:
            raise FileExistsError(f"{self.uri(rel)} exists")

    def _create(self, rel: str, data: bytes) -> bool:
        """A conditional put of ``data``: True when it created the object, False when the object was there.

        A conditional put is not idempotent, so obstore does not retry it (its store for them has retries off);
        it is retried here. A try whose answer was lost (a reset, a timeout, a 5xx) may have landed: when a later
        try finds the object there, the object is read back, and holding exactly ``data`` it is this put's own
        (callers put contents no other writer puts: a commit, a claim's token)."""
        import obstore
        from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError

        unknown = False  # a try failed in a way that may have landed

        def once() -> bool:
            nonlocal unknown
            try:
                obstore.put(self._conditional(), rel, data, mode="create")
                return True
            except (AlreadyExistsError, PreconditionError):
                if unknown and self.read_bytes(rel) == data:
                    log.info("the put of %s landed though its answer was lost", self.uri(rel))
                    return True
                return False
            except Exception as e:
                unknown = unknown or retries.transient(e)
                raise

        return retries.call(self._retry, "conditional put", self.uri(rel), once, again=retries.transient,
                            keep=(NotSupportedError,))

    def _conditional(self):
        """The store for conditional puts: obstore's retries off (:meth:`_create` retries them)."""
        store = self.__dict__.get("_conditional_store")
        if store is None:
            no_retry = dataclasses.replace(self._retry, max_retries=0)
            store = self._store if self.scheme == "memory" else self._open(no_retry)
            self._conditional_store = store
        return store

    def _check_conditional_put(self) -> None:
        import obstore
        from obstore.exceptions import NotSupportedError

        key = (self.scheme, urlparse(self.base).netloc, tuple(sorted(self._config.items())))
        if _checked.get(key):
            return
        probe = _PROBE + uuid.uuid4().hex
        try:
            self._create(probe, b"1")
            refused = not self._create(probe, b"2")
        except NotSupportedError:
            refused = False
        finally:
            retries.call(self._retry, "delete", self.uri(probe), lambda: obstore.delete(self._store, probe),
                         again=retries.transient)
        if not refused:
            raise ConditionalPutUnsupportedError(
                f"{self.uri()}: the store accepted a second conditional put "
                f"({_PRECONDITIONS.get(self.scheme, 'create only')}) of one key, so two "
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
            return pa.BufferReader(_whole(result))
        del result  # a large file is read by ranges: a Parquet reader wants its footer and some columns
        reader = obstore.open_reader(self._store, rel, buffer_size=1 << 20)
        return pa.PythonFile(_Reader(reader, self._retry, self.uri(rel)), mode="r")

    def open_output(self, rel: str) -> pa.NativeFile:
        return pa.PythonFile(_Writer(self, rel), mode="w")

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

    def __init__(self, reader, retry: retries.RetryPolicy, where: str):
        self._r = reader
        self._retry = retry
        self._where = where
        self.closed = False

    def read(self, n: int = -1) -> bytes:
        start = self._r.tell()
        want = self._r.size - start if n is None or n < 0 else min(n, max(self._r.size - start, 0))

        def once() -> bytes:
            self._r.seek(start)
            data = (self._r.read(n) if n is not None and n >= 0 else self._r.read()).to_bytes()
            if len(data) != want:
                raise retries.ShortRead(f"read {len(data)} of {want} bytes at {start}")
            return data

        return retries.call(self._retry, "ranged read", self._where, once)

    def seek(self, offset: int, whence: int = 0) -> int:
        return retries.call(self._retry, "seek", self._where, lambda: self._r.seek(offset, whence))

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
    """A new file, with the position ``pyarrow.PythonFile`` asks for. Up to ``_WRITE_BUFFER`` bytes it is kept
    and written with one put when the stream closes (obstore retries a put: the file has a fresh name); a larger
    one becomes obstore's multipart upload. Either way the object appears when the stream closes, never torn."""

    def __init__(self, io: ObjectStoreFileIO, rel: str):
        self._io = io
        self._rel = rel
        self._buffer = bytearray()
        self._w: Any = None  # obstore's WritableFile, once the file outgrows one put
        self._pos = 0
        self.closed = False

    def _call(self, fn):
        return retries.call(self._io._retry, "multipart upload", self._io.uri(self._rel), fn,
                            again=lambda e: False)  # a broken upload cannot be resumed: the caller's write fails

    def write(self, data) -> int:
        import obstore

        view = memoryview(data).cast("B")  # obstore takes unsigned bytes; pyarrow hands signed ones
        if self._w is None:
            self._buffer += view
            if len(self._buffer) > _WRITE_BUFFER:
                self._w = obstore.open_writer(self._io._store, self._rel, buffer_size=_WRITE_BUFFER)
                buffered, self._buffer = bytes(self._buffer), bytearray()
                self._call(lambda: self._w.write(buffered))
        else:
            self._call(lambda: self._w.write(view))
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
            if self._w is None:
                self._io.write_atomic(self._rel, bytes(self._buffer))
                self._buffer = bytearray()
            else:
                self._call(self._w.close)


def _whole(result) -> bytes:
    """The body of a GET of a whole object, checked against the object's size: a body cut short is never
    taken for the file (hyper also refuses one shorter than its Content-Length)."""
    data = result.bytes().to_bytes()
    if len(data) != result.meta["size"]:
        raise retries.ShortRead(f"read {len(data)} of {result.meta['size']} bytes")
    return data


def _storage_error(where: str, e: Exception) -> StorageError:
    """An obstore error as a :class:`StorageError`: its first line (the rest is the client's debug dump)."""
    return retries.storage_error(where, e)


def _mapped(method, again=retries.broken_body):
    """``method`` raising the store's failures (obstore errors: no bucket, refused credentials, an endpoint that
    cannot be reached, a request that failed after obstore's retries) as :class:`StorageError`, after trying
    again what obstore does not retry (:mod:`bitlake.fs.retries`); a missing object stays a
    ``FileNotFoundError``."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        where = self.uri(args[0]) if args and isinstance(args[0], str) else self.uri()
        return retries.call(self._retry, method.__name__.replace("_", " "), where,
                            lambda: method(self, *args, **kwargs), again=again)

    return call


for _name in ("exists", "read_bytes", "size", "mtime", "write_atomic", "open_input", "listdir", "walk"):
    setattr(ObjectStoreFileIO, _name, _mapped(getattr(ObjectStoreFileIO, _name)))
# S3's delete is a POST (?delete), which obstore does not retry after a lost answer; deleting again is harmless.
ObjectStoreFileIO.delete = _mapped(ObjectStoreFileIO.delete, again=retries.transient)  # type: ignore[method-assign]
# Its own retries inside (_create); a failure of the probe or of reading a put back is raised as it came.
ObjectStoreFileIO.put_if_absent = _mapped(  # type: ignore[method-assign]
    ObjectStoreFileIO.put_if_absent, again=lambda e: False)
