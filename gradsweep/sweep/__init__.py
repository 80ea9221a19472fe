"""Running a sweep: isolated workers, shards, partial results, tracked reds, the tally and its verdict."""
