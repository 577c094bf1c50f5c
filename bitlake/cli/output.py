"""What the command line prints: one-line messages, step spinners, tables of rows and of the history (boxed on a
terminal, plain text off one), JSON lines."""

from __future__ import annotations

import base64
import contextlib
import datetime
import decimal
import json
import math
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich (bitlake[cli]), httpx (bitlake[client]) and pyspark are imported where they are used
    from rich.console import Console
    from rich.table import Table as RichTable


@contextlib.contextmanager
def step(console: Console, description: str) -> Iterator[None]:
    """A spinner with the step name and its elapsed time while the step runs, then a summary line.

    Off a terminal (CI logs, pipes) there is no spinner: the step is logged when it starts instead.
    """
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

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


def _first_line(e: Exception) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    # An error in a Python worker carries the worker's traceback, whose last line names the error.
    raised = [line for line in lines if re.match(r"[\w.]+(Error|Exception): ", line)]
    return raised[-1] if raised else lines[0] if lines else type(e).__name__


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in counts.items()) or "no counts"


def render_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, title: str = "") -> RichTable:
    from rich.table import Table as RichTable
    from rich.text import Text

    grid = RichTable(title=Text(title), title_justify="left")
    for c in columns:
        grid.add_column(c, overflow="fold")
    for row in rows:
        grid.add_row(*("∅" if v is None else str(v) for v in row))
    return grid


def render_history(history: list[dict[str, Any]]) -> RichTable:
    from rich.table import Table as RichTable

    grid = RichTable(title="history (newest first)", title_justify="left")
    for c in ("version", "time (UTC)", "operation", "batch", "counts"):
        grid.add_column(c, overflow="fold")
    for h in history:
        batch = h["batch_id"] or ", ".join(h["processed"])
        counts = ", ".join(f"{k}={v}" for k, v in h["counts"].items() if v)
        when = h["timestamp"][:19].replace("T", " ")
        grid.add_row(str(h["version"]), when, h["operation"], batch, counts)
    return grid


def print_grid(console: Console, grid: RichTable) -> None:
    """A table of :func:`render_rows` or :func:`render_history`: boxed and fitted to a terminal; off a terminal
    (a pipe, a file, ``less``) plain text, never cut or folded at 80 columns: the title, a header line and a
    line per row, columns aligned by spaces, so ``grep`` and ``cut`` see whole values."""
    if console.is_terminal:
        console.print(grid)
        return
    columns = [str(c.header) for c in grid.columns]
    cells = [[_plain(v) for v in c.cells] for c in grid.columns]
    rows = [list(r) for r in zip(*cells, strict=True)] if cells else []
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(columns)]
    lines = [str(grid.title)] if grid.title else []
    lines += ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in [columns, *rows]]
    console.file.write("".join(line + "\n" for line in lines))


def _plain(value: Any) -> str:
    # A line per row: a newline or tab inside a value is written as its escape (--json keeps values exact).
    return str(value).replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def print_json_lines(console: Console, rows: Iterable[dict[str, Any]]) -> None:
    """One JSON object per row and line (JSON lines), values JSON-typed: see :func:`json_value`."""
    write = console.file.write
    for row in rows:
        write(json_value(row) + "\n")


def json_value(value: Any) -> str:
    """``value`` (as ``pyarrow``'s ``to_pylist`` gives it) as JSON text: numbers as numbers (decimals with every
    digit; NaN and the infinities, which JSON has no number for, as the strings ``"NaN"``, ``"Infinity"``,
    ``"-Infinity"``, as Spark's JSON writer does), timestamps, dates and times as ISO-8601 strings, durations as
    ISO-8601 durations (``"PT1.5S"``), binary as base64, structs as objects, lists as arrays and maps as arrays
    of ``[key, value]`` pairs."""
    if value is None or isinstance(value, (bool, int, str)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else _NON_FINITE[str(value)]
    if isinstance(value, decimal.Decimal):
        return str(value) if value.is_finite() else json.dumps(str(value))
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return json.dumps(value.isoformat())
    if isinstance(value, datetime.timedelta):
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        return json.dumps(f"PT{decimal.Decimal(micros).scaleb(-6).normalize():f}S")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return json.dumps(base64.b64encode(bytes(value)).decode())
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k), ensure_ascii=False)}: {json_value(v)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json_value(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)


_NON_FINITE = {"nan": '"NaN"', "inf": '"Infinity"', "-inf": '"-Infinity"'}
