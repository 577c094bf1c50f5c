"""Prior-entries files: what a MetaGen commit's records found in the key store (docs/FORMAT.md, "Prior entries").

One row a record of the batches the commit makes live, in row-id order: the record's ``_row_id`` and its key's
entry at the version before the commit. ``_prior_delta`` null: the key had none. ``_prior_row_id`` null (with a
delta): the entry was a visible row that this commit ended, by a record of the same key and batch, so the row id
is that SET_VALID_UNTIL event's target in the commit's log, and is not written again (it would cost a random row id
a key, most of the file). Otherwise it holds the entry's row id, and ``_prior_deleted`` says whether the entry is a
delete marker. A revert of a batch that commit made live starts its keys' history from these entries instead of
searching the key store of the version before it."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bitlake.format import layout, rowid
from bitlake.format.commit import PriorFile
from bitlake.fs import FileIO

ROW_ID = "_row_id"
DELTA = "_prior_delta"
PRIOR_ROW_ID = "_prior_row_id"
DELETED = "_prior_deleted"
SCHEMA = pa.schema([pa.field(ROW_ID, pa.int64(), False), pa.field(DELTA, pa.int64()),
                    pa.field(PRIOR_ROW_ID, pa.int64()), pa.field(DELETED, pa.bool_(), False)])
# Row ids in order, and deltas mostly alike: DELTA_BINARY_PACKED stores them in a few bits a row.
_OPTIONS = {"compression": "zstd", "use_dictionary": [DELETED],
            "column_encoding": dict.fromkeys([ROW_ID, DELTA, PRIOR_ROW_ID], "DELTA_BINARY_PACKED")}


def table(rid: np.ndarray, found: np.ndarray, delta: np.ndarray, prior_rid: np.ndarray, deleted: np.ndarray,
          in_log: np.ndarray) -> pa.Table:
    """The rows of records ``rid`` (any order) whose keys' entries were ``found``, ``delta``, ``prior_rid``,
    ``deleted``; ``in_log``: the commit's log holds the row id (the row ended by a record of the key and batch)."""
    by_row = np.argsort(rid, kind="stable")
    return pa.table([rid[by_row], pa.array(delta[by_row], mask=~found[by_row]),
                     pa.array(prior_rid[by_row], mask=(~found | in_log)[by_row]), (deleted & found)[by_row]],
                    schema=SCHEMA)


def write(io: FileIO, rows: pa.Table) -> PriorFile:
    path = layout.prior_path()
    with io.open_output(path) as out:
        pq.write_table(rows, out, **_OPTIONS, store_schema=False, write_statistics=False)
    return PriorFile(path, rows.num_rows)


def read(io: FileIO, f: PriorFile, part: int) -> pa.Table:
    """The rows of ``f`` of the records of the batch of segment part ``part`` (one range of row ids)."""
    return pq.read_table(io.open_input(f.path), schema=SCHEMA, filters=[
        (ROW_ID, ">=", part << rowid.PART_SHIFT), (ROW_ID, "<", (part + 1) << rowid.PART_SHIFT)])
