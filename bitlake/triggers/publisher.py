"""The bitlake producer: registers the Data Change Events of a table's commits, each exactly once.

Every bitlake commit that changes the view carries its events in the commit file
(``commitlog.read(io, v).events``), so an event exists iff its commit does. :func:`publish` registers
the events of every commit not yet published to a target (a :class:`TriggerStore` or a :class:`Client`).
The pattern is **commit, then publish**: a writer publishes after its commit, and any publisher run
drains whatever a writer that crashed in between left unpublished. Registration is idempotent on
``(table, partition, snapshot_id)`` with the same payload (the events are read back from the immutable
commit), so two publishers, a retry or a crash at any point never register an event twice.

To avoid reading the whole commit log on every run, the publisher keeps a cursor per target under the
table: ``_bitlake/published/<target-id>.json`` holding the last version it published there, written
atomically after the registration succeeded. The cursor is an optimisation only: a crash between the
registration and the cursor write makes the next run register those events again, which changes nothing.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from pydantic import ValidationError

from bitlake.errors import InvalidInputError, VersionExpiredError
from bitlake.format import commitlog
from bitlake.format import state as state_mod
from bitlake.table import Table, open_table
from bitlake.triggers.client import Client
from bitlake.triggers.event import MAX_EVENTS_PER_REQUEST, EventIn
from bitlake.triggers.models import Registration

if TYPE_CHECKING:
    from bitlake.triggers.store import TriggerStore

PUBLISHED_DIR = "_bitlake/published"


def target_id(target: TriggerStore | Client) -> str:
    """A stable name of where events go: the service's URL, or the store's database URL without password."""
    if isinstance(target, Client):
        return target.base_url
    from bitlake.triggers.store import TriggerStore  # SQLAlchemy: not needed to publish through a Client

    if isinstance(target, TriggerStore):
        return target.engine.url.render_as_string(hide_password=True)
    raise InvalidInputError(f"publish to a TriggerStore or a Client, not a {type(target).__name__}")


def cursor_path(target: str) -> str:
    return f"{PUBLISHED_DIR}/{hashlib.sha256(target.encode()).hexdigest()[:24]}.json"


def published_version(table: Table, target: str) -> int:
    """The last version whose events the cursor says were registered at ``target`` (0: none)."""
    path = cursor_path(target)
    if not table.io.exists(path):
        return 0
    try:
        doc = json.loads(table.io.read_bytes(path))
        version = int(doc["version"])
    except (ValueError, KeyError, TypeError):
        return 0  # a damaged cursor costs a rescan, never an event
    # A cursor ahead of the log belongs to an earlier table at this path: start over.
    return version if 0 <= version <= table.version else 0


def _write_cursor(table: Table, target: str, version: int) -> None:
    # Two publishers may race; never move the cursor back (it would only cost a rescan, but why).
    if published_version(table, target) >= version:
        return
    body = json.dumps({"target": target, "version": version}, sort_keys=True).encode()
    table.io.write_atomic(cursor_path(target), body)


def _registrable(event: dict, version: int, location: str) -> EventIn:
    """``event`` of commit ``version`` as the service takes it; InvalidInputError, naming the commit and the
    reason, for one it would refuse (docs/triggers.md, "The event", has the limits)."""
    try:
        return EventIn.model_validate(event)
    except ValidationError as e:
        reasons = "; ".join(f"{'.'.join(map(str, d['loc']))}: {d['msg']}" for d in e.errors())
        raise InvalidInputError(f"the event of version {version} of {location} for partition "
                                f"{str(event.get('partition'))[:200]} cannot be registered: {reasons}") from None


def publish(table: Table | str, target: TriggerStore | Client, *, batch_events: int = MAX_EVENTS_PER_REQUEST,
            skip_expired: bool = False) -> list[Registration]:
    """Registers the events of every commit of ``table`` after the target's publish cursor.

    Args:
        table: a :class:`bitlake.Table` or its path.
        target: a :class:`TriggerStore` or a producer :class:`Client` of the service.
        batch_events: events per registration call; the cursor moves after each call.
        skip_expired: when cleanup dropped commits the cursor has not reached (docs/maintenance.md), go on
            from the oldest commit left instead of raising ``VersionExpiredError``.

    Returns:
        One :class:`Registration` per event, in commit order; ``created`` is False for events that were
        already registered (by a publisher that crashed before moving its cursor, or another publisher).
    """
    if isinstance(table, str):
        table = open_table(table)
    name = target_id(target)
    latest = table.refresh().version
    out: list[Registration] = []
    pending: list[EventIn] = []
    # Commits carry the table's logical name; where the table lives is the publisher's knowledge, sent
    # as the events' ``location`` tag so that incremental readers find it.
    location = table.io.uri()
    cursor = published_version(table, name)
    earliest = state_mod.earliest_version(table.io)
    if cursor + 1 < earliest:
        if not skip_expired:
            raise VersionExpiredError(
                f"the publish cursor of {name!r} on {location} is at version {cursor}, but cleanup dropped the "
                f"commits before {earliest} (the retention window): their events are gone; publish with "
                "skip_expired=True (bitlake events publish --skip-expired) to go on from there")
        cursor = earliest - 1
    for version in range(cursor + 1, latest + 1):
        pending.extend(_registrable({**e, "tags": {**e.get("tags", {}), "location": location}}, version, location)
                       for e in commitlog.read(table.io, version).events)
        # Register whole commits at a time, so that the cursor only ever passes fully registered commits.
        if len(pending) >= batch_events or version == latest:
            if pending:
                out.extend(target.register(pending))
                pending = []
            _write_cursor(table, name, version)
    return out
