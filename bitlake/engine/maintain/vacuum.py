"""The vacuum (docs/restatement.md): tombstoned rows removed physically from every data file that holds them.

A tombstone hides rows at read time; the vacuum rewrites, file by file, each data file that any version of the
retention window reads and that can hold a row the table's tombstones hide: the file's Parquet statistics
(each row group's minimum and maximum of the tombstone's column) and its segments (a batch made live before
the tombstone) say which can. Each rewrite keeps the other rows with their row ids, as a compacted file whose
offsets file says which rows it holds; a file with nothing left has no rewrite. Every version then reads the
rewrite in the file's place (docs/FORMAT.md, "Vacuum"), and the files are deleted.
"""

from __future__ import annotations

import dataclasses
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bitlake.engine.maintain import compaction
from bitlake.engine.read import plan
from bitlake.format import bitmap, commitlog, datafile, keystore, layout, rowid
from bitlake.format import state as state_mod
from bitlake.format.commit import DataFile, PurgedFile, Rewrite
from bitlake.format.metadata import deltas_as_int
from bitlake.format.state import TableState
from bitlake.fs import FileIO
from bitlake.pool import thread_map


@dataclasses.dataclass
class Prepared:
    """A vacuum written and not yet committed."""

    planned_on: int
    rewrites: list[Rewrite]
    written: list[str]
    tombstones: list[str]  # paths of the tombstones it applied
    files_considered: int
    files_read: int
    rows_purged: int  # distinct rows, however many files (of the latest version and older ones) held them
    purged: pa.Table  # a keyed table's purged rows: key columns, delta value (int64), packed row id
    purged_file: PurgedFile | None = None  # their records, once written (write_purged)
    current: pa.Table | None = None  # those of ``purged`` that were their keys' current rows


def window_files(io: FileIO, latest: TableState) -> dict[str, DataFile]:
    """Every data file a version inside the retention window reads: those of the window's first version and
    those later commits added, each read through the vacuums since."""
    start = latest.window.version if latest.window else state_mod.earliest_version(io)
    base = latest if start == latest.version else state_mod.load(io, start)
    files = dict(base.files)
    for v in range(start + 1, latest.version + 1):
        files.update({f.path: f for f in commitlog.read(io, v).add_files})
    return TableState(latest.protocol, latest.metadata, files=files).read_through(latest.rewritten).files


def prepare(io: FileIO, state: TableState, dry_run: bool = False) -> Prepared:
    """Finds and rewrites the files that hold rows the tombstones of ``state`` hide. ``dry_run``: finds them and
    the rows they hide (by the tombstones' columns and the row ids), writes nothing; ``purged`` then holds row ids
    only."""
    meta = state.metadata
    hidden = plan.tombstones(io, state)
    live = {b.part: b.live_version for b in state.parts.values() if b.live_version is not None}
    rule = plan.ReadPlan(state, None, [], [], {}, {}, bitmap.BitmapCache(io), hidden, live)
    files = window_files(io, state)

    def may_hold(f: DataFile) -> bool:
        made_live = [live.get(r.part) for r in f.segments]
        wanted = [(c, values) for w, c, values in hidden if any(v is not None and v < w for v in made_live)]
        return bool(wanted) and _in_ranges(io, f, meta.file_format, wanted)

    candidates = [f for f in files.values() if may_hold(f)]

    hidden_columns = sorted({c for _, c, _ in hidden} | set(rowid.ROW_ID_COLUMNS))
    data = datafile.data_schema(meta)

    def gone_in(table: pa.Table) -> np.ndarray:
        parts = table.column(rowid.PART_COLUMN).to_numpy()
        return rule.tombstoned(table) & np.isin(parts, list(live))  # a pending batch is made live later

    def row_ids(table: pa.Table) -> np.ndarray:
        return rowid.pack_arrays(*(table.column(c).to_numpy() for c in rowid.ROW_ID_COLUMNS))

    def rewrite(f: DataFile) -> tuple[Rewrite | None, list[str], pa.Table | None]:
        # The tombstones' columns first: a file whose statistics admitted a value may hold no hidden row. Then
        # the file streamed into its rewrite, a batch at a time (a whole file's table and its filtered copy cost
        # their memory, and on this kind of machine the first touch of every page of it).
        gone_ids = []
        for batch in datafile.read_batches(io, f.path, data, meta.file_format, hidden_columns):
            table = pa.Table.from_batches([batch])
            gone_ids.append(row_ids(table)[gone_in(table)])
        gone = sum(len(ids) for ids in gone_ids)
        if not gone:
            return None, [], None
        if dry_run:
            return Rewrite(f.path, None), [], pa.table({ROW_ID: pa.array(np.concatenate(gone_ids), pa.int64())})
        out = compaction._Output(io, meta, f.partition, compaction.ONE_FILE, f.rows - gone)
        found = []
        try:
            for batch in datafile.read_batches(io, f.path, data, meta.file_format):
                table = pa.Table.from_batches([batch])
                mask = gone_in(table)
                ids = row_ids(table)
                if mask.any():
                    found.append(_purged(table, mask, ids, meta))
                    table, ids = table.filter(pa.array(~mask)), ids[~mask]
                out.write(table, ids, f.bytes / max(1, f.rows))
            out.close()
        except BaseException:
            for path in out.written:
                io.delete(path)
            raise
        purged = pa.concat_tables(found)
        return Rewrite(f.path, out.done[0] if out.done else None), out.written, purged

    done = thread_map(rewrite, candidates)
    rewrites = [r for r, _, _ in done if r is not None]
    written = [p for _, paths, _ in done for p in paths]
    found = [t for _, _, t in done if t is not None]
    purged = pa.concat_tables(found) if found else _purged(datafile.data_schema(meta).empty_table(),
                                                             np.empty(0, bool), np.empty(0, np.int64), meta)
    ids = purged.column(ROW_ID).to_numpy()
    purged = purged.take(pa.array(np.unique(ids, return_index=True)[1]))  # a row may be in several files
    return Prepared(state.version, rewrites, written, [t.path for _, t in state.tombstones], len(files),
                    len(candidates), purged.num_rows, purged)


ROW_ID = keystore.ROW_ID  # the purged rows' columns are named as the key store names its entries'
DELTA = keystore.DELTA


def _purged(rows: pa.Table, mask: np.ndarray, ids: np.ndarray, meta) -> pa.Table:
    """Of ``rows`` (with packed row ids ``ids``), those ``mask`` purges: the columns a delete record needs (key,
    delta, those that take no null), taken before the rows are, the delta value as int64 and the packed row id (the
    row id alone on an unkeyed table)."""
    ids = ids[mask]
    if not meta.keyed:
        return pa.table({ROW_ID: pa.array(ids, pa.int64())})
    needed = [f.name for f in meta.schema if f.name in meta.primary_key or f.name == meta.delta_column
              or not f.nullable]
    rows = rows.select(needed).filter(pa.array(mask))
    return rows.append_column(
        DELTA, pa.array(deltas_as_int(rows.column(meta.delta_column), meta.delta_type))).append_column(
        ROW_ID, pa.array(ids, pa.int64()))


# A purged file's rows are in row-id order, so a batch's rows are a range of them: in row groups this small, a
# restatement of a small batch reads a few (docs/FORMAT.md, "Vacuum").
PURGED_ROW_GROUP_ROWS = 1 << 14


def write_purged(io: FileIO, meta, purged: pa.Table) -> PurgedFile | None:
    """The purged records of a keyed table (in row-id order) as a keys file (None: none), for restatements to fold
    again."""
    if not meta.keyed or not purged.num_rows:
        return None
    rows = datafile.keys_rows(purged, meta, purged.column(DELTA).to_numpy(), purged.column(ROW_ID).to_numpy(), False)
    path = layout.keys_file_path(f"purged-{uuid.uuid4().hex}")
    with io.open_output(path) as out:
        pq.write_table(rows, out, row_group_size=PURGED_ROW_GROUP_ROWS, **keystore.parquet_options(rows.schema))
    return PurgedFile(path, rows.num_rows)


def _in_ranges(io: FileIO, f: DataFile, file_format: str, wanted: list[tuple[str, pa.Array]]) -> bool:
    """Whether a row group's statistics of a tombstone's column admit one of its values (no statistics: yes)."""
    if file_format != "parquet":
        return True
    md = pq.ParquetFile(io.open_input(f.path)).metadata
    names = [md.schema.column(i).path for i in range(md.num_columns)]
    for column, values in wanted:
        if column not in names:
            continue  # a file written before the column was added holds nulls there: never a value
        if pa.types.is_floating(values.type) and pc.any(pc.is_nan(values)).as_py():
            return True  # Parquet's min and max leave NaN out: no statistics rule a NaN out
        i = names.index(column)
        for g in range(md.num_row_groups):
            stats = md.row_group(g).column(i).statistics
            if stats is None or not stats.has_min_max:
                return True
            try:
                lo, hi = pa.scalar(stats.min).cast(values.type), pa.scalar(stats.max).cast(values.type)
                inside = pc.and_(pc.greater_equal(values, lo), pc.less_equal(values, hi))
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                return True
            if pc.any(inside).as_py():
                return True
    return False
