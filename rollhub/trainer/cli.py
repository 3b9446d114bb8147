"""`rollhub train`, `rollhub sft`, `rollhub eval`, `rollhub view` (import-light: torch loads in the handlers)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rollhub.core.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser("train", help="train a policy: optional SFT warm-start, then async RL (GRPO/GiGPO)")
    train.add_argument("config", nargs="?", help="recipe YAML, e.g. configs/sokoban_tiny.yaml (optional with --resume)")
    train.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set train.steps=5",
    )
    train.add_argument(
        "--resume", metavar="RUN_DIR", default=None, help="continue the run in RUN_DIR from its latest checkpoint"
    )
    train.add_argument(
        "--overwrite", action="store_true", help="replace the files of an earlier run in run_dir (a fresh start)"
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    train.set_defaults(func=_cmd_train)

    sft = subparsers.add_parser("sft", help="SFT on scripted-expert demonstrations only, then evaluate")
    sft.add_argument("config", help="recipe YAML (its model/env/agent/sft/eval sections are used)")
    sft.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    sft.add_argument("--out", default=None, help="where to write the fine-tuned model (default RUN_DIR/sft_model)")
    sft.add_argument("--no-progress", action="store_true", help="no progress bars (logs only)")
    sft.set_defaults(func=_cmd_sft)

    evaluate = subparsers.add_parser(
        "eval", help="success rate of a model on a recipe's held-out seeds, or on an env (ID) with its 95% interval"
    )
    evaluate.add_argument(
        "config",
        metavar="RECIPE_OR_ENV",
        help="recipe YAML (env, agent and eval sections are used), or an env id such as rollhub/Math-v0",
    )
    evaluate.add_argument(
        "--model",
        required=True,
        help="HF checkpoint dir (RUN/final_model) or a hub id in the HF cache (org/name); with an env id also "
        "an OpenAI-compatible URL",
    )
    evaluate.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="recipe: e.g. eval.temperature=1.0; env id: an env argument, e.g. difficulty=2",
    )
    env_only = evaluate.add_argument_group("with an env id (a recipe sets these in its eval section)")
    env_only.add_argument("--episodes", type=int, default=None, help="episodes, one per seed (default 20)")
    env_only.add_argument("--split", choices=("test", "train"), default=None, help="seeds (and env split) to play")
    env_only.add_argument("--model-name", default=None, help="the endpoint's model name (default: its first)")
    env_only.add_argument("--temperature", type=float, default=None, help="sampling temperature (default 0: greedy)")
    env_only.add_argument("--max-new-tokens", type=int, default=None, help="most tokens per reply (default 256)")
    env_only.add_argument("--json", action="store_true", default=None, help="print one JSON object")
    evaluate.add_argument("--no-progress", action="store_true", help="no progress bar (logs only)")
    evaluate.set_defaults(func=_cmd_eval)

    view = subparsers.add_parser("view", help="read a run's trajectories: static HTML (default) or text")
    view.add_argument("run", help="run folder (with trajectories.jsonl) or a trajectories .jsonl file")
    view.add_argument("--out", default=None, help="HTML file to write (default RUN/trajectories.html)")
    view.add_argument("--text", action="store_true", help="print transcripts to the terminal instead")
    view.add_argument("--limit", type=int, default=200, help="most recent trajectories to show")
    view.add_argument("--only", choices=["success", "failure"], default=None, help="filter by outcome")
    view.add_argument(
        "--tokenizer", default=None, metavar="DIR", help="decode prompts with this tokenizer (default: the run's own)"
    )
    view.set_defaults(func=_cmd_view)


def load_run_config(config_path: str | None, overrides: list[str], resume: str | None):
    from rollhub.core.config import load_config
    from rollhub.trainer.config import RunConfig

    if config_path is None:
        if resume is None:
            raise UserError("give a recipe (rollhub train configs/sokoban_tiny.yaml) or --resume RUN_DIR")
        saved = Path(resume) / "config.json"
        if not saved.is_file():
            raise UserError(f"{resume} has no config.json; is it a run folder written by 'rollhub train'?")
        config_path = str(saved)
    extra = [f"run_dir={resume}"] if resume else []
    return load_config(RunConfig, config_path, list(overrides) + extra)


def _cmd_train(args: argparse.Namespace) -> int:
    import asyncio
    import functools
    import logging

    from rollhub.trainer.job import run_training
    from rollhub.trainer.ranks.launch import end_follower_process, launched_ranks, train_on_ranks

    config = load_run_config(args.config, args.overrides, args.resume)
    logging.getLogger("rollhub").setLevel(min(logging.getLogger().level, logging.WARNING))
    resume = args.resume is not None
    job = functools.partial(run_training, overwrite=args.overwrite)
    if launched_ranks() or config.trainer.world_size > 1:  # torchrun, or trainer.world_size: N (docs/ray.md)
        summary = train_on_ranks(config, job, resume=resume, progress=not args.no_progress)
        if summary is None:  # a follower rank (torchrun): rank 0 reports
            end_follower_process(0)
    else:
        summary = asyncio.run(job(config, resume=resume, progress=not args.no_progress))
    print(
        f"run folder: {summary.run_dir} "
        f"(metrics.jsonl, tensorboard/, learning_curve.png; rollhub view {summary.run_dir})"
    )
    return 0


def _cmd_sft(args: argparse.Namespace) -> int:
    import asyncio

    from rollhub.trainer.sft_job import run_sft_job

    config = load_run_config(args.config, args.overrides, None)
    asyncio.run(run_sft_job(config, out_dir=args.out, progress=not args.no_progress))
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    import asyncio

    from rollhub.rollout.evaluate_env import looks_like_env_id, run_env_eval

    if looks_like_env_id(args.config):
        from rollhub.trainer.config import EvalConfig

        return run_env_eval(args, held_out_seed_offset=EvalConfig().seed_offset)
    env_flags = ("episodes", "split", "model_name", "temperature", "max_new_tokens", "json")
    given = [f"--{name.replace('_', '-')}" for name in env_flags if getattr(args, name) is not None]
    if given:
        raise UserError(
            f"{', '.join(given)}: for 'rollhub eval ENV --model ...'; a recipe sets its evaluation in its eval "
            "section (e.g. --set eval.episodes=50)"
        )
    from rollhub.trainer.evaluate import evaluate_model_dir
    from rollhub.trainer.model_source import resolve_model_path
    from rollhub.trainer.progress import JobProgress, silence_library_progress

    config = load_run_config(args.config, args.overrides, None)
    model_dir = resolve_model_path(args.model, what="--model")  # a folder, or a hub id in the HF cache
    silence_library_progress()
    with JobProgress(not args.no_progress) as display:
        result = asyncio.run(evaluate_model_dir(config, model_dir, progress=display))
    if result.all_infra_failed:  # no episode was scored: a 0% would blame the model
        print(f"{config.eval.label}: {result.describe()}")
        return 1
    print(
        f"success on {config.eval.label} (temperature {config.eval.temperature}): {100 * result.success_rate:.1f}%  "
        f"invalid actions {100 * result.invalid_action_rate:.1f}%  mean turns {result.mean_turns:.1f}"
    )
    print(
        f"format errors {100 * result.format_error_rate:.1f}%  well-formed accuracy "
        f"{100 * result.well_formed_accuracy:.1f}% of {result.well_formed_episodes}  "
        f"infra failures {result.infra_failures}"
    )
    if result.tool_call_rate is not None:
        print(f"tool use: {result.describe()}")
    return 0


def _cmd_view(args: argparse.Namespace) -> int:
    from rollhub.trainer.view import find_tokenizer_dir, find_trajectory_file, load_tokenizer, render_html, render_text

    source = find_trajectory_file(Path(args.run))
    tokenizer = load_tokenizer(find_tokenizer_dir(source, Path(args.tokenizer) if args.tokenizer else None))
    if args.text:
        print(render_text(source, limit=args.limit, only=args.only, tokenizer=tokenizer))
        return 0
    out = Path(args.out) if args.out else (source.parent / "trajectories.html")
    count = render_html(source, out, limit=args.limit, only=args.only, tokenizer=tokenizer)
    print(f"wrote {count} trajectories to {out}")
    return 0
