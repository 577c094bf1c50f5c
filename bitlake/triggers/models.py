"""The trigger service's answers that its client shares with the store: registrations, pages of events,
token roles. They live apart from :mod:`bitlake.triggers.store` so that the client (and the command line)
import no SQLAlchemy; the store re-exports them under their old names.
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, Field

from bitlake.triggers.event import Event


class Role(enum.StrEnum):
    """What a token may do: producers register events; consumers query, evaluate and acknowledge; admins both."""

    PRODUCER = "producer"
    CONSUMER = "consumer"
    ADMIN = "admin"


class Registration(BaseModel):
    """One registered event and whether this request created it (False: it existed, the request was a retry)."""

    created: bool
    event: Event


class RegistrationResult(BaseModel):
    """The answer to a registration (``POST /events``)."""

    events: list[Registration] = Field(description="One per event sent, in order")


class EventPage(BaseModel):
    next_cursor: str | None = Field(description="Pass as cursor to get the next page; null on the last page")
    events: list[Event]


class _AnyPartition:
    def __repr__(self) -> str:
        return "ANY_PARTITION"


ANY_PARTITION: Any = _AnyPartition()
"""``partition=`` of :meth:`TriggerStore.events` that does not filter (``None`` means unpartitioned)."""
