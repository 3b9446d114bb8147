"""`rollhub eval ENV --model PATH_OR_URL`: a model's success rate on an env, with its 95% interval.

The recipe form (`rollhub eval RECIPE.yaml --model DIR`) judges a training run; this form answers
a newcomer's first question, "how does this model do on this env?", with no recipe: episodes
are played one after another through the message-level loop of `envs try`
(rollhub.envs.episode), by a local checkpoint or any OpenAI-compatible endpoint
(rollhub.rollout.chat_models). A rate is reported with its n and Wilson 95% interval, since 20
episodes cannot tell 40% from 60%.

Seeds: `--split test` plays the held-out seeds a training recipe evaluates on (from its
`eval.seed_offset`, which the trainer's CLI passes in), `--split train` seeds from 0; an env
whose constructor takes `split` (rollhub/Math-v0) is also built with that split, so its test
problems are its held-out list.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from rollhub.core.errors import UserError
from rollhub.core.intervals import wilson_interval
from rollhub.envs.episode import EpisodeOutcome, play_episode
from rollhub.rollout.chat_models import ChatModel

SPLITS = ("test", "train")


@dataclass
class EnvEvaluation:
    env: str
    model: str
    split: str
    n: int
    successes: int
    success_rate: float
    ci95: tuple[float, float]
    mean_turns: float
    mean_return: float
    seeds: tuple[int, int]

    def describe(self) -> str:
        low, high = self.ci95
        return (
            f"{self.env} ({self.split} split, seeds {self.seeds[0]}..{self.seeds[1]}): success "
            f"{100 * self.success_rate:.1f}% (95% interval {100 * low:.1f}-{100 * high:.1f}%, n={self.n}), "
            f"mean turns {self.mean_turns:.2f}, mean return {self.mean_return:+.3f}"
        )


def split_seeds(split: str, episodes: int, held_out_seed_offset: int) -> list[int]:
    """The seeds of `split`: held-out seeds from `held_out_seed_offset`, or training seeds from 0."""
    start = held_out_seed_offset if split == "test" else 0
    return list(range(start, start + episodes))


def summarise(env_id: str, model: str, split: str, outcomes: list[EpisodeOutcome]) -> EnvEvaluation:
    n = len(outcomes)
    successes = sum(o.success for o in outcomes)
    return EnvEvaluation(
        env=env_id,
        model=model,
        split=split,
        n=n,
        successes=successes,
        success_rate=successes / n if n else 0.0,
        ci95=wilson_interval(successes, n),
        mean_turns=statistics.fmean(o.steps for o in outcomes) if n else 0.0,
        mean_return=statistics.fmean(o.total_reward for o in outcomes) if n else 0.0,
        seeds=(outcomes[0].seed, outcomes[-1].seed) if n else (0, 0),
    )


async def evaluate_env(
    env_id: str, env_kwargs: dict[str, Any], model: ChatModel, seeds: list[int], *, model_label: str, split: str
) -> EnvEvaluation:
    """One episode per seed of a fresh env, played by `model`."""
    from rollhub.envs.registry import make

    async def play(env: Any, conversation: list) -> str:
        return await model.reply(conversation, env.tools if env.chat_template_tools else None)

    outcomes = []
    for seed in seeds:
        try:
            env = make(env_id, **env_kwargs)
        except ValueError as exc:
            raise UserError(f"bad arguments for env {env_id}: {exc}") from None
        try:
            outcomes.append(await play_episode(env, play, env_id=env_id, seed=seed))
        finally:
            await env.close()
    return summarise(env_id, model_label, split, outcomes)


def looks_like_env_id(text: str) -> bool:
    """Whether `rollhub eval`'s first argument names an env (an id, or SOURCE:TARGET) rather than a recipe file."""
    from pathlib import Path

    from rollhub.envs.registry import ID_PATTERN, SOURCES

    if text.endswith((".yaml", ".yml", ".json")) or Path(text).is_file():
        return False
    return bool(ID_PATTERN.match(text)) or text.partition(":")[0] in SOURCES


def _split_kwargs(env_spec: Any, split: str) -> dict[str, Any]:
    try:
        parameters = inspect.signature(env_spec.load_entry_point()).parameters
    except (TypeError, ValueError):
        return {}
    return {"split": split} if "split" in parameters else {}


def run_env_eval(args: argparse.Namespace, *, held_out_seed_offset: int) -> int:
    """The handler of `rollhub eval ENV --model PATH_OR_URL [--episodes N] [--split test] [--json]`;
    `held_out_seed_offset`: where a recipe's held-out seeds start (`eval.seed_offset`)."""
    import asyncio

    from rollhub.envs.arguments import typed_env_kwargs
    from rollhub.envs.checker import missing_requirements
    from rollhub.envs.cli import parse_env_args
    from rollhub.envs.registry import spec
    from rollhub.rollout.chat_models import open_chat_model

    defaults = {"episodes": 20, "split": "test", "temperature": 0.0, "max_new_tokens": 256, "json": False}
    for name, default in defaults.items():  # the parser leaves them None, so a recipe run can tell they were given
        if getattr(args, name, None) is None:
            setattr(args, name, default)
    if args.episodes < 1:
        raise UserError(f"--episodes must be >= 1, got {args.episodes}")
    env_spec = spec(args.config)
    missing = missing_requirements(env_spec)
    if missing:
        raise UserError(f"{args.config} cannot run here: {'; '.join(missing)}")
    given = parse_env_args(args.overrides)
    kwargs = typed_env_kwargs(env_spec, {**_split_kwargs(env_spec, args.split), **given}, key_prefix="--set ")
    seeds = split_seeds(args.split, args.episodes, held_out_seed_offset)

    async def main() -> EnvEvaluation:
        model = open_chat_model(
            args.model, model_name=args.model_name, temperature=args.temperature, max_new_tokens=args.max_new_tokens
        )
        try:
            return await evaluate_env(args.config, kwargs, model, seeds, model_label=args.model, split=args.split)
        finally:
            await model.close()

    result = asyncio.run(main())
    print(json.dumps(asdict(result)) if args.json else result.describe())
    return 0
