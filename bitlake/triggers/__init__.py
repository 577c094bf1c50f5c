"""The trigger service (LakeChime): Data Change Events in a SQL store, partition and snapshot triggers.

- :func:`create_app` - the FastAPI application (``uvicorn --factory bitlake.triggers:create_app``).
- :class:`Client` - its Python client.
- :class:`TriggerStore` - the store itself (SQLite or PostgreSQL), for embedding and administration;
  :func:`bitlake.triggers.store.create_token` creates API tokens.

docs/triggers.md describes the event model, the API, the trigger semantics and the configuration.
"""

from bitlake.triggers.client import Client
from bitlake.triggers.config import TriggerConfig
from bitlake.triggers.errors import (
    BadCursorError,
    EventConflictError,
    EventNotFoundError,
    FlowConflictError,
    FlowNotFoundError,
    TriggerError,
    TriggerServiceError,
)
from bitlake.triggers.event import Event, EventIn, OperationType, TableFormat, decode_events, encode_events
from bitlake.triggers.service import create_app
from bitlake.triggers.store import Role, TriggerStore, create_token
from bitlake.triggers.trigger import PartitionTrigger, SnapshotTrigger

__all__ = [
    "BadCursorError", "Client", "Event", "EventConflictError", "EventIn", "EventNotFoundError", "FlowConflictError",
    "FlowNotFoundError", "OperationType", "PartitionTrigger", "Role", "SnapshotTrigger", "TableFormat",
    "TriggerConfig", "TriggerError", "TriggerServiceError", "TriggerStore", "create_app", "create_token",
    "decode_events", "encode_events",
]
