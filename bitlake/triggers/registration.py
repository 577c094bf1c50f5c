"""Registration planning: what one registration transaction inserts, and how it answers each request
(:class:`PlannedRegistration`), worked out without the database; the store
(:meth:`~bitlake.triggers.store.TriggerStore.register_together_json`) and the service's direct insert
(storecalls.py) run the plans.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pydantic_core

from bitlake.triggers.errors import EventConflictError
from bitlake.triggers.event import EventIn, format_timestamp, from_micros, now_micros, to_micros
from bitlake.triggers.statements import REGISTRATION_LOCK

# The columns of an event besides its key and registration time: a retry must repeat them exactly.
PAYLOAD = ("snapshot_ts", "prev_snapshot_id", "table_format", "operation_type", "tags")

# What a registration finds for each key of a batch: event id, whether this request created it, the payload
# fields in which the stored event differs from the request's, and the stored event's JSON (None when created).
Found = tuple[int, bool, list[str], str | None]


def event_row(e: EventIn, event_ts: int) -> dict[str, Any]:
    """The ``events`` row of ``e`` registered at ``event_ts`` (microseconds), without its event id."""
    table, partition_json, snapshot_id = e.key()
    return {
        "event_ts": event_ts, "table_name": table, "partition_json": partition_json, "snapshot_id": snapshot_id,
        "snapshot_ts": None if e.snapshot_ts is None else to_micros(e.snapshot_ts),
        "prev_snapshot_id": e.prev_snapshot_id, "table_format": e.table_format.value,
        "operation_type": e.operation_type.value, "tags": e.tags,
    }


def found_inserted(inserted: Iterable[Sequence]) -> dict[tuple[str, str, str], Found]:
    """What a registration finds for the rows an INSERT returned (key columns, then event_id): created events."""
    return {(table, partition, snapshot): (event_id, True, [], None)
            for table, partition, snapshot, event_id in inserted}


class PlannedRegistration:
    """The requests of one registration transaction, validated and keyed: what the store inserts, and how it
    answers each request once it knows the event id of every key (:meth:`answers`).

    Built without the database, so that the service can plan in its event loop and try the insert of new
    events on its own connection (storecalls.py) before it hands the plan's requests to the store.
    """

    def __init__(self, batches: list[list[EventIn]], registered_at: int):
        self.batches, self.registered_at = batches, registered_at
        self.rows = [[event_row(e, registered_at) for e in batch] for batch in batches]
        # the first row of each key, in request order; a later one is a retry of it
        self.unique: dict[tuple[str, str, str], dict[str, Any]] = {}
        for batch_rows in self.rows:
            for r in batch_rows:
                self.unique.setdefault((r["table_name"], r["partition_json"], r["snapshot_id"]), r)

    @classmethod
    def of(cls, requests: Sequence[Iterable[EventIn | Mapping[str, Any]]]) -> PlannedRegistration:
        return cls([[e if isinstance(e, EventIn) else EventIn.model_validate(e) for e in events]
                    for events in requests], now_micros())

    def one_by_one(self) -> list[PlannedRegistration]:
        """Each request as a plan of its own, with the same registration time."""
        return [PlannedRegistration([batch], self.registered_at) for batch in self.batches]

    @property
    def distinct(self) -> bool:
        """No key is repeated: every event may be new."""
        return len(self.unique) == sum(map(len, self.rows))

    @functools.cached_property
    def pg_params(self) -> dict[str, Any]:
        """The parameters of the PostgreSQL INSERT (:data:`~bitlake.triggers.statements.PG_INSERT_NEW` and
        ``PG_INSERT_UNREGISTERED``)."""
        values = list(self.unique.values())
        # pydantic's JSON writer (Rust), three times as fast as the json module; event_ts is ignored: one for all
        return {"rows": pydantic_core.to_json(values).decode(), "event_ts": self.registered_at,
                "lock_key": REGISTRATION_LOCK}

    def answers_inserted(self, inserted: Iterable[Sequence]) -> list[bytes]:
        """:meth:`answers` when every key was inserted: ``inserted`` are the rows
        :data:`~bitlake.triggers.statements.PG_INSERT_NEW` returned."""
        return self.answers(found_inserted(inserted))

    def answers(self, found: Mapping[tuple[str, str, str], Found]) -> list[bytes]:
        """Each request's answer, the JSON of a :class:`RegistrationResult`; raises :class:`EventConflictError`
        for the first event that differs from the one registered under its key."""
        registered_at = format_timestamp(from_micros(self.registered_at))
        answers = []
        for batch, batch_rows in zip(self.batches, self.rows, strict=True):
            out = []
            for e, r in zip(batch, batch_rows, strict=True):
                key = (r["table_name"], r["partition_json"], r["snapshot_id"])
                event_id, created, differs, stored = found[key]
                first = self.unique[key]
                new = created  # drawn by this transaction, which the conflict rolls back: not an id to name
                if r is not first:  # a duplicate of an earlier event of these requests is a retry of it
                    created, differs = False, [f for f in PAYLOAD if r[f] != first[f]]
                if differs:
                    what = (f"table {e.table!r}, partition {e.partition!r}, snapshot {e.snapshot_id!r}")
                    raise EventConflictError(
                        (f"the request holds the event of {what} twice, with different {', '.join(differs)}"
                         if new else f"event {event_id} of {what} is registered with other {', '.join(differs)}")
                        + "; a retry must repeat the event exactly (nothing of this request was registered)")
                out.append({"created": created, "event": json.loads(stored) if stored is not None else {
                    "event_id": event_id, "event_ts": registered_at, "table": e.table, "partition": e.partition,
                    "snapshot_id": e.snapshot_id,
                    "snapshot_ts": None if e.snapshot_ts is None else format_timestamp(e.snapshot_ts),
                    "prev_snapshot_id": e.prev_snapshot_id, "table_format": r["table_format"],
                    "operation_type": r["operation_type"], "tags": r["tags"]}})
            answers.append(pydantic_core.to_json({"events": out}))
        return answers
