"""The ``bitlake`` command line: the table commands (:mod:`bitlake.cli.tables`: create, ingest, metagen, show,
changes, history, describe, cleanup, upgrade) and the trigger service's (:mod:`bitlake.cli.events`: ``serve``
and ``events publish|watch|list|token``).

Errors bitlake raises on purpose (:class:`bitlake.BitlakeError`) print one line and exit with 2, like
argparse's usage errors, in the command line's words (``--look-back``, not ``look_back``); a command that needs an
extra that is not installed (pyspark for a Spark MetaGen) says which in one line; any other Spark error prints
its first line and exits with 1.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

import pyarrow as pa

import bitlake
from bitlake.cli import events, tables
from bitlake.cli.events import watch_state_path
from bitlake.cli.output import _first_line, render_history, render_rows, say
from bitlake.cli.schema import parse_schema, parse_type
from bitlake.errors import BitlakeError
from bitlake.triggers.__main__ import database_error

__all__ = ["build_parser", "main", "parse_schema", "parse_type", "render_history", "render_rows", "watch_state_path"]


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help names its default, unless it says it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.option_strings and action.default not in (None, False, "", argparse.SUPPRESS) \
                and "default" not in text:
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """The parser of ``bitlake`` and of each of its commands (sub-parsers are made of the parent's class)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="bitlake", description="Mutable tables on an immutable data lake.")
    p.add_argument("--version", action="version", version=f"bitlake {bitlake.__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    tables.add_parsers(sub)
    events.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        from rich.console import Console
    except ImportError:
        sys.exit("bitlake: the command line needs its extra: pip install 'bitlake[cli]'")
    parser = build_parser()
    args = parser.parse_args(argv)
    out, err = Console(), Console(stderr=True)
    try:
        code = args.run(args, out, err)
    except BitlakeError as e:
        message = cli_wording(" ".join(str(e).split()), command_options(parser, args), getattr(args, "path", None))
        message = message.removeprefix(f"{args.command}: ")  # the library names its call, as the line already does
        say(err, f"bitlake {args.command}: error: {message}")
        return 2
    except ImportError as e:
        extra = _EXTRAS.get((e.name or "").partition(".")[0])
        if extra is None:
            raise
        say(err, f"bitlake {args.command}: error: this needs {extra[0]}, which is not installed: "
                 f"pip install 'bitlake[{extra[1]}]'")
        return 2
    except (OSError, ValueError, OverflowError, pa.ArrowException) as e:
        # An input that is not what it claims (a missing file, Parquet or JSON that does not parse, a number
        # out of range): one line, as for bitlake's own errors; BITLAKE_DEBUG=1 shows the traceback.
        if os.environ.get("BITLAKE_DEBUG"):
            raise
        say(err, f"bitlake {args.command}: error: {type(e).__name__}: {_first_line(e)}")
        return 2
    except Exception as e:
        # httpx and pyspark are optional (bitlake[client], bitlake[spark]): an error of either comes from
        # a module a command has imported, so neither is imported here.
        httpx, pyspark_errors = sys.modules.get("httpx"), sys.modules.get("pyspark.errors")
        if httpx is not None and isinstance(e, httpx.HTTPError):
            say(err, f"bitlake {args.command}: error: cannot reach the trigger service: {e}")
            return 2
        reason = database_error(e)  # --db-url: a URL that does not parse, a database that cannot be reached
        if reason is not None:
            say(err, f"bitlake {args.command}: error: {reason}")
            return 2
        psycopg = sys.modules.get("psycopg")  # mirror's source database: unreachable, refusing, without wal2json
        if psycopg is not None and isinstance(e, psycopg.Error):
            say(err, f"bitlake {args.command}: error: the database: {type(e).__name__}: {_first_line(e)}")
            return 2
        if pyspark_errors is None or not isinstance(e, pyspark_errors.PySparkException):
            raise
        say(err, f"bitlake {args.command}: Spark error: {_first_line(e)}")
        return 1
    return code or 0


# The optional packages a command can need, by import name: what to say, and bitlake's extra that installs it.
_EXTRAS = {"pyspark": ("Spark (pyspark)", "spark"), "py4j": ("Spark (pyspark)", "spark"),
           "httpx": ("httpx", "client"), "fastapi": ("FastAPI", "service"), "uvicorn": ("uvicorn", "service"),
           "sqlalchemy": ("SQLAlchemy", "service"), "alembic": ("alembic", "service"),
           "psycopg": ("psycopg", "service")}
# The library's errors name its keyword arguments: those whose option is not named after them, by the option's dest.
_ARGUMENTS = {"num_buckets": "buckets", "file_format": "format", "major=True": "major"}
# The calls the library's errors suggest, and the commands that do the same.
_CALLS = [(re.compile(r"\breplace_batch\(('[^']*'), data\)"), "`bitlake replace {0} {1} INPUT...`"),
          (re.compile(r"\brevert_batch\(('[^']*')\)"), "`bitlake revert {0} {1}`")]


def cli_wording(message: str, options: dict[str, str], path: str | None = None) -> str:
    """``message`` with each keyword argument of the library it names (``look_back``, ``major=True``,
    ``starting_version``) written as the command's option (``--look-back``, ``--major``, ``--starting-version``),
    and each call it suggests as the command (``revert_batch('b')``: ``bitlake revert PATH 'b'``): a command line
    user passed flags, not arguments. ``options``: the command's options by dest; ``path``: the table's."""
    for call, command in _CALLS:
        message = call.sub(lambda m, command=command: command.format(path or "PATH", *m.groups()), message)
    flags = {dest: flag for dest, flag in options.items() if "_" in dest}
    flags.update({name: options[dest] for name, dest in _ARGUMENTS.items() if dest in options})
    if not flags:
        return message
    names = "|".join(map(re.escape, sorted(flags, key=len, reverse=True)))
    return re.sub(rf"(?<![\w.'\"-])({names})(?![\w'\"])", lambda m: flags[m[1]], message)


def command_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, str]:
    """The long options of the (sub-)command ``args`` ran, by dest."""
    while True:
        sub = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not sub or getattr(args, sub[0].dest, None) not in sub[0].choices:
            break
        parser = sub[0].choices[getattr(args, sub[0].dest)]
    return {a.dest: next((o for o in a.option_strings if o.startswith("--")), a.option_strings[0])
            for a in parser._actions if a.option_strings and a.dest != "help"}
