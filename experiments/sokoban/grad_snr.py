"""`python -m experiments.sokoban.grad_snr`: is the policy gradient signal or noise at a given batch size?

Takes the groups a training run logged (`trajectories.jsonl`) while the policy was still close
to a checkpoint (all tokens from versions <= `max_version`), computes the loss gradient the
trainer would use (GiGPO or GRPO advantages from the run's recipe, its loss aggregation, one
update with π_prox = π_θ) on two disjoint random batches of B groups, and reports the cosine
between the two gradients, repeated. If the batch gradient were mostly signal the cosine
would be near 1; near 0 means each step's direction is mostly noise, and Adam (which moves
every weight by about lr whatever the gradient's size) then random-walks the policy.

  python -m experiments.sokoban.grad_snr --set run=runs/sokoban_tiny --set sizes=[8,16,32]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiments.sokoban.cli import main as tool_main
from rollhub.bench.report import bench_setup, print_table, save_json, save_plot
from rollhub.core.errors import UserError


@dataclass
class GradSnrConfig:
    run: str = ""  # a run folder with config.json and trajectories.jsonl
    model: str = ""  # checkpoint the gradients are taken at (default: RUN/sft_model)
    max_version: int = 8  # only groups whose tokens all come from versions <= this
    sizes: list[int] = field(default_factory=lambda: [8, 16, 32])  # batch sizes in groups: --set sizes=[8,16]
    repeats: int = 3
    seed: int = 0
    threads: int = 1

    def validate(self) -> None:
        if self.repeats < 1 or self.max_version < 0:
            raise ValueError("repeats must be >= 1 and max_version >= 0")
        if not self.sizes or min(self.sizes) < 1:
            raise ValueError("sizes must be a non-empty list of batch sizes >= 1, e.g. [8,16,32]")


QUICK = ["sizes=[1]", "repeats=1"]


def load_groups(trajectories_file: Path, max_version: int) -> list[Any]:
    from rollhub.rollout.serialization import trajectory_from_dict
    from rollhub.rollout.types import Group

    by_group: dict[str, list[Any]] = collections.defaultdict(list)
    with open(trajectories_file) as handle:
        for line in handle:
            trajectory = trajectory_from_dict(json.loads(line))
            versions = [v for turn in trajectory.turns for v in turn.token_versions]
            if versions and max(versions) <= max_version:
                by_group[trajectory.group_id].append(trajectory)
    sizes = collections.Counter(len(t) for t in by_group.values())
    full = max(sizes, key=lambda n: (sizes[n], n)) if sizes else 0  # the run's group size
    return [
        Group(group_id=g, env_id=t[0].env_id, seed=t[0].seed, trajectories=t)
        for g, t in by_group.items()
        if len(t) == full
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from rollhub.core.config import load_config
    from rollhub.trainer.batch import build_training_batch
    from rollhub.trainer.config import RunConfig
    from rollhub.trainer.policy import Policy
    from rollhub.trainer.update import policy_update

    cfg, out = bench_setup(GradSnrConfig, args, QUICK)
    run_dir = Path(cfg.run)
    if not cfg.run or not (run_dir / "config.json").exists() or not (run_dir / "trajectories.jsonl").exists():
        raise UserError("--set run=RUN must name a training run folder with config.json and trajectories.jsonl")
    model = Path(cfg.model) if cfg.model else run_dir / "sft_model"
    if not (model / "config.json").exists():
        raise UserError(f"no model at {model}; pass --set model=CHECKPOINT_DIR")
    sizes = list(cfg.sizes)
    torch.set_num_threads(cfg.threads)
    recipe = load_config(RunConfig, str(run_dir / "config.json"), [])
    groups = load_groups(run_dir / "trajectories.jsonl", cfg.max_version)
    needed = 2 * max(sizes)
    if len(groups) < needed:
        raise UserError(
            f"{len(groups)} complete groups with versions <= {cfg.max_version}; "
            f"{needed} needed (raise max_version or lower sizes)"
        )
    policy = Policy(model, micro_batch_size=recipe.optim.micro_batch_size, temperature=recipe.agent.temperature)
    # the policy-gradient part only: a KL term to the warm-start has zero gradient at the warm-start
    loss_config = dataclasses.replace(recipe.loss, kl_coef=0.0)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.0)  # only the gradient is wanted

    def gradient(part: list[Any]) -> torch.Tensor:
        batch, _ = build_training_batch(part, policy.tokenizer.pad_token_id, recipe.algorithm)
        optimizer.zero_grad(set_to_none=True)
        policy_update(policy, optimizer, batch, None, loss_config, max_grad_norm=None)
        return torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])

    rng = random.Random(cfg.seed)
    rows = []
    for size in sizes:
        cosines = []
        for _ in range(cfg.repeats):
            rng.shuffle(groups)
            first, second = gradient(groups[:size]), gradient(groups[size : 2 * size])
            cosines.append(float(torch.nn.functional.cosine_similarity(first, second, dim=0)))
        rows.append(
            {
                "groups_per_batch": size,
                "repeats": cfg.repeats,
                "cosine_mean": sum(cosines) / len(cosines),
                "cosines": cosines,
            }
        )
    print_table(
        f"gradient cosine between disjoint batches ({len(groups)} groups, versions <= {cfg.max_version})",
        [{k: v for k, v in r.items() if k != "cosines"} for r in rows],
    )
    result = {"benchmark": "grad-snr", "config": vars(cfg), "groups_available": len(groups), "rows": rows}
    save_json(out / "result.json", result)
    save_plot(out / "grad_snr.png", _draw, rows)
    return result


def _draw(ax: Any, rows: list[dict[str, Any]]) -> None:
    for row in rows:
        ax.scatter([row["groups_per_batch"]] * len(row["cosines"]), row["cosines"], color="tab:blue", alpha=0.6)
    ax.plot(
        [r["groups_per_batch"] for r in rows],
        [r["cosine_mean"] for r in rows],
        color="tab:blue",
        marker="o",
        label="mean",
    )
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xlabel("groups per batch")
    ax.set_ylabel("cosine between two batch gradients")
    ax.set_ylim(-1, 1)
    ax.legend()


def main(argv: list[str] | None = None) -> int:
    return tool_main(run, "grad-snr", __doc__, argv)


if __name__ == "__main__":
    raise SystemExit(main())
