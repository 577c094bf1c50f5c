"""Writing batches: landing, conforming input, MetaGen, restatement of batches."""
