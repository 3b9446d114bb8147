"""Data-parallel trainer ranks: batch sharding (`sharding`, pure functions), the rank group rank 0
drives (`group`) and starting the ranks (`launch`: torchrun, local processes, Ray actors)."""
