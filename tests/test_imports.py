"""Light imports: the table library, the trigger service's client and the command line load neither the
service's stack (FastAPI, SQLAlchemy, ...) nor Spark; a command imports those only when it needs them.

Each import runs in a fresh interpreter, since this one has loaded everything by now.
"""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEAVY = ("sqlalchemy", "fastapi", "uvicorn", "alembic", "psycopg", "pyspark")


def heavy_modules_after(code: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """The ``heavy`` modules in ``sys.modules`` once a fresh interpreter has run ``code``."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("module", ["bitlake", "bitlake.triggers.client", "bitlake.cli"])
def test_import_loads_no_service_stack_nor_spark(module):
    assert heavy_modules_after(f"import {module}") == []


@pytest.mark.parametrize("code", [
    "from bitlake.triggers import Client, Event, TriggerServiceError",  # what the Airflow provider imports
    "import bitlake.cli; bitlake.cli.build_parser()",  # bitlake --help
])
def test_the_client_side_loads_no_service_stack_nor_spark(code):
    assert heavy_modules_after(code) == []


def test_the_service_still_loads_on_first_use():
    assert {"sqlalchemy", "fastapi"} <= set(heavy_modules_after("from bitlake.triggers import create_app"))


def test_a_load_does_not_import_the_sql_compiler(tmp_path):
    """A first load in a process (create_table and an ingest: a short-lived job's whole work) does not pay for
    sqlglot (about 0.1 s); it loads with the first SQL string."""
    def load(name: str) -> str:
        return (f"import bitlake, pyarrow as pa\n"
                f"t = bitlake.create_table({str(tmp_path / name)!r}, pa.schema([('k', pa.int64()), ('d', pa.int64())]), "
                f"primary_key='k', delta_column='d')\n"
                f"t.ingest(pa.table({{'k': [1, 2], 'd': [1, 1]}}))\n"
                f"t.to_arrow()")

    assert heavy_modules_after(load("a"), ("sqlglot", *HEAVY)) == []
    assert heavy_modules_after(f"{load('b')}\nt.to_arrow(filter='k > 1')", ("sqlglot",)) == ["sqlglot"]
