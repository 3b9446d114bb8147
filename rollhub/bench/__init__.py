"""rollhub.bench: reproducible measurements behind `rollhub bench NAME`."""
