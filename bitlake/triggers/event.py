"""The Data Change Event (LakeChime's DCE) as the trigger service accepts, stores and returns it.

An event says that one commit (``snapshot_id``) of a table changed one partition. Producers send
:class:`EventIn`; the store adds ``event_id`` (increasing) and ``event_ts`` (the registration time) and
hands back :class:`Event`. Registration is idempotent on ``(table, partition, snapshot_id)``.

The JSON encoding of an event, the one the service returns and :func:`encode_events` writes for a Spark
job, is the field names of :class:`Event`, with timestamps as ISO-8601 UTC strings of fixed width
(``2024-01-02T03:04:05.000000Z``) so that they sort as text in time order, ``partition`` a JSON list of
strings (or nulls) or ``null``, and ``tags`` an object of strings. docs/triggers.md has the Spark schema.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import re
import time
from collections.abc import Iterable
from typing import Annotated, Any

import pydantic_core
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    TypeAdapter,
    WithJsonSchema,
)

# Limits of one event. They keep the unique index entry (table, partition, snapshot id) below
# PostgreSQL's B-tree limit of 2,704 bytes, so no valid event can fail at the database: 512 bytes of table
# name, at most 512 bytes of snapshot id (128 characters) and 1,536 bytes of partition JSON, with the
# entry's headers, come to about 2,600 bytes. A bitlake table's name has the same limit
# (bitlake.format.metadata.MAX_NAME_BYTES); its partitions are bounded by their JSON's size alone, so a
# table with many partition columns or long values is refused only when its partition's JSON is too long.
MAX_TABLE_BYTES = 512
MAX_SNAPSHOT_ID_CHARS = 128
MAX_PARTITION_JSON_BYTES = 1536
# Each level takes at least 3 bytes of the JSON ('"",'): no partition within the JSON limit is deeper.
MAX_PARTITION_DEPTH = MAX_PARTITION_JSON_BYTES // 3
MAX_TAGS = 32
MAX_TAG_KEY_CHARS = 128
MAX_TAG_VALUE_CHARS = 4096
MAX_TAGS_JSON_BYTES = 8192
MAX_EVENTS_PER_REQUEST = 1000

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_US = dt.timedelta(microseconds=1)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_TAG_KEY = r"^[A-Za-z0-9_.:/\-]+$"
_DIGITS = re.compile(r"-?\d+")


class TableFormat(enum.StrEnum):
    """How to interpret ``snapshot_id``: a bitlake version, nothing (Hive), an Iceberg snapshot id, a Delta version."""

    BITLAKE = "BITLAKE"
    HIVE = "HIVE"
    ICEBERG = "ICEBERG"
    DELTA = "DELTA"


class OperationType(enum.StrEnum):
    """What the commit did; UPDATE promises nothing (it may have appended, deleted or both)."""

    APPEND = "APPEND"
    DELETE = "DELETE"
    UPDATE = "UPDATE"


def parse_timestamp(value: Any) -> dt.datetime:
    """A UTC datetime from an ISO-8601 string (UTC when it has no zone), epoch milliseconds or a datetime.

    Epoch milliseconds is LakeChime's encoding (a Long); an all-digit string counts as one too, which is how
    a timestamp arrives in a query string.
    """
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        try:
            return value.astimezone(dt.UTC)
        except OverflowError:  # 0001-01-01T00:00+01:00 is in year 0 in UTC: pydantic turns only ValueError into a 422
            raise ValueError(f"{value.isoformat()} is out of range in UTC (years 1 to 9999)") from None
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return EPOCH + dt.timedelta(milliseconds=value)
        except OverflowError:
            raise ValueError(f"epoch milliseconds {value} is out of range") from None
    if isinstance(value, str):
        text = value.strip()
        if _DIGITS.fullmatch(text):
            return parse_timestamp(int(text))
        try:
            parsed = dt.datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"{value!r} is neither an ISO-8601 timestamp nor epoch milliseconds") from None
        return parse_timestamp(parsed)
    raise ValueError("a timestamp is an ISO-8601 string or an integer of epoch milliseconds")


def format_timestamp(value: dt.datetime) -> str:
    """The fixed-width ISO-8601 UTC text of ``value``: ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    if value.tzinfo is not dt.UTC:  # what the store hands out is already UTC: one C call for it
        value = value.astimezone(dt.UTC)
    return value.isoformat(timespec="microseconds")[:-6] + "Z"


def to_micros(value: dt.datetime) -> int:
    """Microseconds since the Unix epoch: how the store keeps every timestamp."""
    return (value - EPOCH) // _ONE_US


def from_micros(value: int) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=value)


def now_micros() -> int:
    """The current time in microseconds since the Unix epoch (a registration's ``event_ts``, for one)."""
    return time.time_ns() // 1000


def checked_text(max_chars: int | None = None, *, max_bytes: int | None = None, controls: bool = False):
    """A pydantic check of a string: encodable UTF-8, no NUL, no control characters unless ``controls``, and
    at most ``max_chars`` characters and ``max_bytes`` bytes of UTF-8."""
    def check(value: str) -> str:
        if value.isascii():  # most text: no surrogates, as many bytes as characters, no encoding needed
            size = len(value)
        else:
            try:
                size = len(value.encode("utf-8"))
            except UnicodeEncodeError:
                raise ValueError("text must be valid Unicode (no lone surrogates)") from None
        if "\x00" in value:
            raise ValueError("text must not contain NUL characters")
        if not controls and _CONTROL.search(value):
            raise ValueError("text must not contain control characters")
        if max_chars is not None and len(value) > max_chars:
            raise ValueError(f"at most {max_chars} characters, got {len(value)}")
        if max_bytes is not None and size > max_bytes:
            raise ValueError(f"at most {max_bytes} bytes in UTF-8, got {size}")
        return value

    return AfterValidator(check)


Timestamp = Annotated[
    dt.datetime,
    BeforeValidator(parse_timestamp),
    PlainSerializer(format_timestamp, return_type=str, when_used="json"),
    WithJsonSchema({"anyOf": [{"type": "string", "format": "date-time"}, {"type": "integer"}],
                    "description": "ISO-8601 (UTC when without zone) or integer epoch milliseconds"},
                   mode="validation"),
    WithJsonSchema({"type": "string", "format": "date-time", "description": "UTC: YYYY-MM-DDTHH:MM:SS.ffffffZ"},
                   mode="serialization"),
]
TableName = Annotated[str, Field(min_length=1), checked_text(max_bytes=MAX_TABLE_BYTES)]
SnapshotId = Annotated[str, Field(min_length=1), checked_text(MAX_SNAPSHOT_ID_CHARS)]
PartitionValue = Annotated[str, checked_text(controls=True)]  # its size is the partition's JSON's
TagKey = Annotated[str, Field(min_length=1, max_length=MAX_TAG_KEY_CHARS, pattern=_TAG_KEY)]
TagValue = Annotated[str, checked_text(MAX_TAG_VALUE_CHARS, controls=True)]


# json.dumps with options builds an encoder per call.
_COMPACT_SORTED = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode


def canonical_partition(partition: list[str | None] | None) -> str:
    """The stored form of a partition: compact JSON, ``null`` for an unpartitioned table.

    Every registered event needs it, so pydantic's JSON writer (Rust) writes it, at a seventh of the cost of
    the json module: the same text as ``json.dumps(partition, ensure_ascii=False, separators=(",", ":"))``
    for every code point (tests/triggers/test_store.py checks them all), so events stored before keep their key.
    """
    return pydantic_core.to_json(partition).decode()


def canonical_tags(tags: dict[str, str]) -> str:
    return _COMPACT_SORTED(tags)


# A character takes at most 6 bytes in this JSON (a \uXXXX escape; others 1 to 4 bytes of UTF-8), a value
# at most 5 more (quotes or null, and a comma), a tag 6 (two pairs of quotes, colon, comma): below these
# bounds the exact size need not be computed, which spares two JSON encodings per registered event. The
# bounds are sums over C iterators: they run for every event of every registration.
def _check_partition(partition: list[str | None] | None) -> list[str | None] | None:
    if partition is None or 2 + 5 * len(partition) + 6 * sum(map(len, filter(None, partition))) \
            <= MAX_PARTITION_JSON_BYTES:
        return partition
    if len(canonical_partition(partition).encode()) > MAX_PARTITION_JSON_BYTES:
        raise ValueError(f"the partition's JSON is longer than {MAX_PARTITION_JSON_BYTES} bytes")
    return partition


def _check_tags(tags: dict[str, str]) -> dict[str, str]:
    if 2 + 6 * (len(tags) + sum(map(len, tags)) + sum(map(len, tags.values()))) <= MAX_TAGS_JSON_BYTES:
        return tags
    if len(canonical_tags(tags).encode()) > MAX_TAGS_JSON_BYTES:
        raise ValueError(f"the tags' JSON is longer than {MAX_TAGS_JSON_BYTES} bytes")
    return tags


PartitionValues = Annotated[
    list[PartitionValue | None],
    Field(min_length=1, max_length=MAX_PARTITION_DEPTH,
          description="One value per partition level (null for a null value); null when the table is unpartitioned"),
    AfterValidator(_check_partition),
]
Tags = Annotated[dict[TagKey, TagValue], Field(max_length=MAX_TAGS), AfterValidator(_check_tags)]


class EventIn(BaseModel):
    """An event as a producer registers it (what ``bitlake.changeevent.commit_events`` produces)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    table: TableName
    partition: PartitionValues | None = None
    snapshot_id: SnapshotId | None = Field(
        default=None, description="The commit, in the table format's terms; null for Hive")
    snapshot_ts: Timestamp | None = None
    prev_snapshot_id: SnapshotId | None = None
    table_format: TableFormat
    operation_type: OperationType
    tags: Tags = Field(default_factory=dict)

    def key(self) -> tuple[str, str, str]:
        """The idempotency key as stored: (table, canonical partition, snapshot id or '')."""
        return self.table, canonical_partition(self.partition), self.snapshot_id or ""


class Event(BaseModel):
    """A registered event: :class:`EventIn` plus what the store assigned."""

    model_config = ConfigDict(frozen=True)

    event_id: int
    event_ts: Timestamp
    table: str
    partition: list[str | None] | None
    snapshot_id: str | None
    snapshot_ts: Timestamp | None
    prev_snapshot_id: str | None
    table_format: TableFormat
    operation_type: OperationType
    tags: dict[str, str]


_EVENTS = TypeAdapter(list[Event])


def encode_events(events: Iterable[Event]) -> str:
    """The events as one JSON array, the documented encoding (e.g. an argument of a Spark job)."""
    return _EVENTS.dump_json(list(events)).decode()


def decode_events(text: str | bytes) -> list[Event]:
    """The inverse of :func:`encode_events`.

    >>> decode_events(encode_events([]))
    []
    """
    return _EVENTS.validate_json(text)
