"""eval.select: the best policy on validation seeds becomes final_model; the held-out seeds
take no part in the choice, and the last step's policy is still scored and reported."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainer_testing import tiny_recipe

from rollhub.cli import main
from rollhub.core.config import load_config
from rollhub.core.errors import UserError
from rollhub.trainer.config import RunConfig
from rollhub.trainer.evaluate import EvalResult
from rollhub.trainer.metrics import read_jsonl
from rollhub.trainer.policy import Policy
from rollhub.trainer.selection import BEST_FILE, CheckpointSelector

torch.set_num_threads(1)


def _reading(success: float) -> EvalResult:
    return EvalResult(success, 0.0, 0.0, 0.0, 0.0, 0)


def _perturb(policy: Policy, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in policy.model.parameters():
            param.add_(0.01 * torch.randn(param.shape, generator=generator))


def test_selector_keeps_the_best_reading_and_hands_its_weights_over(tiny_model_dir, tmp_path):
    config = RunConfig(run_dir=str(tmp_path))
    config.eval.select.episodes = 4
    policy = Policy(tiny_model_dir, micro_batch_size=8)
    selector = CheckpointSelector(config, tmp_path)
    assert selector.validation.eval.seeds == list(range(2_000_000, 2_000_004))  # not the held-out seeds
    snapshots = {}
    for step, success in [(1, 0.5), (2, 0.25), (3, 0.5), (4, 0.25)]:
        _perturb(policy, step)
        snapshots[step] = {k: v.clone() for k, v in policy.model.state_dict().items()}
        kept = selector.consider(step, _reading(success), policy)
        assert kept == (step in (1, 3))  # a tie goes to the later step
    assert selector.best.step == 3 and selector.last.step == 4
    best = selector.best_state_dict()
    assert best.keys() == snapshots[3].keys()
    assert all(torch.equal(best[k], snapshots[3][k]) for k in best)
    assert not all(torch.equal(best[k], snapshots[4][k]) for k in best)
    selector.hand_over(tmp_path / "final_model")
    final = load_file(str(tmp_path / "final_model" / "model.safetensors"))
    assert torch.equal(final["model.embed_tokens.weight"], snapshots[3]["model.embed_tokens.weight"])
    # a resumed run keeps a pick made before its checkpoint and drops one made after it
    assert CheckpointSelector(config, tmp_path, resumed_at=3).best.step == 3
    assert CheckpointSelector(config, tmp_path, resumed_at=2).best is None


def _recipe(tmp_path: Path, model_dir: Path) -> Path:
    return tiny_recipe(
        tmp_path,
        model_dir,
        train={"steps": 3, "checkpoint_every": 1, "keep_checkpoints": 0},
        eval={"episodes": 2, "select": {"episodes": 2, "samples_per_seed": 1, "every": 1}},
    )


def test_validation_seeds_may_not_overlap_held_out_or_training_seeds(tiny_model_dir, tmp_path):
    recipe = _recipe(tmp_path, tiny_model_dir)
    with pytest.raises(UserError, match="validation seeds .* overlap evaluation seeds"):
        load_config(RunConfig, recipe, ["eval.select.seed_offset=1000001"])
    first_training_seed = load_config(RunConfig, recipe).train_seed_start  # moved by the run's seed
    with pytest.raises(UserError, match="training seeds .* overlap validation seeds"):
        load_config(RunConfig, recipe, [f"eval.select.seed_offset={first_training_seed + 5}"])
    with pytest.raises(UserError, match="eval.select.every"):
        load_config(RunConfig, recipe, ["eval.select.every=0"])


RECIPE = Path(__file__).resolve().parents[2] / "configs" / "sokoban_6x6_2b.yaml"


def test_sokoban_selection_reads_validation_rooms_apart_from_training_and_held_out_rooms(tmp_path):
    """Small rooms repeat across seeds: validation seeds on the test split would pick the checkpoint on
    held-out rooms. The recipe's selection plays the validation split, and the run checks refuse the
    test split (overlaps the held-out rooms) and the training split (overlaps training)."""
    from rollhub.trainer.build import check_run_envs

    config = load_config(RunConfig, RECIPE, [f"run_dir={tmp_path / 'run'}"])
    check_run_envs(config)
    selector = CheckpointSelector(config, tmp_path)
    assert selector.validation.eval_env_kwargs["split"] == "validation"
    assert config.eval_env_kwargs["split"] == "test" and config.env.kwargs["split"] == "train"
    assert selector.validation.eval_env_id == config.eval_env_id
    assert selector.validation.eval_env_kwargs == {**config.eval_env_kwargs, "split": "validation"}
    for split, message in (("test", "evaluation overlaps validation"), ("train", "validation overlaps training")):
        config = load_config(
            RunConfig, RECIPE, [f"run_dir={tmp_path / 'run'}", f"eval.select.kwargs={{split: {split}}}"]
        )
        with pytest.raises(UserError, match=f"{message}.*eval.select.kwargs"):
            check_run_envs(config)


@pytest.mark.parametrize("pick", [0, 1])
def test_an_earlier_pick_is_what_the_final_evaluation_plays(tiny_model_dir, tmp_path, capsys, monkeypatch, pick):
    """Validation readings that peak at the warm-start (0) or at step 1 (forced, so the choice
    is known): the final held-out evaluation plays those weights, final_model holds them, and
    the last step's policy is scored and reported beside it."""
    values = [1.0, 0.5, 0.5, 0.0] if pick == 0 else [0.5, 1.0, 0.5, 0.0]
    readings = iter(values)
    real_score = CheckpointSelector.score

    async def forced(self, engine, tokenizer, **kwargs):
        result = await real_score(self, engine, tokenizer, **kwargs)  # the real validation episodes run
        result.success_rate = next(readings)
        return result

    monkeypatch.setattr(CheckpointSelector, "score", forced)
    assert main(["train", str(_recipe(tmp_path, tiny_model_dir)), "--no-progress"]) == 0
    out = capsys.readouterr().out
    run = tmp_path / "run"
    logged = {
        r["step"]: r["select/success_rate"] for r in read_jsonl(run / "metrics.jsonl") if "select/success_rate" in r
    }
    assert logged == dict(enumerate(values))  # the warm-start, every step (every=1), the last
    assert json.loads((run / BEST_FILE).read_text()) == {"step": pick, "success_rate": 1.0}
    assert f"final policy: step {pick}," in out and "the last step's (3) held-out success" in out
    shipped = load_file(str(run / "final_model" / "model.safetensors"))
    if pick == 0:  # no SFT in this recipe: the warm-start is the base model
        picked = load_file(str(tiny_model_dir / "model.safetensors"))
    else:
        picked = torch.load(run / "checkpoints" / "step-000001" / "state.pt", weights_only=False)["model"]
    step3 = torch.load(run / "checkpoints" / "step-000003" / "state.pt", weights_only=False)["model"]
    assert all(torch.equal(shipped[k], picked[k]) for k in shipped)
    assert not all(torch.equal(shipped[k], step3[k]) for k in shipped)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["selected_step"] == pick and summary["steps"] == 3
    # the curve's last point is the last step's policy; the picked one is logged as final/
    last_row = [r for r in read_jsonl(run / "metrics.jsonl") if "eval/success_rate" in r][-1]
    assert last_row["step"] == 3
    assert last_row["eval/success_rate"] == summary["last_step_success_rate"]
    assert last_row["final/success_rate"] == summary["final_success_rate"]
    assert last_row["final/selected_step"] == pick
    phases = summary["phases_s"]
    assert phases["eval_selected_s"] > 0 and phases["select_s"] > 0


def test_the_learning_curve_marks_the_picked_policy_at_its_step(tmp_path, monkeypatch):
    """With eval.select the curve ends on the last step's reading; the picked policy is a
    separate point at the step whose weights it has, not drawn at all without a pick."""
    import matplotlib.axes

    from rollhub.trainer.metrics import plot_learning_curve

    drawn: list[tuple[list, list]] = []
    real_scatter = matplotlib.axes.Axes.scatter
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "scatter",
        lambda self, x, y, **kw: drawn.append((list(x), list(y))) or real_scatter(self, x, y, **kw),
    )
    curve = [{"step": 0, "eval/success_rate": 0.5}, {"step": 2, "eval/success_rate": 0.6}]
    assert plot_learning_curve(curve, tmp_path / "plain.png") is not None
    assert drawn == []
    final = {"step": 2, "eval/success_rate": 0.6, "final/success_rate": 0.8, "final/selected_step": 1}
    assert plot_learning_curve(curve[:1] + [final], tmp_path / "picked.png") is not None
    assert drawn == [([1], [0.8])]
