"""The trigger service (LakeChime): Data Change Events in a SQL store, partition and snapshot triggers.

- :func:`create_app` - the FastAPI application (``uvicorn --factory bitlake.triggers:create_app``).
- :class:`Client` - its Python client.
- :class:`TriggerStore` - the store itself (SQLite or PostgreSQL), for embedding and administration;
  :func:`bitlake.triggers.store.create_token` creates API tokens.
- :func:`publish` - registers the events of a bitlake table's unpublished commits (exactly once).
- :class:`HiveFolderAdapter`, :class:`IcebergAdapter`, :class:`DeltaAdapter` - producers for other tables.
- :func:`snapshot_range`, :func:`read_changes` - the range a batch of events covers, and its rows in Spark.

docs/triggers.md describes the event model, the API, the trigger semantics and the configuration.
"""

from bitlake.triggers.adapters import DeltaAdapter, HiveFolderAdapter, IcebergAdapter
from bitlake.triggers.client import Client
from bitlake.triggers.config import TriggerConfig
from bitlake.triggers.errors import (
    AdapterError,
    BadCursorError,
    BrokenChainError,
    EventConflictError,
    EventNotFoundError,
    FlowConflictError,
    FlowNotFoundError,
    IncrementalReadError,
    TriggerError,
    TriggerServiceError,
)
from bitlake.triggers.event import Event, EventIn, OperationType, TableFormat, decode_events, encode_events
from bitlake.triggers.incremental import SnapshotRange, read_changes, snapshot_range
from bitlake.triggers.publisher import publish
from bitlake.triggers.service import create_app
from bitlake.triggers.store import Role, TriggerStore, create_token
from bitlake.triggers.trigger import PartitionTrigger, SnapshotTrigger

__all__ = [
    "AdapterError", "BadCursorError", "BrokenChainError", "Client", "DeltaAdapter", "Event", "EventConflictError",
    "EventIn", "EventNotFoundError", "FlowConflictError", "FlowNotFoundError", "HiveFolderAdapter", "IcebergAdapter",
    "IncrementalReadError", "OperationType", "PartitionTrigger", "Role", "SnapshotRange", "SnapshotTrigger",
    "TableFormat", "TriggerConfig", "TriggerError", "TriggerServiceError", "TriggerStore", "create_app",
    "create_token", "decode_events", "encode_events", "publish", "read_changes", "snapshot_range",
]
