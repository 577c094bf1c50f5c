"""Helpers of the multi-process tests: the writer script and the harness that runs it."""
