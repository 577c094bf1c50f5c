"""The probes' starting point: a copy of a table whose key store this process holds in memory, as a writer that
loaded it holds it (bitlake/engine/keys/keycache.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

import bitlake
from bitlake.engine.keys import keycache
from bitlake.engine.keys.indexsession import close_idle
from bitlake.pool import thread_map


@contextlib.contextmanager
def warm_copy(source: str) -> Iterator[bitlake.Table]:
    """A copy of the table at ``source`` beside it, its key-store files read into this process's memory; the copy
    goes on exit, its key index closed first (``source`` stays as it was)."""
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(source))) as work:
        path = os.path.join(work, "table")
        shutil.copytree(source, path)
        t = bitlake.open_table(path)
        state = t.state()
        thread_map(lambda f: keycache.CACHE.entries(t.io, f, state.metadata),
                   [f for fs in state.keystore.values() for f in fs])
        try:
            yield t
        finally:
            close_idle()
