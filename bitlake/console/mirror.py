"""The console's mirror page: how far a PostgreSQL mirror (bitlake.mirror, docs/cdc.md) has applied its source,
read from the table alone. The mirror names its batches ``snapshot-<slot>`` and ``wal-<slot>-<end LSN in 16 hex
digits>`` (:func:`bitlake.mirror.wal_batch`), and commits each as it applies it: so
the last applied LSN, when it was applied, and the rates of the recent steps are in the snapshot's batches and
their commits. How many bytes of WAL the source has beyond it needs the source: the mirror's own progress
(``bitlake mirror``'s log) says it."""

from __future__ import annotations

import dataclasses
import time

import bitlake
from bitlake.console.lake import when
from bitlake.format import commitlog
from bitlake.mirror import LSN_COLUMN, lsn_text, wal_batch

RECENT = 20  # the steps the rates are measured over


@dataclasses.dataclass
class Step:
    version: int
    time: str
    lsn: str
    changes: int


@dataclasses.dataclass
class MirrorStatus:
    slot: str
    lsn: str  # the end LSN of the last applied step, as PostgreSQL writes it
    applied: str  # when (UTC)
    seconds_since: float
    changes_per_s: float  # over the recent steps
    wal_bytes_per_s: float
    steps: list[Step]


def status(t: bitlake.Table) -> MirrorStatus | None:
    """The mirror's progress, or None for a table no mirror writes (no ``_lsn`` delta column or no WAL batch)."""
    state = t.state()
    if state.metadata.delta_column != LSN_COLUMN:
        return None
    steps = []
    for b in state.parts.values():
        named = wal_batch(b.batch_id)
        if named is not None and b.live_version is not None:
            steps.append((b.live_version, named[1], named[0], b.batch_id))
    if not steps:
        return None
    steps.sort()
    recent = steps[-RECENT:]
    out: list[Step] = []
    times: list[int] = []
    for version, end, _, batch_id in reversed(recent):
        c = commitlog.read(t.io, version)
        counts = c.batch_counts.get(batch_id, c.counts)
        out.append(Step(version, when(c.timestamp_ms), lsn_text(end), sum(counts.values())))
        times.append(c.timestamp_ms)
    span = (times[0] - times[-1]) / 1000 if len(times) > 1 else 0.0
    changes = sum(s.changes for s in out[:-1])  # the changes applied after the oldest step's commit
    wal = recent[-1][1] - recent[0][1]
    return MirrorStatus(slot=recent[-1][2], lsn=lsn_text(recent[-1][1]), applied=out[0].time,
                        seconds_since=max(0.0, time.time() - times[0] / 1000),
                        changes_per_s=changes / span if span else 0.0, wal_bytes_per_s=wal / span if span else 0.0,
                        steps=out)
