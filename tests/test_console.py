"""The console's routes through FastAPI's TestClient on a real service app and real tables: the token and its
cookie, the roots rule, every page, the actions (refused without a write token, run with one), and that no GET
changes a table."""

from __future__ import annotations

import os
import re
from html import unescape
from urllib.parse import quote

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

import bitlake
from bitlake.console.roots import OutsideRoots, Roots
from bitlake.format import commitlog
from bitlake.fs import file_io
from bitlake.triggers import TriggerConfig, create_app
from tests.test_compaction import SCHEMA, batch, churned

PAGES = ["/", "/console/table?path={p}", "/console/changes?path={p}", "/console/view?path={p}",
         "/console/events?path={p}", "/console/action?path={p}&name=maintain"]


class Console:
    """A TestClient on a service app with the console of ``roots``, and one token per role."""

    def __init__(self, tmp_path, roots):
        self.app = create_app(TriggerConfig(db_url=f"sqlite:///{tmp_path}/service.db", token_cache_seconds=0,
                                            freeze_gc=False), console=roots)
        store = self.app.state.store
        self.read = store.create_token("consumer", ["*"], name="console (read)")
        self.write = store.create_token("admin", ["*"], name="console (write)")
        self.producer = store.create_token("producer", ["*"])
        self.http = TestClient(self.app).__enter__()

    def login(self, token: str) -> None:
        r = self.http.get(f"/?token={token}", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/", r.text

    def get(self, url: str, status: int = 200) -> str:
        r = self.http.get(url)
        assert r.status_code == status, r.text
        return r.text

    def post(self, status: int = 200, **form) -> str:
        r = self.http.post("/console/action", data=form)
        assert r.status_code == status, r.text
        return r.text

    def close(self) -> None:
        self.http.__exit__(None, None, None)


@pytest.fixture
def lake(tmp_path):
    """Two roots: ``lake`` with a churned table (a tombstone pending) and a quiet one in a sub-folder, and
    ``other`` with one table."""
    root, other = tmp_path / "lake", tmp_path / "other"
    t = churned(str(root / "sales" / "orders"))
    t.tombstone("grp", ["g1"])
    quiet = bitlake.create_table(str(root / "quiet"), SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2)
    quiet.ingest(batch(range(5), 1, 0).drop_columns(["op"]), batch_id="q0")
    far = bitlake.create_table(str(other / "far"), SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2)
    far.ingest(batch(range(3), 1, 0).drop_columns(["op"]), batch_id="f0")
    return {"root": str(root), "other": str(other), "orders": t, "quiet": quiet, "far": far}


@pytest.fixture
def console(tmp_path, lake):
    c = Console(tmp_path, [lake["root"]])
    yield c
    c.close()


def q(path: str) -> str:
    return quote(path, safe="")


def files_of(t) -> list[tuple[str, int]]:
    io = file_io(t.path)
    return [(f, io.size(f)) for f in io.walk()]


def test_every_page_needs_a_reading_token_and_the_address_token_becomes_an_httponly_cookie(console, lake):
    p = q(lake["orders"].path)
    for page in PAGES:
        assert "needs a token" in unescape(console.get(page.format(p=p), 401))
    r = console.http.get(f"/console/table?path={p}&page=0&token=blt_wrong", follow_redirects=False)
    assert r.status_code == 401 and "unknown or revoked token" in r.text
    r = console.http.get(f"/console/table?path={p}&page=0&token={console.read}", follow_redirects=False)
    assert r.status_code == 303 and console.read not in r.headers["location"]
    assert r.headers["location"] == f"/console/table?path={p}&page=0"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
    for page in PAGES:
        console.get(page.format(p=p))
    console.login(console.producer)
    assert "cannot read tables" in console.get("/", 403)


def test_the_lake_lists_every_table_under_the_roots_needing_attention_first(console, lake):
    console.login(console.read)
    html = console.get("/")
    names = re.findall(r'<a href="/console/table\?path=[^"]+">([^<]+)</a>', html)
    assert names == ["orders", "quiet"]  # orders: a tombstone, a pending batch, compaction due; far: another root
    assert "far" not in names and lake["far"].path not in html
    row = html[html.index(">orders<"):html.index(">quiet<")]
    assert "compact: " in row and ">1<" in row  # what maintain() would do; the tombstone pending


@pytest.mark.parametrize("path", [
    "{other}/far", "{root}/../other/far", "{root}/sales/../../other/far", "{root}/%2e%2e/other/far",
    "{root}2", "/etc", "file://{other}/far", "memory://lake/t", "",
])
def test_a_path_outside_the_roots_is_refused(console, lake, path):
    console.login(console.read)
    path = path.format(root=lake["root"], other=lake["other"])
    for page in PAGES[1:]:
        html = unescape(console.get(page.format(p=q(path) if "%" not in path else path), 403))
        assert "refused" in html and "far" not in html.split("refused", 1)[1].split("outside")[-1]


def test_a_symlink_out_of_a_root_is_refused(console, lake):
    console.login(console.read)
    link = os.path.join(lake["root"], "link")
    os.symlink(lake["far"].path, link)
    assert "outside the console" in unescape(console.get(f"/console/table?path={q(link)}", 403))
    assert "far" not in console.get("/")


def test_roots_compare_uris_by_scheme_host_and_path_without_dot_dot():
    roots = Roots(["s3://bucket/lake", "memory://lake/"])
    assert roots.check("s3://bucket/lake//sales/./t/") == "s3://bucket/lake/sales/t"
    assert roots.check("memory://lake/t") == "memory://lake/t"
    for outside in ["s3://bucket/lake2/t", "s3://other/lake/t", "gs://bucket/lake/t", "s3://bucket/lake/../x",
                    "s3://bucket/lake/%2E%2E/x", "memory://other/t", "/bucket/lake/t"]:
        with pytest.raises(OutsideRoots):
            roots.check(outside)


@pytest.mark.s3
def test_an_object_store_root(tmp_path, s3_server, s3_uri):
    """An s3:// root on a real S3 API: its tables are found by listing, a table of another prefix is refused."""
    t = bitlake.create_table(f"{s3_uri}/db/t", SCHEMA, primary_key=["k"], delta_column="mod", num_buckets=2)
    t.ingest(batch(range(4), 1, 0).drop_columns(["op"]), batch_id="m0")
    elsewhere = s3_server.uri("console-elsewhere")
    bitlake.create_table(f"{elsewhere}/t", SCHEMA)
    c = Console(tmp_path, [s3_uri])
    try:
        c.login(c.read)
        assert f"{s3_uri}/db/t" in c.get("/") and "console-elsewhere" not in c.get("/")
        assert "m0" in c.get(f"/console/table?path={q(s3_uri + '/db/t')}")
        for outside in [f"{elsewhere}/t", f"{s3_uri}/../console-elsewhere/t", f"{s3_uri}/%2e%2e/console-elsewhere/t"]:
            assert "refused" in c.get(f"/console/table?path={q(outside)}", 403)
    finally:
        c.close()


def test_the_table_page_shows_the_timeline_batches_and_files(console, lake):
    t = lake["orders"]
    console.login(console.read)
    html = console.get(f"/console/table?path={q(t.path)}")
    versions = [int(v) for v in re.findall(r'<tr data-version="(\d+)">', html)]
    assert versions == list(range(t.version, -1, -1))
    ops = re.findall(r'<td class="op">([A-Z_]+)</td>', html)
    assert ops == [h["operation"] for h in t.history()]
    assert "<svg" in html and "valid rows" in html
    for b in ("b0", "b4"):
        assert f"<td>{b}</td>" in html
    assert re.search(r"<td>pending</td><td[^>]*>\d+</td><td class=\"status-pending\">pending</td>", html)
    assert html.count("data/") >= t.describe()["data_files"]


def test_the_timeline_says_who_committed_and_how_long_it_took_and_the_key_store_by_bucket(console, lake,
                                                                                          monkeypatch):
    t = lake["quiet"]
    monkeypatch.setenv("BITLAKE_USER", "ana@shop")
    t.ingest(batch([7], 5, 1).drop_columns(["op"]), batch_id="q1")
    info = commitlog.read(t.io, t.version).info
    assert info["user"] == "ana@shop" and info["read_version"] == t.version - 1 and info["attempts"] == 1
    assert info["duration_ms"] >= 0 and t.history()[0]["user"] == "ana@shop"
    console.login(console.read)
    html = console.get(f"/console/table?path={q(t.path)}")
    row = re.search(rf'<tr data-version="{t.version}">.*?</tr>', html, re.S).group(0)
    assert "<td>ana@shop</td>" in row and f"{info['duration_ms'] / 1000:.2f} s" in row
    buckets = re.search(r'<table id="keystore">.*?</table>', html, re.S).group(0)
    expected = {b: sum(f.rows for f in fs) for b, fs in t.state().keystore.items()}
    assert expected and sum(expected.values()) >= 6  # a small table's keys share one file (bucket -1)
    for b, rows in expected.items():
        label = "shared" if b == -1 else b
        assert re.search(rf'<td class="n">{label}</td><td class="n">\d+</td><td class="n">{rows}</td>', buckets)


def test_the_lake_page_keeps_a_summary_while_the_version_stays(console, lake, monkeypatch):
    console.login(console.read)
    console.get("/")
    calls = []
    real = bitlake.Table.maintain
    monkeypatch.setattr(bitlake.Table, "maintain", lambda self, **kw: calls.append(self.path) or real(self, **kw))
    console.get("/")
    assert calls == []  # nothing committed: every summary kept
    lake["quiet"].ingest(batch([9], 3, 2).drop_columns(["op"]), batch_id="q2")
    html = console.get("/")
    assert calls == [lake["quiet"].path] and f">{lake['quiet'].version}<" in html


def test_the_mirror_page_reads_the_applied_lsn_and_rates_from_the_batches(tmp_path, console, lake):
    # A table as bitlake.mirror writes it: key, _lsn delta column, a snapshot batch, then wal-<slot>-<end LSN>.
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("_lsn", pa.int64())])
    t = bitlake.create_table(os.path.join(lake["root"], "pg", "users"), schema, primary_key="id", delta_column="_lsn")
    rows = lambda ids, lsn: pa.table({"id": ids, "name": [f"n{i}" for i in ids], "_lsn": [lsn] * len(ids)})  # noqa
    t.ingest(rows([1, 2, 3], 0x16B0000), batch_id="snapshot-s1")
    t.ingest(rows([2, 4], 0x16B0100), batch_id=f"wal-s1-{0x16B0180:016x}")
    t.ingest(rows([5], 0x1_0000_0010), batch_id=f"wal-s1-{0x1_0000_0040:016x}")
    console.login(console.read)
    assert "mirror of PostgreSQL" in console.get(f"/console/table?path={q(t.path)}")
    html = console.get(f"/console/mirror?path={q(t.path)}")
    assert "<td>s1</td>" in html and "<td>1/40</td>" in html  # the last step's end LSN, as PostgreSQL writes it
    steps = re.findall(r'<tr><td class="n">(\d+)</td><td>[^<]*</td><td>([0-9A-F/]+)</td><td class="n">(\d+)</td>', html)
    assert steps == [(str(t.version), "1/40", "1"), (str(t.version - 1), "0/16B0180", "2")]
    assert "mirror of PostgreSQL" not in console.get(f"/console/table?path={q(lake['quiet'].path)}")
    console.get(f"/console/mirror?path={q(lake['quiet'].path)}", 404)


def test_the_timeline_is_paged(tmp_path, console, lake):
    t = lake["quiet"]
    for i in range(30):
        t.ingest(batch([i], 10 + i, i).drop_columns(["op"]), batch_id=f"p{i}")
    console.login(console.read)
    first = console.get(f"/console/table?path={q(t.path)}")
    second = console.get(f"/console/table?path={q(t.path)}&page=1")
    assert [int(v) for v in re.findall(r'data-version="(\d+)"', first)] == list(range(t.version, t.version - 25, -1))
    assert [int(v) for v in re.findall(r'data-version="(\d+)"', second)] == list(range(t.version - 25, -1, -1))
    assert "older</a>" in first and "newer</a>" in second


def test_the_change_feed_page_is_changes_to_arrow(console, lake):
    t = lake["orders"]
    console.login(console.read)
    html = console.get(f"/console/changes?path={q(t.path)}&start=1&end={t.version}")
    expected = t.changes_to_arrow(starting_version=1, ending_version=t.version)
    table = html[html.index('<table id="changes">'):]
    rows = re.findall(r"<tr>((?:<td>[^<]*</td>)+)</tr>", table)
    assert len(rows) == min(expected.num_rows, 100) and f"{expected.num_rows} change rows" in html
    got = [re.findall(r"<td>([^<]*)</td>", r) for r in rows]
    want = [["" if v is None else v.isoformat() if hasattr(v, "isoformat") else str(v) for v in row.values()]
            for row in expected.slice(0, 100).to_pylist()]
    assert [[unescape(c) for c in r] for r in got] == want


def test_the_past_view_and_the_events(console, lake):
    t = lake["orders"]
    console.login(console.read)
    html = console.get(f"/console/view?path={q(t.path)}&version=1")
    assert len(re.findall(r"<tr><td>", html)) == t.to_arrow(version=1).num_rows == 40
    html = console.get(f"/console/view?path={q(t.path)}&version=5&valid_at=1")
    assert len(re.findall(r"<tr><td>", html)) == t.to_arrow(version=5, valid_at=1).num_rows
    assert "bad" not in console.get(f"/console/view?path={q(t.path)}&version=999", 400)
    html = console.get(f"/console/events?path={q(t.path)}")
    assert html.count("<td>BITLAKE") == 0 and "no trigger flow on orders" in html
    events = sum(len(commitlog.read(t.io, v).events) for v in range(t.version + 1))
    assert len(re.findall(r'<tr><td class="n">\d+</td>', html.split('id="events"')[1])) == events > 0


def test_the_past_view_and_the_change_feed_are_paged(console, lake):
    t = lake["quiet"]
    t.ingest(batch(range(5, 250), 2, 0).drop_columns(["op"]), batch_id="q1")
    console.login(console.read)
    view = t.to_arrow()
    pages = [console.get(f"/console/view?path={q(t.path)}&offset={o}") for o in (0, 100, 200)]
    got = [re.findall(r"<tr><td>(\d+)</td>", p) for p in pages]
    assert [len(g) for g in got] == [100, 100, 50] and sum(got, []) == [str(k) for k in view["k"].to_pylist()]
    assert ["next</a>" in p for p in pages] == [True, True, False]
    changes = t.changes_to_arrow(starting_version=t.version, ending_version=t.version)
    html = console.get(f"/console/changes?path={q(t.path)}&start={t.version}&end={t.version}&offset=200")
    assert len(re.findall(r"<tr><td>", html)) == changes.num_rows - 200 == 45 and "previous</a>" in html


def test_no_get_changes_a_table(console, lake):
    t = lake["orders"]
    before = files_of(t), t.version
    console.login(console.write)  # even with a write token
    for page in PAGES:
        console.get(page.format(p=q(t.path)))
    for action in ("maintain", "compact", "cleanup", "vacuum"):
        console.get(f"/console/action?path={q(t.path)}&name={action}&min_age=0")
    console.get(f"/console/action?path={q(t.path)}&name=revert&batch=b1")
    console.get(f"/console/table?path={q(t.path)}&page=3&bpage=2&fpage=9")
    assert (files_of(t), t.version) == before


def test_an_action_is_refused_without_a_write_token_and_runs_with_one(console, lake):
    t = lake["orders"]
    v = t.version
    console.login(console.read)
    dry = console.get(f"/console/action?path={q(t.path)}&name=revert&batch=b1")
    assert "confirm: revert" in dry and "read-only" in dry
    html = unescape(console.post(403, path=t.path, name="revert", batch="b1", version=str(v), confirm="yes"))
    assert "read-only" in html and "--allow-writes" in html and t.version == v
    # a bearer header is a session too; a producer token writes events, not tables
    r = console.http.post("/console/action", data={"path": t.path, "name": "compact", "confirm": "yes"},
                          headers={"Authorization": f"Bearer {console.producer}"})
    assert r.status_code == 403 and t.version == v

    console.login(console.write)
    assert "runs only when confirmed" in console.post(400, path=t.path, name="compact")
    assert "moved from version" in console.post(409, path=t.path, name="compact", version=str(v - 1), confirm="yes")
    assert "refused" in console.post(403, path=lake["far"].path, name="compact", confirm="yes")
    assert t.version == v
    html = console.post(path=t.path, name="revert", batch="b1", version=str(v), confirm="yes")
    assert 'id="result"' in html and t.version == v + 1 and t.history()[0]["operation"] == "REVERT"
    assert t.state().batch("b1").status == "reverted"
    html = console.post(path=t.path, name="vacuum", version=str(t.version), confirm="yes")
    assert t.history()[0]["operation"] == "VACUUM" and not t.describe()["tombstones"]
    html = console.post(path=t.path, name="maintain", min_age="0", version=str(t.version), confirm="yes")
    assert 'id="result"' in html and "compact" in html


def test_a_major_compaction_with_a_look_back(console, lake):
    t = lake["orders"]
    console.login(console.write)
    dry = console.get(f"/console/action?path={q(t.path)}&name=compact&look_back={t.version}")
    assert f'name="look_back" value="{t.version}"' in dry and f"version {t.version}" in dry
    html = console.post(path=t.path, name="compact", look_back=str(t.version), version=str(t.version), confirm="yes")
    assert 'id="result"' in html and t.describe()["window"] is not None
    assert "all versions" not in console.get(f"/console/table?path={q(t.path)}")  # the retention window shows


def test_a_token_sees_only_the_tables_its_globs_cover(tmp_path, lake):
    c = Console(tmp_path, [lake["root"]])
    try:
        c.login(c.app.state.store.create_token("consumer", ["quiet"]))
        html = c.get("/")
        assert ">quiet<" in html and ">orders<" not in html
        assert "does not cover table 'orders'" in unescape(c.get(f"/console/table?path={q(lake['orders'].path)}", 403))
    finally:
        c.close()


def test_unknown_table_and_bad_input(console, lake):
    console.login(console.read)
    assert "no such table" in console.get(f"/console/table?path={q(lake['root'] + '/nothing')}", 404)
    assert "whole number" in console.get(f"/console/table?path={q(lake['orders'].path)}&page=x", 400)
    assert "unknown action" in console.get(f"/console/action?path={q(lake['orders'].path)}&name=drop", 400)


def test_a_root_may_be_a_table_itself(tmp_path, lake):
    c = Console(tmp_path, [lake["quiet"].path])  # bitlake serve demo-lake: the demo's folder is a table
    try:
        c.login(c.read)
        assert re.findall(r'<a href="/console/table\?path=[^"]+">([^<]+)</a>', c.get("/")) == ["quiet"]
        assert "refused" in c.get(f"/console/table?path={q(lake['orders'].path)}", 403)
    finally:
        c.close()


def test_serve_refuses_console_options_without_roots(capsys):
    from bitlake.cli import main

    assert main(["serve", "--allow-writes"]) != 0
    assert "name the lake folders" in capsys.readouterr().err


def test_serve_refuses_a_token_its_store_does_not_know(tmp_path, lake, capsys):
    from bitlake.cli import main

    assert main(["serve", lake["root"], "--token", "blt_unknown", "--db-url", f"sqlite:///{tmp_path}/s.db"]) != 0
    assert "does not know this token" in capsys.readouterr().err
