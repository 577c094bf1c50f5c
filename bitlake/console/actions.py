"""The console's actions: maintain, compact, cleanup, vacuum, revert a batch. A GET shows what the action would
do (the Table API's dry run of it) with a confirm button; only a POST with ``confirm`` from a write (admin)
token runs it."""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from starlette.concurrency import run_in_threadpool

import bitlake
from bitlake.console import lake
from bitlake.console.auth import ConsoleError, writer
from bitlake.console.pages import Reader, number, open_table, render
from bitlake.errors import BitlakeError

ACTIONS = {
    "maintain": "run what the table's metrics call for (compaction, then cleanup)",
    "compact": "a minor compaction: rewrite small files and files with many superseded rows, no view changes; with "
               "a look-back (a version, an age such as 7d, or a commit time), a major one: reads before it expire",
    "cleanup": "remove files no commit of the window references, older than the grace period",
    "vacuum": "remove the rows the table's tombstones hide from every data file, for good",
    "revert": "revert a batch: every later view as if it had never been ingested",
}
router = APIRouter(include_in_schema=False)


def _plain(value: Any) -> Any:
    """A result as nested dicts, lists and scalars, for the result page."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _action(name: str | None) -> str:
    if name not in ACTIONS:
        raise ConsoleError(400, f"unknown action {name!r}: one of {', '.join(ACTIONS)}")
    return name


def _compaction(params: dict[str, str]) -> dict[str, Any]:
    look_back = params.get("look_back")
    if not look_back:
        return {}
    return {"major": True, "look_back": int(look_back) if look_back.isdigit() else look_back}


def dry_run(t: bitlake.Table, name: str, params: dict[str, str]) -> Any:
    """What ``name`` would do now, changing nothing."""
    min_age = float(number(params.get("min_age"), "min_age", 3600) or 0)
    if name == "maintain":
        plan = t.maintain(dry_run=True, min_age_seconds=min_age)
        return {"tasks": [{"task": x.name, "reason": x.reason, "gain": x.gain} for x in plan.tasks],
                "files cleanup would remove": plan.removed}
    if name == "compact":
        return t.compact(dry_run=True, **_compaction(params))
    if name == "cleanup":
        return {"files it would remove": t.cleanup(dry_run=True, min_age_seconds=min_age)}
    if name == "vacuum":
        tombstones = t.describe()["tombstones"]
        if not tombstones:
            return {"note": "no tombstones: a vacuum would commit nothing"}
        return {"tombstones it would apply and retire": tombstones, "vacuum": t.vacuum(dry_run=True)}
    detail = lake.batch_detail(t, params.get("batch", ""))
    if detail is None:
        raise ConsoleError(404, f"no batch {params.get('batch')!r} in {t.path}")
    return {"batch": detail, "change rows the revert would write": t.revert_batch(detail["batch_id"],
                                                                                  dry_run=True).counts}


def run(t: bitlake.Table, name: str, params: dict[str, str]) -> Any:
    min_age = float(number(params.get("min_age"), "min_age", 3600) or 0)
    if name == "maintain":
        r = t.maintain(min_age_seconds=min_age)
        return {"tasks": [{"task": x.name, "reason": x.reason} for x in r.tasks],
                "compaction": _plain(r.compaction), "removed": r.removed}
    if name == "compact":
        return _plain(t.compact(**_compaction(params)))
    if name == "cleanup":
        return {"removed": t.cleanup(min_age_seconds=min_age)}
    if name == "vacuum":
        return _plain(t.vacuum())
    return _plain(t.revert_batch(params.get("batch", "")))


@router.get("/console/action", response_class=HTMLResponse)
def action_page(request: Request, info: Reader, path: str | None = None, name: str | None = None,
                batch: str | None = None, min_age: str | None = None, look_back: str | None = None):
    t = open_table(request, info, path)
    action = _action(name)
    params = {k: v for k, v in {"batch": batch, "min_age": min_age, "look_back": look_back}.items() if v}
    try:
        plan = _plain(dry_run(t, action, params))
    except BitlakeError as e:
        raise ConsoleError(400, f"{action} dry run: {e}") from None
    return render(request, "action.html", info, path=t.path, name=t.name, action=action, about=ACTIONS[action],
                  plan=plan, params=params, version=t.version, result=None)


@router.post("/console/action", response_class=HTMLResponse)
async def action_run(request: Request):
    info = await writer(request)
    form = dict(parse_qsl((await request.body()).decode("utf-8", "replace")))
    return await run_in_threadpool(_run, request, info, form)


def _run(request: Request, info, form: dict[str, str]) -> HTMLResponse:
    t = open_table(request, info, form.get("path"))
    action = _action(form.get("name"))
    params = {k: form[k] for k in ("batch", "min_age", "look_back") if form.get(k)}
    if form.get("confirm") != "yes":
        raise ConsoleError(400, f"{action} runs only when confirmed: open its dry run and press the confirm button")
    expected = number(form.get("version"), "version")
    if expected is not None and expected != t.version:
        raise ConsoleError(409, f"the table moved from version {expected} to {t.version} since the dry run: look "
                                "at the dry run again before you confirm")
    try:
        result = run(t, action, params)
    except BitlakeError as e:
        raise ConsoleError(400, f"{action} failed: {e}") from None
    finally:
        lake.forget(t.path)
    return render(request, "action.html", info, path=t.path, name=t.name, action=action, about=ACTIONS[action],
                  plan=None, params=params, version=t.version, result=result)
