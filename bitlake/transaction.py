"""The optimistic commit protocol: build a commit against the latest state, put-if-absent the next version,
rebuild on a lost race (docs/FORMAT.md, "Writing"); and the segment-part claims that keep row ids unique.

A lost race proves the commit did not land, so the metadata files built for it are deleted before the
rebuild; anything else (a crash, an unknown error) leaves them for ``cleanup``, since the commit may exist.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from bitlake import faults
from bitlake.errors import CommitConflictError, InvalidInputError
from bitlake.format import commitlog, layout, rowid
from bitlake.format.commit import Commit
from bitlake.format.state import TableState, write_checkpoint
from bitlake.fs import FileIO

MAX_COMMIT_ATTEMPTS = 30


class Rebuild(Exception):
    """Raised by a build that found its state already stale (another writer committed meanwhile)."""


Build = Callable[[TableState], "tuple[Commit | None, list[str]]"]


def commit(io: FileIO, refresh: Callable[[], TableState], build: Build) -> tuple[Commit | None, TableState]:
    """Commits what ``build`` makes of the latest state; returns the commit (None: nothing to commit) and the
    state it was built on. ``build`` returns the commit and the paths of the files it wrote for it."""
    for attempt in range(MAX_COMMIT_ATTEMPTS):
        state = refresh()
        try:
            c, written = build(state)
        except Rebuild:
            continue
        if c is None:
            return None, state
        faults.point("after_metagen")
        try:
            commitlog.write(io, c)
            faults.point("after_commit")
        except FileExistsError:
            for path in written:
                io.delete(path)
            time.sleep(random.uniform(0.05, 0.2) * min(attempt + 1, 10))
            continue
        if c.version % state.metadata.int_prop("checkpoint.interval") == 0:
            # The state at our own version, not the latest: another writer may already be past it.
            at = TableState.from_json(state.to_json())
            at.apply(c)
            write_checkpoint(io, at)
        return c, state
    raise CommitConflictError(
        f"gave up after {MAX_COMMIT_ATTEMPTS} attempts: other writers kept committing to {io.uri()} first"
    )


def claim_part(io: FileIO, state: TableState) -> int:
    """Claims a segment part no other landing has: an atomic create of ``_bitlake/parts/<n>``."""
    listed = [int(n) for n in io.listdir(layout.PARTS_DIR) if n.isdigit()]
    n = max([state.max_part, *listed]) + 1
    while True:
        if n > rowid.MAX_PART:
            raise InvalidInputError("the table has used every segment part; copy it into a new table")
        try:
            io.put_if_absent(layout.part_claim_path(n), b"")
            return n
        except FileExistsError:
            n += 1
