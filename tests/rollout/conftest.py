"""Fixtures for the rollout tests: a small scripted test env (the tiny model is in tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest
from rollout_testing import CountdownEnv


@pytest.fixture
def countdown_factory():
    def factory(env_id: str, **kwargs: Any) -> CountdownEnv:
        return CountdownEnv(**kwargs)

    return factory
