import atexit
import importlib.metadata
import os
import shutil
import sys
import tempfile

import pytest


def _has_airflow() -> bool:
    # Asked of the installed distributions, not of the import system: with tests/ on sys.path, the folder
    # tests/airflow would pass for an "airflow" namespace package.
    try:
        importlib.metadata.version("apache-airflow-core")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# The Airflow provider's tests need Apache Airflow, installed in its own environment (make test-airflow).
collect_ignore = [] if _has_airflow() else ["airflow"]

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("BITLAKE_SHUFFLE_PARTITIONS", "4")
# The key indexes of remote tables (a local cache) go to a folder of this test session, not the user's,
# removed when the session ends.
if "BITLAKE_CACHE" not in os.environ:
    os.environ["BITLAKE_CACHE"] = tempfile.mkdtemp(prefix="bitlake-cache-")
    atexit.register(shutil.rmtree, os.environ["BITLAKE_CACHE"], True)


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole test session, as ``bitlake.spark_session`` builds it: bitlake's jar,
    its session extension and catalog (tables by name in Spark SQL, docs/spark-sql.md) and the Python data source."""
    import bitlake

    session = bitlake.spark_session("local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API on loopback (moto's server, started for the session) with one bucket; the process's
    environment points obstore and the writer processes the tests start at it. Returns a function giving a
    fresh, empty table URI under the bucket at each call."""
    from tests.s3server import start_s3_server

    server = start_s3_server()
    yield server
    server.stop()


@pytest.fixture
def s3_uri(s3_server, request):
    """A fresh ``s3://`` URI for one test."""
    return s3_server.uri(request.node.name)
