"""Where each file of a table lives, relative to its base (docs/FORMAT.md, "Layout"), and how partition
values are rendered into folder names."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

DATA_DIR = "data"
META_DIR = "_bitlake"
COMMITS_DIR = "_bitlake/commits"
CHECKPOINTS_DIR = "_bitlake/state"
V1_CHECKPOINTS_DIR = "_bitlake/checkpoints"  # format v1's checkpoints: ignored by v2 readers
PARTS_DIR = "_bitlake/parts"
KEYS_DIR = "_bitlake/keys"
LOGS_DIR = "_bitlake/logs"
BITMAPS_DIR = "_bitlake/bitmaps"
KEYSTORE_DIR = "_bitlake/keystore"
TOMBSTONES_DIR = "_bitlake/tombstones"
CHANGES_DIR = "_bitlake/changes"
PUBLISHED_DIR = "_bitlake/published"
STAGING_DIR = "_bitlake/staging"  # rows of a streaming micro-batch until its commit ingests them
INDEX_DIR = "_bitlake/index"
INDEX_LOCK = "_bitlake/index.lock"
TMP_PREFIX = ".tmp-"

# Folders of files that commits name; anything in them that no commit names is a leftover.
# Folders whose files live as long as a commit names them (no commit names a staged file: cleanup removes
# those a crashed streaming query left).
REFERENCED_DIRS = (DATA_DIR, KEYS_DIR, LOGS_DIR, BITMAPS_DIR, KEYSTORE_DIR, TOMBSTONES_DIR, CHANGES_DIR, STAGING_DIR)

NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
# Bytes that stay as they are in partition folder names; every other byte of the UTF-8 text is %XX.
_UNESCAPED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~ ")


def commit_path(version: int) -> str:
    return f"{COMMITS_DIR}/{version:020d}.json"


def checkpoint_path(version: int) -> str:
    return f"{CHECKPOINTS_DIR}/{version:020d}.json"


def part_claim_path(part: int) -> str:
    return f"{PARTS_DIR}/{part:08d}"


def file_stem(part: int, seq: int) -> str:
    """``<part>-<seq>-<random>``: a landed file's name names its segment, and stays unique across task retries."""
    return f"{part:08d}-{seq:05d}-{uuid.uuid4().hex[:12]}"


def compacted_stem() -> str:
    """``c-<uuid>``: a compacted file holds rows of many segments, which its commit entry lists."""
    return f"c-{uuid.uuid4().hex}"


def data_file_path(stem: str, partition: dict[str, str | None] | None, file_format: str) -> str:
    folder = f"{DATA_DIR}/{partition_dir(partition)}" if partition else DATA_DIR
    return f"{folder}/{stem}.{file_format}"


def keys_file_path(stem: str) -> str:
    return f"{KEYS_DIR}/{stem}.parquet"


def log_path() -> str:
    return f"{LOGS_DIR}/{uuid.uuid4().hex}.parquet"


def bitmap_path() -> str:
    return f"{BITMAPS_DIR}/{uuid.uuid4().hex}.parquet"


def tombstone_path() -> str:
    return f"{TOMBSTONES_DIR}/{uuid.uuid4().hex}.parquet"


def change_path() -> str:
    return f"{CHANGES_DIR}/{uuid.uuid4().hex}.parquet"


def bucket_dir(bucket: int) -> str:
    return f"{KEYSTORE_DIR}/bucket-{bucket:05d}"


def keystore_path(bucket: int) -> str:
    """A new key-store file of bucket ``bucket``, or of several (:data:`bitlake.format.keystore.SHARED`)."""
    folder = f"{KEYSTORE_DIR}/shared" if bucket < 0 else bucket_dir(bucket)
    return f"{folder}/{uuid.uuid4().hex}.parquet"


def prior_path() -> str:
    """A new prior-entries file (:class:`bitlake.format.commit.PriorFile`)."""
    return f"{KEYSTORE_DIR}/prior/{uuid.uuid4().hex}.parquet"


def escape(text: str) -> str:
    """Percent-encodes every UTF-8 byte outside ``A-Z a-z 0-9 _ . - ~`` and space, as ``%XX`` (upper case)."""
    return "".join(chr(b) if b in _UNESCAPED else f"%{b:02X}" for b in text.encode())


def partition_dir(values: dict[str, str | None]) -> str:
    """``col=value/...`` in partition-column order (Hive style, so plain Spark discovers the folders)."""
    return "/".join(
        f"{escape(col)}={NULL_PARTITION if value is None else escape(value)}" for col, value in values.items()
    )


def partition_text(value: Any) -> str | None:
    """A partition value as the text stored in commits and rendered in folder names (docs/FORMAT.md)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        raise TypeError("binary columns cannot partition a table")
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    return str(value)
