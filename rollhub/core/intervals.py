"""Confidence intervals for success rates: every reading is reported with its n and 95% interval.

A success rate read on 20 or 100 episodes is a noisy estimate; the Wilson score interval is used
because, unlike the normal approximation, it stays inside [0, 1] and keeps a useful width at 0%
and 100% and for small n, the readings small runs produce.
"""

from __future__ import annotations

import math

Z_95 = 1.959963984540054  # two-sided 95% quantile of the standard normal


def wilson_interval(successes: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a success rate `successes / n`; (0.0, 1.0) when n is 0.

    `successes` may be fractional (a rate times n), as readings are logged as rates."""
    if n <= 0:
        return 0.0, 1.0
    rate = min(max(successes / n, 0.0), 1.0)
    denominator = 1 + z * z / n
    centre = (rate + z * z / (2 * n)) / denominator
    half = z * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n)) / denominator
    low = 0.0 if rate == 0 else max(0.0, centre - half)
    high = 1.0 if rate == 1 else min(1.0, centre + half)
    return low, high
