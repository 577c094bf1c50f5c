"""Retries of an object store's requests, and its failures as :class:`~bitlake.errors.StorageError`
(docs/storage.md, "Faults").

obstore retries most failed requests itself: a 5xx answer, a connection it could not open or that dropped, a
timeout of a read-only or idempotent request. It does not retry what bitlake retries here: a conditional put
(not idempotent: its first attempt may have landed, and a retry then finds the object there) and an answer whose
body broke off (a listing, the start of a multipart upload, a body shorter than announced). Both follow one
policy, set with delta-rs's ``storage_options`` names: ``max_retries``, ``retry_timeout`` (the deadline from a
request's first attempt), ``backoff_config.init_backoff``, ``backoff_config.max_backoff`` and
``backoff_config.base``; or obstore's ``retry_config`` dict.
"""

from __future__ import annotations

import dataclasses
import random
import re
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from bitlake.errors import InvalidInputError, StorageError

_T = TypeVar("_T")

KEYS = ("max_retries", "retry_timeout", "backoff_config.init_backoff", "backoff_config.max_backoff",
        "backoff_config.base")
_UNITS = {"ns": 1e-9, "nsec": 1e-9, "us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1, "sec": 1,
          "second": 1, "seconds": 1, "m": 60, "min": 60, "minute": 60, "minutes": 60, "h": 3600, "hr": 3600,
          "hour": 3600, "hours": 3600}
# What a failed request's message says when the store or the network, not the request, is at fault.
_TRANSIENT = re.compile(r"error sending request|body error|status code: 5\d\d|timed out|timeout|connection",
                        re.IGNORECASE)
_BODY = re.compile(r"body error", re.IGNORECASE)


class ShortRead(Exception):
    """A read returned fewer bytes than the object holds."""


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how long a failed request is tried again: obstore's ``RetryConfig``, and bitlake's own
    retries of what obstore leaves (durations in seconds)."""

    max_retries: int = 10
    retry_timeout: float = 180.0
    init_backoff: float = 0.1
    max_backoff: float = 15.0
    base: float = 2.0

    def obstore(self) -> dict[str, Any]:
        """The policy as obstore's ``retry_config``."""
        return {"max_retries": self.max_retries, "retry_timeout": timedelta(seconds=self.retry_timeout),
                "backoff": {"init_backoff": timedelta(seconds=self.init_backoff),
                            "max_backoff": timedelta(seconds=self.max_backoff), "base": self.base}}

    def backoffs(self):
        """The waits before each retry: exponential with decorrelated jitter, as obstore's."""
        wait = self.init_backoff
        for _ in range(self.max_retries):
            wait = min(self.max_backoff, random.uniform(self.init_backoff, max(self.init_backoff, wait * self.base)))
            yield wait


def split_options(options: dict[str, Any]) -> tuple[dict[str, Any], RetryPolicy]:
    """``options`` without the retry options, and the policy they set (obstore's defaults for the rest)."""
    rest, given = {}, {}
    for key, value in options.items():
        k = key.lower()
        if k == "retry_config" and isinstance(value, dict):
            backoff = value.get("backoff") or {}
            given.update({k2: v for k2, v in value.items() if k2 != "backoff"})
            given.update({f"backoff_config.{k2}": v for k2, v in backoff.items()})
        elif k in KEYS and value is not None:
            given[k] = value
        else:
            rest[key] = value
    fields: dict[str, Any] = {}
    for key, value in given.items():
        name = key.removeprefix("backoff_config.")
        try:
            if name == "max_retries":
                fields[name] = int(value)
            elif name == "base":
                fields[name] = float(value)
            elif name in ("retry_timeout", "init_backoff", "max_backoff"):
                fields[name] = seconds(value)
            else:
                raise ValueError("unknown key")
        except ValueError:
            raise InvalidInputError(
                f"storage option {key!r}={value!r}: give {', '.join(KEYS)} (a count, durations such as '100ms' or "
                "'3min', a number)") from None
    return rest, RetryPolicy(**fields)


def seconds(value: Any) -> float:
    """A duration in seconds: a number, a ``timedelta`` or a human-readable text (``"1s 500ms"``, ``"3min"``)."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)):
        return float(value)
    spans = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", str(value).strip().lower())
    if not spans or re.sub(r"[\d.\sa-z]", "", str(value)):
        raise ValueError(value)
    total = 0.0
    for number, unit in spans:
        if unit not in _UNITS and unit != "":
            raise ValueError(value)
        total += float(number) * _UNITS.get(unit, 1)
    return total


def transient(e: BaseException) -> bool:
    """Whether a request failed for the store's or the network's sake, so that trying again may succeed."""
    from obstore.exceptions import GenericError

    return isinstance(e, ShortRead) or (isinstance(e, GenericError) and bool(_TRANSIENT.search(_first_line(e))))


def broken_body(e: BaseException) -> bool:
    """Whether an answer broke off in its body: the failures obstore does not retry on its own."""
    from obstore.exceptions import GenericError

    return isinstance(e, ShortRead) or (isinstance(e, GenericError) and bool(_BODY.search(_first_line(e))))


def _first_line(e: BaseException) -> str:
    """The error's own message; the client's debug dump below it names settings such as ``retry_timeout``."""
    return (str(e).strip().splitlines() or [""])[0]


def storage_error(where: str, e: BaseException, operation: str = "", attempts: int = 1) -> StorageError:
    """A store's failure as a :class:`StorageError` in one line: the path, the error, its first line (the rest
    is the client's debug dump), the operation and how often it was tried."""
    first = _first_line(e) or type(e).__name__
    tried = f"; tried {attempts} times" if attempts > 1 else ""
    doing = f" ({operation}{tried})" if operation else ""
    return StorageError(f"{where}: {type(e).__name__}: {first[:400]}{doing}")


def call(policy: RetryPolicy, operation: str, where: str, fn: Callable[[], _T], *,
         again: Callable[[BaseException], bool] = broken_body, keep: tuple[type[BaseException], ...] = ()) -> _T:
    """``fn()``, tried again after a failure ``again`` accepts while the policy allows (its retries, its
    deadline); an obstore failure that remains is raised as a :class:`StorageError`, but for those in ``keep``,
    raised as they are."""
    from obstore.exceptions import BaseError

    start = time.monotonic()
    waits = policy.backoffs()
    attempts = 0
    while True:
        attempts += 1
        try:
            return fn()
        except keep:
            raise
        except (BaseError, ShortRead) as e:
            wait = next(waits, None) if again(e) else None
            if wait is None or time.monotonic() - start + wait > policy.retry_timeout:
                raise storage_error(where, e, operation, attempts) from None
            time.sleep(wait)
