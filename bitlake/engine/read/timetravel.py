"""Which version a read means: ``version=``, or the latest commit at or before ``as_of=`` (a commit time)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from bitlake.errors import InvalidInputError, VersionExpiredError, VersionNotFoundError
from bitlake.format import commitlog
from bitlake.format import state as state_mod
from bitlake.format.commit import Window
from bitlake.format.metadata import delta_text
from bitlake.fs import FileIO


def timestamp_ms(value: Any, what: str = "as_of") -> int:
    """A commit-time argument (``as_of``, or the argument ``what`` names) as milliseconds since the epoch."""
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInputError(f"{what} {value!r} is not an ISO-8601 time") from None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return int(value.timestamp() * 1000)
    if isinstance(value, dt.date):
        return int(dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC).timestamp() * 1000)
    raise InvalidInputError(f"{what} must be a datetime, a date or an ISO-8601 string, not {value!r}")


def resolve_version(io: FileIO, latest: int, version: int | None = None, as_of: Any = None, *,
                    names: tuple[str, str] = ("version", "as_of")) -> int:
    """The version a read asks for: ``version``, or the latest commit at or before ``as_of`` (``names``: what
    the caller calls the two in its errors)."""
    vname, tname = names
    if version is not None and as_of is not None:
        raise InvalidInputError(f"give {vname} or {tname}, not both")
    if version is not None:
        if isinstance(version, bool) or not isinstance(version, int):
            raise InvalidInputError(f"{vname} must be an integer, not {version!r}")
        if not 0 <= version <= latest:
            raise VersionNotFoundError(f"{vname} {version} does not exist; the table has versions 0 to {latest}")
        return version
    if as_of is None:
        return latest
    target = timestamp_ms(as_of, tname)
    earliest = state_mod.earliest_version(io)
    first = commitlog.read(io, earliest).timestamp_ms
    if target < first:
        when = _iso(first)
        if earliest:
            raise VersionExpiredError(f"{tname} {as_of} is before the retention window: the table keeps versions "
                                      f"from {earliest}, committed at {when}")
        raise VersionNotFoundError(f"{tname} {as_of} is before the table's first commit at {when}")
    return commitlog.last_at_or_before(io, earliest, latest, target)


def first_at_or_after(io: FileIO, latest: int, when: Any, what: str = "starting_timestamp") -> int:
    """The first version committed at or after the time ``when`` (Delta's reading of a change feed's
    ``startingTimestamp``); VersionNotFoundError when the latest commit is older, VersionExpiredError when
    the commits it could be were dropped by cleanup."""
    target = timestamp_ms(when, what)
    if isinstance(when, (str, dt.datetime)) and _sub_ms(when):
        target += 1  # a time inside a millisecond comes after a commit of that millisecond
    last = commitlog.read(io, latest).timestamp_ms
    if target > last:
        raise VersionNotFoundError(f"{what} {when} is after the latest commit, version {latest} at {_iso(last)}")
    earliest = state_mod.earliest_version(io)
    first = commitlog.read(io, earliest).timestamp_ms
    if target < first and earliest:
        raise VersionExpiredError(f"{what} {when} is before the retention window: the table keeps versions from "
                                  f"{earliest}, committed at {_iso(first)}")
    lo, hi = earliest, latest
    while lo < hi:
        mid = (lo + hi) // 2
        if commitlog.read(io, mid).timestamp_ms >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _sub_ms(when: str | dt.datetime) -> bool:
    """Whether a time has a fraction of a millisecond (commit times are whole milliseconds)."""
    if isinstance(when, str):
        when = dt.datetime.fromisoformat(when.replace("Z", "+00:00"))
    return when.microsecond % 1000 != 0


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat()


def inside_window(io: FileIO, window: Window | None, version: int) -> int:
    """``version``, or the window's first version when the window starts at the commit just after it: a major
    compaction with its look-back at the latest version ``w`` starts the window at its own commit, ``w + 1``, so
    that cleanup can release the files it replaced, and that commit reads the same as ``w`` (a compaction
    changes no view, and has no change row), so a read of ``w`` reads it."""
    if window is not None and version == window.version - 1:
        c = commitlog.read(io, window.version)
        if c.window is not None and c.window.version == c.version:
            return window.version
    return version


def check_window(window: Window | None, version: int, valid_at: int | None = None, what: str = "version") -> None:
    """Refuses a read outside the retention window a major compaction set (``VersionExpiredError``)."""
    if window is None:
        return
    span = window_text(window)
    if version < window.version:
        raise VersionExpiredError(f"{what} {version} is before the retention window: {span} (a major compaction "
                                  "purged the rest)")
    if valid_at is not None and window.watermark is not None and valid_at < window.watermark:
        raise VersionExpiredError(f"valid_at {delta_text(valid_at, window.delta_type)} is before the retention "
                                  f"window: {span} (a major compaction purged the rest)")


def window_text(window: Window) -> str:
    """What a retention window keeps, in words: its first version and, on a keyed table, its first event time
    (ISO-8601 for a time or date delta column)."""
    return f"the table keeps versions from {window.version}" + (
        f" and event times from {delta_text(window.watermark, window.delta_type)}"
        if window.watermark is not None else "")
