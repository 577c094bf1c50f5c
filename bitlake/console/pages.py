"""The console's pages (GET only, nothing changes): the lake, a table (overview, timeline, batches, segments,
files and key store), its change feed, a past view, its events and trigger flows, and a mirror's progress."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from sqlalchemy import func, select

import bitlake
from bitlake.console import lake, mirror, svg
from bitlake.console.auth import WRITERS, ConsoleError, check_table, reader
from bitlake.console.roots import OutsideRoots, Roots, find_tables
from bitlake.errors import BitlakeError, TableNotFoundError
from bitlake.format import state as state_mod
from bitlake.triggers.tables import EVENTS, FLOWS
from bitlake.triggers.tokens import TokenInfo

ROWS = 100  # rows a change-feed or past-view page shows
FILES = 50  # files, segments and batches a page shows
router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
Reader = Annotated[TokenInfo, Depends(reader)]


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


templates.env.filters["bytes"] = _bytes
templates.env.filters["pct"] = lambda x: f"{100 * x:.1f} %"
templates.env.filters["num"] = lambda x: f"{x:,}" if isinstance(x, int) else x


def render(request: Request, template: str, info: TokenInfo, **context: Any) -> HTMLResponse:
    context.update(writes=info.role in WRITERS, role=str(info.role), roots=list(request.app.state.console_roots))
    return templates.TemplateResponse(request, template, context)


def open_table(request: Request, info: TokenInfo, path: str | None) -> bitlake.Table:
    """The table at ``path`` when it lies under the console's roots and the token covers it."""
    roots: Roots = request.app.state.console_roots
    try:
        normal = roots.check(path or "")
    except OutsideRoots as e:
        raise ConsoleError(403, f"refused: {e}; this console serves only tables under {', '.join(roots)}") from None
    try:
        t = bitlake.open_table(normal)
    except TableNotFoundError as e:
        raise ConsoleError(404, str(e)) from None
    except BitlakeError as e:
        raise ConsoleError(404, f"{normal}: {e}") from None
    check_table(info, t.name)
    return t


def number(text: str | None, what: str, default: int | None = None) -> int | None:
    if text is None or text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ConsoleError(400, f"{what} must be a whole number, not {text!r}") from None


def cells(table: pa.Table) -> tuple[list[str], list[list[str]]]:
    """A page of rows as text: None as an empty cell, timestamps in ISO form."""
    def text(v: Any) -> str:
        if v is None:
            return ""
        return v.isoformat() if hasattr(v, "isoformat") else str(v)

    return table.column_names, [[text(v) for v in row.values()] for row in table.to_pylist()]


@router.get("/", response_class=HTMLResponse)
def lake_page(request: Request, info: Reader):
    roots: Roots = request.app.state.console_roots
    # a symbolic link found under a root may lead out of it: such a table is not listed (nor served)
    summaries = [lake.summary(p) for root in roots for p in find_tables(root) if roots.contains(p)]
    summaries = [s for s in summaries if s.error or info.allows(s.name)]
    summaries.sort(key=lambda s: s.attention)
    return render(request, "lake.html", info, tables=summaries)


@router.get("/console/table", response_class=HTMLResponse)
def table_page(request: Request, info: Reader, path: str | None = None, page: str | None = None,
               bpage: str | None = None, spage: str | None = None, fpage: str | None = None,
               kpage: str | None = None):
    t = open_table(request, info, path)
    p = lake.timeline(t, number(page, "page", 0) or 0)
    xs, rows, sizes = p.plot
    plot = svg.lines(xs, [("valid rows", rows), ("data bytes", sizes)], title="valid rows and data bytes by version")
    segments = lake.segments(t)
    files = lake.files(t)
    batches = lake.batches(t)
    hist = svg.histogram([s["fraction"] for s in segments], title="segments by valid fraction")
    return render(request, "table.html", info, t=lake.overview(t), path=t.path, timeline=p, plot=plot,
                  mirror=mirror.status(t) is not None,
                  batches=_paged(batches, bpage, "bpage"), segments=_paged(segments, spage, "spage"),
                  files=_paged(files, fpage, "fpage"), keystore=_paged(lake.keystore(t), kpage, "kpage"),
                  histogram=hist)


def _paged(items: list, page: str | None, what: str) -> dict[str, Any]:
    pages = max(1, -(-len(items) // FILES))
    n = min(max(number(page, what, 0) or 0, 0), pages - 1)
    return {"items": items[n * FILES:(n + 1) * FILES], "page": n, "pages": pages, "total": len(items)}


@router.get("/console/changes", response_class=HTMLResponse)
def changes_page(request: Request, info: Reader, path: str | None = None, start: str | None = None,
                 end: str | None = None, offset: str | None = None):
    t = open_table(request, info, path)
    latest = t.version
    end_v = number(end, "end", latest)
    start_v = number(start, "start", max(state_mod.earliest_version(t.io), (end_v or latest) - 9))
    skip = max(number(offset, "offset", 0) or 0, 0)
    try:
        changes = t.changes_to_arrow(starting_version=start_v, ending_version=end_v)
    except BitlakeError as e:
        raise ConsoleError(400, f"change feed {start_v} to {end_v}: {e}") from None
    columns, rows = cells(changes.slice(skip, ROWS))
    return render(request, "changes.html", info, path=t.path, name=t.name, start=start_v, end=end_v, latest=latest,
                  offset=skip, total=changes.num_rows, columns=columns, rows=rows, size=ROWS)


def _event_time(text: str | None) -> Any:
    if not text:
        return None
    return int(text) if re.fullmatch(r"-?\d+", text.strip()) else text.strip()


def _window(reader: pa.RecordBatchReader, skip: int, size: int) -> tuple[list[pa.RecordBatch], bool]:
    """Rows ``skip`` to ``skip + size`` of a stream, and whether more follow; reads no further than it needs."""
    taken: list[pa.RecordBatch] = []
    seen = wanted = 0
    for batch in reader:
        if wanted == size and batch.num_rows:
            return taken, True
        start = max(skip - seen, 0)
        seen += batch.num_rows
        if start < batch.num_rows:
            part = batch.slice(start, size - wanted)
            taken.append(part)
            wanted += part.num_rows
            if wanted == size and seen > skip + size:
                return taken, True
    return taken, False


@router.get("/console/view", response_class=HTMLResponse)
def view_page(request: Request, info: Reader, path: str | None = None, version: str | None = None,
              as_of: str | None = None, valid_at: str | None = None, offset: str | None = None):
    t = open_table(request, info, path)
    v = number(version, "version")
    skip = max(number(offset, "offset", 0) or 0, 0)
    try:
        rows_reader = t.to_batches(version=v, as_of=as_of or None, valid_at=_event_time(valid_at), batch_size=4096)
        taken, more = _window(rows_reader, skip, ROWS)
    except BitlakeError as e:
        raise ConsoleError(400, f"past view: {e}") from None
    page = pa.Table.from_batches(taken, schema=rows_reader.schema)
    columns, rows = cells(page)
    return render(request, "view.html", info, path=t.path, name=t.name, version=version or "", as_of=as_of or "",
                  valid_at=valid_at or "", offset=skip, columns=columns, rows=rows, more=more, size=ROWS,
                  latest=t.version)


def flows(request: Request, table: str) -> list[dict[str, Any]]:
    """The trigger flows on ``table`` in the service's store: the last event each acknowledged, when, and how
    many of the table's registered events come after it."""
    store = request.app.state.store
    with store.engine.connect() as conn:
        latest = conn.execute(select(func.max(EVENTS.c.event_id)).where(EVENTS.c.table_name == table)).scalar()
        out = []
        for f in conn.execute(select(FLOWS).where(FLOWS.c.table_name == table).order_by(FLOWS.c.flow_name)):
            behind = conn.execute(select(func.count()).select_from(EVENTS).where(
                EVENTS.c.table_name == table, EVENTS.c.event_id > f.last_event_id)).scalar()
            out.append({"flow": f.flow_name, "last_event_id": f.last_event_id, "acked": lake.when(
                f.acked_at // 1000 if f.acked_at else None), "behind": behind})
        snapshot = conn.execute(select(func.max(EVENTS.c.snapshot_id)).where(
            EVENTS.c.table_name == table, EVENTS.c.event_id == latest)).scalar() if latest else None
    return [{"latest_event_id": latest, "latest_snapshot": snapshot}, *out]


@router.get("/console/events", response_class=HTMLResponse)
def events_page(request: Request, info: Reader, path: str | None = None, page: str | None = None):
    t = open_table(request, info, path)
    p = lake.timeline(t, number(page, "page", 0) or 0, plot=False)
    head, *flow_rows = flows(request, t.name)
    return render(request, "events.html", info, path=t.path, name=t.name, timeline=p, flows=flow_rows,
                  registered=head, latest=t.version)


@router.get("/console/mirror", response_class=HTMLResponse)
def mirror_page(request: Request, info: Reader, path: str | None = None):
    t = open_table(request, info, path)
    status = mirror.status(t)
    if status is None:
        raise ConsoleError(404, f"no PostgreSQL mirror writes {t.path}: it has no _lsn delta column and no wal- batch")
    return render(request, "mirror.html", info, path=t.path, name=t.name, m=status)
