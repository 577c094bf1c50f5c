"""The ``bitlake`` command line: create, ingest, metagen, show, changes, history, describe, cleanup; the
trigger service (``serve``) and its events (``events publish|watch|list|token``).

Errors bitlake raises on purpose (:class:`bitlake.BitlakeError`) print one line and exit with 2, like
argparse's usage errors; any other Spark error (a missing path, a CSV value that does not cast) prints
its first line and exits with 1.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import pyarrow as pa
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table as RichTable
from rich.text import Text

import bitlake
from bitlake.errors import BitlakeError, InvalidInputError
from bitlake.schema import to_arrow_schema

TYPES = {
    "bool": pa.bool_(), "boolean": pa.bool_(),
    "int8": pa.int8(), "byte": pa.int8(),
    "int16": pa.int16(), "short": pa.int16(),
    "int32": pa.int32(), "int": pa.int32(), "integer": pa.int32(),
    "int64": pa.int64(), "long": pa.int64(), "bigint": pa.int64(),
    "float": pa.float32(), "float32": pa.float32(),
    "double": pa.float64(), "float64": pa.float64(),
    "string": pa.string(), "binary": pa.binary(),
    "date": pa.date32(), "date32": pa.date32(), "date32[day]": pa.date32(),
    # Spark's TIMESTAMP is an instant (Arrow: with a time zone); TIMESTAMP_NTZ is the local kind.
    "timestamp": pa.timestamp("us", tz="UTC"), "timestamp[us, tz=UTC]": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"), "timestamp[us]": pa.timestamp("us"),
}
_LOWER_TYPES = {name.lower(): t for name, t in TYPES.items()}  # names are matched case-insensitively
_DECIMAL = re.compile(r"decimal(?:128)?\((\d+),\s*(\d+)\)")
INPUT_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv",
                 ".json": "json", ".jsonl": "json", ".ndjson": "json"}


def parse_type(text: str) -> pa.DataType:
    """A type name of the compact spec (``int64``, ``timestamp``, ``decimal(10,2)``…) as an Arrow type."""
    name = text.strip().lower()
    if name in _LOWER_TYPES:
        return _LOWER_TYPES[name]
    m = _DECIMAL.fullmatch(name)
    if m:
        return pa.decimal128(int(m[1]), int(m[2]))
    known = ", ".join(sorted(t for t in TYPES if "[" not in t))
    raise InvalidInputError(f"unknown column type {text!r}; known: {known}, decimal(p,s)")


def parse_schema(spec: str) -> pa.Schema:
    """``id:int64,name:string`` or a JSON file: a list of ``{name, type, nullable}`` (what ``describe``
    prints under ``columns``), an object holding such a list under ``columns``, or a Spark StructType."""
    if os.path.isfile(spec):
        with open(spec) as f:
            try:
                doc = json.load(f)
            except json.JSONDecodeError as e:
                raise InvalidInputError(f"schema file {spec} is not valid JSON: {e}") from None
        if isinstance(doc, dict) and doc.get("type") == "struct":
            from pyspark.sql.types import StructType

            return to_arrow_schema(StructType.fromJson(doc))
        columns = doc.get("columns") if isinstance(doc, dict) else doc
        if not isinstance(columns, list) or not all(isinstance(c, dict) and "name" in c and "type" in c
                                                    for c in columns):
            raise InvalidInputError(f"schema file {spec} holds no list of {{name, type}} columns")
        return pa.schema([pa.field(c["name"], parse_type(c["type"]), c.get("nullable", True))
                          for c in columns])
    fields = []
    for item in re.split(r",(?![^(]*\))", spec):  # not the comma of decimal(p,s)
        name, sep, type_name = item.partition(":")
        if not sep or not name.strip():
            raise InvalidInputError(f"schema item {item!r} is not name:type (and {spec!r} is not a file)")
        fields.append(pa.field(name.strip(), parse_type(type_name)))
    return pa.schema(fields)


def _columns(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


@contextlib.contextmanager
def step(console: Console, description: str) -> Iterator[None]:
    """A spinner with the step name and its elapsed time while the step runs, then a summary line.

    Off a terminal (CI logs, pipes) there is no spinner: the step is logged when it starts instead.
    """
    start = time.monotonic()
    if console.is_terminal:
        progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                            console=console, transient=True)
        with progress:
            progress.add_task(description, total=None)
            yield
    else:
        say(console, f"{description} ...")
        yield
    say(console, f"{description}: {time.monotonic() - start:.1f} s", style="dim")


def say(console: Console, text: str, style: str | None = None) -> None:
    """One line, as is: paths and batch ids are not rich markup, and long lines are not wrapped."""
    console.print(text, style=style, highlight=False, markup=False, soft_wrap=True)


# ------------------------------------------------------------------------------------------ commands


def cmd_create(args, out: Console, err: Console) -> None:
    table = bitlake.create_table(
        args.path, parse_schema(args.schema), primary_key=_columns(args.primary_key),
        delta_column=args.delta_column, partition_by=_columns(args.partition_by),
        file_format=args.format, num_buckets=args.buckets,
    )
    meta = table.metadata
    kind = f"keyed on {', '.join(meta.primary_key)} by {meta.delta_column}" if meta.keyed else "append-only"
    say(out, f"created table {table.path}, {kind} (version {table.version})")


def input_format(paths: list[str], given: str | None) -> str:
    """Checks the inputs exist (before Spark starts) and returns their format."""
    for p in paths:
        if not os.path.exists(p):
            raise InvalidInputError(f"no such input file: {p}")
    fmt = given or INPUT_FORMATS.get(os.path.splitext(paths[0].rstrip("/"))[1].lower())
    if fmt is None:
        raise InvalidInputError(
            f"cannot tell the format of {paths[0]}: pass --input-format parquet, csv or json")
    return fmt


def read_input(spark, table: bitlake.Table, paths: list[str], fmt: str):
    """The input files as one Spark DataFrame.

    Parquet keeps its types (bitlake checks them against the table). CSV and JSON lines are read
    without a schema, which Spark would apply by position to a CSV header and which would silently
    drop unknown JSON fields; the table's columns are then cast by name, and any other column is
    left for bitlake to reject (or to serve as the op column).
    """
    from pyspark.sql import functions as F

    from bitlake.schema import spark_schema

    if fmt == "parquet":
        return spark.read.parquet(*paths)
    df = spark.read.option("header", True).csv(paths) if fmt == "csv" else spark.read.json(paths)
    types = {f.name.lower(): f.dataType for f in spark_schema(table.metadata.schema).fields}
    return df.select(*[F.col(c).cast(types[c.lower()]).alias(c) if c.lower() in types else F.col(c)
                       for c in df.columns])


def cmd_ingest(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    fmt = input_format(args.inputs, args.input_format)
    with step(err, "starting Spark"):
        spark = bitlake.spark_session()
    df = read_input(spark, table, args.inputs, fmt)
    what = "landing" if args.no_metagen else "landing and MetaGen"
    with step(err, f"{what} of {', '.join(args.inputs)}"):
        r = table.ingest(df, op_column=args.op_column, batch_id=args.batch_id, metagen=not args.no_metagen,
                         inline=METAGEN_MODES[args.metagen_mode], spark=spark)
    if not r.committed:
        say(out, f"batch {r.batch_id} was already committed at version {r.version}: nothing done")
    elif not r.visible:
        say(out, f"batch {r.batch_id} landed at version {r.version}, pending: `bitlake metagen {args.path}`")
    else:
        say(out, f"batch {r.batch_id} committed at version {r.version}: {_counts(r.counts)}")


# --metagen-mode -> Table.ingest's ``inline`` argument.
METAGEN_MODES = {"auto": None, "inline": True, "spark": False}


def cmd_metagen(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    pending = [b.batch_id for b in table.refresh().pending]
    if not pending:
        say(out, "no pending batches: nothing to do")
        return
    with step(err, "starting Spark"):
        spark = bitlake.spark_session()
    with step(err, f"MetaGen of {len(pending)} pending batch(es)"):
        r = table.metagen(inline=METAGEN_MODES[args.metagen_mode], spark=spark)
    say(out, f"batches {', '.join(pending)} visible at version {r.version}: {_counts(r.counts)}")


def _valid_at(table: bitlake.Table, text: str | None):
    """``--valid-at`` as the delta column wants it: an integer for integer columns, else ISO text."""
    if text is None or not pa.types.is_integer(table.metadata.delta_type):
        return text
    try:
        return int(text)
    except ValueError:
        raise InvalidInputError(f"--valid-at {text!r}: the delta column is an integer column") from None


def cmd_show(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    meta = table.metadata
    valid_at = _valid_at(table, args.valid_at) if meta.keyed else args.valid_at
    version = table._view_state(args.version, args.as_of, valid_at)[0].version
    with step(err, "starting Spark"):
        spark = bitlake.spark_session()
    what = "the current view" if args.version is None and args.as_of is None else f"version {version}"
    if valid_at is not None:
        what += f" valid at {valid_at}"
    with step(err, f"reading {what}"):
        df = table.to_spark(spark, version=version, valid_at=valid_at, include_row_ids=args.row_ids)
        total = df.count()
        # orderBy + limit runs as a top-k per partition: no full sort of the view.
        rows = (df.orderBy(*meta.primary_key) if meta.keyed else df).limit(args.limit).collect()
    out.print(render_rows(df.columns, [tuple(r) for r in rows],
                          title=f"{table.path} @ {what}: {total} rows, first {len(rows)}"))


def cmd_changes(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    types = _columns(args.change_types)
    with step(err, "starting Spark"):
        spark = bitlake.spark_session()
    with step(err, f"reading the changes after version {args.start_version}"):
        df = table.changes(spark, start_version=args.start_version, end_version=args.end_version,
                           change_types=types)
        rows = df.limit(args.limit).collect()
    out.print(render_rows(df.columns, [tuple(r) for r in rows],
                          title=f"{table.path}: changes after version {args.start_version}, first {len(rows)}"))


def cmd_history(args, out: Console, err: Console) -> None:
    history = bitlake.open_table(args.path).history()
    if args.json:
        out.print_json(data=history)
    else:
        out.print(render_history(history))


def cmd_describe(args, out: Console, err: Console) -> None:
    out.print_json(data=bitlake.open_table(args.path).describe())


def cmd_cleanup(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    removed = table.cleanup(min_age_seconds=args.min_age_seconds, dry_run=args.dry_run)
    for rel in removed:
        say(out, rel)
    verb = "would remove" if args.dry_run else "removed"
    say(out, f"{verb} {len(removed)} unreferenced file(s)")


# --------------------------------------------------------------------------------- trigger service


def cmd_serve(args, out: Console, err: Console) -> None:
    import uvicorn

    from bitlake.triggers import TriggerConfig, create_app

    config = TriggerConfig.load(args.config)
    if args.db_url:
        config = config.model_copy(update={"db_url": args.db_url})
    say(err, f"bitlake trigger service on http://{args.host}:{args.port} (store: "
             f"{_redacted(config.db_url)}); OpenAPI at /docs")
    # loop/http "auto" (uvicorn's defaults): uvloop and httptools, which bitlake installs (uvicorn[standard])
    uvicorn.run(create_app(config), host=args.host, port=args.port, log_level=args.log_level,
                loop="auto", http="auto")


def _redacted(db_url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(db_url).render_as_string(hide_password=True)


@contextlib.contextmanager
def trigger_target(args, *, role: str) -> Iterator[Any]:
    """The service (``--url`` and ``--token``) or the store itself (``--db-url``) a command talks to."""
    from bitlake.triggers import Client, TriggerStore

    if args.db_url:
        with TriggerStore(args.db_url) as store:
            yield store
        return
    url = args.url or os.environ.get("BITLAKE_TRIGGERS_URL")
    token = args.token or os.environ.get("BITLAKE_TRIGGERS_TOKEN")
    if not url or not token:
        raise InvalidInputError(
            f"name the trigger service with --url and a {role} --token (or $BITLAKE_TRIGGERS_URL and "
            "$BITLAKE_TRIGGERS_TOKEN), or its database with --db-url")
    with Client(url, token) as client:
        yield client


def _registered(registrations) -> str:
    new = sum(r.created for r in registrations)
    return f"{len(registrations)} event(s), {new} new, {len(registrations) - new} already registered"


def cmd_events_publish(args, out: Console, err: Console) -> None:
    from bitlake.triggers import publish

    table = bitlake.open_table(args.path)
    with trigger_target(args, role="producer") as target:
        registrations = publish(table, target)
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
    from bitlake.triggers.adapters import DeltaAdapter, HiveFolderAdapter, IcebergAdapter
    from bitlake.triggers.incremental import require

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
    from bitlake.triggers import TriggerServiceError
    from bitlake.triggers.publisher import target_id

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
    from bitlake.triggers import encode_events
    from bitlake.triggers.event import parse_timestamp

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
    out.print(grid)
    if page.next_cursor:
        say(out, f"more events follow: --min-event-id {page.events[-1].event_id + 1}")


def cmd_events_token(args, out: Console, err: Console) -> int:
    from bitlake.triggers.__main__ import token_command

    return token_command(args)


# ------------------------------------------------------------------------------------------- output


def _first_line(e: Exception) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    # An error in a Python worker carries the worker's traceback, whose last line names the error.
    raised = [line for line in lines if re.match(r"[\w.]+(Error|Exception): ", line)]
    return raised[-1] if raised else lines[0] if lines else type(e).__name__


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in counts.items()) or "no counts"


def render_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str = "") -> RichTable:
    grid = RichTable(title=Text(title), title_justify="left")
    for c in columns:
        grid.add_column(c, overflow="fold")
    for row in rows:
        grid.add_row(*("∅" if v is None else str(v) for v in row))
    return grid


def render_history(history: list[dict[str, Any]]) -> RichTable:
    grid = RichTable(title="history (newest first)", title_justify="left")
    for c in ("version", "time (UTC)", "operation", "batch", "counts"):
        grid.add_column(c, overflow="fold")
    for h in history:
        batch = h["batch_id"] or ", ".join(h["processed"])
        counts = ", ".join(f"{k}={v}" for k, v in h["counts"].items() if v)
        when = h["timestamp"][:19].replace("T", " ")
        grid.add_row(str(h["version"]), when, h["operation"], batch, counts)
    return grid


# ------------------------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bitlake", description="Mutable tables on an immutable data lake.")
    p.add_argument("--version", action="version", version=f"bitlake {bitlake.__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    path_help = "the table's folder (or file:// URI)"
    mode_help = ("how MetaGen runs: inline on the driver with the RocksDB key index, a Spark job, or auto "
                 "(inline up to the table's metagen.inline_max_rows records; default)")

    c = sub.add_parser("create", help="create a table")
    c.add_argument("path", help=path_help)
    c.add_argument("--schema", required=True,
                   help='"name:type,..." (e.g. "id:int64,name:string,mod:timestamp") or a JSON file')
    c.add_argument("--primary-key", help="comma-separated key columns (then --delta-column is needed too)")
    c.add_argument("--delta-column", help="the column ordering a key's records (timestamp, date or integer)")
    c.add_argument("--partition-by", help="comma-separated partition columns")
    c.add_argument("--format", default="parquet", choices=["parquet", "orc"], help="data file format")
    c.add_argument("--buckets", type=int, default=16, help="key-store hash buckets (default 16)")
    c.set_defaults(run=cmd_create)

    i = sub.add_parser("ingest", help="ingest one batch from Parquet, CSV or JSON-lines files")
    i.add_argument("path", help=path_help)
    i.add_argument("inputs", nargs="+", metavar="INPUT", help="files (or folders) of one batch, all one format")
    i.add_argument("--input-format", choices=["parquet", "csv", "json"],
                   help="default: from the first input's extension")
    i.add_argument("--op-column", help='string column saying "upsert" or "delete" per record')
    i.add_argument("--batch-id", help="the batch id; re-ingesting a committed id does nothing")
    i.add_argument("--no-metagen", action="store_true", help="land only; `bitlake metagen` makes it visible")
    i.add_argument("--metagen-mode", choices=list(METAGEN_MODES), default="auto", help=mode_help)
    i.set_defaults(run=cmd_ingest)

    m = sub.add_parser("metagen", help="make every pending batch visible")
    m.add_argument("path", help=path_help)
    m.add_argument("--metagen-mode", choices=list(METAGEN_MODES), default="auto", help=mode_help)
    m.set_defaults(run=cmd_metagen)

    s = sub.add_parser("show", help="print the first rows of the current view")
    s.add_argument("path", help=path_help)
    s.add_argument("--limit", type=int, default=20, help="rows to print (default 20)")
    s.add_argument("--row-ids", action="store_true", help="also print the row-id columns")
    s.add_argument("--version", type=int, help="the table as committed at this version")
    s.add_argument("--as-of", help="the latest version committed at or before this ISO-8601 time")
    s.add_argument("--valid-at", help="rows valid at this delta-column value (event time)")
    s.set_defaults(run=cmd_show)

    ch = sub.add_parser("changes", help="print the change feed of a version range")
    ch.add_argument("path", help=path_help)
    ch.add_argument("--start-version", type=int, required=True, help="exclusive start of the range")
    ch.add_argument("--end-version", type=int, help="inclusive end of the range (default: latest)")
    ch.add_argument("--change-types", help="comma-separated: insert,update_preimage,update_postimage,delete")
    ch.add_argument("--limit", type=int, default=50, help="rows to print (default 50)")
    ch.set_defaults(run=cmd_changes)

    h = sub.add_parser("history", help="list the commits, newest first")
    h.add_argument("path", help=path_help)
    h.add_argument("--json", action="store_true", help="print JSON instead of a table")
    h.set_defaults(run=cmd_history)

    d = sub.add_parser("describe", help="print the table's metadata and sizes as JSON")
    d.add_argument("path", help=path_help)
    d.set_defaults(run=cmd_describe)

    k = sub.add_parser("cleanup", help="remove files no commit references (leftovers of failed jobs)")
    k.add_argument("path", help=path_help)
    k.add_argument("--min-age-seconds", type=float, default=3600.0,
                   help="keep younger files: a running job may still commit them (default 3600)")
    k.add_argument("--dry-run", action="store_true", help="list the files without removing them")
    k.set_defaults(run=cmd_cleanup)

    sv = sub.add_parser("serve", help="run the trigger service (FastAPI on uvicorn)")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8400, help="port (default 8400)")
    sv.add_argument("--db-url", help="the store's SQLAlchemy URL (default: $BITLAKE_TRIGGERS_DB_URL, else "
                                     "sqlite:///./bitlake-triggers.db)")
    sv.add_argument("--config", help="a TOML configuration file (default: $BITLAKE_TRIGGERS_CONFIG)")
    sv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    sv.set_defaults(run=cmd_serve)

    ev = sub.add_parser("events", help="Data Change Events: publish, watch, list; API tokens")
    actions = ev.add_subparsers(dest="action", required=True, metavar="ACTION")

    def target_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--url", help="the trigger service, e.g. http://127.0.0.1:8400 ($BITLAKE_TRIGGERS_URL)")
        parser.add_argument("--token", help="a bearer token ($BITLAKE_TRIGGERS_TOKEN)")
        parser.add_argument("--db-url", help="talk to the store's database directly instead of the service")

    pb = actions.add_parser("publish", help="register the events of a bitlake table's unpublished commits")
    pb.add_argument("path", help=path_help)
    target_options(pb)
    pb.set_defaults(run=cmd_events_publish)

    w = actions.add_parser("watch", help="register events for a Hive folder's, Iceberg or Delta table's changes")
    w.add_argument("kind", choices=["hive", "iceberg", "delta"])
    w.add_argument("location", help="the table's folder (or file:// URI); with --catalog an Iceberg identifier")
    target_options(w)
    w.add_argument("--table", help="the table's name in the events (default: its location URI)")
    w.add_argument("--interval", type=float, default=30.0, help="seconds between looks (default 30)")
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

    from bitlake.triggers.__main__ import add_token_parser

    add_token_parser(actions).set_defaults(run=cmd_events_token)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out, err = Console(), Console(stderr=True)
    try:
        code = args.run(args, out, err)
    except BitlakeError as e:
        say(err, f"bitlake {args.command}: error: {e}")
        return 2
    except httpx.HTTPError as e:
        say(err, f"bitlake {args.command}: error: cannot reach the trigger service: {e}")
        return 2
    except Exception as e:
        from pyspark.errors import PySparkException

        if not isinstance(e, PySparkException):
            raise
        say(err, f"bitlake {args.command}: Spark error: {_first_line(e)}")
        return 1
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
