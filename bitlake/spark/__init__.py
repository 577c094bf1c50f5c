"""The Spark jobs: data landing, MetaGen, and reads. Executors read and write per-segment metadata
themselves; the driver plans with lists of files and commits."""
