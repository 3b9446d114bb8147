"""Registers the benchmark-simulation env ids through rollhub's own `rollhub.envs` entry point.

They live here, not in `rollhub.envs.builtin`, so the env hub never imports benchmark code;
their descriptions start with "[benchmark simulation]" so `rollhub envs list` marks them.
"""

from rollhub.envs.registry import register

SIMULATION_LABEL = "[benchmark simulation]"


def register_envs() -> None:
    latency_env = "rollhub.bench.sim.latency_env"
    register(
        "bench/LatencySokoban-v0",
        f"{latency_env}:sokoban_like",
        description=f"{SIMULATION_LABEL} Sokoban-like step latencies, no task",
        time_scale=0.001,
    )
    register(
        "bench/LatencySWE-v0",
        f"{latency_env}:swe_like",
        description=f"{SIMULATION_LABEL} SWE-like step and reset latencies, no task",
        time_scale=0.001,
    )
