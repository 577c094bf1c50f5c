"""Token administration: ``python -m bitlake.triggers token create|list|revoke`` (also ``bitlake events token``).

The database is ``--db-url``, else the service's configuration (``BITLAKE_TRIGGERS_*``, see config.py).
``create`` prints the token once; only its hash is stored.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bitlake.triggers.config import TriggerConfig
from bitlake.triggers.errors import TriggerError
from bitlake.triggers.models import Role

DB_URL_HELP = "SQLAlchemy URL of the store (default: the service's configuration)"


def add_token_parser(sub) -> argparse.ArgumentParser:
    """Adds the ``token`` command with its ``create``, ``list`` and ``revoke`` actions to ``sub``."""
    token = sub.add_parser("token", help="create, list or revoke API tokens")
    actions = token.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="create a token and print it (shown only this once)")
    create.add_argument("--role", required=True, choices=[r.value for r in Role])
    create.add_argument("--table", action="append", dest="tables", metavar="GLOB",
                        help="a table glob the token covers (repeatable; default '*')")
    create.add_argument("--name", default="", help="a label shown by 'token list'")
    listing = actions.add_parser("list", help="list tokens (never the tokens themselves)")
    revoke = actions.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("token_id", type=int)
    for p in (create, listing, revoke):
        # SUPPRESS: an action's default must not overwrite a --db-url given before the action.
        p.add_argument("--db-url", default=argparse.SUPPRESS, help=DB_URL_HELP)
    return token


def token_command(args: argparse.Namespace) -> int:
    """Runs a parsed ``token`` action; 1 when there was no active token to revoke. Raises TriggerError."""
    from bitlake.triggers.store import TriggerStore  # SQLAlchemy: only once a token command runs

    config = TriggerConfig.load()
    if getattr(args, "db_url", None):
        config = config.model_copy(update={"db_url": args.db_url})
    with TriggerStore.from_config(config) as store:
        if args.action == "create":
            print(store.create_token(args.role, args.tables or ["*"], name=args.name))
        elif args.action == "list":
            for t in store.tokens():
                state = "revoked" if t.revoked_at else "active"
                print(f"{t.token_id}\t{t.role.value}\t{state}\t{','.join(t.tables)}\t{t.name}")
        elif not store.revoke_token(args.token_id):
            print(f"no active token {args.token_id}", file=sys.stderr)
            return 1
    return 0


def database_error(error: BaseException) -> str | None:
    """The one-line reason of an error of the store's database (a URL that SQLAlchemy cannot parse, a server
    that cannot be reached...), None for any other error. SQLAlchemy is imported only by the commands that
    use the store, so an error of it comes from a module already loaded."""
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is None or not isinstance(error, sa_exc.SQLAlchemyError):
        return None
    cause = error.orig if isinstance(error, sa_exc.DBAPIError) else error
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    first = lines[0] if lines else type(cause).__name__
    if isinstance(error, sa_exc.ArgumentError):
        return f"bad database URL (--db-url): {first}"
    return f"the trigger store's database failed: {first}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bitlake.triggers", description=__doc__.splitlines()[0])
    parser.add_argument("--db-url", help=DB_URL_HELP)
    add_token_parser(parser.add_subparsers(dest="what", required=True))
    args = parser.parse_args(argv)
    try:
        return token_command(args)
    except (TriggerError, ValueError) as e:  # ValueError: a database the store does not run on
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        reason = database_error(e)
        if reason is None:
            raise
        print(f"error: {reason}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
