"""The docs: the site builds strictly (a broken link or a reference to a name that is gone fails), and the
```python blocks of README.md and docs/*.md run.

Each page's blocks run in order in one fresh namespace, in a temporary working folder. A block opts out with
an HTML comment on the line before its fence, which must give a reason: ``<!-- not run: needs a cluster -->``.
A block that needs Spark is marked ``<!-- spark -->``: its page then runs under the ``spark`` marker, with the
test session's SparkSession as ``spark`` in the namespace.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")
MARKER = re.compile(r"^\s*<!--\s*(?P<body>.*?)\s*-->\s*$")


@dataclass
class Block:
    line: int  # 1-based line of the opening fence
    code: str
    marker: str | None  # the HTML comment before the fence, without <!-- -->

    @property
    def not_run(self) -> bool:
        return self.marker is not None and self.marker.startswith("not run")

    @property
    def spark(self) -> bool:
        return self.marker == "spark"


def python_blocks(path: Path) -> list[Block]:
    """The page's ```python (or ```py) blocks, each with the comment on the line before its fence."""
    lines = path.read_text().splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip().split()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if info and info[0] in ("python", "py"):
            before = lines[i - 1] if i > 0 else ""
            marker = MARKER.match(before)
            body = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:end])
            blocks.append(Block(i + 1, textwrap.dedent(body) + "\n", marker["body"] if marker else None))
        i = end + 1
    return blocks


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def page_params():
    """One test a page; a page with Spark blocks gets two: the blocks before its first Spark block, unmarked (so
    the fast tests run them), and all its blocks under the spark marker."""
    for path in PAGES:
        blocks = [b for b in python_blocks(path) if not b.not_run]
        if not blocks:
            continue
        name = page_id(path)
        if not any(b.spark for b in blocks):
            yield pytest.param(path, False, id=name)
            continue
        if not blocks[0].spark:
            yield pytest.param(path, False, id=f"{name}, before Spark")
        yield pytest.param(path, True, marks=pytest.mark.spark, id=f"{name}, with Spark")


@pytest.mark.parametrize(("path", "with_spark"), list(page_params()))
def test_code_blocks_run(path: Path, with_spark: bool, tmp_path, monkeypatch, request):
    name = page_id(path)
    blocks = [b for b in python_blocks(path) if not b.not_run]
    if not with_spark:
        first_spark = next((i for i, b in enumerate(blocks) if b.spark), len(blocks))
        blocks = blocks[:first_spark]
    namespace: dict = {"__name__": f"docs:{name}"}
    if with_spark:
        namespace["spark"] = request.getfixturevalue("spark")
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        code = compile(block.code, f"{name}, block at line {block.line}", "exec")
        exec(code, namespace)  # noqa: S102 - running the docs' examples is the point


def test_opt_outs_give_a_reason():
    """``<!-- not run -->`` without a reason, or a marker the test does not know, is a mistake."""
    bad = []
    for path in PAGES:
        for b in python_blocks(path):
            if b.marker is None or b.spark:
                continue
            if not re.fullmatch(r"not run:\s*\S.*", b.marker):
                bad.append(f"{page_id(path)}:{b.line}: <!-- {b.marker} -->")
    assert not bad, "markers before ```python blocks must be <!-- spark --> or <!-- not run: REASON -->:\n" + "\n".join(bad)


def test_site_builds_strict(tmp_path):
    """mkdocs.yml's site, with --strict: a broken link, a missing anchor, a page left out of the nav or an API
    reference to a name that no longer exists fails the build."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
         "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "reference" / "table" / "index.html").exists()


def test_nav_covers_every_page():
    """Every docs/*.md page is in mkdocs.yml's nav (mkdocs would only say so at INFO level)."""
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")]
    missing = [p for p in pages if not re.search(rf":\s*{re.escape(p)}\s*$", nav, re.M)]
    assert not missing, f"pages missing from mkdocs.yml's nav: {missing}"


def test_one_install_wording():
    """bitlake installs from a clone: `pip install .` or `pip install '.[extra,...]'`, never an editable or a
    registry install in the docs (issue 41: the README mixed `pip install bitlake` and `pip install -e '.[...]'`).
    Error messages name an extra as `bitlake[spark]`; the README's install section says what that means."""
    wrong = re.compile(r"pip install (-e\b|bitlake\b|'bitlake\[)")
    bad = [f"{page_id(p)}:{n}: {line.strip()}" for p in PAGES for n, line in enumerate(p.read_text().splitlines(), 1)
           if wrong.search(line)]
    assert not bad, "\n".join(bad)
