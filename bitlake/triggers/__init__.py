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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        OutOfRangeError,
        TriggerError,
        TriggerServiceError,
    )
    from bitlake.triggers.event import Event, EventIn, OperationType, TableFormat, decode_events, encode_events
    from bitlake.triggers.incremental import SnapshotRange, read_changes, snapshot_range
    from bitlake.triggers.models import Role
    from bitlake.triggers.publisher import publish
    from bitlake.triggers.service import create_app
    from bitlake.triggers.store import TriggerStore, create_token
    from bitlake.triggers.trigger import PartitionTrigger, SnapshotTrigger

# Each name is imported from its module on first use (PEP 562), so that ``import bitlake.triggers.client``
# (and the Airflow provider, the command line) loads neither the service (FastAPI) nor the store (SQLAlchemy).
_EXPORTS = {
    "adapters": ("DeltaAdapter", "HiveFolderAdapter", "IcebergAdapter"),
    "client": ("Client",),
    "config": ("TriggerConfig",),
    "errors": ("AdapterError", "BadCursorError", "BrokenChainError", "EventConflictError", "EventNotFoundError",
               "FlowConflictError", "FlowNotFoundError", "IncrementalReadError", "OutOfRangeError",
               "TriggerError", "TriggerServiceError"),
    "event": ("Event", "EventIn", "OperationType", "TableFormat", "decode_events", "encode_events"),
    "incremental": ("SnapshotRange", "read_changes", "snapshot_range"),
    "models": ("Role",),
    "publisher": ("publish",),
    "service": ("create_app",),
    "store": ("TriggerStore", "create_token"),
    "trigger": ("PartitionTrigger", "SnapshotTrigger"),
}
_MODULES = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "AdapterError", "BadCursorError", "BrokenChainError", "Client", "DeltaAdapter", "Event", "EventConflictError",
    "EventIn", "EventNotFoundError", "FlowConflictError", "FlowNotFoundError", "HiveFolderAdapter", "IcebergAdapter",
    "IncrementalReadError", "OperationType", "OutOfRangeError", "PartitionTrigger", "Role", "SnapshotRange",
    "SnapshotTrigger", "TableFormat", "TriggerConfig", "TriggerError", "TriggerServiceError", "TriggerStore",
    "create_app", "create_token", "decode_events", "encode_events", "publish", "read_changes", "snapshot_range",
]
