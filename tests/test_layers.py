"""The house rules the code can check: dependencies go one way (format -> engine -> spark -> API/CLI ->
service), the format and the engine import no Spark, and no module is too long to walk."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parent.parent / "bitlake"
STDLIB_AND_CORE = ("pyarrow", "numpy", "pyroaring", "bitlake.errors", "bitlake.fs", "bitlake.faults", "bitlake.pool")
# What each layer may import from bitlake and beyond (the standard library is always allowed).
ALLOWED = {
    "format": STDLIB_AND_CORE + ("bitlake.format",),
    "engine": STDLIB_AND_CORE + ("bitlake.format", "bitlake.engine", "rocksdict"),
    "spark": STDLIB_AND_CORE + ("bitlake.format", "bitlake.engine", "bitlake.spark", "pyspark"),
}
THIRD_PARTY = {"pyarrow", "numpy", "pyroaring", "rocksdict", "pyspark", "pandas", "sqlalchemy", "fastapi",
               "uvicorn", "httpx", "pydantic", "alembic", "psycopg", "rich", "airflow", "deltalake", "pyiceberg"}
MAX_LINES = 650


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "bitlake":
                names.update(f"bitlake.{a.name}" for a in node.names)
            else:
                names.add(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_import_only_what_is_below_them(layer):
    wrong = {}
    for path in sorted((ROOT / layer).glob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            if top != "bitlake" and top not in THIRD_PARTY:
                continue  # the standard library
            if name == "bitlake" or not any(name == a or name.startswith(a + ".") for a in ALLOWED[layer]):
                wrong.setdefault(path.name, []).append(name)
    assert wrong == {}


def test_no_module_is_too_long_to_walk():
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
