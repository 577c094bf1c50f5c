"""The house rules the code can check: dependencies go one way, format -> engine -> operations -> API ->
CLI/service (docs/architecture.md), for every module of every package; the format and the engine import no
Spark; ingest, restatement, DML and maintenance stand side by side; no module is too long to walk."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).parent.parent / "bitlake"
# Every module, by the unit it belongs to: a package below bitlake, or a top-level module.
LAYERS = [
    ("core", {"bitlake.errors", "bitlake.sql", "bitlake.fs", "bitlake.faults", "bitlake.pool", "bitlake.memory",
              "bitlake.version"}),
    ("format", {"bitlake.format"}),
    ("engine", {"bitlake.engine", "bitlake.spark"}),
    ("operations", {"bitlake.transaction", "bitlake.changeevent", "bitlake.batches", "bitlake.ingest",
                    "bitlake.restatement", "bitlake.dml", "bitlake.maintenance", "bitlake.read", "bitlake.cdc"}),
    ("API", {"bitlake.table", "bitlake.bootstrap", "bitlake.polars"}),
    ("CLI/service", {"bitlake", "bitlake.cli", "bitlake.triggers", "bitlake.console", "bitlake.airflow", "bitlake.datasource",
                     "bitlake.mirror"}),
]
RANK = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}
SIDE_BY_SIDE = {"bitlake.ingest", "bitlake.restatement", "bitlake.dml", "bitlake.maintenance"}
NO_SPARK = {"bitlake.format", "bitlake.engine", "bitlake.fs", "bitlake.transaction", "bitlake.batches"}
THIRD_PARTY_BELOW_ENGINE = {"pyspark", "pandas", "sqlalchemy", "fastapi", "airflow"}
MAX_LINES = 650


def _unit(name: str) -> str:
    """A module's unit: its package below bitlake, or itself when it is a top-level module."""
    return ".".join(name.split(".")[:2])


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield path, ".".join(parts)


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


def test_every_module_has_a_layer():
    assert sorted({_unit(m) for _, m in _modules()} - set(RANK)) == []


@pytest.mark.parametrize("layer", [name for name, _ in LAYERS])
def test_modules_import_only_their_layer_and_those_below(layer):
    wrong = {}
    for path, module in _modules():
        unit = _unit(module)
        if LAYERS[RANK[unit]][0] != layer:
            continue
        for name in _imports(path):
            if not name.startswith("bitlake"):
                if unit in NO_SPARK and name.split(".")[0] in THIRD_PARTY_BELOW_ENGINE:
                    wrong.setdefault(module, []).append(name)
                continue
            target = _unit(name)
            if target == unit:
                continue
            above = RANK[target] > RANK[unit]
            beside = unit in SIDE_BY_SIDE and target in SIDE_BY_SIDE
            engine_on_spark = unit == "bitlake.engine" and target == "bitlake.spark"
            if above or beside or engine_on_spark:
                wrong.setdefault(module, []).append(name)
    assert wrong == {}


def test_no_module_is_too_long_to_walk():
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}
