import importlib.util
import os
import sys

import pytest

# The Airflow provider's tests need Apache Airflow, installed in its own environment (make test-airflow).
collect_ignore = [] if importlib.util.find_spec("airflow") else ["airflow"]

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("BITLAKE_SHUFFLE_PARTITIONS", "4")


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole test session."""
    import bitlake

    session = bitlake.spark_session("local[2]")
    yield session
    session.stop()
