"""Change files: the change rows of a restatement commit, which no other metadata implies (docs/FORMAT.md,
"Change feed"). A Parquet file of row ids, each with its change type and its place among the commit's change
rows; readers take the rows' values from the data files, as for every change row. A vacuum's change file
also holds, for rows no data file holds any more, the key columns and the delta column: its rows are read
from it (the other columns null)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bitlake.format import layout
from bitlake.format.commit import ChangeFile
from bitlake.fs import FileIO

ROW_ID = "_row_id"
CHANGE_TYPE = "_change_type"
ORDER = "_order"
SCHEMA = pa.schema([pa.field(ROW_ID, pa.int64(), False), pa.field(CHANGE_TYPE, pa.string(), False),
                    pa.field(ORDER, pa.int64(), False)])


def table(*pieces: tuple[np.ndarray, str, np.ndarray]) -> pa.Table:
    """Change rows from ``(row ids, change type, places)`` pieces, sorted by place."""
    if not pieces:
        return SCHEMA.empty_table()
    rids = np.concatenate([p[0] for p in pieces]).astype(np.int64)
    kinds = np.concatenate([np.full(len(p[0]), p[1], dtype=object) for p in pieces])
    order = np.concatenate([p[2] for p in pieces]).astype(np.int64)
    t = pa.table({ROW_ID: rids, CHANGE_TYPE: pa.array(kinds, pa.string()), ORDER: order}, schema=SCHEMA)
    return t.sort_by(ORDER)


def write(io: FileIO, rows: pa.Table) -> ChangeFile:
    """Writes change rows (:data:`SCHEMA`, then any key and delta columns)."""
    path = layout.change_path()
    extra = [rows.schema.field(c) for c in rows.column_names if c not in SCHEMA.names]
    with io.open_output(path) as out:
        pq.write_table(rows.select(SCHEMA.names + [f.name for f in extra]).cast(pa.schema(list(SCHEMA) + extra)),
                       out, compression="zstd")
    return ChangeFile(path, rows.num_rows)


def read(io: FileIO, f: ChangeFile) -> pa.Table:
    return pq.read_table(io.open_input(f.path))


def carries_values(rows: pa.Table) -> bool:
    """Whether the change rows hold their own values (a vacuum's), rather than naming rows of data files."""
    return len(rows.column_names) > len(SCHEMA.names)
