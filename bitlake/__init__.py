"""bitlake: mutable datasets on an immutable data lake (row ids, a key store, validity logs, bitmaps)."""

import importlib

from bitlake.errors import (
    BatchIdReusedError,
    BitlakeError,
    CommitConflictError,
    CommitStateUnknownError,
    ConditionalPutUnsupportedError,
    CorruptTableError,
    IndexUnavailableError,
    InvalidInputError,
    InvalidSettingError,
    MissingDependencyError,
    NotATableError,
    NullValueError,
    SchemaMismatchError,
    StorageError,
    TableExistsError,
    TableNotFoundError,
    UnknownOperationError,
    UnsupportedFormatVersionError,
    VersionExpiredError,
    VersionNotFoundError,
)
from bitlake.version import __version__ as __version__

# The table API is imported on first use (PEP 562), so a process that needs one module of the package (a key
# index's SST writer, a Spark worker) does not pay for pandas, pyarrow.dataset and the rest.
_LAZY = {"ConvertResult": "bitlake.bootstrap", "convert": "bitlake.bootstrap", "IngestResult": "bitlake.table",
         "CommitResult": "bitlake.table", "DmlResult": "bitlake.dml", "MergeResult": "bitlake.dml",
         "Table": "bitlake.table", "create_table": "bitlake.table", "open_table": "bitlake.table"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bitlake' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def spark_session(master: str | None = None, app_name: str = "bitlake", **conf: str):
    """The active SparkSession, or a local one set up for bitlake: see :func:`bitlake.spark.session.spark_session`;
    ``format("bitlake")`` is registered with it.

    PySpark (``pip install 'bitlake[spark]'``) is imported here, not by ``import bitlake``; without it this raises
    :class:`MissingDependencyError`.
    """
    from bitlake.spark.session import spark_session

    spark = spark_session(master, app_name, **conf)
    register_data_source(spark)
    return spark


def register_data_source(spark) -> None:
    """Makes ``spark.read.format("bitlake")`` and ``df.write.format("bitlake")`` known to a SparkSession that
    :func:`spark_session` did not build (docs/spark.md)."""
    from bitlake.spark.session import require_pyspark

    require_pyspark()
    from bitlake.datasource import register

    register(spark)


def spark_jar() -> str | None:
    """The path of bitlake's jar for Spark (its row filter for reads; compiled on first use, needs a JDK), for a
    session :func:`spark_session` did not build: ``.config("spark.jars", bitlake.spark_jar())``. None without a
    JDK: reads then filter rows by a join, which is slower (docs/spark.md)."""
    from bitlake.spark.jar import jar_path

    return jar_path()


def foreach_batch(path: str, *, op_column: str | None = None, batch_id_prefix: str | None = None,
                  storage_options: dict | None = None):
    """A Structured Streaming ``foreachBatch`` function that ingests each epoch exactly once (docs/spark.md)."""
    from bitlake.spark.session import require_pyspark

    require_pyspark()
    from bitlake.datasource import foreach_batch as make

    return make(path, op_column=op_column, batch_id_prefix=batch_id_prefix, storage_options=storage_options)


__all__ = [
    "BatchIdReusedError", "BitlakeError", "CommitConflictError", "CommitResult", "CommitStateUnknownError",
    "ConditionalPutUnsupportedError", "ConvertResult", "CorruptTableError", "DmlResult", "IndexUnavailableError",
    "IngestResult", "MergeResult",
    "InvalidInputError", "InvalidSettingError", "MissingDependencyError", "NotATableError", "NullValueError",
    "SchemaMismatchError", "StorageError", "Table", "TableExistsError", "TableNotFoundError", "UnknownOperationError",
    "UnsupportedFormatVersionError", "VersionExpiredError", "VersionNotFoundError",
    "convert", "create_table", "foreach_batch", "open_table", "register_data_source", "spark_jar",
    "spark_session",
]
