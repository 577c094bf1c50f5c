"""The console's roots: the lake folders and object-store URIs it may show, the rule that keeps every table
path under one of them, and the search for the bitlake tables beneath them (through :mod:`bitlake.fs`)."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from urllib.parse import unquote, urlparse

from bitlake.fs import file_io

# Names that are files, not folders: the search does not list them (a plain Parquet lake holds many).
_FILE_SUFFIXES = (".parquet", ".orc", ".json", ".crc", ".db", ".avro", ".csv", ".txt", ".md")
MAX_DEPTH = 6


class OutsideRoots(ValueError):
    """A path the console does not serve: outside its roots, or spelled with ``..``."""


def _uri_parts(path: str) -> tuple[str, str] | None:
    """``(scheme://netloc, /normal/path)`` of an object-store URI; None for a local path or a ``file://`` URI."""
    if "://" not in path:
        return None
    u = urlparse(path)
    if u.scheme.lower() == "file":
        return None
    segments = unquote(u.path).split("/")
    if ".." in segments:
        raise OutsideRoots(f"{path}: '..' is not allowed in a table path")
    # normpath keeps a leading '//' (POSIX allows it a meaning): strip the slashes first
    path_ = posixpath.normpath("/" + "/".join(segments).lstrip("/")).rstrip("/") or "/"
    return f"{u.scheme.lower()}://{u.netloc}", path_


def _local(path: str) -> str:
    if path.startswith("file://"):
        path = unquote(urlparse(path).path)
    if ".." in path.replace("\\", "/").split("/"):
        raise OutsideRoots(f"{path}: '..' is not allowed in a table path")
    return os.path.realpath(os.path.expanduser(path))  # symlinks resolved: a link out of a root leads outside


def normal(path: str) -> str:
    """The one spelling of ``path`` the console compares: a real absolute local path, or ``scheme://netloc/path``
    without ``.`` segments, doubled or trailing slashes. Raises OutsideRoots for a path with ``..``."""
    parts = _uri_parts(path)
    if parts is None:
        return _local(path)
    return parts[0] + (parts[1] if parts[1] != "/" else "")


def _under(path: str, root: str) -> bool:
    if path == root:
        return True
    return path.startswith(root if root.endswith(("/", os.sep)) else root + ("/" if "://" in root else os.sep))


class Roots:
    """The folders and URIs a console serves; a table path is served when it is one of them or beneath one."""

    def __init__(self, roots: Sequence[str]):
        if not roots:
            raise ValueError("the console needs at least one root")
        self.roots = [normal(r) for r in roots]

    def __iter__(self):
        return iter(self.roots)

    def contains(self, path: str) -> bool:
        try:
            self.check(path)
        except OutsideRoots:
            return False
        return True

    def check(self, path: str) -> str:
        """``path`` in its normal spelling, when it lies under a root; OutsideRoots otherwise."""
        if not path:
            raise OutsideRoots("no table path given")
        p = normal(path)
        if not any(_under(p, r) for r in self.roots):
            raise OutsideRoots(f"{path} is outside the console's roots")
        return p


def find_tables(root: str, *, max_depth: int = MAX_DEPTH) -> list[str]:
    """The bitlake tables at or beneath ``root`` (folders holding ``_bitlake/commits``), found by listing through
    the root's FileIO; the search does not descend into a table, nor into names starting with ``.`` or ``_``."""
    io = file_io(root)
    found: list[str] = []

    def join(rel: str) -> str:
        if not rel:
            return root
        return f"{root.rstrip('/')}/{rel}" if "://" in root else os.path.join(root, rel)

    def visit(rel: str, depth: int) -> None:
        names = io.listdir(rel)
        if "_bitlake" in names and "commits" in io.listdir(posixpath.join(rel, "_bitlake")):
            found.append(join(rel))
            return
        if depth >= max_depth:
            return
        for name in names:
            if not name.startswith((".", "_")) and not name.lower().endswith(_FILE_SUFFIXES):
                visit(posixpath.join(rel, name) if rel else name, depth + 1)

    visit("", 0)
    return found
