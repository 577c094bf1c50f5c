"""The Apache Airflow provider of bitlake's trigger service (docs/airflow.md).

- :class:`~bitlake.airflow.hooks.BitlakeTriggersHook` - an Airflow connection of type ``bitlake_triggers``
  (host = the service URL, password = the token) and the clients built from it.
- :class:`~bitlake.airflow.operators.DataChangeEventOperator` - the events of a table in a time range, or a
  flow's pending events (snapshot trigger), as XCom; :class:`~bitlake.airflow.operators.DataChangeEventAckOperator`
  acknowledges a flow's run.
- :class:`~bitlake.airflow.sensors.DataChangeEventSensor` - waits for a partition or a snapshot trigger to fire;
  deferrable (:class:`~bitlake.airflow.triggers.DataChangeEventTrigger` polls the service in Airflow's triggerer),
  so the wait holds no worker slot.
- ``bitlake/airflow/example_dags/example_bitlake_changes.py`` - the whole loop.

Airflow finds the provider through the ``apache_airflow_provider`` entry point, which names
:func:`get_provider_info`. This module imports nothing from Airflow, so the entry point loads cheaply and
bitlake works without Airflow; the classes above are imported on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from bitlake.version import __version__

_LAZY = {
    "BitlakeTriggersHook": "bitlake.airflow.hooks",
    "DataChangeEventOperator": "bitlake.airflow.operators",
    "DataChangeEventAckOperator": "bitlake.airflow.operators",
    "DataChangeEventSensor": "bitlake.airflow.sensors",
    "DataChangeEventTrigger": "bitlake.airflow.triggers",
}

__all__ = [*_LAZY, "get_provider_info"]


#: How Airflow's connection form shows a ``bitlake_triggers`` connection (host = URL, password = token).
CONNECTION_FIELD_BEHAVIOUR: dict[str, Any] = {
    "hidden_fields": ["login"],
    "relabeling": {"host": "Service URL", "password": "Token", "schema": "Path prefix"},
    "placeholders": {"host": "http://127.0.0.1:8400", "password": "blt_... (a consumer token)",
                     "extra": '{"timeout": 30}'},
}


def get_provider_info() -> dict[str, Any]:
    """What Airflow's ProvidersManager reads (airflow/provider_info.schema.json)."""
    integration = "bitlake trigger service"
    return {
        "package-name": "bitlake",
        "name": "bitlake",
        "description": "Data Change Events of bitlake's trigger service: partition and snapshot triggers, "
                       "a deferrable sensor, an operator returning the events, flow acknowledgement.",
        "versions": [__version__],
        "integrations": [{"integration-name": integration, "tags": ["software"]}],
        "hooks": [{"integration-name": integration, "python-modules": ["bitlake.airflow.hooks"]}],
        "operators": [{"integration-name": integration, "python-modules": ["bitlake.airflow.operators"]}],
        "sensors": [{"integration-name": integration, "python-modules": ["bitlake.airflow.sensors"]}],
        "triggers": [{"integration-name": integration, "python-modules": ["bitlake.airflow.triggers"]}],
        "connection-types": [{"connection-type": "bitlake_triggers", "hook-name": "bitlake trigger service",
                              "hook-class-name": "bitlake.airflow.hooks.BitlakeTriggersHook",
                              "ui-field-behaviour": CONNECTION_FIELD_BEHAVIOUR}],
    }


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
