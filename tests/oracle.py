"""The semantics contract of docs/semantics.md as a small pure-Python model, independent of bitlake's code."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Record:
    key: tuple
    delta: Any
    op: str  # "upsert" | "delete"
    row: dict | None  # the full row for upserts


@dataclasses.dataclass
class Accepted:
    delta: Any
    op: str
    row: dict | None
    version: int = 0


class Oracle:
    def __init__(self):
        self.history: dict[tuple, list[Accepted]] = {}  # key -> accepted records, in acceptance order
        self.changes: list[tuple[str, int, dict]] = []

    def apply(self, records: list[Record], version: int = 0) -> dict[str, int]:
        """Applies one batch, committed at ``version``; returns its counts. Its changes are appended
        to ``self.changes`` as ``(change_type, version, row)``."""
        counts = dict.fromkeys(("inserted", "updated", "deleted", "stale", "ignored_deletes"), 0)
        order = sorted(range(len(records)), key=lambda i: (records[i].delta, i))
        for i in order:
            r = records[i]
            accepted = self.history.setdefault(r.key, [])
            last = accepted[-1] if accepted else None
            if last is not None and r.delta < last.delta:
                counts["stale"] += 1
                continue
            visible = last is not None and last.op == "upsert"
            if r.op == "upsert":
                counts["updated" if visible else "inserted"] += 1
                if visible:
                    self.changes.append(("update_preimage", version, last.row))
                    self.changes.append(("update_postimage", version, r.row))
                else:
                    self.changes.append(("insert", version, r.row))
            else:
                counts["deleted" if visible else "ignored_deletes"] += 1
                if visible:
                    self.changes.append(("delete", version, last.row))
            accepted.append(Accepted(r.delta, r.op, r.row, version))
        return counts

    def view(self, valid_at: Any = None, version: int | None = None) -> list[dict]:
        """The rows valid at event time ``valid_at`` (default: +infinity) as of ``version`` (default: all)."""
        out = []
        for records in self.history.values():
            chosen = None
            for a in records:
                if version is not None and a.version > version:
                    break
                if valid_at is None or a.delta <= valid_at:
                    chosen = a
            if chosen is not None and chosen.op == "upsert":
                out.append(chosen.row)
        return out

    def changes_between(self, start: int, end: int) -> list[tuple]:
        return [c for c in self.changes if start < c[1] <= end]


def rows_key(rows: list[dict], columns: list[str]) -> list[tuple]:
    return sorted(tuple(r[c] for c in columns) for r in rows)
