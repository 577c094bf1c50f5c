"""What the command line prints: one-line messages, step spinners, tables of rows and of the history."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator, Sequence
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
