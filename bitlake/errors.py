"""Every error bitlake raises on purpose derives from :class:`BitlakeError`."""


class BitlakeError(Exception):
    """Base class of bitlake's errors."""


class MissingDependencyError(BitlakeError, ImportError):
    """A call needs an optional package that is not installed; the message names the extra to install (``pip
    install 'bitlake[spark]'``)."""


class TableNotFoundError(BitlakeError):
    """The path does not exist."""


class NotATableError(BitlakeError):
    """The path exists but holds no bitlake table."""


class TableExistsError(BitlakeError):
    """create_table was pointed at a path that already holds a table."""


class UnsupportedFormatVersionError(BitlakeError):
    """The table was written by a newer format version than this library reads."""


class CorruptTableError(BitlakeError):
    """A metadata file fails its checksum or cannot be parsed."""


class InvalidInputError(BitlakeError):
    """A batch or an argument breaks the table's contract; nothing of it was written."""


class InvalidSettingError(InvalidInputError, ValueError):
    """A setting bitlake is given is not one it can use: an Airflow connection or operator argument, the trigger
    store's database URL. Also a ``ValueError``, which these raised before."""


class SchemaMismatchError(InvalidInputError):
    """The input's columns or types do not match the table schema."""


class BatchIdReusedError(InvalidInputError):
    """A batch id that already committed was ingested again with other records: a committed batch is changed by
    ``replace_batch`` (or ``revert_batch``), not by ingesting its id again (docs/ingestion.md)."""


class NullValueError(InvalidInputError):
    """A key column, the delta column or a non-nullable column holds a null."""


class UnknownOperationError(InvalidInputError):
    """The op column holds a value other than "upsert" or "delete"."""


class StorageError(BitlakeError):
    """The table's store refused or failed an operation: a bucket that does not exist, credentials it does not
    accept, an endpoint it cannot reach (the store's own message, first line, names the cause)."""


class ConditionalPutUnsupportedError(StorageError):
    """The store does not refuse a second conditional put of one key: committing to it is not safe."""


class CommitStateUnknownError(StorageError):
    """A commit's put failed and the log could not be read to learn whether it landed: the writer kept every file
    it wrote (reopen the table to see; ``cleanup()`` removes them if the commit did not land)."""


class CommitConflictError(BitlakeError):
    """A concurrent commit made this one impossible, and retrying could not resolve it."""


class VersionNotFoundError(BitlakeError):
    """The requested version does not exist (or is outside the retained window)."""


class VersionExpiredError(VersionNotFoundError):
    """The requested version, event time or change range starts before the table's retention window: a major
    compaction purged what it would read (docs/maintenance.md)."""


class IndexUnavailableError(BitlakeError):
    """The key index cannot be opened: another process holds it, or the table's key types or its
    ``keystore.index`` property allow none. Ingestion catches it and scans the key store instead."""
