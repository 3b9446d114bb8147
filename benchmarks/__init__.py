"""rollhub.benchmarks: reproducible measurements behind `rollhub bench NAME`."""
