"""Token administration: ``python -m bitlake.triggers token create|list|revoke``.

The database is ``--db-url``, else the service's configuration (``BITLAKE_TRIGGERS_*``, see config.py).
``create`` prints the token once; only its hash is stored.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from bitlake.triggers.config import TriggerConfig
from bitlake.triggers.errors import TriggerError
from bitlake.triggers.store import Role, TriggerStore


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bitlake.triggers", description=__doc__.splitlines()[0])
    parser.add_argument("--db-url", help="SQLAlchemy URL of the store (default: the service's configuration)")
    sub = parser.add_subparsers(dest="what", required=True)
    token = sub.add_parser("token", help="create, list or revoke API tokens").add_subparsers(dest="action",
                                                                                           required=True)
    create = token.add_parser("create", help="create a token and print it (shown only this once)")
    create.add_argument("--role", required=True, choices=[r.value for r in Role])
    create.add_argument("--table", action="append", dest="tables", metavar="GLOB",
                        help="a table glob the token covers (repeatable; default '*')")
    create.add_argument("--name", default="", help="a label shown by 'token list'")
    token.add_parser("list", help="list tokens (never the tokens themselves)")
    revoke = token.add_parser("revoke", help="revoke a token by id")
    revoke.add_argument("token_id", type=int)
    args = parser.parse_args(argv)

    config = TriggerConfig.load()
    if args.db_url:
        config = config.model_copy(update={"db_url": args.db_url})
    try:
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
    except TriggerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
