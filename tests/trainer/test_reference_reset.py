"""loss.reference_reset_every: every N steps the KL anchor becomes the current policy, and a
resumed run gets back the anchor it had, not the warm-start."""

import pytest
import torch
from trainer_testing import tiny_recipe

from rollhub.cli import main
from rollhub.core.config import load_config
from rollhub.core.errors import UserError
from rollhub.trainer.checkpoint import read_checkpoint
from rollhub.trainer.config import RunConfig
from rollhub.trainer.metrics import read_jsonl

torch.set_num_threads(1)


def _recipe(tmp_path, model_dir, steps: int):
    return tiny_recipe(
        tmp_path,
        model_dir,
        loss={"kl_coef": 0.1, "kl_estimator": "full", "reference_reset_every": 3},
        train={"steps": steps, "checkpoint_every": 1, "keep_checkpoints": 10},
    )


def _same(a: dict, b: dict) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_the_anchor_moves_every_n_steps_and_survives_a_resume(tiny_model_dir, tmp_path):
    assert main(["train", str(_recipe(tmp_path, tiny_model_dir, 4)), "--no-progress"]) == 0
    run = tmp_path / "run" / "checkpoints"
    ckpt = {step: read_checkpoint(run / f"step-{step:06d}") for step in (2, 3, 4)}
    base = ckpt[2]["reference"]
    assert not _same(ckpt[2]["model"], base)  # the policy moved, the anchor did not (yet)
    assert _same(ckpt[3]["reference"], ckpt[3]["model"])  # reset at step 3
    assert _same(ckpt[4]["reference"], ckpt[3]["model"]) and not _same(ckpt[4]["reference"], base)
    resets = [r["step"] for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r.get("train/reference_reset")]
    assert resets == [3]

    # resume to step 5: the anchor restored from step 4's checkpoint is step 3's policy
    assert (
        main(["train", str(_recipe(tmp_path, tiny_model_dir, 5)), "--resume", str(tmp_path / "run"), "--no-progress"])
        == 0
    )
    step5 = read_checkpoint(run / "step-000005")
    assert _same(step5["reference"], ckpt[3]["model"])


def test_a_reset_needs_a_kl_term(tiny_model_dir, tmp_path):
    def config(**loss):
        return load_config(RunConfig, tiny_recipe(tmp_path, tiny_model_dir, loss=loss))

    with pytest.raises(UserError, match="needs loss.kl_coef > 0"):
        config(reference_reset_every=5)
    with pytest.raises(UserError, match=">= 0"):
        config(reference_reset_every=-1, kl_coef=0.1)
    assert config(reference_reset_every=5, kl_coef=0.1).loss.reference_reset_every == 5
