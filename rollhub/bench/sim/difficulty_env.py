"""BENCHMARK-ONLY: a latency env whose episode duration grows with the task's difficulty.

Task `seed` has difficulty `seed % levels` (so a stream of consecutive seeds draws every
level equally often: the task distribution is uniform over levels). A level-d step sleeps
N(step_mean_s·(1 + slope·d), step_std_s) and the episode succeeds with probability
success_prob_easy − d·success_drop: harder tasks take longer and fail more, the shape of
ALFWorld's long games or SWE's hard issues. Used by `rollhub bench redundancy-bias` to show
what cancelling the slowest groups does to the mix of tasks a trainer sees.
"""

from __future__ import annotations

from typing import Any

from rollhub.bench.sim.latency_env import LatencyDistribution, LatencyEnv


class DifficultyLatencyEnv(LatencyEnv):
    def __init__(
        self,
        *,
        levels: int = 4,
        slope: float = 1.0,
        step_mean_s: float = 5.0,
        step_std_s: float = 2.0,
        success_prob_easy: float = 0.8,
        success_drop: float = 0.2,
        **kwargs: Any,
    ):
        if levels < 1:
            raise ValueError("levels must be >= 1")
        if slope < 0:
            raise ValueError("slope must be >= 0")
        super().__init__(step_mean_s=step_mean_s, step_std_s=step_std_s, **kwargs)
        self.levels = levels
        self.slope = slope
        self.base_mean_s = step_mean_s
        self.success_prob_easy = success_prob_easy
        self.success_drop = success_drop
        self.difficulty = 0

    async def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.difficulty = (seed or 0) % self.levels
        self.step_latency = LatencyDistribution(
            self.base_mean_s * (1 + self.slope * self.difficulty), self.step_latency.std_s
        )
        self.success_prob = max(0.0, min(1.0, self.success_prob_easy - self.difficulty * self.success_drop))
        observation, info = await super().reset(seed=seed, options=options)
        info["difficulty"] = self.difficulty
        return observation, info
