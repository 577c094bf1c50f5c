"""Partition and snapshot triggers (LakeChime): what a scheduler asks and what the service answers.

A **partition trigger** asks "has this partition arrived?". Its partition values may be templates of the
scheduled time (``{{ ds }}``, ``{{ hour - 1h }}``...). The scheduled time is the latest tick
``start + k * frequency * frequency_unit`` (k >= 0) at or before the evaluation time ``at``, or a
``scheduled_time`` the caller gives (Airflow's logical date), or ``at`` itself. It fires when at least one
event of the table has exactly the rendered partition, carries every requested tag and was registered
(``event_ts``) at or before ``at``; it returns those events.

A **snapshot trigger** asks "what changed since my flow's last successful run?". It fires with the events of
the table that carry the requested tags and have an ``event_id`` above the flow's acknowledged cursor; the
cursor moves only when the flow acknowledges a run. docs/triggers.md states both precisely.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
import zoneinfo
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from bitlake.triggers.errors import OutOfRangeError
from bitlake.triggers.event import (
    MAX_PARTITION_DEPTH,
    MAX_PARTITION_JSON_BYTES,
    Event,
    TableName,
    Tags,
    Timestamp,
    checked_text,
)

MAX_FIRED_EVENTS = 1000
MAX_FLOW_NAME_CHARS = 200


class FrequencyUnit(enum.StrEnum):
    MINUTES = "MINUTES"
    HOURS = "HOURS"
    DAYS = "DAYS"


_TEMPLATE = re.compile(r"\{\{(.*?)\}\}")
_EXPRESSION = re.compile(r"\s*([a-z_]+)\s*(?:([+-])\s*(\d{1,6})\s*([mhd]))?\s*")
_FORMATS = {
    "ds": "%Y-%m-%d",
    "ds_nodash": "%Y%m%d",
    "year": "%Y",
    "month": "%m",
    "day": "%d",
    "hour": "%H",
    "minute": "%M",
    "ts_nodash": "%Y%m%dT%H%M%S",
}
VARIABLES = (*_FORMATS, "ts")


def _parse(template: str) -> list[tuple[str, str, int, str] | str]:
    """``template`` as literal text and (variable, sign, amount, unit) parts; ValueError names the fault."""
    parts: list[tuple[str, str, int, str] | str] = []
    pos = 0
    for m in _TEMPLATE.finditer(template):
        parts.append(template[pos:m.start()])
        expr = _EXPRESSION.fullmatch(m[1])
        if expr is None or expr[1] not in VARIABLES:
            raise ValueError(
                f"bad template {m[0]!r}: expected {{{{ VARIABLE }}}} or {{{{ VARIABLE +/- N(m|h|d) }}}} "
                f"with VARIABLE one of {', '.join(VARIABLES)}")
        parts.append((expr[1], expr[2] or "+", int(expr[3] or 0), expr[4] or "d"))
        pos = m.end()
    parts.append(template[pos:])
    for text in parts:
        if isinstance(text, str) and ("{{" in text or "}}" in text):
            raise ValueError(f"unbalanced '{{{{' or '}}}}' in partition template {template!r}")
    return parts


def _shift(when: dt.datetime, sign: str, amount: int, unit: str, tz: dt.tzinfo) -> dt.datetime:
    amount = amount if sign == "+" else -amount
    if unit == "d":
        # Days are calendar days where the template is rendered: 23 or 25 hours across a DST change.
        wall = when.astimezone(tz).replace(tzinfo=None) + dt.timedelta(days=amount)
        return wall.replace(tzinfo=tz)
    return when + (dt.timedelta(minutes=amount) if unit == "m" else dt.timedelta(hours=amount))


def render(template: str, when: dt.datetime, tz: dt.tzinfo = dt.UTC) -> str:
    """``template`` with each ``{{ VARIABLE [+/- N unit] }}`` replaced by ``when`` (shifted) in ``tz``.

    Raises :class:`OutOfRangeError` when a shifted time leaves years 1 to 9999.

    >>> import datetime as dt
    >>> render("{{ ds }}/{{ hour - 1h }}", dt.datetime(2024, 3, 1, 0, 30, tzinfo=dt.UTC))
    '2024-03-01/23'
    >>> render("{{ ds_nodash - 1d }}", dt.datetime(2024, 3, 1, tzinfo=dt.UTC))
    '20240229'
    """
    out = []
    for part in _parse(template):
        if isinstance(part, str):
            out.append(part)
            continue
        name, sign, amount, unit = part
        try:
            local = _shift(when, sign, amount, unit, tz).astimezone(tz)
        except OverflowError:
            raise OutOfRangeError(
                f"partition template {template!r} rendered at {when.isoformat()} leaves the range of dates "
                "(years 1 to 9999)") from None
        out.append(local.isoformat(timespec="seconds") if name == "ts" else local.strftime(_FORMATS[name]))
    return "".join(out)


def render_partition(partition: list[str | None] | None, when: dt.datetime, tz: dt.tzinfo = dt.UTC):
    return None if partition is None else [None if v is None else render(v, when, tz) for v in partition]


def _tick(start: dt.datetime, k: int, frequency: int, unit: FrequencyUnit, tz: dt.tzinfo) -> dt.datetime:
    if k == 0:
        return start
    if unit is FrequencyUnit.DAYS:
        # Daily schedules keep their wall-clock time in ``tz`` (Airflow's behaviour), so a tick is not
        # always 24 hours after the previous one.
        wall = start.astimezone(tz).replace(tzinfo=None) + dt.timedelta(days=k * frequency)
        return wall.replace(tzinfo=tz).astimezone(dt.UTC)
    step = dt.timedelta(minutes=frequency) if unit is FrequencyUnit.MINUTES else dt.timedelta(hours=frequency)
    return start + k * step


def schedule(at: dt.datetime, start: dt.datetime, frequency: int, unit: FrequencyUnit,
             tz: dt.tzinfo = dt.UTC) -> tuple[dt.datetime | None, dt.datetime]:
    """(the latest tick at or before ``at`` or None before ``start``, the tick after ``at``).

    Raises :class:`OutOfRangeError` when one of them is past year 9999.

    >>> import datetime as dt
    >>> start = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    >>> [t.isoformat() for t in schedule(dt.datetime(2024, 1, 1, 7, tzinfo=dt.UTC), start, 6, FrequencyUnit.HOURS)]
    ['2024-01-01T06:00:00+00:00', '2024-01-01T12:00:00+00:00']
    """
    if at < start:
        return None, start
    nominal = {FrequencyUnit.MINUTES: dt.timedelta(minutes=1), FrequencyUnit.HOURS: dt.timedelta(hours=1),
               FrequencyUnit.DAYS: dt.timedelta(days=1)}[unit] * frequency
    k = (at - start) // nominal
    try:
        while k > 0 and _tick(start, k, frequency, unit, tz) > at:
            k -= 1
        while _tick(start, k + 1, frequency, unit, tz) <= at:
            k += 1
        return _tick(start, k, frequency, unit, tz), _tick(start, k + 1, frequency, unit, tz)
    except OverflowError:
        raise OutOfRangeError(
            f"the schedule from {start.isoformat()} every {frequency} {unit.value.lower()} has no tick after "
            f"{at.isoformat()} before year 10000") from None


def _check_template(value: str) -> str:
    _parse(value)
    return value


def _check_timezone(value: str) -> str:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {value!r}") from None
    return value


# A template is bounded like a whole stored partition: what it renders to can match no longer one.
PartitionTemplate = Annotated[str, checked_text(MAX_PARTITION_JSON_BYTES, controls=True),
                              AfterValidator(_check_template)]
FlowName = Annotated[str, Field(min_length=1), checked_text(MAX_FLOW_NAME_CHARS)]
FiredLimit = Annotated[int, Field(strict=True, ge=1, le=MAX_FIRED_EVENTS)]


class PartitionTrigger(BaseModel):
    """A partition trigger to evaluate (POST /triggers/partition)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    table: TableName
    partition: Annotated[list[PartitionTemplate | None], Field(min_length=1, max_length=MAX_PARTITION_DEPTH)] | None
    tags: Tags = Field(default_factory=dict)
    start: Timestamp | None = Field(default=None, description="The first tick of the schedule")
    frequency: Annotated[int, Field(strict=True, ge=1, le=1_000_000)] | None = None
    frequency_unit: FrequencyUnit | None = None
    scheduled_time: Timestamp | None = Field(
        default=None, description="Render the templates at this time instead of a tick of the schedule")
    at: Timestamp | None = Field(default=None, description="The evaluation time; the server's clock by default")
    timezone: Annotated[str, Field(max_length=64), AfterValidator(_check_timezone)] = "UTC"
    limit: FiredLimit = MAX_FIRED_EVENTS

    @model_validator(mode="after")
    def _one_way_to_schedule(self) -> PartitionTrigger:
        if self.scheduled_time is not None and self.start is not None:
            raise ValueError("give either scheduled_time or start (with frequency), not both")
        if (self.frequency is not None or self.frequency_unit is not None) and self.start is None:
            raise ValueError("frequency and frequency_unit need start")
        if self.start is not None and (self.frequency is None or self.frequency_unit is None):
            raise ValueError("start needs frequency and frequency_unit")
        return self

    def evaluate_at(self, now: dt.datetime) -> tuple[dt.datetime, dt.datetime | None, dt.datetime | None]:
        """(evaluation time, scheduled time or None before start, next scheduled time or None)."""
        at = self.at or now
        if self.scheduled_time is not None:
            return at, self.scheduled_time, None
        if self.start is None:
            return at, at, None
        assert self.frequency is not None and self.frequency_unit is not None
        tick, following = schedule(at, self.start, self.frequency, self.frequency_unit,
                                   zoneinfo.ZoneInfo(self.timezone))
        return at, tick, following


class PartitionTriggerResult(BaseModel):
    fired: bool
    table: str
    partition: list[str | None] | None = Field(description="The partition after rendering its templates")
    tags: dict[str, str]
    evaluated_at: Timestamp
    scheduled_time: Timestamp | None = Field(description="Null when the evaluation time is before start")
    next_scheduled_time: Timestamp | None
    has_more: bool = Field(description="More events matched than limit; these are the first by event_id")
    events: list[Event]  # last: the service writes the other fields and appends the database's JSON of these


class SnapshotTrigger(BaseModel):
    """A snapshot trigger to evaluate for a consumer flow (POST /triggers/snapshot)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    flow: FlowName
    table: TableName
    tags: Tags = Field(default_factory=dict)
    start: Timestamp | None = Field(
        default=None, description="Used when the flow is first seen: it ignores events registered before it")
    limit: FiredLimit = MAX_FIRED_EVENTS


class SnapshotAck(BaseModel):
    """A flow's successful run over the events up to ``event_id`` (POST /triggers/snapshot/ack)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    flow: FlowName
    table: TableName
    event_id: Annotated[int, Field(strict=True, ge=1, le=2**63 - 1)]


class FlowCursor(BaseModel):
    """Where a consumer flow stands on one table."""

    flow: str
    table: str
    tags: dict[str, str]
    start: Timestamp | None
    last_event_id: int = Field(description="The last acknowledged event id; 0 before the first ack")
    created_at: Timestamp
    acked_at: Timestamp | None


class SnapshotTriggerResult(BaseModel):
    fired: bool
    cursor: FlowCursor
    has_more: bool = Field(description="More events are pending than limit; ack these, evaluate again")
    events: list[Event] = Field(description="The events after the cursor, by event_id")  # last, as above
