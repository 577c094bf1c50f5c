"""bitlake's JVM side for Spark: the Java sources of ``jvm/`` (the row filter of :mod:`bitlake.spark.reader`,
``KeepRow``; the session catalog and extension that give bitlake tables names in Spark SQL, docs/spark-sql.md),
compiled on first use against the jars that PySpark ships, and kept as one jar in the user's cache folder
(``$BITLAKE_CACHE`` or ``~/.cache/bitlake``), named after the sources' and Spark's versions.

:func:`bitlake.spark_session` puts the jar on its session's classpath (``spark.jars``, which Spark also ships to
a cluster's executors). A session built otherwise takes it with ``.config("spark.jars", bitlake.spark_jar())``;
without it, or without a JDK to compile it (``javac``), reads filter rows by a join instead, which is slower
after churn and gives the same rows, and tables have no names in Spark SQL.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import zipfile

log = logging.getLogger(__name__)

SOURCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jvm")
CLASS = "io.bitlake.spark.KeepRow"
EXTENSION = "io.bitlake.spark.Extension"
CATALOG = "io.bitlake.spark.Catalog"
_lock = threading.Lock()
_built: dict[str, str | None] = {}


def _javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "javac")):
        return os.path.join(home, "bin", "javac")
    return shutil.which("javac")


def _spark_jars() -> list[str]:
    """Every jar PySpark ships: the sources use Spark's SQL, catalyst and core APIs, Scala's library, Jackson
    and RoaringBitmap."""
    import pyspark

    return sorted(glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "*.jar")))


def _sources() -> list[str]:
    return sorted(glob.glob(os.path.join(SOURCES, "*.java")))


def jar_path() -> str | None:
    """The jar, compiled now if the cache lacks it; None (and a warning, once) when no JDK can compile it."""
    with _lock:
        if SOURCES not in _built:
            _built[SOURCES] = _build()
        return _built[SOURCES]


def _build() -> str | None:
    import pyspark

    classpath = _spark_jars()
    sources = _sources()
    h = hashlib.sha256(pyspark.__version__.encode())
    for path in sources:
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read())
    digest = h.hexdigest()[:16]
    root = os.environ.get("BITLAKE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "bitlake")
    jar = os.path.join(root, "jars", f"bitlake-spark-{digest}.jar")
    if os.path.exists(jar):
        return jar
    javac = _javac()
    if javac is None or len(classpath) < 2:
        log.warning("bitlake: no javac (a JDK 17) to compile %s; Spark reads of tables with invalid rows filter "
                    "them by a join, which is slower (install openjdk-17-jdk-headless)", SOURCES)
        return None
    os.makedirs(os.path.dirname(jar), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(jar)) as work:
        out = subprocess.run([javac, "--release", "17", "-nowarn", "-cp", os.pathsep.join(classpath), "-d", work,
                              *sources], capture_output=True, text=True)
        if out.returncode != 0:
            log.warning("bitlake: compiling %s failed; Spark reads filter rows by a join:\n%s", SOURCES, out.stderr)
            return None
        staged = os.path.join(work, "bitlake-spark.jar")
        with zipfile.ZipFile(staged, "w") as z:
            for folder, _, names in os.walk(work):
                for name in names:
                    if name.endswith(".class"):
                        path = os.path.join(folder, name)
                        z.write(path, os.path.relpath(path, work))
        os.replace(staged, jar)  # atomic: a concurrent build of the same source writes the same bytes
    return jar


def register(spark) -> bool:
    """Registers the row filter as ``bitlake_keep`` in ``spark``; False when its class is not on the session's
    classpath. Remembered on the session object."""
    known = getattr(spark, "_bitlake_keep_row", None)
    if known is None:
        from pyspark.sql.types import BooleanType

        try:
            spark.udf.registerJavaFunction("bitlake_keep", CLASS, BooleanType())
            known = True
        except Exception as e:  # noqa: BLE001 - Spark reports a missing class in several ways
            log.info("bitlake: %s is not on this Spark session's classpath (%s); reads filter by a join", CLASS,
                     str(e).splitlines()[0] if str(e) else type(e).__name__)
            known = False
        spark._bitlake_keep_row = known
    return known
