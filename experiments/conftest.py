"""Test setup for the campaigns' tools, as tests/conftest.py has it: one CPU thread per test
process and one tiny random-init model per test session (built locally, no downloads)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollhub.inference.models import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("tiny5m"), size="5m")
