"""Checking a reward before it is kept: only a finite number of sane size is ever trained on.

A reward reaches the gateway from the agent program (`POST /sessions/{id}/reward`, or
`ProgramTask.set_reward`), code rollhub did not write. A NaN, an infinity, 1e308 or a string
would poison the group's advantages (one NaN makes the whole batch's loss NaN), so it is
refused where it arrives, with the reason, and the session keeps its earlier reward (0 if none:
a session that never reports a valid reward is paid nothing).
"""

from __future__ import annotations

import math
from typing import Any

from rollhub.rollout.gateway.errors import bad_param


def checked_reward(value: Any, max_abs: float) -> float:
    """`value` as a float, or a 400 (`ApiError`, param `reward`) saying why it is refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_param("reward", f"'reward' must be a number, got {type(value).__name__} {value!r:.80}")
    try:
        reward = float(value)
    except OverflowError:  # an integer too large for a float
        raise bad_param("reward", f"'reward' must be within +-{max_abs:g}, got a huge integer") from None
    if not math.isfinite(reward):
        raise bad_param("reward", f"'reward' must be a finite number, got {reward!r}")
    if abs(reward) > max_abs:
        raise bad_param(
            "reward", f"'reward' must be within +-{max_abs:g} (GatewayConfig.max_abs_reward), got {reward:g}"
        )
    return reward
