"""Test setup shared by tests/ and experiments/, kept tiny: one CPU thread per test process (CI
has 2 shared cores), and one tiny random-init model per test session (built locally, no downloads)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollhub.inference.models import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("tiny5m"), size="5m")


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer(tiny_model_dir: Path) -> tuple[Any, Any]:
    from rollhub.inference.models import load_model_and_tokenizer

    return load_model_and_tokenizer(tiny_model_dir)


@pytest.fixture
async def engine(tiny_model_and_tokenizer):
    from rollhub.inference.engines.hf import HFEngine

    model, tokenizer = tiny_model_and_tokenizer
    eng = HFEngine(model, tokenizer, threads=1, max_batch_size=32)
    yield eng
    await eng.close()


@pytest.fixture
async def engine_apps(tiny_model_dir):
    """Two HFEngines, each behind the SGLang-native app on its own port (no processes).

    Yields (engines, runners, urls); the router and server tests take what they need.
    """
    from aiohttp import web

    from rollhub.inference.engines.hf import HFEngine
    from rollhub.inference.server import build_app

    engines, runners, urls = [], [], []
    for _ in range(2):
        engine = HFEngine(tiny_model_dir, threads=1, max_batch_size=8)
        runner = web.AppRunner(build_app(engine))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        engines.append(engine)
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
    yield engines, runners, urls
    for runner in runners:
        await runner.cleanup()
