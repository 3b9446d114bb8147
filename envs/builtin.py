"""Registration of the built-in env ids (entry points import lazily on make)."""

from rollhub.envs.registry import register


def register_builtin_envs() -> None:
    # Each area adds its ids here; keep entry points as strings so nothing heavy imports.
    # Benchmark-only simulations (issue 8): latency envs with no task, for scheduling benchmarks.
    register("bench/LatencySokoban-v0", "rollhub.benchmarks.latency_env:sokoban_like", description="[benchmark simulation] Sokoban-like step latencies, no task", time_scale=0.001)
    register("bench/LatencySWE-v0", "rollhub.benchmarks.latency_env:swe_like", description="[benchmark simulation] SWE-like step and reset latencies, no task", time_scale=0.001)
    pass
