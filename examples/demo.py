"""bitlake in one minute: a keyed table of bank accounts, a base load and a few change batches.

Run it with ``make demo`` or ``python examples/demo.py [PATH]`` (default ``./demo-lake``, removed first).
Spark runs in local mode; the table is a plain folder you can look into afterwards.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console

import bitlake
from bitlake.cli import render_history, render_rows

SCHEMA = pa.schema([
    ("aid", pa.int64()),
    ("name", pa.string()),
    ("balance", pa.float64()),
    ("mod_time", pa.timestamp("us", tz="UTC")),
])
BASE_ROWS = 3000
T0 = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)

console = Console()


def accounts(aids, *, at: dt.datetime, balance=100.0, name="holder", op: str | None = None) -> pa.Table:
    """Records for ``aids`` with the same mod_time; with ``op`` an extra op column ("upsert"/"delete")."""
    aids = list(aids)
    columns = {
        "aid": pa.array(aids, pa.int64()),
        "name": pa.array([f"{name}-{a}" for a in aids]),
        "balance": pa.array([balance + a for a in aids], pa.float64()),
        "mod_time": pa.array([at] * len(aids), pa.timestamp("us", tz="UTC")),
    }
    if op is not None:
        columns["op"] = pa.array([op] * len(aids))
    return pa.table(columns)


def name_of(table: bitlake.Table, aid: int) -> str:
    """Reads the small view on the driver with to_arrow(), no Spark job."""
    view = table.to_arrow()
    return view.filter(pc.equal(view["aid"], aid))["name"][0].as_py()


def say(text: str) -> None:
    console.print(text, highlight=False)


def explain(title: str, text: str) -> None:
    console.rule(f"[bold]{title}")
    say(text)


def report(r: bitlake.IngestResult, what: str = "") -> None:
    counts = ", ".join(f"{k}={v}" for k, v in r.counts.items() if v) or "no records applied yet"
    what = what or f"batch [cyan]{r.batch_id}[/cyan]"
    if not r.committed:
        say(f"  -> {what} was already committed at version {r.version}: nothing written ({counts})")
    else:
        say(f"  -> {what} committed at version {r.version}, visible={r.visible}: {counts}")


def fresh_folder(path: str) -> None:
    """Removes the previous demo table, and refuses to remove anything that is not a bitlake table."""
    if os.path.exists(path):
        if os.listdir(path) and not os.path.isdir(os.path.join(path, "_bitlake")):
            raise SystemExit(f"{path} exists and is not a bitlake table; pick another folder")
        shutil.rmtree(path)


def main(path: str = "demo-lake") -> bitlake.Table:
    started = time.monotonic()
    fresh_folder(path)
    spark = bitlake.spark_session()

    explain("1. create", "A keyed table: primary key aid, and mod_time orders each key's records.")
    table = bitlake.create_table(path, SCHEMA, primary_key=["aid"], delta_column="mod_time", num_buckets=4)
    say(f"  -> {table!r}")

    explain("2. base load", f"{BASE_ROWS} accounts in one batch. Landing writes the data files (every row "
            "carries its row id); MetaGen fills the key store and the validity bitmaps, then one commit.")
    report(table.ingest(accounts(range(1, BASE_ROWS + 1), at=T0), batch_id="base", spark=spark))

    explain("3. a change batch", "One batch, told apart by its op column: 200 updates, 100 new accounts, "
            "50 deletes, and one stale record (account 500 with a mod_time older than the one stored).\n"
            "Only these 351 records are written: old rows are never rewritten, they are marked invalid.")
    t1 = T0 + dt.timedelta(days=31)
    changes = pa.concat_tables([
        accounts(range(1, 201), at=t1, balance=1000.0, name="updated", op="upsert"),
        accounts(range(BASE_ROWS + 1, BASE_ROWS + 101), at=t1, name="new", op="upsert"),
        accounts(range(2901, 2951), at=t1, op="delete"),
        accounts([500], at=T0 - dt.timedelta(days=365), name="stale", op="upsert"),
    ])
    report(table.ingest(changes, op_column="op", batch_id="changes-1", spark=spark))

    explain("4. a retried batch", "The same batch id again (say, a job retried after a timeout): a no-op.")
    report(table.ingest(changes, op_column="op", batch_id="changes-1", spark=spark))

    explain("5. land now, MetaGen later", "metagen=False only lands the data: it is committed but not "
            "visible until metagen() runs (e.g. one MetaGen for several landed batches).")
    t2 = t1 + dt.timedelta(days=1)
    report(table.ingest(accounts(range(201, 211), at=t2, balance=5000.0, name="late"),
                        batch_id="changes-2", metagen=False, spark=spark))
    say(f"  account 201 before metagen(): {name_of(table, 201)}")
    report(table.metagen(spark=spark), "metagen() of the pending batches")
    say(f"  account 201 after metagen():  {name_of(table, 201)}")

    explain("6. the current view", "What readers see: one row per live key, read at scan speed (files "
            "filtered by the bitmaps). Account 500 kept its base row; 2901 was deleted, so it is absent.")
    view = table.to_spark(spark)
    total = view.count()
    first = view.orderBy("aid").limit(5).collect()
    picked = "1, 500, 2900, 2901, 3001"
    picks = view.where(f"aid IN ({picked})").orderBy("aid").collect()
    console.print(render_rows(view.columns, [tuple(r) for r in first], title=f"first 5 of {total} rows"))
    console.print(render_rows(view.columns, [tuple(r) for r in picks], title=f"accounts {picked}"))
    expected = BASE_ROWS + 100 - 50
    say(f"  {total} rows = {BASE_ROWS} base + 100 new - 50 deleted (expected {expected})")
    d = table.describe()
    say(f"  stored rows {d['stored_rows']}, valid rows {d['valid_rows']}, in {d['data_files']} data files: "
        "superseded rows stay in their files, hidden by the bitmaps, until compaction")

    explain("7. upkeep", "maintain() reads the table's metrics and runs what is due: here a minor compaction "
            "that merges the small files, current rows apart from superseded ones (every view stays as it was).")
    plan = table.maintain(dry_run=True)
    for task in plan.tasks:
        say(f"  due: {task.name}: {task.reason}")
    done = table.maintain()
    if done.compaction is not None and done.compaction.version is not None:
        c = done.compaction
        say(f"  version {c.version}: {c.removed_files} files rewritten into {c.added_files}")
    if table.to_spark(spark).count() != total:
        raise SystemExit("the view changed with the compaction")

    explain("8. restatement", "The late batch changes-2 was wrong: revert_batch() makes every view from now on "
            "as if it had never come (account 201 shows its previous record again) in one commit of metadata. "
            "Then account 7 asks to be forgotten: a tombstone hides its rows at once, vacuum() removes them "
            "from every file.")
    report(table.revert_batch("changes-2"), "revert of changes-2")
    say(f"  account 201 after the revert: {name_of(table, 201)}")
    say(f"  tombstone at version {table.tombstone('aid', [7]).version}: account 7 is hidden from every view from now on")
    v = table.vacuum()
    say(f"  vacuum at version {v.version}: {v.rows_purged} row(s) purged, {v.files_rewritten} of "
        f"{v.files_considered} data files rewritten")
    if name_of(table, 201) != "holder-201" or table.to_spark(spark).count() != total - 1:
        raise SystemExit("the restatement did not give the expected view")
    total -= 1
    expected -= 1

    explain("9. history", "Every commit, newest first: the batch it carried and what it did.")
    console.print(render_history(table.history()))
    say(f"\ndone in {time.monotonic() - started:.0f} s; the table is in {os.path.abspath(path)}")
    if total != expected:
        raise SystemExit(f"the view has {total} rows, expected {expected}")
    return table


if __name__ == "__main__":
    os.environ.setdefault("BITLAKE_SHUFFLE_PARTITIONS", "4")
    main(sys.argv[1] if len(sys.argv) > 1 else "demo-lake")
