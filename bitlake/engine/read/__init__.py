"""Reading: the read planner every engine shares, the Arrow reader, the change feed, time travel."""
