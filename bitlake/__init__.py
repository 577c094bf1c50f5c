"""bitlake: mutable datasets on an immutable data lake (row ids, a key store, validity logs, bitmaps)."""

from bitlake.errors import (
    BitlakeError,
    CommitConflictError,
    CorruptTableError,
    IndexUnavailableError,
    InvalidInputError,
    NotATableError,
    NullValueError,
    SchemaMismatchError,
    TableExistsError,
    TableNotFoundError,
    UnknownOperationError,
    UnsupportedFormatVersionError,
    VersionNotFoundError,
)
from bitlake.spark.session import spark_session
from bitlake.table import IngestResult, Table, create_table, open_table

__version__ = "0.1.0"

__all__ = [
    "BitlakeError", "CommitConflictError", "CorruptTableError", "IndexUnavailableError", "IngestResult",
    "InvalidInputError",
    "NotATableError", "NullValueError", "SchemaMismatchError", "Table", "TableExistsError",
    "TableNotFoundError", "UnknownOperationError", "UnsupportedFormatVersionError", "VersionNotFoundError",
    "create_table", "open_table", "spark_session",
]
