"""The semantics contract of BRIEF.md as a small pure-Python model, independent of bitlake's code."""

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


class Oracle:
    def __init__(self):
        self.history: dict[tuple, list[Accepted]] = {}  # key -> accepted records, in acceptance order

    def apply(self, records: list[Record]) -> dict[str, int]:
        """Applies one batch; returns its counts."""
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
            else:
                counts["deleted" if visible else "ignored_deletes"] += 1
            accepted.append(Accepted(r.delta, r.op, r.row))
        return counts

    def view(self, valid_at: Any = None) -> list[dict]:
        """The rows valid at event time ``valid_at`` (default: the current view)."""
        out = []
        for records in self.history.values():
            chosen = None
            for a in records:
                if valid_at is None or a.delta <= valid_at:
                    chosen = a
            if chosen is not None and chosen.op == "upsert":
                out.append(chosen.row)
        return out


def rows_key(rows: list[dict], columns: list[str]) -> list[tuple]:
    return sorted(tuple(r[c] for c in columns) for r in rows)
