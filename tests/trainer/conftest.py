"""Shared fixtures: one tiny random-init model per test session (built locally, no downloads)."""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from rollhub.rollout.models import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("tiny-model"), "5m", seed=0)
