"""The protocol: which format version and features a table needs of its readers and writers.

Modelled on Delta's ``protocol`` action: a table states a reader version and a writer version, and from
version 2 on, lists of named features. A reader refuses a table whose reader version is higher than it
implements or that names a reader feature it does not know, and names exactly what it lacks; a writer does
the same with the writer version and features. Commit 0 carries the protocol; a later commit may raise it.
"""

from __future__ import annotations

import dataclasses

from bitlake.errors import UnsupportedFormatVersionError

FORMAT_VERSION = 2

# Features this library implements (docs/FORMAT.md, "Protocol and features").
V1_HISTORY = "v1History"  # the table was upgraded from format v1: its earlier commits are v1 files
TOMBSTONES = "tombstones"  # commits may hide rows by value (docs/FORMAT.md, "Tombstones")
RESTATEMENTS = "restatements"  # commits may revert or replace batches (docs/FORMAT.md, "Restatements")
# the key store may list shared files (docs/FORMAT.md, "Key store"): writers only, readers never read the key store
SHARED_KEYSTORE_FILES = "sharedKeystoreFiles"
# a segment's valid offsets may be a bitmap and a delta to it (docs/FORMAT.md, "Bitmaps")
BITMAP_DELTAS = "bitmapDeltas"
# keys files may hold a `_position` column: deletes numbered out of input order (docs/FORMAT.md, "Keys files")
DELETE_POSITIONS = "deletePositions"
# commits may name prior-entries files (docs/FORMAT.md, "Prior entries"): writers only, which must keep them as they
# keep the key-store files
PRIOR_ENTRIES = "priorEntries"
# the key store may list a keys file as a shared file whose rows all have one `_ks_version` (docs/FORMAT.md, "Key
# store"): writers only
KEYS_FILE_ENTRIES = "keysFileEntries"
READER_FEATURES = frozenset({V1_HISTORY, TOMBSTONES, RESTATEMENTS, BITMAP_DELTAS, DELETE_POSITIONS})
WRITER_FEATURES = READER_FEATURES | {SHARED_KEYSTORE_FILES, PRIOR_ENTRIES, KEYS_FILE_ENTRIES}
_WRITER_ONLY = WRITER_FEATURES - READER_FEATURES


@dataclasses.dataclass(frozen=True)
class Protocol:
    reader_version: int = FORMAT_VERSION
    writer_version: int = FORMAT_VERSION
    reader_features: tuple[str, ...] = ()
    writer_features: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "min_reader_version": self.reader_version,
            "min_writer_version": self.writer_version,
            "reader_features": list(self.reader_features),
            "writer_features": list(self.writer_features),
        }

    @classmethod
    def from_json(cls, d: dict) -> Protocol:
        return cls(d["min_reader_version"], d["min_writer_version"], tuple(d.get("reader_features", ())),
                   tuple(d.get("writer_features", ())))

    def with_features(self, *names: str) -> Protocol:
        """This protocol with the features ``names``: as writer features, and as reader features too unless they
        are for writers only."""
        return dataclasses.replace(
            self, reader_features=tuple(sorted({*self.reader_features, *(set(names) - _WRITER_ONLY)})),
            writer_features=tuple(sorted({*self.writer_features, *names})),
        )

    def needing(self, *names: str) -> Protocol | None:
        """This protocol with the features ``names`` for a commit that starts using them, or None when it has them
        (the commit then carries no protocol)."""
        if set(names) <= set(self.writer_features):
            return None
        return self.with_features(*names)

    def check_read(self, where: str) -> None:
        _check(where, "read", self.reader_version, self.reader_features, READER_FEATURES)

    def check_write(self, where: str) -> None:
        if self.writer_version < FORMAT_VERSION:
            raise UnsupportedFormatVersionError(
                f"{where} is a format v{self.writer_version} table: this bitlake reads it but writes only format "
                f"v{FORMAT_VERSION}; run `bitlake upgrade {where}` (one commit) to write to it"
            )
        _check(where, "write", self.writer_version, self.writer_features, WRITER_FEATURES)


def _check(where: str, what: str, version: int, features: tuple[str, ...], known: frozenset[str]) -> None:
    lacking = []
    if version > FORMAT_VERSION:
        lacking.append(f"format version {version} (this bitlake implements up to {FORMAT_VERSION})")
    missing = sorted(set(features) - known)
    if missing:
        lacking.append(f"the {what} features {missing}, which this bitlake does not implement")
    if lacking:
        raise UnsupportedFormatVersionError(f"{where} needs, to {what}, {' and '.join(lacking)}: upgrade bitlake")
