"""Ingestion: land a batch and make it visible (MetaGen), as one commit or two (docs/ingestion.md)."""

from __future__ import annotations

from typing import Any

from bitlake import batches
from bitlake.batches import IngestResult
from bitlake.engine.write.landing import Landed
from bitlake.format.commit import INGEST
from bitlake.fs import FileIO
from bitlake.transaction import Transaction

__all__ = ["IngestResult", "commit_landed", "ingest", "metagen"]


def ingest(io: FileIO, refresh, data: Any, *, op_column: str | None, batch_id: str | None, metagen: bool,
           inline: bool | None, spark: Any) -> IngestResult:
    """Ingests one batch (:meth:`bitlake.Table.ingest`)."""
    with Transaction(io, refresh) as tx:
        return batches.write(tx, data, op_column=op_column, batch_id=batch_id, metagen=metagen, inline=inline,
                             spark=spark)


def metagen(io: FileIO, refresh, *, inline: bool | None, spark: Any) -> IngestResult:
    """Makes every pending batch visible in one MetaGen commit (:meth:`bitlake.Table.metagen`)."""
    refresh().protocol.check_write(io.uri())
    with Transaction(io, refresh) as tx:
        return batches.make_live(tx, None, inline=inline, spark=spark)


def commit_landed(io: FileIO, refresh, batch: Landed, *, operation: str = INGEST) -> IngestResult:
    """Commits, with its MetaGen, a batch whose segment part was claimed and whose files were landed elsewhere (a
    Spark write's tasks: :mod:`bitlake.datasource`); its files go when no commit takes it. MetaGen runs inline:
    the caller may have no SparkSession."""
    with Transaction(io, refresh) as tx:
        tx.own_part(batch.part)
        return batches.commit_landed(tx, batch, metagen=True, inline=True, spark=None, operation=operation)


