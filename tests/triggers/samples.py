"""Sample events for the trigger tests."""

from __future__ import annotations

EVENT = {"table": "db.orders", "partition": ["2024-01-01"], "snapshot_id": "1", "snapshot_ts": "2024-01-01T00:00:00Z",
         "prev_snapshot_id": None, "table_format": "BITLAKE", "operation_type": "APPEND", "tags": {}}


def event(**changes) -> dict:
    """A valid event (as bitlake.changeevent.commit_events makes them), changed where asked."""
    return {**EVENT, **changes}


def commits(table: str, n: int, *, first: int = 1, partition: list | None = None,
            tags: dict | None = None) -> list[dict]:
    """Events of ``n`` chained commits of ``table`` (snapshot ids first .. first+n-1)."""
    return [event(table=table, snapshot_id=str(v), prev_snapshot_id=str(v - 1) if v > 1 else None,
                  partition=partition, tags=tags or {}) for v in range(first, first + n)]
