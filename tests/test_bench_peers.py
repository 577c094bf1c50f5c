"""The peers benchmark's renderer, from hand-built records: no Spark, no data, no peers installed."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def peers():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("bench_peers", BENCH / "peers.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def rec(system, sf, op, fraction=None, wall=1.0, written=None, change=None, engine=None, error=None, **extra):
    return {"system": system, "scale_factor": sf, "operation": op, "batch_fraction": fraction, "engine": engine,
            "wall_s": wall, "bytes_written": written, "change_parquet_bytes": change, "error": error, **extra}


def records():
    out = []
    for sf in (0.1, 1.0):
        rows = int(6_000_000 * sf)
        for system, written_per_change, wall in (("bitlake", 1.4, 2.0), ("deltalake", 700.0, 3.0), ("lance", 1.3, 2.0),
                                                 ("iceberg", 500.0, 50.0), ("spark-rewrite", 650.0, 9.0),
                                                 ("limits", 1.0, 0.1)):
            out.append(rec(system, sf, "load", None, 10.0, 200e6 * sf, 200e6 * sf, records=rows))
            for f in (0.001, 0.01, 0.1):
                change = 300e3 * sf * f / 0.001
                written = change * (written_per_change if system in ("bitlake", "limits") else 1) or None
                if system not in ("bitlake", "limits"):
                    written = 200e6 * sf
                out.append(rec(system, sf, "upsert", f, wall * (sf if system != "bitlake" else 1), written,
                               change, records=round(rows * f)))
            out.append(rec(system, sf, "delete", 0.001, wall, 1e5, 2e4, records=round(rows * 0.001)))
            if system == "limits":
                for engine, seconds in (("spark", 5.0), ("pyarrow", 2.0)):
                    out.append(rec(system, sf, "scan_full", None, seconds, engine=engine, rows=rows))
                    out.append(rec(system, sf, "scan_selective", None, seconds / 4, engine=engine, rows=rows // 80))
            else:
                engine = "pyarrow" if system in ("deltalake", "iceberg") else "spark"
                out.append(rec(system, sf, "scan_full", None, 5.5, engine=engine, rows=rows, sum_l_quantity=1.0))
                out.append(rec(system, sf, "scan_selective", None, 1.5, engine=engine, rows=rows // 80))
            out.append(rec(system, sf, "storage", None, None, storage_bytes=300e6 * sf, current_data_bytes=200e6 * sf))
    # iceberg's 10 % upsert at SF 1 passed the time limit; what came after it did not run
    for r in out:
        if r["system"] == "iceberg" and r["scale_factor"] == 1.0 and r["operation"] == "upsert" and r["batch_fraction"] == 0.1:
            r.update(wall_s=None, bytes_written=None, error="timeout: passed the limit of 600 s")
        elif r["system"] == "iceberg" and r["scale_factor"] == 1.0 and r["operation"] in ("delete", "scan_full"):
            r.update(wall_s=None, bytes_written=None, error="not run: an earlier operation timed out")
    return out


def results():
    run = {"command": ".venv/bin/python benchmarks/peers.py --scale-factors 0.1,1", "date": "2026-11-23 01:00 UTC",
           "scale_factors": [0.1, 1.0], "systems": ["bitlake", "limits", "deltalake", "iceberg", "spark-rewrite"],
           "machine": {"cores": 2, "memory_gib": 23.5, "platform": "Linux", "python": "3.11.7"},
           "versions": {"pyspark": "4.3.0", "pyarrow": "26.0.1", "deltalake": "1.6.6", "pyiceberg": "0.12.0",
                        "tpchgen-cli": "4.0.0"},
           "code": {"git_head": "abc1234", "bitlake_dirty": False}, "note": "a hand-built run"}
    return {"runs": [run], "records": records(), "expected": {"1": {"rows": 6, "sum_l_quantity": 1.0,
                                                                   "selective_rows": 1}},
            "json_paths": ["benchmarks/results/peers-test.json"]}


def test_write_amplification(peers):
    rs = records()
    assert peers.amplification(peers.find(rs, "bitlake", 1.0, "upsert", 0.001)) == pytest.approx(1.4)
    assert peers.amplification(peers.find(rs, "deltalake", 1.0, "upsert", 0.001)) == pytest.approx(200e6 / 300e3)
    assert peers.amplification(peers.find(rs, "iceberg", 1.0, "upsert", 0.1)) is None  # timed out: no figure


def test_scan_ratio_uses_the_plain_scan_of_the_same_engine(peers):
    rs = records()
    assert peers.scan_ratio(rs, peers.find(rs, "bitlake", 1.0, "scan_full")) == pytest.approx(5.5 / 5.0)
    assert peers.scan_ratio(rs, peers.find(rs, "deltalake", 1.0, "scan_full")) == pytest.approx(5.5 / 2.0)
    # bitlake's own interleaved plain scan wins over the limits' one when it is there
    paired = {**peers.find(rs, "bitlake", 1.0, "scan_full"), "plain_wall_s": 5.0 / 1.1}
    assert peers.scan_ratio(rs, paired) == pytest.approx(5.5 * 1.1 / 5.0)


def test_targets(peers):
    by = {}
    for t in peers.targets(records()):
        by.setdefault((t["target"].split(" ")[0], t["scale_factor"]), []).append(t["status"])
    assert by[("write", 1.0)] == ["met"] * 4        # 476x lower than the best copy-on-write peer; 1.4 <= 1.5
    assert by[("upsert", 1.0)] == ["met"] * 5       # within 1.5x of lance at SF 1 (3), the same batch at 10x (2)
    assert ("upsert", 0.1) not in by                # the lance comparison is made at SF 1, the rest from SF 3
    assert by[("base", 1.0)] == ["met"]             # the same load time as the fastest peer
    assert by[("full", 1.0)] == ["met"]             # 1.1x the plain Spark scan
    same_size = [t for t in peers.targets(records()) if "table size" in t["target"]]
    assert [t["status"] for t in same_size] == ["met", "met"]  # SF 0.1 at 1 % against SF 1 at 0.1 %, and 10 % vs 1 %


def test_load_targets_by_input_and_targets_without_peers(peers):
    """Arrow input's load is held to the fastest peer's (1.5x), a Spark DataFrame's to plain Spark writing it; a
    target with nothing to compare with is not assessed, never met."""
    rs = records() + [rec("bitlake-arrow", 1.0, "load", None, 16.0), rec("bitlake-arrow", 3.0, "upsert", 0.001, 0.1),
                      rec("bitlake", 3.0, "load", None, 30.0)]
    by = {(t["system"], t["scale_factor"], t["target"]): t for t in peers.targets(rs)}
    arrow = by[("bitlake-arrow", 1.0, "base load at most 1.5x the fastest peer's (Arrow input)")]
    assert arrow["status"] == "MISSED" and "10.0 s: 1.60x" in arrow["figure"] and "spark-rewrite" not in arrow["figure"]
    spark = "base load of a Spark DataFrame at most plain Spark writing it as Parquet"
    assert by[("bitlake", 1.0, spark)]["status"] == "met" and "spark-rewrite 10.0 s: 1.00x" in by[("bitlake", 1.0, spark)]["figure"]
    assert by[("bitlake", 3.0, spark)]["status"] == "not assessed"
    alone = by[("bitlake-arrow", 3.0, "upsert faster than every peer (scale factors 3 and 10)")]
    assert alone["status"] == "not assessed" and "lance not run" in alone["figure"]


def test_targets_count_the_background_work_an_operation_left(peers):
    """bitlake's key-index update runs after the call returns: the wall cell shows it, the targets count it."""
    rs = records()
    mine = peers.find(rs, "bitlake", 1.0, "upsert", 0.001)
    mine["settle_s"] = 1.5  # 2.0 s + 1.5 s against lance's 2.0 s: past 1.5x
    status = [t["status"] for t in peers.targets(rs) if t["target"].startswith("upsert within")]
    assert status == ["MISSED", "met", "met"]
    text = peers.render({**results(), "records": rs}, [])
    assert "| upsert | 0.1 % | 6,000 | 0.30 MB | bitlake | 2.00 (+1.50 after) |" in text


def test_render(peers):
    text = peers.render(results(), ["img/peers-cost-vs-table-size.png"])
    assert text.startswith(peers.SECTION + "\n")
    assert "### Scale factor 1 (6,000,000 rows)" in text
    assert "| upsert | 0.1 % | 6,000 | 0.30 MB | deltalake | 3.00 | 200.00 MB | 666.67 |" in text
    assert "| upsert | 10 % | 600,000 | 30.00 MB | iceberg | timed out | — | — |" in text
    assert "iceberg upsert 10 %: timeout: passed the limit of 600 s (2 later operations of iceberg not run)" in text
    assert "deltalake 1.6.6" in text and "2 cores" in text
    assert "![peers-cost-vs-table-size](img/peers-cost-vs-table-size.png)" in text
    assert "MISSED" not in text


def test_merge_results_replaces_a_system_of_a_scale_factor(peers):
    old = results()
    new = {"runs": [{"command": "again"}], "records": [rec("deltalake", 1.0, "load", None, 99.0)], "expected": {}}
    merged = peers.merge_results(old, new)
    loads = [r for r in merged["records"] if r["system"] == "deltalake" and r["scale_factor"] == 1.0
             and not r["operation"].startswith("scan")]  # a run without scans keeps the old ones (below)
    assert [r["wall_s"] for r in loads] == [99.0]
    assert len(merged["runs"]) == 2


def test_a_run_without_scans_keeps_the_earlier_scans(peers):
    old = results()
    before = [r for r in old["records"] if r["system"] == "bitlake" and r["scale_factor"] == 1.0
              and r["operation"].startswith("scan")]
    new = {"runs": [{"command": "--no-scans"}], "records": [rec("bitlake", 1.0, "load", None, 99.0)], "expected": {}}
    merged = peers.merge_results(old, new)
    mine = [r for r in merged["records"] if r["system"] == "bitlake" and r["scale_factor"] == 1.0]
    assert [r["wall_s"] for r in mine if r["operation"] == "load"] == [99.0]
    assert before and [r for r in mine if r["operation"].startswith("scan")] == before
    assert not [r for r in mine if r["operation"].startswith("upsert")]  # the rest of the old run is replaced


def test_repeated_sequences_report_each_operation_from_its_round_of_median_time(peers):
    rounds = [[rec("bitlake", 1.0, "load", None, 10.0), rec("bitlake", 1.0, "upsert", 0.001, 0.30, settle_s=0.05)],
              [rec("bitlake", 1.0, "load", None, 12.0), rec("bitlake", 1.0, "upsert", 0.001, 0.10, settle_s=0.01)],
              [rec("bitlake", 1.0, "load", None, 9.0), rec("bitlake", 1.0, "upsert", 0.001, 0.20, settle_s=0.30)]]
    load, upsert = peers.median_records(rounds)
    assert (load["wall_s"], load["rounds_s"]) == (10.0, [10.0, 12.0, 9.0])
    assert (upsert["wall_s"], upsert["settle_s"]) == (0.30, 0.05)  # 0.35 s in all: the median of 0.35, 0.11, 0.50
    rounds[1][1].update(wall_s=None, error="crashed: the worker process died")
    assert peers.median_records(rounds)[1]["error"].startswith("crashed")  # failed once: reported as failed
    assert peers.median_records(rounds[:1]) == rounds[0]
    run = {**results()["runs"][0], "repeat": 3}
    assert "ran 3 times" in peers.render_runs({**results(), "runs": [run]})


def test_summary_table_between_the_markers(peers):
    """The summary: one table a scale factor, bitlake's and the peers' figures side by side, written between the
    markers of the doc and nowhere else; an operation a system lacks reads "not offered", one it never ran "not run"."""
    import peers_summary

    base = [rec("bitlake-arrow", 1.0, "load", None, 4.0, 250e6, 210e6, records=6_000_000, settle_s=0.5),
            rec("bitlake-arrow", 1.0, "upsert", 0.001, 0.02, 4.5e5, 3e5, settle_s=0.01),
            rec("bitlake-arrow", 1.0, "scan_full", None, 3.3, engine="spark"),
            rec("bitlake-arrow", 1.0, "scan_full", None, 0.96, engine="pyarrow"),
            rec("lance", 1.0, "load", None, 3.3, 325e6, 210e6), rec("lance", 1.0, "erase", None, 0.19, 9e5),
            rec("lance", 1.0, "scan_full", None, 1.43, engine="pyarrow"),
            rec("lance", 1.0, "revert", None, None, error="not offered: no batches")]
    text = peers_summary.render({"records": base})
    lines = text.splitlines()
    assert lines[0] == peers_summary.START and lines[-1] == peers_summary.END
    assert "Scale factor 1 (6,000,000 rows):" in lines
    assert "| operation | bitlake | lance |" in lines  # delta-rs and Paimon did not run at this scale factor
    assert "| load (an Arrow stream) | 4.50 s, 250.0 MB | 3.30 s, 325.0 MB |" in lines
    assert "| upsert 0.1 % | 0.03 s, 0.5 MB (1.50x) | not run |" in lines
    assert "| full scan into Arrow | 0.96 s | 1.43 s |" in lines  # the pyarrow scan, not Spark's
    assert "| erase 1,000 suppliers' rows from the files | not run | 0.19 s, 0.9 MB (marked, not removed) |" in lines
    assert "| revert the 0.1 % batch | not run | not offered |" in lines
    doc = f"# Benchmarks\n\nprose\n\n{peers_summary.START}\nold table\n{peers_summary.END}\n\nmore prose\n"
    written = peers_summary.write(doc, {"records": base})
    assert written.startswith("# Benchmarks\n\nprose\n\n" + text) and written.endswith("\n\nmore prose\n")
    assert "old table" not in written
    assert peers_summary.write("# no markers\n", {"records": base}) == "# no markers\n"
