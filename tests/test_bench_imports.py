"""Every benchmark script and probe imports against the package as it is: a module the package moved or renamed
fails here, not weeks later when someone runs the probe (three probes imported ``bitlake.engine.metagen`` long
after it had moved to ``bitlake.engine.write``)."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted([*BENCH.glob("*.py"), *(BENCH / "probes").glob("*.py")])


@pytest.mark.parametrize("path", SCRIPTS, ids=[str(p.relative_to(BENCH)) for p in SCRIPTS])
def test_benchmark_script_imports(path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.syspath_prepend(str(BENCH / "probes"))
    name = f"bench_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    assert module.__doc__, f"{path.name} says in its docstring what it measures and how to run it"
