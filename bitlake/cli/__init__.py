"""The ``bitlake`` command line: the table commands (:mod:`bitlake.cli.tables`: create, ingest, metagen, show,
changes, history, describe, cleanup, upgrade) and the trigger service's (:mod:`bitlake.cli.events`: ``serve``
and ``events publish|watch|list|token``).

Errors bitlake raises on purpose (:class:`bitlake.BitlakeError`) print one line and exit with 2, like
argparse's usage errors; any other Spark error (a missing path, a CSV value that does not cast) prints
its first line and exits with 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import pyarrow as pa

import bitlake
from bitlake.cli import events, tables
from bitlake.cli.events import watch_state_path
from bitlake.cli.output import _first_line, render_history, render_rows, say
from bitlake.cli.tables import parse_schema, parse_type
from bitlake.errors import BitlakeError
from bitlake.triggers.__main__ import database_error

__all__ = ["build_parser", "main", "parse_schema", "parse_type", "render_history", "render_rows", "watch_state_path"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bitlake", description="Mutable tables on an immutable data lake.")
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
    args = build_parser().parse_args(argv)
    out, err = Console(), Console(stderr=True)
    try:
        code = args.run(args, out, err)
    except BitlakeError as e:
        say(err, f"bitlake {args.command}: error: {e}")
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
        if pyspark_errors is None or not isinstance(e, pyspark_errors.PySparkException):
            raise
        say(err, f"bitlake {args.command}: Spark error: {_first_line(e)}")
        return 1
    return code or 0
