"""The bitlake table format, version 2 (docs/FORMAT.md): layout, file schemas, the readers and writers of
every file, the commit log, and the state a version's commits replay to.

This package imports neither Spark nor any engine: the Spark jobs (:mod:`bitlake.spark`) and the driver's
Arrow code (:mod:`bitlake.engine`) sit on it, and a second implementation needs only docs/FORMAT.md.
Every byte goes through a :class:`bitlake.fs.FileIO`.
"""
