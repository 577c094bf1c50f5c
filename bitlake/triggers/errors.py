"""Errors of the trigger store and service; ``status_code`` is the HTTP status the service answers with."""

from __future__ import annotations

from bitlake.errors import BitlakeError


class TriggerError(BitlakeError):
    """Base class of the trigger service's errors."""

    status_code = 400


class EventConflictError(TriggerError):
    """An event with the same (table, partition, snapshot_id) exists with a different payload."""

    status_code = 409


class FlowNotFoundError(TriggerError):
    """The flow has never evaluated a snapshot trigger on that table, so there is no cursor to move."""

    status_code = 404


class EventNotFoundError(TriggerError):
    """No event with that id exists on that table."""

    status_code = 404


class FlowConflictError(TriggerError):
    """The flow exists with another tag filter, or an ack would move its cursor backwards."""

    status_code = 409


class BadCursorError(TriggerError):
    """A paging cursor that the service did not hand out."""

    status_code = 400


class OutOfRangeError(TriggerError):
    """A partition trigger whose template or schedule, evaluated, leaves the range of dates (years 1 to 9999)."""

    status_code = 422


class TriggerServiceError(TriggerError):
    """The service answered a :class:`bitlake.triggers.Client` request with an error status."""

    def __init__(self, status_code: int, detail: object):
        self.status_code = status_code
        self.detail = detail
        super().__init__(f"{status_code}: {detail}")


class IncrementalReadError(TriggerError):
    """Events that cannot be read as one range of changes: mixed tables, a range a format cannot return."""


class BrokenChainError(IncrementalReadError):
    """The events do not chain by ``prev_snapshot_id`` into one unbroken range of snapshots."""


class AdapterError(TriggerError):
    """A watched table or folder cannot be read, or an adapter's state file is damaged."""
