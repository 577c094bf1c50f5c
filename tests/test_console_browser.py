"""The console in a real browser: headless Chromium (Debian's ``chromium``, driven by Playwright for Python; make
test installs it) against a ``bitlake serve ROOT --allow-writes`` process on a loopback port, on tables built
here. With ``BITLAKE_CONSOLE_SCREENSHOTS=1`` the screenshots of the lake, timeline and change-feed pages are
written to docs/img/console-*.png (docs/console.md shows them); otherwise to the test's temporary folder, so a
test run leaves the tree as it was."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

import bitlake
from bitlake.triggers.store import TriggerStore
from tests.ports import free_port, wait_for_port
from tests.test_compaction import SCHEMA, batch, churned

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
DOCS_IMG = Path(__file__).resolve().parent.parent / "docs" / "img"


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """``lake/shop/orders``: an ingest of several batches, a revert, a tombstone and a compaction;
    ``lake/shop/customers``: one batch; ``elsewhere/secret``: a table outside the root."""
    base = tmp_path_factory.mktemp("console")
    orders = churned(str(base / "lake" / "shop" / "orders"))
    orders.revert_batch("b3")
    orders.tombstone("grp", ["g1"])
    assert orders.compact().version == orders.version
    customers = bitlake.create_table(str(base / "lake" / "shop" / "customers"), SCHEMA, primary_key=["k"],
                                     delta_column="mod", num_buckets=2)
    customers.ingest(batch(range(10), 1, 0).drop_columns(["op"]), batch_id="c0")
    secret = bitlake.create_table(str(base / "elsewhere" / "secret"), SCHEMA)
    return {"base": base, "root": str(base / "lake"), "orders": orders, "customers": customers, "secret": secret}


@pytest.fixture(scope="module")
def server(lake):
    """``bitlake serve ROOT --allow-writes`` in its own process; yields its read and write addresses."""
    port = free_port()
    log = lake["base"] / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "bitlake.cli", "serve", lake["root"], "--port", str(port), "--allow-writes",
             "--db-url", f"sqlite:///{lake['base']}/service.db", "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_port(port, process, "bitlake serve", output=log.read_text)
        urls = re.findall(rf"http://127\.0\.0\.1:{port}/\?token=\S+", log.read_text())
        assert len(urls) == 2, log.read_text()
        yield {"read": urls[0], "write": urls[1], "base": f"http://127.0.0.1:{port}"}
    finally:
        process.terminate()
        process.wait(30)
    with TriggerStore(f"sqlite:///{lake['base']}/service.db") as store:  # the console's tokens end with it
        assert [(t.name, t.revoked_at is not None) for t in store.tokens()] == [("console (read)", True),
                                                                                 ("console (write)", True)]


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail("Debian's chromium is missing: make test installs it (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    yield context.new_page()
    context.close()


def screenshot(page, name: str, tmp_path: Path, *, full_page: bool = False) -> None:
    path = tmp_path / f"console-{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    assert path.stat().st_size > 10_000
    if os.environ.get("BITLAKE_CONSOLE_SCREENSHOTS") == "1":
        shutil.copyfile(path, DOCS_IMG / path.name)


def table_url(server, t, route: str = "table", **params) -> str:
    extra = "".join(f"&{k}={v}" for k, v in params.items())
    return f"{server['base']}/console/{route}?path={quote(t.path, safe='')}{extra}"


def test_the_lake_and_the_timeline_of_every_commit(server, lake, page, tmp_path):
    page.goto(server["read"])
    assert "token=" not in page.url  # moved into the cookie
    names = page.locator("#tables td:first-child a").all_inner_texts()
    assert sorted(names) == ["customers", "orders"]
    assert names[0] == "orders"  # a tombstone pending and a batch pending: it needs attention first
    assert "secret" not in page.content()
    screenshot(page, "lake", tmp_path)

    page.click("text=orders")
    t = lake["orders"]
    versions = [int(v) for v in page.locator("#timeline tr[data-version] td:first-child").all_inner_texts()]
    assert versions == list(range(t.version, -1, -1))
    ops = page.locator("#timeline td.op").all_inner_texts()
    assert ops == [h["operation"] for h in t.history()]
    assert {"REVERT", "TOMBSTONE", "COMPACT"} <= set(ops) and ops[-1] == "CREATE"
    assert page.locator("svg.plot").count() == 2
    statuses = dict(zip(page.locator("#batches tr td:first-child").all_inner_texts(),
                        page.locator("#batches tr td:nth-child(3)").all_inner_texts(), strict=True))
    assert statuses == {"b0": "live", "b1": "live", "b2": "live", "b3": "reverted", "b4": "live",
                        "pending": "pending"}
    screenshot(page, "timeline", tmp_path, full_page=True)


def test_the_change_feed_page_agrees_with_changes_to_arrow(server, lake, page, tmp_path):
    t = lake["orders"]
    page.goto(server["read"])
    page.goto(table_url(server, t, "changes", start=1, end=t.version))
    expected = t.changes_to_arrow(starting_version=1, ending_version=t.version)
    assert page.locator("#changes th").all_inner_texts() == expected.column_names
    rows = [r.locator("td").all_inner_texts() for r in page.locator("#changes tr").all()[1:]]
    want = [["" if v is None else v.isoformat() if hasattr(v, "isoformat") else str(v) for v in row.values()]
            for row in expected.slice(0, 100).to_pylist()]
    assert rows == want and 0 < len(rows)
    assert f"{expected.num_rows} change rows" in page.inner_text("#summary")
    screenshot(page, "changes", tmp_path)


def test_an_action_is_refused_without_a_write_token_and_runs_with_one(server, lake, page):
    t = lake["customers"]
    version = t.version
    page.goto(server["read"])
    page.goto(table_url(server, t, "action", name="revert", batch="c0"))
    assert "c0" in page.inner_text("#plan")
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.click("#confirm button")
    assert answer.value.status == 403 and "read-only" in page.inner_text("#refused")
    assert t.version == version

    page.goto(server["write"])
    page.goto(table_url(server, t, "action", name="revert", batch="c0"))
    with page.expect_response(lambda r: r.request.method == "POST") as answer:
        page.click("#confirm button")
    assert answer.value.status == 200 and f"version {version + 1}" in page.inner_text("#result")
    assert t.version == version + 1 and t.history()[0]["operation"] == "REVERT" and t.to_arrow().num_rows == 0


def test_a_path_outside_the_roots_is_refused(server, lake, page):
    page.goto(server["read"])
    for path in (lake["secret"].path, f"{lake['root']}/../elsewhere/secret"):
        response = page.goto(f"{server['base']}/console/table?path={quote(path, safe='')}")
        assert response.status == 403 and "serves only tables under" in page.inner_text("#refused")
    response = page.goto(f"{server['base']}/")
    assert response.status == 200
