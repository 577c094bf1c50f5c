"""A ready local SparkSession: the project's interpreter for workers, Arrow on, UTC, small shuffles, and bitlake's
jar with its session extension and catalog, which give bitlake tables names in Spark SQL (docs/spark-sql.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from bitlake.errors import BitlakeError, MissingDependencyError
from bitlake.spark import jar

SPARK_MISSING = "this needs Spark, and pyspark is not installed: pip install 'bitlake[spark]'"


def require_pyspark() -> None:
    """Raises :class:`MissingDependencyError` (one line naming the extra) when pyspark cannot be imported."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise MissingDependencyError(SPARK_MISSING, name="pyspark") from None


def check_java() -> None:
    java = shutil.which("java")
    if java is None and "JAVA_HOME" in os.environ:
        java = os.path.join(os.environ["JAVA_HOME"], "bin", "java")
    if not java or not os.path.exists(java):
        raise BitlakeError("Spark needs Java 17, and no `java` is on PATH (nor JAVA_HOME set): install openjdk-17-jre")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    if '"17' not in out and '"21' not in out:
        raise BitlakeError(f"Spark 4 needs Java 17 or 21; `java -version` says: {out.splitlines()[0] if out else '?'}")


def sql_conf(jar_file: str | None = None) -> dict[str, str]:
    """The Spark settings of bitlake's jar, its session extension and its catalog (docs/spark-sql.md), for a
    session or a Spark Connect server built by hand: ``--conf key=value`` each. Empty without a JDK to compile
    the jar. ``spark.bitlake.python`` is the interpreter of the driver's planner process (this one)."""
    jar_file = jar_file or jar.jar_path()
    if jar_file is None:
        return {}
    return {"spark.jars": jar_file, "spark.sql.extensions": jar.EXTENSION,
            "spark.sql.catalog.spark_catalog": jar.CATALOG, "spark.bitlake.python": sys.executable}


def spark_session(master: str | None = None, app_name: str = "bitlake", **conf: str):
    """Returns the active SparkSession or builds a local one configured for bitlake.

    Args:
        master: Spark master URL; default ``local[*]`` (or ``$BITLAKE_SPARK_MASTER``).
        app_name: the application name.
        **conf: extra Spark settings, e.g. ``spark_session(**{"spark.executor.memory": "2g"})``.

    Raises:
        MissingDependencyError: pyspark is not installed (``pip install 'bitlake[spark]'``).
    """
    require_pyspark()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master or os.environ.get("BITLAKE_SPARK_MASTER", "local[*]"))
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.shuffle.partitions", os.environ.get("BITLAKE_SHUFFLE_PARTITIONS", "8"))
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.driver.memory", os.environ.get("BITLAKE_DRIVER_MEMORY", "4g"))
        .config("spark.python.worker.reuse", "true")
        # A read names its files (the commit log has them), and Spark checks each one: from this many paths on
        # (default 32) in a Spark job of its own, whose start costs more than the checks on the driver
        # (docs/benchmarks.md, "Design measurements", "Spark reads").
        .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "512")
    )

    conf = dict(conf)
    for key, value in sql_conf().items():  # the row filter, and tables named in Spark SQL
        if key in ("spark.jars", "spark.sql.extensions"):  # lists: the caller's and bitlake's
            conf[key] = ",".join(j for j in (conf.get(key), value) if j)
        else:
            conf.setdefault(key, value)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("BITLAKE_SPARK_LOG_LEVEL", "ERROR"))
    return spark
