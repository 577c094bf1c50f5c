"""bitlake against its peers: the same change workload on bitlake, delta-rs, pyiceberg, lance, Paimon and Spark.

TPC-H ``lineitem`` (``tpchgen-cli``) keyed by ``(l_orderkey, l_linenumber)`` with an integer delta column
``l_delta`` (0 for the base, ``k`` for change batch ``k``). Per scale factor the batches are generated
once (same seed) and written as Parquet files; every system then starts each timed operation from the
same file:

1. ``load``: the base;
2. ``upsert``: change batches of 0.1 %, 1 % and 10 % of the base rows, each 95 % updates of random
   existing keys (``l_quantity + 1``) and 5 % new keys beyond the largest ``l_orderkey``;
3. ``delete``: 0.1 % random existing keys (key and delta columns only);
4. ``scan_full``: an aggregate over every column (core.py's); ``scan_selective``: the same over the rows
   with ``l_shipdate`` in March 1995. One warm-up, then the median of ``--runs`` runs.

Each system runs in its own subprocess (``--worker``), which reports one JSON line per operation; an
operation that passes ``--timeout`` gets its process group killed and is recorded as timed out, a
failure is recorded with its error, and the run goes on with the next system. The Paimon workers run with
the interpreter of ``.venv-paimon`` (``make setup-paimon``): pypaimon needs pyarrow < 20, bitlake's
environment has pyarrow 26. Their process imports only this file, core.py, pyarrow and numpy (no bitlake,
no Spark).

Results go to ``benchmarks/results/peers-<date>.json`` (records of the same day's file for other
systems or scale factors are kept) and to the section "## Peers: bitlake against delta-rs, pyiceberg,
lance, Paimon and plain Spark" of ``docs/benchmarks.md``, with plots under ``docs/img/``.

    .venv/bin/python benchmarks/peers.py --scale-factors 0.1,1,3           # what `make bench-peers` runs
    .venv/bin/python benchmarks/peers.py --scale-factors 0.1 --systems deltalake,limits
    .venv/bin/python benchmarks/peers.py --scale-factors 1 --systems bitlake-arrow,lance,paimon
    .venv/bin/python benchmarks/peers.py --render-only benchmarks/results/peers-2026-11-23.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import functools
import json
import multiprocessing
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from decimal import Decimal
from importlib import metadata as importlib_metadata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

import core  # noqa: E402  (benchmarks/ is not a package)
import peers_summary  # noqa: E402
from core import CODEC, DELTA, PRIMARY_KEY, ROOT, log, sf_text  # noqa: E402

WORK_DIR = ROOT / "benchmarks" / "work" / "peers"
RESULTS_DIR = ROOT / "benchmarks" / "results"
IMG_DIR = ROOT / "docs" / "img"
SECTION = "## Peers: bitlake against delta-rs, pyiceberg, lance, Paimon and plain Spark"
OLD_SECTION_PREFIX = "## Peers: bitlake against"  # the section's heading before it named lance and Paimon
PAIMON_PYTHON = Path(os.environ.get("BITLAKE_PAIMON_PYTHON", ROOT / ".venv-paimon" / "bin" / "python"))

SEED = 42
UPSERT_FRACTIONS = (0.001, 0.01, 0.10)
DELETE_FRACTION = 0.001
UPDATE_SHARE = 0.95
MONTH = (dt.date(1995, 3, 1), dt.date(1995, 4, 1))  # the selective scan: l_shipdate in [start, end)
# The operations on the table after the batches and scans, in this order (each system offers what it can):
# a past view (the base, by version), the change feed of the 1 % batch, an update and a delete by condition
# (one day of l_shipdate each, ~0.04 % of the rows), the rows of 1,000 suppliers erased (bitlake: tombstone and
# vacuum; the peers: a delete of the same rows), a compaction, the current rows counted (every system that ran
# the writes before must hold the same), and bitlake's revert of the 0.1 % batch.
MORE_OPS = ("past_scan", "change_feed", "update_where", "delete_where", "erase", "compact", "count", "revert")
MORE_WRITES = ("update_where", "delete_where", "erase")  # what the count depends on
UPDATE_DAY, DELETE_DAY = dt.date(1996, 6, 3), dt.date(1996, 6, 4)
ERASED_SUPPLIERS = 1000  # l_suppkey 1..1000, or a tenth of the suppliers when there are fewer than 10,000


MORE_DOC = {
    "past_scan": "a full scan of the base by version (bitlake `open_table(path, version=)`, delta-rs `DeltaTable(uri, "
                 "version=0)`, lance `lance.dataset(uri, version=1)`, Paimon `copy({'scan.snapshot-id': '1'})`), "
                 "aggregated as the full scan",
    "change_feed": "the change feed of the 1 % batch's commit into Arrow (bitlake `changes_to_arrow`; its rows: "
                   "pre- and post-images of updates, inserts)",
    "update_where": "`l_quantity + 1` where `{day}` (`update`: bitlake's and delta-rs's names, lance's "
                    "`update(values, where=)`)",
    "delete_where": "a delete of the rows where `{day}`",
    "erase": "the rows of 1,000 suppliers (`l_suppkey` 1..1000; a tenth of them below scale factor 1) erased: "
             "bitlake `tombstone` then `vacuum` (times of both; the tombstone alone hides the rows), delta-rs and "
             "lance `delete(\"l_suppkey IN (...)\")` (delta-rs rewrites the files; lance marks the rows in deletion "
             "files, the data staying in the files until a compaction: the target holds bitlake against delta-rs)",
    "compact": "bitlake `compact()` (minor), delta-rs `optimize.compact()`, lance `optimize.compact_files()`",
    "count": "the current rows counted (each system that ran the three writes above must hold bitlake's count)",
    "revert": "bitlake `revert_batch` of the 0.1 % batch (against that batch's upsert in the targets)",
}


def day_condition(day: dt.date) -> str:
    return f"l_shipdate = CAST('{day}' AS DATE)"


def erase_condition(suppliers: list[int]) -> str:
    return f"l_suppkey IN ({', '.join(map(str, suppliers))})"


class NotOffered(Exception):
    """An operation a system does not offer (recorded as "not offered: why")."""

# bitlake's ingestion modes. Each is the keyword arguments of Table.ingest, whether Table.metagen()
# follows (timed with it) and the input: a Spark DataFrame (`spark.read.parquet`, the default) or a pyarrow
# Table (`pq.read_table`, "input": "arrow"); a new mode is one more line here.
BITLAKE_MODES: dict[str, dict] = {
    "bitlake": {"ingest": {}, "then_metagen": False,
                "doc": "`t.ingest(spark.read.parquet(file))`: landing and MetaGen in one call, MetaGen chosen by "
                       "bitlake (inline on the driver with the RocksDB key index up to `metagen.inline_max_rows` "
                       "records, a Spark job beyond; the default was 2,000,000 until commit ae2f06f and is "
                       "100,000,000 since); the batch file, a plain scan of Parquet, lands from the file: read by "
                       "the driver with pyarrow when at most `ingest.driver_max_bytes` (64 MB), else by a landing "
                       "job whose tasks read its row groups (since commit 0d426e6; before, a DataFrame Spark "
                       "estimated at most 64 MB was collected as Arrow, a larger one landed from its rows); the "
                       "delete batch (`withColumn(\"op\", lit(\"delete\"))`) is collected as Arrow"},
    "bitlake-arrow": {"ingest": {}, "then_metagen": False, "input": "arrow",
                      "doc": "the same call with Arrow input: `t.ingest(pq.read_table(file))` (the delete batch "
                             "with an `op` column of `\"delete\"` appended by pyarrow, `op_column=\"op\"`); the "
                             "batch lands on the driver without Spark, MetaGen as for bitlake; scans: "
                             "`to_spark` (Spark) and `t.to_batches(columns, filter)` (pyarrow: the view streamed, "
                             "the selective scan's filter pushed down to the files as the peers' scanners take "
                             "theirs; before 2026-11-28 22:00 UTC, `t.to_arrow()` then a filter)"},
    "bitlake-spark": {"ingest": {"inline": False}, "then_metagen": False,
                      "doc": "`t.ingest(batch, inline=False)`: MetaGen always as a Spark job (batch MetaGen)"},
    "bitlake-two-step": {"ingest": {"metagen": False}, "then_metagen": True,
                         "doc": "`t.ingest(batch, metagen=False)` then `t.metagen()`, both timed"},
}
PEERS = ["deltalake", "iceberg", "lance", "paimon", "paimon-python", "spark-rewrite"]
COPY_ON_WRITE = {"deltalake", "iceberg", "spark-rewrite"}
PAIMON_SYSTEMS = {"paimon", "paimon-python"}  # run by .venv-paimon's interpreter
LIMITS = "limits"
SYSTEMS = [*BITLAKE_MODES, LIMITS, *PEERS]  # limits reads the first bitlake mode's data files
SYSTEM_DOC = {
    "deltalake": "delta-rs: `write_deltalake`; `DeltaTable.merge(batch, predicate=<keys equal>, "
                 "source_alias='s', target_alias='t').when_matched_update_all().when_not_matched_insert_all()"
                 ".execute()`; the delete batch through the same merge with `.when_matched_delete()` (what a "
                 "user does with a list of composite keys: a `delete(predicate)` would need one "
                 "`(l_orderkey = .. AND l_linenumber = ..)` term per key)",
    "iceberg": "pyiceberg with a `SqlCatalog` on SQLite: `append` for the base, `upsert(batch, "
               "join_cols=[l_orderkey, l_linenumber])`, `delete(create_match_filter(keys, join_cols))` "
               "(the key filter `upsert` builds itself)",
    "spark-rewrite": "plain Spark on a Parquet folder: read the current snapshot, left-anti join it with the "
                     "batch's keys, union the batch's rows (none for the delete batch), write a new snapshot "
                     "folder, switch a pointer file to it and remove the old one",
    "lance": "lance (pylance): `lance.write_dataset(table, uri)`; `ds.merge_insert([l_orderkey, l_linenumber])"
             ".when_matched_update_all().when_not_matched_insert_all().execute(batch)`; the delete batch "
             "through `merge_insert(keys).when_matched_delete().execute(keys)`; scans `ds.scanner(columns, "
             "filter)` into Arrow batches (lance's default write parameters: fragments of at most 1,048,576 rows; "
             "updated and deleted rows are marked in deletion files, the new rows go to new fragments)",
    "paimon": "pypaimon (Apache Paimon's Python library, in `.venv-paimon` with pyarrow < 20) with its Rust "
              "reader and writer (`pypaimon-rust`, table options `read.native.enabled` and "
              "`write.native.enabled`): a primary-key table on (l_orderkey, l_linenumber) with 4 buckets in a "
              "filesystem catalog (deduplicate merge engine: the last record of a key wins). Load and upserts "
              "are batch writes of the rows (`new_batch_write_builder()`, `write_arrow`, `prepare_commit`, "
              "`commit`); the delete batch is the keys with `-D` as their row kind: pypaimon writes deletes to "
              "a primary-key table only through `rowkind.field`, so the table has one more string column, `op` "
              "(`+I` on every written row, `-D` on the delete batch, whose other columns are null). No "
              "compaction runs (pypaimon does not compact), so reads merge the sorted runs of each bucket; "
              "scans `new_read_builder().with_projection(columns)` (+ `with_filter` on l_shipdate for the "
              "selective scan, the rows filtered again by pyarrow) `.to_arrow_batch_reader(splits)`",
    "paimon-python": "the same pypaimon table and calls with pypaimon's defaults: its pure-Python writer and "
                     "reader (no `read.native.enabled` / `write.native.enabled`)",
    LIMITS: "the change alone: read the batch file and write it again as one Parquet file (pyarrow, snappy); "
            "storage: the base and the batches as Parquet files; scans: plain Spark and plain pyarrow over "
            "bitlake's committed data files, no filtering of invalid rows",
}
ARROW_SYSTEMS = {"deltalake", "iceberg", "lance", "paimon", "paimon-python"}  # read by their own readers into Arrow


def fraction_text(f: float | None) -> str:
    return "—" if f is None else f"{f * 100:g} %"


def mb(n: float | None) -> str:
    return "—" if n is None else f"{n / 1e6:,.2f} MB"


# ------------------------------------------------------------------------------------------ data


class BaseFile:
    """The base rows as a Parquet file, read a row group at a time: no process of the benchmark holds the whole
    base (27 GB of Arrow at scale factor 30). ``take`` reads the row groups holding the rows asked for."""

    def __init__(self, path: Path):
        self.file = pq.ParquetFile(path)
        counts = [self.file.metadata.row_group(i).num_rows for i in range(self.file.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_rows = int(self.starts[-1])

    def column_chunks(self, name: str):
        for i in range(self.file.num_row_groups):
            yield self.file.read_row_group(i, columns=[name]).column(0)

    def take(self, idx: np.ndarray) -> pa.Table:
        """The rows at positions ``idx`` (repeats allowed), in that order."""
        idx = np.asarray(idx, dtype=np.int64)
        order = np.argsort(idx, kind="stable")
        wanted = idx[order]
        groups = np.searchsorted(self.starts, wanted, side="right") - 1
        parts = []
        for g in np.unique(groups):
            lo, hi = np.searchsorted(groups, [g, g + 1])
            parts.append(self.file.read_row_group(int(g)).take(pa.array(wanted[lo:hi] - self.starts[g])))
        got = pa.concat_tables(parts) if parts else self.file.schema_arrow.empty_table()
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        return got.take(pa.array(inverse))


def file_stream(path: str | Path) -> pa.RecordBatchReader:
    """A Parquet file as a stream, a row group at a time (what a load takes: the base never whole in memory;
    ``ParquetFile.iter_batches`` buffers ahead of its consumer)."""
    f = pq.ParquetFile(path)
    return pa.RecordBatchReader.from_batches(
        f.schema_arrow, (b for i in range(f.num_row_groups) for b in f.read_row_group(i).to_batches()))


def write_base(source: Path, path: Path, rows_per_group: int = 1 << 20) -> int:
    """The generator's file as the table's rows (core.base_columns), streamed into ``path``; returns its size."""
    src = pq.ParquetFile(source)
    schema = core.table_schema(src.schema_arrow)
    path.parent.mkdir(parents=True, exist_ok=True)
    pending: list[pa.Table] = []
    with pq.ParquetWriter(path, schema, compression=CODEC) as out:
        for i in range(src.num_row_groups):
            pending.append(pa.Table.from_arrays(core.base_columns(src.read_row_group(i), schema), schema=schema))
            if sum(t.num_rows for t in pending) >= rows_per_group or i == src.num_row_groups - 1:
                out.write_table(pa.concat_tables(pending))
                pending = []
    return path.stat().st_size


class PeerChanges:
    """The batches of this benchmark: upserts (updates of random base keys, new keys) and a delete batch.

    Unlike core.ChangeMaker the upsert batches carry no deletes (the issue's workload); the expected
    final row count, sum of ``l_quantity`` and rows of the selective scan are tracked as it goes.
    """

    def __init__(self, base: BaseFile, seed: int):
        self.base = base
        self.rng = np.random.default_rng(seed)
        self.updated = np.zeros(base.num_rows, dtype=bool)
        self.deleted = np.zeros(base.num_rows, dtype=bool)
        self.next_orderkey = max(pc.max(c).as_py() for c in base.column_chunks("l_orderkey")) + 1
        self.inserted_rows = 0
        self.inserted_qty = 0.0
        self.inserted_in_month = 0
        self.qty = np.concatenate([c.cast(pa.float64()).to_numpy() for c in base.column_chunks("l_quantity")])
        self.in_month = np.concatenate([
            pc.and_(pc.greater_equal(c, pa.scalar(MONTH[0])), pc.less(c, pa.scalar(MONTH[1])))
            .to_numpy(zero_copy_only=False) for c in base.column_chunks("l_shipdate")])

    def _with_delta(self, table: pa.Table, k: int) -> pa.Table:
        i = table.schema.get_field_index(DELTA)
        return table.set_column(i, DELTA, pa.array(np.full(table.num_rows, k, dtype=np.int32)))

    def upsert(self, k: int, fraction: float) -> tuple[pa.Table, dict]:
        n = max(2, round(fraction * self.base.num_rows))
        updates = round(UPDATE_SHARE * n)
        inserts = n - updates
        live = np.flatnonzero(~self.deleted)
        upd_idx = np.sort(self.rng.choice(live, size=updates, replace=False))
        self.updated[upd_idx] = True
        upd = self.base.take(upd_idx)
        qty = upd.column("l_quantity")
        upd = upd.set_column(upd.schema.get_field_index("l_quantity"), "l_quantity",
                             pc.add(qty, pa.scalar(Decimal("1.00"), qty.type)).cast(qty.type))
        src = self.rng.integers(0, self.base.num_rows, size=inserts)
        ins = self.base.take(src)
        keys = np.arange(self.next_orderkey, self.next_orderkey + inserts, dtype=np.int64)
        self.next_orderkey += inserts
        ins = ins.set_column(ins.schema.get_field_index("l_orderkey"), "l_orderkey",
                             pa.array(keys, ins.schema.field("l_orderkey").type))
        ins = ins.set_column(ins.schema.get_field_index("l_linenumber"), "l_linenumber",
                             pa.array(np.ones(inserts, dtype=np.int32), ins.schema.field("l_linenumber").type))
        self.inserted_rows += inserts
        self.inserted_qty += float(self.qty[src].sum())
        self.inserted_in_month += int(self.in_month[src].sum())
        batch = pa.concat_tables([self._with_delta(upd, k), self._with_delta(ins, k)])
        batch = batch.take(pa.array(self.rng.permutation(batch.num_rows)))  # a change stream is unordered
        return batch, {"records": n, "updates": updates, "inserts": inserts, "deletes": 0}

    def delete(self, k: int, fraction: float) -> tuple[pa.Table, dict]:
        n = max(1, round(fraction * self.base.num_rows))
        live = np.flatnonzero(~self.deleted)
        idx = self.rng.choice(live, size=n, replace=False)
        self.deleted[idx] = True
        keys = self._with_delta(self.base.take(idx), k).select([*PRIMARY_KEY, DELTA])
        return keys, {"records": n, "updates": 0, "inserts": 0, "deletes": n}

    def expected(self) -> dict:
        keep = ~self.deleted
        return {
            "rows": int(keep.sum()) + self.inserted_rows,
            "sum_l_quantity": round(float(self.qty[keep].sum() + self.updated[keep].sum()) + self.inserted_qty, 2),
            "selective_rows": int(self.in_month[keep].sum()) + self.inserted_in_month,
        }


def prepare(sf: float, folder: Path, quick: bool) -> dict:
    """Writes the base and the batches of one scale factor; returns the spec every worker reads."""
    source = core.lineitem(sf)
    batches_dir = folder / "batches"
    base_file = batches_dir / "0-base.parquet"
    size = write_base(source, base_file)
    base = BaseFile(base_file)
    ops = [{"operation": "load", "batch_fraction": None, "file": str(base_file), "change_parquet_bytes": size,
            "composition": {"records": base.num_rows}, "k": 0}]
    maker = PeerChanges(base, SEED)
    fractions = UPSERT_FRACTIONS[:2] if quick else UPSERT_FRACTIONS
    for k, fraction in enumerate(fractions, start=1):
        batch, comp = maker.upsert(k, fraction)
        path = batches_dir / f"{k}-upsert-{fraction:g}.parquet"
        ops.append({"operation": "upsert", "batch_fraction": fraction, "file": str(path),
                    "change_parquet_bytes": core.write_parquet(batch, path), "composition": comp, "k": k})
    k = len(fractions) + 1
    keys, comp = maker.delete(k, DELETE_FRACTION)
    path = batches_dir / f"{k}-delete-{DELETE_FRACTION:g}.parquet"
    ops.append({"operation": "delete", "batch_fraction": DELETE_FRACTION, "file": str(path),
                "change_parquet_bytes": core.write_parquet(keys, path), "composition": comp, "k": k})
    expected = {**maker.expected(), "past_rows": base.num_rows, "past_sum_l_quantity": round(float(maker.qty.sum()), 2)}
    suppliers = max(pc.max(c).as_py() for c in base.column_chunks("l_suppkey"))
    spec = {"scale_factor": sf, "base_rows": base.num_rows, "source": str(source), "ops": ops,
            "erased_suppliers": max(1, min(ERASED_SUPPLIERS, suppliers // 10)),
            "expected": expected, "runs": 1 if quick else 3, "warmup": not quick}
    (folder / "spec.json").write_text(json.dumps(spec, indent=1))
    return spec


def prepare_apart(sf: float, folder: Path, quick: bool) -> dict:
    """:func:`prepare` in a process of its own: the tables it builds (11 GB at scale factor 10) would stay in
    this process's memory beside every system's worker, which the kernel killed at SF 10."""
    child = multiprocessing.get_context("spawn").Process(target=prepare, args=(sf, folder, quick))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"generating the batches of SF {sf_text(sf)} failed (exit code {child.exitcode})")
    return json.loads((folder / "spec.json").read_text())


# --------------------------------------------------------------------------------------- systems


def arrow_aggregate(batches, schema: pa.Schema) -> dict:
    """core.aggregate's figures (count, sums of numbers, max of the rest) computed with pyarrow, batch by batch."""
    rows, sums, maxes = 0, {}, {}
    for b in batches:
        rows += b.num_rows
        for f in schema:
            col = b.column(f.name)
            t = f.type
            if pa.types.is_integer(t) or pa.types.is_decimal(t) or pa.types.is_floating(t):
                s = pc.sum(col).as_py()
                if s is not None:
                    sums[f.name] = sums.get(f.name, 0) + s
            else:
                m = pc.max(col).as_py()
                if m is not None and (f.name not in maxes or m > maxes[f.name]):
                    maxes[f.name] = m
    return {"rows": rows, "sum_l_quantity": float(sums.get("l_quantity", 0))}


def spark_figures(row) -> dict:
    return {"rows": int(row["_rows"]), "sum_l_quantity": float(row["sum_l_quantity"] or 0)}


def month_filter_spark():
    from pyspark.sql import functions as F

    return (F.col("l_shipdate") >= F.lit(MONTH[0])) & (F.col("l_shipdate") < F.lit(MONTH[1]))


def month_filter_arrow():
    import pyarrow.dataset as ds

    return (ds.field("l_shipdate") >= pa.scalar(MONTH[0])) & (ds.field("l_shipdate") < pa.scalar(MONTH[1]))


class System:
    """One system under test, living in ``folder``. Every operation starts from a Parquet file."""

    engine = "spark"
    erased: list[int] = []  # the suppliers whose rows `erase` removes (set by the worker from the spec)

    def __init__(self, name: str, folder: Path, schema: pa.Schema):
        self.name, self.folder, self.schema = name, folder, schema
        self.folder.mkdir(parents=True, exist_ok=True)

    def load(self, path: str, k: int = 0) -> dict:
        raise NotImplementedError

    def upsert(self, path: str, k: int) -> dict:
        raise NotImplementedError

    def delete(self, path: str, k: int) -> dict:
        raise NotImplementedError

    def scan(self, selective: bool) -> dict:
        raise NotImplementedError

    def current_data_bytes(self) -> int | None:
        return None

    def past_scan(self) -> dict:
        raise NotOffered("no past versions")

    def change_feed(self) -> dict:
        raise NotOffered("no change feed")

    def update_where(self) -> dict:
        raise NotOffered("no update by condition")

    def delete_where(self) -> dict:
        raise NotOffered("no delete by condition")

    def erase(self) -> dict:
        raise NotOffered("no delete by condition")

    def compact(self) -> dict:
        raise NotOffered("no compaction")

    def count(self) -> dict:
        raise NotOffered("no count")

    def revert(self) -> dict:
        raise NotOffered("no revert of a batch (a restore drops every later commit)")

    def settle(self) -> None:
        """Waits for writes an operation left running in the background, once its wall time is taken, so that
        its bytes are counted with it."""


class SparkSystem(System):
    # Whether its loads and batches run on Spark; if not, the session starts before its scans only, so that no
    # JVM starting up (its JIT compiling after the first job) shares the cores with them.
    spark_in_ops = True

    @functools.cached_property
    def spark(self):
        import bitlake

        return bitlake.spark_session(os.environ.get("BITLAKE_SPARK_MASTER", "local[2]"),
                                     app_name=f"bitlake-bench-peers-{self.name}")

    def warm_up(self, file: str) -> None:
        """A first small job, which loads the JVM's classes: they would otherwise be charged to what runs next."""
        self.spark.read.parquet(file).limit(10).collect()

    def aggregate(self, df, selective: bool) -> dict:
        if selective:
            df = df.filter(month_filter_spark())
        return spark_figures(core.aggregate(df, self.schema).collect()[0])


class Bitlake(SparkSystem):
    def __init__(self, name, folder, schema):
        super().__init__(name, folder, schema)
        self.mode = BITLAKE_MODES[name]
        self.table = None
        self.versions: dict[int, int] = {}  # batch k's commit

    def _ingest(self, df, k: int, op_column: str | None) -> dict:
        t0 = time.perf_counter()
        r = self.table.ingest(df, op_column=op_column, batch_id=f"peers-{k}", **self.mode["ingest"])
        phases = {"ingest_s": time.perf_counter() - t0}
        if self.mode["then_metagen"]:
            t1 = time.perf_counter()
            r = self.table.metagen()
            phases["metagen_s"] = time.perf_counter() - t1
        self.versions[k] = self.table.version
        return {"counts": r.counts, "phases": phases}

    def past_scan(self):
        import bitlake

        past = bitlake.open_table(str(self.folder / "table"), version=self.versions[0])
        return arrow_aggregate(past.to_batches(columns=self.schema.names), self.schema)

    def change_feed(self):
        v = self.versions[2]  # the 1 % batch's commit
        return {"rows": self.table.changes_to_arrow(starting_version=v, ending_version=v).num_rows}

    def update_where(self):
        r = self.table.update(predicate=day_condition(UPDATE_DAY), updates={"l_quantity": "l_quantity + 1"})
        return {"counts": _jsonable(fields_of(r))}

    def delete_where(self):
        return {"counts": _jsonable(fields_of(self.table.delete(predicate=day_condition(DELETE_DAY))))}

    def erase(self):
        t0 = time.perf_counter()
        self.table.tombstone("l_suppkey", self.erased)
        t1 = time.perf_counter()
        r = self.table.vacuum()
        phases = {"tombstone_s": t1 - t0, "vacuum_s": time.perf_counter() - t1}
        return {"counts": _jsonable(fields_of(r)), "phases": phases}

    def compact(self):
        return {"counts": _jsonable(fields_of(self.table.compact()))}

    def count(self):
        return {"rows": sum(b.num_rows for b in self.table.to_batches(columns=["l_orderkey"]))}

    def revert(self):
        return {"counts": self.table.revert_batch("peers-1").counts}

    @property
    def arrow_input(self) -> bool:
        return self.mode.get("input") == "arrow"

    @property
    def spark_in_ops(self) -> bool:
        return not self.arrow_input

    def settle(self) -> None:
        from bitlake.engine.keys.indexsession import join_compactions

        # The key index's update after a commit runs on a thread; its entries then stay in RocksDB's memtable, written
        # when it fills, when SST files overlapping them go in or when the index closes, counted in that operation.
        # A large upsert's SST files over the index's newer entries set off a compaction in RocksDB's background:
        # counted in the upsert (at SF 30 it ran into the delete after it, whose bytes it was, 36 MB of 37).
        join_compactions()

    def _read(self, path):
        """The batch file as the mode's input: read inside the timed call, as for the peers."""
        return pq.read_table(path) if self.arrow_input else self.spark.read.parquet(path)

    def load(self, path, k=0):
        t0 = time.perf_counter()
        import bitlake

        self.table = bitlake.create_table(str(self.folder / "table"), self.schema, primary_key=PRIMARY_KEY,
                                          delta_column=DELTA, num_buckets=16)
        t1 = time.perf_counter()
        batch = file_stream(path) if self.arrow_input else self._read(path)
        t2 = time.perf_counter()
        r = self._ingest(batch, k, None)
        r["phases"].update(create_s=t1 - t0, read_s=t2 - t1)  # creating the table includes importing bitlake
        return r

    def upsert(self, path, k):
        t0 = time.perf_counter()
        batch = self._read(path)
        read_s = time.perf_counter() - t0
        return self._phased(self._ingest(batch, k, None), read_s=read_s)

    def delete(self, path, k):
        t0 = time.perf_counter()
        if self.arrow_input:
            keys = pq.read_table(path)
            keys = keys.append_column("op", pa.array(["delete"] * keys.num_rows, pa.string()))
        else:
            from pyspark.sql import functions as F

            keys = self.spark.read.parquet(path).withColumn("op", F.lit("delete"))
        read_s = time.perf_counter() - t0
        return self._phased(self._ingest(keys, k, "op"), read_s=read_s)

    @staticmethod
    def _phased(r: dict, **phases: float) -> dict:
        """``r`` with the timed call's other phases: reading the batch (the input's own cost, inside the wall
        time as for the peers: `spark.read.parquet` plans a scan of the file, which takes Spark 0.1 s or so)."""
        r["phases"].update(phases)
        return r

    def scan(self, selective):
        return self.aggregate(self.table.to_spark(self.spark), selective)

    def arrow_scan(self, selective):
        """The current view streamed on the driver (``Table.to_batches``, the filter pushed down as the peers'
        scanners take theirs), aggregated by pyarrow."""
        return arrow_aggregate(self.table.to_batches(columns=self.schema.names,
                                                     filter=month_filter_arrow() if selective else None),
                               self.schema)

    def scans(self):
        """(engine, function, plain counterpart over the same data files) of this mode's scans."""
        out = [("spark", self.scan, self.plain_scan)]
        if self.arrow_input:
            out.append(("pyarrow", self.arrow_scan, self.plain_arrow_scan))
        return out

    def data_files(self) -> list[str]:
        return [self.table.io.local_path(f.path) for f in self.table.state().data_files()]

    def plain_arrow_scan(self, selective):
        """Plain pyarrow over the table's committed data files, invalid rows and all (the limits' pyarrow scan)."""
        import pyarrow.dataset as ds

        scanner = ds.dataset(self.data_files(), format="parquet").scanner(
            columns=self.schema.names, filter=month_filter_arrow() if selective else None)
        return arrow_aggregate(scanner.to_batches(), self.schema)

    def plain_scan(self, selective):
        """Plain Spark over the table's committed data files, invalid rows and all (core.py's baseline)."""
        from bitlake.spark.schema import spark_schema

        df = self.spark.read.schema(spark_schema(self.schema)).parquet(*self.data_files()).select(self.schema.names)
        return self.aggregate(df, selective)

    def current_data_bytes(self):
        return sum(f.bytes for f in self.table.state().data_files())


class SparkRewrite(SparkSystem):
    """What a team without a table format does: merge the change into a new snapshot of the table."""

    def current(self) -> Path:
        return self.folder / (self.folder / "CURRENT").read_text().strip()

    def _switch(self, df, k: int) -> dict:
        name = f"snapshot-{k:05d}"
        df.write.parquet(str(self.folder / name))
        old = self.current() if (self.folder / "CURRENT").exists() else None
        tmp = self.folder / "CURRENT.tmp"
        tmp.write_text(name)
        os.replace(tmp, self.folder / "CURRENT")  # readers see the old or the new snapshot, never half
        if old is not None:
            shutil.rmtree(old)
        return {}

    def load(self, path, k=0):
        return self._switch(self.spark.read.parquet(path), k)

    def upsert(self, path, k):
        batch = self.spark.read.parquet(path)
        base = self.spark.read.parquet(str(self.current()))
        return self._switch(base.join(batch.select(*PRIMARY_KEY), PRIMARY_KEY, "left_anti").unionByName(batch), k)

    def delete(self, path, k):
        keys = self.spark.read.parquet(path).select(*PRIMARY_KEY)
        base = self.spark.read.parquet(str(self.current()))
        return self._switch(base.join(keys, PRIMARY_KEY, "left_anti"), k)

    def scan(self, selective):
        return self.aggregate(self.spark.read.parquet(str(self.current())), selective)

    def current_data_bytes(self):
        return sum(v for v in core.snapshot(self.current()).values())


class DeltaLake(System):
    engine = "pyarrow"
    PREDICATE = " AND ".join(f"t.{c} = s.{c}" for c in PRIMARY_KEY)

    @property
    def uri(self) -> str:
        return str(self.folder / "table")

    def load(self, path, k=0):
        from deltalake import write_deltalake

        write_deltalake(self.uri, file_stream(path))
        return {}

    def _merge(self, path):
        from deltalake import DeltaTable

        return DeltaTable(self.uri).merge(source=pq.read_table(path), predicate=self.PREDICATE,
                                          source_alias="s", target_alias="t")

    def upsert(self, path, k):
        m = self._merge(path).when_matched_update_all().when_not_matched_insert_all().execute()
        return {"metrics": _jsonable(m)}

    def delete(self, path, k):
        return {"metrics": _jsonable(self._merge(path).when_matched_delete().execute())}

    def scan(self, selective):
        from deltalake import DeltaTable

        dataset = DeltaTable(self.uri).to_pyarrow_dataset()
        scanner = dataset.scanner(columns=self.schema.names, filter=month_filter_arrow() if selective else None)
        return arrow_aggregate(scanner.to_batches(), self.schema)

    def current_data_bytes(self):
        from deltalake import DeltaTable

        actions = pa.table(DeltaTable(self.uri).get_add_actions(flatten=True))
        return int(pc.sum(actions.column("size_bytes")).as_py())

    def past_scan(self):
        from deltalake import DeltaTable

        dataset = DeltaTable(self.uri, version=0).to_pyarrow_dataset()
        return arrow_aggregate(dataset.scanner(columns=self.schema.names).to_batches(), self.schema)

    def change_feed(self):
        raise NotOffered("the change data feed is off: this workload creates the table with delta-rs's defaults "
                         "(delta.enableChangeDataFeed would add files to every merge)")

    def update_where(self):
        from deltalake import DeltaTable

        return {"metrics": _jsonable(DeltaTable(self.uri).update(updates={"l_quantity": "l_quantity + 1"},
                                                                 predicate=day_condition(UPDATE_DAY)))}

    def delete_where(self):
        from deltalake import DeltaTable

        return {"metrics": _jsonable(DeltaTable(self.uri).delete(day_condition(DELETE_DAY)))}

    def erase(self):
        from deltalake import DeltaTable

        return {"metrics": _jsonable(DeltaTable(self.uri).delete(erase_condition(self.erased)))}

    def compact(self):
        from deltalake import DeltaTable

        return {"metrics": _jsonable(DeltaTable(self.uri).optimize.compact())}

    def count(self):
        from deltalake import DeltaTable

        return {"rows": DeltaTable(self.uri).to_pyarrow_dataset().count_rows()}


class Iceberg(System):
    engine = "pyarrow"
    IDENT = "bench.lineitem"

    def __init__(self, name, folder, schema):
        super().__init__(name, folder, schema)
        from pyiceberg.catalog.sql import SqlCatalog

        (folder / "warehouse").mkdir(exist_ok=True)
        self.catalog = SqlCatalog("bench", uri=f"sqlite:///{folder / 'catalog.db'}",
                                  warehouse=f"file://{folder / 'warehouse'}")

    def load(self, path, k=0):
        self.catalog.create_namespace_if_not_exists("bench")
        base = pq.read_table(path)
        self.catalog.create_table(self.IDENT, schema=base.schema).append(base)
        return {}

    def upsert(self, path, k):
        r = self.catalog.load_table(self.IDENT).upsert(pq.read_table(path), join_cols=PRIMARY_KEY)
        return {"metrics": {"rows_updated": r.rows_updated, "rows_inserted": r.rows_inserted}}

    def delete(self, path, k):
        from pyiceberg.table.upsert_util import create_match_filter

        keys = pq.read_table(path)
        self.catalog.load_table(self.IDENT).delete(delete_filter=create_match_filter(keys, PRIMARY_KEY))
        return {}

    def scan(self, selective):
        row_filter = f"l_shipdate >= '{MONTH[0]}' and l_shipdate < '{MONTH[1]}'" if selective else "true"
        reader = self.catalog.load_table(self.IDENT).scan(row_filter=row_filter).to_arrow_batch_reader()
        return arrow_aggregate(reader, self.schema)

    def current_data_bytes(self):
        return sum(t.file.file_size_in_bytes for t in self.catalog.load_table(self.IDENT).scan().plan_files())


class Lance(System):
    engine = "pyarrow"

    @property
    def uri(self) -> str:
        return str(self.folder / "table")

    def dataset(self):
        import lance

        return lance.dataset(self.uri)

    def load(self, path, k=0):
        import lance

        lance.write_dataset(file_stream(path), self.uri)
        return {}

    def upsert(self, path, k):
        m = (self.dataset().merge_insert(PRIMARY_KEY).when_matched_update_all().when_not_matched_insert_all()
             .execute(pq.read_table(path)))
        return {"metrics": _jsonable(m)}

    def delete(self, path, k):
        return {"metrics": _jsonable(self.dataset().merge_insert(PRIMARY_KEY).when_matched_delete()
                                     .execute(pq.read_table(path)))}

    def scan(self, selective):
        scanner = self.dataset().scanner(columns=self.schema.names,
                                         filter=month_filter_arrow() if selective else None)
        return arrow_aggregate(scanner.to_batches(), self.schema)

    def past_scan(self):
        import lance

        scanner = lance.dataset(self.uri, version=1).scanner(columns=self.schema.names)
        return arrow_aggregate(scanner.to_batches(), self.schema)

    def update_where(self):
        return {"metrics": _jsonable(self.dataset().update({"l_quantity": "l_quantity + 1"},
                                                           where=day_condition(UPDATE_DAY)))}

    def delete_where(self):
        return {"metrics": _jsonable(self.dataset().delete(day_condition(DELETE_DAY)))}

    def erase(self):
        return {"metrics": _jsonable(self.dataset().delete(erase_condition(self.erased)))}

    def compact(self):
        return {"metrics": _jsonable(self.dataset().optimize.compact_files())}

    def count(self):
        return {"rows": self.dataset().count_rows()}

    def current_data_bytes(self):
        total = 0
        for fragment in self.dataset().get_fragments():
            for f in fragment.data_files():
                size = f.file_size_bytes
                total += size if size is not None else os.path.getsize(Path(self.uri) / "data" / f.path)
        return total


class Paimon(System):
    """A pypaimon primary-key table; runs in .venv-paimon (see PAIMON_PYTHON)."""

    engine = "pyarrow"
    IDENT = "bench.lineitem"
    OP = "op"  # the row-kind column (rowkind.field): pypaimon's only way to write deletes to a primary-key table
    NATIVE = {"read.native.enabled": "true", "write.native.enabled": "true"}

    def __init__(self, name, folder, schema):
        super().__init__(name, folder, schema)
        from pypaimon import CatalogFactory

        (folder / "warehouse").mkdir(exist_ok=True)
        self.catalog = CatalogFactory.create({"warehouse": f"file://{folder / 'warehouse'}"})
        self.options = {"bucket": "4", "rowkind.field": self.OP, **(self.NATIVE if name == "paimon" else {})}

    def table(self):
        return self.catalog.get_table(self.IDENT)

    def _with_kind(self, data: pa.Table, kind: str) -> pa.Table:
        return data.append_column(self.OP, pa.array([kind] * data.num_rows, pa.string()))

    def _write(self, data: pa.Table | pa.RecordBatchReader) -> dict:
        builder = self.table().new_batch_write_builder()
        write, commit = builder.new_write(), builder.new_commit()
        try:
            for batch in data if isinstance(data, pa.RecordBatchReader) else [data]:
                write.write_arrow(batch)
            commit.commit(write.prepare_commit())
        finally:
            write.close()
            commit.close()
        return {}

    def load(self, path, k=0):
        from pypaimon import Schema

        stream = file_stream(path)
        schema = stream.schema.append(pa.field(self.OP, pa.string()))
        base = pa.RecordBatchReader.from_batches(schema, (pa.RecordBatch.from_arrays(
            [*b.columns, pa.array(["+I"] * b.num_rows, pa.string())], schema=schema) for b in stream))
        self.catalog.create_database("bench", True)
        self.catalog.create_table(self.IDENT, Schema.from_pyarrow_schema(
            schema, primary_keys=PRIMARY_KEY, options=self.options), False)
        return self._write(base)

    def upsert(self, path, k):
        return self._write(self._with_kind(pq.read_table(path), "+I"))

    def delete(self, path, k):
        keys = pq.read_table(path)
        n = keys.num_rows
        columns = [keys.column(f.name).cast(f.type) if f.name in keys.schema.names else pa.nulls(n, f.type)
                   for f in self.schema]
        return self._write(self._with_kind(pa.Table.from_arrays(columns, schema=self.schema), "-D"))

    def _splits(self, builder):
        return builder.new_scan().plan().splits()

    def scan(self, selective):
        builder = self.table().new_read_builder().with_projection(self.schema.names)
        if selective:
            pb = builder.new_predicate_builder()
            builder = builder.with_filter(pb.and_predicates([pb.greater_or_equal("l_shipdate", MONTH[0]),
                                                             pb.less_than("l_shipdate", MONTH[1])]))
        reader = builder.new_read().to_arrow_batch_reader(self._splits(builder))
        batches = (b.filter(month_filter_arrow()) if selective else b for b in reader)
        return arrow_aggregate(batches, self.schema)

    def files(self):
        return [f for s in self._splits(self.table().new_read_builder()) for f in s.files]

    def past_scan(self):
        builder = self.table().copy({"scan.snapshot-id": "1"}).new_read_builder().with_projection(self.schema.names)
        return arrow_aggregate(builder.new_read().to_arrow_batch_reader(self._splits(builder)), self.schema)

    def count(self):
        builder = self.table().new_read_builder().with_projection(["l_orderkey"])
        return {"rows": sum(b.num_rows for b in builder.new_read().to_arrow_batch_reader(self._splits(builder)))}

    def current_data_bytes(self):
        return sum(f.file_size for f in self.files())

    def storage_details(self) -> dict:
        levels: dict[str, int] = {}
        for f in self.files():
            levels[str(f.level)] = levels.get(str(f.level), 0) + 1
        return {"data_files_by_level": dict(sorted(levels.items()))}


class Limits(System):
    """The change alone as Parquet, and plain scans of bitlake's data files (the scan baseline)."""

    def load(self, path, k=0):
        return self._copy(path, k)

    def upsert(self, path, k):
        return self._copy(path, k)

    def delete(self, path, k):
        return self._copy(path, k)

    def _copy(self, path, k):
        stream = file_stream(path)
        with pq.ParquetWriter(self.folder / f"{k}.parquet", stream.schema, compression=CODEC) as out:
            for batch in stream:
                out.write_batch(batch)
        return {}

    def bitlake_files(self) -> list[str]:
        import bitlake

        for mode in BITLAKE_MODES:
            folder = self.folder.parent / mode / "table"
            if folder.exists():
                t = bitlake.open_table(str(folder))
                self.source = mode
                return [t.io.local_path(f.path) for f in t.state().data_files()]
        raise RuntimeError("no bitlake table in this run to take the data files from (run a bitlake mode first)")

    def scans(self):
        """(engine, selective, function) of the plain scans, over the bitlake table's data files."""
        import pyarrow.dataset as ds

        from bitlake.spark.schema import spark_schema

        files = self.bitlake_files()
        spark = SparkSystem("limits", self.folder, self.schema)
        struct = spark_schema(self.schema)

        def plain_spark(selective):
            return spark.aggregate(spark.spark.read.schema(struct).parquet(*files).select(self.schema.names),
                                   selective)

        def plain_arrow(selective):
            scanner = ds.dataset(files, format="parquet").scanner(
                columns=self.schema.names, filter=month_filter_arrow() if selective else None)
            return arrow_aggregate(scanner.to_batches(), self.schema)

        return [("spark", plain_spark), ("pyarrow", plain_arrow)]


SYSTEM_CLASSES = {**dict.fromkeys(BITLAKE_MODES, Bitlake), "spark-rewrite": SparkRewrite,
                  "deltalake": DeltaLake, "iceberg": Iceberg, "lance": Lance, "paimon": Paimon,
                  "paimon-python": Paimon, LIMITS: Limits}


def scan_engines(system: str) -> list[str | None]:
    """The engines a system's scans are recorded under when it has more than one (else [None])."""
    if system == LIMITS or BITLAKE_MODES.get(system, {}).get("input") == "arrow":
        return ["spark", "pyarrow"]
    return [None]


def fields_of(result) -> dict:
    """A result object's fields (a dataclass's, or its attributes)."""
    return dataclasses.asdict(result) if dataclasses.is_dataclass(result) else vars(result)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, int | float | str | bool) or obj is None:
        return obj
    return str(obj)


# ---------------------------------------------------------------------------------------- worker


def worker(system_name: str, spec_path: Path, folder: Path, events: Path) -> int:
    """Runs one system's operations in order, appending one JSON line per start and per result."""
    spec = json.loads(spec_path.read_text())
    sf = spec["scale_factor"]
    out = open(events, "a")  # noqa: SIM115 - open for the whole run, flushed per line

    def emit(kind, **fields):
        out.write(json.dumps({"event": kind, **fields}) + "\n")
        out.flush()

    def base_record(op, fraction, engine=None):
        return {"system": system_name, "scale_factor": sf, "operation": op, "batch_fraction": fraction,
                "engine": engine, "wall_s": None, "bytes_written": None, "change_parquet_bytes": None,
                "error": None}

    schema = core.table_schema(pq.read_schema(spec["source"]))
    shutil.rmtree(folder, ignore_errors=True)
    system = None
    try:
        system = SYSTEM_CLASSES[system_name](system_name, folder, schema)
        if isinstance(system, SparkSystem) and system.spark_in_ops:
            system.warm_up(spec["ops"][0]["file"])
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
        emit("fatal", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        return 1
    rss = core.TreeRss().start()

    def timed(rec: dict, call) -> None:
        """Runs ``call`` as the operation of ``rec``: its wall time, the background work it left, its peak RSS
        and the bytes it wrote under the system's folder."""
        before = core.snapshot(folder)
        rss.mark()
        start_ms, t0 = time.time() * 1000, time.perf_counter()
        extra = call()
        rec["wall_s"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        system.settle()
        rec["settle_s"] = time.perf_counter() - t1  # background work the operation left, after its wall time
        os.sync()  # the next operation starts with this one's writes on disk, not written back under it
        rss.mark()
        rec["peak_rss"] = rss.peaks([("op", start_ms, time.time() * 1000)])["op"]
        rec.update(extra or {})
        rec["bytes_written"], _, rec["files_written"] = core.written_between(before, core.snapshot(folder))
        log(f"{system_name} sf {sf_text(sf)} {rec['operation']} {fraction_text(rec['batch_fraction'])}: "
            f"{rec['wall_s']:.2f} s (then {rec['settle_s']:.2f} s in the background), "
            f"wrote {mb(rec['bytes_written'])}")

    for op in spec["ops"]:
        rec = base_record(op["operation"], op["batch_fraction"])
        rec["change_parquet_bytes"] = op["change_parquet_bytes"]
        rec["records"] = op["composition"]["records"]
        emit("start", operation=op["operation"], batch_fraction=op["batch_fraction"], engine=None)
        fn = {"load": system.load, "upsert": system.upsert, "delete": system.delete}[op["operation"]]
        try:
            timed(rec, functools.partial(fn, op["file"], op["k"]))
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
            log(f"{system_name} {op['operation']} failed: {rec['error']}")
            emit("record", record=rec)
            emit("fatal", error=f"stopped after {op['operation']} {fraction_text(op['batch_fraction'])} failed")
            return 1
        emit("record", record=rec)

    # (engine, scan, plain counterpart): bitlake's scans alternate with a plain scan of the same data files
    # by the same engine in the same process, so their ratio holds on a machine whose other jobs come and go.
    if isinstance(system, Limits):
        try:
            scans = [(engine, fn, None) for engine, fn in system.scans()]
        except Exception as e:  # noqa: BLE001
            emit("fatal", error=f"{type(e).__name__}: {e}")
            return 1
    elif isinstance(system, Bitlake):
        scans = system.scans()
    else:
        scans = [(system.engine, system.scan, None)]
    if isinstance(system, SparkSystem) and not system.spark_in_ops and spec.get("scans", True):
        try:
            system.warm_up(spec["ops"][0]["file"])
        except Exception as e:  # noqa: BLE001
            emit("fatal", error=f"{type(e).__name__}: {e}")
            return 1
    for selective in (False, True) if spec.get("scans", True) else ():
        op = "scan_selective" if selective else "scan_full"
        for engine, fn, plain in scans:
            rec = base_record(op, None, engine)
            emit("start", operation=op, batch_fraction=None, engine=engine)
            try:
                warm = None
                if spec["warmup"]:
                    t0 = time.perf_counter()
                    fn(selective)
                    warm = time.perf_counter() - t0
                    if plain:
                        plain(selective)
                runs, plain_runs, figures = [], [], None
                for i in range(spec["runs"]):
                    if plain and i % 2:
                        t0 = time.perf_counter()
                        plain(selective)
                        plain_runs.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    figures = fn(selective)
                    runs.append(time.perf_counter() - t0)
                    if plain and not i % 2:
                        t0 = time.perf_counter()
                        plain(selective)
                        plain_runs.append(time.perf_counter() - t0)
                rec.update(figures)
                rec.update(wall_s=statistics.median(runs), runs_s=runs, warmup_s=warm)
                if plain_runs:
                    rec.update(plain_wall_s=statistics.median(plain_runs), plain_runs_s=plain_runs)
                if isinstance(system, Limits):
                    rec["files_of"] = system.source
                log(f"{system_name} sf {sf_text(sf)} {op} ({engine}): {rec['wall_s']:.2f} s, {figures}")
            except Exception as e:  # noqa: BLE001
                rec["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
                log(f"{system_name} {op} failed: {rec['error']}")
            emit("record", record=rec)

    rec = base_record("storage", None)
    emit("start", operation="storage", batch_fraction=None, engine=None)
    try:
        rec["storage_bytes"] = sum(core.snapshot(folder).values())
        rec["current_data_bytes"] = system.current_data_bytes()
        if hasattr(system, "storage_details"):
            rec.update(system.storage_details())
    except Exception as e:  # noqa: BLE001
        rec["error"] = f"{type(e).__name__}: {e}"
    emit("record", record=rec)

    system.erased = list(range(1, spec["erased_suppliers"] + 1))
    for op in MORE_OPS if spec.get("more", True) and not isinstance(system, Limits) else ():
        rec = base_record(op, None)
        emit("start", operation=op, batch_fraction=None, engine=None)
        try:
            timed(rec, getattr(system, op))
        except NotOffered as e:
            rec["error"] = f"not offered: {e}"
        except Exception as e:  # noqa: BLE001 - recorded, the next operation runs
            rec["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
            log(f"{system_name} {op} failed: {rec['error']}")
        emit("record", record=rec)
    rss.stop()
    out.close()
    return 0


# ---------------------------------------------------------------------------------- orchestrator


def expected_keys(system: str, spec: dict) -> list[tuple]:
    keys = [(op["operation"], op["batch_fraction"], None) for op in spec["ops"]]
    for op in ("scan_full", "scan_selective") if spec.get("scans", True) else ():
        keys += [(op, None, e) for e in scan_engines(system)]
    keys.append(("storage", None, None))
    return keys + [(op, None, None) for op in MORE_OPS if spec.get("more", True) and system != LIMITS]


def run_system(system: str, spec: dict, folder: Path, timeout: float) -> list[dict]:
    """Runs one system's worker; kills its process group when an operation passes the time limit."""
    sf = spec["scale_factor"]
    events = folder.parent / f"{system}.events.jsonl"
    events.unlink(missing_ok=True)
    python = str(PAIMON_PYTHON) if system in PAIMON_SYSTEMS else sys.executable
    cmd = [python, str(Path(__file__).resolve()), "--worker", system,
           "--spec", str(folder.parent / "spec.json"), "--folder", str(folder), "--events", str(events)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    if system in PAIMON_SYSTEMS and not PAIMON_PYTHON.exists():
        log(f"{system}: {PAIMON_PYTHON} is missing (make setup-paimon)")
        return [{"system": system, "scale_factor": sf, "operation": op, "batch_fraction": fraction, "engine": engine,
                 "wall_s": None, "bytes_written": None, "change_parquet_bytes": None,
                 "error": f"not run: no {os.path.relpath(PAIMON_PYTHON, ROOT)} (make setup-paimon)"}
                for op, fraction, engine in expected_keys(system, spec)]
    # The batch files just generated, and the previous system's folder, leave dirty pages that the kernel
    # writes back while the next worker runs: each system starts with them on disk.
    os.sync()
    log(f"{system} at SF {sf_text(sf)}: starting its worker ({os.path.relpath(python, ROOT)})")
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    records, current, fatal, seen = [], None, None, 0
    started = time.monotonic()
    timed_out = False
    while True:
        done = proc.poll() is not None
        if events.exists():
            lines = events.read_text().split("\n")
            for line in lines[seen:-1]:  # the last piece is empty or an unfinished line
                ev = json.loads(line)
                if ev["event"] == "start":
                    current, started = ev, time.monotonic()
                elif ev["event"] == "record":
                    records.append(ev["record"])
                    current = None
                elif ev["event"] == "fatal":
                    fatal = ev["error"]
            seen = max(seen, len(lines) - 1)
        if done:
            break
        if time.monotonic() - started > timeout:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker's own process group: Python and its JVM
            proc.wait()
            timed_out = True
            break
        time.sleep(0.5)
    def key_of(r):  # only the limits and bitlake-arrow run one scan per engine
        return r["operation"], r["batch_fraction"], r.get("engine") if scan_engines(system) != [None] else None

    have = {key_of(r) for r in records}
    for key in expected_keys(system, spec):
        if key in have:
            continue
        op, fraction, engine = key
        code = proc.returncode
        died = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        if timed_out and (key_of(current) == key if current is not None else not records):
            error = f"timeout: passed the limit of {timeout:g} s"
            current = None
        elif timed_out:
            error = "not run: an earlier operation timed out"
        elif fatal:
            error = f"not run: {fatal}"
        elif current is not None and key_of(current) == key:
            error = f"crashed: the worker process died ({died}) during this operation"
            current = None
        else:
            error = f"not run: the worker process died ({died})"
        records.append({"system": system, "scale_factor": sf, "operation": op, "batch_fraction": fraction,
                        "engine": engine, "wall_s": None, "bytes_written": None, "change_parquet_bytes": None,
                        "error": error})
        log(f"{system} {op} {fraction_text(fraction)}: {error}")
    return records


def check(records: list[dict], expected: dict) -> None:
    """Every system's view after all batches must hold the expected rows and sum of l_quantity, its past view the
    base's, and its count after the operations that followed (when it ran them all) the first bitlake mode's."""
    past = {"rows": expected.get("past_rows"), "sum_l_quantity": expected.get("past_sum_l_quantity")}
    for r in records:
        if r["operation"] == "past_scan" and not r["error"] and past["rows"] is not None:
            got = {"rows": r.get("rows"), "sum_l_quantity": round(r.get("sum_l_quantity") or 0, 2)}
            if got != past:
                r["error"] = f"wrong result: {got}, expected {past}"
    wrote = {s for s in {r["system"] for r in records}
             if all(not r["error"] for r in records if r["system"] == s and r["operation"] in MORE_WRITES)}
    counts = [r for r in records if r["operation"] == "count" and not r["error"] and r["system"] in wrote]
    reference = next((r for r in counts if r["system"] in BITLAKE_MODES), None)
    for r in counts:
        if reference is not None and r.get("rows") != reference.get("rows"):
            r["error"] = f"wrong result: {r.get('rows'):,} rows, {reference['system']} holds {reference.get('rows'):,}"
    for r in records:
        if r["system"] == LIMITS or r["error"] or r["operation"] not in ("scan_full", "scan_selective"):
            continue
        if r["operation"] == "scan_full":
            want = {"rows": expected["rows"], "sum_l_quantity": expected["sum_l_quantity"]}
        else:
            want = {"rows": expected["selective_rows"]}
        got = {k: (round(r.get(k), 2) if k == "sum_l_quantity" else r.get(k)) for k in want}
        if got != want:
            r["error"] = f"wrong result: {got}, expected {want}"
            log(f"{r['system']} SF {sf_text(r['scale_factor'])} {r['operation']}: {r['error']}")


def versions() -> dict:
    out = {}
    for dist in ("pyspark", "pyarrow", "deltalake", "pyiceberg", "pylance", "tpchgen-cli", "pandas", "matplotlib"):
        try:
            out[dist] = importlib_metadata.version(dist)
        except importlib_metadata.PackageNotFoundError:
            out[dist] = None
    if PAIMON_PYTHON.exists():  # the Paimon workers' own environment
        code = ("import json, importlib.metadata as m\n"
                "def v(d):\n"
                "    try:\n        return m.version(d)\n"
                "    except m.PackageNotFoundError:\n        return None\n"
                "print(json.dumps([v(d) for d in ('pypaimon', 'pypaimon-rust', 'pyarrow')]))")
        try:
            found = json.loads(subprocess.run([str(PAIMON_PYTHON), "-c", code], capture_output=True, text=True,
                                              check=True, timeout=120).stdout)
            out.update({"pypaimon": found[0], "pypaimon-rust": found[1], "pyarrow (.venv-paimon)": found[2]})
        except (subprocess.SubprocessError, OSError, ValueError):
            pass
    return out


def median_records(rounds: list[list[dict]]) -> list[dict]:
    """One record an operation from a system's repeated sequences (--repeat): the one of median time (wall plus the
    background work after it; the lower median of an even count), with every round's times beside it."""
    if len(rounds) == 1:
        return rounds[0]

    def key(r):
        return r["operation"], r["batch_fraction"], r.get("engine")

    def total(r):
        return (r.get("wall_s") or 0.0) + (r.get("settle_s") or 0.0)

    out = []
    for first in rounds[0]:
        same = [r for records in rounds for r in records if key(r) == key(first)]
        timed = sorted((r for r in same if r.get("wall_s") is not None and not r.get("error")), key=total)
        if len(timed) < len(same):  # an operation that failed in any round is reported as failed
            out.append(next(r for r in same if r.get("wall_s") is None or r.get("error")))
            continue
        chosen = dict(timed[(len(timed) - 1) // 2])
        chosen["rounds_s"] = [round(total(r), 4) for r in same]
        if any(r.get("phases") for r in same):
            chosen["rounds_phases"] = [r.get("phases") for r in same]
        out.append(chosen)
    return out


def record_key(r: dict) -> tuple:
    return (r["system"], r["scale_factor"])


def merge_results(old: dict | None, new: dict) -> dict:
    """The new run's records replace the old file's for the same system and scale factor, except the scans of a
    run without them (--no-scans): the old ones stay."""
    if not old:
        return new
    replaced = {record_key(r) for r in new["records"]}
    scanned = {record_key(r) for r in new["records"] if r["operation"].startswith("scan")}
    keep = [r for r in old["records"] if record_key(r) not in replaced
            or (r["operation"].startswith("scan") and record_key(r) not in scanned)]

    def superseded(run):  # every system and scale factor of an old run measured again: its line would mislead
        pairs = {(s, sf) for s in run.get("systems") or [] for sf in run.get("scale_factors") or []}
        return bool(pairs) and pairs <= replaced

    runs = [r for r in old.get("runs", []) if not superseded(r)]
    return {"runs": runs + new.get("runs", []), "records": keep + new["records"],
            "expected": {**old.get("expected", {}), **new.get("expected", {})},
            "notes": old.get("notes", []) + new.get("notes", []),
            "json_paths": list(dict.fromkeys(old.get("json_paths", []) + new.get("json_paths", [])))}


# ---------------------------------------------------------------------------------------- render


def find(records, system, sf, operation, fraction=None, engine=None) -> dict | None:
    for r in records:
        if (r["system"] == system and r["scale_factor"] == sf and r["operation"] == operation
                and r["batch_fraction"] == fraction and (engine is None or r.get("engine") == engine)):
            return r
    return None


def amplification(r: dict | None) -> float | None:
    """Bytes written over the change alone as Parquet."""
    if not r or r.get("error") or r.get("bytes_written") is None or not r.get("change_parquet_bytes"):
        return None
    return r["bytes_written"] / r["change_parquet_bytes"]


def scan_ratio(records, r: dict) -> float | None:
    """A scan's wall time over the plain scan of bitlake's data files with the same engine: for bitlake the
    one interleaved with it in its own process, for the others the limits' scan."""
    if r.get("error") or r.get("wall_s") is None:
        return None
    if r.get("plain_wall_s"):
        return r["wall_s"] / r["plain_wall_s"]
    engine = r.get("engine") or ("pyarrow" if r["system"] in ARROW_SYSTEMS else "spark")
    base = find(records, LIMITS, r["scale_factor"], r["operation"], None, engine)
    if not base or base.get("error") or not base.get("wall_s"):
        return None
    return r["wall_s"] / base["wall_s"]


def systems_in(records) -> list[str]:
    present = {r["system"] for r in records}
    known = [s for s in SYSTEMS if s in present]
    return known + sorted(present - set(known))


def num(x: float | None, fmt: str = ".2f") -> str:
    return "—" if x is None else format(x, fmt)


def cell_error(r: dict | None) -> str:
    if r is None:
        return "not run"
    e = r["error"] or ""
    for prefix, text in (("timeout", "timed out"), ("not run", "not run"), ("crashed", "crashed"),
                         ("not offered", "not offered")):
        if e.startswith(prefix):
            return text
    return "failed"


def spent(r: dict) -> float:
    """An operation's wall time with the background work it left (bitlake's key-index update after a commit)."""
    return r["wall_s"] + (r.get("settle_s") or 0.0)


def spent_text(r: dict) -> str:
    after = r.get("settle_s") or 0.0
    return f"{spent(r):.2f} s" + (f" ({r['wall_s']:.2f} + {after:.2f} after)" if after >= 0.005 else "")


def targets(records) -> list[dict]:
    """The issue's targets, each with the figure and met / MISSED / not assessed. bitlake's times count the
    background work an operation left (the worker waits for it before the next one): a stream of batches pays
    for it."""
    out = []
    sfs = sorted({r["scale_factor"] for r in records})
    modes = [m for m in BITLAKE_MODES if any(r["system"] == m for r in records)]
    peers = [p for p in PEERS if any(r["system"] == p for r in records)]
    for mode in modes:
        for sf in sfs:
            mine = amplification(find(records, mode, sf, "upsert", 0.001))
            worst = []
            for p in (p for p in peers if p in COPY_ON_WRITE):
                theirs = amplification(find(records, p, sf, "upsert", 0.001))
                if mine and theirs:
                    worst.append((theirs / mine, p))
            if mine is None or not worst:
                continue
            ratio, peer = min(worst)
            out.append({"target": "write amplification at least 50x lower than every copy-on-write peer "
                                  "on the 0.1 % batch", "system": mode, "scale_factor": sf,
                        "figure": f"{mode} {mine:.2f}; lowest peer ratio {ratio:,.0f}x ({peer})",
                        "status": "met" if ratio >= 50 else "MISSED"})
        for sf in sfs:
            for f in UPSERT_FRACTIONS:
                r = find(records, mode, sf, "upsert", f)
                if not r or r.get("error"):
                    continue
                faster = []
                for p in peers:
                    q = find(records, p, sf, "upsert", f)
                    faster.append((p, q["wall_s"] if q and not q.get("error") else None))
                text = ", ".join(
                    f"{p} {num(w, '.2f') if w is not None else cell_error(find(records, p, sf, 'upsert', f))}"
                    for p, w in faster)
                figure = f"{fraction_text(f)}: {mode} {spent_text(r)}; {text or 'no peer in the run'}"
                if sf >= 3:
                    lower = all(w is None or spent(r) < w for _, w in faster)
                    status = ("met" if lower else "MISSED") if any(w is not None for _, w in faster) else \
                        "not assessed"
                    out.append({"target": "upsert faster than every peer (scale factors 3 and 10)", "system": mode,
                                "scale_factor": sf, "figure": figure, "status": status})
                lance = dict(faster).get("lance")
                if sf == 1 and lance:
                    out.append({"target": "upsert within 1.5x of lance (scale factor 1)", "system": mode,
                                "scale_factor": sf, "figure": f"{figure}: {spent(r) / lance:.2f}x lance",
                                "status": "met" if spent(r) <= 1.5 * lance else "MISSED"})
                amp = amplification(r)
                if amp is not None:
                    out.append({"target": "write amplification at most 1.5 on every batch", "system": mode,
                                "scale_factor": sf, "figure": f"{fraction_text(f)}: {amp:.2f}",
                                "status": "met" if amp <= 1.5 else "MISSED"})
            r = find(records, mode, sf, "load")
            if not r or r.get("error"):
                continue
            if BITLAKE_MODES[mode].get("input") == "arrow":
                # Arrow input: against the fastest peer's load of the same Arrow table.
                loads = [(q["wall_s"], p) for p in peers if p != "spark-rewrite"
                         and (q := find(records, p, sf, "load")) and not q.get("error") and q.get("wall_s")]
                if loads:
                    best, peer = min(loads)
                    out.append({"target": "base load at most 1.5x the fastest peer's (Arrow input)", "system": mode,
                                "scale_factor": sf, "figure": f"{mode} {spent_text(r)}; {peer} {best:.1f} s: "
                                                              f"{spent(r) / best:.2f}x",
                                "status": "met" if spent(r) <= 1.5 * best else "MISSED"})
                continue
            # A Spark DataFrame: against plain Spark writing the same DataFrame as Parquet (spark-rewrite's load).
            q = find(records, "spark-rewrite", sf, "load")
            plain = q["wall_s"] if q and not q.get("error") else None
            out.append({"target": "base load of a Spark DataFrame at most plain Spark writing it as Parquet",
                        "system": mode, "scale_factor": sf,
                        "figure": f"{mode} {spent_text(r)}; " + (f"spark-rewrite {plain:.1f} s: {spent(r) / plain:.2f}x"
                                                                if plain else "spark-rewrite not in the run"),
                        "status": "not assessed" if not plain else ("met" if spent(r) <= plain else "MISSED")})
        small = [(sf, find(records, mode, sf, "upsert", UPSERT_FRACTIONS[0])) for sf in sfs]
        small = [(sf, spent(r)) for sf, r in small if r and not r.get("error")]
        if 1 in dict(small) and 10 in dict(small):
            w1, w10 = dict(small)[1], dict(small)[10]
            out.append({"target": "the 0.1 % batch within 1.5x between scale factors 1 and 10", "system": mode,
                        "scale_factor": 10, "figure": f"{w1:.2f} s at SF 1, {w10:.2f} s at SF 10: {w10 / w1:.2f}x",
                        "status": "met" if w10 <= 1.5 * w1 else "MISSED"})
        # Same-size batches on tables of different sizes: SF a with fraction x and SF b with x * a / b.
        pairs = []
        for a in sfs:
            for b in sfs:
                for fa in UPSERT_FRACTIONS:
                    for fb in UPSERT_FRACTIONS:
                        if b > a and abs(a * fa - b * fb) < 1e-9 * max(a, b) + 1e-12:
                            ra, rb = find(records, mode, a, "upsert", fa), find(records, mode, b, "upsert", fb)
                            if ra and rb and not ra.get("error") and not rb.get("error"):
                                pairs.append((a, fa, b, fb, spent(ra), spent(rb), rb.get("records") or 0))
        if not pairs:
            out.append({"target": "upsert wall time grows with the batch size, not the table size",
                        "system": mode, "scale_factor": None,
                        "figure": "needs two scale factors with batches of the same size (e.g. 0.1 and 1)",
                        "status": "not assessed"})
        for a, fa, b, fb, wa, wb, n in pairs:
            out.append({"target": "upsert wall time grows with the batch size, not the table size "
                                  "(same batch on a table 10x larger: under 2x the time)",
                        "system": mode, "scale_factor": b,
                        "figure": f"{n:,}-row batch: {wa:.1f} s at SF {sf_text(a)} "
                                  f"({fraction_text(fa)}), {wb:.1f} s at SF {sf_text(b)} ({fraction_text(fb)}): "
                                  f"{wb / wa:.2f}x for a {b / a:g}x table",
                        "status": "met" if wb / wa < 2 else "MISSED"})
        for sf in sfs:
            r = find(records, mode, sf, "scan_full")
            if not r:
                continue
            ratio = scan_ratio(records, r)
            out.append({"target": "full scan within 1.2x of the plain Parquet scan after all batches",
                        "system": mode, "scale_factor": sf,
                        "figure": "—" if ratio is None else f"{ratio:.2f}x ({r['wall_s']:.2f} s)",
                        "status": "not assessed" if ratio is None else ("met" if ratio <= 1.2 else "MISSED")})
        out += more_targets(records, mode, sfs, peers)
    return out


def more_table(records, sf, systems) -> list[str]:
    """The operations after the batches and scans: a row each, a column per system (time, bytes, rows)."""
    rows = [(op, [find(records, s, sf, op) for s in systems]) for op in MORE_OPS]
    if not any(r for _, found in rows for r in found):
        return []
    lines = ["", "Operations after the batches and scans, in this order (wall time with the work after it, bytes "
                 "written, rows where the operation returns rows; \"not offered\": the system has no such call):", ""]
    days = {"update_where": UPDATE_DAY, "delete_where": DELETE_DAY}
    lines += [f"- `{op}`: " + MORE_DOC[op].replace("{day}", day_condition(days.get(op, DELETE_DAY))) for op in MORE_OPS]
    lines += ["", "| operation | " + " | ".join(systems) + " |", "| --- " * (len(systems) + 1) + "|"]
    for op, found in rows:
        cells = []
        for r in found:
            if r is None:
                cells.append("not run")
            elif r["error"]:
                cells.append(cell_error(r))
            else:
                text = f"{spent_text(r)}, {mb(r.get('bytes_written'))}"
                if r.get("rows") is not None and op in ("change_feed", "count"):
                    text += f", {r['rows']:,} rows"
                if (r.get("phases") or {}).get("tombstone_s") is not None:
                    text += f" (tombstone {r['phases']['tombstone_s']:.2f} s)"
                cells.append(text)
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return lines


def more_targets(records, mode: str, sfs, peers) -> list[dict]:
    """The issue's targets for the operations after the batches: faster than every peer that offers one (within
    1.2x of the fastest at scale factor 1), no more bytes than lance for DML, a revert within 2x its batch's upsert."""
    out = []
    for sf in sfs:
        for op in ("past_scan", "update_where", "delete_where", "erase", "compact"):
            r = find(records, mode, sf, op)
            if not r or r.get("error"):
                continue
            # lance's delete marks rows in deletion files, their data kept until a compaction (bitlake's tombstone
            # does as much, in metadata); an erasure is held against the peers whose delete removes the data.
            against = [p for p in peers if op != "erase" or p in COPY_ON_WRITE]
            # A compaction that wrote nothing had nothing to compact (delta-rs's merges rewrite whole files): no race.
            theirs = [(spent(q), p) for p in against if (q := find(records, p, sf, op)) and not q.get("error")
                      and (op != "compact" or q.get("bytes_written"))]
            if not theirs:
                continue
            best, peer = min(theirs)
            ratio = spent(r) / best
            bound = 1.0 if sf >= 3 else 1.2
            out.append({"target": f"{op} faster than every peer (within 1.2x of the fastest at SF 1)", "system": mode,
                        "scale_factor": sf, "figure": f"{mode} {spent_text(r)}; fastest peer {peer} {best:.2f} s: "
                                                      f"{ratio:.2f}x",
                        "status": "met" if ratio <= bound else "MISSED"})
            q = find(records, "lance", sf, op)
            if op in ("update_where", "delete_where") and q and not q.get("error") and q.get("bytes_written"):
                out.append({"target": f"{op} writes no more bytes than lance", "system": mode, "scale_factor": sf,
                            "figure": f"{mb(r['bytes_written'])} against {mb(q['bytes_written'])}",
                            "status": "met" if r["bytes_written"] <= q["bytes_written"] else "MISSED"})
        r, batch = find(records, mode, sf, "revert"), find(records, mode, sf, "upsert", UPSERT_FRACTIONS[0])
        if r and batch and not r.get("error") and not batch.get("error"):
            ratio = spent(r) / spent(batch)
            out.append({"target": "revert of the 0.1 % batch within 2x its upsert", "system": mode, "scale_factor": sf,
                        "figure": f"{spent_text(r)} against {spent_text(batch)}: {ratio:.2f}x",
                        "status": "met" if ratio <= 2 else "MISSED"})
    return out


def peak_rss_text(record: dict) -> str:
    """The operation's peak RSS of the system's process tree, and of the JVM in it when there is one."""
    peak = record.get("peak_rss")
    if not peak:
        return "—"
    return mb(peak["tree"]) + (f" (JVM {mb(peak['jvm'])})" if peak["jvm"] else "")


RUNS_DOC = ROOT / "benchmarks" / "results" / "peers-runs.md"
RUNS_HEADER = """# Peers: the runs behind the tables, and the notes on them

The section "Peers" of docs/benchmarks.md shows, for each system, scale factor and operation, the figures of the
latest run that measured it (`benchmarks/peers.py --render-only` merges the results files, later ones winning).
These are the runs merged into it, oldest first, with the commands that made them, and the notes added to them
afterwards (`--render-only ... --note`). Written by `benchmarks/peers.py` with the section; the raw results are
the JSON files beside this one.

"""


def render_runs(results: dict) -> str:
    """The run log of the section (benchmarks/results/peers-runs.md): each run's command, and the notes."""
    lines = []
    for run in results.get("runs", []):
        code = run.get("code", {})
        lines.append(f"Command: `{run['command']}`, {run['date']} (scale factors "
                     f"{', '.join(sf_text(s) for s in run['scale_factors'])}; systems {', '.join(run['systems'])}; "
                     f"bitlake at commit {code.get('git_head', '?')}"
                     + (" with uncommitted changes in bitlake/" if code.get("bitlake_dirty") else "") + ")."
                     + (f" Each system's sequence ran {run['repeat']} times, the systems in turn"
                        + (", every other round in reverse order" if run.get("serpentine") else "")
                        + "; an operation's figures are those of its round of median time (the call and the work "
                        "after it)."
                        if run.get("repeat", 1) > 1 else "")
                     + (f" {run['note']}" if run.get("note") else "")
                     + (f" Load average (1 min) {run['load_average_start']:.1f} at the start, "
                        f"{run['load_average_end']:.1f} at the end, on {run['machine']['cores']} cores."
                        if run.get("load_average_end") is not None else ""))
        lines.append("")
    if results.get("notes"):
        lines += ["Notes on these runs, added afterwards (`--render-only ... --note`):", ""]
        lines += [f"- {n}" for n in results["notes"]] + [""]
    return RUNS_HEADER + "\n".join(lines)


def render(results: dict, img_links: list[str] | None = None) -> str:
    """The doc section, from the results JSON alone (the run log: :func:`render_runs`)."""
    records = results["records"]
    runs = results.get("runs", [])
    sfs = sorted({r["scale_factor"] for r in records})
    systems = systems_in(records)
    lines = [SECTION, "", "The tables below merge several runs: each row is from the latest run that measured it. "
             "The runs, their commands, and the notes on what changed between them are in "
             "`benchmarks/results/peers-runs.md`.", ""]
    if runs:
        last = runs[-1]
        m, v = last["machine"], last["versions"]
        lines += [f"Machine: {m['cores']} cores, {m['memory_gib']} GiB RAM ({m['platform']}); Spark "
                      f"`{last.get('master', 'local[2]')}`. Python {m['python']}, "
                  + ", ".join(f"{k} {v[k]}" for k in v if v[k]) + "."]
    lines += [
        "",
        "Workload: TPC-H `lineitem` (tpchgen-cli) keyed by (l_orderkey, l_linenumber), delta column `l_delta` "
        "(0 for the base, k for batch k). Upsert batches of 0.1 %, 1 % and 10 % of the base rows: "
        f"{UPDATE_SHARE:.0%} updates of random existing keys (`l_quantity + 1`), the rest new keys; then a "
        f"delete batch of {fraction_text(DELETE_FRACTION)} random existing keys (key and delta columns). The "
        f"batches are generated once per scale factor (seed {SEED}) and written as Parquet files; every timed "
        "operation starts from that file, read inside the timed call (pyarrow's `pq.read_table` for delta-rs, "
        "pyiceberg, lance, Paimon, bitlake-arrow and the limits; `spark.read.parquet` for the Spark systems), so "
        "every system gets the same rows. The load takes the base as an Arrow stream, the file read a row group at "
        "a time (`pa.RecordBatchReader`), for every system but pyiceberg (whose `append` takes a table) and the "
        "Spark ones, so that no process holds the whole base (27 GB of Arrow at scale factor 30): since "
        "2026-11-29; before, the load read the file whole with `pq.read_table`.",
        "",
        "Systems (each in its own process, one after the other; an operation over the time limit is killed "
        "and recorded as timed out):",
        "",
    ]
    for s in systems:
        doc = BITLAKE_MODES[s]["doc"] if s in BITLAKE_MODES else SYSTEM_DOC.get(s, "")
        lines.append(f"- **{s}**: {doc}.")
    lines += [
        "",
        "Bytes written: every file an operation added or changed under the system's folder (a walk before and "
        "after), whole, except a file of at most 1 MB that only grew (its earlier content unchanged: RocksDB's "
        "LOG and MANIFEST), which counts the bytes appended (runs before 2026-11-25 22:45 UTC counted it "
        "whole). Write amplification: bytes written / the batch alone as one snappy Parquet file "
        "(pyarrow). Peak RSS: the resident set of the system's process tree (its Python process, Spark's JVM "
        "and PySpark's workers; the batch read inside the timed call included), sampled every 0.25 s and at the "
        "operation's start and end, with the JVM's share for Spark systems (runs before 2026-11-26 12:00 UTC did "
        "not record it). bitlake's key index takes a commit's entries on a thread after the commit, while the call "
        "returns (since commit 2347b9d; before, commits of 200,000 entries or more staged them on a thread during "
        "the call), and flushes them on RocksDB's thread; the worker waits for both after taking the wall time, "
        "before counting the bytes, and records that wait as the operation's background time, \"(+x after)\" in "
        "the wall time's cell (since run s of 2026-11-26; runs from commit dddf22e to 4aa4468 counted a flush "
        "with whichever operation came after it ended). A bitlake mode's batch and delete cells also give the "
        "part of the wall time that read the batch, \"(reading the batch x)\": `spark.read.parquet` (Spark "
        "planning the file's scan) or `pq.read_table` (since 2026-11-27 10:40 UTC). Each worker starts, and each "
        "operation follows the one "
        "before, after an untimed `os.sync()` (since the 12:45 and 12:57 UTC runs of "
        "2026-11-26), so that no operation runs while an earlier one's writes (a 2-3 GB load at SF 10) are written "
        "back. Wall times are single runs on a machine shared with other jobs; a Spark system's process starts its "
        "session and runs one small read before the timed operations, so JVM start-up is not in its load; "
        "bitlake-arrow's, whose loads and batches run without Spark, starts it before its scans only (since the "
        "13:10 UTC run of 2026-11-26: before, its JVM started up beside its load). bitlake-two-step's wall time "
        "is given with its two calls (ingest + metagen); the rest is creating the table (load) and Spark planning "
        "the read of the batch file.",
        "",
    ]
    for sf in sfs:
        base_rows = next((r.get("records") for r in records
                          if r["scale_factor"] == sf and r["operation"] == "load" and r.get("records")), None)
        lines += [f"### Scale factor {sf_text(sf)}" + (f" ({base_rows:,} rows)" if base_rows else ""), "",
                  "| operation | batch | records | change as Parquet | system | wall s | bytes written | write amp. "
                  "| peak RSS |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        ops = [("load", None)] + [("upsert", f) for f in UPSERT_FRACTIONS] + [("delete", DELETE_FRACTION)]
        for op, f in ops:
            rows = [find(records, s, sf, op, f) for s in systems]
            if not any(rows):
                continue
            first = next(r for r in rows if r)
            for s, r in zip(systems, rows, strict=True):
                if r is None:
                    continue
                phases = r.get("phases") or {}
                wall = num(r["wall_s"]) if not r["error"] else cell_error(r)
                if "metagen_s" in phases and not r["error"]:
                    wall += f" ({phases['ingest_s']:.2f} + {phases['metagen_s']:.2f})"
                if (r.get("settle_s") or 0) >= 0.005 and not r["error"]:
                    wall += f" (+{r['settle_s']:.2f} after)"
                if "read_s" in phases and op != "load" and not r["error"]:  # a bitlake mode's input, in its wall time
                    wall += f" (reading the batch {phases['read_s']:.2f})"
                amp = amplification(r)
                lines.append(f"| {op} | {fraction_text(f)} | {num(first.get('records'), ',')} "
                             f"| {mb(first.get('change_parquet_bytes'))} | {s} | {wall} "
                             f"| {mb(r['bytes_written'])} | {num(amp, ',.2f')} | {peak_rss_text(r)} |")
        lines += ["", "Storage after all batches (the whole folder, history included; \"current data\" = "
                      "the data files of the latest view) and scans (one warm-up, median of the timed runs; "
                      "ratio = wall time / the plain scan of bitlake's data files with the same engine: "
                      "for a bitlake mode, plain Spark (or plain pyarrow for bitlake-arrow's `to_arrow` scan) over "
                      "its own table's files, run alternately with its scans in the same process (\"plain s\" "
                      "gives that median); for the others the limits' scans: plain Spark for Spark systems, plain "
                      "pyarrow for delta-rs, pyiceberg, lance and Paimon, whose own readers produce Arrow: "
                      "`DeltaTable.to_pyarrow_dataset()`, pyiceberg's `scan(row_filter=...).to_arrow_batch_reader()`, "
                      "lance's `scanner(columns, filter)` and pypaimon's `to_arrow_batch_reader(splits)`, aggregated "
                      "batch by batch by the same pyarrow code as the plain pyarrow scan; the plain scans read all "
                      "of bitlake's data files, invalid rows included, so a peer's ratio below 1 reflects its own "
                      "file layout and fewer rows, not a reader faster than plain Parquet):", "",
                  "| system | storage | current data | scan engine | full scan s (plain s) | / plain | "
                  "selective scan s (plain s) | / plain | rows after all batches |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for s in systems:
            st = find(records, s, sf, "storage")
            for e in scan_engines(s):
                full = find(records, s, sf, "scan_full", None, e)
                sel = find(records, s, sf, "scan_selective", None, e)
                if not (st or full or sel):
                    continue
                eng = e or (full or {}).get("engine") or ""

                def scan_cells(r):
                    if r is None:
                        return "—", "—"
                    if r["error"]:
                        return cell_error(r), "—"
                    own = f" ({r['plain_wall_s']:.2f})" if r.get("plain_wall_s") else ""
                    return num(r["wall_s"]) + own, num(scan_ratio(records, r))

                fw, fr = scan_cells(full)
                sw, sr = scan_cells(sel)
                rows = num(full.get("rows"), ",") if full and not full["error"] else "—"
                stor = mb(st.get("storage_bytes")) if st and e in (None, "spark") else ""
                cur = mb(st.get("current_data_bytes")) if st and e in (None, "spark") else ""
                if st and st.get("data_files_by_level") and e is None:
                    cur += " (data files by LSM level: " + ", ".join(
                        f"{n} at {lvl}" for lvl, n in st["data_files_by_level"].items()) + ")"
                lines.append(f"| {s} | {stor} | {cur} | {eng} | {fw} | {fr} | {sw} | {sr} | {rows} |")
        exp = results.get("expected", {}).get(sf_text(sf))
        if exp:
            lines += ["", f"Expected after all batches (from the generator): {exp['rows']:,} rows, sum of "
                          f"`l_quantity` {exp['sum_l_quantity']:,.2f}, {exp['selective_rows']:,} rows in the "
                          "selective scan; every system's scans are checked against it (a mismatch is an error)."]
        lines += more_table(records, sf, [s for s in systems if s != LIMITS])
        errors = [r for r in records if r["scale_factor"] == sf and r["error"] and not r["error"].startswith("not off")]
        if errors:
            lines += ["", "Errors:", ""]
            for r in errors:
                if r["error"].startswith("not run"):
                    continue
                skipped = sum(1 for q in errors if q["system"] == r["system"] and q["error"].startswith("not run"))
                lines.append(f"- {r['system']} {r['operation']} {fraction_text(r['batch_fraction'])}"
                             f"{' (' + r['engine'] + ')' if r.get('engine') else ''}: "
                             f"{r['error'].splitlines()[0][:300]}"
                             + (f" ({skipped} later operations of {r['system']} not run)" if skipped else ""))
        lines.append("")
    lines += ["### Targets", "", "| target | system | scale factor | figure | status |",
              "| --- | --- | --- | --- | --- |"]
    for t in targets(records):
        sf = "—" if t["scale_factor"] is None else sf_text(t["scale_factor"])
        lines.append(f"| {t['target']} | {t['system']} | {sf} | {t['figure']} | {t['status']} |")
    if img_links:
        lines += ["", "### Plots", ""] + [f"![{Path(p).stem}]({p})" for p in img_links]
    lines += ["", "Raw results: " + ", ".join(f"`{p}`" for p in results.get("json_paths", [])) + ".", ""]
    return "\n".join(lines)


def plot(results: dict, img_dir: Path) -> list[str]:
    """Upsert wall time and bytes written against table size (0.1 % batch) and against batch size (largest SF)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = results["records"]
    sfs = sorted({r["scale_factor"] for r in records})
    systems = [s for s in systems_in(records) if s != LIMITS] + [LIMITS]
    img_dir.mkdir(parents=True, exist_ok=True)
    paths = []

    def draw(name, title, xs_label, series_for):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, (field, ylabel) in zip(axes, [("wall_s", "upsert wall time (s)"),
                                              ("bytes_written", "bytes written (MB)")], strict=True):
            for i, s in enumerate(systems):  # one colour per system in every plot
                pts = series_for(s, field)
                label = "change alone as Parquet" if s == LIMITS else s
                if pts:
                    xs, ys = zip(*pts, strict=True)
                    ax.plot(xs, ys, marker="o", label=label, color=f"C{i}", linestyle="--" if s == LIMITS else "-")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(xs_label)
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle(title)
        fig.tight_layout()
        path = img_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    def value(r, field):
        if not r or r.get("error") or r.get(field) is None:
            return None
        return r[field] / 1e6 if field == "bytes_written" else r[field]

    def by_sf(s, field):
        pts = []
        for sf in sfs:
            v = value(find(records, s, sf, "upsert", 0.001), field)
            load = next((r for r in records if r["scale_factor"] == sf and r["operation"] == "load"
                         and r.get("records")), None)
            if v:
                pts.append((load["records"] if load else sf * 6_000_000, v))
        return pts

    draw("peers-cost-vs-table-size.png", "Upsert of a 0.1 % batch against table size",
         "table size (rows)", by_sf)
    top = sfs[-1]

    def by_batch(s, field):
        pts = []
        for fr in UPSERT_FRACTIONS:
            r = find(records, s, top, "upsert", fr)
            v = value(r, field)
            if v:
                pts.append((r.get("records") or fr, v))
        return pts

    draw("peers-cost-vs-batch-size.png", f"Upserts into the scale factor {sf_text(top)} table against batch size",
         "batch size (rows)", by_batch)
    return [os.path.relpath(p, ROOT / "docs") for p in paths]


def publish(results: dict, plots: bool = True) -> str:
    links = plot(results, IMG_DIR) if plots else []
    section = render(results, links)
    if core.DOC.exists():  # a heading that named fewer systems: the section is replaced, not added twice
        lines = core.DOC.read_text().splitlines(keepends=True)
        renamed = [SECTION + "\n" if line.startswith(OLD_SECTION_PREFIX) else line for line in lines]
        if renamed != lines:
            core.DOC.write_text("".join(renamed))
    core.write_doc(section, SECTION)
    core.DOC.write_text(peers_summary.write(core.DOC.read_text(), results))
    RUNS_DOC.write_text(render_runs(results))
    return section


# ------------------------------------------------------------------------------------------ main


def parse_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale-factors", default="0.1,1,3", help="comma-separated TPC-H scale factors")
    ap.add_argument("--systems", default="all",
                    help=f"comma-separated, from {', '.join(SYSTEMS)}; 'all', or 'bitlake-modes'")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per operation before it is killed")
    ap.add_argument("--quick", action="store_true", help="no 10 %% batch, one scan run and no warm-up")
    ap.add_argument("--no-scans", action="store_true", help="loads and batches only (earlier scan figures stay)")
    ap.add_argument("--scan-runs", type=int, help="timed runs of each scan, without a warm-up (default: 3 after a "
                    "warm-up; 1 with --quick): a scale factor whose scans take minutes")
    ap.add_argument("--no-more", action="store_true",
                    help=f"not the operations after the batches and scans ({', '.join(MORE_OPS)})")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each system's sequence this many times, the systems interleaved; each operation's "
                         "record is the round of median time (call plus the work after it)")
    ap.add_argument("--keep-work", action="store_true", help="keep the systems' folders under benchmarks/work/peers")
    ap.add_argument("--no-doc", action="store_true", help="do not touch docs/benchmarks.md or docs/img")
    ap.add_argument("--note", default="", help="a line for the doc (e.g. why a run is partial); with "
                    "--render-only, a note on the runs kept in the (last) results file")
    ap.add_argument("--output", help="results file (default benchmarks/results/peers-<date>.json, merged)")
    ap.add_argument("--render-only", nargs="+", metavar="RESULTS.json",
                    help="rewrite the doc section and the plots from results files (later ones win)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    ap.add_argument("--events", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    os.environ.setdefault("BITLAKE_DRIVER_MEMORY", "8g")
    os.environ.setdefault("BITLAKE_SHUFFLE_PARTITIONS", "16")
    os.environ.setdefault("BITLAKE_SPARK_MASTER", "local[2]")
    if args.worker:
        return worker(args.worker, Path(args.spec), Path(args.folder), Path(args.events))

    if args.render_only:
        results = None
        for p in args.render_only:
            results = merge_results(results, json.loads(Path(p).read_text()))
        if args.note:
            # Kept in the last results file, so that the doc stays regenerable from the JSON alone.
            last = Path(args.render_only[-1])
            saved = json.loads(last.read_text())
            saved.setdefault("notes", []).append(args.note)
            last.write_text(json.dumps(saved, indent=1, default=str) + "\n")
            results.setdefault("notes", []).append(args.note)
        print(publish(results))
        return 0

    if args.repeat < 1:
        ap.error("--repeat takes a count of at least 1")
    sfs = [float(s) for s in parse_list(args.scale_factors)]
    if args.systems == "all":
        systems = SYSTEMS
    else:
        wanted = set()
        for s in parse_list(args.systems):
            wanted |= set(BITLAKE_MODES) if s == "bitlake-modes" else {s}
        unknown = wanted - set(SYSTEMS)
        if unknown:
            ap.error(f"unknown systems {sorted(unknown)}; known: {SYSTEMS}")
        systems = [s for s in SYSTEMS if s in wanted]
    core.compile_bitlake()
    date = dt.datetime.now(dt.UTC)
    given = sys.argv[1:] if argv is None else argv
    run = {"command": shlex.join([".venv/bin/python", "benchmarks/peers.py", *given]),
           "date": date.strftime("%Y-%m-%d %H:%M UTC"), "scale_factors": sfs, "systems": systems,
           "timeout_s": args.timeout, "quick": args.quick, "repeat": args.repeat, "serpentine": True,
           "machine": core.machine(),
           "versions": versions(),
           "master": os.environ["BITLAKE_SPARK_MASTER"], "driver_memory": os.environ["BITLAKE_DRIVER_MEMORY"],
           "code": core.code_version(), "note": args.note, "load_average_start": os.getloadavg()[0]}
    out = Path(args.output) if args.output else RESULTS_DIR / f"peers-{date.strftime('%Y-%m-%d')}.json"
    new = {"runs": [run], "records": [], "expected": {}}
    for sf in sfs:
        work = WORK_DIR / f"sf{sf_text(sf)}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        log(f"SF {sf_text(sf)}: generating the batches")
        spec = prepare_apart(sf, work, args.quick)
        if args.no_scans or args.no_more or args.scan_runs:
            spec["scans"], spec["more"] = not args.no_scans, not args.no_more
            if args.scan_runs:
                spec["runs"], spec["warmup"] = args.scan_runs, False
            (work / "spec.json").write_text(json.dumps(spec, indent=1))
        new["expected"][sf_text(sf)] = spec["expected"]
        rounds: dict[str, list[list[dict]]] = {system: [] for system in systems}
        # The systems interleaved, so that a slow spell of the machine hits them all, in a serpentine order (every
        # other round reversed), so that no system always follows the same one: a worker that follows one which
        # freed gigabytes runs slower (on this machine bitlake-arrow's SF 1 load read its file in 2.1-2.2 s after
        # paimon's worker, against 1.0 s after none).
        for r in range(args.repeat):
            for system in systems if r % 2 == 0 else systems[::-1]:
                rounds[system].append(run_system(system, spec, work / system, args.timeout))
        sf_records = [r for system in systems for r in median_records(rounds[system])]
        check(sf_records, spec["expected"])
        new["records"] += sf_records
        old = json.loads(out.read_text()) if out.exists() else None
        results = merge_results(old, {**new, "records": sf_records, "runs": [] if sf != sfs[0] else [run]})
        results["json_paths"] = sorted(set(results.get("json_paths", []) + [os.path.relpath(out, ROOT)]))
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1, default=str) + "\n")  # after every SF: partial results
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    results = json.loads(out.read_text())
    for r in results["runs"]:
        if r["date"] == run["date"] and r["command"] == run["command"]:
            r["load_average_end"] = os.getloadavg()[0]
    out.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(publish(results, plots=True) if not args.no_doc else render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
