"""The driver's engine: landing tasks, MetaGen, the read planner and Arrow reads, in pyarrow and numpy on
top of :mod:`bitlake.format`. The Spark jobs (:mod:`bitlake.spark`) run the same task code in executors."""
