"""API tokens in the trigger store: what a token may do (:class:`TokenInfo`), how it is kept (only its
SHA-256, :func:`hash_token`), and the store's token methods (:class:`TokenStore`, a base of
:class:`~bitlake.triggers.store.TriggerStore`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import secrets
from collections.abc import Sequence

from pydantic import BaseModel, Field
from sqlalchemy import Engine, insert, select, update
from sqlalchemy.engine import Row

from bitlake.triggers.database import once_more_if_disconnected
from bitlake.triggers.errors import TriggerError
from bitlake.triggers.event import Timestamp, from_micros, now_micros
from bitlake.triggers.models import Role
from bitlake.triggers.tables import TOKENS

TOKEN_PREFIX = "blt_"
MAX_TOKEN_GLOBS = 64


class TokenInfo(BaseModel):
    """A token as the store knows it (never the token itself)."""

    token_id: int
    name: str
    role: Role
    tables: list[str] = Field(description="fnmatch globs of the tables the token may touch")
    created_at: Timestamp
    revoked_at: Timestamp | None

    def allows(self, table: str) -> bool:
        return any(fnmatch.fnmatchcase(table, glob) for glob in self.tables)


def hash_token(token: str) -> str:
    # Tokens are 256 random bits, so a fast hash is as safe as a slow one and keeps every request cheap.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _token(row: Row) -> TokenInfo:
    return TokenInfo(token_id=row.token_id, name=row.name, role=Role(row.role), tables=row.tables,
                     created_at=from_micros(row.created_at),
                     revoked_at=None if row.revoked_at is None else from_micros(row.revoked_at))


class TokenStore:
    """The token methods of :class:`~bitlake.triggers.store.TriggerStore`, which sets the engines."""

    engine: Engine
    _reader: Engine  # the engine for single-statement reads (autocommit on PostgreSQL)

    def create_token(self, role: Role | str, tables: Sequence[str] = ("*",), *, name: str = "") -> str:
        """Create a token and return it; only its hash is stored, so this is the one time it is seen.

        Args:
            role: ``producer`` (register events), ``consumer`` (query, evaluate, acknowledge) or ``admin``.
            tables: fnmatch globs of the tables the token may touch (``*`` for all).
            name: a label for the token list.
        """
        try:
            role = Role(role)
        except ValueError:
            raise TriggerError(f"unknown role {role!r}: producer, consumer or admin") from None
        globs = [tables] if isinstance(tables, str) else list(tables)
        if not globs or len(globs) > MAX_TOKEN_GLOBS or not all(isinstance(g, str) and 0 < len(g) <= 512
                                                                 for g in globs):
            raise TriggerError(f"a token needs 1 to {MAX_TOKEN_GLOBS} table globs of 1 to 512 characters")
        if len(name) > 200:
            raise TriggerError("a token name has at most 200 characters")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.engine.begin() as conn:
            conn.execute(insert(TOKENS), {"name": name, "token_hash": hash_token(token), "role": role.value,
                                                  "tables": globs, "created_at": now_micros(), "revoked_at": None})
        return token

    @once_more_if_disconnected
    def authenticate(self, token: str) -> TokenInfo | None:
        """The token's details, or None when it is unknown or revoked."""
        tk = TOKENS
        with self._reader.connect() as conn:
            row = conn.execute(select(tk).where(tk.c.token_hash == hash_token(token),
                                                tk.c.revoked_at.is_(None))).first()
        return None if row is None else _token(row)

    def revoke_token(self, token_id: int) -> bool:
        """Revoke a token by id; False when there is no such active token."""
        tk = TOKENS
        with self.engine.begin() as conn:
            return bool(conn.execute(update(tk).where(tk.c.token_id == token_id, tk.c.revoked_at.is_(None))
                                     .values(revoked_at=now_micros())).rowcount)

    def tokens(self) -> list[TokenInfo]:
        with self.engine.connect() as conn:
            return [_token(r) for r in conn.execute(select(TOKENS).order_by(TOKENS.c.token_id))]
