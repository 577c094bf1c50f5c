"""``/events``: producers register Data Change Events, consumers query them."""

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from bitlake.triggers.event import (
    MAX_EVENTS_PER_REQUEST,
    MAX_PARTITION_JSON_BYTES,
    EventIn,
    PartitionValues,
    TableName,
    Tags,
    Timestamp,
)
from bitlake.triggers.models import ANY_PARTITION, EventPage, RegistrationResult
from bitlake.triggers.routes.deps import Calls, Consumer, MaxPage, Producer, Registrations, in_scope, page_limit
from bitlake.triggers.routes.responses import json_response, printable, reasons

MAX_PAGE = 1000
DEFAULT_PAGE = 100
_PARTITION = TypeAdapter(PartitionValues | None)
_TAGS = TypeAdapter(Tags)

router = APIRouter(tags=["events"])


class EventBatch(BaseModel):
    """Events to register in one transaction."""

    model_config = ConfigDict(extra="forbid")

    events: list[EventIn] = Field(min_length=1, max_length=MAX_EVENTS_PER_REQUEST)


@router.post("/events", response_model=RegistrationResult)
async def register(batch: EventBatch, info: Producer, registrations: Registrations) -> Response:
    """Register 1 to 1000 events in one transaction (all or nothing); retries return the existing events."""
    for table in sorted({e.table for e in batch.events}):
        in_scope(info, table)
    return json_response(await registrations.register(batch.events))


@router.get("/events", response_model=EventPage)
async def list_events(
    info: Consumer,
    calls: Calls,
    max_page: MaxPage,
    table: Annotated[TableName, Query(description="The table (exact name)")],
    partition: Annotated[str | None, Query(
        description='JSON: a list of values (["2024-01-01","05"]) or null for unpartitioned events')] = None,
    tag: Annotated[list[str] | None, Query(description="key=value; repeat for several; all must match")] = None,
    since: Annotated[Timestamp | None, Query(description="event_ts >= since")] = None,
    until: Annotated[Timestamp | None, Query(description="event_ts < until")] = None,
    min_event_id: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
    max_event_id: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
    cursor: Annotated[str | None, Query(max_length=200, description="next_cursor of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = DEFAULT_PAGE,
) -> Response:
    """Events of a table in event-id order, filtered and paged."""
    in_scope(info, table)
    limit = page_limit(limit, max_page, given=limit != DEFAULT_PAGE)  # the default is lowered, not refused
    wanted = _partition_filter(partition)
    tags = _tag_filter(tag or [])
    return json_response(await calls(lambda s: s.events_json(
        table, partition=wanted, tags=tags, since=since, until=until, min_event_id=min_event_id,
        max_event_id=max_event_id, cursor=cursor, limit=limit)))


def _partition_filter(partition: str | None) -> Any:
    """The store's partition filter for the ``partition`` parameter: any partition when it is absent."""
    if partition is None:
        return ANY_PARTITION
    try:
        return _PARTITION.validate_json(partition)
    except ValidationError as e:
        raise HTTPException(422, f"partition must be JSON: a list of strings (or nulls), at most "
                                 f"{MAX_PARTITION_JSON_BYTES} bytes, or null; {printable(reasons(e))}") from None


def _tag_filter(items: list[str]) -> dict[str, str]:
    """The ``tag`` parameters (``key=value`` each) as the store's tag filter."""
    tags: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise HTTPException(422, f"tag {item[:100]!r} is not key=value")
        tags[key] = value
    try:
        return _TAGS.validate_python(tags)
    except ValidationError as e:
        raise HTTPException(422, f"bad tag filter: {printable(reasons(e))}") from None
