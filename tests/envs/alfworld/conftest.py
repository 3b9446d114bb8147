"""ALFWorld tests need the real engine (the 'alfworld' extra); they skip visibly without it."""

import importlib.util

import pytest

ENGINE_MISSING = [m for m in ("textworld", "alfworld", "fast_downward") if importlib.util.find_spec(m) is None]
needs_engine = pytest.mark.skipif(
    bool(ENGINE_MISSING),
    reason=f"ALFWorld engine not installed (missing {', '.join(ENGINE_MISSING)}): pip install -e '.[alfworld]'",
)


@pytest.fixture(scope="module")
def pool():
    """Two private worker processes shared by a test module (their caches stay warm)."""
    from rollhub.envs.alfworld.pool import WorkerPool

    workers = WorkerPool(2)
    yield workers
    workers.close()


@pytest.fixture(scope="module", autouse=True)
def _stop_shared_pools():
    yield
    if not ENGINE_MISSING:
        from rollhub.envs.alfworld.pool import shutdown_shared_pools

        shutdown_shared_pools()
