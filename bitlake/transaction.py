"""The one commit path (docs/architecture.md). Every writer — ingest and MetaGen, revert and replace, tombstone,
vacuum, DML, compaction, schema and property changes, upgrade — plans on a snapshot, writes its files and
publishes its commit here, with the store's put-if-absent of the next version; a writer that lost the race
plans again on the new snapshot (docs/FORMAT.md, "Writing").

The rule this module keeps: **once a commit is published, nothing it names is ever deleted.** A writer deletes
what it wrote only when it has proved its commit did not land: another commit holds the version, or the
version is still free after the failure. When the outcome is unknown — an error or an interrupt during the put
and the log cannot be read to tell, as Iceberg's ``CommitStateUnknownException`` — it deletes nothing and raises
:class:`CommitStateUnknownError`; ``cleanup`` removes the files later if the commit indeed never landed. Once
it landed, an error in the steps after it (the checkpoint, the key index, the upkeep) leaves every file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import logging
import os
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from bitlake import faults
from bitlake.engine.keys import indexsession
from bitlake.engine.write import landing
from bitlake.errors import CommitConflictError, CommitStateUnknownError, InvalidInputError
from bitlake.format import commitlog, layout, rowid
from bitlake.format.commit import Commit
from bitlake.format.state import TableState, write_checkpoint
from bitlake.fs import FileIO
from bitlake.version import __version__

log = logging.getLogger(__name__)

MAX_COMMIT_ATTEMPTS = 30


@dataclasses.dataclass(frozen=True)
class Attempt:
    """What a writer's plan makes of one snapshot: the commit to publish (None: nothing to commit), the files it
    wrote for that commit alone (deleted when the commit proves not to land), and what runs once it landed, given
    the latest snapshot (which holds the commit)."""

    commit: Commit | None
    written: tuple[str, ...] = ()
    after: Callable[[TableState], Any] | None = None


class Replan(Exception):
    """Raised by a plan that found its snapshot already stale: plan again on the latest one."""


class Finished(Exception):
    """Raised by a plan that finds nothing to do: ``result`` is the operation's answer."""

    def __init__(self, result: Any):
        super().__init__(result)
        self.result = result


Plan = Callable[[TableState], Attempt]


class Transaction:
    """One write operation: the files and segment parts it owns, and at most one commit.

    Used as a context manager. What it owns (:meth:`own`, :meth:`claim_part`) is removed when it ends without its
    commit landing, and kept when the commit landed or its outcome is unknown. ``refresh`` returns the latest
    snapshot (:meth:`bitlake.Table.refresh`)."""

    def __init__(self, io: FileIO, refresh: Callable[[], TableState]):
        self.io = io
        self.refresh = refresh
        self.committed: Commit | None = None
        self.unknown = False  # an outcome it could not learn: it deletes nothing
        self._putting: tuple[Commit, bytes] | None = None  # a put whose outcome is not learned yet
        self._files: list[str] = []
        self._parts: list[int] = []
        self._index: indexsession.IndexSession | None = None
        self._started = time.time()

    def __enter__(self) -> Transaction:
        return self

    def __exit__(self, kind, exc, tb) -> None:  # an error goes on up
        try:
            if self._putting is not None and self.committed is None and not self.unknown:
                self._learn_outcome()  # interrupted before it learned what its put did
            if self.committed is None and not self.unknown:
                self._discard()
        except Exception:  # noqa: BLE001 - the operation's own failure is the one to raise; cleanup() removes them
            log.warning("could not remove the files of an operation on %s that did not commit", self.io.uri(),
                        exc_info=True)
        finally:
            if self._index is not None:
                self._index.close()

    def _learn_outcome(self) -> None:
        c, data = self._putting  # type: ignore[misc]
        try:
            if self._landed(c, data, None):
                self.committed = c
        except CommitStateUnknownError:
            pass  # self.unknown is set: nothing is deleted

    @property
    def index(self) -> indexsession.IndexSession:
        """The key index across this operation's attempts (brought to the commit after it lands)."""
        if self._index is None:
            self._index = indexsession.IndexSession(self.io)
        return self._index

    def own(self, *paths: str) -> None:
        """Files written for this operation whatever the attempt: they go unless its commit lands."""
        self._files += paths

    def claim_part(self) -> int:
        """A segment part no other writer has (:func:`claim_part`), whose files go unless the commit lands."""
        part = claim_part(self.io, self.refresh)
        self.own_part(part)
        return part

    def own_part(self, part: int) -> None:
        """A segment part claimed for this operation elsewhere (a Spark write's driver): its files go unless the
        commit lands."""
        self._parts.append(part)

    def _discard(self) -> None:
        for path in self._files:
            _delete(self.io, path)
        for part in self._parts:
            landing.remove_part_files(self.io, part)

    def commit(self, plan: Plan) -> Commit | None:
        """Publishes what ``plan`` makes of the latest snapshot, planning again after a lost race; returns the
        commit, or None when the plan had nothing to commit. A plan's :class:`Finished` passes through."""
        for attempt in range(MAX_COMMIT_ATTEMPTS):
            state = self.refresh()
            try:
                a = plan(state)
            except Replan:
                continue
            except FileNotFoundError:
                if self.refresh().version == state.version:
                    raise
                continue  # a vacuum committed meanwhile deleted a file the plan read: plan on the new snapshot
            if a.commit is None:
                return None
            a = dataclasses.replace(a, commit=dataclasses.replace(a.commit, info=self._info(state, attempt)))
            faults.point("before_commit")
            if not self._publish(a):
                for path in a.written:  # another writer holds the version: no commit can name them
                    _delete(self.io, path)
                time.sleep(random.uniform(0.05, 0.2) * min(attempt + 1, 10))
                continue
            self._after(state, a)
            return a.commit
        raise CommitConflictError(
            f"gave up after {MAX_COMMIT_ATTEMPTS} attempts: other writers kept committing to {self.io.uri()} first"
        )

    def _info(self, state: TableState, attempt: int) -> dict[str, Any]:
        """The commit's ``info`` (docs/FORMAT.md): who wrote it, with what, on which snapshot, after how long."""
        return {"user": user(), "engine": engine(), "read_version": state.version,
                "attempts": attempt + 1, "duration_ms": round((time.time() - self._started) * 1000)}

    def _publish(self, a: Attempt) -> bool:
        """Puts the commit; True when it landed, False when another writer's commit holds its version. On any
        other failure it learns from the log whether the commit landed: if so the failure of an ``Exception``
        is only a lost answer and the commit stands (an interrupt is raised again, the commit kept); if not, and
        the store cannot apply a failed put later (a local disk), the attempt's files go and the failure is
        raised; if the log cannot tell, or an object store may still apply the put, nothing goes and
        :class:`CommitStateUnknownError` is raised."""
        c = a.commit
        assert c is not None
        data = commitlog.encode(c.to_json())
        self._putting = (c, data)
        try:
            self.io.put_if_absent(layout.commit_path(c.version), data)
            faults.point("after_commit")
        except FileExistsError:
            if not self._landed(c, data, None):
                self._putting = None
                return False
        except BaseException as e:
            if not self._landed(c, data, e):
                if self.io.failed_put_may_land_later:
                    self.unknown = True
                    raise CommitStateUnknownError(
                        f"the put of commit {c.version} of {self.io.uri()} failed ({e}) and may still land: its "
                        "files are kept; reopen the table to see, and cleanup() removes them if it did not land"
                    ) from e
                self._putting = None
                for path in a.written:
                    _delete(self.io, path)
                raise
            self.committed = c
            if not isinstance(e, Exception):
                raise
            log.warning("commit %d of %s landed though its put failed (%s)", c.version, self.io.uri(), e)
        self.committed = c
        return True

    def _landed(self, c: Commit, data: bytes, error: BaseException | None) -> bool:
        """Whether the log holds this very commit at its version (its bytes, checksum and all)."""
        try:
            return self.io.read_bytes(layout.commit_path(c.version)) == data
        except FileNotFoundError:
            return False
        except BaseException as e:
            self.unknown = True
            raise CommitStateUnknownError(
                f"cannot tell whether commit {c.version} of {self.io.uri()} landed (the put failed: "
                f"{error or 'version taken'}; reading it back failed: {e}); its files are kept: reopen the table to "
                "see, and cleanup() removes them if it did not land") from error or e

    def _after(self, state: TableState, a: Attempt) -> None:
        """The steps after a commit landed: a checkpoint when one is due, then the plan's own step. A failure
        here is raised, and the commit stands."""
        c = a.commit
        assert c is not None
        if c.version % state.metadata.int_prop("checkpoint.interval") == 0:
            # The snapshot at our own version, not the latest: another writer may already be past it.
            write_checkpoint(self.io, state.applied(c))
        faults.point("after_checkpoint")
        if a.after is not None:
            a.after(self.refresh())


def run(io: FileIO, refresh: Callable[[], TableState], plan: Plan) -> Commit | None:
    """One transaction of one plan: :meth:`Transaction.commit` for a writer that owns no files beyond it."""
    with Transaction(io, refresh) as tx:
        return tx.commit(plan)


def engine() -> str:
    """The writer, as commits name it: ``bitlake <version>`` (the package's own: the installed distribution's, found
    by ``importlib.metadata``, cost a new process 20 ms at its first commit)."""
    return f"bitlake {__version__}"


def user() -> str:
    """Who commits: ``BITLAKE_USER``, else the operating system's user name."""
    name = os.environ.get("BITLAKE_USER")
    if name:
        return name
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid without a name
        return f"uid {os.getuid()}"


def _delete(io: FileIO, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        io.delete(path)


def claim_part(io: FileIO, refresh: Callable[[], TableState]) -> int:
    """Claims a segment part no other landing has: an atomic create of ``_bitlake/parts/<n>`` above every part the
    latest snapshot holds. Cleanup removes the claims of parts a snapshot holds, so the claim is checked against
    the snapshot after it: a part committed meanwhile (its claim maybe gone) is not taken again."""
    listed = [int(n) for n in io.listdir(layout.PARTS_DIR) if n.isdigit()]
    n = max([refresh().max_part, *listed]) + 1
    # A token no other claim holds: an object store's put retried after its answer was lost tells its own claim
    # from another writer's by the bytes (bitlake.fs.objectstore's _create).
    token = uuid.uuid4().hex.encode()
    while True:
        if n > rowid.MAX_PART:
            raise InvalidInputError("the table has used every segment part; copy it into a new table")
        try:
            io.put_if_absent(layout.part_claim_path(n), token)
        except FileExistsError:
            n += 1
            continue
        latest = refresh().max_part
        if latest < n:
            return n
        n = latest + 1
