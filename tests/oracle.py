"""The semantics contract of docs/semantics.md as a small pure-Python model, independent of bitlake's code.

The model keeps every incarnation of every batch (its records, the version that made it live, the version that
reverted or replaced it) and folds the ones a version sees, in the order they were applied, whenever a view
is asked for: a restatement is then simply an incarnation left out from its version on."""

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


@dataclasses.dataclass
class Incarnation:
    batch_id: str | None
    records: list[Record]
    version: int  # made live at
    restated: int | None = None  # reverted or replaced at


COUNTS = ("inserted", "updated", "deleted", "stale", "ignored_deletes")


class Oracle:
    def __init__(self):
        self.incarnations: list[Incarnation] = []  # in the order applied
        self.changes: list[tuple[str, int, dict]] = []
        self.tombstones: list[tuple[int, str, set]] = []  # (version, column, values)
        self.purged: set[int] = set()  # id() of the rows a vacuum removed

    def tombstone(self, column: str, values, version: int) -> None:
        """From ``version`` on, views hide the rows of batches made live before it whose column holds a value."""
        self.tombstones.append((version, column, set(values)))

    def vacuum(self, version: int, key_row) -> None:
        """Removes, from every version, the rows the tombstones hide, and retires them; at ``version`` the keys
        whose current record it removed are deleted (delete records with that record's delta value), their
        change rows being ``key_row(row)``: the key and delta columns alone, the rest gone with the row."""
        newly = {id(r.row) for inc in self.incarnations for r in inc.records
                 if r.row is not None and id(r.row) not in self.purged and self._hidden(r.row, inc.version, None)}
        self.purged |= newly
        self.tombstones = []
        gone = [(key, records[-1]) for key, records in self.history().items()
                if records and records[-1].op == "upsert" and id(records[-1].row) in newly]
        if gone:
            self.apply([Record(key, last.delta, "delete", None) for key, last in gone], version)
            self.changes += [("delete", version, key_row(last.row)) for _, last in gone]

    def _hidden(self, row: dict, made_live: int, version: int | None) -> bool:
        return any(made_live < w and (version is None or w <= version) and row.get(column) in values
                   for w, column, values in self.tombstones)

    # -- writes --------------------------------------------------------------------------------------------

    def apply(self, records: list[Record], version: int = 0, batch_id: str | None = None) -> dict[str, int]:
        """Applies one batch, committed at ``version``; returns its counts. Its changes are appended
        to ``self.changes`` as ``(change_type, version, row)``."""
        history = self.history()
        counts = _fold(history, records, version, self.changes, self.purged)
        self.incarnations.append(Incarnation(batch_id, records, version))
        return counts

    def revert(self, batch_id: str, version: int) -> None:
        """Reverts the current incarnation of ``batch_id`` at ``version``: its change rows are the difference
        between the current views before and after."""
        before = self._current()
        for inc in self.incarnations:
            if inc.batch_id == batch_id and inc.restated is None:
                inc.restated = version
        self._diff(before, version)

    def replace(self, batch_id: str, records: list[Record], version: int) -> None:
        """Reverts ``batch_id`` and applies ``records`` under it, atomically at ``version``; the change rows
        are the difference between the current views before and after."""
        before = self._current()
        for inc in self.incarnations:
            if inc.batch_id == batch_id and inc.restated is None:
                inc.restated = version
        self.incarnations.append(Incarnation(batch_id, records, version))
        self._diff(before, version)

    def _current(self) -> dict[tuple, dict]:
        return {k: rs[-1].row for k, rs in self.history().items() if rs and rs[-1].op == "upsert"
                and id(rs[-1].row) not in self.purged}

    def _diff(self, before: dict[tuple, dict], version: int) -> None:
        """Change rows per key whose current record changed: another record, even with equal values, is an
        update (records are compared by identity, as the table compares row ids)."""
        after = self._current()
        for k in sorted(set(before) | set(after), key=repr):
            old, new = before.get(k), after.get(k)
            if old is new:
                continue
            if old is not None and new is not None:
                self.changes += [("update_preimage", version, old), ("update_postimage", version, new)]
            elif old is not None:
                self.changes.append(("delete", version, old))
            else:
                self.changes.append(("insert", version, new))

    # -- reads ---------------------------------------------------------------------------------------------

    def history(self, version: int | None = None) -> dict[tuple, list[Accepted]]:
        """Per key, the accepted records a version sees (default: the latest), in acceptance order."""
        history: dict[tuple, list[Accepted]] = {}
        for inc in self.incarnations:
            if version is not None and inc.version > version:
                continue
            if inc.restated is not None and (version is None or inc.restated <= version):
                continue
            _fold(history, inc.records, inc.version, None, set())
        return history

    def view(self, valid_at: Any = None, version: int | None = None) -> list[dict]:
        """The rows valid at event time ``valid_at`` (default: +infinity) as of ``version`` (default: all),
        without those tombstones hide or a vacuum removed."""
        out = []
        for records in self.history(version).values():
            chosen = None
            for a in records:
                if valid_at is None or a.delta <= valid_at:
                    chosen = a
            if chosen is not None and chosen.op == "upsert" and id(chosen.row) not in self.purged and \
                    not self._hidden(chosen.row, chosen.version, version):
                out.append(chosen.row)
        return out

    def changes_between(self, start: int, end: int) -> list[tuple]:
        """The change rows of commits ``(start, end]``; a row a vacuum removed gives none."""
        return [c for c in self.changes if start < c[1] <= end and id(c[2]) not in self.purged]


def _fold(history: dict[tuple, list[Accepted]], records: list[Record], version: int, changes: list | None,
          purged: set[int]) -> dict[str, int]:
    """Applies one batch's records to ``history`` in contract order; appends its change rows to ``changes``. A
    record whose row a vacuum ``purged`` has no row to update or delete (a revert may make it a key's last)."""
    counts = dict.fromkeys(COUNTS, 0)
    out = changes if changes is not None else []
    order = sorted(range(len(records)), key=lambda i: (records[i].delta, i))
    for i in order:
        r = records[i]
        accepted = history.setdefault(r.key, [])
        last = accepted[-1] if accepted else None
        if last is not None and r.delta < last.delta:
            counts["stale"] += 1
            continue
        visible = last is not None and last.op == "upsert" and id(last.row) not in purged
        if r.op == "upsert":
            counts["updated" if visible else "inserted"] += 1
            if visible:
                out.append(("update_preimage", version, last.row))
                out.append(("update_postimage", version, r.row))
            else:
                out.append(("insert", version, r.row))
        else:
            counts["deleted" if visible else "ignored_deletes"] += 1
            if visible:
                out.append(("delete", version, last.row))
        accepted.append(Accepted(r.delta, r.op, r.row, version))
    return counts


def rows_key(rows: list[dict], columns: list[str]) -> list[tuple]:
    return sorted(tuple(r[c] for c in columns) for r in rows)
