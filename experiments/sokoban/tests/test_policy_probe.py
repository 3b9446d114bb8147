"""`python -m experiments.sokoban.policy_probe` on a tiny random model: exact probabilities of whole
answers on the solver's boards and after a wall move, and a clear error without models."""

import json

import pytest
import torch

from experiments.sokoban.policy_probe import main


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def test_policy_probe_scores_boards_exactly(tmp_path):
    from rollhub.inference.models import init_tiny_model

    model = init_tiny_model(tmp_path / "model", "5m", seed=0)
    out = tmp_path / "probe"
    assert main(["--quick", "--out", str(out), "--set", f"models={model}"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert list(out.glob("*.png")), "the probe wrote no plot"
    rows = {r["boards"]: r for r in result["rows"]}
    assert set(rows) == {"solver", "after-wall"}
    for row in rows.values():
        assert row["n"] > 0
        # probabilities of whole answers: each part of the total, the total at most 1
        assert 0 <= row["p_optimal"] <= row["p_any_move"] <= 1
        assert 0 <= row["p_wall"] <= row["p_any_move"]
    # an untrained model spreads its mass over the whole vocabulary: far from any move
    assert rows["solver"]["p_any_move"] < 0.05


def test_policy_probe_needs_models(tmp_path):
    assert main(["--quick", "--out", str(tmp_path / "p")]) != 0
