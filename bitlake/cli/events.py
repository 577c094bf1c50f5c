"""The trigger service's commands: ``serve`` and ``events publish|watch|list|token``."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import bitlake
from bitlake.cli.output import print_grid, say
from bitlake.cli.tables import PATH_HELP, seconds
from bitlake.errors import InvalidInputError
from bitlake.triggers.__main__ import add_token_parser, token_command
from bitlake.triggers.config import TriggerConfig
from bitlake.triggers.errors import TriggerServiceError
from bitlake.triggers.event import encode_events, parse_timestamp
from bitlake.triggers.incremental import require

# rich (bitlake[cli]), httpx (bitlake[client]), pyspark, and the modules that load them or the trigger service's
# stack (FastAPI, SQLAlchemy) or the table library are imported where they are used: `bitlake --help` and the
# commands that need none of them start without them (tests/test_imports.py).
if TYPE_CHECKING:
    from rich.console import Console


def cmd_serve(args, out: Console, err: Console) -> None:
    import uvicorn

    from bitlake.triggers.service import create_app  # FastAPI (bitlake[service]): serve alone loads it

    config = TriggerConfig.load(args.config)
    if args.db_url:
        config = config.model_copy(update={"db_url": args.db_url})
    if (args.token or args.allow_writes) and not args.roots:
        raise InvalidInputError("--token and --allow-writes are the console's: name the lake folders or URIs to show")
    app = create_app(config, console=args.roots or None)
    say(err, f"bitlake trigger service on http://{args.host}:{args.port} (store: "
             f"{_redacted(config.db_url)}); OpenAPI at /docs")
    if args.roots:
        _revoked_at_shutdown(app, _console_tokens(app.state.store, args, err))
    # loop/http "auto" (uvicorn's defaults): uvloop and httptools, which bitlake installs (uvicorn[standard])
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, loop="auto", http="auto")


def _revoked_at_shutdown(app, tokens: list[str]) -> None:
    """A console's own tokens live as long as it runs: they are revoked when the app shuts down, before its
    store closes (uvicorn re-raises SIGTERM and SIGINT once it has shut down, so no code after run() would)."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a):
        async with inner(a) as state:
            try:
                yield state
            finally:
                for token in tokens:
                    info = app.state.store.authenticate(token)
                    if info is not None:
                        app.state.store.revoke_token(info.token_id)

    app.router.lifespan_context = lifespan


def _console_tokens(store, args, err: Console) -> list[str]:
    """Prints the console's addresses, Jupyter's way: with a read token (``--token``, else a fresh consumer token)
    and, with ``--allow-writes``, a second one with a fresh admin token. Returns the tokens made here."""
    made = []
    if args.token:
        info = store.authenticate(args.token)
        if info is None:
            raise InvalidInputError("--token: the service's store does not know this token (or it was revoked)")
        read, kind = args.token, ("read and write" if info.role == "admin" else "read-only") + f", {info.role} token"
    else:
        read, kind = store.create_token("consumer", ["*"], name="console (read)"), "read-only"
        made.append(read)
    base = f"http://{args.host}:{args.port}/"
    say(err, f"bitlake console of {', '.join(args.roots)} ({kind}); open:")
    say(err, f"    {base}?token={read}")
    if args.allow_writes:
        write = store.create_token("admin", ["*"], name="console (write)")
        made.append(write)
        say(err, "to run maintenance and reverts (a write token: keep it to yourself), open:")
        say(err, f"    {base}?token={write}")
    return made


def _redacted(db_url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(db_url).render_as_string(hide_password=True)


@contextlib.contextmanager
def trigger_target(args, *, role: str) -> Iterator[Any]:
    """The service (``--url`` and ``--token``) or the store itself (``--db-url``) a command talks to."""
    if args.db_url:
        from bitlake.triggers.store import TriggerStore  # SQLAlchemy (bitlake[service]): --db-url alone loads it

        with TriggerStore(args.db_url) as store:
            yield store
        return
    url = args.url or os.environ.get("BITLAKE_TRIGGERS_URL")
    token = args.token or os.environ.get("BITLAKE_TRIGGERS_TOKEN")
    if not url or not token:
        raise InvalidInputError(
            f"name the trigger service with --url and a {role} --token (or $BITLAKE_TRIGGERS_URL and "
            "$BITLAKE_TRIGGERS_TOKEN), or its database with --db-url")
    from bitlake.triggers.client import Client  # httpx (see above)

    with Client(url, token) as client:
        yield client


def _registered(registrations) -> str:
    new = sum(r.created for r in registrations)
    return f"{len(registrations)} event(s), {new} new, {len(registrations) - new} already registered"


def cmd_events_publish(args, out: Console, err: Console) -> None:
    from bitlake.triggers.publisher import publish  # the table library and httpx

    table = bitlake.open_table(args.path)
    with trigger_target(args, role="producer") as target:
        registrations = publish(table, target, skip_expired=args.skip_expired)
    versions = sorted({int(r.event.snapshot_id) for r in registrations if r.event.snapshot_id})
    span = f" of versions {versions[0]}..{versions[-1]}" if versions else ""
    say(out, f"published {_registered(registrations)}{span} of {table.name} (version {table.version})")


def watch_state_path(kind: str, location: str, table: str | None, target: str) -> str:
    """Where ``events watch`` keeps an adapter's state by default: one file per (table, target), under
    ``$XDG_STATE_HOME/bitlake/watch`` (``~/.local/state`` when unset)."""
    root = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    digest = hashlib.sha256(json.dumps([kind, location, table, target]).encode()).hexdigest()[:20]
    return os.path.join(root, "bitlake", "watch", f"{kind}-{digest}.json")


def make_adapter(args, target: str):
    from bitlake.triggers.adapters import DeltaAdapter, HiveFolderAdapter, IcebergAdapter  # httpx (the client)

    location = args.location
    table: Any = location
    if args.kind == "iceberg" and args.catalog:
        require("pyiceberg", InvalidInputError)
        from pyiceberg.catalog import load_catalog
        from pyiceberg.exceptions import NoSuchTableError

        try:
            table = load_catalog(args.catalog).load_table(location)
        except (NoSuchTableError, ValueError) as e:
            raise InvalidInputError(f"catalog {args.catalog!r}: cannot load table {location!r}: {e}") from None
    else:
        location = os.path.abspath(location.removeprefix("file://"))
        if not os.path.exists(location):
            raise InvalidInputError(f"no such {args.kind} table or folder: {location}")
        table = location
    state = args.state or watch_state_path(args.kind, location, args.table, target)
    if args.kind == "hive":
        return HiveFolderAdapter(location, state_path=state, table=args.table, file_format=args.file_format)
    if args.kind == "iceberg":
        return IcebergAdapter(table, state_path=state, name=args.table)
    return DeltaAdapter(location, state_path=state, table=args.table)


def cmd_events_watch(args, out: Console, err: Console) -> None:
    import httpx

    from bitlake.triggers.publisher import target_id  # the table library and httpx

    with trigger_target(args, role="producer") as target:
        adapter = make_adapter(args, target_id(target))
        if args.once:
            _watch_round(adapter, target, out)
            return
        say(err, f"watching {args.kind} table {adapter.table} at {adapter.location} every {args.interval:g} s "
                 f"(state: {adapter.state_path})")
        try:
            while True:
                try:
                    _watch_round(adapter, target, out, quiet=True)
                except (httpx.TransportError, TriggerServiceError) as e:
                    # A watcher outlives restarts of the service: report, and try again at the next round.
                    if isinstance(e, TriggerServiceError) and e.status_code < 500:
                        raise
                    say(err, f"bitlake events watch: the service failed ({e}); retrying in {args.interval:g} s")
                time.sleep(args.interval)
        except KeyboardInterrupt:
            return


def _watch_round(adapter, target, out: Console, *, quiet: bool = False) -> None:
    registrations = adapter.emit(target)
    for r in registrations:
        e = r.event
        say(out, f"{'registered' if r.created else 'already had'} event {e.event_id}: {e.table} "
                 f"snapshot {e.snapshot_id} partition {json.dumps(e.partition)} {e.operation_type.value}")
    if not registrations and not quiet:
        say(out, "no new changes")


def cmd_events_list(args, out: Console, err: Console) -> None:
    from rich.table import Table as RichTable
    from rich.text import Text

    if not 1 <= args.limit <= 1000:
        raise InvalidInputError(f"--limit {args.limit}: give 1 to 1000")
    try:
        since, until = (None if t is None else parse_timestamp(t) for t in (args.since, args.until))
    except ValueError as e:
        raise InvalidInputError(f"--since/--until: {e}") from None
    with trigger_target(args, role="consumer") as target:
        page = target.events(args.table, limit=args.limit, since=since, until=until, min_event_id=args.min_event_id)
    if args.json:
        say(out, encode_events(page.events))
        return
    grid = RichTable(title=Text(f"events of {args.table} (first {len(page.events)})"), title_justify="left")
    for c in ("event_id", "event_ts (UTC)", "partition", "snapshot", "prev", "operation", "tags"):
        grid.add_column(c, overflow="fold")
    for event in page.events:
        grid.add_row(str(event.event_id), event.event_ts.strftime("%Y-%m-%d %H:%M:%S"), json.dumps(event.partition),
                     event.snapshot_id or "∅", event.prev_snapshot_id or "∅", event.operation_type.value,
                     ", ".join(f"{k}={v}" for k, v in event.tags.items()))
    print_grid(out, grid)
    if page.next_cursor:
        say(out, f"more events follow: --min-event-id {page.events[-1].event_id + 1}")


def cmd_events_token(args, out: Console, err: Console) -> int:
    return token_command(args)


def add_parsers(sub) -> None:
    """The trigger service commands' sub-parsers."""
    sv = sub.add_parser("serve", help="run the trigger service (FastAPI on uvicorn) and the console")
    sv.add_argument("roots", nargs="*", metavar="ROOT",
                    help="lake folders or URIs (or tables) the console shows (docs/console.md); none: no console")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8400, help="port (default 8400)")
    sv.add_argument("--db-url", help="the store's SQLAlchemy URL (default: $BITLAKE_TRIGGERS_DB_URL, else "
                                     "sqlite:///./bitlake-triggers.db)")
    sv.add_argument("--config", help="a TOML configuration file (default: $BITLAKE_TRIGGERS_CONFIG)")
    sv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                    help="uvicorn's log level")
    sv.add_argument("--token", help="console: the read (consumer) or write (admin) token to print, one the store "
                                    "knows (default: a fresh consumer token, revoked when serve exits)")
    sv.add_argument("--allow-writes", action="store_true",
                    help="console: also make a fresh admin token and print its address (actions: maintain, compact, "
                         "cleanup, vacuum, revert)")
    sv.set_defaults(run=cmd_serve)

    ev = sub.add_parser("events", help="Data Change Events: publish, watch, list; API tokens")
    actions = ev.add_subparsers(dest="action", required=True, metavar="ACTION")

    def target_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--url", help="the trigger service, e.g. http://127.0.0.1:8400 ($BITLAKE_TRIGGERS_URL)")
        parser.add_argument("--token", help="a bearer token ($BITLAKE_TRIGGERS_TOKEN)")
        parser.add_argument("--db-url", help="talk to the store's database directly instead of the service")

    pb = actions.add_parser("publish", help="register the events of a bitlake table's unpublished commits")
    pb.add_argument("path", help=PATH_HELP)
    target_options(pb)
    pb.add_argument("--skip-expired", action="store_true",
                    help="when cleanup dropped commits not yet published, go on from the oldest commit left "
                         "(their events are lost)")
    pb.set_defaults(run=cmd_events_publish)

    w = actions.add_parser("watch", help="register events for a Hive folder's, Iceberg or Delta table's changes")
    w.add_argument("kind", choices=["hive", "iceberg", "delta"])
    w.add_argument("location", help="the table's local folder (or file:// URI); with --catalog an Iceberg identifier")
    target_options(w)
    w.add_argument("--table", help="the table's name in the events (default: its location URI)")
    w.add_argument("--interval", type=seconds, default=30.0, help="seconds between looks (default 30)")
    w.add_argument("--once", action="store_true", help="look once and exit")
    w.add_argument("--state", help="the adapter's state file (default: under $XDG_STATE_HOME/bitlake/watch)")
    w.add_argument("--catalog", help="iceberg: a pyiceberg catalog name (~/.pyiceberg.yaml, PYICEBERG_CATALOG__*)")
    w.add_argument("--file-format", default="parquet", help="hive: the data files' format (default parquet)")
    w.set_defaults(run=cmd_events_watch)

    ls = actions.add_parser("list", help="list a table's events")
    target_options(ls)
    ls.add_argument("--table", required=True, help="the table's name in the events")
    ls.add_argument("--since", help="events registered at or after this time (ISO-8601 or epoch ms)")
    ls.add_argument("--until", help="events registered before this time")
    ls.add_argument("--min-event-id", type=int, help="events from this id on")
    ls.add_argument("--limit", type=int, default=100, help="at most this many (1 to 1000, default 100)")
    ls.add_argument("--json", action="store_true", help="print the events' JSON encoding")
    ls.set_defaults(run=cmd_events_list)
    add_token_parser(actions).set_defaults(run=cmd_events_token)
