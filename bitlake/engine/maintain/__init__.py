"""Upkeep: compaction, the retention window, the vacuum, the metrics that say what is due."""
