"""The peers benchmark's summary: one table a scale factor, every operation down and bitlake, delta-rs, lance and
Paimon across, each cell the figure a reader compares (wall time with the work after the call, bytes written, and
the write amplification of the batches), from the merged results JSON. ``benchmarks/peers.py`` writes it between
two markers in the section "Summary" of docs/benchmarks.md, where the prose around it says what the misses are made
of; the full records stay in the section "Peers"."""

from __future__ import annotations

START = "<!-- peers-summary:start (benchmarks/peers.py writes what is between these markers) -->"
END = "<!-- peers-summary:end -->"

# (operation, batch fraction, engine of the scan or None, the row's label)
ROWS = [
    ("load", None, None, "load (an Arrow stream)"),
    ("upsert", 0.001, None, "upsert 0.1 %"),
    ("upsert", 0.01, None, "upsert 1 %"),
    ("upsert", 0.1, None, "upsert 10 %"),
    ("delete", 0.001, None, "delete 0.1 % (by key)"),
    ("scan_full", None, "pyarrow", "full scan into Arrow"),
    ("scan_selective", None, "pyarrow", "selective scan (March 1995)"),
    ("past_scan", None, None, "the base as loaded (a past version), scanned"),
    ("change_feed", None, None, "change feed of the 1 % batch"),
    ("update_where", None, None, "update by condition (one day)"),
    ("delete_where", None, None, "delete by condition (one day)"),
    ("erase", None, None, "erase 1,000 suppliers' rows from the files"),
    ("compact", None, None, "compaction"),
    ("revert", None, None, "revert the 0.1 % batch"),
]
SYSTEMS = [("bitlake-arrow", "bitlake"), ("deltalake", "delta-rs"), ("lance", "lance"),
           ("paimon", "Paimon (Rust writer)")]
_READS = {"scan_full", "scan_selective", "past_scan", "change_feed"}
_BATCHES = {"upsert", "delete"}


def cell(r: dict | None) -> str:
    """One system's figure for one operation."""
    if r is None:
        return "not run"
    if r.get("error"):
        return "not offered" if r["error"].startswith("not offered") else "failed"
    seconds = r["wall_s"] + (r.get("settle_s") or 0)
    if r["operation"] in _READS:
        return f"{seconds:.2f} s"
    text = f"{seconds:.2f} s, {(r.get('bytes_written') or 0) / 1e6:,.1f} MB"
    if r["operation"] in _BATCHES and r.get("change_parquet_bytes"):
        text += f" ({r['bytes_written'] / r['change_parquet_bytes']:.2f}x)"
    if r["system"] == "lance" and r["operation"] == "erase":
        text += " (marked, not removed)"
    if r["operation"] == "compact" and not r.get("bytes_written"):
        text += " (nothing to do)"
    return text


def _found(records: list[dict], sf: float, system: str, operation: str, fraction, engine) -> dict | None:
    for r in records:
        if (r["scale_factor"] == sf and r["system"] == system and r["operation"] == operation
                and r.get("batch_fraction") == fraction and (engine is None or r.get("engine") == engine)):
            return r
    return None


def table(records: list[dict], sf: float) -> list[str]:
    """The summary table of scale factor ``sf``: the systems that ran at it, across."""
    systems = [(s, label) for s, label in SYSTEMS if any(r["system"] == s and r["scale_factor"] == sf
                                                       for r in records)]
    load = _found(records, sf, systems[0][0], "load", None, None)
    head = f"Scale factor {sf:g}" + (f" ({load['records']:,} rows)" if load and load.get("records") else "") + ":"
    lines = [head, "", "| operation | " + " | ".join(label for _, label in systems) + " |",
             "| --- |" + " --- |" * len(systems)]
    for operation, fraction, engine, label in ROWS:
        cells = [cell(_found(records, sf, s, operation, fraction, engine)) for s, _ in systems]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines + [""]


def render(results: dict) -> str:
    """The tables of every scale factor of ``results`` with bitlake and a peer, between the markers."""
    records = results["records"]
    sfs = sorted({r["scale_factor"] for r in records if r["system"] == SYSTEMS[0][0]})
    lines = [START, ""]
    for sf in sfs:
        lines += table(records, sf)
    return "\n".join(lines + [END])


def write(doc_text: str, results: dict) -> str:
    """``doc_text`` with the summary tables between the markers replaced (unchanged when it has no markers)."""
    start, end = doc_text.find(START), doc_text.find(END)
    if start < 0 or end < start:
        return doc_text
    return doc_text[:start] + render(results) + doc_text[end + len(END):]
