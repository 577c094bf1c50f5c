"""The table commands: create, ingest, metagen, show, changes, history, describe, cleanup, compact, maintain,
tombstone, vacuum, revert, replace, delete, update, convert, upgrade."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
from typing import TYPE_CHECKING

import pyarrow as pa

import bitlake
from bitlake import cdc
from bitlake.cli.inputs import input_format, read_input
from bitlake.cli.output import _counts, print_grid, print_json_lines, render_history, render_rows, say, step
from bitlake.cli.schema import parse_schema
from bitlake.errors import InvalidInputError
from bitlake.format import rowid
from bitlake.format.metadata import AGE, delta_text, delta_to_int
from bitlake.mirror import PostgresMirror, lsn_text
from bitlake.sql import to_expression

# rich (bitlake[cli]), httpx (bitlake[client]) and pyspark are imported where they are used, and so is the table
# library (through ``bitlake``'s lazy names, or bitlake.bootstrap): `bitlake --help` starts without them. No command
# starts Spark itself: the only ones that run on it are MetaGen as a Spark job (--metagen-mode spark), which the
# library starts, and a schema file holding a Spark StructType with nested types.
if TYPE_CHECKING:
    from rich.console import Console

def _columns(text: str | None) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def cmd_create(args, out: Console, err: Console) -> None:
    table = bitlake.create_table(
        args.path, parse_schema(args.schema), primary_key=_columns(args.primary_key),
        delta_column=args.delta_column, partition_by=_columns(args.partition_by),
        file_format=args.format, num_buckets=args.buckets, name=args.name,
    )
    meta = table.metadata
    kind = f"keyed on {', '.join(meta.primary_key)} by {meta.delta_column}" if meta.keyed else "append-only"
    say(out, f"created table {table.path}, {kind} (version {table.version})")


def _batch_input_args(parser, inputs_help: str) -> None:
    """The arguments of a command that reads one batch: :func:`_batch_input` reads them."""
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help=inputs_help)
    parser.add_argument("--input-format", choices=["parquet", "csv", "json"],
                        help="default: from the first input's extension (.parquet/.pq, .csv, .json/.jsonl/.ndjson)")
    parser.add_argument("--op-column", help='a string column saying "upsert" or "delete" per record (default: none, '
                                            "every record is an upsert)")


def _batch_input(args, table) -> pa.RecordBatchReader:
    """The records of ``args.inputs``, streamed with pyarrow."""
    return read_input(table.metadata.schema, args.inputs, input_format(args.inputs, args.input_format))


def cmd_ingest(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    data = _batch_input(args, table)
    what = "landing" if args.no_metagen else "landing and MetaGen"
    with step(err, f"{what} of {', '.join(args.inputs)}"):
        # A Spark MetaGen (--metagen-mode spark, or auto on a large batch) starts Spark itself.
        r = table.ingest(data, op_column=args.op_column, batch_id=args.batch_id, metagen=not args.no_metagen,
                         inline=METAGEN_MODES[args.metagen_mode])
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
    with step(err, f"MetaGen of {len(pending)} pending batch(es)"):
        r = table.metagen(inline=METAGEN_MODES[args.metagen_mode])
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
    if args.valid_at is not None and not meta.keyed:
        raise InvalidInputError("--valid-at needs a keyed table: an append-only table has no delta column")
    valid_at = _valid_at(table, args.valid_at)
    if valid_at is not None:
        try:
            delta_to_int(valid_at, meta.delta_type)
        except InvalidInputError as e:
            raise InvalidInputError(f"--valid-at: {e}") from None
    columns = _columns(args.columns)
    keys = list(meta.primary_key)
    # The projection is pushed into the read, with the key columns the order needs (dropped before printing).
    read_columns = None if columns is None else columns + [k for k in keys if k not in columns]
    view = table.view(version=args.version, as_of=args.as_of, valid_at=valid_at, columns=read_columns,
                      filter=args.where, include_row_ids=args.row_ids)
    what = "the current view" if args.version is None and args.as_of is None else f"version {view.version}"
    if valid_at is not None:
        what += f" valid at {valid_at}"
    if args.where is not None:
        what += f" where {args.where}"
    with step(err, f"reading {what}"):  # on this machine with pyarrow, in bounded memory: no Spark
        order = [(c, "ascending") for c in keys]
        total, first = 0, view.schema.empty_table()
        for batch in view.to_reader():
            total += batch.num_rows
            if order or first.num_rows < args.limit:  # a running top-k by key, or the first rows read
                first = pa.concat_tables([first, pa.Table.from_batches([batch])])
                first = (first.sort_by(order) if order else first).slice(0, args.limit)
    if columns is not None:
        first = first.select(columns + (list(rowid.ROW_ID_COLUMNS) if args.row_ids else []))
    _print_rows(out, first, args.json, f"{table.path} @ {what}: {total} rows, first {first.num_rows}")


def _print_rows(out: Console, rows: pa.Table, as_json: bool, title: str) -> None:
    if as_json:
        print_json_lines(out, rows.to_pylist())
    else:
        print_grid(out, render_rows(rows.column_names, [tuple(r.values()) for r in rows.to_pylist()], title=title))


def cmd_changes(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    if args.starting_version is not None and args.ending_version is not None \
            and args.starting_version > args.ending_version:
        raise InvalidInputError(f"--starting-version {args.starting_version} is after --ending-version "
                                f"{args.ending_version}")
    columns = _columns(args.columns)
    start = (f"version {args.starting_version}" if args.starting_version is not None else
             args.starting_timestamp if args.starting_timestamp is not None else "the first version")
    end = (f"version {args.ending_version}" if args.ending_version is not None else
           args.ending_timestamp if args.ending_timestamp is not None else "the latest")
    what = f"changes from {start} to {end}" + (f" where {args.where}" if args.where is not None else "")
    with step(err, f"reading the {what}"):
        rows = table.changes_to_arrow(starting_version=args.starting_version, ending_version=args.ending_version,
                                      starting_timestamp=args.starting_timestamp,
                                      ending_timestamp=args.ending_timestamp, change_types=_columns(args.change_types))
        if columns is not None:
            unknown = [c for c in columns if c not in rows.column_names]
            if unknown:
                raise InvalidInputError(f"--columns: {unknown} are not columns of the change rows; they have "
                                        f"{rows.column_names}")
        if args.where is not None:
            rows = rows.filter(to_expression(args.where, rows.schema))
    total = rows.num_rows
    rows = rows.slice(0, args.limit)
    if columns is not None:
        rows = rows.select(columns)
    _print_rows(out, rows, args.json, f"{table.path}: {what}: {total} rows, first {rows.num_rows}")


def cmd_history(args, out: Console, err: Console) -> None:
    history = bitlake.open_table(args.path).history()
    if args.json:
        out.print_json(data=history)
    else:
        print_grid(out, render_history(history))


def cmd_describe(args, out: Console, err: Console) -> None:
    out.print_json(data=bitlake.open_table(args.path).describe())


def cmd_cleanup(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    removed = table.cleanup(min_age_seconds=args.min_age_seconds, dry_run=args.dry_run)
    for rel in removed:
        say(out, rel)
    verb = "would remove" if args.dry_run else "removed"
    say(out, f"{verb} {len(removed)} unreferenced file(s)")


@contextlib.contextmanager
def compaction_progress(err: Console):
    """A transient rich progress bar of the rows a compaction rewrites; yields its ``progress(rows, total)``. Off a
    terminal there is no bar (rich would leave an empty line in a log)."""
    from rich.progress import Progress

    if not err.is_terminal:
        yield lambda rows, total: None
        return
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("compacting", total=None)

        def advance(rows: int, total: int) -> None:
            if total:
                bar.update(task, total=total)
            bar.advance(task, rows)

        yield advance


def cmd_compact(args, out: Console, err: Console) -> None:
    if args.look_back is not None and not args.major:
        raise InvalidInputError("--look-back needs --major: it sets the retention window of a major compaction")
    table = bitlake.open_table(args.path)
    # A look-back of digits is a version (bitlake.engine.maintain.window.start), anything else an age or a time.
    kw = {"target_file_bytes": args.target_file_bytes, "major": args.major, "look_back": args.look_back,
          "cluster_by": args.cluster_by}
    if args.dry_run:
        plan = table.compact(dry_run=True, **kw)
        verb = "would rewrite" if plan["files"] or plan["log_files"] else "nothing to compact:"
        say(out, f"{verb} {plan['files']} file(s), {plan['rows']} rows, {plan['bytes']} bytes in "
                 f"{plan['partitions']} partition(s); regroup {plan['log_files']} log file(s)")
        return
    with compaction_progress(err) as advance:
        r = table.compact(progress=advance, **kw)
    if r.version is None:
        say(out, "nothing to compact: nothing was due, or another compaction replaced the files first")
        return
    say(out, f"version {r.version}: {r.removed_files} file(s) ({r.bytes_removed} bytes) rewritten into "
             f"{r.added_files} ({r.bytes_written} bytes): {r.current_rows} current rows, {r.history_rows} superseded"
             + (f", {r.purged_rows} purged" if args.major else "")
             + (f"; {r.log_files_removed} log file(s) {'folded' if args.major else 'regrouped'}"
                if r.log_files_removed else ""))
    if r.history_rows:
        say(out, "superseded rows go to files of their own, which reads of the current view skip; past and "
                 "event-time views read them until a major compaction's window lets them go (--major)")
    if args.major:
        w = table.state().window
        assert w is not None
        times = "" if w.watermark is None else \
            f", event times from {delta_text(w.watermark, table.metadata.delta_type)}"  # ISO for a time column
        say(out, f"retention window: versions from {w.version}{times}")


def cmd_maintain(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    if args.dry_run:
        r = table.maintain(dry_run=True, min_age_seconds=args.min_age_seconds)
    else:
        with compaction_progress(err) as advance:
            r = table.maintain(min_age_seconds=args.min_age_seconds, progress=advance)
    m = r.metrics
    say(out, f"{m.data_files} data files ({m.small_files} small, {m.wasteful_files} with many superseded rows), "
             f"{m.valid_rows} valid of {m.stored_rows} stored rows, {m.log_files} log files, oldest version "
             f"{m.oldest_version} (committed {m.oldest_version_committed})")
    for t in r.tasks:
        say(out, f"{'would run' if args.dry_run else 'ran'} {t.name}: {t.reason}; expected: {t.gain}")
    c = r.compaction
    if c is not None and c.version is not None:
        say(out, f"version {c.version}: {c.removed_files} file(s) rewritten into {c.added_files}, "
                 f"{c.purged_rows} rows purged")
    say(out, f"{'would remove' if args.dry_run else 'removed'} {len(r.removed)} unreferenced file(s)")


def cmd_tombstone(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    values = [v for v in args.values.split(",") if v != ""]
    version = table.tombstone(args.column, values).version
    say(out, f"version {version}: rows committed before it with {args.column} in {len(set(values))} value(s) "
             "are hidden from now on")


def cmd_vacuum(args, out: Console, err: Console) -> None:
    with step(err, "vacuuming"):
        r = bitlake.open_table(args.path).vacuum()
    if r.version is None:
        say(out, "no tombstone to apply: nothing done")
    else:
        say(out, f"version {r.version}: {r.rows_purged} row(s) purged; {r.files_rewritten} of {r.files_considered} "
                 f"data file(s) rewritten ({r.files_read} read); {r.tombstones_retired} tombstone(s) retired")


def cmd_revert(args, out: Console, err: Console) -> None:
    r = bitlake.open_table(args.path).revert_batch(args.batch_id)
    if not r.committed:
        say(out, f"batch {args.batch_id} is reverted already: nothing done")
    else:
        say(out, f"version {r.version}: batch {args.batch_id} reverted; {_counts(r.counts)}")


def cmd_cdc(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)

    def lines():
        for name in args.inputs:
            with open(name) as f:
                yield from f

    with step(err, f"applying the change events of {', '.join(args.inputs)}"):
        results = cdc.ingest(table, lines(), batch_id=args.batch_id, position=args.position,
                             decimal_handling=args.decimal_handling)
    for r in results:
        what = "already committed: nothing done" if not r.committed else _counts(r.counts)
        say(out, f"version {r.version}: batch {r.batch_id}: {what}")


def cmd_mirror(args, out: Console, err: Console) -> None:
    def progress(p) -> None:
        if p.changes:
            say(out, f"LSN {lsn_text(p.lsn)}: {p.changes} changes in {p.seconds:.2f} s ({p.changes_per_s:,.0f}/s), "
                     f"{p.lag_bytes:,} bytes of WAL behind")

    mirror = PostgresMirror(args.dsn, args.table, args.path, slot=args.slot, key=_columns(args.key) or None,
                            batch_changes=args.batch_changes, progress=progress)
    try:
        with step(err, f"snapshot of {args.table}"):
            mirror.snapshot()
        say(out, f"mirroring {args.table} into {args.path} from slot {mirror.slot}")
        mirror.run(interval=args.interval, until_caught_up=args.until_caught_up)
    finally:
        mirror.close()


def cmd_replace(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    data = _batch_input(args, table)
    with step(err, f"replacing batch {args.batch_id} by {', '.join(args.inputs)}"):
        r = table.replace_batch(args.batch_id, data, op_column=args.op_column)
    say(out, f"version {r.version}: batch {args.batch_id} replaced; {_counts(r.counts)}")


def cmd_delete(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    with step(err, f"deleting where {args.where}"):
        r = table.delete(args.where)
    _say_dml(out, r, "deleted")


def cmd_update(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    assignments = {}
    for a in args.set:
        column, eq, expr = a.partition("=")
        if not eq or not column.strip():
            raise InvalidInputError(f"--set {a!r}: write COLUMN=EXPRESSION (a SQL expression)")
        assignments[column.strip()] = expr
    with step(err, f"updating where {args.where}"):
        r = table.update(args.where, assignments)
    _say_dml(out, r, "updated")


def _say_dml(out: Console, r, what: str) -> None:
    if r.version is None:
        say(out, "no row matched: nothing committed")
    else:
        say(out, f"version {r.version}: {r.matched} row(s) {what}; {_counts(r.counts)}")


def cmd_convert(args, out: Console, err: Console) -> None:
    from bitlake.bootstrap import convert  # the table library (see above)

    with step(err, f"converting {args.source}"):
        r = convert(args.source, args.path, primary_key=_columns(args.primary_key), delta_column=args.delta_column,
                    partition_by=_columns(args.partition_by), source_kind=args.source_kind, name=args.name,
                    num_buckets=args.buckets)
    kind = f"keyed on {', '.join(r.table.metadata.primary_key)}" if r.table.metadata.keyed else "append-only"
    say(out, f"converted the {r.source_kind} dataset {args.source} into {r.table.path} ({kind}, version "
             f"{r.table.version}): {r.rows} rows read, {r.duplicates} duplicate key record(s) resolved; "
             f"{_counts(r.counts)}")


def cmd_upgrade(args, out: Console, err: Console) -> None:
    table = bitlake.open_table(args.path)
    version = table.upgrade().version
    if version is None:
        say(out, f"{args.path} already is a format v2 table (version {table.version})")
    else:
        say(out, f"upgraded {args.path} to format v2 in version {version}")


def cmd_analyze(args, out: Console, err: Console) -> None:
    r = bitlake.open_table(args.path).analyze()
    if r.version is None:
        say(out, f"every data file of {args.path} has column statistics: nothing done")
    else:
        say(out, f"recorded the column statistics of {r.counts['files']} data file(s) in version {r.version}")


PATH_HELP = "the table: a folder or a file://, s3://, gs://, az:// or memory:// URI"
_METAGEN_MODE_HELP = ("how MetaGen runs: inline on this machine (key lookups in the RocksDB key index, or a scan of "
                      "the touched key-store buckets), or as a Spark job (needs bitlake[spark]); auto, the default, "
                      "runs inline: the command has no Spark session at hand")


def add_parsers(sub) -> None:
    """The table commands' sub-parsers, a group at a time in the order ``bitlake --help`` lists them."""
    _add_write_parsers(sub)
    _add_read_parsers(sub)
    _add_maintenance_parsers(sub)
    _add_row_removal_parsers(sub)
    _add_change_capture_parsers(sub)
    _add_restatement_parsers(sub)
    _add_conversion_parsers(sub)


def _add_write_parsers(sub) -> None:
    """create, ingest, metagen: a table's creation and its batches' two steps, landing and MetaGen."""
    c = sub.add_parser("create", help="create a table")
    c.add_argument("path", help=PATH_HELP)
    c.add_argument("--schema", required=True,
                   help='"name:type,..." (e.g. "id:int64,name:string,mod:timestamp") or a JSON file')
    c.add_argument("--primary-key", help="comma-separated key columns (then --delta-column is needed too; "
                                         "default: none, an append-only table)")
    c.add_argument("--delta-column", help="the column ordering a key's records (timestamp, date or integer)")
    c.add_argument("--partition-by", help="comma-separated partition columns (default: none)")
    c.add_argument("--format", default="parquet", choices=["parquet", "orc"], help="data file format")
    c.add_argument("--buckets", type=int, default=16, help="key-store hash buckets (default 16)")
    c.add_argument("--name", help="the table's logical name in its Data Change Events (default: the folder's name)")
    c.set_defaults(run=cmd_create)

    i = sub.add_parser("ingest", help="ingest one batch from Parquet, CSV or JSON-lines files")
    i.add_argument("path", help=PATH_HELP)
    _batch_input_args(i, "files (or folders) of one batch, all one format")
    i.add_argument("--batch-id", help="the batch id; re-ingesting a committed id with the same records does nothing, "
                                      "with other records is an error (default: a new id)")
    i.add_argument("--no-metagen", action="store_true", help="land only; `bitlake metagen` makes it visible")
    i.add_argument("--metagen-mode", choices=list(METAGEN_MODES), default="auto", help=_METAGEN_MODE_HELP)
    i.set_defaults(run=cmd_ingest)

    m = sub.add_parser("metagen", help="make every pending batch visible")
    m.add_argument("path", help=PATH_HELP)
    m.add_argument("--metagen-mode", choices=list(METAGEN_MODES), default="auto", help=_METAGEN_MODE_HELP)
    m.set_defaults(run=cmd_metagen)


def _add_read_parsers(sub) -> None:
    """show, changes, history, describe: the commands that only read."""
    s = sub.add_parser("show", help="print the first rows of a view (ordered by key), read with pyarrow")
    s.add_argument("path", help=PATH_HELP)
    s.add_argument("--limit", type=row_count, default=20, help="rows to print (default 20)")
    s.add_argument("--row-ids", action="store_true", help="also print the row-id columns")
    when = s.add_mutually_exclusive_group()
    when.add_argument("--version", type=int, help="the table as committed at this version (default: the latest)")
    when.add_argument("--as-of", help="the latest version committed at or before this ISO-8601 time")
    s.add_argument("--valid-at", help="rows valid at this delta-column value (event time; default: the current "
                                      "rows)")
    _row_options(s, "the view's columns")
    s.set_defaults(run=cmd_show)

    ch = sub.add_parser("changes", help="print the change feed (Delta's change data feed rows) of a range of "
                                        "versions, both ends included")
    ch.add_argument("path", help=PATH_HELP)
    start = ch.add_mutually_exclusive_group()
    start.add_argument("--starting-version", type=int, metavar="N",
                       help="the first version whose changes are printed (included; default: the first readable)")
    start.add_argument("--starting-timestamp", metavar="TIME",
                       help="start at the first version committed at or after this ISO-8601 time")
    end = ch.add_mutually_exclusive_group()
    end.add_argument("--ending-version", type=int, metavar="N",
                     help="the last version whose changes are printed (included; default: the latest)")
    end.add_argument("--ending-timestamp", metavar="TIME",
                     help="end at the last version committed at or before this ISO-8601 time")
    ch.add_argument("--change-types", help="comma-separated: insert,update_preimage,update_postimage,delete "
                                           "(default: all)")
    ch.add_argument("--limit", type=row_count, default=50, help="rows to print (default 50)")
    _row_options(ch, "the table's columns and _change_type, _commit_version, _commit_timestamp")
    ch.set_defaults(run=cmd_changes)

    h = sub.add_parser("history", help="list the commits, newest first")
    h.add_argument("path", help=PATH_HELP)
    h.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    h.set_defaults(run=cmd_history)

    d = sub.add_parser("describe", help="print the table's metadata and sizes as JSON")
    d.add_argument("path", help=PATH_HELP)
    d.set_defaults(run=cmd_describe)


def _row_options(parser, columns: str) -> None:
    parser.add_argument("--columns", metavar="A,B,...",
                        help=f"comma-separated columns to print, of {columns} (default: all)")
    parser.add_argument("--where", metavar="CONDITION",
                        help="a SQL condition the rows printed hold, e.g. \"region = 'EU' and amount > 0\" "
                             "(evaluated with pyarrow, no Spark)")
    parser.add_argument("--json", action="store_true",
                        help="print JSON lines, an object per row (timestamps and dates as ISO-8601 strings)")


def _add_maintenance_parsers(sub) -> None:
    """cleanup, compact, maintain: the commands that rewrite or remove a table's files and keep its current view."""
    k = sub.add_parser("cleanup", help="remove files no commit references (leftovers of failed jobs)")
    k.add_argument("path", help=PATH_HELP)
    k.add_argument("--min-age-seconds", type=seconds, default=3600.0,
                   help="keep younger files: a running job may still commit them (default 3600)")
    k.add_argument("--dry-run", action="store_true", help="list the files without removing them")
    k.set_defaults(run=cmd_cleanup)

    m = sub.add_parser("compact", help="rewrite small data files and those with many superseded rows")
    m.add_argument("path", help=PATH_HELP)
    m.add_argument("--target-file-bytes", type=int,
                   help="size of the files written (default: the compact.target_file_bytes property)")
    m.add_argument("--dry-run", action="store_true", help="say what would be rewritten, rewrite nothing")
    m.add_argument("--major", action="store_true",
                   help="also set the retention window and purge what no view inside it can see")
    m.add_argument("--look-back", type=look_back,
                   help="with --major, the window's start: a version, an age (7d, 12h) or an ISO-8601 time "
                        "(default: the compact.look_back property)")
    m.add_argument("--cluster-by", metavar="COLUMN",
                   help="rewrite every file of each partition into files of disjoint ranges of this column")
    m.set_defaults(run=cmd_compact)

    mt = sub.add_parser("maintain", help="run the compactions and cleanup the table's metrics call for")
    mt.add_argument("path", help=PATH_HELP)
    mt.add_argument("--dry-run", action="store_true", help="print the plan and its expected gain, change nothing")
    mt.add_argument("--min-age-seconds", type=seconds, default=3600.0,
                    help="cleanup keeps younger files (default 3600)")
    mt.set_defaults(run=cmd_maintain)


def _add_row_removal_parsers(sub) -> None:
    """tombstone, vacuum, revert: rows out of the views by value (a tombstone, which a vacuum then erases from
    the files) or by batch."""
    tb = sub.add_parser("tombstone", help="hide the rows committed so far whose column holds one of the values")
    tb.add_argument("path", help=PATH_HELP)
    tb.add_argument("--column", required=True, help="the column the values are of")
    tb.add_argument("--values", required=True, help="comma-separated values (read as the column's type)")
    tb.set_defaults(run=cmd_tombstone)

    va = sub.add_parser("vacuum", help="remove the rows tombstones hide from every file, and retire the tombstones")
    va.add_argument("path", help=PATH_HELP)
    va.set_defaults(run=cmd_vacuum)

    rv = sub.add_parser("revert", help="revert a batch: every view from now on as if it had never been ingested")
    rv.add_argument("path", help=PATH_HELP)
    rv.add_argument("batch_id", help="the batch id to revert")
    rv.set_defaults(run=cmd_revert)


def _add_change_capture_parsers(sub) -> None:
    """cdc, mirror: the commands that apply another system's changes (Debezium events, PostgreSQL's WAL)."""
    cd = sub.add_parser("cdc", help="apply Debezium change events (JSON lines of Kafka messages or envelopes)")
    cd.add_argument("path", help=PATH_HELP)
    cd.add_argument("inputs", nargs="+", help="files of JSON lines, applied in order")
    cd.add_argument("--batch-id", help="the batch id (a retry with the same id is a no-op; default: a new id)")
    cd.add_argument("--position", choices=["lsn", "ts_ms"], default="lsn",
                    help="what the delta column takes: PostgreSQL's source.lsn (default) or the change's ts_ms")
    cd.add_argument("--decimal-handling", choices=["precise", "string", "double"], default="precise",
                    help="the connector's decimal.handling.mode, for messages without a schema section "
                         "(precise: decimals as base64 bytes, the default)")
    cd.set_defaults(run=cmd_cdc)

    mi = sub.add_parser("mirror", help="mirror a PostgreSQL table: a snapshot, then logical replication (wal2json)")
    mi.add_argument("dsn", help="the source database: postgresql://user@host:port/db or a libpq string")
    mi.add_argument("path", help="the bitlake table, created on the first run: "
                                 + PATH_HELP.removeprefix("the table: "))
    mi.add_argument("--table", required=True, help="the source table, schema.table")
    mi.add_argument("--slot", help="the replication slot's name (default bitlake_<schema>_<table>)")
    mi.add_argument("--key", help="key columns of a table without a primary key (it needs REPLICA IDENTITY FULL)")
    mi.add_argument("--interval", type=seconds, default=1.0, help="seconds between polls when nothing is waiting "
                                                                "(default 1)")
    mi.add_argument("--batch-changes", type=int, default=50_000, help="changes per commit at most (whole "
                    "transactions; default 50000)")
    mi.add_argument("--until-caught-up", action="store_true", help="stop once nothing is left to apply")
    mi.set_defaults(run=cmd_mirror)


def _add_restatement_parsers(sub) -> None:
    """replace, delete, update: the commands that rewrite committed rows (a batch, or rows a condition picks)."""
    rp = sub.add_parser("replace", help="revert a batch and ingest new records under its id, in one commit")
    rp.add_argument("path", help=PATH_HELP)
    rp.add_argument("batch_id", help="the batch id to replace")
    _batch_input_args(rp, "files (or folders) of the new records, all one format")
    rp.set_defaults(run=cmd_replace)

    de = sub.add_parser("delete", help="delete the current rows a SQL condition holds for (pyarrow, no Spark)")
    de.add_argument("path", help=PATH_HELP)
    de.add_argument("--where", required=True, help="a SQL condition, e.g. \"region = 'EU' and amount < 0\"")
    de.set_defaults(run=cmd_delete)

    up = sub.add_parser("update", help="set columns of the current rows a SQL condition holds for (pyarrow, no Spark)")
    up.add_argument("path", help=PATH_HELP)
    up.add_argument("--where", required=True, help="a SQL condition, e.g. \"aid = 42\"")
    up.add_argument("--set", action="append", required=True, metavar="COLUMN=EXPRESSION",
                    help="a column and its new value as a SQL expression, e.g. \"amount=amount * 2\" or "
                         "\"note='fixed'\" (a string literal in quotes; repeatable)")
    up.set_defaults(run=cmd_update)


def _add_conversion_parsers(sub) -> None:
    """convert, upgrade: the commands that make a bitlake table of another format, or of an older one."""
    v = sub.add_parser("convert",
                       help="create a table from a Parquet folder, a Delta or Iceberg table or a lance dataset")
    v.add_argument("source", help="the dataset's folder (or Parquet file, or Iceberg metadata JSON file)")
    v.add_argument("path", help=f"the new table (new or empty): {PATH_HELP.removeprefix('the table: ')}")
    v.add_argument("--source-kind", choices=["parquet", "delta", "iceberg", "lance"], help="default: detected")
    v.add_argument("--primary-key", help="comma-separated key columns (then --delta-column is needed too; "
                                         "default: none, an append-only table)")
    v.add_argument("--delta-column", help="the column ordering a key's records (timestamp, date or integer)")
    v.add_argument("--partition-by", help="comma-separated partition columns (default: the source's)")
    v.add_argument("--buckets", type=int, default=16, help="key-store hash buckets (default 16)")
    v.add_argument("--name", help="the table's logical name (default: the folder's name)")
    v.set_defaults(run=cmd_convert)

    u = sub.add_parser("upgrade", help="upgrade a format v1 table to format v2 (one commit)")
    u.add_argument("path", help=PATH_HELP)
    u.set_defaults(run=cmd_upgrade)
    a = sub.add_parser("analyze", help="record the column statistics of data files written without them (one "
                                       "commit), so that filters skip those files too")
    a.add_argument("path", help=PATH_HELP)
    a.set_defaults(run=cmd_analyze)


def row_count(text: str) -> int:
    """A count of rows: a whole number from 0 to 2^62 (argparse names the option when it is not)."""
    value = int(text)
    if not 0 <= value <= 1 << 62:
        raise ValueError(text)
    return value


def seconds(text: str) -> float:
    """A number of seconds: finite, at least 0 (argparse names the option when it is not)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds of at least 0")
    return value


def look_back(text: str) -> str:
    """A ``--look-back``: a version, an age (7d, 12h, 30m, 90s) or an ISO-8601 time, checked before the table
    opens; the library reads it."""
    value = text.strip()
    if value.isdigit() or AGE.match(value):
        return value
    try:
        datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a version, an age (7d, 12h, 30m, 90s) or an ISO-8601 "
                                         "time") from None
    return value
